"""The watcher's bookkeeping for a stream at its limit, with no servers: which objects lost their
latest observation, and when a watch is asked to list again. Publishing again what was
discarded, against real servers: tests/integration/test_watcher_isolation.py."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from prometheus_client import REGISTRY

from services.watcher import service, translate
from shared import subjects
from shared.appwrapper.constants import APPWRAPPER_LABEL
from shared.bus.membership import Membership
from shared.config import OperatorConfig
from shared.kube import ResourceRef
from shared.messages import AppWrapperObservation, NodeObservation, PodObservation
from shared.runtime import Runtime
from tests.waiting import until


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class Unused:
    """The bus or the Kubernetes client of a watcher whose test never reaches them: any use of
    one fails the test, so nothing here stands in for a server."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"this test's watcher must not use its {self.what} (it used .{name})")


def watcher() -> service.Watcher:
    rt = Runtime(
        name="watcher",
        config=OperatorConfig(),
        bus=Unused("bus"),  # type: ignore[arg-type]
        kube=Unused("Kubernetes client"),  # type: ignore[arg-type]
        probes=None,
    )
    return service.Watcher(rt)


def test_an_observation_below_the_first_sequence_or_past_the_last_is_discarded() -> None:
    seqs = {"a": 3, "b": 10, "c": 12, "d": 20}
    # "e" was never published (refused): nothing to restore.
    assert service.discarded(["a", "b", "c", "d", "e"], seqs, first=10, last=15) == {"a": 3, "d": 20}
    # An empty stream (first is one past last): every one of them is gone.
    assert service.discarded(["b", "c"], seqs, first=16, last=15) == {"b": 10, "c": 12}


def test_a_watch_lists_again_at_most_once_per_gap_which_grows_while_objects_keep_being_discarded() -> None:
    w = watcher()
    period = w.check_period
    w.live["pods"] = {"p1", "p2"}
    w.publisher.seqs.update({"p1": 1, "p2": 2})
    w.relists["pods"] = relist = asyncio.Event()

    def check(first: int, now: float) -> bool:
        """A check at ``now``; whether the watch was asked to list again (and then lists)."""
        relist.clear()
        w.restore_discarded(first, first + 10, now=now)
        asked = relist.is_set()
        w.relisting.discard("pods")  # its list is done before the next check
        return asked

    assert check(first=2, now=0.0)  # p1 lost: listed at once
    w.publisher.restore.clear()
    w.publisher.seqs["p1"] = 4  # restored, and p2 lost in turn
    assert not check(first=3, now=period / 2)  # too soon after the last list
    assert check(first=3, now=period)  # the gap, once the check period, has passed
    w.publisher.seqs["p2"] = 6
    w.publisher.seqs["p1"] = 1
    assert not check(first=3, now=2 * period)  # the gap is now twice the check period
    assert check(first=3, now=3 * period)
    # A check that finds nothing discarded starts the gaps over.
    w.publisher.seqs["p1"] = 5
    assert not check(first=3, now=4 * period)
    w.publisher.seqs["p1"] = 1
    assert check(first=3, now=4 * period)


def test_a_publish_whose_acknowledgement_crosses_the_streams_answer_is_not_taken_for_discarded() -> None:
    w = watcher()
    w.live["pods"] = {"new", "moved", "sent", "lost"}
    w.relists["pods"] = relist = asyncio.Event()
    # When the stream was asked: "moved" was at 3, "sent" on its way, "new" not published yet.
    asked = {"moved": 3, "sent": 4, "lost": 2}
    # The answer (first 5, last 10) was computed before the publishes of "new" (11) and "moved"
    # (12) were stored, and after the stream's first passed the previous sequences of "sent"
    # (its new one not acknowledged yet) and of "moved"; all three acknowledgements came first.
    w.publisher.seqs.update({"new": 11, "moved": 12, "sent": 4, "lost": 2})
    assert w.restore_discarded(5, 10, now=0.0, asked=asked, busy={"sent"}) == 1
    assert w.publisher.restore == {"lost": 2} and relist.is_set()
    # Without what was known when it asked, all four would look discarded.
    w.publisher.restore.clear()
    w.relisting.discard("pods")
    assert w.restore_discarded(5, 10, now=1000.0) == 4


