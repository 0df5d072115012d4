"""NATS over TLS as deployed by deploy/nats/tls (and deploy/nats/tls/cert-manager): what the
manifests say, and that what they say works on real nats-servers.

- Without the Component nothing is encrypted; with it, every client connection and every route
  uses the certificate of the Secret respawn-nats-tls, mounted where the configuration reads it;
  a reloader picks up a renewed certificate; the services connect to a tls:// URL and trust the
  Secret's CA, of which alone they mount.
- cert-manager's Certificate names the host the services connect to and every route's host, for
  server and client use, and is signed by a CA of Respawn's own.
- The rendered NATS configuration (one server, as the local overlay with the Component), with a
  Secret of this test's own where the pod mounts it, runs a server that requires TLS; a service
  process configured from the rendered ConfigMaps becomes ready over it, and a client without the
  CA is refused with the error that says what to check. Two servers configured with the rendered
  route block, with a certificate of the Certificate's usages, form their routes over TLS.

test_deploy.py runs the overlay deploy/overlays/nats-tls through the checks every target passes
(server-side dry run, hardening, nats-server -t).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from respawn import natsauth
from respawn.testbed.cluster import kubectl_binary
from respawn.testbed.nats import NatsServer, start_nats
from respawn.testbed.ports import free_port
from respawn.testbed.services import spawn_service
from shared.bus import Bus, BusError
from tests.integration.test_deploy import (
    DEPLOY,
    NATS_TLS_SECRET,
    SERVICES,
    SYSTEM_NS,
    build,
    configmap,
    nats_tls_mount,
    nats_tls_secret,
    one,
    pod_specs,
)
from tests.waiting import until_sync

pytestmark = pytest.mark.nats

TLS = "overlays/nats-tls"
COMPONENT = DEPLOY / "nats" / "tls"
CERT_MANAGER = COMPONENT / "cert-manager"
# What a tls { } block names, in nats.conf syntax.
TLS_FILE = re.compile(r"^\s*(cert_file|key_file|ca_file):\s*(\S+)\s*$", re.MULTILINE)


def render(directory: Path, *, resources: list[Path], components: list[Path]) -> list[dict[str, Any]]:
    """``kubectl kustomize`` of an overlay of ``resources`` with ``components``, written here."""
    directory.mkdir(parents=True, exist_ok=True)
    overlay = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(r, directory) for r in resources],
        "components": [os.path.relpath(c, directory) for c in components],
    }
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    proc = subprocess.run(
        [kubectl_binary(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def tls_files(conf: str) -> dict[str, str]:
    return {key: value.strip('"') for key, value in TLS_FILE.findall(conf)}


def service_ca_mount(docs: list[dict[str, Any]], deployment: str) -> tuple[str, dict[str, Any]] | None:
    """Where a Deployment mounts the Secret respawn-nats-tls, and that volume (None: it does not)."""
    spec = pod_specs(docs)[deployment]
    volumes = {
        v["name"]: v for v in spec["volumes"] if (v.get("secret") or {}).get("secretName") == NATS_TLS_SECRET
    }
    (container,) = spec["containers"]
    for mount in container.get("volumeMounts") or []:
        if mount["name"] in volumes:
            return mount["mountPath"], volumes[mount["name"]]
    return None


@pytest.fixture(scope="module")
def tls_docs() -> list[dict[str, Any]]:
    return build(TLS)


# ------------------------------------------------------------------------------ the manifests


@pytest.mark.parametrize("target", ["base", "overlays/local"])
def test_without_the_component_nothing_is_encrypted(target: str) -> None:
    docs = build(target)
    files = configmap(docs, "respawn-nats-config")["data"]
    assert "tls {" not in files["tls.conf"] and "tls {" not in files["cluster-tls.conf"]
    assert nats_tls_mount(docs) is None
    assert "RESPAWN_NATS_URL" not in configmap(docs, "respawn-env")["data"]
    for service in SERVICES:
        assert service_ca_mount(docs, f"respawn-{service}") is None


def test_every_connection_and_route_uses_the_mounted_secret(tls_docs: list[dict[str, Any]]) -> None:
    files = configmap(tls_docs, "respawn-nats-config")["data"]
    mount = nats_tls_mount(tls_docs)
    assert mount is not None
    expected = {
        "cert_file": f"{mount}/tls.crt",
        "key_file": f"{mount}/tls.key",
        "ca_file": f"{mount}/ca.crt",
    }
    # Clients (tls.conf, included at the top level) and routes (cluster-tls.conf, included in the
    # cluster block) alike.
    assert tls_files(files["tls.conf"]) == expected
    assert tls_files(files["cluster-tls.conf"]) == expected
    assert "include ./tls.conf" in files["nats.conf"]
    assert "include ./cluster-tls.conf" in files["cluster.conf"]


def test_a_renewed_certificate_is_reloaded_by_the_sidecar(tls_docs: list[dict[str, Any]]) -> None:
    spec = pod_specs(tls_docs)["respawn-nats"]
    # The reloader signals nats-server through its pid file: one process namespace for the pod.
    assert spec["shareProcessNamespace"] is True
    containers = {c["name"]: c for c in spec["containers"]}
    reloader = containers["reloader"]
    args = reloader["args"]
    pid_file = re.search(
        r"^pid_file:\s*(\S+)", configmap(tls_docs, "respawn-nats-config")["data"]["nats.conf"], re.M
    )
    assert pid_file is not None
    assert args[args.index("-pid") + 1] == pid_file.group(1)
    watched = {args[i + 1] for i, arg in enumerate(args) if arg == "-config"}
    mount = nats_tls_mount(tls_docs)
    assert {f"{mount}/tls.crt", f"{mount}/tls.key", f"{mount}/ca.crt"} <= watched
    # It sees the same files (and the pid file) where the server does.
    server_mounts = {m["name"]: m["mountPath"] for m in containers["nats"]["volumeMounts"]}
    reloader_mounts = {m["name"]: m["mountPath"] for m in reloader["volumeMounts"]}
    for volume in ("tls", "run", "config"):
        assert reloader_mounts[volume] == server_mounts[volume], volume


def test_the_services_connect_over_tls_trusting_only_the_secrets_ca(tls_docs: list[dict[str, Any]]) -> None:
    env = configmap(tls_docs, "respawn-env")["data"]
    url = urlparse(env["RESPAWN_NATS_URL"])
    assert url.scheme == "tls"
    # The client Service of the NATS servers.
    assert url.hostname == one(tls_docs, "Service", "respawn-nats")["metadata"]["name"]
    for service in SERVICES:
        found = service_ca_mount(tls_docs, f"respawn-{service}")
        assert found is not None, service
        path, volume = found
        assert env["RESPAWN_NATS_TLS_CA_FILE"] == f"{path}/ca.crt"
        # The CA only: the server's private key stays in the NATS pods.
        assert volume["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    # The webhook never connects to NATS.
    assert service_ca_mount(tls_docs, "respawn-webhook") is None


def covers(name: str, host: str) -> bool:
    """Whether certificate name ``name`` (a wildcard stands for one label) matches ``host``."""
    if name.startswith("*."):
        first, _, rest = host.partition(".")
        return bool(first) and rest == name[2:]
    return name == host


def test_cert_manager_issues_a_certificate_for_every_client_and_route_host(
    tls_docs: list[dict[str, Any]],
) -> None:
    certificate = one(tls_docs, "Certificate", "respawn-nats")
    spec = certificate["spec"]
    assert spec["secretName"] == NATS_TLS_SECRET
    host = urlparse(configmap(tls_docs, "respawn-env")["data"]["RESPAWN_NATS_URL"]).hostname
    routes = re.findall(
        r"nats://([^:\s]+):\d+", configmap(tls_docs, "respawn-nats-config")["data"]["cluster.conf"]
    )
    assert len(routes) == 3
    hosts = [host, f"{host}.{SYSTEM_NS}.svc", *routes, *(f"{r}.{SYSTEM_NS}.svc" for r in routes)]
    for wanted in hosts:
        assert any(covers(name, str(wanted)) for name in spec["dnsNames"]), wanted
    # Routes verify each other both ways: the one certificate serves as client too.
    assert {"server auth", "client auth"} <= set(spec["usages"])
    # Signed by Respawn's own CA, itself from the self-signed issuer; everything in one namespace.
    issuer = one(tls_docs, "Issuer", spec["issuerRef"]["name"])
    ca = one(tls_docs, "Certificate", "respawn-nats-ca")
    assert issuer["spec"]["ca"]["secretName"] == ca["spec"]["secretName"]
    assert ca["spec"]["isCA"] is True
    assert "selfSigned" in one(tls_docs, "Issuer", ca["spec"]["issuerRef"]["name"])["spec"]
    for kind, name in (("Certificate", "respawn-nats"), ("Certificate", "respawn-nats-ca")):
        assert one(tls_docs, kind, name)["metadata"]["namespace"] == SYSTEM_NS


# ------------------------------------------------------------------------ on real servers


@pytest.fixture
def single_server_docs(tmp_path: Path) -> list[dict[str, Any]]:
    """One server with TLS: the local overlay with both Components."""
    return render(
        tmp_path / "overlay", resources=[DEPLOY / "overlays" / "local"], components=[COMPONENT, CERT_MANAGER]
    )


def start_rendered_server(
    docs: list[dict[str, Any]], secret: Path, directory: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[NatsServer, dict[str, str]]:
    """nats-server with the rendered configuration, the Secret's files from ``secret``; returns
    it and the users' passwords."""
    files = dict(configmap(docs, "respawn-nats-config")["data"])
    mount = nats_tls_mount(docs)
    assert mount is not None
    run = directory / "run"
    run.mkdir(parents=True)
    for name, text in files.items():
        # The pod's paths, here: the Secret, the pid file; the store is given by start_nats.
        text = text.replace(f"{mount}/", f"{secret}/").replace("/var/run/nats/", f"{run}/")
        text = re.sub(r"^\s*store_dir:.*$", "", text, flags=re.MULTILINE)
        (directory / name).write_text(text)
    passwords = {u.name: natsauth.generate_password() for u in natsauth.default_users()}
    # The pod's environment: its name and the users' passwords (auth.conf reads them).
    monkeypatch.setenv("POD_NAME", "respawn-nats-0")
    for user in natsauth.default_users():
        monkeypatch.setenv(user.password_variable, passwords[user.name])
    return start_nats(directory / "store", config_file=directory / "nats.conf"), passwords


