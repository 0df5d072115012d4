"""Turning what arrives on the bus into work: verdicts → reconciles of AppWrappers.

Verdicts come from a durable consumer shared by all replicas (each verdict goes to one replica).
One that can change the phase is applied at once and acked only after the status write it
causes has succeeded; a Healthy one is queued. The latest verdict of each AppWrapper is kept for
the reconciles that follow (:class:`LatestVerdicts`).

Changes of AppWrappers, their components and pods are not taken from the bus: lifecycle's own
watch caches trigger those reconciles (``on_change``, debounced), after the cache has the change,
so that the reconcile reads it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Protocol

from services.lifecycle.verdicts import VerdictUse
from services.lifecycle.workqueue import Key, WorkQueue
from shared.bus import Delivery, TransientError
from shared.kubetime import utcnow
from shared.messages import Verdict

__all__ = ["LatestVerdicts", "ReconcileKey", "Triggers"]

log = logging.getLogger(__name__)


class ReconcileKey(Protocol):
    def __call__(
        self, key: Key, verdict: Verdict | None, *, urgent: bool = False
    ) -> Awaitable[VerdictUse]: ...


class LatestVerdicts:
    """The latest verdict of each AppWrapper, handed to each of its reconciles.

    Verdicts of one AppWrapper arrive in order, but a redelivery can bring back an older one;
    a verdict about a new incarnation (another uid) always replaces the old incarnation's.

    Each is kept as its JSON (with its uid and sequence, which the comparison needs) and read
    back when a reconcile asks: as a model, a verdict with every field set takes about 2 KB of
    small objects, as JSON about 0.6 KB (measured with tracemalloc), and one is kept per
    AppWrapper.
    """

    def __init__(self) -> None:
        self._latest: dict[Key, tuple[str, int, bytes]] = {}

    def offer(self, verdict: Verdict) -> None:
        key = (verdict.ref.namespace, verdict.ref.name)
        known = self._latest.get(key)
        if known is None or known[0] != verdict.ref.uid or known[1] <= verdict.seq:
            self._latest[key] = (verdict.ref.uid, verdict.seq, verdict.model_dump_json().encode())

    def get(self, key: Key) -> Verdict | None:
        known = self._latest.get(key)
        return None if known is None else Verdict.model_validate_json(known[2])

    def forget(self, key: Key) -> None:
        """The AppWrapper is gone."""
        self._latest.pop(key, None)


class Triggers:
    def __init__(
        self,
        *,
        queue: WorkQueue,
        latest: LatestVerdicts,
        reconcile: ReconcileKey,
    ) -> None:
        self.queue = queue
        self.latest = latest
        self.reconcile = reconcile

    async def on_verdict(self, verdict: Verdict, delivery: Delivery) -> None:
        self.latest.offer(verdict)
        key = (verdict.ref.namespace, verdict.ref.name)
        if verdict.state == "Healthy":
            # A Healthy verdict changes at most a condition; it must not wait in line in front of
            # the verdicts that reset or finish workloads (the consumer is sequential). The
            # coalescing workers apply it with the AppWrapper's next reconcile.
            self.queue.enqueue(key)
            return
        started = utcnow()
        use = await self.reconcile(key, verdict, urgent=verdict.state == "Unhealthy")
        log.debug(
            "verdict %s/%s %s seq %d (decided %.0f ms before arrival): %s after %.0f ms",
            key[0],
            key[1],
            verdict.state,
            verdict.seq,
            (started - verdict.decided_at).total_seconds() * 1000,
            use,
            (utcnow() - started).total_seconds() * 1000,
        )
        if use is VerdictUse.HELD:
            # Not applicable yet (e.g. the workload is still being created): keep it unacked.
            raise TransientError(f"verdict for {key[0]}/{key[1]} held", delay=1.0)
