"""Properties of restart-storm tracking over arbitrary restart histories.

* A storm is detected iff, for some time t at which a count was first seen, that count exceeds
  the count in force at t - W (the last seen at or before it; the first seen when none is that
  old) by at least K: checked against a reference that keeps the whole history.
* The history kept per container never exceeds K + 1 samples, however long the pod lives.
* Folding the same observation twice changes nothing.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from services.health.rules import REASON_RESTART_STORM, evaluate
from services.health.state import AppWrapperHealth, apply
from shared.faulttolerance import FaultTolerance
from shared.stalls import RESTART_STORM_ANNOTATION
from tests.unit.test_health_rules import AW, NS, T0, aw_obs
from tests.unit.test_health_stalls import healthy_pod, looping

steps = st.lists(
    st.tuples(st.integers(min_value=0, max_value=900), st.integers(min_value=0, max_value=3)),
    min_size=1,
    max_size=40,
)
restarts = st.integers(min_value=1, max_value=6)
windows = st.integers(min_value=1, max_value=1200)


def history(start: int, points: list[tuple[int, int]]) -> list[tuple[datetime, int]]:
    """(time, restart count) of each observation: the seconds since the previous one and the rise."""
    at, count, out = T0 + timedelta(seconds=10), start, []
    for gap, rise in points:
        at += timedelta(seconds=gap)
        count += rise
        out.append((at, count))
    return out


def reference_storm(observed: list[tuple[datetime, int]], k: int, window: timedelta) -> bool:
    first_seen: list[tuple[datetime, int]] = []
    for at, count in observed:
        if not first_seen or count > first_seen[-1][1]:
            first_seen.append((at, count))
    for at, count in first_seen:
        older = [c for t, c in first_seen if t <= at - window]
        base = older[-1] if older else first_seen[0][1]
        if count - base >= k:
            return True
    return False


def fold(k: int, seconds: int, observed: list[tuple[datetime, int]]) -> AppWrapperHealth:
    state = AppWrapperHealth(namespace=NS, name=AW, defaults=FaultTolerance())
    state = apply(state, aw_obs(annotations={RESTART_STORM_ANNOTATION: f"{k}/{seconds}s"}))
    state = apply(state, healthy_pod("p0"))
    for at, count in observed:
        # No creation time: the pod may be old, its first count says nothing of when it rose.
        state = apply(state, looping("p1", count, at, created_at=None))
    return state


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=50), steps, restarts, windows)
def test_a_storm_is_detected_iff_the_count_rises_by_k_within_w(
    start: int, points: list[tuple[int, int]], k: int, seconds: int
) -> None:
    observed = history(start, points)
    state = fold(k, seconds, observed)
    (record,) = state.pods["p1"].restarts
    expected = reference_storm(observed, k, timedelta(seconds=seconds))
    assert (record.storm is not None) == expected
    verdict = evaluate(state, observed[-1][0]).verdict
    assert verdict is not None
    assert (verdict.reason == REASON_RESTART_STORM) == expected


@settings(max_examples=200, deadline=None)
@given(steps, restarts, windows)
def test_the_history_never_exceeds_k_plus_one_samples(
    points: list[tuple[int, int]], k: int, seconds: int
) -> None:
    state = AppWrapperHealth(namespace=NS, name=AW, defaults=FaultTolerance())
    state = apply(state, aw_obs(annotations={RESTART_STORM_ANNOTATION: f"{k}/{seconds}s"}))
    stormed: tuple[tuple[datetime, int], ...] | None = None
    for at, count in history(0, points):
        state = apply(state, looping("p1", count, at, created_at=None))
        (record,) = state.pods["p1"].restarts
        assert len(record.samples) <= k + 1
        # Once a storm is seen its samples stop changing (while the pod is the same).
        if stormed is not None and record.storm is not None:
            assert record.samples == stormed
        stormed = record.samples if record.storm is not None else None


@settings(max_examples=100, deadline=None)
@given(steps, restarts, windows)
def test_folding_an_observation_again_changes_nothing(
    points: list[tuple[int, int]], k: int, seconds: int
) -> None:
    state = AppWrapperHealth(namespace=NS, name=AW, defaults=FaultTolerance())
    state = apply(state, aw_obs(annotations={RESTART_STORM_ANNOTATION: f"{k}/{seconds}s"}))
    for at, count in history(0, points):
        obs = looping("p1", count, at, created_at=None)
        once = apply(state, obs)
        assert apply(once, obs) == once
        state = once
