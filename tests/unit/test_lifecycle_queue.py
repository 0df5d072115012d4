"""Lifecycle's reconcile queue: each AppWrapper once, and resets under way first."""

from __future__ import annotations

import asyncio

from opentelemetry import context as otel_context

from services.lifecycle.service import Lifecycle


def service() -> Lifecycle:
    # Only what the queue uses: no runtime, no bus, no API server.
    svc = Lifecycle.__new__(Lifecycle)
    svc.queue = asyncio.PriorityQueue()
    svc.queued = {}
    svc.arrivals = 0
    svc.incidents = {}
    return svc


async def drain(svc: Lifecycle) -> list[tuple[str, str]]:
    keys = []
    while svc.queued:
        keys.append(await asyncio.wait_for(svc.next_key(), timeout=1.0))
    return keys


async def test_keys_come_out_in_arrival_order_once_each() -> None:
    svc = service()
    for name in ("a", "b", "a", "c", "b"):
        svc.enqueue(("ns", name))
    assert await drain(svc) == [("ns", "a"), ("ns", "b"), ("ns", "c")]
    assert svc.queue.empty()


async def test_a_reset_under_way_jumps_the_backlog() -> None:
    svc = service()
    for i in range(100):
        svc.enqueue(("ns", f"backlog-{i}"))
    svc.incidents[("ns", "resetting")] = otel_context.get_current()
    svc.enqueue(("ns", "resetting"))
    keys = await drain(svc)
    assert keys[0] == ("ns", "resetting")
    assert len(keys) == 101


async def test_a_queued_key_that_starts_a_reset_is_moved_up_not_reconciled_twice() -> None:
    svc = service()
    for name in ("a", "b", "c"):
        svc.enqueue(("ns", name))
    svc.incidents[("ns", "c")] = otel_context.get_current()
    svc.enqueue(("ns", "c"))
    keys = await drain(svc)
    assert keys == [("ns", "c"), ("ns", "a"), ("ns", "b")]
    # c's superseded entry is still in the heap; the next worker skips it.
    svc.enqueue(("ns", "d"))
    assert await drain(svc) == [("ns", "d")]
    assert svc.queue.empty()
    # Queued again after it was handed out: reconciled again (that pass may have missed a change).
    svc.enqueue(("ns", "c"))
    assert await drain(svc) == [("ns", "c")]
