"""NATS users and subject permissions: one user per service, read-only users for outsiders.

Every service connects as its own user and may publish only what it produces (the watcher
observations, health verdicts, lifecycle lifecycle events, autopilot node verdicts), plus the
JetStream API requests, acks and dead letters of what it consumes. Outside subscribers get a
user that can read the public streams (verdicts and lifecycle) through consumers of their own
and publish nothing else. The permissions are derived from what :mod:`shared.bus` and the
services actually send; ``tests/integration/test_deploy.py`` proves them on a real server.

The rules and the rendering are pure functions. :func:`render_auth_config` builds the server's
``accounts`` block with passwords as ``$NATS_PASSWORD_<USER>`` references, which nats-server
resolves from its own environment, so the generated file can be committed and reviewed while
the passwords live only in a Kubernetes Secret (:func:`render_secret`). Only
:func:`generate_password` and :func:`main` (``python -m respawn.natsauth config|secret|env``)
touch randomness or output.

Known limits, which NATS permissions cannot express more tightly:
- consumer names are single tokens, so a service may manage any consumer on the streams it
  reads, not only its own;
- every service creates and updates the streams at start (``Bus.ensure_streams``), so each may
  change any stream's configuration, though never publish into another service's subjects;
- services share the ``_INBOX.>`` reply space; outside subscribers are kept out of it by a
  private inbox prefix (``_INBOX_<user>``), which their client must be told to use.

No user may subscribe to a stream's own subjects: reading goes through consumers, which deliver
to the reader's inbox. A plain subscription would give a push consumer the interest it needs to
deliver into that subject, which another stream may capture: a way to write without publishing.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import secrets
import string
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from shared import subjects

__all__ = [
    "ACCOUNT",
    "PUBLIC_STREAMS",
    "SECRET_NAME",
    "SERVICES",
    "SERVICE_INBOX_PREFIX",
    "SUBSCRIBER",
    "Permissions",
    "User",
    "default_users",
    "generate_password",
    "inbox_prefix",
    "main",
    "password_variable",
    "render_auth_config",
    "render_env_file",
    "render_secret",
    "service_permissions",
    "service_user",
    "subject_matches",
    "subscriber_permissions",
    "subscriber_user",
    "validate_password",
]

ACCOUNT = "RESPAWN"
SERVICES = ("watcher", "health", "lifecycle", "autopilot")
SUBSCRIBER = "subscriber"
SECRET_NAME = "respawn-nats-users"
SERVICE_INBOX_PREFIX = "_INBOX"
PUBLIC_STREAMS = (subjects.VERDICTS_STREAM, subjects.LIFECYCLE_STREAM)
ALL_STREAMS = (
    subjects.OBSERVATIONS_STREAM,
    subjects.VERDICTS_STREAM,
    subjects.NODE_VERDICTS_STREAM,
    subjects.LIFECYCLE_STREAM,
    subjects.DEAD_LETTER_STREAM,
)

_API = "$JS.API"
_USER_NAME = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
# nats-server parses a variable's value as a configuration value, so "12k" would become the
# number 12288 and "true" a boolean. A leading letter and no separators keep it a plain string.
_PASSWORD = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{23,}$")


# ------------------------------------------------------------------ subjects


def subject_matches(pattern: str, subject: str) -> bool:
    """Whether NATS would let ``pattern`` (with ``*`` and ``>``) cover ``subject``.

    Tokens of ``subject`` are compared literally, as the server does for permissions, so a
    subject that itself contains ``*`` is only covered by a wildcard or that same token.
    """
    want, have = pattern.split("."), subject.split(".")
    for index, token in enumerate(want):
        if token == ">":
            return len(have) > index
        if index >= len(have) or (token != "*" and token != have[index]):
            return False
    return len(want) == len(have)


@dataclass(frozen=True)
class Permissions:
    """Subjects a user may publish to and subscribe to; everything else is denied."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]

    def may_publish(self, subject: str) -> bool:
        return any(subject_matches(p, subject) for p in self.publish)

    def may_subscribe(self, subject: str) -> bool:
        return any(subject_matches(p, subject) for p in self.subscribe)


