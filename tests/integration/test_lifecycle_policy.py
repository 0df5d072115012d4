"""lifecycle's admission policy (deploy/base/rbac/lifecycle-creates.yaml) on a real API server.

lifecycle's ClusterRole lets it create every wrapped kind in every namespace; the policy narrows
that to objects an AppWrapper controls, outside the system namespaces. The requests are made with
a token of lifecycle's own ServiceAccount, with the RBAC of deploy/base, so the API server's whole
chain (authentication, RBAC, admission) decides as it would in a cluster.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from respawn.testbed.cluster import kubectl
from respawn.testbed.modes import Endpoints
from tests.integration.test_deploy import build, dump, service_account_kubeconfig
from tests.waiting import until_sync

pytestmark = pytest.mark.testbed

POLICY = "respawn-lifecycle-creates-appwrapper-components"
SYSTEM_NS = "respawn-system"
NOT_OWNED = "has no controller ownerReference to a workload.codeflare.dev/v1beta2 AppWrapper"


@dataclass
class Lifecycle:
    kubeconfig: Path
    admin: Path

    def create(self, namespace: str, body: dict[str, Any], *extra: str) -> Any:
        return kubectl(
            self.kubeconfig, "create", "-n", namespace, *extra, "-f", "-", stdin=json.dumps(body), check=False
        )


@pytest.fixture(scope="module")
def lifecycle(testbed: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lifecycle]:
    """lifecycle's ServiceAccount, its RBAC and its admission policy from deploy/base; a token."""
    kc = testbed.kubeconfig
    wanted = {
        ("Namespace", SYSTEM_NS),
        ("ServiceAccount", "respawn-lifecycle"),
        ("ValidatingAdmissionPolicy", POLICY),
        ("ValidatingAdmissionPolicyBinding", POLICY),
    }
    docs = [
        d
        for d in build("base")
        if (d["kind"], d["metadata"]["name"]) in wanted
        or (d["kind"] in ("ClusterRole", "ClusterRoleBinding") and "lifecycle" in str(d["metadata"]))
    ]
    kubectl(kc, "apply", "-f", "-", stdin=dump(docs))
    token = kubectl(
        kc, "create", "token", "respawn-lifecycle", "-n", SYSTEM_NS, "--duration=1h"
    ).stdout.strip()
    account = Lifecycle(
        service_account_kubeconfig(kc, token, tmp_path_factory.mktemp("lifecycle") / "kubeconfig"), kc
    )

    # The aggregated role is filled in, and the policy enforced, asynchronously: wait for both.
    def in_force() -> str:
        probe = account.create("default", configmap("policy-probe"), "--dry-run=server")
        return probe.stderr if POLICY in probe.stderr else ""

    until_sync(f"{POLICY} to be enforced on lifecycle", in_force, within=60)
    try:
        yield account
    finally:
        cluster_scoped = [d for d in docs if d["kind"] not in ("Namespace", "ServiceAccount")]
        kubectl(
            kc,
            "delete",
            "--ignore-not-found",
            "--wait=false",
            "-f",
            "-",
            stdin=dump(cluster_scoped),
            check=False,
        )


def owner(**changes: Any) -> dict[str, Any]:
    """A controller reference to an AppWrapper, as lifecycle's templating writes it."""
    return {
        "apiVersion": "workload.codeflare.dev/v1beta2",
        "kind": "AppWrapper",
        "name": "aw",
        "uid": str(uuid.uuid4()),
        "controller": True,
        **changes,
    }


def configmap(name: str, *owners: dict[str, Any]) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if owners:
        metadata["ownerReferences"] = list(owners)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": {"k": "v"}}


def job_template(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "template": {
                "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]}
            }
        },
    }


def refusal(result: Any) -> str:
    assert result.returncode != 0, f"expected a refusal, the API server admitted it: {result.stdout}"
    return " ".join(result.stderr.split())


def test_an_unowned_configmap_is_refused_with_the_policys_message(
    lifecycle: Lifecycle, namespace: str
) -> None:
    text = refusal(lifecycle.create(namespace, configmap("loose")))
    assert f"ValidatingAdmissionPolicy '{POLICY}'" in text
    assert (
        "respawn-lifecycle may create only objects an AppWrapper controls, and this configmaps "
        f"(loose) {NOT_OWNED}"
    ) in text
    assert kubectl(lifecycle.admin, "get", "configmap", "loose", "-n", namespace, check=False).returncode != 0


