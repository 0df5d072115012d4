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
from respawn.testbed.cluster import GPU_RESOURCE
from shared.appwrapper import params
from shared.appwrapper.constants import API_VERSION, KIND
from shared.kubetime import format_kube_time

# Retries far above what a run injects: the retry limit is not what is measured.
RETRY_LIMIT = "1000"


def namespace_manifest(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def appwrapper_manifest(spec: AwSpec, cfg: BenchConfig) -> dict[str, Any]:
    """One AppWrapper of ``bench.run``'s workload: a Job or a PyTorchJob, with the run's periods."""
    stuck = spec.kind == "stuck-init"
    grace = cfg.warmup_grace if stuck else cfg.setup_grace
    annotations = {
        params.ADMISSION_GRACE_PERIOD_ANNOTATION: grace,
        params.WARMUP_GRACE_PERIOD_ANNOTATION: grace,
        params.FAILURE_GRACE_PERIOD_ANNOTATION: cfg.failure_grace,
        params.RETRY_PAUSE_PERIOD_ANNOTATION: cfg.retry_pause,
        params.RETRY_LIMIT_ANNOTATION: "1" if stuck else RETRY_LIMIT,
    }
    resources = {"limits": {GPU_RESOURCE: "1"}} if spec.gpu else {}

    def pod_template(container: str) -> dict[str, Any]:
        pod: dict[str, Any] = {
            "restartPolicy": "Never",
            "containers": [
                {"name": container, "image": "registry.invalid/trainer:1", "resources": resources}
            ],
        }
        if stuck:
            pod["initContainers"] = [{"name": "setup", "image": "registry.invalid/setup:1"}]
        metadata = {"annotations": {sim.STUCK_INIT: "true"}} if stuck else {}
        return {"metadata": metadata, "spec": pod}

    if spec.kind == "pytorchjob":
        replicas: dict[str, Any] = {
            # The training operator finds the framework container by this name.
            "Master": {"replicas": 1, "restartPolicy": "Never", "template": pod_template("pytorch")}
        }
        if spec.pods > 1:
            replicas["Worker"] = {
                "replicas": spec.pods - 1,
                "restartPolicy": "Never",
                "template": pod_template("pytorch"),
            }
        template: dict[str, Any] = {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": spec.name},
            "spec": {"pytorchReplicaSpecs": replicas},
        }
    else:
        template = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": spec.name},
            "spec": {
                "parallelism": spec.pods,
                "completions": spec.pods,
                "backoffLimit": 0,
                "template": pod_template("train"),
            },
        }
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": spec.name, "annotations": annotations},
        "spec": {"components": [{"template": template}]},
    }


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
