"""NATS-only fixtures: one real nats-server (JetStream) per test session.

Loaded through ``pytest_plugins`` by tests/conftest.py. Tests that need a server of their
own (to restart it, say) call :func:`respawn.testbed.nats.start_nats` directly.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from respawn.testbed.nats import NatsServer, start_nats


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
