"""A nats-server running Respawn's NATS accounts (deploy/nats/auth.conf), and plain nats-py
clients of it that keep the server's permission errors: shared by tests/integration/test_deploy.py
and tests/integration/test_nats_permissions.py.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import pytest

from respawn import natsauth
from respawn.testbed.nats import NatsServer, start_nats
from tests.waiting import until


@dataclass
class AuthNats:
    url: str
    passwords: dict[str, str]
    server: NatsServer


def start_auth_nats(directory: Path, config_file: Path, users: Iterable[str]) -> AuthNats:
    """A nats-server in ``directory`` with ``config_file``; each of ``users`` gets a fresh
    password, which the file reads from the server's environment."""
    passwords = {user: natsauth.generate_password() for user in users}
    with pytest.MonkeyPatch.context() as env:
        for user, password in passwords.items():
            env.setenv(natsauth.password_variable(user), password)
        server = start_nats(directory, config_file=config_file)
    return AuthNats(server.url, passwords, server)


@dataclass
class Client:
    """A plain nats-py connection as one user, keeping the server's permission errors."""

    nc: Any
    errors: list[str] = field(default_factory=list)

    @property
    def js(self) -> Any:
        return self.nc.jetstream(timeout=2.0)

    def refusals(self) -> str:
        return "\n".join(e for e in self.errors if "permissions violation" in e.lower())

    async def wait_refused(self, what: str, subject: str) -> None:
        await until(
            f"the server to refuse {what} {subject!r} (refusals so far: {self.refusals()})",
            # nats-py lowercases the server's error text, subject included.
            lambda: f'{what} to "{subject}"'.lower() in self.refusals().lower(),
            within=5,
        )

    async def publish_refused(self, subject: str, payload: bytes = b"{}") -> None:
        await self.nc.publish(subject, payload)
        await self.nc.flush()
        await self.wait_refused("publish", subject)

    async def api(self, subject: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """A JetStream API request; the answer, or TimeoutError when there is none."""
        reply = await self.nc.request(subject, json.dumps(body or {}).encode(), timeout=2.0)
        answer: dict[str, Any] = json.loads(reply.data)
        return answer


@asynccontextmanager
async def client(auth: AuthNats, user: str, **options: Any) -> AsyncIterator[Client]:
    """Connected as ``user`` without reconnecting; ``options``: more of ``nats.connect``'s."""
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    nc = await nats.connect(
        auth.url,
        user=user,
        password=auth.passwords[user],
        error_cb=on_error,
        allow_reconnect=False,
        **options,
    )
    try:
        yield Client(nc, errors)
    finally:
        await nc.close()