def test_a_watch_is_not_asked_again_while_its_list_is_under_way() -> None:
    w = watcher()
    w.live["pods"] = {"p1"}
    w.publisher.seqs["p1"] = 1
    w.relists["pods"] = relist = asyncio.Event()
    assert w.restore_discarded(2, 5, now=0.0) == 1 and relist.is_set()
    relist.clear()
    assert w.restore_discarded(2, 5, now=1000.0) == 0 and not relist.is_set()


# ------------------------------------------------------------------ replicas and their partitions


def replica(owned: frozenset[int]) -> service.Watcher:
    """A watcher in a group, owning ``owned`` (set by hand: its membership never runs here)."""
    w = watcher()
    w.membership = Membership(
        w.rt.bus, "watcher", partitions=subjects.partitions(), heartbeat=1.0, ttl=5.0, on_change=w.moved
    )
    w.membership.owned = owned
    for name, ref, kind, to_message in (
        ("pods", ResourceRef("", "v1", "pods", "Pod", True), PodObservation.KIND, translate.pod_observation),
        (
            "nodes",
            ResourceRef("", "v1", "nodes", "Node", False),
            NodeObservation.KIND,
            translate.node_observation,
        ),
        (
            "appwrappers",
            ResourceRef("workload.codeflare.dev", "v1beta2", "appwrappers", "AppWrapper", True),
            AppWrapperObservation.KIND,
            translate.appwrapper_observation,
        ),
    ):
        w.watched[name] = (ref, kind, to_message)
    return w


async def event(
    w: service.Watcher, watch: str, obj: dict[str, Any], live: set[str], *, deleted: bool = False
) -> None:
    """An event of ``watch`` (one of those :func:`replica` sets up) for ``obj``."""
    _, kind, to_message = w.watched[watch]
    await w.on_event(watch, obj, to_message, kind, live, deleted=deleted)


def labelled_pod(namespace: str, aw: str, name: str) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": namespace,
            "name": name,
            "uid": f"uid-{name}",
            "labels": {APPWRAPPER_LABEL: aw},
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "job-uid", "controller": True}
            ],
        },
        "status": {"phase": "Running"},
    }


def appwrapper_in(partition: int) -> str:
    """The name of an AppWrapper in namespace "ns" that is in ``partition``."""
    return next(
        name for name in (f"aw-{i}" for i in range(10_000)) if subjects.partition("ns", name) == partition
    )


async def test_a_replica_keeps_the_objects_of_partitions_it_does_not_own_and_publishes_none_of_them() -> None:
    # The watcher's bus and Kubernetes client fail the test if used: nothing is published,
    # attributed, looked up or refused for a partition this replica does not own.
    w = replica(frozenset())
    aw = appwrapper_in(3)
    live: set[str] = set()
    await event(w, "appwrappers", {"metadata": {"namespace": "ns", "name": aw, "uid": "u"}}, live)
    await event(w, "pods", labelled_pod("ns", aw, "p"), live)
    await event(w, "nodes", {"metadata": {"name": "n1"}}, live)
    pod_subject = subjects.appwrapper_obs("ns", aw, "pod", "p")
    assert live == {pod_subject, subjects.appwrapper_obs("ns", aw, "appwrapper", aw), subjects.node_obs("n1")}
    assert not w.held and not w.publisher.last
    # What it keeps: every object, with what a takeover needs of it.
    kept = {k.subject: k for _, _, k in w.kept_in(range(subjects.partitions()))}
    assert set(kept) == live
    assert kept[pod_subject].partition == 3 and kept[pod_subject].obj()["status"] == {"phase": "Running"}
    assert kept[subjects.node_obs("n1")].partition == subjects.partition("", "n1")
    # Learned all the same: once its partition is taken over, the pod's chain is known this far.
    assert w.appwrapper_uids[("ns", aw)] == "u"

    # A delete is forgotten, unless the partition is being taken over: its tombstone is then the
    # takeover's to publish.
    await event(w, "pods", labelled_pod("ns", aw, "p"), live, deleted=True)
    assert pod_subject not in {k.subject for _, _, k in w.kept_in({3})}
    await event(w, "pods", labelled_pod("ns", aw, "q"), live)
    w.taking = frozenset({3})
    await event(w, "pods", labelled_pod("ns", aw, "q"), live, deleted=True)
    [(_, _, marker)] = [entry for entry in w.kept_in({3}) if entry[0] == "pods"]
    assert marker.deleted and marker.subject == subjects.appwrapper_obs("ns", aw, "pod", "q")


