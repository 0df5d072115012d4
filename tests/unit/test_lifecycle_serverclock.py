"""The API server's clock as lifecycle estimates it: skewed local clocks, latencies, clock steps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.lifecycle import serverclock
from services.lifecycle.serverclock import Bounds, ServerClock, bounds_of, correction

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


class Clocks:
    """The server's true time and a local clock ``skew`` ahead of it."""

    def __init__(self, skew: timedelta) -> None:
        self.server = T0
        self.skew = skew

    def local(self) -> datetime:
        return self.server + self.skew

    def creation(self, latency: timedelta) -> tuple[datetime, datetime, datetime]:
        """(creationTimestamp, sent, received) of a create whose answer takes ``latency``; the
        server stamps it half-way, cut to the second as metav1.Time is."""
        sent = self.local()
        stamped = (self.server + latency / 2).replace(microsecond=0)
        self.server += latency
        return stamped, sent, self.local()


@settings(max_examples=300, deadline=None)
@given(
    skew_ms=st.integers(min_value=-3_600_000, max_value=3_600_000),
    start_ms=st.integers(min_value=0, max_value=999),
    latencies=st.lists(st.integers(min_value=1, max_value=400), min_size=1, max_size=20),
)
def test_the_corrected_clock_is_never_ahead_of_the_server_and_off_by_at_most_a_second_and_a_round_trip(
    skew_ms: int, start_ms: int, latencies: list[int]
) -> None:
    clocks = Clocks(timedelta(milliseconds=skew_ms))
    clocks.server += timedelta(milliseconds=start_ms)
    clock = ServerClock(clocks.local)
    for latency in latencies:
        clock.created(*clocks.creation(timedelta(milliseconds=latency)))
        clocks.server += timedelta(milliseconds=37)
        error = clock.now() - clocks.server
        worst = timedelta(seconds=1) + timedelta(milliseconds=max(latencies))
        if abs(clocks.skew) <= worst:
            # Within what the samples can tell apart: the local clock is used as it is.
            assert abs(error) <= worst
        else:
            assert error <= timedelta(0), "never ahead of the server"
            assert -error <= worst


def test_seven_minutes_either_way_are_corrected_from_one_probe() -> None:
    for skew in (timedelta(minutes=7), timedelta(minutes=-7)):
        clocks = Clocks(skew)
        clock = ServerClock(clocks.local)
        assert clock.now() == clocks.local(), "no sample yet: the local clock"
        clock.created(*clocks.creation(timedelta(milliseconds=20)))
        assert timedelta(0) <= clocks.server - clock.now() <= timedelta(seconds=1, milliseconds=20)


def test_agreeing_clocks_are_left_alone() -> None:
    clocks = Clocks(timedelta(milliseconds=300))
    clock = ServerClock(clocks.local)
    for _ in range(5):
        clock.created(*clocks.creation(timedelta(milliseconds=10)))
    assert clock.offset == timedelta(0)


def test_a_status_write_time_only_bounds_the_offset_from_below() -> None:
    clocks = Clocks(timedelta(minutes=-3))  # local behind: the server wrote a time "in the future"
    clock = ServerClock(clocks.local)
    clock.written_before(clocks.server.replace(microsecond=0), clocks.local())
    assert clock.offset >= timedelta(minutes=3) - timedelta(seconds=1)
    ahead = Clocks(timedelta(minutes=3))
    other = ServerClock(ahead.local)
    other.written_before(ahead.server.replace(microsecond=0), ahead.local())
    assert other.offset == timedelta(0), "a lower bound alone cannot show a clock is ahead"


def test_a_stepped_clock_starts_the_estimate_over() -> None:
    clocks = Clocks(timedelta(minutes=5))
    clock = ServerClock(clocks.local)
    clock.created(*clocks.creation(timedelta(milliseconds=10)))
    assert clock.offset < -timedelta(minutes=4)
    clocks.skew = timedelta(0)  # NTP stepped the local clock back into line
    clock.created(*clocks.creation(timedelta(milliseconds=10)))
    assert clock.offset == timedelta(0)


def test_old_samples_expire() -> None:
    clocks = Clocks(timedelta(minutes=2))
    clock = ServerClock(clocks.local, window=timedelta(minutes=10))
    clock.created(*clocks.creation(timedelta(milliseconds=10)))
    # Eleven minutes later the local clock has drifted 0.6 s further ahead. The old sample
    # still fits the new one, but believing it would put the corrected clock ahead.
    clocks.server += timedelta(minutes=11)
    clocks.skew += timedelta(milliseconds=600)
    clock.created(*clocks.creation(timedelta(milliseconds=10)))
    assert clock.now() <= clocks.server


def test_bounds_combine_by_intersection_and_the_correction_is_the_lower_bound() -> None:
    combined = bounds_of(
        [Bounds(timedelta(seconds=5), timedelta(seconds=9)), Bounds(timedelta(seconds=6), None)]
    )
    assert combined == Bounds(timedelta(seconds=6), timedelta(seconds=9))
    assert correction(combined) == timedelta(seconds=6)
    assert correction(Bounds(timedelta(seconds=-9), timedelta(seconds=-5))) == timedelta(seconds=-9)
    assert correction(Bounds(timedelta(seconds=-1), timedelta(seconds=1))) == timedelta(0)
    assert correction(Bounds()) == timedelta(0)


class NaiveClock:
    """The estimate by its definition: the samples of the window (at most ``limit``, the newest
    kept), intersected afresh for every sample; on a contradiction only the newest is kept."""

    def __init__(self, window: timedelta, limit: int) -> None:
        self.window, self.limit = window, limit
        self.samples: list[Bounds] = []

    def add(self, sample: Bounds) -> Bounds:
        assert sample.at is not None
        self.samples = [s for s in self.samples if s.at is None or s.at >= sample.at - self.window]
        self.samples = [*self.samples, sample][-self.limit :]
        if not bounds_of(self.samples).consistent:
            self.samples = [sample]
        return bounds_of(self.samples)


offsets = st.one_of(st.none(), st.integers(min_value=-5_000, max_value=5_000))


@settings(max_examples=300, deadline=None)
@given(
    samples=st.lists(
        st.tuples(st.integers(min_value=0, max_value=400), offsets, offsets), min_size=1, max_size=60
    ),
    limit=st.integers(min_value=1, max_value=8),
)
def test_the_estimate_is_the_intersection_of_the_samples_in_the_window(
    samples: list[tuple[int, int | None, int | None]], limit: int
) -> None:
    window = timedelta(seconds=60)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(serverclock, "_MAX_SAMPLES", limit)
        clock, naive = ServerClock(lambda: T0, window=window), NaiveClock(window, limit)
        at = T0
        for gap_s, low_ms, high_ms in samples:
            at += timedelta(seconds=gap_s / 10)
            low = None if low_ms is None else timedelta(milliseconds=low_ms)
            high = None if high_ms is None else timedelta(milliseconds=high_ms)
            expected = naive.add(Bounds(low, high, at))
            clock._add(Bounds(low, high, at))
            assert clock.bounds() == expected
            assert clock.offset == correction(expected)
