"""autopilot: node observations → node verdicts. A thin loop around the pure logic in nodes.py.

Each replica replays the node subjects of the observation stream into memory with its own
consumer. The stream keeps only the latest message per node, so the replay is the present state
of every node, not its history. Once the replay is done the replica compares what it found with
the last verdict stored for each resource and publishes the resources that differ: a node that
recovered while no autopilot was running is cleared then. From there on, every observation that
moves a node between sets publishes the complete sets of that resource.

Replicas are active/standby (docs/autopilot.md, "Replicas"): they join the group ``autopilot`` of
:class:`~shared.bus.membership.Membership` with one partition, and the replica that owns it
publishes. The others replay the node observations and follow the node verdicts as the active one
does, so their state is warm, and publish nothing; the one that takes the partition over (its
owner died or left) compares what it knows with the last verdicts stored and publishes what
differs at once.

Verdicts carry a JetStream ``Nats-Msg-Id`` (so that two replicas that both believe they are
active, for the moment a partition takes to move, store each change once): the id names the
resource, the observation that caused the change (its stream sequence, the same for every replica)
and a digest of the sets. The cause is part of the id because sets can return to an earlier value
(a node goes bad, recovers, goes bad again within the duplicate window); an id made of the sets
alone would have JetStream drop the third verdict as a repeat of the first.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from services.autopilot.nodes import NodeHealthState, ResourceNodes, apply, verdicts
from services.autopilot.nodestate import LostNodes, expire, node_state_verdict, observe
from services.autopilot.quarantining import Quarantining
from shared import metrics, subjects
from shared.bus import Delivery, Replay, TransientError, replay_consumer_name, until_done
from shared.bus.membership import Membership
from shared.kubetime import as_utc, utcnow
from shared.messages import (
    NODE_STATE_RESOURCE,
    QUARANTINE_RESOURCE,
    NodeObservation,
    NodeVerdict,
    Verdict,
)
from shared.runtime import Runtime, entry
from shared.taints import NO_EXECUTE, NO_SCHEDULE, PREFER_NO_SCHEDULE, Effect, ResourceTaints

log = logging.getLogger(__name__)

UNHEALTHY = metrics.gauge(
    "respawn_autopilot_unhealthy_nodes",
    "Nodes whose health labels match a configured taint, by resource and effect",
    ["resource", "effect"],
)
PUBLISHED = metrics.counter(
    "respawn_autopilot_node_verdicts", "Node verdicts published, by resource", ["resource"]
)
NODES_SEEN = metrics.gauge("respawn_autopilot_nodes", "Nodes whose latest observation was folded in")
LOST_NODES = metrics.gauge(
    "respawn_autopilot_lost_nodes",
    "Nodes in the node-state verdict (NotReady, Unknown, or deleted within the last hour), by state",
    ["state"],
)
LOST_STATES = ("NotReady", "Unknown", "Deleted")

EFFECTS: tuple[Effect, ...] = (NO_EXECUTE, NO_SCHEDULE, PREFER_NO_SCHEDULE)

# How long a replica's consumer outlives the replica (the server deletes it afterwards).
CONSUMER_INACTIVE_THRESHOLD = 300.0
# How often node quarantine is moved to the present (quarantines that ran out end).
QUARANTINE_TICK = 1.0


def consumer_name(instance: str) -> str:
    """See :func:`shared.bus.replay_consumer_name`."""
    return replay_consumer_name("autopilot", instance)


def instance_name() -> str:
    return os.environ.get("RESPAWN_INSTANCE") or f"{socket.gethostname()}-{os.getpid()}"


# ------------------------------------------------------------------ pure helpers


def sets_of(verdict: NodeVerdict | None) -> ResourceNodes:
    if verdict is None:
        return ResourceNodes()
    return ResourceNodes(
        no_schedule=frozenset(verdict.no_schedule),
        prefer_no_schedule=frozenset(verdict.prefer_no_schedule),
        no_execute=frozenset(verdict.no_execute),
    )


def node_state_msg_id(verdict: NodeVerdict, cause: str) -> str:
    """De-duplication id of a node-state verdict: the cause (as for :func:`verdict_msg_id`, since
    the set can return to an earlier value) and a digest of the entries."""
    body = json.dumps([e.model_dump(mode="json") for e in verdict.lost_nodes], separators=(",", ":"))
    return f"nodestate:{cause}:{hashlib.sha256(body.encode()).hexdigest()[:20]}"


def verdict_msg_id(verdict: NodeVerdict, cause: str) -> str:
    """De-duplication id: the same for every replica that reaches these sets for this cause."""
    sets = [sorted(verdict.no_execute), sorted(verdict.no_schedule), sorted(verdict.prefer_no_schedule)]
    body = json.dumps([verdict.resource, *sets], separators=(",", ":"))
    digest = hashlib.sha256(body.encode()).hexdigest()[:20]
    return f"nodeverdict:{verdict.resource}:{cause}:{digest}"


def due_verdicts(
    state: NodeHealthState,
    published: Mapping[str, NodeVerdict],
    resources: Iterable[str],
    now: datetime,
) -> list[NodeVerdict]:
    """Verdicts for those of ``resources`` whose sets differ from the last published, sorted by resource.

    ``decided_at`` never goes back for a resource: consumers drop a verdict older than the one
    they hold, so a replica whose clock is a little behind must not have its news ignored.
    """
    out: list[NodeVerdict] = []
    for verdict in verdicts(state, resources, now):
        previous = published.get(verdict.resource)
        if previous is not None and sets_of(previous) == state.nodes(verdict.resource):
            continue
        if previous is not None and as_utc(previous.decided_at) > as_utc(verdict.decided_at):
            verdict = verdict.model_copy(update={"decided_at": as_utc(previous.decided_at)})
        out.append(verdict)
    return out


@dataclass(frozen=True)
class NodeChange:
    """One node moving between the sets of one resource (None: healthy for that resource)."""

    resource: str
    node: str
    before: Effect | None
    after: Effect | None

    def describe(self) -> str:
        return f"node {self.node}: {self.resource} {self.before or 'healthy'} -> {self.after or 'healthy'}"


def node_changes(resource: str, before: ResourceNodes, after: ResourceNodes) -> list[NodeChange]:
    """Every node whose effect for ``resource`` differs between two set values, sorted by node."""
    touched = (
        (before.no_execute ^ after.no_execute)
        | (before.no_schedule ^ after.no_schedule)
        | (before.prefer_no_schedule ^ after.prefer_no_schedule)
    )
    return [
        NodeChange(resource, node, before.effect_of(node), after.effect_of(node)) for node in sorted(touched)
    ]


def unhealthy_counts(state: NodeHealthState, resources: Iterable[str]) -> dict[tuple[str, Effect], int]:
    """Number of nodes per (resource, effect), zeros included, for the gauge."""
    counts: dict[tuple[str, Effect], int] = {}
    for resource in resources:
        sets = state.nodes(resource)
        counts[(resource, NO_EXECUTE)] = len(sets.no_execute)
        counts[(resource, NO_SCHEDULE)] = len(sets.no_schedule)
        counts[(resource, PREFER_NO_SCHEDULE)] = len(sets.prefer_no_schedule)
    return counts


# ------------------------------------------------------------------ the service


class AutopilotService:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.taints: ResourceTaints = rt.config.autopilot.resource_taints
        self.monitor = rt.config.autopilot.monitor_nodes
        self.state = NodeHealthState()
        # The last verdict stored for each resource, whoever published it, and its stream sequence.
        self.published: dict[str, NodeVerdict] = {}
        self.published_seq: dict[str, int] = {}
        self.nodes: set[str] = set()
        self.caught_up = False
        self.last_seq = 0
        self.lock = asyncio.Lock()
        self.durable = consumer_name(instance_name())
        # The replay of the node observations (None until run() starts it, or when not monitoring).
        self.consumer: Replay[NodeObservation] | None = None
        # The replay of the node verdicts, followed for as long as the replica runs.
        self.verdicts: Replay[NodeVerdict] | None = None
        scaling = rt.config.scaling
        # Active/standby: the replica that owns the group's one partition publishes.
        self.membership = Membership(
            rt.bus,
            "autopilot",
            partitions=1,
            heartbeat=scaling.heartbeat.total_seconds(),
            ttl=scaling.member_ttl.total_seconds(),
            on_change=self.moved,
        )
        # Set once this replica knows whether it is the active one (its first share is taken).
        self.share_known = asyncio.Event()
        # Node quarantine (docs/autopilot.md): its own replay of the verdict stream.
        # Each node's labels and taints, as last observed (node quarantine's marks).
        self.node_states: dict[str, tuple[dict[str, str], tuple[dict[str, str], ...]]] = {}
        self.quarantine = Quarantining(
            rt.bus,
            rt.config.node_quarantine,
            active=self.active,
            node_count=lambda: len(self.nodes),
            node_states=lambda: self.node_states,
            kube=rt.kube,
        )
        self.health_verdicts: Replay[Verdict] | None = None
        # Node state (nodestate.py): the lost nodes, and the last node-state verdict stored.
        self.publish_node_state = rt.config.autopilot.publish_node_state
        self.lost = LostNodes()
        self.lost_published: NodeVerdict | None = None
        self.lost_published_seq = 0

    # ------------------------------------------------------------------ active or standby

    def active(self) -> bool:
        """Whether this replica publishes: it owns the group's partition."""
        return self.membership.owns_partition(0)

    def ready(self) -> bool:
        """Replayed, and knows its part: the active one has published what was due."""
        return self.caught_up and self.membership.settled

    async def moved(self, previous: frozenset[int], current: frozenset[int]) -> None:
        """This replica's part changed (:class:`Membership` calls this, one change at a time).

        Becoming active once replayed (the active one died or left): publish every resource whose
        sets differ from the last stored verdict, as at start-up; the standby followed both
        streams, so this is at once. Until it is done the partition does not count as owned, so
        nothing else publishes meanwhile; a failed publish is tried again until it succeeds.
        Becoming standby: :meth:`active` is false from now on.
        """
        if 0 in current - previous:
            await until_done("publishing the node verdicts on becoming active", self.take_over)
        self.share_known.set()

    async def take_over(self) -> None:
        async with self.lock:
            if not self.caught_up:
                return  # the end of the replay publishes what is due (finish_replay)
            resources = {*self.taints, *self.state.by_resource, *self.published}
            for resource in sorted(resources):
                before = sets_of(self.published.get(resource))
                for change in node_changes(resource, before, self.state.nodes(resource)):
                    log.info("%s (since the last verdict, on becoming active)", change.describe())
            await self.publish(self.state, resources, f"takeover-{self.last_seq}", utcnow())
            await self.publish_lost(self.lost, f"takeover-{self.last_seq}", utcnow())
            await self.quarantine.take_over()
            log.info("active: publishing the node verdicts")

    async def on_verdict(self, verdict: NodeVerdict, delivery: Delivery) -> None:
        """A node verdict stored, this replica's own or the active one's: the last one per
        resource is what the next change is compared with."""
        if verdict.resource == QUARANTINE_RESOURCE:
            # Not a resource's sets: node quarantine's own (quarantining.py).
            self.quarantine.on_stored(verdict, delivery)
            return
        if verdict.resource == NODE_STATE_RESOURCE:
            # Not a resource's sets either: the lost nodes (nodestate.py).
            if delivery.stream_seq > self.lost_published_seq:
                self.lost_published, self.lost_published_seq = verdict, delivery.stream_seq
            return
        if delivery.stream_seq > self.published_seq.get(verdict.resource, 0):
            self.published[verdict.resource] = verdict
            self.published_seq[verdict.resource] = delivery.stream_seq

    # ------------------------------------------------------------------ publishing

    async def publish(
        self, state: NodeHealthState, resources: Iterable[str], cause: str, now: datetime
    ) -> None:
        """Publish the sets of ``state`` that differ from the last published ones.

        ``published`` moves only once JetStream stored the verdict; a failure raises
        :class:`TransientError` so the message that caused it is redelivered.
        """
        for verdict in due_verdicts(state, self.published, resources, now):
            subject = subjects.node_verdict(verdict.resource)
            try:
                stored = await self.rt.bus.publish(subject, verdict, msg_id=verdict_msg_id(verdict, cause))
            except Exception as exc:
                raise TransientError(f"publishing the {verdict.resource} node verdict failed: {exc}") from exc
            PUBLISHED.labels(resource=verdict.resource).inc()
            self.published[verdict.resource] = verdict
            self.published_seq[verdict.resource] = max(
                self.published_seq.get(verdict.resource, 0), stored.seq
            )
            log.info(
                "%s nodes: NoExecute %s, NoSchedule %s, PreferNoSchedule %s",
                verdict.resource,
                list(verdict.no_execute),
                list(verdict.no_schedule),
                list(verdict.prefer_no_schedule),
            )

    def lost_due(self, lost: LostNodes) -> bool:
        """Whether ``lost`` differs from the stored node-state verdict (nothing stored: from none)."""
        stored = self.lost_published.lost_nodes if self.lost_published is not None else ()
        return stored != lost.listed()

    async def publish_lost(self, lost: LostNodes, cause: str, now: datetime) -> None:
        """Publish the node-state verdict if it differs from the stored one (active replica only).

        Raises :class:`TransientError` on failure, like :meth:`publish`. With
        ``autopilot.publishNodeState`` off ``lost`` is always empty, so a set stored by an earlier
        configuration is cleared rather than left for health to go on reading.
        """
        if not self.active() or not self.lost_due(lost):
            return
        verdict = node_state_verdict(lost, now)
        if self.lost_published is not None and as_utc(self.lost_published.decided_at) > as_utc(now):
            # Consumers drop a verdict older than the one they hold.
            verdict = verdict.model_copy(update={"decided_at": as_utc(self.lost_published.decided_at)})
        try:
            stored = await self.rt.bus.publish(
                subjects.node_verdict(NODE_STATE_RESOURCE), verdict, msg_id=node_state_msg_id(verdict, cause)
            )
        except Exception as exc:
            raise TransientError(f"publishing the node-state verdict failed: {exc}") from exc
        PUBLISHED.labels(resource=NODE_STATE_RESOURCE).inc()
        self.lost_published = verdict
        self.lost_published_seq = max(self.lost_published_seq, stored.seq)
        log.info(
            "lost nodes: %s",
            ", ".join(f"{e.node} {e.state} since {e.since.isoformat()}" for e in verdict.lost_nodes)
            or "none",
        )

    async def expire_lost(self) -> None:
        """Forget nodes deleted long enough ago; publish if that changed the set (on the tick)."""
        if not self.caught_up:
            return
        lost = expire(self.lost, utcnow())
        if lost is self.lost:
            return
        try:
            await self.publish_lost(lost, f"expiry-{self.last_seq}", utcnow())
        except TransientError as exc:  # tried again on the next tick
            log.warning("%s", exc)
            return
        self.lost = lost
        self.update_gauges()

    def update_gauges(self) -> None:
        states: list[str] = [e.state for e in self.lost.entries.values()]
        for state in LOST_STATES:
            LOST_NODES.labels(state=state).set(states.count(state))
        resources = {*self.taints, *self.state.by_resource, *self.published}
        for (resource, effect), count in unhealthy_counts(self.state, resources).items():
            UNHEALTHY.labels(resource=resource, effect=effect).set(count)
        NODES_SEEN.set(len(self.nodes))

    # ------------------------------------------------------------------ observations

    async def on_health_verdict(self, verdict: Verdict, delivery: Delivery) -> None:
        """A verdict about an AppWrapper: node quarantine counts the nodes it blames."""
        async with self.lock:
            await self.quarantine.on_verdict(verdict, delivery)

    async def quarantine_ticks(self) -> None:
        while True:
            await asyncio.sleep(QUARANTINE_TICK)
            async with self.lock:
                await self.quarantine.tick()
                await self.expire_lost()

    async def on_node(self, observation: NodeObservation, delivery: Delivery) -> None:
        async with self.lock:
            before = self.state
            # Node quarantine needs the nodes (its cap is a share of them) even when their
            # health labels are not watched.
            after, changed = (
                apply(before, observation, self.taints) if self.monitor else (before, frozenset())
            )
            lost = observe(self.lost, observation) if self.publish_node_state else self.lost
            if self.caught_up and lost is not self.lost:
                # As below: published before kept, so a failure redelivers the observation.
                await self.publish_lost(lost, f"obs-{delivery.stream_seq}", utcnow())
            self.lost = lost
            if self.caught_up and changed and self.active():
                # Publish before keeping the new state: if publishing fails the observation is
                # redelivered, found to change the same sets again, and published with the same id.
                await self.publish(after, changed, f"obs-{delivery.stream_seq}", utcnow())
                for resource in sorted(changed):
                    for change in node_changes(resource, before.nodes(resource), after.nodes(resource)):
                        log.info("%s", change.describe())
            self.state = after
            if observation.deleted:
                self.nodes.discard(observation.name)
                self.node_states.pop(observation.name, None)
            else:
                self.nodes.add(observation.name)
                self.node_states[observation.name] = (observation.labels, observation.taints)
            self.last_seq = max(self.last_seq, delivery.stream_seq)
            if changed or not self.caught_up:
                self.update_gauges()

    # ------------------------------------------------------------------ start-up

    async def catch_up(self) -> None:
        """The replays are complete: the active replica publishes every resource whose sets
        differ from what is stored; a standby publishes nothing.

        Also covers resources no longer configured: their stored sets are cleared. Runs under
        the lock; ``caught_up`` is set only once everything due was published.
        """
        if self.caught_up:
            return
        resources = {*self.taints, *self.state.by_resource, *self.published}
        if self.active():
            for resource in sorted(resources):
                before = sets_of(self.published.get(resource))
                for change in node_changes(resource, before, self.state.nodes(resource)):
                    log.info("%s (since the last verdict)", change.describe())
            await self.publish(self.state, resources, f"start-{self.last_seq}", utcnow())
        # Nodes deleted long ago come back with their tombstones in the replay: forgotten here.
        self.lost = expire(self.lost, utcnow()) if self.publish_node_state else LostNodes()
        await self.publish_lost(self.lost, f"start-{self.last_seq}", utcnow())
        await self.quarantine.catch_up()
        self.caught_up = True
        self.update_gauges()
        log.info(
            "replayed %d nodes (%s); %s",
            len(self.nodes),
            "active" if self.active() else "standby",
            ", ".join(
                f"{r}: {len(self.state.nodes(r).no_execute)} NoExecute, "
                f"{len(self.state.nodes(r).no_schedule)} NoSchedule, "
                f"{len(self.state.nodes(r).prefer_no_schedule)} PreferNoSchedule"
                for r in sorted(resources)
            )
            or "no resource configured",
        )

    async def finish_replay(self) -> None:
        """The replay is complete (or there is none): once the node verdicts are replayed too and
        this replica knows whether it is the active one, catch up, under the lock.

        The replay calls this once it has caught up and retries it until it succeeds (see
        ``Bus.replay``); without a replay, run() retries it the same way.
        """
        if self.verdicts is not None:
            await self.verdicts.wait_caught_up()
        if self.health_verdicts is not None:
            await self.health_verdicts.wait_caught_up()
        await self.share_known.wait()
        async with self.lock:
            await self.catch_up()

    async def run(self) -> None:
        self.rt.add_check("replayed", self.ready)
        membership = asyncio.create_task(self.membership.run(), name="autopilot-membership")
        ticks = asyncio.create_task(self.quarantine_ticks(), name="autopilot-quarantine")
        try:
            # The last stored verdict of every resource, and every one stored from then on: the
            # active replica's own, and, while standby, the active one's.
            self.verdicts = await self.rt.bus.replay(
                subjects.NODE_VERDICTS_STREAM,
                f"{self.durable}-verdicts",
                subjects.node_verdict_filter(),
                NodeVerdict,
                self.on_verdict,
                last_per_subject=True,
                inactive_threshold=CONSUMER_INACTIVE_THRESHOLD,
            )
            if self.quarantine.enabled:
                # The verdicts of one window back: the failures that may still count.
                self.health_verdicts = await self.rt.bus.replay(
                    subjects.VERDICTS_STREAM,
                    f"{self.durable}-faults",
                    subjects.verdict_filter(),
                    Verdict,
                    self.on_health_verdict,
                    start_time=self.quarantine.replay_from(utcnow()),
                    inactive_threshold=CONSUMER_INACTIVE_THRESHOLD,
                )
            if self.monitor or self.quarantine.enabled or self.publish_node_state:
                if not self.monitor:
                    log.info("autopilot.monitorNodes is off: not watching node health labels")
                self.consumer = await self.rt.bus.replay(
                    subjects.OBSERVATIONS_STREAM,
                    self.durable,
                    subjects.node_obs_filter(),
                    NodeObservation,
                    self.on_node,
                    on_caught_up=self.finish_replay,
                    inactive_threshold=CONSUMER_INACTIVE_THRESHOLD,
                )
                await (self.consumer.task or asyncio.Event().wait())
            else:
                # Nothing is judged, so nothing may stay flagged: catch-up publishes empty sets for
                # every resource that a previous configuration left with unhealthy nodes.
                log.info("autopilot.monitorNodes is off: not watching node health")
                await until_done("publishing the node verdicts at start-up", self.finish_replay)
                await asyncio.Event().wait()
        finally:
            ticks.cancel()
            await asyncio.gather(ticks, return_exceptions=True)
            await self.remove_consumer()
            # Its last act is to delete this replica's key: a standby takes over at once.
            membership.cancel()
            await asyncio.gather(membership, return_exceptions=True)

    async def remove_consumer(self) -> None:
        """Delete this run's consumers at once rather than leaving them to the inactivity timeout."""
        for replay in (self.consumer, self.verdicts, self.health_verdicts):
            if replay is not None:
                await replay.stop(grace=2.0)
        self.consumer = self.verdicts = self.health_verdicts = None


async def main(rt: Runtime) -> None:
    await AutopilotService(rt).run()


def run() -> None:
    # Kubernetes only to mark quarantined nodes (nodeQuarantine.nodeLabel / nodeTaint).
    entry("autopilot", main, needs_kube=lambda config: config.node_quarantine.marks_nodes)
