"""The testbed is real: Kubernetes controllers, the scheduler, kwok's pod contract and JetStream."""

from __future__ import annotations

import functools
import json
import socket
import ssl
from pathlib import Path
from typing import Any

import pytest

from respawn.testbed import kubeapi, manifests, sim
from respawn.testbed.cluster import kubectl
from respawn.testbed.errors import TestbedError
from respawn.testbed.modes import Endpoints
from tests.integration.objects import apply
from tests.waiting import holds_sync, until_sync

pytestmark = pytest.mark.testbed


def pods(kubeconfig: Path, namespace: str, selector: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = sim.get_json(kubeconfig, "pods", "-n", namespace, "-l", selector)["items"]
    return items


def job(
    name: str, *, parallelism: int = 1, annotations: dict[str, str] | None = None, gpus: int = 0, **spec: Any
) -> dict[str, Any]:
    """A Job whose pods are labelled app=<name>."""
    template = manifests.pod_template(labels={"app": name}, annotations=annotations, gpus=gpus)
    return manifests.job(name, pods=parallelism, template=template, **spec)


def test_job_pods_are_scheduled_run_and_succeed(testbed: Endpoints, namespace: str) -> None:
    kc = testbed.kubeconfig
    apply(kc, namespace, job("ok", parallelism=2, annotations={sim.SUCCEED_AFTER: "2s"}))
    running = until_sync(
        "2 running pods",
        lambda: [p for p in pods(kc, namespace, "app=ok") if p["status"].get("phase") == "Running"],
    )
    for p in running:
        assert p["spec"]["nodeName"].startswith("kwok-node-"), "bound to a fake node by the real scheduler"
    until_sync(
        "2 bound", lambda: len([p for p in pods(kc, namespace, "app=ok") if p["spec"].get("nodeName")]) == 2
    )
    until_sync(
        "both pods Succeeded",
        lambda: [p["status"]["phase"] for p in pods(kc, namespace, "app=ok")] == ["Succeeded", "Succeeded"],
    )
    conds = until_sync(
        "job conditions",
        lambda: [
            c["type"]
            for c in sim.get_json(kc, "job", "ok", "-n", namespace)["status"].get("conditions", [])
            if c["status"] == "True"
        ],
    )
    until_sync(
        f"Job Complete (had {conds})",
        lambda: (
            "Complete"
            in [
                c["type"]
                for c in sim.get_json(kc, "job", "ok", "-n", namespace)["status"].get("conditions", [])
                if c["status"] == "True"
            ]
        ),
    )


def test_fail_after_pod_fails_with_exit_code_and_job_controller_reacts(
    testbed: Endpoints, namespace: str
) -> None:
    kc = testbed.kubeconfig
    apply(kc, namespace, job("bad", annotations={sim.FAIL_AFTER: "1s", sim.EXIT_CODE: "42"}, backoffLimit=1))

    def failed() -> list[dict[str, Any]]:
        return [p for p in pods(kc, namespace, "app=bad") if p["status"].get("phase") == "Failed"]

    first = until_sync("a Failed pod", failed)[0]
    term = first["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 42
    # backoffLimit 1: the Job controller replaces the failed pod once, then marks the Job Failed.
    until_sync("the Job controller's replacement pod to fail too", lambda: len(failed()) >= 2, within=90)
    until_sync(
        "Job Failed condition",
        lambda: any(
            c["type"] == "Failed" and c["status"] == "True"
            for c in sim.get_json(kc, "job", "bad", "-n", namespace)["status"].get("conditions", [])
        ),
        within=90,
    )


def test_status_patch_is_not_overwritten(testbed: Endpoints, namespace: str) -> None:
    kc = testbed.kubeconfig
    apply(kc, namespace, job("patched"))
    pod = until_sync(
        "running pod",
        lambda: [p for p in pods(kc, namespace, "app=patched") if p["status"].get("phase") == "Running"],
    )[0]["metadata"]["name"]
    sim.fail_pod(kc, namespace, pod, exit_code=7)
    got = until_sync(
        "pod Failed after patch",
        lambda: sim.get_json(kc, "pod", pod, "-n", namespace)["status"].get("phase") == "Failed",
    )
    assert got
    # Give kwok every chance to (wrongly) rewrite it: the Job controller must see the failure instead.
    until_sync(
        "Job controller counts the failed pod",
        lambda: sim.get_json(kc, "job", "patched", "-n", namespace)["status"].get("failed", 0) >= 1,
    )
    status = sim.get_json(kc, "pod", pod, "-n", namespace)["status"]
    assert status["phase"] == "Failed"
    assert status["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 7


def test_garbage_collector_and_stuck_terminating(testbed: Endpoints, namespace: str) -> None:
    kc = testbed.kubeconfig
    apply(kc, namespace, job("gc", parallelism=2))
    until_sync("2 pods", lambda: len(pods(kc, namespace, "app=gc")) == 2)
    kubectl(kc, "delete", "job", "gc", "-n", namespace, "--cascade=background", "--wait=false")
    until_sync("the garbage collector to delete the Job's pods", lambda: pods(kc, namespace, "app=gc") == [])

    apply(kc, namespace, job("stuck", annotations={sim.STUCK_TERMINATING: "true"}))
    pod = until_sync(
        "running stuck pod",
        lambda: [p for p in pods(kc, namespace, "app=stuck") if p["status"].get("phase") == "Running"],
    )[0]["metadata"]["name"]
    kubectl(kc, "delete", "job", "stuck", "-n", namespace, "--cascade=orphan", "--wait=false")
    kubectl(kc, "delete", "pod", pod, "-n", namespace, "--wait=false")
    until_sync(
        "deletionTimestamp set",
        lambda: sim.get_json(kc, "pod", pod, "-n", namespace)["metadata"].get("deletionTimestamp"),
    )
    # The graceful delete must not complete: check it is still there after kwok had ample time.
    holds_sync(
        "the pod being there (graceful delete not completed)",
        lambda: kubectl(kc, "get", "pod", pod, "-n", namespace, check=False).returncode == 0,
        during=3,
        every=0.3,
    )
    kubectl(kc, "delete", "pod", pod, "-n", namespace, "--grace-period=0", "--force", "--wait=false")
    until_sync(
        "pod gone after grace-0 delete",
        lambda: kubectl(kc, "get", "pod", pod, "-n", namespace, check=False).returncode != 0,
    )


def test_stuck_init_stays_pending(testbed: Endpoints, namespace: str) -> None:
    kc = testbed.kubeconfig
    manifest = manifests.pod(
        "init", labels={"app": "init"}, annotations={sim.STUCK_INIT: "true"}, init_container=True
    )
    apply(kc, namespace, manifest)
    status = until_sync(
        "init container status",
        lambda: sim.get_json(kc, "pod", "init", "-n", namespace)["status"].get("initContainerStatuses"),
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
    apply(kc, namespace, job("gpu", parallelism=len(nodes) + 1, gpus=8))
    until_sync(
        "one 8-GPU pod per node",
        lambda: len([p for p in pods(kc, namespace, "app=gpu") if p["spec"].get("nodeName")]) == len(nodes),
    )
    pending = until_sync(
        "the extra pod to be Unschedulable",
        lambda: [
            p
            for p in pods(kc, namespace, "app=gpu")
            if not p["spec"].get("nodeName")
            and any(c.get("reason") == "Unschedulable" for c in p["status"].get("conditions", []))
        ],
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

    apply(kc, namespace, manifests.pytorchjob("ptj", replicas={"Master": 1, "Worker": 2}))
    sel = "training.kubeflow.org/job-name=ptj"
    running = until_sync(
        "3 running PyTorchJob pods",
        lambda: (
            len(ps := [p for p in pods(kc, namespace, sel) if p["status"].get("phase") == "Running"]) == 3
            and ps
        ),
        within=90,
    )
    worker = next(
        p for p in running if p["metadata"]["labels"].get("training.kubeflow.org/replica-type") == "worker"
    )
    sim.fail_pod(kc, namespace, worker["metadata"]["name"], exit_code=1)
    until_sync(
        "PyTorchJob Failed condition",
        lambda: any(
            c["type"] == "Failed" and c["status"] == "True"
            for c in sim.get_json(kc, "pytorchjob", "ptj", "-n", namespace)
            .get("status", {})
            .get("conditions", [])
        ),
        within=90,
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


def test_reads_without_kubectl_give_what_kubectl_prints(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str
) -> None:
    """``kubeapi.get_object`` answers over one connection what ``kubectl get -o json`` prints:
    objects, lists (by label and field selector, across namespaces) and a missing object."""
    kc = testbed.kubeconfig
    apply(kc, namespace, job("listed", parallelism=2))
    apply(kc, namespace, manifests.job_appwrapper("wrapped", pods=1))
    until_sync("the Job's 2 pods", lambda: len(pods(kc, namespace, "app=listed")) == 2)
    quiet = (
        ("job", "listed", "-n", namespace),
        ("namespace", namespace),
        ("jobs", "-n", namespace),
        ("pods", "-n", namespace, "-l", "app=listed"),
        ("pods", "-n", namespace, "--field-selector", "metadata.namespace=" + namespace),
        # Across namespaces, but only this test's: another test's AppWrappers may be anything,
        # up to nested deeper than a comparison of the two answers can recurse.
        ("appwrappers", "-A", "--field-selector", "metadata.namespace=" + namespace),
        ("aw", "wrapped", "-n", namespace),
        ("crd", "appwrappers.workload.codeflare.dev"),  # not in the table: through kubectl
    )

    def both(args: tuple[str, ...]) -> tuple[Any, Any]:
        return kubeapi.get_object(kc, *args), kubeapi.loads(kubectl(kc, "get", *args, "-o", "json").stdout)

    # Pods change while kwok runs them; compare once a read of each way agrees (they must).
    for args in quiet:
        mine, theirs = until_sync(
            f"the same answer to get {' '.join(args)}",
            functools.partial(both, args),
            done=lambda r: r[0] == r[1],
        )
        assert mine == theirs
    assert kubeapi.get_object(kc, "pod", "nope", "-n", namespace) is None
    assert kubectl(kc, "get", "pod", "nope", "-n", namespace, check=False).returncode != 0
    with pytest.raises(TestbedError, match="nope"):
        sim.get_json(kc, "pod", "nope", "-n", namespace)


def test_a_namespace_made_without_kubectl_is_there_and_goes_when_deleted(testbed: Endpoints) -> None:
    kc = testbed.kubeconfig
    name = "made-directly"
    kubeapi.create_namespace(kc, name)
    assert (
        json.loads(kubectl(kc, "get", "namespace", name, "-o", "json").stdout)["status"]["phase"] == "Active"
    )
    with pytest.raises(TestbedError, match="already exists"):
        kubectl(kc, "create", "namespace", name)
    kubeapi.delete_namespace(kc, name)
    until_sync(
        f"namespace {name} deleted",
        lambda: kubeapi.get_object(kc, "namespace", name),
        done=lambda ns: ns is None or ns["status"]["phase"] == "Terminating",
    )
    kubeapi.delete_namespace(kc, "never-made")  # a clean-up of what is not there is no error


def test_a_merge_patch_without_kubectl_does_what_kubectl_patch_does(
    testbed: Endpoints, namespace: str
) -> None:
    """``kubeapi.merge_patch``: a pod's status subresource, a node's label set and removed, and
    a refusal (a missing object) as an error that names it."""
    kc = testbed.kubeconfig
    apply(kc, namespace, job("patched", parallelism=1))
    [pod] = until_sync(
        "the Job's pod running",
        lambda: pods(kc, namespace, "app=patched"),
        done=lambda p: len(p) == 1 and p[0]["status"].get("phase") == "Running",
    )
    name = pod["metadata"]["name"]
    condition = {"type": "PatchedHere", "status": "True", "reason": "Test"}
    kubeapi.merge_patch(
        kc, "pod", name, {"status": {"conditions": [condition]}}, namespace=namespace, subresource="status"
    )
    found = sim.get_json(kc, "pod", name, "-n", namespace)
    assert any(c["type"] == "PatchedHere" and c["reason"] == "Test" for c in found["status"]["conditions"])

    node = sim.get_json(kc, "nodes")["items"][0]["metadata"]["name"]
    key = f"test.respawn.dev/patched-{namespace}"
    sim.label_node(kc, node, key, "yes")
    assert sim.get_json(kc, "node", node)["metadata"]["labels"][key] == "yes"
    sim.label_node(kc, node, key, None)
    assert key not in sim.get_json(kc, "node", node)["metadata"]["labels"]

    with pytest.raises(TestbedError, match="nope"):
        kubeapi.merge_patch(kc, "pod", "nope", {"metadata": {"labels": {"a": "b"}}}, namespace=namespace)


def test_an_apply_without_kubectl_creates_then_updates_as_kubectl_apply_does(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str
) -> None:
    """``kubeapi.apply``: an AppWrapper created, then applied again with a changed annotation and
    one left out; a kind it does not know goes through kubectl; a refusal names the object."""
    kc = testbed.kubeconfig
    aw = manifests.job_appwrapper("applied", pods=1, annotations={"a.test/x": "1", "a.test/y": "1"})
    kubeapi.apply(kc, aw, namespace=namespace)
    first = sim.get_json(kc, "aw", "applied", "-n", namespace)
    assert {k: v for k, v in first["metadata"]["annotations"].items() if k.startswith("a.test/")} == {
        "a.test/x": "1",
        "a.test/y": "1",
    }
    aw["metadata"]["annotations"] = {**aw["metadata"]["annotations"], "a.test/x": "2"}
    del aw["metadata"]["annotations"]["a.test/y"]
    kubeapi.apply(kc, aw, namespace=namespace)
    second = sim.get_json(kc, "aw", "applied", "-n", namespace)
    assert second["metadata"]["uid"] == first["metadata"]["uid"]
    assert {k: v for k, v in second["metadata"]["annotations"].items() if k.startswith("a.test/")} == {
        "a.test/x": "2"
    }
    # Not in the table: kubectl applies it.
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "q"},
        "spec": {"hard": {"pods": "5"}},
    }
    kubeapi.apply(kc, quota, namespace=namespace)
    assert json.loads(kubectl(kc, "get", "resourcequota", "q", "-n", namespace, "-o", "json").stdout)["spec"][
        "hard"
    ] == {"pods": "5"}
    bad = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "Not_A_Name"}}
    with pytest.raises(TestbedError, match="Not_A_Name"):
        kubeapi.apply(kc, bad, namespace=namespace)


def test_a_kept_alive_connection_that_died_is_replaced(testbed: Endpoints, namespace: str) -> None:
    kc = testbed.kubeconfig
    assert kubeapi.get_object(kc, "namespace", namespace) is not None
    client = kubeapi._client(kc)
    assert client is not None and client.conn is not None and client.conn.sock is not None
    # What the connection looks like once the server has closed it: the next write or read fails,
    # with an error of the socket or, as seen in the suite, of the TLS layer.
    client.conn.sock.shutdown(socket.SHUT_RDWR)
    assert kubeapi.get_object(kc, "namespace", namespace) is not None
    assert client.conn is not None
    real = client.conn.sock

    class ClosedByServer:
        def sendall(self, _data: bytes) -> None:
            raise ssl.SSLEOFError(8, "EOF occurred in violation of protocol")

        def close(self) -> None:
            real.close()

    client.conn.sock = ClosedByServer()
    assert kubeapi.get_object(kc, "namespace", namespace) is not None
    kubeapi.create_namespace(kc, f"{namespace}-again")
    kubeapi.delete_namespace(kc, f"{namespace}-again")
