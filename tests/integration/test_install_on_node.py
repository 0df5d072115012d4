"""The release's one-command install on the testbed: `kubectl apply --server-side -f
dist/install.yaml`, unchanged, brings Respawn up on the real node.

The real node gives the manifests what a cluster gives them (docs/deploy.md, "Cluster network"):
the `kubernetes` Service's address, cluster DNS (the NATS servers find each other by their
StatefulSet names, the services find `respawn-nats`), a volume for each NATS server's claim, and
Respawn's namespace placed on the node. Then:

- every pod of install.yaml runs on the real node and becomes Ready: three NATS servers
  clustered, two replicas of each service and of the webhook (which made its own certificate and
  the NATS passwords: nothing was created by hand);
- an AppWrapper is admitted through the webhook, its workload runs on kwok's nodes, a failed pod
  is reset once and the AppWrapper Succeeds;
- the documented uninstall removes Respawn and keeps the CRD and the AppWrapper.

Needs root (containerd and the kubelet); the first run builds the images if they are not cached.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from respawn import release
from respawn.testbed import manifests, realnode, sim
from respawn.testbed.cluster import kubectl
from shared.appwrapper.model import read_appwrapper
from tests.integration import cli
from tests.integration.objects import FAST_RESET, apply, get_appwrapper, running_pods, wait_phase
from tests.integration.realnode_marks import REAL_NODE
from tests.waiting import until, until_sync

pytestmark = REAL_NODE

respawn = functools.partial(cli.respawn, timeout=600)
NS = realnode.RESPAWN_NAMESPACE
# What install.yaml runs: component → replicas.
WANT = {"nats": 3, "watcher": 2, "health": 2, "lifecycle": 2, "autopilot": 2, "webhook": 2}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, float]]:
    """(kubeconfig, install.yaml, seconds from apply to every pod Ready)."""
    base = tmp_path_factory.mktemp("inst")
    state_dir = (base / "tb").resolve()
    up = respawn("local", "up", "--state-dir", str(state_dir), "--nodes", "2", "--no-services", "--real-node")
    try:
        assert up.returncode == 0, up.stderr
        kubeconfig = state_dir / "kubeconfig"
        dist = base / "dist"
        assert release.main(["--dist", str(dist), "--manifests-only"]) == 0
        started = time.monotonic()
        kubectl(kubeconfig, "apply", "--server-side", "-f", str(dist / "install.yaml"), timeout=120)
        until_sync(
            "every pod of install.yaml Ready",
            lambda: ready_counts(kubeconfig),
            done=WANT.__eq__,
            within=300,
            every=2,
        )
        yield kubeconfig, dist / "install.yaml", time.monotonic() - started
    finally:
        down = respawn("local", "down", "--state-dir", str(state_dir))
        assert down.returncode == 0, down.stderr


def pods(kc: Path) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = sim.get_json(kc, "pods", "-n", NS)["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def ready_counts(kc: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for pod in pods(kc):
        conditions = {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions", [])}
        if conditions.get("Ready") == "True":
            component = pod["metadata"]["labels"].get("app.kubernetes.io/component", "")
            counts[component] = counts.get(component, 0) + 1
    return counts


def test_every_pod_of_install_yaml_runs_ready_on_the_real_node(installed: tuple[Path, Path, float]) -> None:
    kc, _, seconds = installed
    assert ready_counts(kc) == WANT
    for pod in pods(kc):
        assert pod["spec"]["nodeName"] == realnode.NODE_NAME, pod["metadata"]["name"]
        # On the pod network, not the node's.
        assert not pod["spec"].get("hostNetwork"), pod["metadata"]["name"]
    print(f"install.yaml: every pod Ready {seconds:.1f}s after the apply")


async def test_an_appwrapper_is_admitted_reset_once_and_succeeds(installed: tuple[Path, Path, float]) -> None:
    kc, _, _ = installed
    ns = "inst-1"
    kubectl(kc, "create", "namespace", ns)
    aw = manifests.job_appwrapper("w", annotations=FAST_RESET, pod_annotations={sim.SUCCEED_AFTER: "20s"})
    apply(kc, ns, aw)
    first = (await until("w's pod running", lambda: running_pods(kc, ns, "w"), within=90))[0]
    assert first["spec"]["nodeName"] != realnode.NODE_NAME
    sim.fail_pod(kc, ns, first["metadata"]["name"], exit_code=1)
    final = read_appwrapper(await wait_phase(kc, ns, "w", "Succeeded", within=120))
    assert final.resetting_count == 1


def test_the_documented_uninstall_keeps_the_crd_and_the_appwrappers(
    installed: tuple[Path, Path, float],
) -> None:
    kc, install, _ = installed
    kubectl(kc, "create", "namespace", "inst-2")
    apply(kc, "inst-2", manifests.job_appwrapper("kept", annotations=FAST_RESET))
    kubectl(
        kc,
        "delete",
        "-f",
        str(install),
        "-l",
        "app.kubernetes.io/component!=crd",
        "--wait=false",
        timeout=120,
    )
    until_sync(
        "Respawn's namespace gone",
        lambda: kubectl(kc, "get", "namespace", NS, check=False).returncode,
        done=lambda rc: rc != 0,
        within=180,
        every=2,
    )
    assert get_appwrapper(kc, "inst-2", "kept") is not None
    crds = json.loads(kubectl(kc, "get", "crd", "-o", "json").stdout)["items"]
    assert "appwrappers.workload.codeflare.dev" in {c["metadata"]["name"] for c in crds}
