"""The AppWrapper admission webhooks on a real API server.

The webhook runs as its own process on 127.0.0.1 with a serving certificate made here, and is
registered with ``clientConfig.url`` for the test's namespace only (a namespaceSelector), so
other tests in the session never reach it. Requests are made with kubectl, as an admin and as
a ServiceAccount user ``alice`` with a namespaced Role, so the API server's own admission chain
(mutation, schema, validation) decides exactly as it would for a person.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import json
import os
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from respawn.testbed import manifests
from respawn.testbed.cluster import kubectl, kubectl_binary
from respawn.testbed.modes import Endpoints
from respawn.testbed.ports import free_port
from respawn.testbed.process import Proc, start, stop_pid, wait_until
from services.webhook.admission import sanitize_label
from shared.appwrapper.constants import APPWRAPPER_LABEL, QUEUE_NAME_LABEL, USER_ID_LABEL, USER_LABEL
from tests.waiting import until_sync

pytestmark = pytest.mark.testbed

REPO = Path(__file__).resolve().parents[2]
WEBHOOK_DIR = REPO / "deploy" / "webhook"
DEFAULT_QUEUE = "default-queue"


# ---------------------------------------------------------------------------------------------
# The webhook process


def _ip_serving_cert(directory: Path) -> tuple[Path, Path, bytes]:
    """A CA and a serving certificate for the IP 127.0.0.1 (the API server checks IP SANs)."""
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "respawn-webhook-test-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    crt_path, key_path = directory / "tls.crt", directory / "tls.key"
    crt_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return crt_path, key_path, ca.public_bytes(serialization.Encoding.PEM)


@dataclass
class Webhook:
    proc: Proc
    port: int
    ca_pem: bytes

    @property
    def base_url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cadata=self.ca_pem.decode())

    def post(self, path: str, body: bytes) -> dict[str, Any]:
        req = urllib.request.Request(
            self.base_url + path, data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        with urllib.request.urlopen(req, timeout=10, context=self.ssl_context()) as resp:
            assert resp.status == 200
            answer: dict[str, Any] = json.loads(resp.read())
            return answer

    def healthy(self) -> bool:
        with urllib.request.urlopen(
            self.base_url + "/healthz", timeout=2, context=self.ssl_context()
        ) as resp:
            return bool(resp.status == 200)


@pytest.fixture(scope="module")
def webhook(
    testbed: Endpoints, appwrapper_crd: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Webhook]:
    directory = tmp_path_factory.mktemp("webhook")
    crt, key, ca_pem = _ip_serving_cert(directory)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "RESPAWN_CONFIG"}
    env.update({"KUBECONFIG": str(testbed.kubeconfig), "RESPAWN_DEFAULT_QUEUE_NAME": DEFAULT_QUEUE})
    argv = [sys.executable, "-m", "services.webhook.server", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--cert-file", str(crt), "--key-file", str(key)]
    proc = start("webhook", argv, directory / "webhook.log", env=env)
    hook = Webhook(proc, port, ca_pem)
    try:
        wait_until(proc, hook.healthy, timeout=30, what="serving /healthz")
        yield hook
    finally:
        stop_pid(proc.pid)


def _configurations(namespace: str, hook: Webhook) -> list[dict[str, Any]]:
    """deploy/webhook's configurations, pointed at the test process and limited to ``namespace``.

    Everything else (rules, match conditions, failure policy) is exactly as deployed.
    """
    documents = list(yaml.safe_load_all((WEBHOOK_DIR / "configurations.yaml").read_text()))
    ca_bundle = base64.b64encode(hook.ca_pem).decode()
    for conf in documents:
        conf["metadata"]["name"] = f"respawn-test-{namespace}"
        for hook_spec in conf["webhooks"]:
            path = hook_spec["clientConfig"]["service"]["path"]
            hook_spec["clientConfig"] = {"url": f"{hook.base_url}{path}", "caBundle": ca_bundle}
            hook_spec["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    assert {conf["kind"] for conf in documents} == {
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    }
    return documents


# ---------------------------------------------------------------------------------------------
# Objects


def deployment_aw(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    template = manifests.pod_template(labels={"app": name}, restart_policy="Always")
    deployment = manifests.deployment(f"{name}-web", replicas=1, template=template)
    return manifests.appwrapper(name, manifests.component(deployment), labels=labels, suspend=True)


def job_aw(name: str, pod_sets: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    job = manifests.job(f"{name}-job")
    return manifests.appwrapper(name, manifests.component(job, pod_sets=pod_sets), suspend=True)


Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def create(
    run: Kubectl, namespace: str, body: dict[str, Any], *extra: str
) -> subprocess.CompletedProcess[str]:
    return run("create", "-n", namespace, *extra, "-f", "-", stdin=json.dumps(body))


def get_aw(testbed: Endpoints, namespace: str, name: str) -> dict[str, Any]:
    out = kubectl(testbed.kubeconfig, "get", "appwrapper", name, "-n", namespace, "-o", "json").stdout
    found: dict[str, Any] = json.loads(out)
    return found


# ---------------------------------------------------------------------------------------------
# Registration and users


@contextmanager
def registered_with(testbed: Endpoints, configurations: list[dict[str, Any]]) -> Iterator[None]:
    """``configurations`` (webhook configurations) applied until the block ends."""
    kubectl(
        testbed.kubeconfig,
        "apply",
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": configurations}),
    )
    try:
        yield
    finally:
        for conf in configurations:
            kubectl(
                testbed.kubeconfig,
                "delete",
                conf["kind"],
                conf["metadata"]["name"],
                "--ignore-not-found",
                check=False,
            )


@pytest.fixture
def registered(testbed: Endpoints, namespace: str, webhook: Webhook) -> Iterator[None]:
    """Both webhooks registered for ``namespace``, and in force, until the test ends."""
    with registered_with(testbed, _configurations(namespace, webhook)):
        _wait_in_force(testbed, namespace)
        yield


def _wait_in_force(testbed: Endpoints, namespace: str) -> None:
    # The API server picks up new webhook configurations asynchronously; server-side dry runs
    # (allowed: both webhooks declare no side effects) show when both are consulted.
    run = admin(testbed)

    def probe() -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
        mutated = create(run, namespace, job_aw("probe"), "--dry-run=server", "-o", "json")
        rejected = create(
            run, namespace, job_aw("probe", [{"path": "template.spec.nosuch"}]), "--dry-run=server"
        )
        return mutated, rejected

    def in_force(answers: tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]) -> bool:
        mutated, rejected = answers
        labels = json.loads(mutated.stdout)["metadata"].get("labels", {}) if mutated.returncode == 0 else {}
        return USER_LABEL in labels and rejected.returncode != 0 and "denied the request" in rejected.stderr

    until_sync("both webhooks to be in force", probe, done=in_force, within=30, every=0.3)


@dataclass
class User:
    username: str
    uid: str
    run: Kubectl


def _grant(testbed: Endpoints, namespace: str, resources: dict[str, list[str]]) -> None:
    rules = [
        {"apiGroups": [group], "resources": names, "verbs": ["create", "get"]}
        for group, names in resources.items()
    ]
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "alice", "namespace": namespace},
        "rules": rules,
    }
    kubectl(testbed.kubeconfig, "apply", "-f", "-", stdin=json.dumps(role))


@pytest.fixture
def alice(testbed: Endpoints, namespace: str, tmp_path: Path) -> User:
    """ServiceAccount ``alice``, bound to Role ``alice`` (AppWrappers only until a test widens it)."""
    kubectl(testbed.kubeconfig, "create", "serviceaccount", "alice", "-n", namespace)
    _grant(testbed, namespace, {"workload.codeflare.dev": ["appwrappers"]})
    kubectl(
        testbed.kubeconfig,
        "create",
        "rolebinding",
        "alice",
        "-n",
        namespace,
        "--role=alice",
        f"--serviceaccount={namespace}:alice",
    )
    token = kubectl(
        testbed.kubeconfig, "create", "token", "alice", "-n", namespace, "--duration=1h"
    ).stdout.strip()
    uid = kubectl(
        testbed.kubeconfig,
        "get",
        "serviceaccount",
        "alice",
        "-n",
        namespace,
        "-o",
        "jsonpath={.metadata.uid}",
    ).stdout
    # A kubeconfig with the cluster only, so nothing of the admin's identity can leak in.
    admin = yaml.safe_load(testbed.kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    ca = (
        cluster.get("certificate-authority-data")
        or base64.b64encode(Path(cluster["certificate-authority"]).read_bytes()).decode()
    )
    config = tmp_path / "alice.kubeconfig"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "c", "cluster": {"server": cluster["server"], "certificate-authority-data": ca}}
                ],
                "users": [{"name": "alice", "user": {}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "alice"}}],
                "current-context": "c",
            }
        )
    )

    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [kubectl_binary(), f"--kubeconfig={config}", f"--token={token}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    who = json.loads(run("auth", "whoami", "-o", "json").stdout)["status"]["userInfo"]["username"]
    assert who == f"system:serviceaccount:{namespace}:alice"
    return User(who, uid, run)


def admitted(
    attempt: Callable[[], subprocess.CompletedProcess[str]], refusal: str
) -> subprocess.CompletedProcess[str]:
    """The first successful ``attempt``: a Role change reaches the authorizer through an informer,
    so attempts are refused with ``refusal`` (and nothing else) until it has."""

    def tried() -> subprocess.CompletedProcess[str]:
        result = attempt()
        assert result.returncode == 0 or refusal in result.stderr, result.stderr
        return result

    return until_sync(
        "the request to be admitted once the Role allows it",
        tried,
        done=lambda r: r.returncode == 0,
        within=15,
        every=0.3,
    )


def admin(testbed: Endpoints) -> Kubectl:
    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return kubectl(testbed.kubeconfig, *args, stdin=stdin, check=False)

    return run


# ---------------------------------------------------------------------------------------------
# Tests


@pytest.mark.usefixtures("registered")
def test_user_without_deployment_rights_cannot_wrap_a_deployment(
    testbed: Endpoints, namespace: str, alice: User
) -> None:
    result = create(alice.run, namespace, deployment_aw("sneaky"))
    assert result.returncode != 0
    assert "denied the request" in result.stderr
    assert (
        f"spec.components[0].template: Forbidden: User {alice.username} is not authorized to create "
        f"Deployment in {namespace}"
    ) in result.stderr
    listed = kubectl(testbed.kubeconfig, "get", "appwrappers,deployments", "-n", namespace, "-o", "name")
    assert listed.stdout.strip() == ""


@pytest.mark.usefixtures("registered")
def test_user_with_deployment_rights_is_admitted_with_queue_and_user_labels(
    testbed: Endpoints, namespace: str, alice: User
) -> None:
    # Still refused until the Role grants Deployments: the control for the change below.
    assert create(alice.run, namespace, deployment_aw("web")).returncode != 0
    _grant(testbed, namespace, {"workload.codeflare.dev": ["appwrappers"], "apps": ["deployments"]})
    admitted(
        lambda: create(alice.run, namespace, deployment_aw("web")), "not authorized to create Deployment"
    )
    labels = get_aw(testbed, namespace, "web")["metadata"]["labels"]
    assert labels == {
        QUEUE_NAME_LABEL: DEFAULT_QUEUE,
        USER_LABEL: sanitize_label(alice.username),
        USER_ID_LABEL: alice.uid,
    }
    assert labels[USER_LABEL] == f"system_serviceaccount_{namespace}_alice"


@pytest.mark.usefixtures("registered")
def test_given_queue_is_kept_and_given_user_labels_are_replaced(
    testbed: Endpoints, namespace: str, alice: User
) -> None:
    _grant(testbed, namespace, {"workload.codeflare.dev": ["appwrappers"], "batch": ["jobs"]})
    body = job_aw("mine")
    body["metadata"]["labels"] = {QUEUE_NAME_LABEL: "team-queue", USER_LABEL: "someone-else"}
    result = admitted(lambda: create(alice.run, namespace, body), "not authorized to create Job")
    assert f"label {USER_LABEL} is set from the requesting user" in result.stderr  # kubectl's "Warning:"
    labels = get_aw(testbed, namespace, "mine")["metadata"]["labels"]
    assert labels[QUEUE_NAME_LABEL] == "team-queue"
    assert labels[USER_LABEL] == sanitize_label(alice.username)
    assert labels[USER_ID_LABEL] == alice.uid


@pytest.mark.usefixtures("registered")
def test_bad_pod_set_path_is_rejected_with_its_message(testbed: Endpoints, namespace: str) -> None:
    result = create(admin(testbed), namespace, job_aw("badpath", [{"path": "template.spec.nosuch"}]))
    assert result.returncode != 0
    assert "denied the request" in result.stderr
    assert (
        "spec.components[0].podSets[0].path: Invalid: path does not refer to a v1.PodSpecTemplate: "
        "at path position '2' missing field 'nosuch'"
    ) in result.stderr
    not_a_template = create(admin(testbed), namespace, job_aw("spec", [{"path": "template.spec"}]))
    assert not_a_template.returncode != 0
    assert "'template.spec' has no spec.containers" in not_a_template.stderr
    # The same AppWrapper with the right path is admitted (so the path alone was the problem).
    assert (
        create(admin(testbed), namespace, job_aw("goodpath", [{"path": "template.spec.template"}])).returncode
        == 0
    )


@pytest.mark.usefixtures("registered")
def test_user_labels_cannot_change_but_other_labels_can(
    testbed: Endpoints, namespace: str, webhook: Webhook
) -> None:
    run = admin(testbed)
    assert create(run, namespace, job_aw("fixed")).returncode == 0
    before = get_aw(testbed, namespace, "fixed")["metadata"]["labels"]
    assert before[USER_LABEL]  # set from the admin's client certificate
    changed = run("label", "appwrapper", "fixed", "-n", namespace, f"{USER_LABEL}=mallory", "--overwrite")
    assert changed.returncode != 0
    assert f"metadata.labels[{USER_LABEL}]: Forbidden: attempt to change immutable field" in changed.stderr
    removed = run("label", "appwrapper", "fixed", "-n", namespace, f"{USER_ID_LABEL}-")
    assert removed.returncode != 0
    assert "attempt to change immutable field" in removed.stderr

    # Updates that leave the labels alone never reach the webhook (the configuration's match
    # condition), so controllers' writes do not depend on it being up; label changes do.
    def updates_seen() -> int:
        return webhook.proc.log.read_text().count(f"validate UPDATE {namespace}/fixed ")

    seen = updates_seen()
    assert run("annotate", "appwrapper", "fixed", "-n", namespace, "note=x").returncode == 0
    assert updates_seen() == seen
    assert run("label", "appwrapper", "fixed", "-n", namespace, "team=a").returncode == 0
    assert updates_seen() == seen + 1
    after = get_aw(testbed, namespace, "fixed")["metadata"]["labels"]
    assert after == {**before, "team": "a"}


def nested_job_aw(name: str, depth: int) -> dict[str, Any]:
    """A Job AppWrapper whose pod spec carries an extra field ``depth`` levels deep."""
    body = job_aw(name)
    extra: Any = "leaf"
    for _ in range(depth):
        extra = {"x": extra}
    body["spec"]["components"][0]["template"]["spec"]["template"]["spec"]["x"] = extra
    return body


@pytest.mark.usefixtures("registered")
def test_templates_too_deep_or_too_large_are_refused_naming_the_limit(
    testbed: Endpoints, namespace: str
) -> None:
    run = admin(testbed)
    # The API server itself takes both; the webhook refuses them before any service sees them.
    deep = create(run, namespace, nested_job_aw("deep", 300))
    assert deep.returncode != 0
    text = " ".join(deep.stderr.split())
    assert "denied the request: spec.components[0].template: Invalid: nested more than 64 levels deep" in text
    assert "the limit is admission.maxTemplateDepth=64" in text
    large = job_aw("large")
    # (Not in annotations: the CRD's schema caps those at 256 KiB itself.)
    container = large["spec"]["components"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    container["args"] = ["x" * 1000] * 600
    refused = create(run, namespace, large)
    assert refused.returncode != 0
    text = " ".join(refused.stderr.split())
    assert "spec.components: Invalid: the component templates take" in text
    assert "the limit is admission.maxTemplateBytes=524288" in text
    # Within the limits the same shapes are admitted.
    assert create(run, namespace, nested_job_aw("shallow", 20)).returncode == 0
    listed = kubectl(testbed.kubeconfig, "get", "appwrappers", "-n", namespace, "-o", "name").stdout.split()
    assert listed == ["appwrapper.workload.codeflare.dev/shallow"]


@pytest.mark.usefixtures("registered")
def test_templates_may_not_attribute_pods_to_another_appwrapper(testbed: Endpoints, namespace: str) -> None:
    body = job_aw("thief")
    pod = body["spec"]["components"][0]["template"]["spec"]["template"]
    pod["metadata"] = {"labels": {APPWRAPPER_LABEL: "victim"}}
    result = create(admin(testbed), namespace, body)
    assert result.returncode != 0
    assert (
        "spec.components[0].template.spec.template.metadata.labels[workload.codeflare.dev/appwrapper]: "
        "Forbidden: Respawn sets this label to the AppWrapper's name (thief)"
    ) in " ".join(result.stderr.split())
    pod["metadata"]["labels"][APPWRAPPER_LABEL] = "thief"
    assert create(admin(testbed), namespace, body).returncode == 0


def test_a_mutating_webhook_that_cannot_answer_fails_closed(
    testbed: Endpoints, namespace: str, webhook: Webhook
) -> None:
    mutating, validating = _configurations(namespace, webhook)
    mutating["webhooks"][0]["clientConfig"]["url"] = f"https://127.0.0.1:{free_port()}/mutate-appwrapper"
    with registered_with(testbed, [mutating, validating]):
        run = admin(testbed)

        def refused() -> str:
            result = create(run, namespace, job_aw("unmutated"), "--dry-run=server")
            return (
                result.stderr
                if result.returncode != 0 and "mutate.appwrappers.respawn.dev" in result.stderr
                else ""
            )

        message = until_sync("the unreachable mutating webhook to be consulted", refused, within=30)
        assert 'failed calling webhook "mutate.appwrappers.respawn.dev"' in message
    assert kubectl(testbed.kubeconfig, "get", "appwrappers", "-n", namespace, "-o", "name").stdout == ""


def test_an_appwrapper_the_mutating_webhook_did_not_label_is_refused(
    testbed: Endpoints, namespace: str, webhook: Webhook
) -> None:
    # A mutation that did not happen (the configuration missing, or the webhook admitting a
    # review it could not read) leaves labels that do not name the creator: harmless, because
    # validation refuses them.
    _, validating = _configurations(namespace, webhook)
    with registered_with(testbed, [validating]):
        run = admin(testbed)
        forged = job_aw("forged")
        forged["metadata"]["labels"] = {USER_LABEL: "someone-else"}

        def refused() -> str:
            result = create(run, namespace, forged, "--dry-run=server")
            return result.stderr if "denied the request" in result.stderr else ""

        message = " ".join(until_sync("the validating webhook to be consulted", refused, within=30).split())
        whoami = json.loads(run("auth", "whoami", "-o", "json").stdout)["status"]["userInfo"]["username"]
        assert (
            f"metadata.labels[{USER_LABEL}]: Forbidden: must be '{sanitize_label(whoami)}', set from the "
            "requesting user by the mutating webhook respawn-appwrapper (found 'someone-else';"
        ) in message, message
        assert f"metadata.labels[{USER_ID_LABEL}]: Forbidden: must be '', set from" in message, message


def test_webhooks_answer_malformed_reviews(webhook: Webhook) -> None:
    refused = webhook.post("/validate-appwrapper", b"{not json")
    assert refused["response"]["allowed"] is False
    assert refused["response"]["status"]["message"].startswith(
        "malformed admission review: the body is not JSON"
    )
    partial = json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u-1"}}
    ).encode()
    answer = webhook.post("/validate-appwrapper", partial)["response"]
    assert answer["uid"] == "u-1"
    assert answer["allowed"] is False
    assert webhook.post("/mutate-appwrapper", b"[]")["response"] == {"uid": "", "allowed": True}
    assert webhook.proc.alive()


def _render(tmp_path: Path, *components: Path) -> list[dict[str, Any]]:
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    relative = [os.path.relpath(c, overlay) for c in components]
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({"components": relative}))
    out = subprocess.run(
        [kubectl_binary(), "kustomize", str(overlay)], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def test_deployed_manifests_are_accepted_and_meet_restricted_pod_security(
    testbed: Endpoints, namespace: str, tmp_path: Path
) -> None:
    documents = _render(tmp_path, WEBHOOK_DIR)
    kinds = sorted(doc["kind"] for doc in documents)
    assert kinds == sorted(
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Service",
            "Deployment",
            "PodDisruptionBudget",
            "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration",
        ]
    )
    # respawn-system runs at the restricted PodSecurity level; the test namespace warns at it.
    kubectl(testbed.kubeconfig, "label", "namespace", namespace, "pod-security.kubernetes.io/warn=restricted")
    for doc in documents:
        if doc["metadata"].get("namespace"):
            doc["metadata"]["namespace"] = namespace
    result = kubectl(
        testbed.kubeconfig,
        "apply",
        "--dry-run=server",
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": documents}),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "Warning" not in result.stderr, result.stderr
    (binding,) = [doc for doc in documents if doc["kind"] == "ClusterRoleBinding"]
    assert binding["subjects"][0]["name"] == "respawn-webhook"


def test_cert_manager_component_injects_the_ca_into_both_configurations(tmp_path: Path) -> None:
    documents = _render(tmp_path, WEBHOOK_DIR, WEBHOOK_DIR / "cert-manager")
    by_kind = {doc["kind"]: doc for doc in documents}
    certificate = by_kind["Certificate"]
    assert certificate["spec"]["secretName"] == "respawn-webhook-cert"
    assert "respawn-webhook.respawn-system.svc" in certificate["spec"]["dnsNames"]
    expected = f"{certificate['metadata']['namespace']}/{certificate['metadata']['name']}"
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        assert by_kind[kind]["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == expected
    deployment = by_kind["Deployment"]["spec"]["template"]["spec"]
    (certs,) = [v for v in deployment["volumes"] if v["name"] == "certs"]
    assert certs["secret"]["secretName"] == certificate["spec"]["secretName"]
