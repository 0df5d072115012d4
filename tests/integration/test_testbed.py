"""The testbed is real: Kubernetes controllers, the scheduler, kwok's pod contract and JetStream."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from respawn.testbed import sim
from respawn.testbed.cluster import kubectl
from respawn.testbed.modes import Endpoints
from tests.waiting import until_sync

pytestmark = pytest.mark.testbed


def poll(check: Callable[[], Any], *, timeout: float = 60, what: str) -> Any:
    return until_sync(what, check, within=timeout)


def apply(kubeconfig: Path, namespace: str, manifest: dict[str, Any]) -> None:
    kubectl(kubeconfig, "apply", "-n", namespace, "-f", "-", stdin=json.dumps(manifest))


def pods(kubeconfig: Path, namespace: str, selector: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = sim.get_json(kubeconfig, "pods", "-n", namespace, "-l", selector)["items"]
    return items


def job(
    name: str, *, parallelism: int = 1, annotations: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "parallelism": parallelism,
            "completions": parallelism,
            **spec,
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": annotations or {}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]},
            },
        },
    }


def test_job_pods_are_scheduled_run_and_succeed(testbed: Endpoints, namespace: str) -> None:
    kc = testbed.kubeconfig
    apply(kc, namespace, job("ok", parallelism=2, annotations={sim.SUCCEED_AFTER: "2s"}))
    running = poll(
        lambda: [p for p in pods(kc, namespace, "app=ok") if p["status"].get("phase") == "Running"],
        what="2 running pods",
    )
    for p in running:
        assert p["spec"]["nodeName"].startswith("kwok-node-"), "bound to a fake node by the real scheduler"
    poll(
        lambda: len([p for p in pods(kc, namespace, "app=ok") if p["spec"].get("nodeName")]) == 2,
        what="2 bound",
    )
    poll(
        lambda: [p["status"]["phase"] for p in pods(kc, namespace, "app=ok")] == ["Succeeded", "Succeeded"],
        what="both pods Succeeded",
    )
    conds = poll(
        lambda: [
            c["type"]
            for c in sim.get_json(kc, "job", "ok", "-n", namespace)["status"].get("conditions", [])
            if c["status"] == "True"
        ],
        what="job conditions",
    )
    poll(
        lambda: (
            "Complete"
            in [
                c["type"]
                for c in sim.get_json(kc, "job", "ok", "-n", namespace)["status"].get("conditions", [])
                if c["status"] == "True"
            ]
        ),
        what=f"Job Complete (had {conds})",
    )


def test_fail_after_pod_fails_with_exit_code_and_job_controller_reacts(
    testbed: Endpoints, namespace: str
) -> None:
    kc = testbed.kubeconfig
    apply(kc, namespace, job("bad", annotations={sim.FAIL_AFTER: "1s", sim.EXIT_CODE: "42"}, backoffLimit=1))

    def failed() -> list[dict[str, Any]]:
        return [p for p in pods(kc, namespace, "app=bad") if p["status"].get("phase") == "Failed"]

    first = poll(failed, what="a Failed pod")[0]
    term = first["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 42
    # backoffLimit 1: the Job controller replaces the failed pod once, then marks the Job Failed.
    poll(lambda: len(failed()) >= 2, timeout=90, what="the Job controller's replacement pod to fail too")
    poll(
        lambda: any(
            c["type"] == "Failed" and c["status"] == "True"
            for c in sim.get_json(kc, "job", "bad", "-n", namespace)["status"].get("conditions", [])
        ),
        timeout=90,
        what="Job Failed condition",
    )


def test_status_patch_is_not_overwritten(testbed: Endpoints, namespace: str) -> None:
    kc = testbed.kubeconfig
    apply(kc, namespace, job("patched"))
    pod = poll(
        lambda: [p for p in pods(kc, namespace, "app=patched") if p["status"].get("phase") == "Running"],
        what="running pod",
    )[0]["metadata"]["name"]
    sim.fail_pod(kc, namespace, pod, exit_code=7)
    got = poll(
        lambda: sim.get_json(kc, "pod", pod, "-n", namespace)["status"].get("phase") == "Failed",
        what="pod Failed after patch",
    )
    assert got
    # Give kwok every chance to (wrongly) rewrite it: the Job controller must see the failure instead.
    poll(
        lambda: sim.get_json(kc, "job", "patched", "-n", namespace)["status"].get("failed", 0) >= 1,
        what="Job controller counts the failed pod",
    )
    status = sim.get_json(kc, "pod", pod, "-n", namespace)["status"]
    assert status["phase"] == "Failed"
    assert status["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 7


def test_garbage_collector_and_stuck_terminating(testbed: Endpoints, namespace: str) -> None:
    kc = testbed.kubeconfig
    apply(kc, namespace, job("gc", parallelism=2))
    poll(lambda: len(pods(kc, namespace, "app=gc")) == 2, what="2 pods")
    kubectl(kc, "delete", "job", "gc", "-n", namespace, "--cascade=background", "--wait=false")
    poll(lambda: pods(kc, namespace, "app=gc") == [], what="the garbage collector to delete the Job's pods")

    apply(kc, namespace, job("stuck", annotations={sim.STUCK_TERMINATING: "true"}))
    pod = poll(
        lambda: [p for p in pods(kc, namespace, "app=stuck") if p["status"].get("phase") == "Running"],
        what="running stuck pod",
    )[0]["metadata"]["name"]
    kubectl(kc, "delete", "job", "stuck", "-n", namespace, "--cascade=orphan", "--wait=false")
    kubectl(kc, "delete", "pod", pod, "-n", namespace, "--wait=false")
    poll(
        lambda: sim.get_json(kc, "pod", pod, "-n", namespace)["metadata"].get("deletionTimestamp"),
        what="deletionTimestamp set",
    )
    # The graceful delete must not complete: check it is still there after kwok had ample time.
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        assert kubectl(kc, "get", "pod", pod, "-n", namespace, check=False).returncode == 0, (
            "graceful delete completed"
        )
        time.sleep(0.3)
    kubectl(kc, "delete", "pod", pod, "-n", namespace, "--grace-period=0", "--force", "--wait=false")
    poll(
        lambda: kubectl(kc, "get", "pod", pod, "-n", namespace, check=False).returncode != 0,
        what="pod gone after grace-0 delete",
    )


def test_stuck_init_stays_pending(testbed: Endpoints, namespace: str) -> None:
    kc = testbed.kubeconfig
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "init", "labels": {"app": "init"}, "annotations": {sim.STUCK_INIT: "true"}},
        "spec": {
            "initContainers": [{"name": "setup", "image": "busybox"}],
            "containers": [{"name": "main", "image": "busybox"}],
        },
    }
    apply(kc, namespace, manifest)
    status = poll(
        lambda: sim.get_json(kc, "pod", "init", "-n", namespace)["status"].get("initContainerStatuses"),
        what="init container status",
    )
    assert "running" in status[0]["state"]
    assert sim.get_json(kc, "pod", "init", "-n", namespace)["status"]["phase"] == "Pending"


def test_gpu_capacity_limits_scheduling_and_evict_label_keeps_node_ready(
    testbed: Endpoints, namespace: str
) -> None:
    kc = testbed.kubeconfig
    nodes = sim.get_json(kc, "nodes")["items"]
    total_gpus = sum(int(n["status"]["allocatable"]["nvidia.com/gpu"]) for n in nodes)
    assert total_gpus == 8 * len(nodes)
    big = job("gpu", parallelism=len(nodes) + 1)
    big["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 8}}
    apply(kc, namespace, big)
    poll(
        lambda: len([p for p in pods(kc, namespace, "app=gpu") if p["spec"].get("nodeName")]) == len(nodes),
        what="one 8-GPU pod per node",
    )
    pending = poll(
        lambda: [
            p
            for p in pods(kc, namespace, "app=gpu")
            if not p["spec"].get("nodeName")
            and any(c.get("reason") == "Unschedulable" for c in p["status"].get("conditions", []))
        ],
        what="the extra pod to be Unschedulable",
    )
    assert len(pending) == 1
    kubectl(kc, "delete", "job", "gpu", "-n", namespace, "--wait=false")

    node = nodes[0]["metadata"]["name"]
    sim.label_node(kc, node, "autopilot.ibm.com/gpuhealth", "EVICT")
    try:
        labelled = sim.get_json(kc, "node", node)
        assert labelled["metadata"]["labels"]["autopilot.ibm.com/gpuhealth"] == "EVICT"
        ready = [c["status"] for c in labelled["status"]["conditions"] if c["type"] == "Ready"]
        assert ready == ["True"]
    finally:
        sim.label_node(kc, node, "autopilot.ibm.com/gpuhealth", None)


def test_pytorchjob_runs_pods_and_reports_failure(testbed: Endpoints, namespace: str) -> None:
    kc = testbed.kubeconfig

    def replica(n: int) -> dict[str, Any]:
        return {
            "replicas": n,
            "restartPolicy": "Never",
            "template": {
                "spec": {
                    "containers": [{"name": "pytorch", "image": "pytorch", "command": ["python", "train.py"]}]
                }
            },
        }

    apply(
        kc,
        namespace,
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": "ptj"},
            "spec": {"pytorchReplicaSpecs": {"Master": replica(1), "Worker": replica(2)}},
        },
    )
    sel = "training.kubeflow.org/job-name=ptj"
    running = poll(
        lambda: (
            len(ps := [p for p in pods(kc, namespace, sel) if p["status"].get("phase") == "Running"]) == 3
            and ps
        ),
        timeout=90,
        what="3 running PyTorchJob pods",
    )
    worker = next(
        p for p in running if p["metadata"]["labels"].get("training.kubeflow.org/replica-type") == "worker"
    )
    sim.fail_pod(kc, namespace, worker["metadata"]["name"], exit_code=1)
    poll(
        lambda: any(
            c["type"] == "Failed" and c["status"] == "True"
            for c in sim.get_json(kc, "pytorchjob", "ptj", "-n", namespace)
            .get("status", {})
            .get("conditions", [])
        ),
        timeout=90,
        what="PyTorchJob Failed condition",
    )


async def test_jetstream_stream_kv_and_durable_consumer(testbed: Endpoints) -> None:
    import nats

    nc = await nats.connect(testbed.nats_url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="TESTBED", subjects=["testbed.>"])
        kv = await js.create_key_value(bucket="testbed")
        await kv.put("k", b"v1")
        assert (await kv.get("k")).value == b"v1"
        await js.publish("testbed.a", b"hello")
        sub = await js.pull_subscribe("testbed.>", durable="probe")
        msgs = await sub.fetch(1, timeout=5)
        assert msgs[0].data == b"hello"
        await msgs[0].ack()
        info = await js.consumer_info("TESTBED", "probe")
        assert info.config.durable_name == "probe"
    finally:
        await nc.close()
