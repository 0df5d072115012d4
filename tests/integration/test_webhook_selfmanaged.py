"""The webhook's self-managed mode on a real API server.

Webhook processes run on 127.0.0.1 with ``--self-managed-cert`` in a namespace of the test's own,
with ``--cert-host 127.0.0.1`` (the API server checks the IP it calls), and are registered with
``clientConfig.url`` for that namespace only, in configurations named for the test: they make the
Secret, set the caBundle the API server then trusts, and create the NATS passwords Secret; the
API server admits AppWrappers through them. The shipped RBAC is proven in test_release.py, where
the same mode runs as the webhook's own ServiceAccount.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import os
import socket
import ssl
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from respawn import natsauth
from respawn.testbed.cluster import kubectl
from respawn.testbed.modes import Endpoints
from respawn.testbed.ports import free_port
from respawn.testbed.process import Proc, start, stop_pid, wait_until
from services.webhook import certs
from services.webhook.selfmanaged import SelfManaged, SelfManagedOptions, decoded
from shared import natsusers
from shared.appwrapper.constants import USER_LABEL
from shared.kube import Kube
from tests.integration.test_webhook import job_aw
from tests.waiting import until_sync

pytestmark = pytest.mark.testbed

REPO = Path(__file__).resolve().parents[2]
CONFIGURATIONS = REPO / "deploy" / "webhook" / "configurations.yaml"
CERT_SECRET = "respawn-webhook-cert"
USERS_SECRET = natsusers.SECRET_NAME


@dataclass
class Replica:
    proc: Proc
    port: int
    directory: Path

    def served_certificate(self) -> x509.Certificate:
        """The certificate the replica serves now (not verified here)."""
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        with (
            socket.create_connection(("127.0.0.1", self.port), timeout=5) as raw,
            context.wrap_socket(raw) as tls,
        ):
            der = tls.getpeercert(binary_form=True)
        assert der
        return x509.load_der_x509_certificate(der)

    def trusted_by(self, ca_pem: bytes, name: str = "127.0.0.1") -> bool:
        """Whether a client trusting only ``ca_pem`` accepts the replica as ``name``."""
        context = ssl.create_default_context(cadata=ca_pem.decode())
        try:
            with (
                socket.create_connection(("127.0.0.1", self.port), timeout=5) as raw,
                context.wrap_socket(raw, server_hostname=name),
            ):
                return True
        except (ssl.SSLError, OSError):
            return False


def start_replica(
    testbed: Endpoints, namespace: str, directory: Path, *, configuration: str, port: int | None = None
) -> Replica:
    """A webhook process in self-managed mode for ``namespace``, as the testbed's admin."""
    directory.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    env = {k: v for k, v in os.environ.items() if k != "RESPAWN_CONFIG"}
    env["KUBECONFIG"] = str(testbed.kubeconfig)
    certs_dir = directory / "certs"
    argv = [sys.executable, "-m", "services.webhook.server", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--cert-file", str(certs_dir / "tls.crt"), "--key-file", str(certs_dir / "tls.key")]
    argv += ["--self-managed-cert", f"--namespace={namespace}", "--cert-host=127.0.0.1"]
    argv += [f"--configuration={configuration}", f"--nats-users-secret={USERS_SECRET}"]
    return Replica(start("webhook", argv, directory / "webhook.log", env=env), port, directory)


def secret(testbed: Endpoints, namespace: str, name: str) -> dict[str, Any] | None:
    proc = kubectl(testbed.kubeconfig, "get", "secret", name, "-n", namespace, "-o", "json", check=False)
    if proc.returncode != 0:
        assert "NotFound" in proc.stderr, proc.stderr
        return None
    found: dict[str, Any] = json.loads(proc.stdout)
    return found


def ca_bundles(testbed: Endpoints, configuration: str) -> list[bytes]:
    bundles = []
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        conf = json.loads(kubectl(testbed.kubeconfig, "get", kind, configuration, "-o", "json").stdout)
        for hook in conf["webhooks"]:
            bundles.append(base64.b64decode(hook["clientConfig"].get("caBundle", "")))
    return bundles


@pytest.fixture
def configuration(testbed: Endpoints, appwrapper_crd: Path, namespace: str) -> Iterator[str]:
    """deploy/webhook's two configurations under a name of the test's own, for ``namespace`` only,
    without a caBundle; their URLs are set by :func:`route`."""
    name = f"respawn-test-{namespace}"
    yield name
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        kubectl(testbed.kubeconfig, "delete", kind, name, "--ignore-not-found", check=False)


def route(testbed: Endpoints, namespace: str, name: str, mutating_port: int, validating_port: int) -> None:
    documents = list(yaml.safe_load_all(CONFIGURATIONS.read_text()))
    for conf, port in zip(documents, (mutating_port, validating_port), strict=True):
        conf["metadata"]["name"] = name
        for hook in conf["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}"}
            hook["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    kubectl(
        testbed.kubeconfig,
        "apply",
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": documents}),
    )


def create(testbed: Endpoints, namespace: str, body: dict[str, Any], *extra: str) -> Any:
    return kubectl(
        testbed.kubeconfig, "create", "-n", namespace, *extra, "-f", "-", stdin=json.dumps(body), check=False
    )


def test_two_replicas_started_together_end_with_one_ca_the_api_server_trusts_and_admit_through_it(
    testbed: Endpoints, namespace: str, configuration: str, tmp_path: Path
) -> None:
    # The ports first, so the configurations can name both replicas before either starts.
    mutating_port, validating_port = free_port(), free_port()
    route(testbed, namespace, configuration, mutating_port, validating_port)
    assert ca_bundles(testbed, configuration) == [b"", b""]
    # Without a caBundle the API server cannot trust anything there: refused, never let through.
    refused = until_sync(
        "the configurations to be in force",
        lambda: create(testbed, namespace, job_aw("early"), "--dry-run=server"),
        done=lambda p: p.returncode != 0 and "failed calling webhook" in p.stderr,
        within=30,
        every=0.3,
    )
    assert "mutate.appwrappers.respawn.dev" in refused.stderr

    replicas: list[Replica] = []
    try:
        # Started together: both find no Secret, both make one, one of the two creations wins.
        for index, port in enumerate((mutating_port, validating_port)):
            replicas.append(
                start_replica(
                    testbed, namespace, tmp_path / f"r{index}", configuration=configuration, port=port
                )
            )

        def ca_of_secret() -> bytes:
            found = decoded(secret(testbed, namespace, CERT_SECRET)) or {}
            return found.get(certs.CA_CERT, b"")

        for replica in replicas:
            wait_until(
                replica.proc,
                lambda r=replica: bool(ca_of_secret()) and r.trusted_by(ca_of_secret()),  # type: ignore[misc]
                timeout=60,
                what="serving a certificate of the Secret's CA",
            )
        data = decoded(secret(testbed, namespace, CERT_SECRET))
        assert data is not None
        # One CA, made once: whichever replica lost the race read and used the winner's.
        assert len(x509.load_pem_x509_certificates(data[certs.CA_CERT])) == 1
        logs = [r.proc.log.read_text() for r in replicas]
        assert sum(log.count(f"Secret {namespace}/{CERT_SECRET} created") for log in logs) == 1, logs
        for replica in replicas:
            assert replica.served_certificate() == x509.load_pem_x509_certificate(data[certs.CERT])
            assert replica.trusted_by(data[certs.CA_CERT])
        # Both configurations trust exactly that CA.
        until_sync(
            "both configurations to carry the Secret's CA",
            lambda: ca_bundles(testbed, configuration),
            done=lambda bundles: bundles == [data[certs.CA_CERT]] * 2,
            within=30,
        )
        # The API server now calls both replicas (mutating on one, validating on the other).
        admitted = until_sync(
            "an AppWrapper to be admitted through the webhooks",
            lambda: create(testbed, namespace, job_aw("through"), "-o", "json"),
            done=lambda p: p.returncode == 0,
            within=30,
            every=0.3,
        )
        assert USER_LABEL in json.loads(admitted.stdout)["metadata"]["labels"]
        denied = create(testbed, namespace, job_aw("badpath", [{"path": "template.spec.nosuch"}]))
        assert denied.returncode != 0 and "denied the request" in denied.stderr, denied.stderr
        assert "validate CREATE" in replicas[1].proc.log.read_text()
        assert "mutate CREATE" in replicas[0].proc.log.read_text()

        # And the NATS passwords, created once, one per user, each one nats-server reads back.
        users = decoded(secret(testbed, namespace, USERS_SECRET))
        assert users is not None and set(users) == set(natsusers.DEFAULT_USERS)
        for user, password in users.items():
            natsauth.validate_password(user, password.decode())
        assert sum(log.count(f"Secret {namespace}/{USERS_SECRET} created") for log in logs) == 1, logs
    finally:
        for replica in replicas:
            stop_pid(replica.proc.pid)


def put_secret(
    testbed: Endpoints, namespace: str, name: str, data: dict[str, bytes], kind: str = "Opaque"
) -> str:
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "type": kind,
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }
    created = kubectl(testbed.kubeconfig, "create", "-f", "-", "-o", "json", stdin=json.dumps(body))
    version: str = json.loads(created.stdout)["metadata"]["resourceVersion"]
    return version


