"""The periodic resync: every AppWrapper with work or a clock pending is reconciled now and then.

Timers live in one replica's memory; a replica that dies with timers pending would lose them.
Another replica's resync picks the work up, so nothing waits longer than a resync period. Which
AppWrappers that is, is the phase policy's to say (:func:`services.lifecycle.machine.needs_attention`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterable, Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from services.lifecycle.machine import needs_attention
from services.lifecycle.workqueue import Key
from shared.kube import KubeApiError

__all__ = ["Resync"]

log = logging.getLogger(__name__)

Pages = Callable[[], AsyncIterable[Sequence[Mapping[str, Any]]]]


class Resync:
    def __init__(self, pages: Pages, enqueue: Callable[[Key], None], *, period: timedelta) -> None:
        """``pages``: a LIST of every AppWrapper, page by page (a LIST of 10,000 whole
        AppWrappers, templates included, parsed at once would set the process's peak memory
        every period)."""
        self.pages = pages
        self.enqueue = enqueue
        self.period = period

    async def once(self) -> None:
        """Queue every AppWrapper that needs attention (a failed LIST waits for the next period)."""
        try:
            async for page in self.pages():
                for aw in page:
                    if needs_attention(aw):
                        meta = aw.get("metadata") or {}
                        self.enqueue((meta.get("namespace", ""), meta.get("name", "")))
        except KubeApiError as exc:
            log.warning("resync list failed: %s", exc)

    async def run(self) -> None:
        """Resync now and every period (never returns; cancel it to stop)."""
        while True:
            await self.once()
            await asyncio.sleep(self.period.total_seconds())
