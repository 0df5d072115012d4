"""health: observations → verdicts. A thin loop around the pure rules in rules.py / state.py.

Each replica replays the observation stream into memory with its own consumer (the stream
keeps only the latest message per object, so the replay is the current state of the
world, not its history), seeds the last verdict of every AppWrapper from the verdict
stream, and from then on evaluates each AppWrapper whenever an observation about it
arrives or one of its deadlines passes. Verdict identities are deterministic, so replicas
that reach the same verdict publish it once (JetStream de-duplicates on Nats-Msg-Id):
extra replicas are hot standbys, and a restarted one picks up where the last one was.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
from datetime import datetime

from opentelemetry import trace
from opentelemetry.context import Context

from services.health.rules import evaluate
from services.health.state import AppWrapperHealth, affected_by, apply, remember_published, supersedes
from shared import metrics, subjects
from shared.bus import Delivery, replay_consumer_name
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
from shared.runtime import Runtime, entry

log = logging.getLogger(__name__)
tracer = trace.get_tracer("respawn.health")

VERDICTS = metrics.counter(
    "respawn_health_verdicts", "Verdicts published, by state and reason", ["state", "reason"]
)
TRACKED = metrics.gauge("respawn_health_appwrappers", "AppWrappers tracked in memory")
EVAL_SECONDS = metrics.histogram(
    "respawn_health_evaluation_round_seconds",
    "Time to evaluate every AppWrapper touched since the last round",
)

Key = tuple[str, str]

EVAL_WINDOW = 256
# How long this replica's consumers outlive it if it dies without deleting them.
CONSUMER_INACTIVE_THRESHOLD = 300.0


class HealthService:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.defaults = rt.config.to_fault_tolerance()
        self.states: dict[Key, AppWrapperHealth] = {}
        self.node_verdicts: dict[str, NodeVerdict] = {}
        self.deadlines: list[tuple[datetime, Key]] = []
        self.wake = asyncio.Event()
        self.dirty: set[Key] = set()
        self.trace_contexts: dict[Key, Context] = {}
        self.dirty_event = asyncio.Event()
        self.caught_up = False

    # ------------------------------------------------------------------ state

    def state_for(self, key: Key) -> AppWrapperHealth:
        state = self.states.get(key)
        if state is None:
            state = AppWrapperHealth(namespace=key[0], name=key[1], defaults=self.defaults)
            for nv in self.node_verdicts.values():
                state = apply(state, nv)
            self.states[key] = state
            TRACKED.set(len(self.states))
        return state

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
        decision = evaluate(state, now)
        v = decision.verdict
        if v is not None:
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
            VERDICTS.labels(state=v.state, reason=v.reason or "-").inc()
            log.info(
                "verdict %s/%s %s %s%s",
                key[0],
                key[1],
                v.state,
                v.reason,
                f": {v.message}" if v.message else "",
            )
            if v.state == "Deleted":
                self.states.pop(key, None)
                self.trace_contexts.pop(key, None)
                TRACKED.set(len(self.states))
                return
            # Observations folded in while the publish was in flight are kept: only record the
            # verdict on the *current* state (the decision changes nothing else).
            current = self.states.get(key)
            if current is not None:
                self.states[key] = remember_published(current, v)
        if decision.next_deadline is not None:
            heapq.heappush(self.deadlines, (decision.next_deadline, key))
            self.wake.set()

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

        Observations are only folded in by the consumer (and acked at once: a restarted replica
        replays the whole observation stream, so an ack never stands for a verdict not yet
        published). Under load one round covers many observations of the same AppWrapper, so
        an 8-pod workload starting up costs one evaluation, not nine; when idle a round starts
        as soon as an observation arrives.
        """
        while True:
            await self.dirty_event.wait()
            self.dirty_event.clear()
            keys = list(self.dirty)
            self.dirty.clear()
            with EVAL_SECONDS.time():
                await self.evaluate_many(keys)

    async def on_observation(self, message: Message, delivery: Delivery) -> None:
        if isinstance(message, NodeObservation):
            return  # nodes are autopilot's; health hears about them through node verdicts
        key = self.key_of(message)
        if key is None:
            return
        self.states[key] = apply(self.state_for(key), message)  # type: ignore[arg-type]
        self.trace_contexts[key] = delivery.trace_context
        if self.caught_up:
            self.mark_dirty(key)

    async def on_node_verdict(self, message: NodeVerdict, delivery: Delivery) -> None:
        previous = self.node_verdicts.get(message.resource)
        if not supersedes(message, previous):
            return  # an older decision delivered late (the states ignore it too)
        self.node_verdicts[message.resource] = message
        for key, state in list(self.states.items()):
            self.states[key] = apply(state, message)
            if self.caught_up and affected_by(state, previous, message):
                self.mark_dirty(key)

    async def catch_up(self) -> None:
        """The replay is complete: judge everything once, from now on judge as things arrive.

        Runs in the observation consumer's task (see ``Bus.replay``), so no observation is
        folded in between the end of the replay and this.
        """
        self.caught_up = True
        log.info("replayed %d AppWrappers; evaluating", len(self.states))
        for key in self.states:
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
            if self.caught_up:
                self.mark_dirty(key)

    # ------------------------------------------------------------------ start-up

    async def seed_last_verdicts(self, durable: str) -> None:
        """Read the newest verdict of every AppWrapper so none is published twice after a restart."""
        count = 0

        async def remember(verdict: Verdict, delivery: Delivery) -> None:
            nonlocal count
            key = (verdict.ref.namespace, verdict.ref.name)
            self.states[key] = remember_published(self.state_for(key), verdict)
            count += 1

        await self.rt.bus.replay(
            subjects.VERDICTS_STREAM,
            durable,
            subjects.verdict_filter(),
            Verdict,
            remember,
            last_per_subject=True,
            follow=False,
        )
        log.info("seeded %d last verdicts", count)

    async def run(self) -> None:
        self.rt.add_check("replayed", lambda: self.caught_up)
        me = replay_consumer_name("health")
        await self.seed_last_verdicts(f"{me}-verdicts")
        timer = asyncio.create_task(self.timer(), name="health-deadlines")
        evaluator = asyncio.create_task(self.evaluator(), name="health-evaluator")
        await self.rt.bus.replay(
            subjects.NODE_VERDICTS_STREAM,
            f"{me}-nodes",
            subjects.node_verdict_filter(),
            NodeVerdict,
            self.on_node_verdict,
            inactive_threshold=CONSUMER_INACTIVE_THRESHOLD,
        )
        observations = await self.rt.bus.replay(
            subjects.OBSERVATIONS_STREAM,
            me,
            subjects.appwrapper_obs_filter(),
            AnyObservation,
            self.on_observation,
            on_caught_up=self.catch_up,
            inactive_threshold=CONSUMER_INACTIVE_THRESHOLD,
        )
        try:
            await asyncio.gather(timer, evaluator, observations.task or asyncio.Event().wait())
        finally:
            timer.cancel()
            evaluator.cancel()


async def main(rt: Runtime) -> None:
    await HealthService(rt).run()


def run() -> None:
    entry("health", main, needs_kube=False)
