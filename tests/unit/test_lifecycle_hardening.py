"""The lifecycle service under kill -9: no lost or duplicated action, whatever line it dies on.

The service runs here against a small in-memory API server and lifecycle stream
(:mod:`tests.unit.lifecycle_cluster`) that keep the API's rules the guards rely on. A "kill" is
an exception no handler catches, raised by the write it interrupts: the process stops there,
exactly as under SIGKILL, and a fresh instance (nothing in memory) carries on.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest

from services.lifecycle import announcements
from services.lifecycle.executor import EVENTS, Executor
from services.lifecycle.failures import RECONCILE_ERROR_EVENT
from services.lifecycle.incidents import Incidents
from services.lifecycle.machine import COMPONENT_NOT_CONTROLLED_EVENT
from services.lifecycle.podcache import PodCache
from services.lifecycle.reader import Reader
from services.lifecycle.reconciler import Reconciler
from services.lifecycle.serverclock import ServerClock
from services.lifecycle.validation import INVALID_VALUE_EVENT
from services.lifecycle.workqueue import WorkQueue
from shared.appwrapper.constants import ANNOUNCED_ANNOTATION, COMPONENT_ANNOTATION, FINALIZER
from shared.appwrapper.params import RETRY_LIMIT_ANNOTATION
from shared.faulttolerance import FaultTolerance
from shared.kube import KubeApiError
from shared.kubetime import parse_kube_time
from shared.messages import LifecycleEvent
from tests.unit.lifecycle_cluster import AWS, JOBS, T0, FakeKube, FakeStream, Fault, conflict, job_appwrapper

KEY = ("team", "train")
WRITES = ("create", "replace", "replace_status", "patch", "delete")
DEFAULTS = FaultTolerance(retry_pause=timedelta(seconds=1), forceful_deletion_grace=timedelta(seconds=30))


class Killed(BaseException):
    """SIGKILL: nothing after it runs (no handler of the service catches a BaseException)."""


@dataclass
class Clock:
    now: datetime = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class Stack:
    """One lifecycle instance (a process): its own memory, the shared cluster and stream."""

    def __init__(self, kube: FakeKube, stream: FakeStream, local: Callable[[], datetime]) -> None:
        self.clock = ServerClock(local)
        self.queue = WorkQueue(clock=self.clock.now)
        self.executor = Executor(kube, stream, appwrappers=AWS, pods=JOBS, clock=self.clock)
        self.reader = Reader(kube, appwrappers=AWS, pods=JOBS, pod_cache=PodCache())
        self.reconciler = Reconciler(
            reader=self.reader,
            executor=self.executor,
            queue=self.queue,
            incidents=Incidents(),
            defaults=DEFAULTS,
            clock=self.clock.now,
        )

    async def settle(self, clock: Clock, rounds: int = 6) -> None:
        try:
            for _ in range(rounds):
                await self.reconciler.reconcile_key(KEY, None)
                clock.advance(1)
        finally:
            self.queue.close()


def messages(stream: FakeStream) -> list[LifecycleEvent]:
    return [m for _, m, _ in stream.messages if isinstance(m, LifecycleEvent)]


def events(kube: FakeKube) -> list[dict[str, Any]]:
    return kube.all(EVENTS)


def reasons(kube: FakeKube) -> collections.Counter[str]:
    return collections.Counter(e["reason"] for e in events(kube))


def phase_changes(stream: FakeStream) -> collections.Counter[str]:
    return collections.Counter(m.phase for m in messages(stream) if m.event == "PhaseChanged")


def new_cluster(aw: dict[str, Any], clock: Clock) -> tuple[FakeKube, FakeStream]:
    kube = FakeKube(server_now=clock)
    kube.put(AWS, aw)
    return kube, FakeStream()


# ------------------------------------------------------------------ announcements: kill -9


async def run_uninterrupted(suspend: bool) -> list[str]:
    """The writes of a run from submission to Running, in order (what the kills interrupt)."""
    clock = Clock()
    kube, stream = new_cluster(job_appwrapper(suspend=suspend), clock)
    await Stack(kube, stream, clock).settle(clock)
    return [verb for verb, _, _ in kube.calls if verb in WRITES] + ["publish"] * len(stream.messages)


@pytest.mark.parametrize("kill_at", range(12))
async def test_a_kill_at_any_write_loses_and_duplicates_no_announcement(kill_at: int) -> None:
    clock = Clock()
    kube, stream = new_cluster(job_appwrapper(), clock)
    writes = 0

    def kill_on_write(verb: str, *_: Any) -> None:
        nonlocal writes
        if verb in WRITES or verb == "publish":
            writes += 1
            if writes == kill_at + 1:
                raise Killed

    kube.fault = kill_on_write
    stream.fail = lambda message: kill_on_write("publish")
    first = Stack(kube, stream, clock)
    try:
        await first.settle(clock)
    except Killed:
        first.queue.close()
    kube.fault, stream.fail = None, None

    # A fresh instance, knowing only what the cluster says, finishes the job.
    await Stack(kube, stream, clock).settle(clock)

    aw = kube.stored(AWS, "train")
    assert aw is not None and aw["status"]["phase"] == "Running"
    assert len(kube.all(JOBS)) == 1, "one Job, however the run was cut"
    # Every status that was written had its announcements delivered exactly once; Suspended,
    # passed through within the first status write, at most once (nothing records it).
    changes = phase_changes(stream)
    assert changes["Resuming"] == 1 and changes["Running"] == 1, changes
    assert changes["Suspended"] <= 1
    events_by_reason = reasons(kube)
    assert events_by_reason["Resuming"] == 1 and events_by_reason["Running"] == 1, events_by_reason
    assert events_by_reason["Suspended"] <= 1
    # ...and the record says so: nothing is owed, so nothing more is ever sent.
    assert aw["metadata"]["annotations"][ANNOUNCED_ANNOTATION] == announcements.transition_of(aw).marker  # type: ignore[union-attr]
    assert not announcements.pending(aw, clock.now)


async def test_the_kill_points_cover_the_whole_run() -> None:
    """The parametrisation above reaches past the last write of a run (so every one is killed)."""
    assert len(await run_uninterrupted(suspend=False)) <= 12


async def killed_by(fault: Fault, kube: FakeKube, stream: FakeStream, clock: Clock) -> None:
    """One lifecycle instance settles until ``fault`` kills it (it must); the fault is then gone."""
    kube.fault = fault
    first = Stack(kube, stream, clock)
    with pytest.raises(Killed):
        await first.settle(clock)
    first.queue.close()
    kube.fault = None


def kill_after_the_create(kube: FakeKube) -> Fault:
    """Kills at the status write that would follow the create of a Job."""

    def kill(verb: str, plural: str, name: str) -> None:
        if verb == "replace_status" and kube.all(JOBS):
            raise Killed

    return kill


async def test_a_restart_after_the_announcements_but_before_their_record_sends_nothing_new() -> None:
    clock = Clock()
    kube, stream = new_cluster(job_appwrapper(), clock)

    def no_record(verb: str, plural: str, name: str) -> None:
        if verb == "patch" and plural == AWS.plural:
            raise Killed

    await killed_by(no_record, kube, stream, clock)
    sent, recorded = list(stream.messages), events(kube)

    again = Stack(kube, stream, clock)
    await again.settle(clock)
    # Re-derived copies carried the same ids: the stream dropped them, the API refused the Events.
    assert stream.messages == sent
    assert events(kube) == recorded
    aw = kube.stored(AWS, "train")
    assert aw is not None and ANNOUNCED_ANNOTATION in aw["metadata"]["annotations"]


async def test_a_failed_publish_is_re_sent_by_a_later_pass_with_the_same_id() -> None:
    clock = Clock()
    kube, stream = new_cluster(job_appwrapper(suspend=True), clock)

    def unavailable(message: Any) -> None:
        raise ConnectionError("nats: no servers available")

    stream.fail = unavailable
    stack = Stack(kube, stream, clock)
    await stack.settle(clock, rounds=1)
    aw = kube.stored(AWS, "train")
    assert aw is not None and aw["status"]["phase"] == "Suspended"
    assert ANNOUNCED_ANNOTATION not in (aw["metadata"].get("annotations") or {}), "not recorded as sent"
    stream.fail = None
    await stack.settle(clock, rounds=2)
    assert phase_changes(stream) == {"Suspended": 1}
    assert reasons(kube)["Suspended"] == 1


async def test_a_record_overwritten_by_an_older_transition_only_costs_a_harmless_resend() -> None:
    clock = Clock()
    kube, stream = new_cluster(job_appwrapper(), clock)
    await Stack(kube, stream, clock).settle(clock)
    before = list(stream.messages)
    # A slow replica records an earlier transition after the latest one was recorded.
    kube.objects[(AWS.plural, "team", "train")]["metadata"]["annotations"][ANNOUNCED_ANNOTATION] = (
        "Resuming/0/x"
    )
    stale = kube.stored(AWS, "train")
    assert stale is not None and announcements.pending(stale, clock.now)
    await Stack(kube, stream, clock).settle(clock)
    assert stream.messages == before
    aw = kube.stored(AWS, "train")
    assert aw is not None and not announcements.pending(aw, clock.now)


# --------------------------------------------------------- deletes: only what is confirmed ours


def foreign_job(name: str = "train-job") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "team",
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "name": "team-b",
                    "uid": "theirs",
                    "controller": True,
                }
            ],
        },
        "spec": {},
    }


async def test_another_teams_object_of_the_same_name_is_never_deleted_and_its_owner_is_told() -> None:
    clock = Clock()
    kube, stream = new_cluster(job_appwrapper(), clock)
    theirs = kube.put(JOBS, foreign_job())
    await Stack(kube, stream, clock).settle(clock, rounds=8)

    aw = kube.stored(AWS, "train")
    assert aw is not None and aw["status"]["phase"] == "Failed"
    unhealthy = {c["type"]: c for c in aw["status"]["conditions"]}["Unhealthy"]
    assert "resource Job train-job exists, but is not controlled by appwrapper" in unhealthy["message"]
    assert kube.stored(JOBS, "train-job") == theirs, "left exactly as it was"
    assert not [c for c in kube.calls if c[0] == "delete"]
    told = [e for e in events(kube) if e["reason"] == COMPONENT_NOT_CONTROLLED_EVENT]
    assert len(told) == 1 and "left in place" in told[0]["message"]


async def test_an_unreadable_component_is_waited_for_never_deleted_by_name() -> None:
    """A create that failed as 'exists, not controlled' leaves a recorded name behind; if the
    object cannot be read when the deletion runs, deleting by that name would hit the owner's
    object. It is waited for instead, and deleted only once read and confirmed ours."""
    clock = Clock()
    kube, stream = new_cluster(job_appwrapper(), clock)
    kube.put(JOBS, foreign_job())

    reads = 0

    def unreadable_after_the_create(verb: str, plural: str, name: str) -> None:
        nonlocal reads
        if verb == "get" and plural == JOBS.plural:
            reads += 1
            # The first read (before the create) and the create's own check see it; from then
            # on it cannot be read.
            if reads > 2:
                raise KubeApiError(503, "ServiceUnavailable", "etcd leader changed")

    kube.fault = unreadable_after_the_create
    stack = Stack(kube, stream, clock)
    await stack.settle(clock, rounds=6)
    assert kube.stored(AWS, "train")["status"]["phase"] == "Failed"  # type: ignore[index]
    assert kube.stored(JOBS, "train-job") is not None
    assert not [c for c in kube.calls if c[0] == "delete"]
    aw = kube.stored(AWS, "train")
    assert aw is not None
    deployed = {c["type"]: c for c in aw["status"]["conditions"]}["ResourcesDeployed"]
    assert deployed["status"] == "True", "not declared deleted while it could not be read"


async def test_the_first_pass_of_an_urgent_reset_deletes_by_the_uid_confirmed_earlier() -> None:
    clock = Clock()
    kube, stream = new_cluster(job_appwrapper(), clock)
    stack = Stack(kube, stream, clock)
    await stack.settle(clock)
    [job] = kube.all(JOBS)
    uid = job["metadata"]["uid"]
    seen = stack.reader.confirmed(KEY, kube.stored(AWS, "train")["metadata"]["uid"], 0)  # type: ignore[index]
    assert seen == ("train-job", uid)


# ------------------------------------------------------------- generated names: created once


async def test_a_generated_name_create_whose_status_write_loses_is_adopted_not_duplicated() -> None:
    clock = Clock()
    kube, stream = new_cluster(job_appwrapper(generate=True), clock)
    created = 0

    def lose_the_write_after_the_create(verb: str, plural: str, name: str) -> None:
        nonlocal created
        if verb == "create" and plural == JOBS.plural:
            created += 1
        elif verb == "replace_status" and created == 1:
            created += 1  # once: the write recording the generated name loses to another writer
            raise conflict()

    kube.fault = lose_the_write_after_the_create
    await Stack(kube, stream, clock).settle(clock)
    [job] = kube.all(JOBS)
    aw = kube.stored(AWS, "train")
    assert aw is not None and aw["status"]["phase"] == "Running"
    assert aw["status"]["componentStatus"][0]["name"] == job["metadata"]["name"]
    assert job["metadata"]["name"].startswith("train-job-")
    assert job["metadata"]["annotations"][COMPONENT_ANNOTATION].startswith(aw["metadata"]["uid"] + "/")


async def test_a_generated_name_create_followed_by_a_kill_is_adopted_by_the_next_instance() -> None:
    clock = Clock()
    kube, stream = new_cluster(job_appwrapper(generate=True), clock)
    await killed_by(kill_after_the_create(kube), kube, stream, clock)
    await Stack(kube, stream, clock).settle(clock)
    assert len(kube.all(JOBS)) == 1
    aw = kube.stored(AWS, "train")
    assert aw is not None and aw["status"]["phase"] == "Running"


async def test_a_generated_name_that_cannot_be_looked_for_is_not_created_again() -> None:
    clock = Clock()
    kube, stream = new_cluster(job_appwrapper(generate=True), clock)
    await killed_by(kill_after_the_create(kube), kube, stream, clock)

    def no_list(verb: str, plural: str, name: str) -> None:
        if verb == "list" and plural == JOBS.plural:
            raise KubeApiError(403, "Forbidden", "cannot list jobs")

    kube.fault = no_list
    await Stack(kube, stream, clock).settle(clock, rounds=3)
    assert len(kube.all(JOBS)) == 1
    assert kube.stored(AWS, "train")["status"]["phase"] == "Resuming"  # type: ignore[index]


# ----------------------------------------------------------------------------- clock skew


@pytest.mark.parametrize("skew", [timedelta(minutes=7), timedelta(minutes=-7), timedelta(0)])
async def test_a_skewed_lifecycle_clock_writes_the_servers_time(skew: timedelta) -> None:
    server = Clock()
    kube, stream = new_cluster(job_appwrapper(), server)
    local = Clock(server.now + skew)
    stack = Stack(kube, stream, local)
    await stack.executor.sync_clock()  # as the service does before its first decision
    for _ in range(4):
        await stack.reconciler.reconcile_key(KEY, None)
        server.advance(1)
        local.advance(1)
    stack.queue.close()
    aw = kube.stored(AWS, "train")
    assert aw is not None and aw["status"]["phase"] == "Running"
    [job] = kube.all(JOBS)
    started = {c["type"]: c for c in aw["status"]["conditions"]}["ResourcesDeployed"]["lastTransitionTime"]
    attempt, created = parse_kube_time(started), parse_kube_time(job["metadata"]["creationTimestamp"])
    assert attempt is not None and created is not None
    # Health counts a pod in the attempt when it was created at or after the attempt's start.
    assert attempt <= created <= attempt + timedelta(seconds=2)
    assert abs(stack.clock.offset + skew) <= timedelta(seconds=1)


async def test_without_the_correction_a_clock_ahead_starts_the_attempt_after_its_own_job() -> None:
    """What the correction prevents (the test above fails this way without it)."""
    server = Clock()
    kube, stream = new_cluster(job_appwrapper(), server)
    local = Clock(server.now + timedelta(minutes=7))
    stack = Stack(kube, stream, local)  # no sync, no samples yet: the local clock as it is
    await stack.reconciler.reconcile_key(KEY, None)
    stack.queue.close()
    aw = kube.stored(AWS, "train")
    assert aw is not None
    started = parse_kube_time(
        {c["type"]: c for c in aw["status"]["conditions"]}["ResourcesDeployed"]["lastTransitionTime"]
    )
    [job] = kube.all(JOBS)
    created = parse_kube_time(job["metadata"]["creationTimestamp"])
    assert started is not None and created is not None and started > created
    # ...and from the Job's creation on, the clock is corrected for the next decisions.
    assert stack.clock.offset <= -timedelta(minutes=6)


# ------------------------------------------------------------------- per-object failures


async def test_an_unreadable_appwrapper_is_reported_once_and_retried_with_a_growing_backoff() -> None:
    clock = Clock()
    kube, stream = new_cluster(job_appwrapper(), clock)

    def too_deep(verb: str, plural: str, name: str) -> None:
        if verb == "get" and plural == AWS.plural:
            raise RecursionError("maximum recursion depth exceeded while decoding a JSON object")

    kube.fault = too_deep
    stack = Stack(kube, stream, clock)
    backoffs = []
    for _ in range(3):
        with pytest.raises(RecursionError):
            await stack.reconciler.reconcile_key(KEY, None)
        backoffs.append(stack.reconciler.failures.backoff(KEY))
    stack.queue.close()
    assert backoffs == [timedelta(seconds=1), timedelta(seconds=2), timedelta(seconds=4)]
    [told] = [e for e in events(kube) if e["reason"] == RECONCILE_ERROR_EVENT]
    assert told["type"] == "Warning"
    assert "RecursionError" in told["message"]
    assert told["involvedObject"]["name"] == "train" and told["involvedObject"]["kind"] == "AppWrapper"

    kube.fault = None
    await stack.reconciler.reconcile_key(KEY, None)
    assert stack.reconciler.failures.backoff(KEY) == timedelta(seconds=1), "forgotten on success"


async def test_an_api_outage_is_retried_but_told_to_nobody() -> None:
    clock = Clock()
    kube, stream = new_cluster(job_appwrapper(), clock)

    def down(verb: str, plural: str, name: str) -> None:
        if plural == AWS.plural:
            raise KubeApiError(503, "ServiceUnavailable", "etcd is down")

    kube.fault = down
    stack = Stack(kube, stream, clock)
    for _ in range(8):
        with pytest.raises(Exception, match="etcd is down"):
            await stack.reconciler.reconcile_key(KEY, None)
    stack.queue.close()
    assert events(kube) == []
    # The key is fine, the API will be back: retried within seconds, not minutes.
    assert stack.reconciler.failures.backoff(KEY) == timedelta(seconds=10)


async def test_a_bad_annotation_value_is_told_once_and_the_default_is_used() -> None:
    clock = Clock()
    aw = job_appwrapper()
    aw["metadata"]["annotations"] = {RETRY_LIMIT_ANNOTATION: "three"}
    kube, stream = new_cluster(aw, clock)
    await Stack(kube, stream, clock).settle(clock)
    told = [e for e in events(kube) if e["reason"] == INVALID_VALUE_EVENT]
    assert len(told) == 1
    assert RETRY_LIMIT_ANNOTATION in told[0]["message"] and "'three'" in told[0]["message"]
    assert kube.stored(AWS, "train")["status"]["phase"] == "Running"  # type: ignore[index]


async def test_a_finalizer_is_in_place_before_anything_is_created() -> None:
    clock = Clock()
    kube, stream = new_cluster(job_appwrapper(), clock)
    await Stack(kube, stream, clock).settle(clock)
    aw = kube.stored(AWS, "train")
    assert aw is not None and FINALIZER in aw["metadata"]["finalizers"]
