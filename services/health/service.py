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
import os
import socket
import uuid
from datetime import UTC, datetime

from nats.js import api

from services.health.rules import evaluate
from services.health.state import AppWrapperHealth, apply, remember_published
from shared import metrics, subjects
from shared.bus import Delivery, TransientError
from shared.messages import (
    AnyObservation,
    AppWrapperObservation,
    ComponentObservation,
    Message,
    NodeObservation,
    NodeVerdict,
    PodObservation,
    Verdict,
    decode,
)
from shared.runtime import Runtime, entry

log = logging.getLogger(__name__)

VERDICTS = metrics.counter(
    "respawn_health_verdicts", "Verdicts published, by state and reason", ["state", "reason"]
)
TRACKED = metrics.gauge("respawn_health_appwrappers", "AppWrappers tracked in memory")
EVAL_SECONDS = metrics.histogram(
    "respawn_health_evaluation_seconds", "Time to fold one observation in and evaluate its AppWrapper"
)

Key = tuple[str, str]


def utcnow() -> datetime:
    return datetime.now(UTC)


def instance_id() -> str:
    return (
        os.environ.get("RESPAWN_INSTANCE") or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    )


class HealthService:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.defaults = rt.config.to_fault_tolerance()
        self.states: dict[Key, AppWrapperHealth] = {}
        self.node_verdicts: dict[str, NodeVerdict] = {}
        self.deadlines: list[tuple[datetime, Key]] = []
        self.wake = asyncio.Event()
        self.lock = asyncio.Lock()
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
        if decision.verdict is not None:
            v = decision.verdict
            # Publish before keeping the new state: if this fails the message is redelivered
            # and the same verdict (same id) is decided again.
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
        self.states[key] = decision.state
        if decision.verdict is not None and decision.verdict.state == "Deleted":
            self.states.pop(key, None)
            TRACKED.set(len(self.states))
            return
        if decision.next_deadline is not None:
            heapq.heappush(self.deadlines, (decision.next_deadline, key))
            self.wake.set()

    async def on_observation(self, message: Message, delivery: Delivery) -> None:
        if isinstance(message, NodeObservation):
            return  # nodes are autopilot's; health hears about them through node verdicts
        key = self.key_of(message)
        if key is None:
            return
        with EVAL_SECONDS.time():
            async with self.lock:
                self.states[key] = apply(self.state_for(key), message)  # type: ignore[arg-type]
                if self.caught_up:
                    await self.evaluate(key, utcnow())
                elif delivery.num_pending == 0:
                    await self.catch_up()

    async def on_node_verdict(self, message: NodeVerdict, delivery: Delivery) -> None:
        async with self.lock:
            self.node_verdicts[message.resource] = message
            for key, state in list(self.states.items()):
                self.states[key] = apply(state, message)
            if self.caught_up:
                now = utcnow()
                for key in list(self.states):
                    await self.evaluate(key, now)

    async def catch_up(self) -> None:
        """The replay is complete: judge everything once, from now on judge as things arrive."""
        self.caught_up = True
        now = utcnow()
        log.info("replayed %d AppWrappers; evaluating", len(self.states))
        for key in list(self.states):
            try:
                await self.evaluate(key, now)
            except Exception as exc:
                raise TransientError(f"publishing verdicts after replay failed: {exc}") from exc

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
            if not self.caught_up:
                continue
            async with self.lock:
                try:
                    await self.evaluate(key, utcnow())
                except Exception:
                    log.exception("evaluating %s/%s at its deadline failed; retrying shortly", *key)
                    heapq.heappush(self.deadlines, (utcnow(), key))
                    await asyncio.sleep(1.0)

    # ------------------------------------------------------------------ start-up

    async def seed_last_verdicts(self) -> None:
        """Read the newest verdict of every AppWrapper so none is published twice after a restart."""
        js = self.rt.bus.js
        sub = await js.subscribe(
            subjects.verdict_filter(),
            stream=subjects.VERDICTS_STREAM,
            ordered_consumer=True,
            deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT,
        )
        count = 0
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=1.0)
                except TimeoutError:
                    break
                try:
                    verdict = decode(Verdict, msg.data)
                except Exception:
                    continue
                key = (verdict.ref.namespace, verdict.ref.name)
                self.states[key] = remember_published(self.state_for(key), verdict)
                count += 1
                if msg.metadata.num_pending == 0:
                    break
        finally:
            await sub.unsubscribe()
        log.info("seeded %d last verdicts", count)

    async def run(self) -> None:
        await self.seed_last_verdicts()
        me = f"health-{instance_id()}"
        timer = asyncio.create_task(self.timer(), name="health-deadlines")
        await self.rt.bus.consume(
            subjects.NODE_VERDICTS_STREAM,
            f"{me}-nodes",
            subjects.node_verdict_filter(),
            NodeVerdict,
            self.on_node_verdict,
            inactive_threshold=300.0,
        )
        consumer = await self.rt.bus.consume(
            subjects.OBSERVATIONS_STREAM,
            me,
            subjects.appwrapper_obs_filter(),
            AnyObservation,
            self.on_observation,
            inactive_threshold=300.0,
        )
        info = await self.rt.bus.js.consumer_info(subjects.OBSERVATIONS_STREAM, me)
        if info.num_pending == 0:
            async with self.lock:
                await self.catch_up()
        self.rt.add_check("replayed", lambda: self.caught_up)
        try:
            await asyncio.gather(timer, consumer.task or asyncio.Event().wait())
        finally:
            timer.cancel()


async def main(rt: Runtime) -> None:
    await HealthService(rt).run()


def run() -> None:
    entry("health", main, needs_kube=False)
