"""The lifecycle under kill -9 at any write, and per-object failures, against the real API server
and NATS.

Lifecycle's parts run in this process (as in :mod:`tests.integration.test_lifecycle_hardening`,
whose plumbing this reuses): a "kill" is an exception no handler catches, raised by a thin
wrapper around the real client before the call it interrupts; the real server stays behind it.
A fresh instance (nothing in memory) then carries on from what the cluster says.
"""

from __future__ import annotations

import collections
import contextlib
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from respawn.testbed import manifests
from respawn.testbed.modes import Endpoints
from services.lifecycle import announcements
from services.lifecycle.failures import RECONCILE_ERROR_EVENT
from services.lifecycle.validation import INVALID_VALUE_EVENT
from shared.appwrapper.constants import ANNOUNCED_ANNOTATION, FINALIZER
from shared.appwrapper.params import RETRY_LIMIT_ANNOTATION
from shared.kube import Kube, KubeApiError
from shared.kubetime import parse_kube_time, utcnow
from shared.messages import Message
from tests.integration.test_lifecycle_hardening import (
    FAST,
    Instance,
    Killed,
    Publishing,
    Wrapped,
    announced,
    apply,
    apply_generating,
    appwrapper,
    condition,
    connected,
    events,
    jobs,
    refs,
)
from tests.waiting import until

pytestmark = pytest.mark.testbed

NAME = "train"
WRITES = ("create", "replace", "replace_status", "patch", "delete")
# Enough passes to take a fresh AppWrapper from submission to Running.
PASSES = 6


async def settle(instance: Instance, kube: Kube, namespace: str) -> None:
    """Reconcile, pass after pass, until the AppWrapper is Running with nothing left to announce
    (the whole run: its last write is the record of the Running announcements)."""

    async def one_pass() -> bool:
        await instance.reconciler.reconcile_key((namespace, NAME), None)
        aw = await appwrapper(kube, namespace, NAME)
        return bool(
            aw and aw.get("status", {}).get("phase") == "Running" and not announcements.pending(aw, utcnow())
        )

    try:
        await until("Running, every announcement recorded", one_pass)
    finally:
        instance.queue.close()


async def phase_changes(nats_url: str, namespace: str) -> collections.Counter[str]:
    messages = await announced(nats_url, namespace, NAME)
    return collections.Counter(m.phase for m in messages if m.event == "PhaseChanged")


async def reasons(kube: Kube, namespace: str) -> collections.Counter[str]:
    return collections.Counter(e["reason"] for e in await events(kube, namespace, NAME))


# ------------------------------------------------------------------ announcements: kill -9


async def run_uninterrupted(testbed: Endpoints, namespace: str) -> list[str]:
    """The writes of a run from submission to Running, in order (what the kills interrupt)."""
    apply(testbed.kubeconfig, namespace, manifests.job_appwrapper(NAME, annotations=FAST))
    writes: list[str] = []

    def record(verb: str, plural: str, name: str) -> None:
        if verb in WRITES:
            writes.append(verb)

    def published(message: Message) -> None:
        writes.append("publish")

    async with connected(testbed) as (kube, bus):
        where = await refs(kube)
        await settle(Instance(Wrapped(kube, record), Publishing(bus, published), where), kube, namespace)
    return writes


# Every write of a whole run (test_the_kill_points_cover_the_whole_run), each killed once.
KILL_POINTS = 12


@pytest.mark.parametrize("kill_at", range(KILL_POINTS))
async def test_a_kill_at_any_write_loses_and_duplicates_no_announcement(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str, kill_at: int
) -> None:
    apply(testbed.kubeconfig, namespace, manifests.job_appwrapper(NAME, annotations=FAST))
    writes = 0

    def kill_on_write(verb: str, *_: Any) -> None:
        nonlocal writes
        if verb in WRITES or verb == "publish":
            writes += 1
            if writes == kill_at + 1:
                raise Killed

    async with connected(testbed) as (kube, bus):
        where = await refs(kube)
        first = Instance(
            Wrapped(kube, kill_on_write), Publishing(bus, lambda _: kill_on_write("publish")), where
        )
        with contextlib.suppress(Killed):
            await settle(first, kube, namespace)

        # A fresh instance, knowing only what the cluster says, finishes the job.
        await settle(Instance(kube, Publishing(bus), where), kube, namespace)

        aw = await appwrapper(kube, namespace, NAME)
        assert aw is not None and aw["status"]["phase"] == "Running"
        assert len(jobs(testbed.kubeconfig, namespace)) == 1, "one Job, however the run was cut"
        # Every status that was written had its announcements delivered exactly once; Suspended,
        # passed through within the first status write, at most once (nothing records it).
        changes = await phase_changes(testbed.nats_url, namespace)
        assert changes["Resuming"] == 1 and changes["Running"] == 1, changes
        assert changes["Suspended"] <= 1
        by_reason = await reasons(kube, namespace)
        assert by_reason["Resuming"] == 1 and by_reason["Running"] == 1, by_reason
        assert by_reason["Suspended"] <= 1
        # ...and the record says so: nothing is owed, so nothing more is ever sent.
        transition = announcements.transition_of(aw)
        assert transition is not None
        assert aw["metadata"]["annotations"][ANNOUNCED_ANNOTATION] == transition.marker
        assert not announcements.pending(aw, utcnow())


