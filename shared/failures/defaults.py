"""The default failure table: tried after the upstream exit-code annotations and the workload's
own patterns, behind (or instead of) the operator's. First match wins, so the specific rows come
before the general ones (an eviction for exceeding one's own storage limit before any eviction).
docs/failures.md explains every row; a unit test keeps the two in step.

The reason strings are the ones Kubernetes and Kueue write: the ``DisruptionTarget`` condition's
reasons (scheduler preemption, Eviction API, taint manager, pod garbage collector, kubelet), the
kubelet's pod reasons (Evicted, Preempting, Terminated/Shutdown for a node shutdown, OutOf* and
UnexpectedAdmissionError for a pod the node refused), and Kueue's ``TerminationTarget``
condition with the reason ``WorkloadEvicted`` or ``WorkloadEvictedDueTo<why>``.
"""

from __future__ import annotations

from typing import Any, Final

from shared.failures.patterns import FailurePattern

__all__ = ["DEFAULT_PATTERNS"]

_DISRUPTION: Final = "DisruptionTarget"


def _row(**fields: Any) -> FailurePattern:
    return FailurePattern.model_validate(fields)


DEFAULT_PATTERNS: Final[tuple[FailurePattern, ...]] = (
    _row(
        node_state=["NotReady", "Unknown", "Deleted"],
        failure_class="Transient",
        code="NodeLost",
        description="the pod's node is not Ready, out of contact or gone: the node failed, not the pod",
    ),
    _row(
        reason="NodeLost",
        failure_class="Transient",
        code="NodeLost",
        description="the node controller marked the pod lost with its node",
    ),
    _row(
        condition={"type": _DISRUPTION, "reason": "DeletionByPodGC"},
        failure_class="Transient",
        code="NodeLost",
        description="the pod garbage collector removed a pod bound to a node that is gone or out of service",
    ),
    _row(
        condition={"type": _DISRUPTION, "reason": "PreemptionBy(Kube)?Scheduler"},
        failure_class="Transient",
        code="Preempted",
        description="the scheduler preempted the pod for one of higher priority",
    ),
    _row(
        reason="Preempting",
        failure_class="Transient",
        code="Preempted",
        description="the kubelet preempted the pod to admit a critical pod",
    ),
    _row(
        condition={"type": "TerminationTarget", "reason": "WorkloadEvicted.*"},
        failure_class="Transient",
        code="QueueEvicted",
        description="Kueue evicted the workload (preemption, PodsReady timeout, admission check, ...)",
    ),
    _row(
        reason="Evicted",
        message=(
            r"ephemeral local storage usage exceeds|exceeded its local ephemeral storage limit"
            r"|Usage of EmptyDir volume .* exceeds the limit"
        ),
        failure_class="Unknown",
        code="EphemeralStorageLimit",
        description="evicted for using more local storage than it asked for: the workload's own doing",
    ),
    _row(
        condition={"type": _DISRUPTION, "reason": "EvictionByEvictionAPI"},
        failure_class="Transient",
        code="Evicted",
        description="evicted through the Eviction API (a node drain)",
    ),
    _row(
        reason="Evicted",
        failure_class="Transient",
        code="Evicted",
        description="the kubelet evicted the pod under node pressure",
    ),
    _row(
        condition={"type": _DISRUPTION, "reason": "DeletionByTaintManager"},
        failure_class="Transient",
        code="NoExecuteTaint",
        description="a NoExecute taint on the node that the pod does not tolerate",
    ),
    _row(
        reason="Terminated|Shutdown",
        failure_class="Transient",
        code="NodeShutdown",
        description="the kubelet stopped the pod because its node is shutting down",
    ),
    _row(
        condition={"type": _DISRUPTION, "reason": "TerminationByKubelet"},
        failure_class="Transient",
        code="KubeletTermination",
        description="the kubelet ended the pod for a reason of its own (pressure, shutdown, preemption)",
    ),
    _row(
        condition={"type": _DISRUPTION},
        failure_class="Transient",
        code="Disrupted",
        description="any other disruption Kubernetes announced before ending the pod",
    ),
    _row(
        reason="OutOf.+|UnexpectedAdmissionError|NodeAffinity|NodeSelectorMismatching|InvalidNodeInfo",
        failure_class="Transient",
        code="NodeAdmission",
        description="the node refused to admit the pod after the scheduler placed it there",
    ),
    _row(
        deleted_externally=True,
        failure_class="Transient",
        code="DeletedExternally",
        description="someone other than Respawn deleted the pod behind the workload's back",
    ),
    _row(
        reason="OOMKilled",
        failure_class="Unknown",
        code="OOMKilled",
        description="a container ran out of memory: may recur with the same limits, may not",
    ),
    _row(
        reason="InvalidImageName",
        failure_class="Permanent",
        code="InvalidImageName",
        description="the image reference cannot be parsed: no retry can pull it",
    ),
    _row(
        reason="ErrImagePull|ImagePullBackOff",
        failure_class="Unknown",
        code="ImagePull",
        description="the image could not be pulled: a registry outage or an image that does not exist",
    ),
    _row(
        exit_codes=[126, 127],
        failure_class="Permanent",
        description="the command cannot be run or is not found in the image (shell conventions)",
    ),
    _row(
        signal=["SIGKILL", "SIGTERM", "SIGINT", "SIGHUP"],
        failure_class="Transient",
        description="killed by a signal from outside the application, not a crash of its own",
    ),
)
