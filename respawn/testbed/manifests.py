"""AppWrapper manifests used by the demo, the benchmarks and the tests: one builder, not five copies."""

from __future__ import annotations

from typing import Any

from shared.appwrapper.constants import API_VERSION, KIND

GPU = "nvidia.com/gpu"


def job_appwrapper(
    name: str,
    *,
    pods: int = 1,
    gpus: int = 0,
    pod_annotations: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    namespace: str | None = None,
    job_name: str | None = None,
    suspend: bool = False,
    init_container: bool = False,
) -> dict[str, Any]:
    """An AppWrapper around one batch/v1 Job of ``pods`` pods (``backoffLimit: 0``, so the Job
    itself never replaces a failed pod and every failure is Respawn's to handle).

    ``gpus`` is the nvidia.com/gpu limit of each pod; ``pod_annotations`` go on the pod template
    (the testbed's simulation contract: ``sim.respawn.dev/*``); ``annotations`` on the AppWrapper.
    """
    container: dict[str, Any] = {"name": "main", "image": "busybox"}
    if gpus:
        container["resources"] = {"limits": {GPU: str(gpus)}}
    pod_spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [container]}
    if init_container:
        pod_spec["initContainers"] = [{"name": "setup", "image": "busybox"}]
    metadata: dict[str, Any] = {"name": name, "annotations": dict(annotations or {})}
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": {
            "suspend": suspend,
            "components": [
                {
                    "template": {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "metadata": {"name": job_name or f"{name}-job"},
                        "spec": {
                            "parallelism": pods,
                            "completions": pods,
                            "backoffLimit": 0,
                            "template": {
                                "metadata": {"annotations": dict(pod_annotations or {})},
                                "spec": pod_spec,
                            },
                        },
                    }
                }
            ],
        },
    }