def hosts(namespace: str) -> tuple[str, ...]:
    return certs.service_hosts("respawn-webhook", namespace, ("127.0.0.1",))


def test_an_expiring_certificate_is_renewed_under_the_same_ca_and_existing_nats_passwords_are_left_alone(
    testbed: Endpoints, namespace: str, configuration: str, tmp_path: Path
) -> None:
    now = dt.datetime.now(dt.UTC)
    # Issued 250 days ago: 115 of its 365 days left, less than a third.
    old = certs.issue(None, certs.Need.CA, hosts(namespace), now - dt.timedelta(days=250))
    assert certs.assess(old, hosts(namespace), now).need is certs.Need.SERVING
    cert_version = put_secret(testbed, namespace, CERT_SECRET, old, "kubernetes.io/tls")
    own_password = natsusers.generate_password().encode()
    users_version = put_secret(testbed, namespace, USERS_SECRET, {"watcher": own_password})
    port = free_port()
    route(testbed, namespace, configuration, port, port)
    replica = start_replica(testbed, namespace, tmp_path / "r", configuration=configuration, port=port)
    try:
        wait_until(
            replica.proc,
            lambda: (
                replica.trusted_by(old[certs.CA_CERT])
                and replica.served_certificate() != x509.load_pem_x509_certificate(old[certs.CERT])
            ),
            timeout=60,
            what="serving a renewed certificate",
        )
        found = secret(testbed, namespace, CERT_SECRET)
        assert found is not None
        assert found["metadata"]["resourceVersion"] != cert_version
        assert found["type"] == "kubernetes.io/tls"
        data = decoded(found)
        assert data is not None
        # The CA is kept, so the configurations' caBundle does not change with the renewal.
        assert (data[certs.CA_CERT], data[certs.CA_KEY]) == (old[certs.CA_CERT], old[certs.CA_KEY])
        renewed = x509.load_pem_x509_certificate(data[certs.CERT])
        assert abs(renewed.not_valid_before_utc - (now - certs.BACKDATE)) < dt.timedelta(minutes=5)
        assert replica.served_certificate() == renewed
        assert certs.assess(data, hosts(namespace), dt.datetime.now(dt.UTC)).need is certs.Need.NOTHING
        until_sync(
            "both configurations to carry the CA",
            lambda: ca_bundles(testbed, configuration),
            done=lambda bundles: bundles == [old[certs.CA_CERT]] * 2,
            within=30,
        )
        # The passwords NATS runs with are never touched, even with users missing.
        users = secret(testbed, namespace, USERS_SECRET)
        assert users is not None
        assert users["metadata"]["resourceVersion"] == users_version
        assert decoded(users) == {"watcher": own_password}
        log = replica.proc.log.read_text()
        assert (
            f"Secret {namespace}/{USERS_SECRET} has no password for autopilot, health, lifecycle, "
            "subscriber; left as it is"
        ) in log
        assert f"Secret {namespace}/{CERT_SECRET}: the serving certificate expires at" in log
    finally:
        stop_pid(replica.proc.pid)


