"""The benchmark's reading of lifecycle's announcements: the reset's (or failure's) PhaseChanged
gives each active fault of its AppWrapper the time the decision was made (the message's own
``at``) and the time the announcement arrived; nothing else does."""

from __future__ import annotations

from datetime import UTC, datetime

from bench.plan import AwSpec
from bench.tracker import AwRec, Tracker
from shared.messages import LifecycleEvent, ObjectRef

T0 = 1_800_000_000.0


def event(
    phase: str, *, event: str = "PhaseChanged", name: str = "aw-1", at: float = T0 + 0.03
) -> LifecycleEvent:
    return LifecycleEvent(
        ref=ObjectRef(namespace="bench", name=name, uid="u1"),
        event=event,
        phase=phase,
        at=datetime.fromtimestamp(at, UTC),
    )


def tracked() -> tuple[Tracker, AwRec]:
    tracker = Tracker(warmup_seconds=60)
    rec = AwRec(spec=AwSpec(name="aw-1", kind="job", pods=1, gpu=False))
    tracker.aws["aw-1"] = rec
    return tracker, rec


def test_the_resets_announcement_times_the_decision_and_its_arrival() -> None:
    tracker, rec = tracked()
    fault = tracker.add_fault("pod-failure", rec, T0, counted=True)
    tracker.on_lifecycle(event("Resetting"), T0 + 0.05)
    assert fault.t_decided is not None and abs(fault.t_decided - (T0 + 0.03)) < 1e-6
    assert fault.t_announced == T0 + 0.05
    # Later announcements of the same reset change nothing.
    tracker.on_lifecycle(event("Resetting", at=T0 + 0.5), T0 + 0.6)
    assert fault.t_announced == T0 + 0.05


def test_a_failure_counts_like_a_reset() -> None:
    tracker, rec = tracked()
    fault = tracker.add_fault("pod-failure", rec, T0, counted=True)
    tracker.on_lifecycle(event("Failed"), T0 + 0.05)
    assert fault.t_announced == T0 + 0.05


def test_other_announcements_and_other_appwrappers_time_nothing() -> None:
    tracker, rec = tracked()
    fault = tracker.add_fault("evict", rec, T0, counted=False)
    tracker.on_lifecycle(event("Running"), T0 + 0.05)
    tracker.on_lifecycle(event("Resetting", event="ResetStarted"), T0 + 0.05)
    tracker.on_lifecycle(event("Resetting", name="aw-2"), T0 + 0.05)
    # An announcement that arrived before the fault was written is not its answer.
    tracker.on_lifecycle(event("Resetting"), T0 - 1.0)
    assert fault.t_announced is None and fault.t_decided is None