@dataclass(frozen=True)
class User:
    name: str
    permissions: Permissions

    @property
    def password_variable(self) -> str:
        return password_variable(self.name)


@dataclass(frozen=True)
class _Reads:
    """A consumer a service keeps on ``stream``."""

    stream: str
    kind: str = "pull"  # "pull": durable, explicit acks; "ordered": ephemeral push replay


@dataclass(frozen=True)
class _ServiceBus:
    """What one service does on the bus (see each service's ``run``)."""

    publishes: tuple[str, ...]
    reads: tuple[_Reads, ...] = ()
    deletes_consumers_on: tuple[str, ...] = ()
    gets_messages_from: tuple[str, ...] = ()


_OBS = subjects.OBSERVATIONS_STREAM
_BUS: Mapping[str, _ServiceBus] = {
    "watcher": _ServiceBus(publishes=(f"{subjects.OBS_PREFIX}.>",)),
    "health": _ServiceBus(
        publishes=(subjects.verdict_filter(),),
        reads=(
            _Reads(_OBS),
            _Reads(subjects.NODE_VERDICTS_STREAM),
            # The last verdict per AppWrapper, replayed at start so none is published twice.
            _Reads(subjects.VERDICTS_STREAM),
        ),
        # Its per-run replay consumers (Bus.replay) are removed when it stops, not left to expire.
        deletes_consumers_on=(_OBS, subjects.NODE_VERDICTS_STREAM, subjects.VERDICTS_STREAM),
    ),
    "lifecycle": _ServiceBus(
        publishes=(subjects.lifecycle_filter(),),
        reads=(
            _Reads(subjects.VERDICTS_STREAM),
            _Reads(_OBS),
        ),
    ),
    "autopilot": _ServiceBus(
        publishes=(subjects.node_verdict_filter(),),
        reads=(
            _Reads(_OBS),
            # The stored node verdicts (the last per resource), replayed at start.
            _Reads(subjects.NODE_VERDICTS_STREAM),
        ),
        # Its per-run replay consumers (Bus.replay) are removed when it stops, not left to expire.
        deletes_consumers_on=(_OBS, subjects.NODE_VERDICTS_STREAM),
    ),
}


def _stream_setup(streams: Iterable[str]) -> list[str]:
    # Bus.ensure_streams: info first, create when missing, update when the config drifted.
    return [f"{_API}.STREAM.{op}.{s}" for s in streams for op in ("INFO", "CREATE", "UPDATE")]


def _pull_consumer(stream: str) -> list[str]:
    return [
        # Named consumers put the name (and a single filter subject) after the stream.
        f"{_API}.CONSUMER.CREATE.{stream}.>",
        f"{_API}.CONSUMER.INFO.{stream}.*",
        f"{_API}.CONSUMER.MSG.NEXT.{stream}.*",
        f"$JS.ACK.{stream}.>",
    ]


def _ordered_consumer(stream: str) -> list[str]:
    return [
        # Ephemeral consumers are created without a name in the subject.
        f"{_API}.CONSUMER.CREATE.{stream}",
        f"{_API}.CONSUMER.CREATE.{stream}.>",
        f"{_API}.CONSUMER.INFO.{stream}.*",
        # Flow-control replies of a push consumer.
        f"$JS.FC.{stream}.>",
    ]