async def test_the_changes_of_a_torn_down_appwrappers_pods_are_neither_published_nor_taken_over() -> None:
    # The bus and the Kubernetes client fail the test if used. The pod's owner (a Job) is not
    # known: were its change handled, the pod would be held while the Job is looked up.
    w = replica(frozenset({3}))
    aw = appwrapper_in(3)
    w.torn_down.learn(("ns", aw), deleting=True, deleted=False, now=time.monotonic())
    skipped = metric("respawn_watcher_teardown_changes_skipped_total", kind=PodObservation.KIND)
    taken = metric("respawn_watcher_takeover_objects_total", kind=PodObservation.KIND)
    live: set[str] = set()
    await event(w, "pods", labelled_pod("ns", aw, "p"), live)
    assert not w.held and not w.publisher.inflight
    assert metric("respawn_watcher_teardown_changes_skipped_total", kind=PodObservation.KIND) == skipped + 1
    # Kept all the same, and not published by a takeover either.
    [(name, _, kept)] = w.kept_in({3})
    await w.publish_kept(name, kept)
    assert not w.held and not w.publisher.inflight
    assert metric("respawn_watcher_takeover_objects_total", kind=PodObservation.KIND) == taken


async def test_a_replica_that_loses_a_partition_lets_go_of_what_it_held_and_published_of_it() -> None:
    kept, lost = appwrapper_in(1), appwrapper_in(2)
    w = replica(frozenset({1, 2}))
    publisher = w.publisher
    for aw in (kept, lost):
        for kind, name in (("pod", "p"), ("appwrapper", aw)):
            subject = subjects.appwrapper_obs("ns", aw, kind, name)
            publisher.last[subject], publisher.seqs[subject] = "fp", 7
        publisher.tombstoned.add(subjects.appwrapper_obs("ns", aw, "pod", "gone"))
        publisher.restore[subjects.appwrapper_obs("ns", aw, "pod", "p")] = 3
        w.held[f"uid-{aw}"] = service.Held(labelled_pod("ns", aw, f"held-{aw}"), since=0.0)
    tables = (publisher.last, publisher.seqs, publisher.restore, publisher.tombstoned)

    w.membership.owned = frozenset({1})  # as Membership does before it calls on_change
    await w.moved(frozenset({1, 2}), frozenset({1}))
    for table in tables:
        assert table and all(translate.subject_partition(s) == 1 for s in table)
    assert list(w.held) == [f"uid-{kept}"]
    # Nothing of partition 2 is published any more, not even a publish waiting out NATS.
    assert not w.may_publish(subjects.appwrapper_obs("ns", lost, "pod", "p"))
    assert w.may_publish(subjects.appwrapper_obs("ns", kept, "pod", "p"))
    assert w.publishing() == {1}


def test_a_watcher_alone_publishes_every_partition() -> None:
    w = watcher()
    assert w.publishing() == set(range(subjects.partitions()))
    assert all(w.owns(p) for p in range(subjects.partitions()))


# ------------------------------------------------------------------ the held-pod resolver


class CountingEvent(asyncio.Event):
    """An event that counts how often its waiter went through a round (each round clears it)."""

    rounds = 0

    def clear(self) -> None:
        self.rounds += 1
        super().clear()


async def test_the_resolver_sleeps_until_woken_when_ready_and_holding_nothing_and_polls_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(service, "RESOLVE_PERIOD", 0.01)
    w = watcher()
    w.wake = wake = CountingEvent()
    readiness_checks = 0
    retries: list[str] = []

    def ready() -> bool:
        nonlocal readiness_checks
        readiness_checks += 1
        return readiness_checks >= 5  # ready at the fifth look: it kept looking while not

    async def retry_held(uid: str, held: service.Held) -> None:
        retries.append(uid)

    monkeypatch.setattr(w, "ready", ready)
    monkeypatch.setattr(w, "retry_held", retry_held)
    monkeypatch.setattr(w, "owns", lambda partition: True)
    task = asyncio.create_task(w.resolve_held())
    try:
        await until("the watcher to notice it is ready", lambda: w.synced_at is not None, within=5)
        # Ready, nothing held: no more rounds on a timer.
        rounds = wake.rounds
        await asyncio.sleep(0.3)
        assert wake.rounds == rounds, "an idle resolver kept waking on a timer"
        # A pod held wakes it, and it looks at that pod again every period until it is released.
        w.held["uid-1"] = service.Held({"metadata": {"namespace": "ns", "name": "p"}}, 0.0)
        wake.set()
        await until("the held pod to be looked at again and again", lambda: len(retries) >= 5, within=5)
        w.held.clear()
        await asyncio.sleep(0.05)
        rounds = wake.rounds
        await asyncio.sleep(0.3)
        assert wake.rounds == rounds, "it kept waking on a timer once nothing was held"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


