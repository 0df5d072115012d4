"""Restart storms, CrashLoopBackOff and the progress heartbeat in the health rules, clock passed in."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from services.health.rules import (
    CODE_CRASH_LOOP_BACK_OFF,
    CODE_RESTART_STORM,
    CODE_STALLED,
    REASON_RESTART_STORM,
    REASON_STALLED,
    evaluate,
)
from services.health.state import AppWrapperHealth, apply
from shared.config import OperatorConfig
from shared.faulttolerance import FaultTolerance
from shared.kubetime import format_kube_time
from shared.messages import ContainerState, PodObservation
from shared.stalls import (
    HEARTBEAT_ANNOTATION,
    HEARTBEAT_TIMEOUT_ANNOTATION,
    RESTART_STORM_ANNOTATION,
    StallDefaults,
    parse_heartbeat,
    stall_policy,
)
from tests.unit.test_health_rules import AW, MIN, NS, SEC, T0, aw_obs, fold, pod

ANNOTATIONS = {RESTART_STORM_ANNOTATION: "3/10m"}


def looping(
    name: str,
    restarts: int,
    at: datetime,
    *,
    state: str = "running",
    reason: str = "",
    phase: str = "Running",
    init: bool = False,
    uid: str | None = None,
    created_at: datetime | None = T0 + SEC,
    heartbeat: str = "",
) -> PodObservation:
    c = ContainerState(
        name="main",
        init=init,
        state=state,
        reason=reason,
        restart_count=restarts,  # type: ignore[arg-type]
    )
    base = pod(name, phase, containers=[c], observed_at=at, uid=uid, created_at=created_at)
    return base.model_copy(update={"heartbeat": heartbeat})


def crash_loop(name: str, restarts: int, at: datetime, **kwargs: Any) -> PodObservation:
    return looping(name, restarts, at, state="waiting", reason="CrashLoopBackOff", **kwargs)


def healthy_pod(name: str, at: datetime = T0 + 2 * SEC, **kwargs: Any) -> PodObservation:
    return looping(name, 0, at, **kwargs)


# ------------------------------------------------------------------------ the annotations


def test_the_storm_annotation_sets_restarts_and_window() -> None:
    policy = stall_policy({RESTART_STORM_ANNOTATION: "3/90s"}, StallDefaults())
    assert (policy.storm_restarts, policy.storm_window, policy.warnings) == (3, timedelta(seconds=90), ())


def test_off_turns_counting_and_crash_loop_back_off_off() -> None:
    policy = stall_policy({RESTART_STORM_ANNOTATION: "off"}, StallDefaults())
    assert not policy.counts_restarts
    assert not policy.crash_loop_backoff


@pytest.mark.parametrize(
    "raw", ["3", "3/", "/10m", "0/10m", "3/0s", "3/-1m", "3/10d", "x/10m", "1001/1m", "3 /10m"]
)
def test_a_malformed_storm_annotation_falls_back_with_a_warning(raw: str) -> None:
    policy = stall_policy({RESTART_STORM_ANNOTATION: raw}, StallDefaults(storm_restarts=7))
    assert (policy.storm_restarts, policy.storm_window) == (7, timedelta(minutes=10))
    assert len(policy.warnings) == 1
    assert RESTART_STORM_ANNOTATION in policy.warnings[0]
    assert "using the default 7/10m0s" in policy.warnings[0]


def test_a_storm_window_beyond_the_grace_period_maximum_is_capped() -> None:
    policy = stall_policy({RESTART_STORM_ANNOTATION: "3/48h"}, StallDefaults(), timedelta(hours=24))
    assert policy.storm_window == timedelta(hours=24)
    assert "exceeds the grace period maximum" in policy.warnings[0]


def test_the_heartbeat_is_off_unless_opted_in() -> None:
    assert stall_policy({}, StallDefaults()).heartbeat_timeout is None
    assert stall_policy({HEARTBEAT_TIMEOUT_ANNOTATION: "5m"}, StallDefaults()).heartbeat_timeout == 5 * MIN


@pytest.mark.parametrize("raw", ["5", "0s", "-1m", "soon"])
def test_a_malformed_heartbeat_timeout_leaves_the_heartbeat_off_with_a_warning(raw: str) -> None:
    policy = stall_policy({HEARTBEAT_TIMEOUT_ANNOTATION: raw}, StallDefaults())
    assert policy.heartbeat_timeout is None
    assert "the heartbeat is not checked" in policy.warnings[0]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("2026-03-01T12:00:00Z", T0),
        ("2026-03-01T13:00:00+01:00", T0),
        ("2026-03-01T12:00:00.123456789Z", T0 + timedelta(microseconds=123456)),
        ("2026-03-01t12:00:00z", T0),
    ],
)
def test_a_heartbeat_is_an_rfc3339_time_with_a_zone(raw: str, expected: datetime) -> None:
    assert parse_heartbeat(raw) == expected


@pytest.mark.parametrize(
    "raw", ["", "2026-03-01T12:00:00", "2026-03-01", "1772366400", "yes", "2026-13-01T00:00:00Z"]
)
def test_anything_else_is_no_heartbeat(raw: str) -> None:
    assert parse_heartbeat(raw) is None


def test_the_operator_defaults_come_from_the_health_section() -> None:
    config = OperatorConfig.model_validate(
        {"health": {"restartStormRestarts": 2, "restartStormWindow": "1m", "crashLoopBackOff": False}}
    )
    assert config.health.stall_defaults() == StallDefaults(2, MIN, False)
    with pytest.raises(ValueError, match="restartStormWindow"):
        OperatorConfig.model_validate({"health": {"restartStormWindow": "0s"}})


# ------------------------------------------------------------------------ restart storms


def test_a_restart_count_rising_by_k_within_w_is_a_storm_at_once() -> None:
    state = fold(
        [
            aw_obs(annotations=ANNOTATIONS),
            healthy_pod("p0"),
            looping("p1", 0, T0 + 2 * SEC),
            looping("p1", 1, T0 + MIN),
            looping("p1", 2, T0 + 2 * MIN),
            looping("p1", 3, T0 + 3 * MIN),
        ]
    )
    v = evaluate(state, T0 + 3 * MIN).verdict
    assert v is not None
    assert (v.state, v.reason, v.failure_class, v.failure_code) == (
        "Unhealthy",
        REASON_RESTART_STORM,
        "Unknown",
        CODE_RESTART_STORM,
    )
    assert v.counts_toward_retry and not v.terminal
    assert v.first_unhealthy_at == T0 + 3 * MIN
    assert "container main of pod p1 restarted 3 times within 10m0s" in v.message


def test_restarts_spread_wider_than_the_window_are_no_storm() -> None:
    state = fold(
        [
            aw_obs(annotations=ANNOTATIONS),
            healthy_pod("p0"),
            looping("p1", 0, T0 + 2 * SEC),
            looping("p1", 1, T0 + 6 * MIN),
            looping("p1", 2, T0 + 12 * MIN),
            looping("p1", 3, T0 + 18 * MIN),
            looping("p1", 4, T0 + 24 * MIN),
        ]
    )
    v = evaluate(state, T0 + 25 * MIN).verdict
    assert v is not None
    assert (v.state, v.reason) == ("Healthy", "")


def test_the_pods_creation_stands_for_a_count_of_zero() -> None:
    # A restarted health instance sees only the latest observation of a pod.
    state = fold([aw_obs(annotations=ANNOTATIONS), healthy_pod("p0"), looping("p1", 3, T0 + 4 * MIN)])
    v = evaluate(state, T0 + 4 * MIN).verdict
    assert v is not None
    assert v.reason == REASON_RESTART_STORM
    old = fold([aw_obs(annotations=ANNOTATIONS), healthy_pod("p0"), looping("p1", 3, T0 + 20 * MIN)])
    assert evaluate(old, T0 + 20 * MIN).verdict.reason == ""  # type: ignore[union-attr]


def test_a_jump_between_two_observations_counts_in_full() -> None:
    state = fold(
        [
            aw_obs(annotations=ANNOTATIONS),
            healthy_pod("p0"),
            looping("p1", 1, T0 + 20 * MIN),
            looping("p1", 4, T0 + 21 * MIN),
        ]
    )
    assert evaluate(state, T0 + 21 * MIN).verdict.reason == REASON_RESTART_STORM  # type: ignore[union-attr]


def test_a_storm_of_a_pod_of_an_earlier_attempt_does_not_count() -> None:
    state = fold(
        [
            aw_obs(annotations=ANNOTATIONS, deployed_at=T0 + 10 * MIN),
            healthy_pod("p0", created_at=T0 + 11 * MIN, at=T0 + 11 * MIN),
            looping("p1", 0, T0 + 2 * SEC),
            looping("p1", 3, T0 + MIN),
        ]
    )
    v = evaluate(state, T0 + 11 * MIN).verdict
    assert v is None or v.reason != REASON_RESTART_STORM


def test_a_new_pod_of_the_same_name_starts_a_new_history() -> None:
    state = fold(
        [
            aw_obs(annotations=ANNOTATIONS),
            healthy_pod("p0"),
            looping("p1", 0, T0 + 2 * SEC, created_at=None),
            looping("p1", 2, T0 + MIN, created_at=None),
            looping("p1", 1, T0 + 2 * MIN, uid="p1-second", created_at=None),
            looping("p1", 2, T0 + 3 * MIN, uid="p1-second", created_at=None),
        ]
    )
    assert evaluate(state, T0 + 3 * MIN).verdict.reason == ""  # type: ignore[union-attr]


def test_init_containers_restarts_count_too() -> None:
    state = fold(
        [
            aw_obs(annotations=ANNOTATIONS),
            healthy_pod("p0"),
            looping("p1", 0, T0 + 2 * SEC, init=True, phase="Pending"),
            looping("p1", 3, T0 + MIN, init=True, phase="Pending"),
        ]
    )
    v = evaluate(state, T0 + MIN).verdict
    assert v is not None
    assert v.reason == REASON_RESTART_STORM
    assert "init container main of pod p1" in v.message


def test_pods_folded_before_their_appwrapper_are_judged_by_its_annotation_once_it_comes() -> None:
    # The stream keeps only each object's latest observation: an AppWrapper whose status changed
    # after its pods sorts after them, so its pods are folded under the operator's defaults
    # (5 restarts here) first; its own 3/10m applies as soon as it is known.
    pods = [
        healthy_pod("p0"),
        looping("p1", 0, T0 + 2 * SEC),
        *(looping("p1", n, T0 + n * MIN) for n in (1, 2, 3)),
    ]
    before = fold(pods)
    assert before.pods["p1"].restarts[0].storm is None
    state = fold([aw_obs(annotations=ANNOTATIONS, observed_at=T0 + 4 * MIN)], before)
    v = evaluate(state, T0 + 4 * MIN).verdict
    assert v is not None
    assert (v.state, v.reason) == ("Unhealthy", REASON_RESTART_STORM)
    assert v.first_unhealthy_at == T0 + 3 * MIN
    assert "container main of pod p1 restarted 3 times within 10m0s" in v.message


def test_a_storm_under_the_defaults_is_dropped_when_the_appwrappers_annotation_allows_it() -> None:
    pods = [healthy_pod("p0"), looping("p1", 0, T0 + 2 * SEC), looping("p1", 5, T0 + MIN)]
    before = fold(pods)
    assert before.pods["p1"].restarts[0].storm is not None
    for annotation in ("10/10m", "off"):
        state = fold([aw_obs(annotations={RESTART_STORM_ANNOTATION: annotation})], before)
        assert state.pods["p1"].restarts[0].storm is None
        assert evaluate(state, T0 + 2 * MIN).verdict.reason == ""  # type: ignore[union-attr]
    # A later, stricter annotation finds it again from the samples kept.
    again = fold(
        [aw_obs(annotations={RESTART_STORM_ANNOTATION: "10/10m"}), aw_obs(annotations=ANNOTATIONS)], before
    )
    assert again.pods["p1"].restarts[0].storm is not None


def test_storm_detection_off_ignores_restarts() -> None:
    state = fold(
        [
            aw_obs(annotations={RESTART_STORM_ANNOTATION: "off"}),
            healthy_pod("p0"),
            looping("p1", 0, T0 + 2 * SEC),
            looping("p1", 9, T0 + MIN),
            crash_loop("p1", 9, T0 + MIN + SEC),
        ]
    )
    assert evaluate(state, T0 + 30 * MIN).verdict.reason == ""  # type: ignore[union-attr]


def test_the_history_is_bounded_to_k_plus_one_samples() -> None:
    observations: list[Any] = [aw_obs(annotations={RESTART_STORM_ANNOTATION: "3/10m"})]
    observations += [looping("p1", n, T0 + n * 6 * MIN) for n in range(200)]
    state = fold(observations)
    (restarts,) = state.pods["p1"].restarts
    assert restarts.storm is None
    assert len(restarts.samples) <= 4


def test_a_failed_pod_is_judged_before_a_storm() -> None:
    state = fold(
        [
            aw_obs(annotations=ANNOTATIONS),
            pod("p0", "Failed", observed_at=T0 + MIN),
            looping("p1", 0, T0 + 2 * SEC),
            looping("p1", 3, T0 + MIN),
        ]
    )
    v = evaluate(state, T0 + 5 * MIN).verdict
    assert v is not None
    assert v.reason == "FoundFailedPods"


# ------------------------------------------------------------------------ CrashLoopBackOff


def test_a_crash_loop_back_off_wait_gets_the_failure_grace_period() -> None:
    state = fold([aw_obs(), healthy_pod("p0"), crash_loop("p1", 1, T0 + MIN)])
    during = evaluate(state, T0 + MIN + 30 * SEC)
    v = during.verdict
    assert v is not None
    assert (v.state, v.reason, v.deadline) == ("Healthy", REASON_RESTART_STORM, T0 + 2 * MIN)
    assert "failure grace period 1m0s ends at" in v.message
    assert during.next_deadline == T0 + 2 * MIN
    after = evaluate(during.state, T0 + 2 * MIN).verdict
    assert after is not None
    assert (after.state, after.failure_class, after.failure_code) == (
        "Unhealthy",
        "Unknown",
        CODE_CRASH_LOOP_BACK_OFF,
    )
    assert after.first_unhealthy_at == T0 + MIN


def test_a_crash_loop_back_off_wait_that_ends_clears() -> None:
    state = fold(
        [aw_obs(), healthy_pod("p0"), crash_loop("p1", 1, T0 + MIN), looping("p1", 1, T0 + MIN + 10 * SEC)]
    )
    v = evaluate(state, T0 + 5 * MIN).verdict
    assert v is not None
    assert (v.state, v.reason) == ("Healthy", "")


def test_each_back_off_wait_is_timed_on_its_own() -> None:
    state = fold(
        [
            aw_obs(),
            healthy_pod("p0"),
            crash_loop("p1", 1, T0 + MIN),
            looping("p1", 1, T0 + MIN + 10 * SEC),
            crash_loop("p1", 2, T0 + MIN + 20 * SEC),
        ]
    )
    v = evaluate(state, T0 + 2 * MIN).verdict
    assert v is not None
    assert (v.state, v.deadline) == ("Healthy", T0 + 2 * MIN + 20 * SEC)


def test_crash_loop_back_off_can_be_turned_off_by_the_operator() -> None:
    state = AppWrapperHealth(
        namespace=NS,
        name=AW,
        defaults=FaultTolerance(),
        stall_defaults=StallDefaults(crash_loop_backoff=False),
    )
    state = fold([aw_obs(), healthy_pod("p0"), crash_loop("p1", 1, T0 + MIN)], state)
    assert evaluate(state, T0 + 30 * MIN).verdict.reason == ""  # type: ignore[union-attr]


# ------------------------------------------------------------------------ the heartbeat

HB = {HEARTBEAT_TIMEOUT_ANNOTATION: "5m"}


def beat(at: datetime) -> str:
    return format_kube_time(at)


def test_no_heartbeat_at_all_stalls_after_the_timeout_from_when_all_pods_ran() -> None:
    state = fold([aw_obs(annotations=HB), healthy_pod("p0", T0 + 10 * SEC), healthy_pod("p1", T0 + 20 * SEC)])
    first = evaluate(state, T0 + MIN)
    assert first.verdict is not None and first.verdict.reason == ""
    assert first.next_deadline == T0 + 5 * MIN + 20 * SEC
    v = evaluate(first.state, T0 + 5 * MIN + 20 * SEC).verdict
    assert v is not None
    assert (v.state, v.reason, v.failure_class, v.failure_code) == (
        "Unhealthy",
        REASON_STALLED,
        "Unknown",
        CODE_STALLED,
    )
    assert v.first_unhealthy_at == T0 + 5 * MIN + 20 * SEC


def test_a_fresh_heartbeat_on_a_pod_keeps_the_workload_healthy() -> None:
    state = fold(
        [
            aw_obs(annotations=HB),
            healthy_pod("p0", T0 + 10 * SEC),
            healthy_pod("p1", T0 + 20 * SEC),
            healthy_pod("p1", T0 + 4 * MIN + 5 * SEC, heartbeat=beat(T0 + 4 * MIN)),
        ]
    )
    decision = evaluate(state, T0 + 8 * MIN)
    assert decision.verdict is not None and decision.verdict.state == "Healthy"
    assert decision.next_deadline == T0 + 9 * MIN
    stale = evaluate(decision.state, T0 + 9 * MIN).verdict
    assert stale is not None and stale.reason == REASON_STALLED
    assert "the last at 2026-03-01T12:04:00Z" in stale.message


def test_a_heartbeat_on_the_appwrapper_counts() -> None:
    body = {**HB, HEARTBEAT_ANNOTATION: beat(T0 + 7 * MIN)}
    state = fold(
        [
            aw_obs(annotations=HB),
            healthy_pod("p0", T0 + 10 * SEC),
            healthy_pod("p1", T0 + 20 * SEC),
            aw_obs(annotations=body, observed_at=T0 + 7 * MIN),
        ]
    )
    decision = evaluate(state, T0 + 11 * MIN)
    assert decision.verdict is not None and decision.verdict.state == "Healthy"
    assert decision.next_deadline == T0 + 12 * MIN


def test_a_heartbeat_from_the_future_counts_only_from_when_it_was_seen() -> None:
    far = beat(T0 + 24 * 60 * MIN)
    state = fold(
        [
            aw_obs(annotations=HB),
            healthy_pod("p0", T0 + 10 * SEC),
            healthy_pod("p1", T0 + MIN, heartbeat=far),
            # Unrelated changes of the pod do not refresh a heartbeat whose value is the same.
            healthy_pod("p1", T0 + 3 * MIN, heartbeat=far),
        ]
    )
    v = evaluate(state, T0 + 6 * MIN).verdict
    assert v is not None and v.reason == REASON_STALLED


def test_a_heartbeat_older_than_the_attempt_does_not_stall_it_at_once() -> None:
    body = {**HB, HEARTBEAT_ANNOTATION: beat(T0 - 60 * MIN)}
    state = fold(
        [aw_obs(annotations=body), healthy_pod("p0", T0 + 10 * SEC), healthy_pod("p1", T0 + 20 * SEC)]
    )
    decision = evaluate(state, T0 + MIN)
    assert decision.verdict is not None and decision.verdict.reason == ""
    assert decision.next_deadline == T0 + 5 * MIN + 20 * SEC


def test_an_unreadable_heartbeat_is_no_heartbeat() -> None:
    state = fold(
        [
            aw_obs(annotations=HB),
            healthy_pod("p0", T0 + 10 * SEC),
            healthy_pod("p1", T0 + 20 * SEC),
            healthy_pod("p1", T0 + 4 * MIN, heartbeat="step 1200"),
        ]
    )
    v = evaluate(state, T0 + 5 * MIN + 20 * SEC).verdict
    assert v is not None and v.reason == REASON_STALLED


def test_the_heartbeat_clock_does_not_run_until_every_pod_runs() -> None:
    state = fold([aw_obs(annotations=HB), healthy_pod("p0", T0 + 10 * SEC), pod("p1", "Pending")])
    decision = evaluate(state, T0 + 4 * MIN)
    assert decision.verdict is not None and decision.verdict.reason == ""
    assert decision.next_deadline == T0 + 5 * MIN  # the warmup deadline, not a heartbeat one


def test_without_the_timeout_annotation_the_heartbeat_is_not_checked() -> None:
    state = fold([aw_obs(), healthy_pod("p0", T0 + 10 * SEC), healthy_pod("p1", T0 + 20 * SEC)])
    decision = evaluate(state, T0 + 60 * MIN)
    assert decision.verdict is not None and decision.verdict.reason == ""
    assert decision.next_deadline is None


def test_a_heartbeat_refresh_publishes_no_verdict() -> None:
    state = fold([aw_obs(annotations=HB), healthy_pod("p0", T0 + 10 * SEC), healthy_pod("p1", T0 + 20 * SEC)])
    first = evaluate(state, T0 + MIN)
    assert first.verdict is not None
    refreshed = apply(first.state, healthy_pod("p1", T0 + 2 * MIN, heartbeat=beat(T0 + 2 * MIN)))
    again = evaluate(refreshed, T0 + 2 * MIN)
    assert again.verdict is None
    assert again.next_deadline == T0 + 7 * MIN


def test_a_back_off_wait_in_its_grace_period_does_not_hold_back_a_due_readiness_verdict() -> None:
    state = fold([aw_obs(), crash_loop("p1", 1, T0 + 6 * MIN + 30 * SEC)])
    v = evaluate(state, T0 + 6 * MIN + 40 * SEC).verdict
    assert v is not None
    assert (v.state, v.reason) == ("Unhealthy", "InsufficientPodsReady")
