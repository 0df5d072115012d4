"""The keyed work queue of the lifecycle service: which AppWrapper to reconcile next, and when.

Three promises, whatever the number of triggers:

- a key waits in the queue at most once (a burst of triggers for one AppWrapper is one
  reconcile, not a backlog of them);
- keys the ``urgent`` predicate picks (AppWrappers in the middle of a reset) go first;
- a key has at most one timer, the earliest asked for. Every reconcile asks again for every
  deadline still pending (the machine computes them all from the status each time), so the
  later ones are never lost; keeping only the earliest bounds the timers to one per AppWrapper
  however often the resync passes over a long clock (a success TTL of days, say).

Timers are the event loop's own (``loop.call_later``), converted from the wall-clock deadlines
the machine computes with ``clock``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Final

from shared import metrics
from shared.kubetime import utcnow

__all__ = ["OBSERVATION_DEBOUNCE", "Key", "WorkQueue"]

Key = tuple[str, str]  # (namespace, name) of an AppWrapper

# Observations come in bursts (a Job's pods start or go away together): one reconcile a short
# moment after the first, not one per pod.
OBSERVATION_DEBOUNCE: Final = timedelta(milliseconds=200)

QUEUE = metrics.gauge("respawn_lifecycle_queue_depth", "AppWrappers waiting to be reconciled")


class WorkQueue:
    def __init__(
        self,
        *,
        urgent: Callable[[Key], bool] = lambda key: False,
        clock: Callable[[], datetime] = utcnow,
        debounce: timedelta = OBSERVATION_DEBOUNCE,
        accept: Callable[[Key], bool] = lambda key: True,
    ) -> None:
        """``accept``: whether a key is this replica's to reconcile (its share of the partitions,
        docs/scaling.md); others are not queued, and one queued before its partition moved away is
        dropped on the way out."""
        self._urgent = urgent
        self._accept = accept
        self._clock = clock
        self._debounce = debounce
        # (priority, arrival, key); priority 0 for urgent keys, 1 for the rest. A key is queued
        # once, at its best priority (``_queued``); superseded entries are skipped on the way out.
        self._heap: asyncio.PriorityQueue[tuple[int, int, Key]] = asyncio.PriorityQueue()
        self._queued: dict[Key, int] = {}
        self._arrivals = 0
        self._timers: dict[Key, asyncio.TimerHandle] = {}

    def __len__(self) -> int:
        """How many keys wait to be handed out."""
        return len(self._queued)

    def enqueue(self, key: Key) -> None:
        """Queue a reconcile of ``key``; urgent keys go first.

        With thousands of AppWrappers a burst of observations (a mass start, say) can queue a
        reconcile of nearly every one of them. A reset waiting its turn behind them would keep
        a workload down for minutes for a pass that takes milliseconds.
        """
        if not self._accept(key):
            return
        priority = 0 if self._urgent(key) else 1
        queued = self._queued.get(key)
        if queued is None or priority < queued:
            self._queued[key] = priority
            self._arrivals += 1
            self._heap.put_nowait((priority, self._arrivals, key))
            QUEUE.set(len(self._queued))

    async def next_key(self) -> Key:
        """The next key to reconcile, skipping entries superseded by a higher-priority one."""
        while True:
            priority, _, key = await self._heap.get()
            if self._queued.get(key) == priority:
                del self._queued[key]
                QUEUE.set(len(self._queued))
                if self._accept(key):
                    return key

    def requeue_at(self, when: datetime, key: Key) -> None:
        """Queue ``key`` at ``when`` (at once if that has passed), unless it is due earlier already."""
        loop = asyncio.get_running_loop()
        due = loop.time() + max(0.0, (when - self._clock()).total_seconds())
        current = self._timers.get(key)
        if current is not None:
            if current.when() <= due:
                return
            current.cancel()
        self._timers[key] = loop.call_at(due, self._fire, key)

    def debounce(self, key: Key) -> None:
        """Reconcile ``key`` a short moment from now, once however many triggers arrive meanwhile
        (the first trigger's timer is the earliest, so the later ones add nothing)."""
        self.requeue_at(self._clock() + self._debounce, key)

    def scheduled(self, key: Key) -> bool:
        """Whether ``key`` has a timer pending."""
        return key in self._timers

    def close(self) -> None:
        """Cancel every timer (when the service stops)."""
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()

    def _fire(self, key: Key) -> None:
        del self._timers[key]
        self.enqueue(key)
