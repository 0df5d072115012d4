"""Verdicts from the bus become work: which are applied at once, which are queued."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from services.lifecycle.triggers import LatestVerdicts, Triggers
from services.lifecycle.verdicts import VerdictUse
from services.lifecycle.workqueue import Key, WorkQueue
from shared.bus import TransientError
from shared.messages import ObjectRef, Verdict

T0 = datetime(2026, 1, 1, tzinfo=UTC)
KEY = ("team", "train")


def verdict(state: str, *, seq: int = 1, uid: str = "uid-1") -> Verdict:
    return Verdict(
        ref=ObjectRef(namespace="team", name="train", uid=uid),
        state=state,
        seq=seq,
        decided_at=T0,
        resetting_count=0,
    )


class Reconciles:
    """Stands in for the reconciler: records calls, answers ``use``."""

    def __init__(self, use: VerdictUse = VerdictUse.APPLIED) -> None:
        self.calls: list[tuple[Key, Verdict | None, bool]] = []
        self.use = use

    async def __call__(self, key: Key, verdict: Verdict | None, *, urgent: bool = False) -> VerdictUse:
        self.calls.append((key, verdict, urgent))
        return self.use


def triggers(reconcile: Reconciles) -> tuple[Triggers, WorkQueue]:
    queue = WorkQueue(clock=lambda: T0, debounce=timedelta(0))
    latest = LatestVerdicts()
    return Triggers(queue=queue, latest=latest, reconcile=reconcile), queue


DELIVERY: Any = None  # the handlers do not look at it


async def test_an_unhealthy_verdict_is_applied_at_once_and_urgently() -> None:
    reconcile = Reconciles()
    t, _ = triggers(reconcile)
    v = verdict("Unhealthy")
    await t.on_verdict(v, DELIVERY)
    assert reconcile.calls == [(KEY, v, True)]
    assert t.latest.get(KEY) == v


async def test_a_healthy_verdict_waits_for_the_next_reconcile_of_its_appwrapper() -> None:
    reconcile = Reconciles()
    t, queue = triggers(reconcile)
    await t.on_verdict(verdict("Healthy"), DELIVERY)
    assert reconcile.calls == []
    assert await asyncio.wait_for(queue.next_key(), timeout=1.0) == KEY


async def test_a_held_verdict_is_kept_unacked() -> None:
    t, _ = triggers(Reconciles(VerdictUse.HELD))
    with pytest.raises(TransientError):
        await t.on_verdict(verdict("Succeeded"), DELIVERY)


async def test_a_redelivered_older_verdict_does_not_replace_the_latest() -> None:
    latest = LatestVerdicts()
    newer = verdict("Unhealthy", seq=5)
    latest.offer(newer)
    latest.offer(verdict("Healthy", seq=4))
    assert latest.get(KEY) == newer
    recreated = verdict("Healthy", seq=1, uid="uid-2")
    latest.offer(recreated)
    assert latest.get(KEY) == recreated, "a new incarnation starts its own sequence"
    latest.forget(KEY)
    assert latest.get(KEY) is None


def test_the_latest_verdict_is_handed_out_as_it_came_with_every_field() -> None:
    latest = LatestVerdicts()
    full = Verdict(
        ref=ObjectRef(namespace="team", name="train", uid="uid-1"),
        state="Unhealthy",
        reason="FoundFailedPods",
        message="pod train-0 failed: exit code 1 (Transient)",
        terminal=False,
        counts_toward_retry=False,
        nodes=("node-1", "node-2"),
        resetting_count=2,
        first_unhealthy_at=T0 - timedelta(seconds=3, microseconds=250),
        decided_at=T0,
        seq=7,
        warnings=("faultTolerance.failureGracePeriod: not a duration",),
        deadline=T0 + timedelta(minutes=1),
        attempt_started_at=T0 - timedelta(hours=1),
        failure_class="Transient",
        failure_code="ExitCode:1",
        fault_kind="pod",
    )
    latest.offer(full)
    got = latest.get(KEY)
    assert got == full
    assert got is not full, "each reconcile gets a verdict of its own"
