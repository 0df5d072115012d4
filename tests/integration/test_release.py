"""The release (`make release`, respawn/release.py): dist/install.yaml, installed, re-applied and
uninstalled on a real API server.

- install.yaml is deploy/release rendered: the base with the webhook in self-managed mode, every
  container image one of the release's two archives at pyproject.toml's versions; manifests that
  name another image are refused.
- An overlay that re-points the image ``respawn`` re-points every container that runs it: the four
  services and the webhook (the webhook is a kustomize Component of the base, and the base's
  images transformer runs after its components).
- On the testbed (which runs no Respawn pod): ``kubectl apply --server-side -f install.yaml``
  creates every object; the webhook configurations fail closed while no webhook answers; the
  webhook process, run with the Deployment's own arguments as the webhook's ServiceAccount,
  creates both Secrets and sets caBundle with the shipped RBAC, and its token may change nothing
  of the configurations but caBundle; applying again changes nothing and keeps caBundle; the
  documented uninstall removes everything but the CRD and its admission policy, and the
  AppWrappers stay, one held by Respawn's finalizer until it is removed by hand.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from respawn import natsauth, release
from respawn.testbed import manifests
from respawn.testbed.cluster import kubectl, kubectl_binary
from respawn.testbed.modes import Endpoints
from respawn.testbed.ports import free_port
from respawn.testbed.process import Proc, start, stop_pid, wait_until
from services.webhook import certs
from services.webhook.selfmanaged import decoded
from shared import natsusers
from shared.appwrapper.constants import FINALIZER
from tests.integration.test_deploy import service_account_kubeconfig
from tests.waiting import until_sync

REPO = Path(__file__).resolve().parents[2]
SYSTEM_NS = "respawn-system"
CONFIGURATION = "respawn-appwrapper"
CERT_SECRET = "respawn-webhook-cert"
VERSIONS = release.versions()


def docs_of(text: str) -> list[dict[str, Any]]:
    return release.documents(text)


def labels(doc: dict[str, Any]) -> dict[str, str]:
    return dict(doc["metadata"].get("labels") or {})


@pytest.fixture(scope="module")
def install(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """dist/install.yaml as `make release` writes it (without the images), in a directory here."""
    dist = tmp_path_factory.mktemp("dist")
    written = release.make(dist, manifests_only=True)
    assert written == [dist / "install.yaml", dist / "SHA256SUMS"]
    return dist / "install.yaml"


# ------------------------------------------------------------------------------ rendering


def test_install_yaml_is_the_release_overlay_with_the_versions_of_pyproject(install: Path) -> None:
    text = install.read_text()
    assert text.startswith(f"# Respawn {VERSIONS.respawn}, rendered from deploy/release by `make release`.\n")
    assert "kubectl apply --server-side -f install.yaml" in text
    assert f"kubectl delete -f install.yaml -l '{release.UNINSTALL_SELECTOR}'" in text
    # Beside it, what the delete without the selector does.
    assert "# WARNING: deleting the AppWrapper CRD (kubectl delete -f install.yaml without -l)" in text
    docs = docs_of(text)
    assert docs == docs_of(release.render())
    images = {(where, name): image for where, name, image in release.container_images(docs)}
    respawn_image = f"respawn:{VERSIONS.respawn}"
    assert images == {
        **{(f"Deployment/respawn-{s}", s): respawn_image for s in natsauth.SERVICES},
        ("Deployment/respawn-webhook", "webhook"): respawn_image,
        ("StatefulSet/respawn-nats", "nats"): f"respawn-nats:{VERSIONS.nats}",
    }
    assert VERSIONS.images == {
        respawn_image: f"respawn-{VERSIONS.respawn}.tar",
        f"respawn-nats:{VERSIONS.nats}": f"respawn-nats-{VERSIONS.nats}.tar",
    }
    sums = (install.parent / "SHA256SUMS").read_text().split()
    assert sums[1] == "install.yaml" and len(sums) == 2


def test_the_release_runs_the_webhook_self_managed_from_an_empty_dir(install: Path) -> None:
    docs = docs_of(install.read_text())
    (webhook,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "respawn-webhook"]
    spec = webhook["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert "--self-managed-cert" in container["args"]
    assert f"--nats-users-secret={natsusers.SECRET_NAME}" in container["args"]
    (certs_volume,) = [v for v in spec["volumes"] if v["name"] == "certs"]
    assert certs_volume == {"name": "certs", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "certs"]
    assert mount["readOnly"] is False
    (namespace,) = [e for e in container["env"] if e["name"] == "RESPAWN_WEBHOOK_NAMESPACE"]
    assert namespace["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    # Nothing of the cert-manager alternative.
    assert not [d for d in docs if d["apiVersion"].startswith("cert-manager.io/")]
    for d in docs:
        assert "cert-manager.io/inject-ca-from" not in (d["metadata"].get("annotations") or {})


def test_the_uninstall_selector_keeps_exactly_the_crd_and_its_admission_policy(install: Path) -> None:
    docs = docs_of(install.read_text())
    kept = {
        (d["kind"], d["metadata"]["name"])
        for d in docs
        if labels(d).get("app.kubernetes.io/component") == "crd"
    }
    assert kept == {
        ("CustomResourceDefinition", "appwrappers.workload.codeflare.dev"),
        ("ValidatingAdmissionPolicy", "appwrappers.workload.codeflare.dev-component-namespace"),
        ("ValidatingAdmissionPolicyBinding", "appwrappers.workload.codeflare.dev-component-namespace"),
    }
    assert release.KEEP_ON_UNINSTALL == "app.kubernetes.io/component=crd"
    assert release.UNINSTALL_SELECTOR == "app.kubernetes.io/component!=crd"


def test_manifests_naming_another_image_are_refused() -> None:
    docs = docs_of(release.render())
    with pytest.raises(release.ReleaseError) as refused:
        release.check_images(docs, release.Versions("9.9.9", VERSIONS.nats))
    message = str(refused.value)
    assert "deploy/release names images that are not in this release (respawn:9.9.9, " in message
    assert f"Deployment/respawn-webhook container webhook: respawn:{VERSIONS.respawn}" in message
    assert "StatefulSet/respawn-nats" not in message


def render_overlay(tmp_path: Path, base: str, images: list[dict[str, str]]) -> list[dict[str, Any]]:
    """An overlay of deploy/``base`` that sets ``images``, rendered as `kubectl kustomize` does."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    relative = os.path.relpath(REPO / "deploy" / base, overlay)
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({"resources": [relative], "images": images}))
    proc = subprocess.run(
        [kubectl_binary(), "kustomize", str(overlay)], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    return docs_of(out)


@pytest.mark.parametrize("base", ["base", "release", "overlays/local"])
def test_an_overlay_repointing_the_image_repoints_every_container(tmp_path: Path, base: str) -> None:
    nats = "respawn-nats" if base == "release" else "nats"
    docs = render_overlay(
        tmp_path,
        base,
        [
            {"name": "respawn", "newName": "registry.example/respawn", "newTag": "X"},
            {"name": nats, "newName": "registry.example/nats", "newTag": "v9"},
        ],
    )
    images = {(where, name): image for where, name, image in release.container_images(docs)}
    # Every deployable, and nothing else left behind (no Job, no init container).
    assert set(images) == {
        *((f"Deployment/respawn-{s}", s) for s in natsauth.SERVICES),
        ("Deployment/respawn-webhook", "webhook"),
        ("StatefulSet/respawn-nats", "nats"),
    }
    assert images.pop(("StatefulSet/respawn-nats", "nats")) == "registry.example/nats:v9"
    assert set(images.values()) == {"registry.example/respawn:X"}


# ------------------------------------------------------------------------------ on the testbed


def run(testbed: Endpoints, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return kubectl(testbed.kubeconfig, *args, check=False, timeout=timeout)


def applied(testbed: Endpoints, install: Path) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Every object of install.yaml as the API server holds it, by (kind, namespace, name)."""
    listed = json.loads(kubectl(testbed.kubeconfig, "get", "-f", str(install), "-o", "json").stdout)
    items = listed["items"] if listed.get("kind") == "List" else [listed]
    return {(i["kind"], i["metadata"].get("namespace", ""), i["metadata"]["name"]): i for i in items}


def ca_bundles(testbed: Endpoints) -> list[str]:
    bundles = []
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        conf = json.loads(kubectl(testbed.kubeconfig, "get", kind, CONFIGURATION, "-o", "json").stdout)
        bundles += [hook["clientConfig"].get("caBundle", "") for hook in conf["webhooks"]]
    return bundles


def secret_data(testbed: Endpoints, name: str) -> dict[str, bytes] | None:
    proc = run(testbed, "get", "secret", name, "-n", SYSTEM_NS, "-o", "json")
    return decoded(json.loads(proc.stdout)) if proc.returncode == 0 else None


# docs/deploy.md, "Uninstall": what lets an AppWrapper held by Respawn's finalizer go.
RELEASE_FINALIZERS = ("--type=merge", "-p", '{"metadata":{"finalizers":null}}')


def aw(testbed: Endpoints, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(
        kubectl(testbed.kubeconfig, "get", "appwrapper", name, "-n", namespace, "-o", "json").stdout
    )
    return found


def suspended_aw(name: str, *, finalizers: list[str] | None = None) -> dict[str, Any]:
    body = manifests.appwrapper(name, manifests.component(manifests.job(f"{name}-job")), suspend=True)
    if finalizers:
        body["metadata"]["finalizers"] = finalizers
    return body


def create_aw(
    testbed: Endpoints, namespace: str, body: dict[str, Any], *extra: str
) -> subprocess.CompletedProcess[str]:
    args = ("create", "-n", namespace, *extra, "-f", "-", "-o", "json")
    return kubectl(testbed.kubeconfig, *args, stdin=json.dumps(body), check=False)


def start_webhook_as_its_service_account(
    testbed: Endpoints, install: Path, directory: Path
) -> tuple[Proc, int]:
    """The webhook process with the release Deployment's own arguments (its port and files moved
    here), authenticated as the ServiceAccount respawn-webhook, so only the shipped RBAC applies."""
    (deployment,) = [
        d
        for d in docs_of(install.read_text())
        if d["kind"] == "Deployment" and d["metadata"]["name"] == "respawn-webhook"
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    moved = {
        "--port": str(port),
        "--cert-file": str(directory / "certs" / "tls.crt"),
        "--key-file": str(directory / "certs" / "tls.key"),
    }
    args = []
    for arg in container["args"]:
        flag = arg.split("=", 1)[0]
        args.append(f"{flag}={moved[flag]}" if flag in moved else arg)
    assert [a for a in args if a.startswith("--port=")] == [f"--port={port}"]
    token = kubectl(
        testbed.kubeconfig, "create", "token", "respawn-webhook", "-n", SYSTEM_NS, "--duration=1h"
    ).stdout.strip()
    kubeconfig = service_account_kubeconfig(testbed.kubeconfig, token, directory / "kubeconfig")
    env = {k: v for k, v in os.environ.items() if k != "RESPAWN_CONFIG"}
    env.update({"KUBECONFIG": str(kubeconfig), "RESPAWN_WEBHOOK_NAMESPACE": SYSTEM_NS})
    argv = [sys.executable, *container["command"][1:], "--host=127.0.0.1", *args]
    assert container["command"][:3] == ["python", "-m", "services.webhook"]
    return start("webhook", argv, directory / "webhook.log", env=env), port


def trusted_as_the_service(port: int, ca_pem: bytes) -> bool:
    """Whether a client that trusts only ``ca_pem`` accepts the webhook under the name the API
    server calls it by."""
    context = ssl.create_default_context(cadata=ca_pem.decode())
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname=f"respawn-webhook.{SYSTEM_NS}.svc"),
        ):
            return True
    except (ssl.SSLError, OSError):
        return False


# Kinds whose objects nothing but an apply changes (no controller writes their status or
# fills them in): applying the same manifests again must leave even their resourceVersion.
UNCHANGING = {
    "Namespace",
    "ServiceAccount",
    "ConfigMap",
    "Service",
    "Role",
    "RoleBinding",
    "ClusterRoleBinding",
    "NetworkPolicy",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
    "ValidatingAdmissionPolicyBinding",
}


@pytest.fixture
def installed(testbed: Endpoints, appwrapper_crd: Path, install: Path) -> Iterator[Path]:
    """install.yaml on the testbed until the test ends; uninstalled then in any case, so that no
    other test meets webhook configurations without a webhook."""
    try:
        yield install
    finally:
        run(
            testbed,
            "delete",
            "-f",
            str(install),
            "-l",
            release.UNINSTALL_SELECTOR,
            "--ignore-not-found",
            "--timeout=180s",
            timeout=240,
        )


@pytest.mark.testbed
def test_install_apply_again_and_uninstall_keep_the_appwrappers(
    testbed: Endpoints, namespace: str, installed: Path, tmp_path: Path
) -> None:
    install = installed
    docs = docs_of(install.read_text())
    # AppWrappers of users, before the install: one Respawn never touched, one it holds by its
    # finalizer (as it does once an AppWrapper has run).
    assert create_aw(testbed, namespace, suspended_aw("plain")).returncode == 0
    held = create_aw(testbed, namespace, suspended_aw("held", finalizers=[FINALIZER]))
    assert held.returncode == 0, held.stderr
    uids = {name: aw(testbed, namespace, name)["metadata"]["uid"] for name in ("plain", "held")}
    webhook: Proc | None = None
    try:
        # --- install: one command, every object, no PodSecurity complaint.
        first = run(testbed, "apply", "--server-side", "-f", str(install))
        assert first.returncode == 0, first.stderr
        assert "Warning" not in first.stderr, first.stderr
        lines = [line for line in first.stdout.splitlines() if line.strip()]
        assert len(lines) == len(docs) and all(line.endswith(" serverside-applied") for line in lines), (
            first.stdout
        )
        objects = applied(testbed, install)
        assert len(objects) == len(docs)
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            (hook,) = objects[(kind, "", CONFIGURATION)]["webhooks"]
            assert hook["failurePolicy"] == "Fail"
            assert "caBundle" not in hook["clientConfig"]

        # --- no webhook answers yet (no pod runs here): AppWrappers are refused, not let through.
        refused = until_sync(
            "the installed webhook configurations to be in force",
            lambda: create_aw(testbed, namespace, suspended_aw("refused"), "--dry-run=server"),
            done=lambda p: p.returncode != 0,
            within=30,
            every=0.3,
        )
        assert 'failed calling webhook "mutate.appwrappers.respawn.dev"' in refused.stderr, refused.stderr

        # --- the webhook, as its ServiceAccount with the Deployment's arguments: both Secrets, caBundle.
        webhook, port = start_webhook_as_its_service_account(testbed, install, tmp_path / "webhook")
        proc = webhook

        def ready() -> bool:
            data = secret_data(testbed, CERT_SECRET)
            return bool(data) and trusted_as_the_service(port, data[certs.CA_CERT])  # type: ignore[index]

        wait_until(proc, ready, timeout=90, what="serving the certificate of its Secret")
        data = secret_data(testbed, CERT_SECRET)
        assert data is not None
        expected = base64.b64encode(data[certs.CA_CERT]).decode()
        until_sync(
            "both caBundles to be set", lambda: ca_bundles(testbed), done=lambda b: b == [expected] * 2
        )
        users = until_sync("the NATS passwords", lambda: secret_data(testbed, natsusers.SECRET_NAME))
        assert set(users) == set(natsusers.DEFAULT_USERS)
        for user, password in users.items():
            natsauth.validate_password(user, password.decode())
        assert "forbidden" not in proc.log.read_text().lower(), proc.log.read_text()

        # --- its patch right covers caBundle and nothing else (the policy of the Component).
        as_webhook = tmp_path / "webhook" / "kubeconfig"

        def patch(kubeconfig: Path, ops: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
            args = ("patch", "mutatingwebhookconfiguration", CONFIGURATION, "--type=json", "--dry-run=server")
            return kubectl(kubeconfig, *args, "-p", json.dumps(ops), check=False)

        widen = [{"op": "add", "path": "/webhooks/0/rules/0/resources/-", "value": "secrets"}]
        refused = until_sync(
            "the webhook's own patches to be limited to caBundle",
            lambda: patch(as_webhook, widen),
            done=lambda p: p.returncode != 0,
            within=30,
            every=0.3,
        )
        assert "respawn-webhook may change only the caBundle of its webhook configurations" in refused.stderr
        fail_open = [{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Ignore"}]
        assert "may change only the caBundle" in patch(as_webhook, fail_open).stderr
        another = certs.issue(None, certs.Need.CA, ("x.example",), datetime.now(UTC))[certs.CA_CERT]
        replaced = {"op": "replace", "path": "/webhooks/0/clientConfig/caBundle"}
        other_ca = [{**replaced, "value": base64.b64encode(another).decode()}]
        assert patch(as_webhook, other_ca).returncode == 0
        # Only the webhook is held to it.
        assert patch(testbed.kubeconfig, widen).returncode == 0

        # --- again: nothing to change, nothing changed, the webhook's caBundle kept.
        diff = run(testbed, "diff", "--server-side", "--field-manager=kubectl", "-f", str(install))
        assert diff.returncode == 0, diff.stdout + diff.stderr
        before = applied(testbed, install)
        again = run(testbed, "apply", "--server-side", "-f", str(install))
        assert again.returncode == 0, again.stderr
        after = applied(testbed, install)
        for key, obj in after.items():
            assert obj["metadata"].get("generation") == before[key]["metadata"].get("generation"), key
            aggregated = obj["kind"] == "ClusterRole" and "aggregationRule" in obj
            if obj["kind"] in UNCHANGING or (obj["kind"] == "ClusterRole" and not aggregated):
                assert obj["metadata"]["resourceVersion"] == before[key]["metadata"]["resourceVersion"], key
        assert ca_bundles(testbed) == [expected] * 2
        stop_pid(proc.pid)
        webhook = None

        # --- uninstall: everything but the CRD and its policy; the AppWrappers stay.
        removed = run(
            testbed,
            "delete",
            "-f",
            str(install),
            "-l",
            release.UNINSTALL_SELECTOR,
            "--timeout=180s",
            timeout=240,
        )
        assert removed.returncode == 0, removed.stderr
        left = run(testbed, "get", "-f", str(install), "-o", "name", "--ignore-not-found")
        policy = "appwrappers.workload.codeflare.dev-component-namespace"
        assert sorted(left.stdout.split()) == [
            "customresourcedefinition.apiextensions.k8s.io/appwrappers.workload.codeflare.dev",
            f"validatingadmissionpolicy.admissionregistration.k8s.io/{policy}",
            f"validatingadmissionpolicybinding.admissionregistration.k8s.io/{policy}",
        ], left.stdout + left.stderr
        gone = run(testbed, "get", "namespace", SYSTEM_NS)
        assert gone.returncode != 0 and "NotFound" in gone.stderr  # and the Secrets the webhook made with it
        for name, uid in uids.items():
            assert aw(testbed, namespace, name)["metadata"]["uid"] == uid
        # Nothing checks AppWrappers now: created unchecked (docs/deploy.md says so).
        assert create_aw(testbed, namespace, suspended_aw("unchecked")).returncode == 0

        # --- the one Respawn held: deleted, it waits for its finalizer, which nobody removes now.
        assert run(testbed, "delete", "appwrapper", "held", "-n", namespace, "--wait=false").returncode == 0
        waiting = aw(testbed, namespace, "held")
        assert waiting["metadata"]["deletionTimestamp"] and waiting["metadata"]["finalizers"] == [FINALIZER]
        # The command docs/deploy.md gives lets it go.
        patched = run(testbed, "patch", "appwrapper", "held", "-n", namespace, *RELEASE_FINALIZERS)
        assert patched.returncode == 0, patched.stderr
        until_sync(
            "the released AppWrapper to be gone",
            lambda: run(testbed, "get", "appwrapper", "held", "-n", namespace),
            done=lambda p: p.returncode != 0 and "NotFound" in p.stderr,
        )
    finally:
        if webhook is not None:
            stop_pid(webhook.pid)
        # The test namespace goes after the test: nothing of it may wait for a finalizer.
        run(testbed, "patch", "appwrapper", "held", "-n", namespace, *RELEASE_FINALIZERS)
