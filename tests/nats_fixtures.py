"""NATS-only fixtures: one real nats-server (JetStream) per test session.

Loaded through ``pytest_plugins`` by tests/conftest.py. Tests that need a server of their
own (to restart it, say) take ``own_nats`` (default settings; stopped after the test) or call
:func:`respawn.testbed.nats.start_nats` directly. ``bus`` is a :class:`~shared.bus.Bus` on the
session's server under a service name of its own, with Respawn's streams (the dead-letter stream
among them); ``own_bus`` is the same on ``own_nats``. :func:`read_all` and :func:`dead_letters`
look at what a stream holds without consuming it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from nats.js import api

from respawn.testbed.nats import NatsServer, start_nats
from shared import subjects
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


async def read_all(bus: Bus, stream: str, subject: str, count: int, *, within: float = 15.0) -> list[Any]:
    """The first ``count`` messages on ``subject`` (read without consuming them)."""
    sub = await bus.js.pull_subscribe(
        subject,
        stream=stream,
        config=api.ConsumerConfig(ack_policy=api.AckPolicy.NONE, inactive_threshold=30.0),
    )
    try:
        got: list[Any] = []
        deadline = time.monotonic() + within
        while len(got) < count and time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                got += await sub.fetch(count - len(got), timeout=1.0)
        return got
    finally:
        await sub.unsubscribe()


async def dead_letters(bus: Bus, count: int) -> list[Any]:
    """The first ``count`` dead letters this bus's service wrote (read without consuming them)."""
    return await read_all(bus, subjects.DEAD_LETTER_STREAM, subjects.dead_letter(bus.service), count)


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
