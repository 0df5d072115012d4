"""The AppWrapper CRD on a real API server: upstream samples are accepted, every rule rejects.

Runs against the testbed's kube-apiserver. The CRD (and the component-namespace admission
policy next to it) is applied server-side from deploy/crd/ exactly as an operator would.
"""

from __future__ import annotations

import copy
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from respawn.testbed.cluster import kubectl
from shared.appwrapper.constants import CRD_NAME, MAX_POD_SETS
from shared.appwrapper.model import parse_appwrapper
from shared.appwrapper.podsets import validate_appwrapper_pod_sets

pytestmark = pytest.mark.testbed

REPO = Path(__file__).resolve().parents[2]
CRD_DIR = REPO / "deploy" / "crd"
MLBATCH_USAGE = Path("/work/shared/reference/mlbatch-usage.txt")


def mlbatch_appwrapper_samples() -> list[str]:
    """The AppWrapper YAML documents embedded in the MLBatch usage guide, as written there.

    The guide is prose with YAML blocks; a block starts at a top-level ``apiVersion:`` line and
    ends at the first blank line.
    """
    if not MLBATCH_USAGE.exists():
        return []
    samples: list[str] = []
    block: list[str] | None = None
    for line in [*MLBATCH_USAGE.read_text().splitlines(), ""]:
        if block is None:
            if line.startswith("apiVersion:"):
                block = [line]
        elif line.strip():
            block.append(line)
        else:
            text = "\n".join(block) + "\n"
            block = None
            doc = yaml.safe_load(text)
            if isinstance(doc, dict) and doc.get("kind") == "AppWrapper":
                samples.append(text)
    return samples


SAMPLES = mlbatch_appwrapper_samples()


def _run(kubeconfig: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return kubectl(kubeconfig, *args, stdin=stdin, check=False)


def _dry_run_create(
    kubeconfig: Path, namespace: str, body: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    return _run(kubeconfig, "create", "--dry-run=server", "-n", namespace, "-f", "-", stdin=json.dumps(body))


def _pod(name: str, namespace: str | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]},
    }


def _job(name: str, parallelism: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "parallelism": parallelism,
            "completions": parallelism,
            "template": {
                "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]}
            },
        },
    }


def _appwrapper(name: str, *components: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "workload.codeflare.dev/v1beta2",
        "kind": "AppWrapper",
        "metadata": {"name": name},
        "spec": {"components": list(components), **spec},
    }