class Stalled:
    """The Kube connection of a replica that reads the Secret, then waits for ``go`` before it
    goes on: another replica writes meanwhile, so what this one writes next is stale."""

    def __init__(self, kube: Kube, secret_name: str, go: asyncio.Event) -> None:
        self._kube = kube
        self._secret = secret_name
        self._go = go
        self.stalled = asyncio.Event()

    async def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        first = method == "GET" and path.endswith(f"/secrets/{self._secret}") and not self.stalled.is_set()
        try:
            return await self._kube.request(method, path, **kwargs)
        finally:
            if first:
                self.stalled.set()
                await self._go.wait()


def managed_options(namespace: str, directory: Path) -> SelfManagedOptions:
    return SelfManagedOptions(
        namespace=namespace,
        cert_secret=CERT_SECRET,
        service="respawn-webhook",
        configuration="respawn-test-absent",
        extra_hosts=("127.0.0.1",),
        nats_users_secret="",
        cert_file=directory / "tls.crt",
        key_file=directory / "tls.key",
    )


@pytest.mark.parametrize("existing", [False, True], ids=["creating", "renewing"])
async def test_a_replica_that_loses_the_race_uses_what_the_winner_wrote(
    testbed: Endpoints, namespace: str, tmp_path: Path, existing: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="services.webhook.selfmanaged")
    now = dt.datetime.now(dt.UTC)
    if existing:
        old = certs.issue(None, certs.Need.CA, hosts(namespace), now - dt.timedelta(days=300))
        put_secret(testbed, namespace, CERT_SECRET, old, "kubernetes.io/tls")
    kube_a, kube_b = await Kube.connect(testbed.kubeconfig), await Kube.connect(testbed.kubeconfig)
    try:
        go = asyncio.Event()
        stalled = Stalled(kube_a, CERT_SECRET, go)
        loser = SelfManaged(stalled, managed_options(namespace, tmp_path / "a"))  # type: ignore[arg-type]
        winner = SelfManaged(kube_b, managed_options(namespace, tmp_path / "b"))
        losing = asyncio.create_task(loser.sync_certificate())
        await asyncio.wait_for(stalled.stalled.wait(), 10)
        # The loser has read (nothing, or the expiring Secret) and waits; the winner writes.
        await winner.sync_certificate()
        go.set()
        await asyncio.wait_for(losing, 30)
    finally:
        await kube_a.close()
        await kube_b.close()
    # Its write was refused (a 409: created already, or a resourceVersion no longer current), and
    # it read and used the winner's.
    assert f"Secret {namespace}/{CERT_SECRET} was written by another replica; reading it" in caplog.text
    stored = decoded(secret(testbed, namespace, CERT_SECRET))
    assert stored is not None
    for directory in ("a", "b"):
        assert (tmp_path / directory / "tls.crt").read_bytes() == stored[certs.CERT]
        assert (tmp_path / directory / "tls.key").read_bytes() == stored[certs.KEY]
    assert loser.ca_bundle == winner.ca_bundle == stored[certs.CA_CERT]
    if existing:
        assert stored[certs.CA_CERT] == old[certs.CA_CERT]
        assert stored[certs.CERT] != old[certs.CERT]
