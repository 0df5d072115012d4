"""The testbed's NATS with TLS (`respawn local up --nats-tls`), without the Kubernetes side:
nats-server started by respawn.testbed.nats with a certificate of a testbed CA, real service
processes started as the testbed starts them, and the CLI reading the streams over TLS.

The whole `respawn local up --nats-tls` is run in test_testbed_cli.py.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from respawn.testbed import pki
from respawn.testbed.cluster import State
from respawn.testbed.nats import start_nats
from respawn.testbed.process import stop_pid
from respawn.testbed.services import start_service
from shared.bus import Bus, BusError, TlsFiles
from tests.integration import cli

pytestmark = pytest.mark.nats

PASSWORD = "tls-testbed-password-that-must-not-leak"


@pytest.fixture
def tls_testbed(tmp_path: Path) -> Iterator[State]:
    """What `up --nats-tls` makes of NATS: a server requiring TLS with a certificate of the
    testbed's CA, and a state that names the CA."""
    authority = pki.generate(tmp_path / "pki", clients={})
    server = start_nats(tmp_path / "nats", tls=pki.serving_cert(authority, "nats"))
    (tmp_path / "logs").mkdir()
    state = State(
        state_dir=tmp_path,
        kubeconfig=tmp_path / "kubeconfig",
        nats_url=server.url,
        api_url="",
        pids={"nats-server": server.pid},
        ports={"nats": server.port},
        nats_ca_file=authority.ca_crt,
    )
    state.save()
    try:
        yield state
    finally:
        for name, pid in reversed(list(state.pids.items())):
            if name != "nats-server":
                stop_pid(pid)
        server.stop()


async def test_the_services_the_testbed_starts_are_ready_over_tls(tls_testbed: State) -> None:
    state = tls_testbed
    assert state.nats_url.startswith("tls://127.0.0.1:")
    # health and autopilot need no Kubernetes; started as `up` starts every service.
    for service in ("health", "autopilot"):
        await asyncio.to_thread(start_service, state, service)
    for service in ("health", "autopilot"):
        log = (state.state_dir / "logs" / f"{service}.log").read_text()
        assert f"connected to NATS at {state.nats_url}" in log, log


async def test_a_client_without_the_testbeds_ca_is_refused_saying_what_to_check(tls_testbed: State) -> None:
    port = tls_testbed.ports["nats"]
    # Asking for TLS or not (nats-py follows a server that requires it), the certificate of the
    # testbed's own CA cannot be verified with the system's.
    for url in (tls_testbed.nats_url, f"nats://127.0.0.1:{port}"):
        with pytest.raises(BusError) as refused:
            await Bus.connect(url, name="respawn-no-ca", connect_deadline=3.0)
        assert "certificate verify failed" in str(refused.value), url
        assert "check nats.tls.caFile" in str(refused.value), url


def test_the_cli_reads_the_streams_over_tls_with_the_testbeds_ca(tls_testbed: State) -> None:
    state = tls_testbed
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NATS_", "RESPAWN_"))}
    env["NATS_URL"] = state.nats_url
    # The services create the streams; here a bus with the CA does.
    asyncio.run(_ensure_streams(state))

    trusted = cli.respawn(
        "tail", "verdicts", "--no-follow", "-A", "-o", "json", env={**env, **state.nats_tls_env()}
    )
    assert trusted.returncode == 0, trusted.stderr
    assert trusted.stdout == ""

    # Without the CA: one error line naming what to set, and never a URL's password.
    port = state.ports["nats"]
    env["NATS_URL"] = f"tls://respawn:{PASSWORD}@127.0.0.1:{port}"
    refused = cli.respawn("tail", "verdicts", "--no-follow", env=env)
    assert refused.returncode == 4  # no connection (docs/cli.md, "Exit codes")
    [line] = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert "certificate verify failed" in line and "check RESPAWN_NATS_TLS_CA_FILE" in line, line
    assert f"tls://127.0.0.1:{port}" in line, line
    assert PASSWORD not in refused.stderr + refused.stdout


async def _ensure_streams(state: State) -> None:
    bus = await Bus.connect(state.nats_url, name="test-streams", tls=TlsFiles(ca_file=state.nats_ca_file))
    try:
        await bus.ensure_streams()
    finally:
        await bus.close()