def _rejection_text(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode != 0, f"expected a rejection, but kubectl succeeded: {proc.stdout}"
    # kubectl folds long messages onto several lines.
    return " ".join(proc.stderr.split())


@pytest.fixture(scope="module")
def crd(testbed: Any) -> Iterator[Path]:
    kubeconfig: Path = testbed.kubeconfig
    kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-k", str(CRD_DIR))
    kubectl(kubeconfig, "wait", "--for=condition=Established", "--timeout=60s", f"crd/{CRD_NAME}")
    # The API server serves the new kind, and enforces the new admission policy, only once its
    # informers have seen them: poll until both are in effect rather than sleeping.
    probe = _appwrapper("policy-probe", {"template": _pod("p", namespace="kube-system")})
    deadline = time.monotonic() + 60
    while True:
        proc = _dry_run_create(kubeconfig, "default", probe)
        if proc.returncode != 0 and "other namespaces" in proc.stderr:
            break
        if time.monotonic() > deadline:
            raise AssertionError(
                f"CRD and namespace policy not in effect after 60s: {proc.stderr or proc.stdout}"
            )
        time.sleep(0.5)
    yield kubeconfig


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
    assert len(SAMPLES) >= 3


@pytest.mark.parametrize("sample", SAMPLES, ids=[f"sample{i}" for i in range(len(SAMPLES))])
def test_mlbatch_sample_is_accepted_unchanged(crd: Path, namespace: str, sample: str) -> None:
    doc = yaml.safe_load(sample)
    text = sample
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
        stdin=json.dumps(_appwrapper("cols", {"template": _job("j")})),
    )
    status = {
        "status": {
            "phase": "Running",
            "resettingCount": 1,
            "conditions": [
                {
                    "type": ctype,
                    "status": value,
                    "reason": "Resuming",
                    "message": "Suspend is false",
                    "lastTransitionTime": "2024-01-01T00:00:00Z",
                }
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
    stored = parse_appwrapper(
        json.loads(kubectl(crd, "get", "aw", "cols", "-n", namespace, "-o", "json").stdout)
    )
    assert stored.status.resetting_count == 1
    assert stored.status.is_true("QuotaReserved")


@pytest.mark.parametrize(
    ("components", "message"),
    [
        pytest.param(
            [{"template": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}}],
            "components contains no podspecs",
            id="no-pod-sets",
        ),
        pytest.param(
            [{"template": _pod(f"p{i}")} for i in range(MAX_POD_SETS + 1)],
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
                    "template": _appwrapper("inner", {"template": _pod("p")}),
                }
            ],
            "Nested AppWrappers are forbidden",
            id="nested-appwrapper",
        ),
        pytest.param(
            [{"template": _pod("p"), "podSets": [{"path": "spec.template"}]}],
            "a pod-set path must start with 'template'",
            id="path-without-template",
        ),
        pytest.param(
            [{"template": _pod("p", namespace="elsewhere")}],
            "AppWrappers cannot create objects in other namespaces",
            id="component-in-other-namespace",
        ),
    ],
)
def test_invalid_appwrapper_is_rejected_with_its_message(
    crd: Path, namespace: str, components: list[dict[str, Any]], message: str
) -> None:
    proc = _dry_run_create(crd, namespace, _appwrapper("bad", *components))
    assert message in _rejection_text(proc)


def test_inferred_pod_sets_of_a_pytorchjob_count_towards_the_limit(crd: Path, namespace: str) -> None:
    pytorchjob = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "ptj"},
        "spec": {
            "pytorchReplicaSpecs": {
                role: {"replicas": 1, "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}
                for role in ("Master", "Worker")
            }
        },
    }
    alone = _dry_run_create(crd, namespace, _appwrapper("ptj", {"template": pytorchjob}))
    assert alone.returncode == 0, alone.stderr
    # Two inferred pod sets plus seven pods is one too many.
    crowded = _appwrapper("ptj", {"template": pytorchjob}, *({"template": _pod(f"p{i}")} for i in range(7)))
    assert "more than 8 podspecs" in _rejection_text(_dry_run_create(crd, namespace, crowded))


def test_component_in_its_own_namespace_is_accepted(crd: Path, namespace: str) -> None:
    proc = _dry_run_create(crd, namespace, _appwrapper("ok", {"template": _pod("p", namespace=namespace)}))
    assert proc.returncode == 0, proc.stderr


@pytest.fixture
def existing(crd: Path, namespace: str) -> dict[str, Any]:
    """A stored AppWrapper with declared pod sets and a managedBy value, to update."""
    body = _appwrapper(
        "upd",
        {
            "template": _job("j", parallelism=2),
            "podSets": [{"path": "template.spec.template", "replicas": 2}],
        },
        suspend=True,
    )
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
            [{"op": "add", "path": "/spec/components/-", "value": {"template": _pod("extra")}}],
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
    body = copy.deepcopy(_appwrapper("upd", {"template": _pod("p")}, managedBy="kueue.x-k8s.io/multikueue"))
    kubectl(crd, "create", "-n", namespace, "-f", "-", stdin=json.dumps(body))
    changed = _json_patch(crd, namespace, [{"op": "replace", "path": "/spec/managedBy", "value": "other"}])
    assert "spec.managedBy is immutable" in _rejection_text(changed)
    removed = _json_patch(crd, namespace, [{"op": "remove", "path": "/spec/managedBy"}])
    assert "spec.managedBy is immutable" in _rejection_text(removed)
