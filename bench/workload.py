"""Every object the benchmarks write to a cluster: AppWrapper manifests, the namespace, and the
status a crashed pod gets. One module, so that a change of manifest reaches every benchmark alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from bench.config import BenchConfig
from bench.plan import AwSpec
from respawn.testbed import manifests, sim
from shared.kubetime import format_kube_time

# Retries far above what a run injects: the retry limit is not what is measured.
RETRY_LIMIT = 1000


def namespace_manifest(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def appwrapper_manifest(spec: AwSpec, cfg: BenchConfig) -> dict[str, Any]:
    """One AppWrapper of ``bench.run``'s workload: a Job or a PyTorchJob, with the run's periods."""
    stuck = spec.kind == "stuck-init"
    grace = cfg.warmup_grace if stuck else cfg.setup_grace
    annotations = manifests.fault_tolerance(
        admission_grace=grace,
        warmup_grace=grace,
        failure_grace=cfg.failure_grace,
        retry_pause=cfg.retry_pause,
        retry_limit=1 if stuck else RETRY_LIMIT,
    )
    # A container that is never pulled (kwok runs no image), named so that nobody mistakes the
    # benchmark's pods for real ones.
    shape: dict[str, Any] = {
        "gpus": 1 if spec.gpu else 0,
        "image": "registry.invalid/trainer:1",
        "init_container": stuck,
        "annotations": {sim.STUCK_INIT: "true"} if stuck else None,
    }
    if spec.kind == "pytorchjob":
        workers = {"Worker": spec.pods - 1} if spec.pods > 1 else {}
        template = manifests.pytorchjob(
            spec.name,
            replicas={"Master": 1, **workers},
            template=manifests.pod_template(container="pytorch", **shape),
        )
    else:
        template = manifests.job(
            spec.name,
            pods=spec.pods,
            backoffLimit=0,
            template=manifests.pod_template(container="train", **shape),
        )
    return manifests.appwrapper(spec.name, manifests.component(template), annotations=annotations)


def job_appwrapper(name: str, pods: int, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """The single-service benchmarks' AppWrapper: one Job of ``pods`` pods, named like it."""
    return manifests.job_appwrapper(name, pods=pods, annotations=annotations, job_name=name)


def observed_job_appwrapper(namespace: str, name: str, uid: str, pods: int, deployed: str) -> dict[str, Any]:
    """``job_appwrapper`` as the watcher would observe it Running since ``deployed``: the body of
    an AppWrapper observation, published without any cluster."""
    body = job_appwrapper(name, pods)
    body["metadata"].update(namespace=namespace, uid=uid)
    body["status"] = {
        "phase": "Running",
        "resettingCount": 0,
        "conditions": [
            {
                "type": "ResourcesDeployed",
                "status": "True",
                "lastTransitionTime": deployed,
                "reason": "Resuming",
            }
        ],
        "componentStatus": [
            {
                "name": name,
                "kind": "Job",
                "apiVersion": "batch/v1",
                "podSets": [{"replicas": pods, "path": "template.spec.template"}],
            }
        ],
    }
    return body


def failed_pod_status(containers: Iterable[tuple[str, str]], exit_code: int, at: datetime) -> dict[str, Any]:
    """The status patch a kubelet writes for a crashed pod, every container (name, image)
    terminated with ``exit_code`` at ``at``; the same as ``sim.fail_pod`` writes through kubectl."""
    stamp = format_kube_time(at)
    statuses = [
        {
            "name": name,
            "image": image,
            "ready": False,
            "restartCount": 0,
            "state": {
                "terminated": {
                    "exitCode": exit_code,
                    "reason": "Error",
                    "startedAt": stamp,
                    "finishedAt": stamp,
                }
            },
        }
        for name, image in containers
    ]
    return {"status": {"phase": "Failed", "containerStatuses": statuses}}
