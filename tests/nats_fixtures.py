"""NATS-only fixtures: one real nats-server (JetStream) per test session.

Loaded through ``pytest_plugins`` by tests/conftest.py. Tests that need a server of their
own (to restart it, say) take ``own_nats`` (default settings; stopped after the test) or call
:func:`respawn.testbed.nats.start_nats` directly. ``bus`` is a :class:`~shared.bus.Bus` on the
session's server under a service name of its own, with Respawn's streams (the dead-letter stream
among them); ``own_bus`` is the same on ``own_nats``.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

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


@contextlib.asynccontextmanager
async def connected_bus(url: str) -> AsyncIterator[Bus]:
    b = await Bus.connect(url, name=f"test-{uuid.uuid4().hex[:10]}")
    try:
        await b.ensure_streams()
        yield b
    finally:
        await b.close()


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    async with connected_bus(nats_url) as b:
        yield b


@pytest.fixture
async def own_nats(tmp_path: Path) -> AsyncIterator[NatsServer]:
    server = await asyncio.to_thread(start_nats, tmp_path / "nats")
    try:
        yield server
    finally:
        await asyncio.to_thread(server.stop)


@pytest.fixture
async def own_bus(own_nats: NatsServer) -> AsyncIterator[Bus]:
    async with connected_bus(own_nats.url) as b:
        yield b