# ------------------------------------------------------------------ a held pod that fails and goes


def failed(pod: dict[str, Any]) -> dict[str, Any]:
    return {**pod, "status": {"phase": "Failed"}}


def job_of(aw: str, aw_uid: str) -> dict[str, Any]:
    """The component the pods of :func:`labelled_pod` are owned by, controlled by AppWrapper ``aw``."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "namespace": "ns",
            "name": "j",
            "uid": "job-uid",
            "ownerReferences": [
                {
                    "apiVersion": "workload.codeflare.dev/v1beta2",
                    "kind": "AppWrapper",
                    "name": aw,
                    "uid": aw_uid,
                    "controller": True,
                }
            ],
        },
    }


def recording(w: service.Watcher, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, bool]]:
    """(pod name, phase, deleted) of every pod the watcher publishes, in order."""
    published: list[tuple[str, str, bool]] = []

    async def publish_pod(pod: dict[str, Any], *, deleted: bool) -> None:
        published.append((pod["metadata"]["name"], pod["status"]["phase"], deleted))

    monkeypatch.setattr(w, "publish_pod", publish_pod)
    return published


async def held_then_failed_and_deleted(w: service.Watcher) -> dict[str, Any]:
    """A pod of AppWrapper "aw" whose Job is not known yet: held, then failed, then deleted."""
    w.appwrapper_uids[("ns", "aw")] = "aw-uid"
    pod = labelled_pod("ns", "aw", "p")
    await w.handle_pod(pod, deleted=False)
    await w.handle_pod(failed(pod), deleted=False)
    await w.handle_pod(failed(pod), deleted=True)
    return pod


async def test_a_held_pod_that_fails_and_is_deleted_is_published_failed_then_gone_once_its_chain_is_known(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = watcher()
    published = recording(w, monkeypatch)
    await held_then_failed_and_deleted(w)
    # Its chain is not known: neither its failure nor its deletion is published yet.
    assert published == [] and w.held["uid-p"].deleted
    w.owners.learn(job_of("aw", "aw-uid"))
    await w.retry_held("uid-p", w.held["uid-p"])
    assert published == [("p", "Failed", False), ("p", "Failed", True)]
    assert not w.held


async def test_a_held_pod_deleted_before_it_failed_gets_its_tombstone_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = watcher()
    published = recording(w, monkeypatch)
    w.appwrapper_uids[("ns", "aw")] = "aw-uid"
    pod = labelled_pod("ns", "aw", "p")
    await w.handle_pod(pod, deleted=False)
    assert "uid-p" in w.held
    await w.handle_pod(pod, deleted=True)
    assert published == [("p", "Running", True)] and not w.held


async def test_a_held_pod_that_failed_and_went_but_is_someone_elses_is_not_published(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = watcher()
    published = recording(w, monkeypatch)
    await held_then_failed_and_deleted(w)
    w.owners.learn(job_of("aw", "another-appwrappers-uid"))
    foreign = metric("respawn_watcher_pods_unattributed_total", reason="other-appwrapper")
    await w.retry_held("uid-p", w.held["uid-p"])
    assert published == [] and not w.held
    assert metric("respawn_watcher_pods_unattributed_total", reason="other-appwrapper") == foreign + 1


async def test_a_held_pod_that_failed_and_went_gets_only_its_tombstone_once_given_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = watcher()
    published = recording(w, monkeypatch)
    await held_then_failed_and_deleted(w)
    w.synced_at = 0.0
    w.held["uid-p"].since = time.monotonic() - service.HOLD_LIMIT
    await w.retry_held("uid-p", w.held["uid-p"])
    assert published == [("p", "Failed", True)] and not w.held