def _unique(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def service_permissions(service: str) -> Permissions:
    """What ``service`` may publish and subscribe to (``service`` is one of :data:`SERVICES`)."""
    try:
        bus = _BUS[service]
    except KeyError:
        raise ValueError(f"unknown service {service!r}; expected one of {', '.join(SERVICES)}") from None
    publish = [*bus.publishes, *_stream_setup(ALL_STREAMS)]
    for reads in bus.reads:
        publish += _pull_consumer(reads.stream) if reads.kind == "pull" else _ordered_consumer(reads.stream)
    publish += [f"{_API}.CONSUMER.DELETE.{s}.*" for s in bus.deletes_consumers_on]
    publish += [f"{_API}.STREAM.MSG.GET.{s}" for s in bus.gets_messages_from]
    if any(r.kind == "pull" for r in bus.reads):
        # Bus.consume moves what can never be processed here (the bus names itself respawn-<service>).
        publish.append(subjects.dead_letter(f"respawn-{service}"))
    # Consumers deliver to the reply inbox, so no subscription to a stream's subjects is needed,
    # and none is granted: with one, a user could create a push consumer that delivers into a
    # subject captured by another stream, and so write where it may not publish.
    return Permissions(publish=_unique(publish), subscribe=(f"{SERVICE_INBOX_PREFIX}.>",))


def inbox_prefix(user: str) -> str:
    """The private reply prefix of an outside subscriber (its client must use it)."""
    return f"_INBOX_{user}"


def subscriber_permissions(user: str = SUBSCRIBER, streams: Sequence[str] = PUBLIC_STREAMS) -> Permissions:
    """Read-only access to ``streams`` through the subscriber's own consumers.

    The only publishes allowed are JetStream API requests that read (stream info, message
    get) or manage consumers on those streams, and the acks and flow-control replies of those
    consumers. Replies and deliveries arrive under :func:`inbox_prefix`, the only subscription
    allowed, so the user cannot see what is meant for Respawn's services.
    """
    unknown = [s for s in streams if s not in PUBLIC_STREAMS]
    if unknown:
        raise ValueError(f"only the public streams can be opened to subscribers, not {', '.join(unknown)}")
    publish = [
        f"{_API}.INFO",  # account limits and usage; clients such as the nats CLI ask for it
        f"{_API}.STREAM.NAMES",  # find a stream by subject (nats-py subscribe without stream=)
    ]
    for stream in streams:
        publish += [
            f"{_API}.STREAM.INFO.{stream}",
            f"{_API}.STREAM.MSG.GET.{stream}",
            f"{_API}.DIRECT.GET.{stream}",
            f"{_API}.DIRECT.GET.{stream}.>",
            f"{_API}.CONSUMER.CREATE.{stream}",
            f"{_API}.CONSUMER.CREATE.{stream}.>",
            f"{_API}.CONSUMER.INFO.{stream}.*",
            f"{_API}.CONSUMER.DELETE.{stream}.*",
            f"{_API}.CONSUMER.MSG.NEXT.{stream}.*",
            f"$JS.ACK.{stream}.>",
            f"$JS.FC.{stream}.>",
        ]
    # Only the private inbox: a subscription to the streams' own subjects would give a push
    # consumer the interest it needs to deliver there, i.e. a way to write into a stream.
    return Permissions(publish=_unique(publish), subscribe=(f"{inbox_prefix(user)}.>",))


def _check_name(name: str) -> str:
    if not _USER_NAME.match(name):
        raise ValueError(
            f"user name {name!r} must start with a lowercase letter and hold only a-z, 0-9 and '-'"
        )
    return name


def service_user(service: str) -> User:
    return User(name=service, permissions=service_permissions(service))


def subscriber_user(name: str = SUBSCRIBER) -> User:
    if name in SERVICES:
        raise ValueError(f"subscriber name {name!r} is taken by a service")
    return User(name=_check_name(name), permissions=subscriber_permissions(name))


def default_users(subscribers: Sequence[str] = (SUBSCRIBER,)) -> list[User]:
    """The four service users, then one read-only user per outside subscriber."""
    users = [service_user(s) for s in SERVICES] + [subscriber_user(n) for n in subscribers]
    names = [u.name for u in users]
    if len(set(names)) != len(names):
        raise ValueError(f"user names must be unique: {', '.join(names)}")
    return users


# ------------------------------------------------------------------ rendering


def password_variable(user: str) -> str:
    """The environment variable of nats-server that holds ``user``'s password."""
    return "NATS_PASSWORD_" + _check_name(user).upper().replace("-", "_")


def _allow_block(what: str, subjects_: Iterable[str]) -> list[str]:
    # JSON strings are valid NATS configuration strings, and quoting keeps "$JS..." literal.
    pad = " " * 12
    return [
        f"          {what}: {{",
        "            allow: [",
        *(f"{pad}  {json.dumps(s)}" for s in subjects_),
        "            ]",
        "          }",
    ]


def render_auth_config(
    users: Sequence[User],
    *,
    account: str = ACCOUNT,
    passwords: Mapping[str, str] | None = None,
) -> str:
    """The nats-server ``accounts`` block: one JetStream-enabled account holding ``users``.

    Passwords are ``$NATS_PASSWORD_<USER>`` references unless ``passwords`` gives them
    literally (for a test server; never commit such a file).
    """
    lines = [
        "# NATS users of Respawn and their subject permissions.",
        "# Generated by `python -m respawn.natsauth config`; edit respawn/natsauth.py, not this file.",
        "# Passwords come from the server's environment (the respawn-nats-users Secret).",
        "accounts {",
        f"  {account} {{",
        "    jetstream: enabled",
        "    users: [",
    ]
    for user in users:
        if passwords is not None:
            password = json.dumps(validate_password(user.name, passwords[user.name]))
        else:
            password = "$" + user.password_variable
        lines += [
            "      {",
            f"        user: {json.dumps(user.name)}",
            f"        password: {password}",
            "        permissions: {",
            *_allow_block("publish", user.permissions.publish),
            *_allow_block("subscribe", user.permissions.subscribe),
            "        }",
            "      }",
        ]
    lines += ["    ]", "  }", "}", ""]
    return "\n".join(lines)


def validate_password(user: str, password: str) -> str:
    if not _PASSWORD.match(password):
        raise ValueError(
            f"the password of {user!r} must be at least 24 characters of A-Z, a-z, 0-9, '-' and '_', "
            "starting with a letter (nats-server would read other values as numbers or booleans)"
        )
    return password


def generate_password() -> str:
    """A random password that nats-server reads back as the same string (~200 bits)."""
    return secrets.choice(string.ascii_letters) + secrets.token_urlsafe(32)


def render_secret(passwords: Mapping[str, str], *, namespace: str, name: str = SECRET_NAME) -> str:
    """A Secret holding each user's password under the user's name (JSON, which is valid YAML)."""
    data = {
        user: base64.b64encode(validate_password(user, pw).encode()).decode()
        for user, pw in sorted(passwords.items())
    }
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "respawn", "app.kubernetes.io/component": "nats"},
        },
        "type": "Opaque",
        "data": data,
    }
    return json.dumps(secret, indent=2) + "\n"


