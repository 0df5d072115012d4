"""The AppWrapper CRD on a real API server: upstream samples are accepted, every rule rejects.

Runs against the testbed's kube-apiserver. The CRD (and the component-namespace admission
policy next to it) is applied server-side from deploy/crd/ exactly as an operator would.
"""

from __future__ import annotations

import copy
import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from respawn.testbed.cluster import kubectl
from respawn.testbed.manifests import appwrapper, component, condition, job, parse_appwrapper, pod, pytorchjob
from shared.appwrapper.constants import CRD_NAME, MAX_POD_SETS
from shared.appwrapper.model import read_appwrapper
from shared.appwrapper.podsets import validate_appwrapper_pod_sets
from tests import mlbatch
from tests.waiting import until_sync

pytestmark = pytest.mark.testbed


def _run(kubeconfig: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return kubectl(kubeconfig, *args, stdin=stdin, check=False)


def _dry_run_create(
    kubeconfig: Path, namespace: str, body: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    return _run(kubeconfig, "create", "--dry-run=server", "-n", namespace, "-f", "-", stdin=json.dumps(body))


def _rejection_text(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode != 0, f"expected a rejection, but kubectl succeeded: {proc.stdout}"
    # kubectl folds long messages onto several lines.
    return " ".join(proc.stderr.split())


@pytest.fixture(scope="module")
def crd(appwrapper_crd: Path) -> Path:
    """The CRD served and the admission policy beside it enforced (the API server enforces a new
    policy only once its informers have seen it: polled, not slept on)."""
    probe = appwrapper("policy-probe", component(pod("p", namespace="kube-system")))
    until_sync(
        "the CRD's namespace policy to be in effect",
        lambda: _dry_run_create(appwrapper_crd, "default", probe),
        done=lambda proc: proc.returncode != 0 and "other namespaces" in proc.stderr,
        every=0.5,
    )
    return appwrapper_crd


def test_crd_has_the_upstream_names_and_shape(crd: Path) -> None:
    body = json.loads(kubectl(crd, "get", "crd", CRD_NAME, "-o", "json").stdout)
    spec = body["spec"]
    assert spec["group"] == "workload.codeflare.dev"
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == "AppWrapper"
    assert spec["names"]["plural"] == "appwrappers"
    assert spec["names"]["shortNames"] == ["aw"]
    [version] = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1beta2", True, True)
    assert version["subresources"] == {"status": {}}
    columns = [column["name"] for column in version["additionalPrinterColumns"]]
    assert columns == ["Status", "Quota Reserved", "Resources Deployed", "Unhealthy", "Age"]


def test_the_usage_guide_has_appwrapper_samples() -> None:
    # Guards the parametrised test below against silently testing nothing.
    assert len(mlbatch.APPWRAPPERS) >= 3


@pytest.mark.parametrize("sample", mlbatch.APPWRAPPERS)
def test_mlbatch_sample_is_accepted_unchanged(crd: Path, namespace: str, sample: str) -> None:
    text = mlbatch.text(sample)
    doc = yaml.safe_load(text)
    if "namespace" in doc.get("metadata", {}):
        doc["metadata"]["namespace"] = namespace
        text = yaml.safe_dump(doc)
    proc = _run(crd, "apply", "--dry-run=server", "-n", namespace, "-f", "-", stdin=text)
    assert proc.returncode == 0, proc.stderr
    # The Python view of the same object agrees with the API server.
    assert validate_appwrapper_pod_sets(parse_appwrapper(doc).spec.components) == []


def test_created_appwrapper_reads_back_and_shows_status_columns(crd: Path, namespace: str) -> None:
    kubectl(
        crd,
        "create",
        "-n",
        namespace,
        "-f",
        "-",
        stdin=json.dumps(appwrapper("cols", component(job("j", pods=1)))),
    )
    status = {
        "status": {
            "phase": "Running",
            "resettingCount": 1,
            "conditions": [
                condition(
                    ctype,
                    value,
                    reason="Resuming",
                    message="Suspend is false",
                    at=datetime(2024, 1, 1, tzinfo=UTC),
                )
                for ctype, value in (
                    ("QuotaReserved", "True"),
                    ("ResourcesDeployed", "True"),
                    ("Unhealthy", "False"),
                )
            ],
        }
    }
    kubectl(
        crd,
        "patch",
        "aw",
        "cols",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(status),
    )
    table = kubectl(crd, "get", "aw", "cols", "-n", namespace, "--no-headers").stdout.split()
    assert table[:5] == ["cols", "Running", "True", "True", "False"]
    stored = read_appwrapper(
        json.loads(kubectl(crd, "get", "aw", "cols", "-n", namespace, "-o", "json").stdout)
    )
    assert stored.resetting_count == 1
    assert stored.is_true("QuotaReserved")


@pytest.mark.parametrize(
    ("components", "message"),
    [
        pytest.param(
            [{"template": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}}],
            "components contains no podspecs",
            id="no-pod-sets",
        ),
        pytest.param(
            [component(pod(f"p{i}")) for i in range(MAX_POD_SETS + 1)],
            "components contains more than 8 podspecs",
            id="nine-inferred-pods",
        ),
        pytest.param(
            [
                {
                    "template": {
                        "apiVersion": "jobset.x-k8s.io/v1alpha2",
                        "kind": "JobSet",
                        "metadata": {"name": "js"},
                        "spec": {"replicatedJobs": [{"name": f"r{i}", "template": {}} for i in range(9)]},
                    }
                }
            ],
            "components contains more than 8 podspecs",
            id="nine-inferred-jobset-pod-sets",
        ),
        pytest.param(
            [
                {
                    "template": {
                        "apiVersion": "example.com/v1",
                        "kind": "Thing",
                        "metadata": {"name": f"t{i}"},
                    },
                    "podSets": [{"path": f"template.spec.p{k}"} for k in range(5)],
                }
                for i in range(2)
            ],
            "components contains more than 8 podspecs",
            id="ten-declared-pod-sets",
        ),
        pytest.param(
            [
                {
                    "template": appwrapper("inner", component(pod("p"))),
                }
            ],
            "Nested AppWrappers are forbidden",
            id="nested-appwrapper",
        ),
        pytest.param(
            [component(pod("p"), pod_sets=[{"path": "spec.template"}])],
            "a pod-set path must start with 'template'",
            id="path-without-template",
        ),
        pytest.param(
            [component(pod("p", namespace="elsewhere"))],
            "AppWrappers cannot create objects in other namespaces",
            id="component-in-other-namespace",
        ),
    ],
)
def test_invalid_appwrapper_is_rejected_with_its_message(
    crd: Path, namespace: str, components: list[dict[str, Any]], message: str
) -> None:
    proc = _dry_run_create(crd, namespace, appwrapper("bad", *components))
    assert message in _rejection_text(proc)


def test_inferred_pod_sets_of_a_pytorchjob_count_towards_the_limit(crd: Path, namespace: str) -> None:
    ptj = component(pytorchjob("ptj", replicas={"Master": 1, "Worker": 1}))
    alone = _dry_run_create(crd, namespace, appwrapper("ptj", ptj))
    assert alone.returncode == 0, alone.stderr
    # Two inferred pod sets plus seven pods is one too many.
    crowded = appwrapper("ptj", ptj, *(component(pod(f"p{i}")) for i in range(7)))
    assert "more than 8 podspecs" in _rejection_text(_dry_run_create(crd, namespace, crowded))


def test_component_in_its_own_namespace_is_accepted(crd: Path, namespace: str) -> None:
    proc = _dry_run_create(crd, namespace, appwrapper("ok", component(pod("p", namespace=namespace))))
    assert proc.returncode == 0, proc.stderr


@pytest.fixture
def existing(crd: Path, namespace: str) -> dict[str, Any]:
    """A stored AppWrapper with declared pod sets and a managedBy value, to update."""
    pod_sets = [{"path": "template.spec.template", "replicas": 2}]
    body = appwrapper("upd", component(job("j", pods=2), pod_sets=pod_sets), suspend=True)
    kubectl(crd, "create", "-n", namespace, "-f", "-", stdin=json.dumps(body))
    return body


def _json_patch(
    kubeconfig: Path, namespace: str, ops: list[dict[str, Any]]
) -> subprocess.CompletedProcess[str]:
    return _run(kubeconfig, "patch", "aw", "upd", "-n", namespace, "--type=json", "-p", json.dumps(ops))


def _stored_spec(kubeconfig: Path, namespace: str) -> dict[str, Any]:
    spec: dict[str, Any] = json.loads(
        kubectl(kubeconfig, "get", "aw", "upd", "-n", namespace, "-o", "json").stdout
    )["spec"]
    return spec


def test_suspend_and_pod_set_infos_can_change(crd: Path, namespace: str, existing: dict[str, Any]) -> None:
    infos = [
        {
            "labels": {"l": "v"},
            "nodeSelector": {"zone": "a"},
            "tolerations": [{"key": "k", "operator": "Exists"}],
        }
    ]
    proc = _json_patch(
        crd,
        namespace,
        [
            {"op": "replace", "path": "/spec/suspend", "value": False},
            {"op": "add", "path": "/spec/components/0/podSetInfos", "value": infos},
        ],
    )
    assert proc.returncode == 0, proc.stderr
    spec = _stored_spec(crd, namespace)
    assert spec["suspend"] is False
    assert spec["components"][0]["podSetInfos"] == infos
    # And back, as Kueue does on preemption.
    proc = _json_patch(
        crd,
        namespace,
        [
            {"op": "replace", "path": "/spec/suspend", "value": True},
            {"op": "remove", "path": "/spec/components/0/podSetInfos"},
        ],
    )
    assert proc.returncode == 0, proc.stderr
    assert "podSetInfos" not in _stored_spec(crd, namespace)["components"][0]


@pytest.mark.parametrize(
    ("ops", "message"),
    [
        pytest.param(
            [
                {
                    "op": "replace",
                    "path": "/spec/components/0/template/spec/template/spec/containers/0/image",
                    "value": "x",
                }
            ],
            "component templates are immutable",
            id="template",
        ),
        pytest.param(
            [{"op": "add", "path": "/spec/components/-", "value": component(pod("extra"))}],
            "the number of components is immutable",
            id="component-count",
        ),
        pytest.param(
            [{"op": "replace", "path": "/spec/components/0/podSets/0/replicas", "value": 3}],
            "declared pod sets (their number, paths and replicas) are immutable",
            id="pod-set-replicas",
        ),
        pytest.param(
            [{"op": "replace", "path": "/spec/components/0/podSets/0/path", "value": "template.spec"}],
            "declared pod sets (their number, paths and replicas) are immutable",
            id="pod-set-path",
        ),
        pytest.param(
            [{"op": "add", "path": "/spec/managedBy", "value": "kueue.x-k8s.io/multikueue"}],
            "spec.managedBy is immutable",
            id="managed-by",
        ),
    ],
)
def test_immutable_fields_cannot_change(
    crd: Path, namespace: str, existing: dict[str, Any], ops: list[dict[str, Any]], message: str
) -> None:
    before = _stored_spec(crd, namespace)
    assert message in _rejection_text(_json_patch(crd, namespace, ops))
    assert _stored_spec(crd, namespace) == before


def test_managed_by_set_at_creation_cannot_be_changed_or_removed(crd: Path, namespace: str) -> None:
    body = copy.deepcopy(appwrapper("upd", component(pod("p")), managedBy="kueue.x-k8s.io/multikueue"))
    kubectl(crd, "create", "-n", namespace, "-f", "-", stdin=json.dumps(body))
    changed = _json_patch(crd, namespace, [{"op": "replace", "path": "/spec/managedBy", "value": "other"}])
    assert "spec.managedBy is immutable" in _rejection_text(changed)
    removed = _json_patch(crd, namespace, [{"op": "remove", "path": "/spec/managedBy"}])
    assert "spec.managedBy is immutable" in _rejection_text(removed)
