"""The API server's clock, as lifecycle's decisions need it.

Every time lifecycle writes into a status (a condition's ``lastTransitionTime``: the start of an
attempt, of a deletion, of a failure) is later compared with times the API server wrote: health
tells an attempt's pods from the previous attempt's by comparing their ``creationTimestamp`` with
the attempt's start. A lifecycle whose clock runs minutes ahead would write an attempt start
after its own pods were created, and health would ignore their failures; one running behind
would let the previous attempt's failed pods count against the new one. So ``now`` is the
server's time, estimated from the server's own timestamps:

- an object created between two readings of the local clock (``sent``, ``received``) carries a
  ``creationTimestamp`` ``C``, the server's time at creation cut to the second; the offset
  (server minus local) therefore lies in ``[C - received, C + 1s - sent]``. Lifecycle creates
  Events and components all the time, and probes with a dry-run create (which sets the
  timestamp and stores nothing) when it starts and every resync period;
- a timestamp the server wrote before ``received`` (e.g. the managedFields time of a status
  write) bounds the offset from below only.

The estimate is the intersection of the intervals seen within :data:`WINDOW`. When the local
clock lies within it (the clocks agree to within a second plus a round trip), it is used as it
is. Otherwise the correction is the interval's lower bound: the corrected clock is then never
ahead of the server's. Erring early is what keeps health right: an attempt start written a
second early still precedes its pods' creation (a reset leaves seconds between attempts, so no
earlier pod gains), while one written a second late would disown the pods created in that second.
Samples that contradict each other (a clock was stepped) are dropped, all but the newest.
Without samples the local clock is used as it is.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from shared import metrics
from shared.kubetime import as_utc, utcnow

__all__ = ["WINDOW", "Bounds", "ServerClock", "bounds_of", "correction"]

# How long a sample is believed (clocks drift; an NTP step makes old samples wrong).
WINDOW: Final = timedelta(minutes=10)
# More samples than that add nothing: the intersection is as tight as the best of them.
_MAX_SAMPLES: Final = 256
_SECOND: Final = timedelta(seconds=1)

OFFSET = metrics.gauge(
    "respawn_lifecycle_clock_correction_seconds",
    "What lifecycle adds to its local clock to read the API server's time",
)


@dataclass(frozen=True, slots=True)
class Bounds:
    """What is known of the offset (server time minus local time); None: unbounded."""

    low: timedelta | None = None
    high: timedelta | None = None
    # Local time the sample was taken (for the window).
    at: datetime | None = None

    @property
    def consistent(self) -> bool:
        return self.low is None or self.high is None or self.low <= self.high


def bounds_of(samples: Iterable[Bounds]) -> Bounds:
    """The intersection of ``samples``."""
    low: timedelta | None = None
    high: timedelta | None = None
    for sample in samples:
        if sample.low is not None:
            low = sample.low if low is None else max(low, sample.low)
        if sample.high is not None:
            high = sample.high if high is None else min(high, sample.high)
    return Bounds(low, high)


def correction(bounds: Bounds) -> timedelta:
    """What to add to the local clock: nothing when the bounds allow it as it is, else their
    lower bound (so that the corrected clock is never ahead of the server's)."""
    low, high = bounds.low, bounds.high
    if (low is None or low <= timedelta(0)) and (high is None or high >= timedelta(0)):
        return timedelta(0)
    if low is not None:
        return low
    # Only an upper bound, below zero (cannot happen with creation samples, which bound both
    # sides): the local clock is ahead by at least that much.
    assert high is not None
    return high


class ServerClock:
    def __init__(self, local: Callable[[], datetime] = utcnow, *, window: timedelta = WINDOW) -> None:
        """``local``: the process's own clock (injected: tests skew it)."""
        self.local = local
        self.window = window
        # The samples within the window, oldest first, each by its number and when it was taken.
        self._samples: deque[tuple[int, datetime | None]] = deque()
        # The largest lower bound and the smallest upper bound among them, as monotonic queues
        # (the front is the answer; a bound that a newer, tighter one outranks is dropped): a
        # sample costs O(1), where intersecting every sample held on each one was a visible share
        # of lifecycle's CPU (it takes a sample from every create and status write).
        self._lows: deque[tuple[int, timedelta]] = deque()
        self._highs: deque[tuple[int, timedelta]] = deque()
        self._numbers = 0
        self._correction = timedelta(0)

    def now(self) -> datetime:
        """The server's time, as well as it is known."""
        return as_utc(self.local()) + self._correction

    @property
    def offset(self) -> timedelta:
        """What is added to the local clock."""
        return self._correction

    def bounds(self) -> Bounds:
        """The intersection of the samples held (:func:`bounds_of` of them)."""
        return Bounds(self._lows[0][1] if self._lows else None, self._highs[0][1] if self._highs else None)

    def created(self, created_at: datetime | None, sent: datetime, received: datetime) -> None:
        """An object the server created between ``sent`` and ``received`` (local times) has
        ``creationTimestamp`` ``created_at``."""
        if created_at is None:
            return
        server = as_utc(created_at)
        self._add(Bounds(server - as_utc(received), server + _SECOND - as_utc(sent), as_utc(received)))

    def written_before(self, server_time: datetime | None, received: datetime) -> None:
        """The server wrote ``server_time`` before the local time ``received``."""
        if server_time is None:
            return
        self._add(Bounds(as_utc(server_time) - as_utc(received), None, as_utc(received)))

    def _add(self, sample: Bounds) -> None:
        horizon = sample.at - self.window if sample.at is not None else None
        while self._samples and horizon is not None and (self._samples[0][1] or horizon) < horizon:
            self._drop_oldest()
        self._push(sample)
        if len(self._samples) > _MAX_SAMPLES:
            self._drop_oldest()
        combined = self.bounds()
        if not combined.consistent:
            # Contradicting samples: a clock was stepped since the older ones. Start over.
            self._samples.clear()
            self._lows.clear()
            self._highs.clear()
            self._push(sample)
            combined = self.bounds()
        self._correction = correction(combined)
        OFFSET.set(self._correction.total_seconds())

    def _push(self, sample: Bounds) -> None:
        number = self._numbers
        self._numbers += 1
        self._samples.append((number, sample.at))
        if sample.low is not None:
            while self._lows and self._lows[-1][1] <= sample.low:
                self._lows.pop()
            self._lows.append((number, sample.low))
        if sample.high is not None:
            while self._highs and self._highs[-1][1] >= sample.high:
                self._highs.pop()
            self._highs.append((number, sample.high))

    def _drop_oldest(self) -> None:
        number, _ = self._samples.popleft()
        for bounds in (self._lows, self._highs):
            while bounds and bounds[0][0] <= number:
                bounds.popleft()