async def test_the_kill_points_cover_the_whole_run(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str
) -> None:
    """The parametrisation above reaches past the last write of a run (so every one is killed)."""
    writes = await run_uninterrupted(testbed, namespace)
    assert len(writes) <= KILL_POINTS


async def test_a_failed_publish_is_re_sent_by_a_later_pass_with_the_same_id(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str
) -> None:
    apply(testbed.kubeconfig, namespace, manifests.job_appwrapper(NAME, suspend=True, annotations=FAST))
    down = True

    def unavailable(message: Message) -> None:
        if down:
            raise ConnectionError("nats: no servers available")

    async with connected(testbed) as (kube, bus):
        instance = Instance(kube, Publishing(bus, unavailable), await refs(kube))
        await instance.reconcile(namespace, NAME)
        aw = await appwrapper(kube, namespace, NAME)
        assert aw is not None and aw["status"]["phase"] == "Suspended"
        assert ANNOUNCED_ANNOTATION not in (aw["metadata"].get("annotations") or {}), "not recorded as sent"
        down = False
        await instance.reconcile(namespace, NAME, passes=2)
        assert await phase_changes(testbed.nats_url, namespace) == {"Suspended": 1}
        assert (await reasons(kube, namespace))["Suspended"] == 1


async def test_a_record_overwritten_by_an_older_transition_only_costs_a_harmless_resend(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str
) -> None:
    apply(testbed.kubeconfig, namespace, manifests.job_appwrapper(NAME, annotations=FAST))
    async with connected(testbed) as (kube, bus):
        where = await refs(kube)
        await settle(Instance(kube, Publishing(bus), where), kube, namespace)
        before = await announced(testbed.nats_url, namespace, NAME)
        by_reason = await reasons(kube, namespace)
        # A slow replica records an earlier transition after the latest one was recorded.
        await kube.patch(
            where[0], NAME, {"metadata": {"annotations": {ANNOUNCED_ANNOTATION: "Resuming/0/x"}}}, namespace
        )
        stale = await appwrapper(kube, namespace, NAME)
        assert stale is not None and announcements.pending(stale, utcnow())
        await settle(Instance(kube, Publishing(bus), where), kube, namespace)
        assert await announced(testbed.nats_url, namespace, NAME) == before
        assert await reasons(kube, namespace) == by_reason
        aw = await appwrapper(kube, namespace, NAME)
        assert aw is not None and not announcements.pending(aw, utcnow())


# --------------------------------------------------------- deletes: only what is confirmed ours


async def test_the_first_pass_of_an_urgent_reset_deletes_by_the_uid_confirmed_earlier(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str
) -> None:
    apply(testbed.kubeconfig, namespace, manifests.job_appwrapper(NAME, annotations=FAST))
    async with connected(testbed) as (kube, bus):
        instance = Instance(kube, Publishing(bus), await refs(kube))
        await instance.reconcile(namespace, NAME, passes=PASSES)
        [job] = jobs(testbed.kubeconfig, namespace)
        aw = await appwrapper(kube, namespace, NAME)
        assert aw is not None
        seen = instance.reader.confirmed((namespace, NAME), aw["metadata"]["uid"], 0)
        assert seen == (f"{NAME}-job", job["metadata"]["uid"])


# ------------------------------------------------------------- generated names: created once


async def test_a_generated_name_that_cannot_be_looked_for_is_not_created_again(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str
) -> None:
    kc = testbed.kubeconfig
    apply_generating(kc, namespace, NAME)
    async with connected(testbed) as (kube, bus):
        where = await refs(kube)

        def kill_after_create(verb: str, plural: str, name: str) -> None:
            if verb == "replace_status" and jobs(kc, namespace):
                raise Killed

        with pytest.raises(Killed):
            await Instance(Wrapped(kube, kill_after_create), Publishing(bus), where).reconcile(
                namespace, NAME, passes=PASSES
            )

        def no_list(verb: str, plural: str, name: str) -> None:
            if verb == "list" and plural == "jobs":
                raise KubeApiError(403, "Forbidden", "cannot list jobs")

        await Instance(Wrapped(kube, no_list), Publishing(bus), where).reconcile(namespace, NAME, passes=3)
        assert len(jobs(kc, namespace)) == 1
        assert ((await appwrapper(kube, namespace, NAME)) or {})["status"]["phase"] == "Resuming"


# ----------------------------------------------------------------------------- clock skew


