"""The bus over TLS (and with credentials) against a real nats-server.

The certificates come from the testbed's PKI helper: a CA of the test's own, a serving
certificate for 127.0.0.1 and a client certificate for mutual TLS.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from respawn.testbed import pki
from respawn.testbed.nats import NatsServer, start_nats
from shared import subjects
from shared.bus import Bus, BusError, Delivery, TlsFiles
from shared.messages import ObjectRef, Verdict
from tests.waiting import until

pytestmark = pytest.mark.nats


def uid() -> str:
    return uuid.uuid4().hex[:10]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> pki.Pki:
    return pki.generate(tmp_path_factory.mktemp("pki"), clients={"nats-client": ("respawn-test", ())})


def tls_conf(certs: pki.Pki, *, verify_clients: bool) -> str:
    return f"""
tls {{
  cert_file: "{certs.apiserver_crt}"
  key_file: "{certs.apiserver_key}"
  ca_file: "{certs.ca_crt}"
  verify: {"true" if verify_clients else "false"}
  timeout: 2
}}
"""


@pytest.fixture
def server_with(tmp_path: Path) -> Iterator[list[NatsServer]]:
    started: list[NatsServer] = []
    yield started
    for server in started:
        server.stop()


def start_with_config(directory: Path, conf: str) -> NatsServer:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "nats.conf").write_text(conf)
    return start_nats(directory, config_file=directory / "nats.conf")


async def start(started: list[NatsServer], directory: Path, conf: str) -> NatsServer:
    server = await asyncio.to_thread(start_with_config, directory, conf)
    started.append(server)
    return server


@pytest.fixture
async def tls_server(
    certs: pki.Pki, tmp_path: Path, server_with: list[NatsServer]
) -> AsyncIterator[NatsServer]:
    yield await start(server_with, tmp_path / "tls", tls_conf(certs, verify_clients=False))


async def round_trip(bus: Bus) -> None:
    await bus.ensure_streams()
    subject = subjects.verdict("tls", uid())
    seen: list[int] = []

    async def handler(msg: Verdict, delivery: Delivery) -> None:
        seen.append(msg.seq)

    await bus.consume(subjects.VERDICTS_STREAM, f"t_{uid()}", subject, Verdict, handler)
    verdict = Verdict(
        ref=ObjectRef(namespace="tls", name="a"), state="Healthy", decided_at=datetime.now(UTC), seq=7
    )
    await bus.publish(subject, verdict, msg_id=None)
    await until("the message over TLS", lambda: seen == [7])


async def test_the_bus_connects_over_tls_with_the_ca(tls_server: NatsServer, certs: pki.Pki) -> None:
    bus = await Bus.connect(tls_server.url, name=f"test-{uid()}", tls=TlsFiles(ca_file=certs.ca_crt))
    try:
        assert bus.nc._server_info.get("tls_required") is True
        await round_trip(bus)
    finally:
        await bus.close()


async def test_without_the_ca_the_server_is_refused_with_a_clear_error(tls_server: NatsServer) -> None:
    with pytest.raises(BusError) as info:
        await Bus.connect(tls_server.url, name=f"test-{uid()}", connect_deadline=3.0)
    message = str(info.value)
    assert "certificate verify failed" in message
    assert "check nats.tls.caFile" in message


async def test_a_server_signed_by_another_ca_is_refused(
    tls_server: NatsServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    other = pki.generate(tmp_path_factory.mktemp("other-pki"), clients={})
    with pytest.raises(BusError, match="certificate verify failed"):
        await Bus.connect(
            tls_server.url, name=f"test-{uid()}", tls=TlsFiles(ca_file=other.ca_crt), connect_deadline=3.0
        )


async def test_mutual_tls_needs_the_client_certificate(
    certs: pki.Pki, tmp_path: Path, server_with: list[NatsServer]
) -> None:
    server = await start(server_with, tmp_path / "mtls", tls_conf(certs, verify_clients=True))
    with pytest.raises(BusError, match="could not connect"):
        await Bus.connect(
            server.url, name=f"test-{uid()}", tls=TlsFiles(ca_file=certs.ca_crt), connect_deadline=3.0
        )
    crt, key = certs.client("nats-client")
    bus = await Bus.connect(
        server.url, name=f"test-{uid()}", tls=TlsFiles(ca_file=certs.ca_crt, cert_file=crt, key_file=key)
    )
    try:
        await round_trip(bus)
    finally:
        await bus.close()


async def test_tls_configured_against_a_server_without_tls_is_refused(nats_url: str, certs: pki.Pki) -> None:
    with pytest.raises(BusError, match=r"does not require TLS although nats\.tls is configured"):
        await Bus.connect(
            nats_url, name=f"test-{uid()}", tls=TlsFiles(ca_file=certs.ca_crt), connect_deadline=3.0
        )


PASSWORD = "s3cret-Password-that-must-not-leak"

AUTH_CONF = f"""
authorization {{
  users = [ {{user: respawn, password: "{PASSWORD}"}} ]
}}
"""


async def test_credentials_in_a_url_are_never_logged(
    tmp_path: Path, server_with: list[NatsServer], caplog: pytest.LogCaptureFixture
) -> None:
    server = await start(server_with, tmp_path / "auth", AUTH_CONF)
    url = f"nats://respawn:{PASSWORD}@127.0.0.1:{server.port}"
    with caplog.at_level(logging.DEBUG):
        bus = await Bus.connect(url, name=f"test-{uid()}")
        try:
            await round_trip(bus)
        finally:
            await bus.close()
        assert f"connected to NATS at nats://127.0.0.1:{server.port}" in caplog.text

        wrong = f"nats://respawn:{PASSWORD}-wrong@127.0.0.1:{server.port}"
        with pytest.raises(BusError) as refused:
            await Bus.connect(wrong, name=f"test-{uid()}", connect_deadline=2.0)
        with pytest.raises(BusError) as unreachable:
            await Bus.connect(
                f"nats://respawn:{PASSWORD}@127.0.0.1:1", name=f"test-{uid()}", connect_deadline=1.0
            )
    for message in (str(refused.value), str(unreachable.value), caplog.text):
        assert PASSWORD not in message
    assert "authorization" in str(refused.value).lower() and "check the NATS credentials" in str(
        refused.value
    )
    assert "nats://127.0.0.1:1" in str(unreachable.value)


async def test_an_nkey_seed_file_logs_in(tmp_path: Path, server_with: list[NatsServer]) -> None:
    nkeys = pytest.importorskip(
        "nkeys", reason="nkey authentication needs the nkeys package (nats-py[nkeys])"
    )
    import nacl.signing  # nkeys' own dependency

    seed = nkeys.encode_seed(nacl.signing.SigningKey.generate().encode(), nkeys.PREFIX_BYTE_USER)
    user = nkeys.from_seed(bytearray(seed)).public_key.decode()
    server = await start(
        server_with, tmp_path / "nkey", f"authorization {{ users = [ {{nkey: {user}}} ] }}\n"
    )
    seed_file = tmp_path / "user.nk"
    seed_file.write_bytes(seed)
    bus = await Bus.connect(server.url, name=f"test-{uid()}", nkey_seed_file=seed_file)
    try:
        await round_trip(bus)
    finally:
        await bus.close()
