"""The nodes Autopilot quarantined (docs/autopilot.md, "Node quarantine"), followed from the bus.

Autopilot publishes them as the NoSchedule set of the node verdict of the pseudo-resource
``respawn.dev/quarantine``. Lifecycle keeps the latest one in memory and keeps every pod it
creates or recreates off those nodes (hooks.py), whatever resources the pod uses: a node that
keeps failing workloads is bad for all of them.

Autopilot ends a quarantine on time by publishing the next verdict. While no autopilot runs
(every replica down, or scaled to zero), nobody does: a node would stay avoided past its
quarantine's end for as long as that lasts. So a node whose entry says its quarantine has ended
(``until`` passed) is not avoided any more, whatever the last verdict's set says.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime

from shared import metrics, subjects
from shared.bus import Bus, Delivery, Replay, replay_consumer_name
from shared.kubetime import as_utc
from shared.messages import QUARANTINE_RESOURCE, NodeVerdict

log = logging.getLogger(__name__)

QUARANTINED = metrics.gauge(
    "respawn_lifecycle_quarantined_nodes",
    "Quarantined nodes of the last quarantine verdict (new pods keep off them until each one's end)",
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

    def in_force(self, now: datetime | None) -> frozenset[str]:
        """The nodes new pods keep off at ``now``: the verdict's set, less those whose quarantine
        ended before ``now`` by their entry (None: all of the set)."""
        if now is None or self._latest is None or not self.nodes:
            return self.nodes
        ended = {
            entry.node
            for entry in self._latest.quarantine
            if entry.state == "Quarantined" and entry.until is not None and as_utc(entry.until) <= as_utc(now)
        }
        return self.nodes - ended

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
