"""Exponential retry pause: base * 2^(n-1), deterministic jitter, an operator maximum; off by default."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path

import pytest

from services.lifecycle.backoff import jitter_fraction, retry_pause
from services.lifecycle.machine import reconcile
from shared.appwrapper.constants import Phase
from shared.config import ConfigError, load_config
from shared.faulttolerance import FaultTolerance
from tests.unit.test_lifecycle_machine import PARAMS, T0, apply, gone, present, running, verdict

S = timedelta(seconds=1)
BACKOFF = FaultTolerance(retry_pause=10 * S, retry_pause_backoff=True, retry_pause_maximum=100 * S)


def test_off_by_default_the_pause_is_upstreams_fixed_one() -> None:
    assert FaultTolerance().retry_pause_backoff is False
    for attempt in (2, 3, 10):
        assert retry_pause(FaultTolerance(retry_pause=10 * S), "u", attempt) == 10 * S


def test_the_pause_doubles_with_every_reset_up_to_the_maximum() -> None:
    pauses = [retry_pause(BACKOFF, "u", attempt) for attempt in range(2, 8)]
    assert pauses == [10 * S, 20 * S, 40 * S, 80 * S, 100 * S, 100 * S]


def test_the_pause_is_never_below_the_base_even_when_the_base_exceeds_the_maximum() -> None:
    params = dataclasses.replace(BACKOFF, retry_pause=200 * S)
    assert retry_pause(params, "u", 5) == 200 * S


def test_jitter_is_deterministic_per_uid_and_attempt_and_bounded() -> None:
    params = dataclasses.replace(BACKOFF, retry_pause_jitter=0.5, retry_pause_maximum=timedelta(hours=1))
    assert retry_pause(params, "u", 3) == retry_pause(params, "u", 3)
    fractions = {jitter_fraction(f"uid-{i}", 3) for i in range(50)}
    assert len(fractions) == 50 and all(0 <= f < 1 for f in fractions)
    for i in range(50):
        pause = retry_pause(params, f"uid-{i}", 3)
        assert 20 * S <= pause < 30 * S
    assert len({retry_pause(params, f"uid-{i}", 3) for i in range(50)}) > 1


def test_huge_attempt_numbers_do_not_overflow() -> None:
    assert retry_pause(BACKOFF, "u", 2**31 - 1) == 100 * S


def test_the_machine_waits_the_grown_pause_before_the_next_attempt() -> None:
    params = dataclasses.replace(
        PARAMS, retry_pause=10 * S, retry_pause_backoff=True, retry_pause_maximum=100 * S
    )
    aw = running(params=params)
    aw["status"]["attempt"] = 3  # two resets already: the next is the third, 40 s
    aw["status"]["resettingCount"] = 2
    at = T0 + 30 * S
    aw = apply(aw, reconcile(aw, present(), verdict(count=2, at=at), params, at))
    assert aw["status"]["phase"] == Phase.RESETTING and aw["status"]["attempt"] == 4
    plan = reconcile(aw, gone(), None, params, at + 5 * S)
    aw = apply(aw, plan)
    assert plan.requeue_at == at + 40 * S
    plan = reconcile(aw, gone(), None, params, at + 39 * S)
    assert plan.phase == Phase.RESETTING
    plan = reconcile(aw, gone(), None, params, at + 40 * S)
    assert plan.phase == Phase.RESUMING


def test_configuration_keys(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "faultTolerance:\n  retryPauseBackoff: true\n  retryPauseMaximum: 10m\n  retryPauseJitter: 0.25\n"
    )
    ft = load_config(path, env={}).to_fault_tolerance()
    assert ft.retry_pause_backoff is True
    assert ft.retry_pause_maximum == timedelta(minutes=10)
    assert ft.retry_pause_jitter == 0.25
    path.write_text("faultTolerance:\n  retryPauseJitter: 2\n")
    with pytest.raises(ConfigError, match="retryPauseJitter"):
        load_config(path, env={})
