"""autopilot: verdicts → node quarantine. The I/O around the pure logic in quarantine.py.

The autopilot service (service.py) owns this: it runs one replay of the verdict stream for it,
hands it the stored quarantine verdict, and tells it when the replays are done and whether this
replica is the active one. Where its state comes from after a restart or a failover
(docs/autopilot.md, "Node quarantine"):

- the counts are rebuilt from the verdict stream, replayed from one ``window`` back (JetStream
  keeps verdicts far longer; older ones cannot count anyway);
- the quarantine entries are those of the last stored quarantine verdict (the node verdict of
  :data:`~shared.messages.QUARANTINE_RESOURCE`), adopted as they are: a failover neither ends
  nor extends a quarantine, and a standby that follows the stored verdicts is current when it
  takes over.

Only the active replica publishes; every replica counts, so its metrics move on all of them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta

from services.autopilot.marks import NodeMarks, NodeState, due_marks, mark_patch
from services.autopilot.quarantine import (
    DRY_RUN,
    HELD,
    QUARANTINED,
    RELEASED,
    QuarantineBook,
    QuarantinePolicy,
    adopt,
    blamed_nodes,
    entries_of,
    failure_counts,
    quarantine_verdict,
    record,
    settle,
)
from shared import metrics, subjects
from shared.bus import Bus, Delivery, TransientError
from shared.config import NodeQuarantineConfig
from shared.kube import Kube, ResourceRef
from shared.kubetime import as_utc, utcnow
from shared.messages import NodeVerdict, QuarantinedNode, Verdict

log = logging.getLogger(__name__)

QUARANTINE_NODES = metrics.gauge(
    "respawn_autopilot_quarantined_nodes",
    "Nodes in the node quarantine, by state (Quarantined, DryRun, Held)",
    ["state"],
)
NODE_FAILURES = metrics.gauge(
    "respawn_autopilot_node_failures",
    "Infrastructure faults blamed on a node within the quarantine window (nodes with none have no series)",
    ["node"],
)
FAULTS_COUNTED = metrics.counter(
    "respawn_autopilot_infrastructure_faults",
    "Infrastructure faults counted against nodes (one per node and AppWrapper attempt), on every replica",
)
QUARANTINE_VERDICTS = metrics.counter(
    "respawn_autopilot_quarantine_verdicts", "Quarantine verdicts published by this replica"
)

MARK_FAILURES = metrics.counter(
    "respawn_autopilot_node_mark_failures",
    "Quarantine labels or taints that could not be written on or removed from a Node (tried again)",
)

STATES = (QUARANTINED, DRY_RUN, HELD)
NODES = ResourceRef("", "v1", "nodes", "Node", namespaced=False)
# A mark written is seen in the node's next observation; until then (or after a failure) it is
# not written again for this long.
MARK_RETRY = 10.0


def quarantine_msg_id(verdict: NodeVerdict) -> str:
    """The same for every replica that publishes these entries. Entries carry their times, so
    the same content twice is the same decision (nothing to lose by dropping the repeat)."""
    body = json.dumps([e.model_dump(mode="json") for e in verdict.quarantine], separators=(",", ":"))
    return f"quarantine:{hashlib.sha256(body.encode()).hexdigest()[:24]}"


def describe(entry: QuarantinedNode) -> str:
    why = f"{entry.failures} infrastructure faults in {', '.join(entry.workloads) or '-'}"
    if entry.state == QUARANTINED:
        return f"node {entry.node} quarantined until {entry.until}: {why}"
    if entry.state == DRY_RUN:
        return f"node {entry.node} would be quarantined until {entry.until} (dry run): {why}"
    if entry.state == HELD:
        return f"node {entry.node} is due for quarantine but the cap is reached: {why}"
    return f"node {entry.node} released from quarantine"


class Quarantining:
    def __init__(
        self,
        bus: Bus,
        config: NodeQuarantineConfig,
        *,
        active: Callable[[], bool],
        node_count: Callable[[], int],
        node_states: Callable[[], Mapping[str, NodeState]] = dict,
        kube: Kube | None = None,
    ) -> None:
        self.bus = bus
        self.enabled = config.enabled
        self.policy = QuarantinePolicy.from_config(config)
        self.active = active
        self.node_count = node_count
        self.book = QuarantineBook()
        # The last stored quarantine verdict, whoever published it, and its stream sequence.
        self.published: NodeVerdict | None = None
        self.published_seq = 0
        self.caught_up = False
        self._failure_nodes: set[str] = set()
        self.marks = NodeMarks(label=config.node_label, taint=config.node_taint)
        self.node_states = node_states
        self.kube = kube
        # Node -> (added or removed, when): the marks written and not yet seen in an observation.
        self._marking: dict[str, tuple[bool, float]] = {}

    def replay_from(self, now: datetime) -> datetime:
        """Where the replay of the verdict stream starts: older verdicts cannot count."""
        return now - self.policy.window - timedelta(seconds=1)

    # ------------------------------------------------------------------ inputs (under the service's lock)

    def on_stored(self, verdict: NodeVerdict, delivery: Delivery) -> None:
        """A stored quarantine verdict. Adopted while replaying and while standby; the active
        replica's own book is ahead of what it published, so it keeps it."""
        if delivery.stream_seq <= self.published_seq:
            return
        self.published, self.published_seq = verdict, delivery.stream_seq
        if not self.caught_up or not self.active():
            self.book = adopt(self.book, verdict.quarantine)
            self.update_gauges()

    async def on_verdict(self, verdict: Verdict, delivery: Delivery) -> None:
        if not self.enabled or not blamed_nodes(verdict):
            return
        now = min(as_utc(verdict.decided_at), utcnow())
        before = self.book
        recorded = record(before, verdict, self.policy, now)
        if recorded is before:
            return  # counted already, or too old to count
        FAULTS_COUNTED.inc(len(recorded.counted) - len(before.counted))
        if not self.caught_up:
            # Decided once everything is replayed (catch_up), with the nodes and the stored entries known.
            self.book = recorded
        else:
            after = settle(recorded, self.policy, now, self.node_count())
            if after.entries != before.entries and self.active():
                # Publish before keeping: a failed publish is retried with the redelivered verdict.
                await self.publish(after, now, raise_transient=True)
            self.book = after
            self.log_changes(before, after)
        self.update_gauges()

    async def catch_up(self) -> None:
        """The replays are done: decide at once, and publish if active. Also clears a stored
        quarantine when quarantine is turned off, so no node stays kept off from an earlier run."""
        now = utcnow()
        before = self.book
        if self.enabled:
            self.book = settle(before, self.policy, now, self.node_count())
        else:
            self.book = QuarantineBook()
        self.caught_up = True
        self.log_changes(before, self.book)
        await self.publish_due(now)
        self.update_gauges()

    async def take_over(self) -> None:
        await self.publish_due(utcnow())

    async def tick(self) -> None:
        """Move to now: quarantines that ran out end, held nodes take freed places; the marks on
        the nodes follow."""
        if not self.caught_up:
            return
        if self.enabled:
            await self.settle_now()
        await self.mark_nodes()

    async def settle_now(self) -> None:
        now = utcnow()
        before = self.book
        after = settle(before, self.policy, now, self.node_count())
        if after.entries != before.entries and self.active():
            try:
                await self.publish(after, now, raise_transient=False)
            except Exception as exc:  # tried again on the next tick
                log.warning("publishing the quarantine verdict failed: %s", exc)
                return
        self.book = after
        self.log_changes(before, after)
        self.update_gauges()

    async def mark_nodes(self) -> None:
        """Write or remove the label/taint of the nodes whose marks differ from the quarantine
        (the active replica only)."""
        if not self.marks or self.kube is None or not self.active():
            return
        now = time.monotonic()
        for node, add in due_marks(self.marks, self.book.quarantined(), self.node_states()):
            tried = self._marking.get(node)
            if tried is not None and tried[0] == add and now - tried[1] < MARK_RETRY:
                continue
            self._marking[node] = (add, now)
            try:
                current = await self.kube.request("GET", NODES.path(None, node))
                await self.kube.patch(NODES, node, mark_patch(self.marks, current, add))
            except Exception as exc:  # tried again after MARK_RETRY
                MARK_FAILURES.inc()
                log.warning(
                    "node %s: %s the quarantine marks failed: %s", node, "adding" if add else "removing", exc
                )
                continue
            log.info("node %s: quarantine marks %s", node, "added" if add else "removed")

    # ------------------------------------------------------------------ output

    def due(self) -> bool:
        stored = self.published.quarantine if self.published is not None else ()
        return stored != entries_of(self.book)

    async def publish_due(self, now: datetime) -> None:
        if self.active() and self.due():
            await self.publish(self.book, now, raise_transient=False)

    async def publish(self, book: QuarantineBook, now: datetime, *, raise_transient: bool) -> None:
        verdict = quarantine_verdict(book, now)
        if self.published is not None and as_utc(self.published.decided_at) > as_utc(now):
            # Consumers drop a verdict older than the one they hold.
            verdict = verdict.model_copy(update={"decided_at": as_utc(self.published.decided_at)})
        try:
            stored = await self.bus.publish(
                subjects.node_verdict(verdict.resource), verdict, msg_id=quarantine_msg_id(verdict)
            )
        except Exception as exc:
            if raise_transient:
                raise TransientError(f"publishing the quarantine verdict failed: {exc}") from exc
            raise
        QUARANTINE_VERDICTS.inc()
        self.published, self.published_seq = verdict, max(self.published_seq, stored.seq)
        log.info(
            "quarantine: %s",
            ", ".join(f"{e.node} {e.state}" for e in verdict.quarantine) or "no node",
        )

    def log_changes(self, before: QuarantineBook, after: QuarantineBook) -> None:
        for node in sorted(set(before.entries) | set(after.entries)):
            old, new = before.entries.get(node), after.entries.get(node)
            if new is not None and (old is None or old.state != new.state):
                if new.state == HELD:
                    log.warning("%s", describe(new))
                else:
                    log.info("%s", describe(new))
            elif new is None and old is not None and old.state != RELEASED:
                log.info("node %s no longer due for quarantine", node)

    def update_gauges(self) -> None:
        states: list[str] = [e.state for e in self.book.entries.values()]
        for state in STATES:
            QUARANTINE_NODES.labels(state=state).set(states.count(state))
        counts = failure_counts(self.book)
        for node in self._failure_nodes - set(counts):
            # Bounded by the nodes with a fault in the window: a node leaves once it has none.
            NODE_FAILURES.remove(node)
        for node, count in counts.items():
            NODE_FAILURES.labels(node=node).set(count)
        self._failure_nodes = set(counts)
