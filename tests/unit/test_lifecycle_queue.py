"""Lifecycle's work queue: each AppWrapper once, resets under way first, one timer per AppWrapper."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from services.lifecycle.workqueue import Key, WorkQueue

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def queue(resetting: set[Key] | None = None) -> WorkQueue:
    # A fixed clock: deadlines are then exact offsets from now on the event loop's own clock.
    urgent = resetting if resetting is not None else set()
    return WorkQueue(urgent=urgent.__contains__, clock=lambda: T0, debounce=timedelta(0))


async def drain(q: WorkQueue) -> list[Key]:
    keys = []
    while len(q):
        keys.append(await asyncio.wait_for(q.next_key(), timeout=1.0))
    return keys


async def test_keys_come_out_in_arrival_order_once_each() -> None:
    q = queue()
    for name in ("a", "b", "a", "c", "b"):
        q.enqueue(("ns", name))
    assert await drain(q) == [("ns", "a"), ("ns", "b"), ("ns", "c")]
    assert len(q) == 0


async def test_a_reset_under_way_jumps_the_backlog() -> None:
    resetting: set[Key] = set()
    q = queue(resetting)
    for i in range(100):
        q.enqueue(("ns", f"backlog-{i}"))
    resetting.add(("ns", "resetting"))
    q.enqueue(("ns", "resetting"))
    keys = await drain(q)
    assert keys[0] == ("ns", "resetting")
    assert len(keys) == 101


async def test_a_queued_key_that_starts_a_reset_is_moved_up_not_reconciled_twice() -> None:
    resetting: set[Key] = set()
    q = queue(resetting)
    for name in ("a", "b", "c"):
        q.enqueue(("ns", name))
    resetting.add(("ns", "c"))
    q.enqueue(("ns", "c"))
    keys = await drain(q)
    assert keys == [("ns", "c"), ("ns", "a"), ("ns", "b")]
    # c's superseded entry is still in the heap; the next worker skips it.
    q.enqueue(("ns", "d"))
    assert await drain(q) == [("ns", "d")]
    # Queued again after it was handed out: reconciled again (that pass may have missed a change).
    q.enqueue(("ns", "c"))
    assert await drain(q) == [("ns", "c")]


async def test_a_deadline_that_has_passed_queues_the_key_at_once() -> None:
    q = queue()
    q.requeue_at(T0 - timedelta(seconds=5), ("ns", "a"))
    assert await asyncio.wait_for(q.next_key(), timeout=1.0) == ("ns", "a")
    assert not q.scheduled(("ns", "a"))


async def test_the_earliest_deadline_wins_and_a_later_one_never_delays_it() -> None:
    q = queue()
    key = ("ns", "a")
    q.requeue_at(T0 + timedelta(hours=1), key)
    q.requeue_at(T0, key)  # earlier: replaces the hour
    q.requeue_at(T0 + timedelta(days=1), key)  # later: the next reconcile asks for it again
    assert await asyncio.wait_for(q.next_key(), timeout=1.0) == key
    assert not q.scheduled(key), "one timer per key: the replaced ones are gone"


async def test_a_burst_of_triggers_is_one_reconcile() -> None:
    q = WorkQueue(clock=lambda: T0, debounce=timedelta(milliseconds=50))
    key = ("ns", "a")
    for _ in range(10):
        q.debounce(key)
    assert await asyncio.wait_for(q.next_key(), timeout=1.0) == key
    assert len(q) == 0 and not q.scheduled(key)


async def test_close_cancels_every_timer() -> None:
    q = queue()
    q.requeue_at(T0 + timedelta(hours=1), ("ns", "a"))
    q.close()
    assert not q.scheduled(("ns", "a"))
