"""The periodic resync: every AppWrapper with work or a clock pending is reconciled now and then.

Timers live in one replica's memory; a replica that dies with timers pending would lose them.
Another replica's resync picks the work up, so nothing waits longer than a resync period. Which
AppWrappers that is, is the phase policy's to say (:func:`services.lifecycle.machine.needs_attention`),
including those with announcements owed by a replica that died after a status write.

What a round goes through is given to it (``appwrappers``): in the service, the AppWrapper cache,
and a LIST only while the cache has not synced (see ``Lifecycle.resync_source``). A round never
fails the service: a source that fails (a LIST's API error, or a page the client cannot read,
e.g. one holding an object nested too deeply for its JSON parser) is logged and counted, the
AppWrappers it gave so far are queued, and the next round tries again. An AppWrapper that
cannot be judged is logged and skipped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterable, Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from services.lifecycle.machine import needs_attention
from services.lifecycle.workqueue import Key
from shared import metrics
from shared.kube import KubeApiError
from shared.kubetime import utcnow

__all__ = ["Resync"]

log = logging.getLogger(__name__)

# Every AppWrapper to consider, one after another.
AppWrappers = Callable[[], AsyncIterable[Mapping[str, Any]]]

FAILED_ROUNDS = metrics.counter(
    "respawn_lifecycle_resync_failures",
    "Resync rounds cut short (the next round tries again), by error type",
    ["error"],
)


class Resync:
    def __init__(
        self,
        appwrappers: AppWrappers,
        enqueue: Callable[[Key], None],
        *,
        period: timedelta,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        """``appwrappers``: every AppWrapper this replica looks after, one by one (a LIST of
        10,000 whole AppWrappers parsed at once would set the process's peak memory every
        period: a LIST is read page by page)."""
        self.appwrappers = appwrappers
        self.enqueue = enqueue
        self.period = period
        self.clock = clock

    async def once(self) -> None:
        """Queue every AppWrapper that needs attention (a failed LIST waits for the next period)."""
        now = self.clock()
        try:
            async for aw in self.appwrappers():
                self._consider(aw, now)
        except KubeApiError as exc:
            FAILED_ROUNDS.labels(error="KubeApiError").inc()
            log.warning("resync list failed: %s", exc)
        except Exception as exc:  # e.g. RecursionError: a page the client cannot decode
            FAILED_ROUNDS.labels(error=type(exc).__name__).inc()
            log.error(
                "resync list failed (%s: %s); the AppWrappers read so far are queued, "
                "the next round tries again",
                type(exc).__name__,
                exc,
            )

    def _consider(self, aw: Any, now: datetime) -> None:
        meta = aw.get("metadata") if isinstance(aw, Mapping) else None
        if not isinstance(meta, Mapping):
            log.warning("resync: skipping a listed AppWrapper without metadata")
            return
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        try:
            if needs_attention(aw, now):
                self.enqueue(key)
        except Exception as exc:  # a bug judging one object must not skip the others
            log.exception("resync: cannot judge AppWrapper %s/%s (%s); queued to be sure", *key, exc)
            self.enqueue(key)

    async def run(self) -> None:
        """Resync now and every period (never returns; cancel it to stop)."""
        while True:
            await self.once()
            await asyncio.sleep(self.period.total_seconds())
