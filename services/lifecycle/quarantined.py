"""The nodes Autopilot quarantined (docs/autopilot.md, "Node quarantine"), followed from the bus.

Autopilot publishes them as the NoSchedule set of the node verdict of the pseudo-resource
``respawn.dev/quarantine``. Lifecycle keeps the latest one in memory and keeps every pod it
creates or recreates off those nodes (hooks.py), whatever resources the pod uses: a node that
keeps failing workloads is bad for all of them.
"""

from __future__ import annotations

import asyncio
import logging

from shared import metrics, subjects
from shared.bus import Bus, Delivery, Replay, replay_consumer_name
from shared.kubetime import as_utc
from shared.messages import QUARANTINE_RESOURCE, NodeVerdict

log = logging.getLogger(__name__)

QUARANTINED = metrics.gauge(
    "respawn_lifecycle_quarantined_nodes",
    "Quarantined nodes that new pods are kept off (as this replica knows)",
)


class QuarantinedNodes:
    """The latest quarantine verdict's NoSchedule set, and a replay that keeps it current."""

    def __init__(self) -> None:
        self.nodes: frozenset[str] = frozenset()
        self._latest: NodeVerdict | None = None
        self._replay: Replay[NodeVerdict] | None = None

    def apply(self, verdict: NodeVerdict) -> None:
        """Keep ``verdict`` unless an newer one is already held (decided_at never goes back)."""
        if verdict.resource != QUARANTINE_RESOURCE:
            return
        if self._latest is not None and as_utc(verdict.decided_at) < as_utc(self._latest.decided_at):
            return
        if frozenset(verdict.no_schedule) != self.nodes:
            log.info("quarantined nodes: %s", ", ".join(verdict.no_schedule) or "none")
        self._latest = verdict
        self.nodes = frozenset(verdict.no_schedule)
        QUARANTINED.set(len(self.nodes))

    async def _on_verdict(self, verdict: NodeVerdict, delivery: Delivery) -> None:
        self.apply(verdict)

    async def run(self, bus: Bus) -> None:
        """Replay the stored quarantine verdict and follow the next ones (never returns)."""
        self._replay = await bus.replay(
            subjects.NODE_VERDICTS_STREAM,
            replay_consumer_name("lifecycle-quarantine"),
            subjects.node_verdict(QUARANTINE_RESOURCE),
            NodeVerdict,
            self._on_verdict,
            last_per_subject=True,
        )
        try:
            await (self._replay.task or asyncio.Event().wait())
        finally:
            await self._replay.stop(grace=2.0)
            self._replay = None
