"""The watch's reconnect delays (shared.kube.watch.Backoff): growing, capped, jittered, reset when healthy."""

from __future__ import annotations

import pytest

from shared.kube.watch import Backoff


@pytest.mark.parametrize(("base", "cap"), [(0.2, 10.0), (1.0, 5.0)])
def test_each_delay_is_between_half_and_all_of_the_capped_exponential(base: float, cap: float) -> None:
    for _ in range(50):  # the jitter is random: many runs, the bounds must always hold
        backoff = Backoff(base=base, cap=cap)
        for attempt in range(12):
            full = min(cap, base * 2**attempt)
            assert full / 2 <= backoff.next() <= full


def test_the_delays_start_over_after_a_reset() -> None:
    backoff = Backoff(base=1.0, cap=100.0)
    for _ in range(6):
        backoff.next()
    assert backoff.attempt == 6
    backoff.reset()
    assert backoff.attempt == 0
    assert 0.5 <= backoff.next() <= 1.0
