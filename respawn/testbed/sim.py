"""Fault injection helpers for tests and the demo (pod simulation contract, see README).

They act through the real API, exactly as an outside actor would.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from respawn.testbed.cluster import kubectl
from respawn.testbed.errors import TestbedError
from respawn.testbed.kubeapi import get_object, merge_patch

SUCCEED_AFTER = "sim.respawn.dev/succeed-after"
FAIL_AFTER = "sim.respawn.dev/fail-after"
EXIT_CODE = "sim.respawn.dev/exit-code"
STUCK_INIT = "sim.respawn.dev/stuck-init"
STUCK_TERMINATING = "sim.respawn.dev/stuck-terminating"


def get_json(kubeconfig: Path, *args: str) -> Any:
    """What ``kubectl get <args> -o json`` prints (:func:`~respawn.testbed.kubeapi.get_object`);
    a missing object is an error here."""
    found = get_object(kubeconfig, *args)
    if found is None:
        raise TestbedError(f"get {' '.join(args)}: (NotFound) no such object")
    return found


def fail_pod(
    kubeconfig: Path,
    namespace: str,
    pod: str,
    *,
    exit_code: int = 1,
    reason: str = "Error",
    condition: dict[str, str] | None = None,
) -> None:
    """Mark a pod Failed now, with every container terminated with ``exit_code`` (and its
    terminated ``reason``), and ``condition`` (type, reason, message; status True) added to the
    pod's conditions when given.

    A status patch through the API, as a kubelet would write it; the testbed's kwok stages
    never overwrite it.
    """
    body = get_json(kubeconfig, "pod", pod, "-n", namespace)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    statuses = [
        {
            "name": c["name"],
            "image": c.get("image", ""),
            "ready": False,
            "restartCount": 0,
            "state": {
                "terminated": {"exitCode": exit_code, "reason": reason, "startedAt": now, "finishedAt": now}
            },
        }
        for c in body["spec"]["containers"]
    ]
    patch: dict[str, Any] = {"status": {"phase": "Failed", "containerStatuses": statuses}}
    if condition is not None:
        added = {"status": "True", "lastTransitionTime": now, **condition}
        kept = [c for c in body.get("status", {}).get("conditions", []) if c.get("type") != added["type"]]
        patch["status"]["conditions"] = [*kept, added]
    patch_pod_status(kubeconfig, namespace, pod, patch)


def crash_loop_pod(kubeconfig: Path, namespace: str, body: dict[str, Any], restarts: int) -> None:
    """Write a crash loop's status, as the kubelet does: every container of the pod ``body``
    exited with 1 and waits in CrashLoopBackOff to be started again, ``restarts`` times so far;
    the pod stays Running (restartPolicy OnFailure)."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    statuses = [
        {
            "name": c["name"],
            "image": c.get("image", ""),
            "ready": False,
            "started": False,
            "restartCount": restarts,
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s restarting"}},
            "lastState": {
                "terminated": {"exitCode": 1, "reason": "Error", "startedAt": now, "finishedAt": now}
            },
        }
        for c in body["spec"]["containers"]
    ]
    patch = {"status": {"phase": "Running", "containerStatuses": statuses}}
    patch_pod_status(kubeconfig, namespace, body["metadata"]["name"], patch)


def patch_pod_status(kubeconfig: Path, namespace: str, pod: str, patch: dict[str, Any]) -> None:
    """A merge patch of the pod's status subresource, as a kubelet writes it; the testbed's
    kwok stages never overwrite it."""
    merge_patch(kubeconfig, "pod", pod, patch, namespace=namespace, subresource="status")


def evict_pod(kubeconfig: Path, namespace: str, pod: str) -> None:
    """The end of a pod evicted through the Eviction API (as a node drain does), as Kubernetes
    records it: the condition DisruptionTarget with reason EvictionByEvictionAPI, then phase
    Failed, its containers stopped by SIGTERM (exit code 143)."""
    fail_pod(
        kubeconfig,
        namespace,
        pod,
        exit_code=143,
        condition={
            "type": "DisruptionTarget",
            "reason": "EvictionByEvictionAPI",
            "message": "Eviction API: evicting",
        },
    )


def label_node(kubeconfig: Path, node: str, key: str, value: str | None) -> None:
    """Set (or with ``value=None`` remove) a node label, e.g. autopilot.ibm.com/gpuhealth=EVICT."""
    merge_patch(kubeconfig, "node", node, {"metadata": {"labels": {key: value}}})


def taint_node(
    kubeconfig: Path, node: str, key: str, value: str, effect: str, *, remove: bool = False
) -> None:
    arg = f"{key}={value}:{effect}" + ("-" if remove else "")
    args = [arg] if remove else [arg, "--overwrite"]
    kubectl(kubeconfig, "taint", "node", node, *args)


def delete_component(kubeconfig: Path, namespace: str, kind: str, name: str) -> None:
    """Delete a wrapped resource behind the controller's back (background propagation)."""
    kubectl(kubeconfig, "delete", kind, name, "-n", namespace, "--cascade=background", "--wait=false")
