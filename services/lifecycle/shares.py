"""This replica's share of the AppWrappers: which partitions it owns, and the verdict consumer of
each (docs/scaling.md).

Each partition has one durable consumer of its verdicts, ``lifecycle-verdicts-<p>``, shared by
whichever replica owns the partition at the time: a partition that moves keeps its place in the
stream, and the verdicts its previous owner had fetched but not handled are nak'ed on the way out
(or, if that owner died, redelivered after the ack wait). Everything else lifecycle does (the
reconciles of pod changes, timers, the resync) is kept to the share by the work queue, which
accepts only keys this replica owns.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from shared import subjects
from shared.bus import Bus, Consumer, Handler
from shared.bus.membership import Membership
from shared.config import ScalingConfig
from shared.messages import Verdict

__all__ = ["Shares"]

log = logging.getLogger(__name__)


Moved = Callable[[frozenset[int], frozenset[int]], Awaitable[None]]


class Shares:
    def __init__(
        self,
        bus: Bus,
        scaling: ScalingConfig,
        *,
        on_verdict: Handler[Verdict],
        consumer_options: Mapping[str, Any],
        moved: Moved,
    ) -> None:
        """``on_verdict`` handles each partition's verdicts, with ``consumer_options`` for
        :meth:`~shared.bus.Bus.consume`. ``moved(gained, lost)``: what else must follow the share
        (the caches, a resync)."""
        self.bus = bus
        self.on_verdict = on_verdict
        self.consumer_options = dict(consumer_options)
        self.moved = moved
        self.consumers: dict[int, Consumer[Verdict]] = {}
        self.membership = Membership(
            bus,
            "lifecycle",
            partitions=subjects.partitions(),
            heartbeat=scaling.heartbeat.total_seconds(),
            ttl=scaling.member_ttl.total_seconds(),
            on_change=self._changed,
        )

    def owns(self, key: tuple[str, str]) -> bool:
        return self.membership.owns(*key)

    def ready(self) -> bool:
        return self.membership.settled and all(c.running for c in self.consumers.values())

    async def run(self) -> None:
        try:
            await self.membership.run()
        finally:
            await asyncio.gather(*(c.stop() for c in self.consumers.values()), return_exceptions=True)
            self.consumers.clear()

    async def _changed(self, previous: frozenset[int], current: frozenset[int]) -> None:
        lost, gained = previous - current, current - previous
        stopping = [self.consumers.pop(p) for p in sorted(lost) if p in self.consumers]
        await asyncio.gather(*(c.stop() for c in stopping), return_exceptions=True)
        for partition in sorted(gained):
            self.consumers[partition] = await self.bus.consume(
                subjects.VERDICTS_STREAM,
                subjects.lifecycle_verdict_durable(partition),
                subjects.verdict_partition_filter(partition),
                Verdict,
                self.on_verdict,
                **self.consumer_options,
            )
        await self.moved(gained, lost)