async def test_without_the_correction_a_clock_ahead_starts_the_attempt_after_its_own_job(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str
) -> None:
    """What the correction prevents (test_lifecycle_hardening's skew test fails this way
    without it)."""
    apply(testbed.kubeconfig, namespace, manifests.job_appwrapper(NAME, annotations=FAST))
    async with connected(testbed) as (kube, bus):
        # No sync, no samples yet: the local clock as it is, seven minutes ahead.
        instance = Instance(
            kube, Publishing(bus), await refs(kube), local=lambda: utcnow() + timedelta(minutes=7)
        )
        await instance.reconcile(namespace, NAME)
        aw = await appwrapper(kube, namespace, NAME)
        started = parse_kube_time(condition(aw, "ResourcesDeployed").get("lastTransitionTime"))
        [job] = jobs(testbed.kubeconfig, namespace)
        created = parse_kube_time(job["metadata"]["creationTimestamp"])
        assert started is not None and created is not None and started > created
        # ...and from the Job's creation on, the clock is corrected for the next decisions.
        assert instance.clock.offset <= -timedelta(minutes=6)


# ------------------------------------------------------------------- per-object failures


async def test_an_unreadable_appwrapper_is_reported_once_and_retried_with_a_growing_backoff(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str
) -> None:
    apply(testbed.kubeconfig, namespace, manifests.job_appwrapper(NAME, annotations=FAST))
    too_deep = True

    def unreadable(verb: str, plural: str, name: str) -> None:
        if too_deep and verb == "get" and plural == "appwrappers":
            raise RecursionError("maximum recursion depth exceeded while decoding a JSON object")

    async with connected(testbed) as (kube, bus):
        instance = Instance(Wrapped(kube, unreadable), Publishing(bus), await refs(kube))
        failures = instance.reconciler.failures
        backoffs = []
        for _ in range(3):
            with pytest.raises(RecursionError):
                await instance.reconciler.reconcile_key((namespace, NAME), None)
            backoffs.append(failures.backoff((namespace, NAME)))
        assert backoffs == [timedelta(seconds=1), timedelta(seconds=2), timedelta(seconds=4)]
        [told] = [e for e in await events(kube, namespace, NAME) if e["reason"] == RECONCILE_ERROR_EVENT]
        assert told["type"] == "Warning"
        assert "RecursionError" in told["message"]
        assert told["involvedObject"]["name"] == NAME and told["involvedObject"]["kind"] == "AppWrapper"

        too_deep = False
        await instance.reconcile(namespace, NAME)
        assert failures.backoff((namespace, NAME)) == timedelta(seconds=1), "forgotten on success"


async def test_an_api_outage_is_retried_but_told_to_nobody(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str
) -> None:
    apply(testbed.kubeconfig, namespace, manifests.job_appwrapper(NAME, annotations=FAST))

    def down(verb: str, plural: str, name: str) -> None:
        if plural == "appwrappers":
            raise KubeApiError(503, "ServiceUnavailable", "etcd is down")

    async with connected(testbed) as (kube, bus):
        instance = Instance(Wrapped(kube, down), Publishing(bus), await refs(kube))
        try:
            for _ in range(8):
                with pytest.raises(Exception, match="etcd is down"):
                    await instance.reconciler.reconcile_key((namespace, NAME), None)
        finally:
            instance.queue.close()
        assert await events(kube, namespace, NAME) == []
        # The key is fine, the API will be back: retried within seconds, not minutes.
        assert instance.reconciler.failures.backoff((namespace, NAME)) == timedelta(seconds=10)


async def test_a_bad_annotation_value_is_told_once_and_the_default_is_used(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str
) -> None:
    manifest = manifests.job_appwrapper(NAME, annotations={**FAST, RETRY_LIMIT_ANNOTATION: "three"})
    apply(testbed.kubeconfig, namespace, manifest)
    async with connected(testbed) as (kube, bus):
        await Instance(kube, Publishing(bus), await refs(kube)).reconcile(namespace, NAME, passes=PASSES)
        told = [e for e in await events(kube, namespace, NAME) if e["reason"] == INVALID_VALUE_EVENT]
        assert len(told) == 1
        assert RETRY_LIMIT_ANNOTATION in told[0]["message"] and "'three'" in told[0]["message"]
        assert ((await appwrapper(kube, namespace, NAME)) or {})["status"]["phase"] == "Running"


async def test_a_finalizer_is_in_place_before_anything_is_created(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str
) -> None:
    apply(testbed.kubeconfig, namespace, manifests.job_appwrapper(NAME, annotations=FAST))
    finalized_first: list[bool] = []

    async with connected(testbed) as (kube, bus):
        where = await refs(kube)

        async def check(verb: str, plural: str, name: str) -> None:
            if verb == "create" and plural == "jobs":
                aw = await appwrapper(kube, namespace, NAME)
                finalized_first.append(FINALIZER in ((aw or {})["metadata"].get("finalizers") or []))

        await Instance(Wrapped(kube, check), Publishing(bus), where).reconcile(namespace, NAME, passes=PASSES)
        aw = await appwrapper(kube, namespace, NAME)
        assert aw is not None and FINALIZER in aw["metadata"]["finalizers"]
        assert finalized_first == [True], "the finalizer was stored before the Job's create"
