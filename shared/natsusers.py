"""Respawn's NATS users and the Secret of their passwords.

The tools that write ``auth.conf`` and the Secret (``respawn.natsauth``) and the webhook, which
creates the Secret on a fresh install (docs/webhooks.md, "Self-managed"), must agree on the
Secret's name, its keys and what a password may look like; both read them from here.
"""

from __future__ import annotations

import re
import secrets
import string
from typing import Final

# The Secret that holds one password per user, under the user's name (docs/deploy.md).
SECRET_NAME: Final = "respawn-nats-users"
SERVICES: Final = ("watcher", "health", "lifecycle", "autopilot")
# The outside reader every install has.
SUBSCRIBER: Final = "subscriber"
# The Secret's keys on a fresh install: what the NATS StatefulSet and the services read.
DEFAULT_USERS: Final = (*SERVICES, SUBSCRIBER)

# nats-server parses an environment value as a configuration value: a password must not read as
# a number, a duration or a boolean. A letter first, then URL-safe characters only.
PASSWORD_PATTERN: Final = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{23,}$")


def generate_password() -> str:
    """A random password that nats-server reads back as the same string (~200 bits)."""
    return secrets.choice(string.ascii_letters) + secrets.token_urlsafe(32)
