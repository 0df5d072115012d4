"""A service starting while JetStream has no quorum fails with one clear error, not a traceback.

A nats-server configured as one of a three-server cluster whose two peers never come up has no
JetStream metadata leader: it accepts connections, but every JetStream request is answered 503
("JetStream system temporarily unavailable") or not at all. ``Bus.ensure_streams`` waits that
out for a while (a cluster electing after a restart recovers within it), then raises
``BusError`` naming the cause, which ``shared.runtime`` prints as its one "cannot use NATS" line.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from respawn.testbed.nats import find_nats_server
from respawn.testbed.ports import free_port
from shared.bus import Bus, BusError
from tests.waiting import until_sync

pytestmark = pytest.mark.nats


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def leaderless_nats(tmp_path: Path) -> Iterator[str]:
    port, cluster_port = free_port(), free_port()
    dead_peers = [free_port(), free_port()]  # nothing listens there
    conf = tmp_path / "nats.conf"
    conf.write_text(
        f"""
server_name: lonely
listen: 127.0.0.1:{port}
jetstream {{ store_dir: "{tmp_path / "js"}" }}
cluster {{
  name: respawn-test
  listen: 127.0.0.1:{cluster_port}
  routes: [{", ".join(f"nats://127.0.0.1:{p}" for p in dead_peers)}]
}}
"""
    )
    log = (tmp_path / "nats.log").open("wb")
    proc = subprocess.Popen([str(find_nats_server()), "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT)
    try:
        until_sync("nats-server accepting connections", lambda: _accepts(port), within=15)
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()
        log.close()


async def test_no_quorum_is_one_clear_bus_error(leaderless_nats: str) -> None:
    bus = await Bus.connect(leaderless_nats, name="respawn-test-no-quorum", replicas=3)
    try:
        started = time.monotonic()
        with pytest.raises(BusError) as caught:
            await bus.ensure_streams(unavailable_for=3.0)
        elapsed = time.monotonic() - started
    finally:
        await bus.close()
    message = str(caught.value)
    assert "JetStream is unavailable" in message, message
    assert "no metadata leader" in message, message
    # It waited for the given time (retrying), and not much longer.
    assert 3.0 <= elapsed < 20.0, elapsed
