"""health: observations → verdicts. A thin loop around the pure rules in rules.py / state.py.

The AppWrappers are split into partitions (``scaling.partitions``, a hash of namespace and name;
the partition is the last token of their observation and verdict subjects). The replicas of
health share them through :class:`shared.bus.membership.Membership`: each one holds and judges
only the AppWrappers of the partitions it owns, so memory and work per replica fall as replicas
are added.

For each partition it takes, a replica first reads the last verdict of each of that partition's
AppWrappers from the verdict stream (so it never publishes a verdict again, and its ``seq``
numbers go on from the last one), then replays that partition's observations into memory with a
consumer of its own (the stream keeps only the latest message per object, so the replay is the
current state of the world, not its history) and follows them. Once that replay has caught up it
judges every AppWrapper of the partition, and from then on each one whenever an observation
about it arrives or one of its deadlines passes. A partition it loses is let go of at once: its
consumer is deleted and what the replica held of its AppWrappers is dropped. A partition gained
later (a peer stopped or died) is rebuilt from the streams the same way. Node verdicts concern
every AppWrapper, so every replica follows all of them.

While a partition moves, or while a replica cut off from NATS still thinks itself alone, two
replicas may judge the same AppWrapper for a moment. Verdict identities are deterministic, so
two replicas that reach the same verdict publish it once (JetStream de-duplicates on
Nats-Msg-Id).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import logging
from dataclasses import dataclass
from datetime import datetime

from opentelemetry import trace
from opentelemetry.context import Context

from services.health.latency import detection
from services.health.rules import evaluate
from services.health.state import (
    AppWrapperHealth,
    FailureSettings,
    apply,
    forget_departed,
    gone,
    node_changes,
    remember_published,
    supersedes,
    touched_by,
    with_node_verdicts,
)
from shared import metrics, subjects
from shared.bus import Delivery, Replay, replay_consumer_name, until_done
from shared.bus.membership import Membership
from shared.kubetime import utcnow
from shared.messages import (
    AnyObservation,
    AppWrapperObservation,
    ComponentObservation,
    Message,
    NodeObservation,
    NodeVerdict,
    PodObservation,
    Verdict,
)
from shared.partitions import partitions_of
from shared.runtime import Runtime, entry
from shared.tasks import cancel_and_wait

log = logging.getLogger(__name__)
tracer = trace.get_tracer("respawn.health")

VERDICTS = metrics.counter(
    "respawn_health_verdicts",
    "Verdicts published, by state, reason and failure class",
    ["state", "reason", "failure_class"],
)
TRACKED = metrics.gauge("respawn_health_appwrappers", "AppWrappers held in memory by this replica")
OBSERVATIONS = metrics.counter(
    "respawn_health_observations",
    "Observations folded into the state of an AppWrapper held by this replica",
)
EVAL_SECONDS = metrics.histogram(
    "respawn_health_evaluation_round_seconds",
    "Time to evaluate every AppWrapper touched since the last round",
)
DETECTION_SECONDS = metrics.histogram(
    "respawn_health_detection_seconds",
    "From a failure (a failed container's finishedAt, a failing condition's start) to the first "
    "Unhealthy verdict of the attempt, grace period included, by reason",
    ["reason"],
    buckets=metrics.LATENCY_BUCKETS,
)
DETECTION_DELAY_SECONDS = metrics.histogram(
    "respawn_health_detection_delay_seconds",
    "From the moment a failure was due for an Unhealthy verdict (its grace period over) to the "
    "verdict, by reason",
    ["reason"],
    buckets=metrics.LATENCY_BUCKETS,
)

Key = tuple[str, str]

GROUP = "health"
EVAL_WINDOW = 256
# How long this replica's consumers outlive it if it dies without deleting them.
CONSUMER_INACTIVE_THRESHOLD = 300.0
# How long an idle partition consumer's fetch waits for a message. A message that arrives ends
# the wait at once, so this costs no latency; it only sets how many pull requests an idle
# replica makes (one per partition per period).
PARTITION_FETCH_TIMEOUT = 5.0


@dataclass(eq=False)
class Partition:
    """One partition this replica owns: how far its loading has come."""

    number: int
    # Seeds the last verdicts, then starts the replay (see HealthService.load).
    task: asyncio.Task[None] | None = None
    replay: Replay[AnyObservation] | None = None
    # The replay has caught up and every AppWrapper of the partition has been put up for judging.
    caught_up: bool = False


class HealthService:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.defaults = rt.config.to_fault_tolerance()
        self.stall_defaults = rt.config.health.stall_defaults()
        self.failures = FailureSettings(
            table=rt.config.failures.table(),
            application_fault_window=rt.config.failures.application_fault_window,
            node_lost_leeway=rt.config.failures.node_lost_leeway,
        )
        self.states: dict[Key, AppWrapperHealth] = {}
        # The partition each held AppWrapper was loaded through (it is let go of with it).
        self.partition_by_key: dict[Key, int] = {}
        self.partitions: dict[int, Partition] = {}
        self.node_verdicts: dict[str, NodeVerdict] = {}
        self.deadlines: list[tuple[datetime, Key]] = []
        self.wake = asyncio.Event()
        self.dirty: set[Key] = set()
        self.trace_contexts: dict[Key, Context] = {}
        self.dirty_event = asyncio.Event()
        self.membership: Membership | None = None
        # This run's consumer names start with it (replay_consumer_name: unique per start).
        self.me = replay_consumer_name(GROUP)

    # ------------------------------------------------------------------ state

    def state_for(self, key: Key, partition: int) -> AppWrapperHealth:
        state = self.states.get(key)
        if state is None:
            state = AppWrapperHealth(
                namespace=key[0],
                name=key[1],
                defaults=self.defaults,
                stall_defaults=self.stall_defaults,
                failures=self.failures,
            )
            for nv in self.node_verdicts.values():
                state = apply(state, nv)
            self.states[key] = state
            self.partition_by_key[key] = partition
            TRACKED.set(len(self.states))
        return state

    def forget(self, key: Key) -> None:
        self.states.pop(key, None)
        self.partition_by_key.pop(key, None)
        self.trace_contexts.pop(key, None)
        self.dirty.discard(key)
        TRACKED.set(len(self.states))

    def live(self, key: Key) -> bool:
        """Whether ``key`` is judged now: held, in a partition whose replay has caught up."""
        partition = self.partitions.get(self.partition_by_key.get(key, -1))
        return partition is not None and partition.caught_up

    @staticmethod
    def key_of(message: Message) -> Key | None:
        if isinstance(message, AppWrapperObservation):
            return message.ref.namespace, message.ref.name
        if isinstance(message, PodObservation | ComponentObservation):
            return message.ref.namespace, message.appwrapper
        return None

    # ------------------------------------------------------------------ evaluation

    async def evaluate(self, key: Key, now: datetime) -> None:
        state = self.states.get(key)
        if state is None:
            return
        synced = with_node_verdicts(state, self.node_verdicts)
        if synced is not state:
            self.states[key] = state = synced
        decision = evaluate(state, now)
        v = decision.verdict
        if v is not None:
            detected = detection(state.last_verdict, v)
            # Publish in the trace of the observation that changed this AppWrapper last (e.g. the
            # pod that failed), so the incident is one trace from the watcher to the reset.
            with tracer.start_as_current_span(
                "health.verdict",
                context=self.trace_contexts.get(key),
                attributes={
                    "appwrapper": f"{key[0]}/{key[1]}",
                    "verdict.state": v.state,
                    "verdict.reason": v.reason,
                },
            ):
                await self.rt.bus.publish(subjects.verdict(key[0], key[1]), v, msg_id=decision.msg_id)
            VERDICTS.labels(state=v.state, reason=v.reason or "-", failure_class=v.failure_class or "-").inc()
            if detected is not None:
                DETECTION_SECONDS.labels(reason=v.reason or "-").observe(detected.seconds)
                DETECTION_DELAY_SECONDS.labels(reason=v.reason or "-").observe(detected.delay_seconds)
            log.info(
                "verdict %s/%s %s %s%s",
                key[0],
                key[1],
                v.state,
                v.reason,
                f": {v.message}" if v.message else "",
            )
            if v.state == "Deleted":
                self.forget(key)
                return
            # Observations folded in while the publish was in flight are kept: only record the
            # verdict on the *current* state (the decision changes nothing else). None if its
            # partition was let go of meanwhile.
            current = self.states.get(key)
            if current is not None:
                self.states[key] = remember_published(current, v)
        if state.departed:
            self.settle_departed(key, state)
        if decision.next_deadline is not None and key in self.states:
            heapq.heappush(self.deadlines, (decision.next_deadline, key))
            self.wake.set()

    def settle_departed(self, key: Key, judged: AppWrapperHealth) -> None:
        """The failed pods gone before this evaluation have been judged: let them go, and the
        AppWrapper too if they were all that was known of it."""
        current = self.states.get(key)
        if current is None:
            return
        current = forget_departed(current, judged)
        if gone(current):
            self.forget(key)
        else:
            self.states[key] = current

    async def evaluate_many(self, keys: list[Key]) -> None:
        """Evaluate AppWrappers concurrently in windows; each one's verdict is independent."""
        now = utcnow()
        for start in range(0, len(keys), EVAL_WINDOW):
            window = keys[start : start + EVAL_WINDOW]
            results = await asyncio.gather(
                *(self.evaluate(key, now) for key in window), return_exceptions=True
            )
            for key, result in zip(window, results, strict=True):
                if isinstance(result, BaseException):
                    log.warning("evaluating %s/%s failed (%s); retrying shortly", key[0], key[1], result)
                    self.mark_dirty(key, retry=True)

    def mark_dirty(self, key: Key, *, retry: bool = False) -> None:
        if retry:
            heapq.heappush(self.deadlines, (utcnow(), key))
            self.wake.set()
            return
        self.dirty.add(key)
        self.dirty_event.set()

    async def evaluator(self) -> None:
        """Evaluate every AppWrapper touched since the last round.

        Observations are only folded in by the consumers (and acked at once: a replica that
        takes a partition replays all of its observations, so an ack never stands for a verdict
        not yet published). Under load one round covers many observations of the same
        AppWrapper, so an 8-pod workload starting up costs one evaluation, not nine; when idle a
        round starts as soon as an observation arrives.
        """
        while True:
            await self.dirty_event.wait()
            self.dirty_event.clear()
            keys = [key for key in self.dirty if key in self.states]
            self.dirty.clear()
            with EVAL_SECONDS.time():
                await self.evaluate_many(keys)

    async def on_observation(self, partition: Partition, message: Message, delivery: Delivery) -> None:
        if isinstance(message, NodeObservation):
            return  # nodes are autopilot's; health hears about them through node verdicts
        key = self.key_of(message)
        if key is None or self.partitions.get(partition.number) is not partition:
            return
        state = apply(self.state_for(key, partition.number), message)  # type: ignore[arg-type]
        OBSERVATIONS.inc()
        if partition.caught_up and gone(state):
            # E.g. the tombstone of a pod whose AppWrapper's deletion was already published.
            self.forget(key)
            return
        self.states[key] = state
        self.trace_contexts[key] = delivery.trace_context
        if partition.caught_up:
            self.mark_dirty(key)

    async def on_node_verdict(self, message: NodeVerdict, delivery: Delivery) -> None:
        previous = self.node_verdicts.get(message.resource)
        if not supersedes(message, previous):
            return  # an older decision delivered late (the states ignore it too)
        self.node_verdicts[message.resource] = message
        changed = node_changes(previous, message)
        # Only the AppWrappers it may change take it now and are judged again; every other
        # state takes it before it is next judged (evaluate).
        for key, state in self.states.items():
            if touched_by(state, changed, message):
                self.states[key] = with_node_verdicts(state, self.node_verdicts)
                if self.live(key):
                    self.mark_dirty(key)

    async def timer(self) -> None:
        """Evaluate AppWrappers whose deadline has passed (deadlines are computed, not slept on)."""
        while True:
            if not self.deadlines:
                self.wake.clear()
                await self.wake.wait()
                continue
            when, key = self.deadlines[0]
            delay = (when - utcnow()).total_seconds()
            if delay > 0:
                self.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), timeout=min(delay, 60.0))
                continue
            heapq.heappop(self.deadlines)
            if self.live(key):
                self.mark_dirty(key)

    # ------------------------------------------------------------------ partitions

    async def on_partitions(self, previous: frozenset[int], current: frozenset[int]) -> None:
        """The membership changed this replica's share: let go of what it lost, then take what it
        gained (called one change at a time)."""
        for number in sorted(set(self.partitions) - current):
            await self.release(number)
        for number in sorted(current - set(self.partitions)):
            self.take(number)

    def replay_durable(self, number: int) -> str:
        return f"{self.me}-p{number}"

    def seed_durable(self, number: int) -> str:
        return f"{self.me}-p{number}-verdicts"

    def take(self, number: int) -> None:
        partition = Partition(number)
        self.partitions[number] = partition
        partition.task = asyncio.create_task(self.load(partition), name=f"health-partition-{number}")

    async def load(self, partition: Partition) -> None:
        """Seed the partition's last verdicts, then replay its observations and follow them.

        Runs in a task of its own, so the membership's change handler returns at once and
        partitions load side by side. Each step is tried again until it succeeds (NATS may be
        away); only letting go of the partition stops it.
        """
        number = partition.number
        await until_done(f"reading the last verdicts of partition {number}", lambda: self.seed(number))

        async def start() -> None:
            partition.replay = await self.rt.bus.replay(
                subjects.OBSERVATIONS_STREAM,
                self.replay_durable(number),
                subjects.appwrapper_obs_partition_filter(number),
                AnyObservation,
                functools.partial(self.on_observation, partition),
                on_caught_up=functools.partial(self.catch_up, partition),
                inactive_threshold=CONSUMER_INACTIVE_THRESHOLD,
                fetch_timeout=PARTITION_FETCH_TIMEOUT,
            )

        await until_done(f"replaying the observations of partition {number}", start)

    async def seed(self, number: int) -> None:
        """Read the newest verdict of each AppWrapper of partition ``number``, so none is
        published twice and ``seq`` goes on from where the previous owner left it."""
        count = 0

        async def remember(verdict: Verdict, delivery: Delivery) -> None:
            nonlocal count
            if self.partitions.get(number) is None:
                return
            key = (verdict.ref.namespace, verdict.ref.name)
            self.states[key] = remember_published(self.state_for(key, number), verdict)
            count += 1

        await self.rt.bus.replay(
            subjects.VERDICTS_STREAM,
            self.seed_durable(number),
            subjects.verdict_partition_filter(number),
            Verdict,
            remember,
            last_per_subject=True,
            follow=False,
        )
        log.debug("partition %d: seeded %d last verdicts", number, count)

    async def catch_up(self, partition: Partition) -> None:
        """The partition's replay is complete: judge its AppWrappers once, from now on as things
        arrive.

        Runs in the partition consumer's task (see ``Bus.replay``), so none of its observations
        is folded in between the end of the replay and this.
        """
        if self.partitions.get(partition.number) is not partition:
            return
        partition.caught_up = True
        keys = []
        for key, number in list(self.partition_by_key.items()):
            if number != partition.number:
                continue
            # Only now is it known that nothing more of it is in the stream: an AppWrapper whose
            # deletion was published long ago (its last verdict read, its tombstone gone), or
            # objects whose every observation was a tombstone.
            if gone(self.states[key]):
                self.forget(key)
            else:
                keys.append(key)
        log.info("partition %d: replayed %d AppWrappers; evaluating", partition.number, len(keys))
        for key in keys:
            self.mark_dirty(key)
        if self.ready():
            log.info(
                "every partition owned is judged: %s (%d AppWrappers)",
                partitions_of(self.partitions),
                len(self.states),
            )

    async def release(self, number: int) -> None:
        """Let go of partition ``number``: stop loading it, delete its consumer, and drop what is
        held of its AppWrappers (their states, deadlines and trace contexts)."""
        partition = self.partitions.pop(number, None)
        if partition is None:
            return
        if partition.task is not None:
            await cancel_and_wait([partition.task])
        if partition.replay is not None:
            await partition.replay.stop()  # deletes its consumer
        else:
            # Loading was cancelled: a consumer the server created just before may be left, with
            # no replay to delete it (a finished seeding has already deleted its own).
            await self.rt.bus.delete_consumer(subjects.VERDICTS_STREAM, self.seed_durable(number))
            await self.rt.bus.delete_consumer(subjects.OBSERVATIONS_STREAM, self.replay_durable(number))
        keys = [key for key, held in self.partition_by_key.items() if held == number]
        for key in keys:
            self.forget(key)
        gone = set(keys)
        self.deadlines = [d for d in self.deadlines if d[1] not in gone]
        heapq.heapify(self.deadlines)
        log.info("partition %d: let go of %d AppWrappers", number, len(keys))

    def ready(self) -> bool:
        """Readiness: the share is settled and every partition in it has been replayed."""
        membership = self.membership
        if membership is None or not membership.settled:
            return False
        return all(
            (partition := self.partitions.get(number)) is not None and partition.caught_up
            for number in membership.owned
        )

    # ------------------------------------------------------------------ start-up

    async def run(self) -> None:
        self.rt.add_check("partitions", self.ready)
        timer = asyncio.create_task(self.timer(), name="health-deadlines")
        evaluator = asyncio.create_task(self.evaluator(), name="health-evaluator")
        tasks = [timer, evaluator]
        try:
            nodes = await self.rt.bus.replay(
                subjects.NODE_VERDICTS_STREAM,
                f"{self.me}-nodes",
                subjects.node_verdict_filter(),
                NodeVerdict,
                self.on_node_verdict,
                inactive_threshold=CONSUMER_INACTIVE_THRESHOLD,
            )
            # Every AppWrapper is judged with the node verdicts in force: none is found healthy
            # on a node marked for eviction only because that verdict was not read yet.
            await nodes.wait_caught_up()
            scaling = self.rt.config.scaling
            self.membership = Membership(
                self.rt.bus,
                GROUP,
                partitions=subjects.partitions(),
                heartbeat=scaling.heartbeat.total_seconds(),
                ttl=scaling.member_ttl.total_seconds(),
                on_change=self.on_partitions,
            )
            tasks.append(asyncio.create_task(self.membership.run(), name="health-membership"))
            await asyncio.gather(*tasks, nodes.task or asyncio.Event().wait())
        finally:
            # Waited for: the membership leaves on its way out (deletes this replica's key), so
            # the others take its share at once instead of after the member TTL.
            loads = [p.task for p in self.partitions.values() if p.task is not None]
            await cancel_and_wait([*tasks, *loads])


async def main(rt: Runtime) -> None:
    await HealthService(rt).run()


def run() -> None:
    entry("health", main, needs_kube=False)