@pytest.fixture
def appwrapper_uid(lifecycle: Lifecycle, namespace: str, appwrapper_crd: Path) -> str:
    """A real (suspended) AppWrapper to own what lifecycle creates: the garbage collector deletes
    objects whose owner does not exist, which would race the test's reads."""
    appwrapper = {
        "apiVersion": "workload.codeflare.dev/v1beta2",
        "kind": "AppWrapper",
        "metadata": {"name": "aw"},
        "spec": {"suspend": True, "components": [{"template": job_template("inner")}]},
    }
    kubectl(lifecycle.admin, "create", "-n", namespace, "-f", "-", stdin=json.dumps(appwrapper))
    return kubectl(
        lifecycle.admin, "get", "appwrapper", "aw", "-n", namespace, "-o", "jsonpath={.metadata.uid}"
    ).stdout


def test_an_object_an_appwrapper_controls_is_admitted(
    lifecycle: Lifecycle, namespace: str, appwrapper_uid: str
) -> None:
    assert lifecycle.create(namespace, configmap("owned", owner(uid=appwrapper_uid))).returncode == 0
    stored = json.loads(
        kubectl(lifecycle.admin, "get", "configmap", "owned", "-n", namespace, "-o", "json").stdout
    )
    assert stored["metadata"]["ownerReferences"][0]["kind"] == "AppWrapper"


@pytest.mark.parametrize(
    "ref",
    [
        owner(controller=False),  # owned, but not controlled
        {k: v for k, v in owner().items() if k != "controller"},
        owner(kind="Deployment", apiVersion="apps/v1"),
        owner(apiVersion="workload.codeflare.dev/v1beta1"),
    ],
)
def test_other_owners_do_not_count(lifecycle: Lifecycle, namespace: str, ref: dict[str, Any]) -> None:
    assert NOT_OWNED in refusal(lifecycle.create(namespace, configmap("other-owner", ref)))


@pytest.mark.parametrize("system", ["kube-system", "kube-public", "kube-node-lease", SYSTEM_NS])
def test_nothing_is_created_in_a_system_namespace(lifecycle: Lifecycle, system: str) -> None:
    text = refusal(
        lifecycle.create(system, configmap(f"probe-{uuid.uuid4().hex[:6]}", owner()), "--dry-run=server")
    )
    assert (
        f"respawn-lifecycle creates the components of AppWrappers, never objects in namespace {system}"
        in text
    )


def test_lifecycle_still_records_events_and_others_are_unaffected(
    lifecycle: Lifecycle, namespace: str
) -> None:
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"aw.{uuid.uuid4().hex[:8]}"},
        "involvedObject": {
            "apiVersion": "workload.codeflare.dev/v1beta2",
            "kind": "AppWrapper",
            "name": "aw",
            "namespace": namespace,
        },
        "reason": "Resetting",
        "message": "probe",
        "type": "Normal",
    }
    assert lifecycle.create(namespace, event).returncode == 0
    # The admin (anyone but lifecycle) creates what RBAC allows, owned or not.
    result = kubectl(
        lifecycle.admin, "create", "-n", namespace, "-f", "-", stdin=json.dumps(configmap("admin-made"))
    )
    assert result.returncode == 0


def test_pods_of_a_job_lifecycle_created_are_not_lifecycles_to_create(
    lifecycle: Lifecycle, namespace: str, appwrapper_uid: str
) -> None:
    # The Job controller creates the pods under its own identity: the policy does not see them.
    job = {
        **job_template("wrapped"),
        "metadata": {"name": "wrapped", "ownerReferences": [owner(uid=appwrapper_uid)]},
    }
    assert lifecycle.create(namespace, job).returncode == 0

    def pods() -> list[Any]:
        out = kubectl(lifecycle.admin, "get", "pods", "-n", namespace, "-l", "job-name=wrapped", "-o", "json")
        return list(json.loads(out.stdout)["items"])

    (pod,) = until_sync("the Job controller to create the Job's pod", pods, within=60)
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "Job"
