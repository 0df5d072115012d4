"""The lifecycle executor deletes exactly the objects its plan was computed from.

A plan that changes no status (e.g. one step of a staged deletion) is not guarded by the
resourceVersion of a status write, so by the time it is carried out another replica may have
finished the reset and recreated the Job under the same name. Each delete therefore carries the
uid that was observed as a precondition; the API server then leaves a newer namesake alone.
"""

from __future__ import annotations

from services.lifecycle.actions import DeleteComponent, DeletePods
from services.lifecycle.executor import Executor
from services.lifecycle.observed import Observed, ObservedComponent, ObservedPod, Presence
from tests.unit.lifecycle_cluster import AWS, PODS, FakeKube, no_bus

AW = {"metadata": {"name": "train", "namespace": "team", "uid": "aw-uid"}}


def deletes(kube: FakeKube) -> list[tuple[str, str, int | None, str | None]]:
    """The deletes made: (resource, name, grace period, uid precondition)."""
    return [(s.plural, s.name, s.kw["grace_period_seconds"], s.kw["uid"]) for s in kube.sent_as("delete")]


def executor(kube: FakeKube) -> Executor:
    return Executor(kube, no_bus(), appwrappers=AWS, pods=PODS)


def seen_job(uid: str, name: str = "train-job") -> Observed:
    return Observed(components=(ObservedComponent(presence=Presence.PRESENT, name=name, uid=uid),), pods=())


async def test_component_deletes_carry_the_observed_uid() -> None:
    kube = FakeKube()
    ex = executor(kube)
    delete = DeleteComponent(index=0, api_version="batch/v1", kind="Job", namespace="team", name="train-job")
    force = DeleteComponent(
        index=0, api_version="batch/v1", kind="Job", namespace="team", name="train-job", force=True
    )
    await ex.act(AW, delete, seen_job("job-uid-1"))
    await ex.act(AW, force, seen_job("job-uid-1"))
    assert deletes(kube) == [("jobs", "train-job", None, "job-uid-1"), ("jobs", "train-job", 0, "job-uid-1")]


async def test_a_component_not_confirmed_ours_under_that_name_is_never_deleted() -> None:
    """By name alone a delete could remove an object that is not ours: another team's object of
    that name, or a namesake created since. Without a uid confirmed ours it is not made at all."""
    kube = FakeKube()
    ex = executor(kube)
    delete = DeleteComponent(index=0, api_version="batch/v1", kind="Job", namespace="team", name="train-job")
    # Seen under another name (or not read at all): no uid is known for this name.
    await ex.act(AW, delete, seen_job("other-uid", name="train-job-old"))
    await ex.act(AW, delete, Observed())
    await ex.act(AW, delete)
    # Seen under this name, but controlled by someone else.
    foreign = Observed(
        components=(
            ObservedComponent(
                presence=Presence.PRESENT, name="train-job", uid="their-uid", controlled_by_us=False
            ),
        ),
        pods=(),
    )
    await ex.act(AW, delete, foreign)
    assert deletes(kube) == []


async def test_the_uid_the_plan_confirmed_guards_the_delete_even_when_nothing_was_read() -> None:
    kube = FakeKube()
    ex = executor(kube)
    delete = DeleteComponent(
        index=0, api_version="batch/v1", kind="Job", namespace="team", name="train-job", uid="job-uid-7"
    )
    await ex.act(AW, delete, Observed())
    assert deletes(kube) == [("jobs", "train-job", None, "job-uid-7")]


async def test_forced_pod_deletes_carry_each_observed_pod_uid() -> None:
    kube = FakeKube()
    ex = executor(kube)
    observed = Observed(
        pods=(
            ObservedPod(name="train-master-0", phase="Running", terminating=True, uid="pod-uid-1"),
            ObservedPod(name="train-worker-0", phase="Running", terminating=True, uid="pod-uid-2"),
        )
    )
    names = ("train-master-0", "train-worker-0", "train-worker-1")
    await ex.act(AW, DeletePods(namespace="team", names=names, force=True), observed)
    assert sorted(deletes(kube), key=str) == [
        ("pods", "train-master-0", 0, "pod-uid-1"),
        ("pods", "train-worker-0", 0, "pod-uid-2"),
        ("pods", "train-worker-1", 0, None),
    ]


async def test_leftover_pods_are_deleted_with_their_own_grace_period_and_observed_uid() -> None:
    kube = FakeKube()
    ex = executor(kube)
    observed = Observed(pods=(ObservedPod(name="train-worker-0", phase="Running", uid="pod-uid-2"),))
    names = ("train-worker-0", "train-worker-1")
    await ex.act(AW, DeletePods(namespace="team", names=names), observed)
    assert sorted(deletes(kube), key=str) == [
        ("pods", "train-worker-0", None, "pod-uid-2"),
        ("pods", "train-worker-1", None, None),
    ]
