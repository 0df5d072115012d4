"""The lifecycle executor against the real API server: how it lets a deleted AppWrapper go, which
objects its deletes may touch, and how it records excluded nodes.

The executor talks to the real client (shared.kube.Kube) through a thin pass-through that notes
each call as made (its verb, resource, name, body and options) before handing it on unchanged;
every answer, a 409 of a stale resourceVersion or a 404 of a vanished object included, is the
API server's own. Nothing here is published to NATS: the publisher fails the test if it is used.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from respawn.testbed import manifests
from respawn.testbed.modes import Endpoints
from services.lifecycle.actions import DeleteComponent, DeletePods, EmitEvent, ExcludeNodes
from services.lifecycle.executor import Executor
from services.lifecycle.machine import FinalizerChange, Plan
from services.lifecycle.observed import Observed, ObservedComponent, ObservedPod, Presence
from services.lifecycle.placement.exclusion import EXCLUDED_NODES_ANNOTATION
from shared.appwrapper.constants import API_VERSION, FINALIZER, KIND
from shared.kube import Kube, KubeApiError, ResourceRef
from shared.messages import Message
from tests.waiting import until

pytestmark = pytest.mark.testbed

MERGE = "application/merge-patch+json"


# ------------------------------------------------------------------------------ plumbing


@dataclass
class Call:
    verb: str
    plural: str
    name: str
    body: Any
    kw: dict[str, Any]
    error: KubeApiError | None = None


@dataclass
class Recorded:
    """The real client; each call is noted as made and passed on unchanged."""

    kube: Kube
    calls: list[Call] = field(default_factory=list)

    RECORDED = frozenset({"get", "create", "replace", "replace_status", "patch", "delete"})

    def __getattr__(self, verb: str) -> Any:
        call = getattr(self.kube, verb)
        if verb not in self.RECORDED:
            return call

        async def recorded(ref: ResourceRef, *args: Any, **kw: Any) -> Any:
            if verb in ("replace", "replace_status"):
                body = args[0] if args else kw["body"]
                name, payload = body["metadata"]["name"], body
            elif verb in ("get", "delete"):
                name, payload = args[0], None
            elif verb == "patch":
                name, payload = args[0], args[1]
            else:
                payload = args[0] if args else kw["body"]
                name = (payload.get("metadata") or {}).get("name", "")
            noted = Call(verb, ref.plural, name, payload, dict(kw))
            self.calls.append(noted)
            try:
                return await call(ref, *args, **kw)
            except KubeApiError as exc:
                noted.error = exc
                raise

        return recorded

    def made(self, verb: str) -> list[Call]:
        return [c for c in self.calls if c.verb == verb]


class NoPublishing:
    async def publish(self, subject: str, message: Message, *, msg_id: str | None) -> Any:
        raise AssertionError(f"nothing is published here, yet {subject} was")


@dataclass
class Cluster:
    kube: Kube
    namespace: str
    appwrappers: ResourceRef
    pods: ResourceRef
    jobs: ResourceRef

    def executor(self) -> tuple[Executor, Recorded]:
        recorded = Recorded(self.kube)
        return Executor(recorded, NoPublishing(), appwrappers=self.appwrappers, pods=self.pods), recorded

    async def gone(self, ref: ResourceRef, name: str) -> bool:
        try:
            await self.kube.get(ref, name, self.namespace)
        except KubeApiError as exc:
            if exc.not_found:
                return True
            raise
        return False


@pytest.fixture
async def cluster(testbed: Endpoints, appwrapper_crd: Any, namespace: str) -> AsyncIterator[Cluster]:
    kube = await Kube.connect(testbed.kubeconfig)
    try:
        yield Cluster(
            kube,
            namespace,
            appwrappers=await kube.resource(API_VERSION, KIND),
            pods=await kube.resource("v1", "Pod"),
            jobs=await kube.resource("batch/v1", "Job"),
        )
    finally:
        await kube.close()


# ------------------------------------------------------------- letting a deleted AppWrapper go

FINAL_STATUS = {"phase": "Terminating", "conditions": []}


async def deleted_aw(c: Cluster, finalizers: list[str]) -> dict[str, Any]:
    """An AppWrapper holding ``finalizers``, deleted (so only its finalizers keep it), as read."""
    body = manifests.job_appwrapper("train", namespace=c.namespace)
    body["metadata"]["finalizers"] = finalizers
    await c.kube.create(c.appwrappers, body, c.namespace)
    await c.kube.delete(c.appwrappers, "train", c.namespace)
    return await c.kube.get(c.appwrappers, "train", c.namespace)


def final(aw: dict[str, Any]) -> Plan:
    return Plan(
        status=FINAL_STATUS,
        resource_version=aw["metadata"]["resourceVersion"],
        finalizer=FinalizerChange.REMOVE,
    )


async def test_the_last_finalizer_goes_in_one_guarded_patch_without_a_final_status_write(
    cluster: Cluster,
) -> None:
    aw = await deleted_aw(cluster, [FINALIZER])
    rv = aw["metadata"]["resourceVersion"]
    ex, sent = cluster.executor()
    await ex.carry_out(aw, final(aw))
    assert [(c.verb, c.body) for c in sent.calls] == [
        ("patch", {"metadata": {"resourceVersion": rv, "finalizers": []}})
    ]
    assert sent.calls[0].error is None
    await until("the AppWrapper to vanish", lambda: cluster.gone(cluster.appwrappers, "train"))


async def test_a_stale_resource_version_falls_back_to_a_fresh_read(cluster: Cluster) -> None:
    stale = await deleted_aw(cluster, [FINALIZER])
    # Someone else changes the AppWrapper after it was read: the executor's copy is stale.
    newer = await cluster.kube.patch(
        cluster.appwrappers, "train", {"metadata": {"labels": {"touched": "yes"}}}, cluster.namespace
    )
    current = newer["metadata"]["resourceVersion"]
    assert current != stale["metadata"]["resourceVersion"]
    ex, sent = cluster.executor()
    await ex.carry_out(stale, final(stale))
    assert [c.verb for c in sent.calls] == ["patch", "get", "patch"]
    first, _, second = sent.calls
    assert first.error is not None and first.error.conflict  # the API server's 409
    assert second.kw["patch_type"] == "application/json-patch+json" and second.error is None
    test_op, replace_op = second.body
    assert test_op == {"op": "test", "path": "/metadata/resourceVersion", "value": current}
    assert replace_op == {"op": "replace", "path": "/metadata/finalizers", "value": []}
    await until("the AppWrapper to vanish", lambda: cluster.gone(cluster.appwrappers, "train"))


async def test_with_another_finalizer_left_the_final_status_is_still_written(cluster: Cluster) -> None:
    aw = await deleted_aw(cluster, ["example.com/keep", FINALIZER])
    ex, sent = cluster.executor()
    try:
        await ex.carry_out(aw, final(aw))
        assert [c.verb for c in sent.calls] == ["replace_status", "patch"]
        assert sent.calls[0].body["status"] == FINAL_STATUS
        assert sent.calls[1].body["metadata"]["finalizers"] == ["example.com/keep"]
        stored = await cluster.kube.get(cluster.appwrappers, "train", cluster.namespace)
        assert stored["status"]["phase"] == "Terminating"
        assert stored["metadata"]["finalizers"] == ["example.com/keep"]
    finally:  # let it go, so that the namespace can
        await cluster.kube.patch(
            cluster.appwrappers, "train", {"metadata": {"finalizers": []}}, cluster.namespace
        )


# ------------------------------------------------------ deletes touch only what the plan saw

AW = {"metadata": {"name": "train", "namespace": "", "uid": "aw-uid"}}


def aw_in(c: Cluster) -> dict[str, Any]:
    return {"metadata": {**AW["metadata"], "namespace": c.namespace}}


async def create_job(c: Cluster, name: str = "train-job") -> str:
    created = await c.kube.create(c.jobs, manifests.job(name, suspend=True), c.namespace)
    return str(created["metadata"]["uid"])


async def create_pod(c: Cluster, name: str) -> str:
    created = await c.kube.create(c.pods, manifests.pod(name), c.namespace)
    return str(created["metadata"]["uid"])


def seen_job(uid: str, name: str = "train-job") -> Observed:
    return Observed(components=(ObservedComponent(presence=Presence.PRESENT, name=name, uid=uid),), pods=())


def deletes(sent: Recorded) -> list[tuple[str, str, int | None, str | None]]:
    """The deletes made: (resource, name, grace period, uid precondition)."""
    return [(c.plural, c.name, c.kw["grace_period_seconds"], c.kw["uid"]) for c in sent.made("delete")]


def delete_job(c: Cluster, **kw: Any) -> DeleteComponent:
    return DeleteComponent(
        index=0, api_version="batch/v1", kind="Job", namespace=c.namespace, name="train-job", **kw
    )


async def test_component_deletes_carry_the_observed_uid(cluster: Cluster) -> None:
    uid = await create_job(cluster)
    ex, sent = cluster.executor()
    await ex.act(aw_in(cluster), delete_job(cluster), seen_job(uid))
    await ex.act(aw_in(cluster), delete_job(cluster, force=True), seen_job(uid))
    assert deletes(sent) == [("jobs", "train-job", None, uid), ("jobs", "train-job", 0, uid)]
    await until("the Job to be deleted", lambda: cluster.gone(cluster.jobs, "train-job"))


async def test_a_component_not_confirmed_ours_under_that_name_is_never_deleted(cluster: Cluster) -> None:
    """By name alone a delete could remove an object that is not ours: another team's object of
    that name, or a namesake created since. Without a uid confirmed ours it is not made at all."""
    uid = await create_job(cluster)
    ex, sent = cluster.executor()
    delete = delete_job(cluster)
    # Seen under another name (or not read at all): no uid is known for this name.
    await ex.act(aw_in(cluster), delete, seen_job("other-uid", name="train-job-old"))
    await ex.act(aw_in(cluster), delete, Observed())
    await ex.act(aw_in(cluster), delete)
    # Seen under this name, but controlled by someone else.
    foreign = Observed(
        components=(
            ObservedComponent(presence=Presence.PRESENT, name="train-job", uid=uid, controlled_by_us=False),
        ),
        pods=(),
    )
    await ex.act(aw_in(cluster), delete, foreign)
    assert deletes(sent) == []
    job = await cluster.kube.get(cluster.jobs, "train-job", cluster.namespace)
    assert job["metadata"]["uid"] == uid and not job["metadata"].get("deletionTimestamp")


async def test_the_uid_the_plan_confirmed_guards_the_delete_even_when_nothing_was_read(
    cluster: Cluster,
) -> None:
    uid = await create_job(cluster)
    ex, sent = cluster.executor()
    await ex.act(aw_in(cluster), delete_job(cluster, uid=uid), Observed())
    assert deletes(sent) == [("jobs", "train-job", None, uid)]
    await until("the Job to be deleted", lambda: cluster.gone(cluster.jobs, "train-job"))


async def test_forced_pod_deletes_carry_each_observed_pod_uid(cluster: Cluster) -> None:
    master, worker = await create_pod(cluster, "train-master-0"), await create_pod(cluster, "train-worker-0")
    ex, sent = cluster.executor()
    observed = Observed(
        pods=(
            ObservedPod(name="train-master-0", phase="Running", terminating=True, uid=master),
            ObservedPod(name="train-worker-0", phase="Running", terminating=True, uid=worker),
        )
    )
    names = ("train-master-0", "train-worker-0", "train-worker-1")
    await ex.act(aw_in(cluster), DeletePods(namespace=cluster.namespace, names=names, force=True), observed)
    assert sorted(deletes(sent), key=str) == [
        ("pods", "train-master-0", 0, master),
        ("pods", "train-worker-0", 0, worker),
        ("pods", "train-worker-1", 0, None),
    ]
    for pod in ("train-master-0", "train-worker-0"):
        await until(f"{pod} to be deleted", functools.partial(cluster.gone, cluster.pods, pod))


async def test_leftover_pods_are_deleted_with_their_own_grace_period_and_observed_uid(
    cluster: Cluster,
) -> None:
    worker = await create_pod(cluster, "train-worker-0")
    ex, sent = cluster.executor()
    observed = Observed(pods=(ObservedPod(name="train-worker-0", phase="Running", uid=worker),))
    names = ("train-worker-0", "train-worker-1")
    await ex.act(aw_in(cluster), DeletePods(namespace=cluster.namespace, names=names), observed)
    assert sorted(deletes(sent), key=str) == [
        ("pods", "train-worker-0", None, worker),
        ("pods", "train-worker-1", None, None),
    ]

    async def deleted() -> bool:
        try:
            pod = await cluster.kube.get(cluster.pods, "train-worker-0", cluster.namespace)
        except KubeApiError as exc:
            return exc.not_found
        return bool(pod["metadata"].get("deletionTimestamp"))

    await until("train-worker-0 to be deleted", deleted)


# ------------------------------------------------------------------ recording excluded nodes


async def annotations_of(c: Cluster, name: str = "aw") -> dict[str, str]:
    aw = await c.kube.get(c.appwrappers, name, c.namespace)
    return dict(aw["metadata"].get("annotations") or {})


async def test_the_executor_records_the_nodes_by_merge_patch_and_an_empty_list_removes_it(
    cluster: Cluster,
) -> None:
    aw = await cluster.kube.create(
        cluster.appwrappers, manifests.job_appwrapper("aw", namespace=cluster.namespace), cluster.namespace
    )
    ex, sent = cluster.executor()
    await ex.act(aw, ExcludeNodes(nodes=("n2", "n1")))
    assert (await annotations_of(cluster)).get(EXCLUDED_NODES_ANNOTATION) == "n2,n1"
    await ex.act(aw, ExcludeNodes(nodes=()))
    assert EXCLUDED_NODES_ANNOTATION not in await annotations_of(cluster)
    patches = sent.made("patch")
    assert all(
        (c.plural, c.kw.get("patch_type", MERGE), c.error) == ("appwrappers", MERGE, None) for c in patches
    )
    assert [(c.name, c.body) for c in patches] == [
        ("aw", {"metadata": {"annotations": {EXCLUDED_NODES_ANNOTATION: "n2,n1"}}}),
        ("aw", {"metadata": {"annotations": {EXCLUDED_NODES_ANNOTATION: None}}}),
    ]


async def test_a_failed_patch_does_not_stop_the_rest_of_the_plan(cluster: Cluster) -> None:
    aw = await cluster.kube.create(
        cluster.appwrappers, manifests.job_appwrapper("aw", namespace=cluster.namespace), cluster.namespace
    )
    # Gone before the plan is carried out: the patch fails (the API server's 404).
    await cluster.kube.delete(cluster.appwrappers, "aw", cluster.namespace)
    await until("the AppWrapper to vanish", lambda: cluster.gone(cluster.appwrappers, "aw"))
    ex, sent = cluster.executor()
    await ex.act(aw, ExcludeNodes(nodes=("n1",)))
    await ex.act(aw, EmitEvent(type="Normal", reason="NodesExcluded", message="m"))
    [patch] = sent.made("patch")
    assert patch.error is not None and patch.error.not_found
    events_ref = await cluster.kube.resource("v1", "Event")
    listed = await cluster.kube.list(events_ref, cluster.namespace)
    reasons = [e["reason"] for e in listed["items"] if e["involvedObject"]["name"] == "aw"]
    assert reasons == ["NodesExcluded"]
