"""autopilot: node observations → node verdicts. A thin loop around the pure logic in nodes.py.

Each replica replays the node subjects of the observation stream into memory with its own
consumer. The stream keeps only the latest message per node, so the replay is the present state
of every node, not its history. Once the replay is done the replica compares what it found with
the last verdict stored for each resource and publishes the resources that differ: a node that
recovered while no autopilot was running is cleared then. From there on, every observation that
moves a node between sets publishes the complete sets of that resource.

Replicas de-duplicate through JetStream's ``Nats-Msg-Id``: the id names the resource, the
observation that caused the change (its stream sequence, the same for every replica) and a
digest of the sets. The cause is part of the id because sets can return to an earlier value
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
from shared import metrics, subjects
from shared.bus import Delivery, Replay, TransientError, replay_consumer_name, until_done
from shared.kubetime import as_utc, utcnow
from shared.messages import NodeObservation, NodeVerdict
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

EFFECTS: tuple[Effect, ...] = (NO_EXECUTE, NO_SCHEDULE, PREFER_NO_SCHEDULE)

# How long a replica's consumer outlives the replica (the server deletes it afterwards).
CONSUMER_INACTIVE_THRESHOLD = 300.0


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
        self.published: dict[str, NodeVerdict] = {}
        self.nodes: set[str] = set()
        self.caught_up = False
        self.last_seq = 0
        self.lock = asyncio.Lock()
        self.durable = consumer_name(instance_name())
        # The replay of the node observations (None until run() starts it, or when not monitoring).
        self.consumer: Replay[NodeObservation] | None = None

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
                await self.rt.bus.publish(subject, verdict, msg_id=verdict_msg_id(verdict, cause))
            except Exception as exc:
                raise TransientError(f"publishing the {verdict.resource} node verdict failed: {exc}") from exc
            PUBLISHED.labels(resource=verdict.resource).inc()
            self.published[verdict.resource] = verdict
            log.info(
                "%s nodes: NoExecute %s, NoSchedule %s, PreferNoSchedule %s",
                verdict.resource,
                list(verdict.no_execute),
                list(verdict.no_schedule),
                list(verdict.prefer_no_schedule),
            )

    def update_gauges(self) -> None:
        resources = {*self.taints, *self.state.by_resource, *self.published}
        for (resource, effect), count in unhealthy_counts(self.state, resources).items():
            UNHEALTHY.labels(resource=resource, effect=effect).set(count)
        NODES_SEEN.set(len(self.nodes))

    # ------------------------------------------------------------------ observations

    async def on_node(self, observation: NodeObservation, delivery: Delivery) -> None:
        async with self.lock:
            before = self.state
            after, changed = apply(before, observation, self.taints)
            if self.caught_up and changed:
                # Publish before keeping the new state: if publishing fails the observation is
                # redelivered, found to change the same sets again, and published with the same id.
                await self.publish(after, changed, f"obs-{delivery.stream_seq}", utcnow())
                for resource in sorted(changed):
                    for change in node_changes(resource, before.nodes(resource), after.nodes(resource)):
                        log.info("%s", change.describe())
            self.state = after
            if observation.deleted:
                self.nodes.discard(observation.name)
            else:
                self.nodes.add(observation.name)
            self.last_seq = max(self.last_seq, delivery.stream_seq)
            if changed or not self.caught_up:
                self.update_gauges()

    # ------------------------------------------------------------------ start-up

    async def stored_verdicts(self) -> dict[str, NodeVerdict]:
        """The last verdict stored for every resource, read from the node-verdict stream."""
        found: dict[str, NodeVerdict] = {}

        async def keep(verdict: NodeVerdict, delivery: Delivery) -> None:
            found[verdict.resource] = verdict

        await self.rt.bus.replay(
            subjects.NODE_VERDICTS_STREAM,
            f"{self.durable}-verdicts",
            subjects.node_verdict_filter(),
            NodeVerdict,
            keep,
            last_per_subject=True,
            follow=False,
        )
        return found

    async def catch_up(self) -> None:
        """The replay is complete: publish every resource whose sets differ from what is stored.

        Also covers resources no longer configured: their stored sets are cleared. Runs under
        the lock; ``caught_up`` is set only once everything due was published.
        """
        if self.caught_up:
            return
        try:
            stored = await self.stored_verdicts()
        except Exception as exc:
            raise TransientError(f"reading the stored node verdicts failed: {exc}") from exc
        self.published = stored
        resources = {*self.taints, *self.state.by_resource, *stored}
        for resource in sorted(resources):
            for change in node_changes(resource, sets_of(stored.get(resource)), self.state.nodes(resource)):
                log.info("%s (since the last verdict)", change.describe())
        await self.publish(self.state, resources, f"start-{self.last_seq}", utcnow())
        self.caught_up = True
        self.update_gauges()
        log.info(
            "replayed %d nodes; %s",
            len(self.nodes),
            ", ".join(
                f"{r}: {len(self.state.nodes(r).no_execute)} NoExecute, "
                f"{len(self.state.nodes(r).no_schedule)} NoSchedule, "
                f"{len(self.state.nodes(r).prefer_no_schedule)} PreferNoSchedule"
                for r in sorted(resources)
            )
            or "no resource configured",
        )

    async def finish_replay(self) -> None:
        """The replay is complete (or there is none): catch up, under the lock.

        The replay calls this once it has caught up and retries it until it succeeds (see
        ``Bus.replay``); without a replay, run() retries it the same way.
        """
        async with self.lock:
            await self.catch_up()

    async def run(self) -> None:
        self.rt.add_check("replayed", lambda: self.caught_up)
        try:
            if self.monitor:
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
            await self.remove_consumer()

    async def remove_consumer(self) -> None:
        """Delete this run's consumer at once rather than leaving it to the inactivity timeout."""
        consumer, self.consumer = self.consumer, None
        if consumer is not None:
            await consumer.stop(grace=2.0)


async def main(rt: Runtime) -> None:
    await AutopilotService(rt).run()


def run() -> None:
    entry("autopilot", main, needs_kube=False)
