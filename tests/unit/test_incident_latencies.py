"""The incident latencies: detection (health), reaction and recovery (lifecycle), from the times
the messages carry."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from services.health.latency import detection
from services.lifecycle.latencies import ResetTimes
from shared.appwrapper.constants import Phase
from shared.messages import ObjectRef, Verdict
from tests.unit.test_health_rules import MIN, SEC, aw_obs, failed_pod, running, verdict_of

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
KEY = ("team-a", "train")


def unhealthy(
    *,
    failed_at: datetime | None = T0,
    decided_at: datetime = T0 + timedelta(seconds=61),
    deadline: datetime | None = T0 + MIN,
    resetting_count: int = 0,
    uid: str = "u1",
    reason: str = "FoundFailedPods",
) -> Verdict:
    return Verdict(
        ref=ObjectRef(namespace="team-a", name="train", uid=uid),
        state="Unhealthy",
        reason=reason,
        first_unhealthy_at=failed_at,
        decided_at=decided_at,
        deadline=deadline,
        resetting_count=resetting_count,
    )


# ------------------------------------------------------------------------- detection


def test_detection_of_a_failed_pod_spans_the_grace_period_and_the_delay_what_follows_it() -> None:
    # The container finished at T0 + 10 s, the grace period is 1 min, the verdict came 0.5 s late.
    finished = T0 + 10 * SEC
    observations = [aw_obs(), *running("p0"), failed_pod("p1", finished_at=finished)]
    v = verdict_of(observations, finished + MIN + SEC / 2)
    assert v.state == "Unhealthy"
    d = detection(None, v)
    assert d is not None
    assert d.seconds == pytest.approx(60.5)
    assert d.delay_seconds == pytest.approx(0.5)


def test_detection_without_a_deadline_is_its_own_delay() -> None:
    d = detection(None, unhealthy(deadline=None, decided_at=T0 + 3 * SEC, reason="AutopilotNoExecute"))
    assert d is not None
    assert (d.seconds, d.delay_seconds) == (3.0, 3.0)


def test_only_the_first_unhealthy_verdict_of_an_attempt_counts() -> None:
    first = unhealthy()
    healthy = first.model_copy(update={"state": "Healthy"})
    assert detection(healthy, first) is not None
    # The same attempt judged Unhealthy again (e.g. more nodes blamed): not counted twice.
    again = first.model_copy(update={"nodes": ("n1",), "decided_at": first.decided_at + SEC})
    assert detection(first, again) is None
    # The next attempt's failure, and another incarnation's, count again.
    assert detection(first, unhealthy(resetting_count=1)) is not None
    assert detection(first, unhealthy(uid="u2")) is not None


def test_no_detection_for_verdicts_that_are_not_unhealthy_or_carry_no_failure_time() -> None:
    assert detection(None, unhealthy().model_copy(update={"state": "Healthy"})) is None
    assert detection(None, unhealthy(failed_at=None)) is None


def test_clock_skew_never_gives_a_negative_detection() -> None:
    d = detection(None, unhealthy(failed_at=T0 + MIN, decided_at=T0, deadline=None))
    assert d is not None
    assert (d.seconds, d.delay_seconds) == (0.0, 0.0)


# ------------------------------------------------------------------ reaction, recovery


def test_reaction_is_verdict_to_first_delete_and_recovery_failure_to_running() -> None:
    times = ResetTimes()
    verdict = unhealthy(failed_at=T0, decided_at=T0 + 61 * SEC)
    times.started(KEY, verdict)
    assert times.phase(KEY, Phase.RESETTING, T0 + 62 * SEC) is None
    assert times.deleted(KEY, T0 + 61.2 * SEC) == pytest.approx(0.2)
    assert times.deleted(KEY, T0 + 70 * SEC) is None  # later stages of the same reset
    assert times.phase(KEY, Phase.RESUMING, T0 + 80 * SEC) is None
    assert times.phase(KEY, Phase.RUNNING, T0 + 90 * SEC) == pytest.approx(90.0)
    assert len(times) == 0
    assert times.phase(KEY, Phase.RUNNING, T0 + 95 * SEC) is None  # counted once


def test_a_second_reset_before_running_keeps_the_first_failure_and_times_its_own_reaction() -> None:
    times = ResetTimes()
    times.started(KEY, unhealthy(failed_at=T0, decided_at=T0 + 61 * SEC))
    assert times.deleted(KEY, T0 + 62 * SEC) == pytest.approx(1.0)
    times.started(KEY, unhealthy(failed_at=T0 + 100 * SEC, decided_at=T0 + 161 * SEC, resetting_count=1))
    assert times.deleted(KEY, T0 + 161.5 * SEC) == pytest.approx(0.5)
    assert times.phase(KEY, Phase.RUNNING, T0 + 200 * SEC) == pytest.approx(200.0)


@pytest.mark.parametrize("phase", [Phase.FAILED, Phase.SUSPENDED, Phase.SUCCEEDED])
def test_a_reset_that_does_not_end_running_is_not_a_recovery(phase: str) -> None:
    times = ResetTimes()
    times.started(KEY, unhealthy())
    assert times.phase(KEY, phase, T0 + 100 * SEC) is None
    assert len(times) == 0
    assert times.phase(KEY, Phase.RUNNING, T0 + 200 * SEC) is None


def test_running_without_a_reset_is_not_a_recovery() -> None:
    times = ResetTimes()
    assert times.phase(KEY, Phase.RUNNING, T0) is None
    assert times.deleted(KEY, T0) is None
