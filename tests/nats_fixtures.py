"""NATS-only fixtures: one real nats-server (JetStream) per test session.

Loaded through ``pytest_plugins`` by tests/conftest.py. Tests that need a server of their
own (to restart it, say) call :func:`respawn.testbed.nats.start_nats` directly. ``bus`` is a
:class:`~shared.bus.Bus` on that server under a service name of its own, with Respawn's streams
(the dead-letter stream among them).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from respawn.testbed.nats import NatsServer, start_nats
from shared.bus import Bus


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    server = start_nats(tmp_path_factory.mktemp("nats"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def nats_url(nats_server: NatsServer) -> str:
    return nats_server.url


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    b = await Bus.connect(nats_url, name=f"test-{uuid.uuid4().hex[:10]}")
    await b.ensure_streams()
    try:
        yield b
    finally:
        await b.close()
