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
from collections.abc import Awaitable, Callable
from typing import Any

from shared import subjects
from shared.bus import Bus, Consumer
from shared.bus.membership import Membership
from shared.config import ScalingConfig

__all__ = ["Shares", "verdict_durable"]

log = logging.getLogger(__name__)


def verdict_durable(partition: int) -> str:
    return f"lifecycle-verdicts-{partition}"


StartConsumer = Callable[[str, str], Awaitable[Consumer[Any]]]
Moved = Callable[[frozenset[int], frozenset[int]], Awaitable[None]]


class Shares:
    def __init__(
        self,
        bus: Bus,
        scaling: ScalingConfig,
        *,
        start_consumer: StartConsumer,
        moved: Moved,
    ) -> None:
        """``start_consumer(durable, filter_subject)``: bind and start one partition's verdict
        consumer. ``moved(gained, lost)``: what else must follow the share (the caches, a resync)."""
        self.start_consumer = start_consumer
        self.moved = moved
        self.consumers: dict[int, Consumer[Any]] = {}
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
            self.consumers[partition] = await self.start_consumer(
                verdict_durable(partition), subjects.verdict_partition_filter(partition)
            )
        await self.moved(gained, lost)