def render_env_file(passwords: Mapping[str, str]) -> str:
    """``user=password`` lines, for ``kubectl create secret generic --from-env-file``."""
    return "".join(f"{user}={validate_password(user, pw)}\n" for user, pw in sorted(passwords.items()))


# ------------------------------------------------------------------ command line


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m respawn.natsauth config|secret|env`` (see docs/deploy.md)."""
    parser = argparse.ArgumentParser(prog="python -m respawn.natsauth", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    config = commands.add_parser("config", help="print the nats-server accounts block (auth.conf)")
    secret = commands.add_parser("secret", help="print a Secret with freshly generated passwords")
    env = commands.add_parser("env", help="print user=password lines with freshly generated passwords")
    for sub in (config, secret, env):
        sub.add_argument(
            "--subscriber",
            action="append",
            dest="subscribers",
            metavar="NAME",
            help=f"an outside subscriber's user name (repeatable; default: {SUBSCRIBER})",
        )
    secret.add_argument("--namespace", default="respawn-system")
    secret.add_argument("--name", default=SECRET_NAME)
    args = parser.parse_args(argv)
    try:
        users = default_users(tuple(args.subscribers or (SUBSCRIBER,)))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.command == "config":
        sys.stdout.write(render_auth_config(users))
        return 0
    passwords = {u.name: generate_password() for u in users}
    if args.command == "secret":
        sys.stdout.write(render_secret(passwords, namespace=args.namespace, name=args.name))
    else:
        sys.stdout.write(render_env_file(passwords))
    return 0


if __name__ == "__main__":
    sys.exit(main())
