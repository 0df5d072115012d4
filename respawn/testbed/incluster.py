"""Respawn deployed from ``deploy/`` onto the testbed's real node: ``respawn local deploy``.

The services, the webhook and NATS run as pods of their own image, made by
``tools/images/build.sh`` and imported into the node's containerd (no registry), from the
overlay ``deploy/overlays/testbed``: the local overlay (one of each), the webhook managing its
own certificate as in the release, and the NATS image built here. The real node gives them what
a cluster would (``realnode.cluster_manifests``, ``respawn.testbed.clusterdns``).

``deploy`` applies it server-side and returns once every Deployment and the StatefulSet are
rolled out and Ready: a service is Ready only once its consumers are bound (its /readyz).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from respawn.testbed import binaries, realnode
from respawn.testbed.cluster import State, kubectl, kubectl_binary
from respawn.testbed.errors import TestbedError
from respawn.testbed.kubeapi import get_object
from respawn.testbed.realnode import BuiltImage, build_images
from respawn.waiting import WaitTimeout, until_sync

Log = Callable[[str], None]

OVERLAY: Final = binaries.REPO_ROOT / "deploy" / "overlays" / "testbed"
NAMESPACE: Final = "respawn-system"
WEBHOOK_CONFIGURATION: Final = "respawn-appwrapper"
NATS_STATEFULSET: Final = "respawn-nats"
DEPLOYMENTS: Final = (
    "respawn-watcher",
    "respawn-health",
    "respawn-lifecycle",
    "respawn-autopilot",
    "respawn-webhook",
)
# The images Respawn's pods run, as tools/images/build.sh names them on its output.
RESPAWN_IMAGE: Final = "respawn"
NATS_IMAGE: Final = "respawn-nats"


def _quiet(_: str) -> None:
    pass


def render(state: State) -> list[dict[str, Any]]:
    """The testbed overlay, as ``kubectl kustomize`` builds it."""
    proc = subprocess.run(
        [kubectl_binary(), "kustomize", str(OVERLAY)], capture_output=True, text=True, timeout=60, check=False
    )
    if proc.returncode != 0:
        raise TestbedError(f"kubectl kustomize {OVERLAY} failed: {proc.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def manifests(state: State) -> list[dict[str, Any]]:
    """Everything ``deploy`` applies: the overlay, the namespace first (so that the objects in it
    are created in the same apply)."""
    docs = render(state)
    return [d for d in docs if d.get("kind") == "Namespace"] + [
        d for d in docs if d.get("kind") != "Namespace"
    ]


def apply(kubeconfig: Path, docs: Iterable[dict[str, Any]]) -> None:
    text = "".join("---\n" + yaml.safe_dump(d, sort_keys=False) for d in docs)
    kubectl(
        kubeconfig,
        "apply",
        "--server-side",
        "--force-conflicts",
        # Not the real node's manager: applying the overlay's Namespace under that one would take
        # away the placement annotations the node put there.
        "--field-manager=respawn-local-deploy",
        "-f",
        "-",
        stdin=text,
        timeout=120,
    )


@dataclass(frozen=True)
class Rollout:
    """What ``deploy`` did: the images it imported and how long it took until all was Ready."""

    images: dict[str, BuiltImage]
    import_seconds: float
    ready_seconds: float


def deploy(state: State, *, log: Log = _quiet, timeout: float = 300) -> Rollout:
    """Deploy Respawn onto the testbed's real node; returns once every pod is Ready."""
    if state.real_node is None:
        raise TestbedError(
            "this testbed has no real node to run Respawn's pods; "
            f"run 'respawn local up --real-node --state-dir {state.state_dir}' first"
        )
    images = build_images(log)
    started = time.monotonic()
    log("importing the respawn and NATS images into the node's containerd")
    realnode.import_archives(state.state_dir, [images[RESPAWN_IMAGE].archive, images[NATS_IMAGE].archive])
    imported = time.monotonic()
    docs = manifests(state)
    wait_claims_bound(state, nats_servers(docs), log=log)
    log(f"applying {OVERLAY.relative_to(binaries.REPO_ROOT)}")
    apply(state.kubeconfig, docs)
    wait_ready(state.kubeconfig, timeout=timeout, log=log)
    done = time.monotonic()
    return Rollout(images=images, import_seconds=imported - started, ready_seconds=done - imported)


def nats_servers(docs: Iterable[dict[str, Any]]) -> int:
    """How many NATS servers the manifests run: the replicas of the NATS StatefulSet."""
    for d in docs:
        if d.get("kind") == "StatefulSet" and d.get("metadata", {}).get("name") == NATS_STATEFULSET:
            return int(d.get("spec", {}).get("replicas", 1))
    return 0


def claim_phases(kubeconfig: Path, servers: int) -> dict[str, str]:
    """The phase of each claim of the first ``servers`` NATS servers: ``Bound``, ``Pending``, …,
    ``missing``, or why it could not be read."""
    phases = {}
    for claim in realnode.NATS_CLAIMS[:servers]:
        try:
            obj = get_object(kubeconfig, "persistentvolumeclaim", claim, "-n", NAMESPACE)
        except TestbedError as e:
            phases[claim] = f"unreadable ({e})"
            continue
        phases[claim] = "missing" if obj is None else obj.get("status", {}).get("phase", "Pending")
    return phases