async def test_a_service_configured_by_the_manifests_is_ready_over_tls_and_a_client_without_the_ca_is_refused(
    single_server_docs: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = single_server_docs
    certificate = one(docs, "Certificate", "respawn-nats")["spec"]
    # A certificate with the names cert-manager would put in it.
    secret = nats_tls_secret(tmp_path / "secret", dns_names=tuple(certificate["dnsNames"]))
    server, passwords = await asyncio.to_thread(
        start_rendered_server, docs, secret, tmp_path / "nats", monkeypatch
    )
    try:
        # The service's environment as its Deployment builds it: respawn-env, the configuration
        # file and its NATS user. The CA sits where the pod mounts it (here, a directory of its
        # own holding ca.crt alone); the URL's host is the Service, which resolves only in the
        # cluster, so the server is reached on loopback under that name.
        env = dict(configmap(docs, "respawn-env")["data"])
        found = service_ca_mount(docs, "respawn-autopilot")
        assert found is not None
        ca_dir = tmp_path / "service-ca"
        ca_dir.mkdir()
        (ca_dir / "ca.crt").write_bytes((secret / "ca.crt").read_bytes())
        env["RESPAWN_NATS_TLS_CA_FILE"] = env["RESPAWN_NATS_TLS_CA_FILE"].replace(found[0], str(ca_dir))
        config = tmp_path / "config.yaml"
        config.write_text(configmap(docs, "respawn-config")["data"]["config.yaml"])
        url = urlparse(env["RESPAWN_NATS_URL"])
        env |= {
            "RESPAWN_CONFIG": str(config),
            "RESPAWN_NATS_TLS_SERVER_NAME": str(url.hostname),
            "NATS_USER": "autopilot",
            "NATS_PASSWORD": passwords["autopilot"],
        }
        loopback = f"{url.scheme}://127.0.0.1:{server.port}"
        service = await asyncio.to_thread(
            spawn_service,
            "autopilot",
            kubeconfig=tmp_path / "unused-kubeconfig",
            nats_url=loopback,
            log_dir=tmp_path / "logs",
            env=env,
        )
        try:
            log = (tmp_path / "logs" / "autopilot.log").read_text()
            assert f"connected to NATS at {loopback}" in log
            assert passwords["autopilot"] not in log
        finally:
            await asyncio.to_thread(service.stop)

        # Without the CA: refused, saying what to check.
        with pytest.raises(BusError) as refused:
            await Bus.connect(
                loopback,
                name="respawn-no-ca",
                user="autopilot",
                password=passwords["autopilot"],
                connect_deadline=3.0,
            )
        assert "certificate verify failed" in str(refused.value)
        assert "check nats.tls.caFile" in str(refused.value)
    finally:
        await asyncio.to_thread(server.stop)


def routes(server: NatsServer) -> int:
    with urllib.request.urlopen(f"{server.monitor_url}/routez", timeout=2) as resp:
        return int(json.load(resp)["num_routes"])


def test_routes_form_over_tls_with_the_rendered_route_block(
    tls_docs: list[dict[str, Any]], tmp_path: Path
) -> None:
    # A certificate for server and client use, as the Certificate asks (routes verify each other
    # both ways: a serving certificate alone fails the handshake), for the name the routes use here.
    assert "client auth" in one(tls_docs, "Certificate", "respawn-nats")["spec"]["usages"]
    secret = nats_tls_secret(tmp_path / "secret", dns_names=("localhost",))
    mount = nats_tls_mount(tls_docs)
    route_tls = configmap(tls_docs, "respawn-nats-config")["data"]["cluster-tls.conf"].replace(
        f"{mount}/", f"{secret}/"
    )
    cluster_ports = [free_port(), free_port()]
    servers: list[NatsServer] = []
    try:
        for index, port in enumerate(cluster_ports):
            directory = tmp_path / f"server-{index}"
            directory.mkdir()
            (directory / "cluster-tls.conf").write_text(route_tls)
            other = cluster_ports[1 - index]
            (directory / "nats.conf").write_text(
                "cluster {\n"
                "  name: respawn\n"
                f"  listen: 127.0.0.1:{port}\n"
                "  include ./cluster-tls.conf\n"
                f"  routes: [nats://localhost:{other}]\n"
                "}\n"
            )
            servers.append(start_nats(directory / "store", config_file=directory / "nats.conf"))
        for server in servers:
            until_sync(
                f"a TLS route on the server at {server.url}", lambda s=server: routes(s) > 0, within=30
            )
        log = (servers[0].log_file).read_text()
        assert "TLS Handshake Failure" not in log, log
    finally:
        for server in servers:
            server.stop()