def wait_claims_bound(state: State, servers: int, *, log: Log = _quiet, timeout: float = 60) -> None:
    """Wait for the claims of the ``servers`` NATS servers to be Bound (the node made them,
    ``realnode.cluster_manifests``), so that the NATS pods are placed at once instead of waiting
    on the scheduler for their claims. A testbed whose node made none (one started by an older
    version) gets them now."""
    if "missing" in claim_phases(state.kubeconfig, servers).values():
        log("making the NATS servers' claims, bound to the node's volumes")
        realnode.provide(realnode.Layout(state.state_dir), state.kubeconfig)

    def unbound() -> dict[str, str]:
        return {c: phase for c, phase in claim_phases(state.kubeconfig, servers).items() if phase != "Bound"}

    try:
        until_sync("the NATS claims Bound", unbound, done=lambda left: not left, within=timeout)
    except WaitTimeout as e:
        raise TestbedError(
            f"{e}; see 'kubectl get pv,pvc -n {NAMESPACE}'; 'respawn local undeploy' makes the "
            "volumes and their claims again, then deploy again"
        ) from None


def _workload(kubeconfig: Path, kind: str, name: str) -> dict[str, Any] | None:
    try:
        obj: dict[str, Any] | None = get_object(kubeconfig, kind, name, "-n", NAMESPACE)
    except TestbedError:
        return None
    return obj


def rolled_out(obj: dict[str, Any] | None) -> bool:
    """A Deployment or StatefulSet whose current spec runs on every replica, all Ready."""
    if obj is None:
        return False
    spec, status = obj.get("spec", {}), obj.get("status", {})
    want = int(spec.get("replicas", 1))
    if int(status.get("observedGeneration", 0)) < int(obj["metadata"].get("generation", 0)):
        return False
    if obj["kind"] == "StatefulSet":
        updated = status.get("updatedReplicas", 0) == want and status.get("currentRevision") == status.get(
            "updateRevision"
        )
    else:
        updated = status.get("updatedReplicas", 0) == want and status.get("replicas", 0) == want
    return bool(updated and status.get("readyReplicas", 0) == want)


def not_ready(kubeconfig: Path) -> list[str]:
    """The Deployments and StatefulSet not rolled out yet, by kind/name."""
    waiting = (
        []
        if rolled_out(_workload(kubeconfig, "statefulset", NATS_STATEFULSET))
        else [f"statefulset/{NATS_STATEFULSET}"]
    )
    waiting += [
        f"deployment/{d}" for d in DEPLOYMENTS if not rolled_out(_workload(kubeconfig, "deployment", d))
    ]
    return waiting


def pod_report(kubeconfig: Path) -> str:
    """The pods of Respawn's namespace as ``describe_pods`` puts them, or why they could not be read."""
    proc = kubectl(kubeconfig, "get", "pods", "-n", NAMESPACE, "-o", "json", check=False)
    if proc.returncode != 0:
        return proc.stderr.strip()
    return describe_pods(json.loads(proc.stdout).get("items", []))


def describe_pods(pods: list[dict[str, Any]]) -> str:
    """Each pod's phase, readiness, why it is not scheduled yet, and its containers' waiting or
    terminated reasons: enough to tell a pod the scheduler cannot place from one that fails."""
    lines = []
    for pod in pods:
        status = pod.get("status", {})
        conditions = {c["type"]: c for c in status.get("conditions", [])}
        ready = conditions.get("Ready", {}).get("status", "?")
        reasons = []
        scheduled = conditions.get("PodScheduled", {})
        if scheduled.get("status") == "False":
            why = f"{scheduled.get('reason', '')} {scheduled.get('message', '')}".strip()
            reasons.append(f"not scheduled: {why}")
        for cs in status.get("containerStatuses", []):
            for state_name in ("waiting", "terminated"):
                detail = cs.get("state", {}).get(state_name)
                if detail:
                    why = f"{detail.get('reason', '')} {detail.get('message', '')}".strip()
                    reasons.append(f"{cs['name']} {state_name}: {why}")
        lines.append(
            f"{pod['metadata']['name']} {status.get('phase')} Ready={ready} {'; '.join(reasons)}".strip()
        )
    return " | ".join(lines) or "no pods"


def wait_ready(kubeconfig: Path, *, timeout: float = 300, log: Log = _quiet) -> None:
    deadline = time.monotonic() + timeout
    waiting = not_ready(kubeconfig)
    while waiting:
        if time.monotonic() > deadline:
            raise TestbedError(
                f"Respawn's pods not Ready within {timeout:.0f}s ({', '.join(waiting)}): "
                f"{pod_report(kubeconfig)}"
            )
        time.sleep(1)
        waiting = not_ready(kubeconfig)
    log("Respawn runs on the real node: every service, the webhook and NATS Ready")


def undeploy(state: State, *, log: Log = _quiet, timeout: float = 120) -> None:
    """Remove what ``deploy`` applied (the CRD and users' AppWrappers stay)."""
    log(f"deleting namespace {NAMESPACE} and Respawn's cluster-wide objects")
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        kubectl(state.kubeconfig, "delete", kind, WEBHOOK_CONFIGURATION, "--ignore-not-found", check=False)
    kubectl(
        state.kubeconfig,
        "delete",
        "namespace",
        NAMESPACE,
        "--ignore-not-found",
        f"--timeout={int(timeout)}s",
        timeout=timeout + 10,
    )
    # The NATS volumes are released with their claims: made again, empty, with their claims
    # bound to them and the namespace's placement annotations, as `local up --real-node` left them.
    volumes = [realnode.nats_volume(i) for i in range(len(realnode.NATS_CLAIMS))]
    kubectl(state.kubeconfig, "delete", "pv", *volumes, "--ignore-not-found", check=False)
    layout = realnode.Layout(state.state_dir)
    shutil.rmtree(layout.volumes, ignore_errors=True)
    realnode.provide(layout, state.kubeconfig)
