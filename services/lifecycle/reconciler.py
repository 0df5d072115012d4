"""One reconcile of one AppWrapper: read, decide (the pure machine), carry out; a few passes.

A pass reads the AppWrapper and what it observes, calls :func:`services.lifecycle.machine.reconcile`
and has the plan carried out. Passes repeat while the plan creates components (their outcomes
feed the next decision) or lost its status write to a newer version (it is recomputed from the
fresh object, never forced). The deadlines a plan asks for go to the work queue.

Replicas may reconcile the same AppWrapper at once; the status write carries the
resourceVersion, so one wins and the other recomputes from fresh state. Within a replica, one
AppWrapper's reconciles never overlap (a lock per AppWrapper).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Final

from opentelemetry import trace

from services.lifecycle.actions import CreateComponent, CreateOutcome
from services.lifecycle.executor import Executor
from services.lifecycle.incidents import Incidents
from services.lifecycle.machine import reconcile
from services.lifecycle.reader import Reader
from services.lifecycle.templating import PodTemplateHook
from services.lifecycle.verdicts import VerdictUse
from services.lifecycle.workqueue import Key, WorkQueue
from shared import metrics
from shared.appwrapper.params import effective_fault_tolerance
from shared.bus import TransientError
from shared.config import NodeExclusionConfig
from shared.faulttolerance import FaultTolerance
from shared.kube import KubeApiError
from shared.kubetime import utcnow
from shared.messages import Verdict

__all__ = ["MAX_PASSES", "Reconciler"]

log = logging.getLogger(__name__)
tracer = trace.get_tracer("respawn.lifecycle")

MAX_PASSES: Final = 6  # reconcile passes per trigger (creates feed their outcomes into the next pass)

CONFLICTS = metrics.counter(
    "respawn_lifecycle_status_conflicts", "Status writes that lost to a newer version"
)
RECONCILES = metrics.counter("respawn_lifecycle_reconciles", "Reconcile passes, by outcome", ["outcome"])


class Reconciler:
    def __init__(
        self,
        *,
        reader: Reader,
        executor: Executor,
        queue: WorkQueue,
        incidents: Incidents,
        defaults: FaultTolerance,
        hooks: Sequence[PodTemplateHook] = (),
        node_exclusion: NodeExclusionConfig | None = None,
        on_gone: Callable[[Key], None] = lambda key: None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        """``defaults``: the operator's fault-tolerance parameters (an AppWrapper's annotations
        override them); ``on_gone`` is told of AppWrappers found deleted."""
        self.reader = reader
        self.executor = executor
        self.queue = queue
        self.incidents = incidents
        self.defaults = defaults
        self.hooks = tuple(hooks)
        self.node_exclusion = node_exclusion
        self.on_gone = on_gone
        self.clock = clock
        self.locks: dict[Key, asyncio.Lock] = {}

    async def reconcile_key(self, key: Key, verdict: Verdict | None, *, urgent: bool = False) -> VerdictUse:
        """Reconcile ``key`` with ``verdict`` (the latest for it, if any) until the plan settles.

        ``urgent``: an Unhealthy verdict has just arrived, so the first pass skips the reads a
        reset does not need (see :meth:`_reconcile`). Raises TransientError when the AppWrapper
        cannot be read or written (the caller retries).
        """
        lock = self.locks.setdefault(key, asyncio.Lock())
        async with lock:
            # A verdict arrives inside its incident's trace (the bus continues the producer's
            # context). Later passes of the same reset (deletion stages, recreation) are
            # triggered by observations and timers, so they rejoin the incident's trace here.
            fresh = verdict is not None and verdict.state == "Unhealthy"
            parent = None if fresh else self.incidents.context(key)
            with tracer.start_as_current_span(
                "lifecycle.reconcile",
                context=parent,
                attributes={"appwrapper.namespace": key[0], "appwrapper.name": key[1]},
            ):
                return await self._reconcile(key, verdict, urgent=urgent)

    async def _reconcile(self, key: Key, verdict: Verdict | None, *, urgent: bool) -> VerdictUse:
        created: dict[int, CreateOutcome] = {}
        use = VerdictUse.NONE
        for passes in range(MAX_PASSES):
            t_read = time.perf_counter()
            try:
                aw = await self.reader.appwrapper(key)
            except KubeApiError as exc:
                raise TransientError(f"reading AppWrapper {key[0]}/{key[1]}: {exc}") from exc
            if aw is None:
                self.on_gone(key)
                RECONCILES.labels(outcome="gone").inc()
                return VerdictUse.SETTLED
            annotations = (aw.get("metadata") or {}).get("annotations") or {}
            params = effective_fault_tolerance(annotations, self.defaults).ft
            was = str((aw.get("status") or {}).get("phase", ""))
            t_observe = time.perf_counter()
            # An arriving Unhealthy verdict's first pass decides from the AppWrapper alone: the
            # decision (reset or fail, then delete the components it records) depends neither on
            # the pods nor on reading the components, and every read is a round trip on the way
            # to the Unhealthy status and the first delete. The machine treats what was not read
            # as unknown (no PodsReady change, no "all gone" conclusion, no missing component);
            # later passes, triggered by the deletion's observations, read everything.
            quick = urgent and passes == 0
            # Nodes matter only to a reset after failed pods, i.e. with an Unhealthy verdict in
            # hand (they come from the node cache, free; a LIST only before it has synced).
            unhealthy = verdict is not None and verdict.state == "Unhealthy"
            observed = await self.reader.observe(
                aw, created, pods=not quick, components=not quick, nodes=unhealthy
            )
            t_decide = time.perf_counter()
            plan = reconcile(
                aw,
                observed,
                verdict,
                params,
                self.clock(),
                hooks=self.hooks,
                node_exclusion=self.node_exclusion,
            )
            if log.isEnabledFor(logging.DEBUG):
                # Where a pass's time goes (read the AppWrapper / read components and pods /
                # decide), for when a verdict takes longer to apply than it should.
                log.debug(
                    "%s/%s pass (read %.0f ms, observe %.0f ms, decide %.1f ms): "
                    "phase %s -> %s, %d pods observed, %d actions, status %s, requeue %s",
                    key[0],
                    key[1],
                    (t_observe - t_read) * 1000,
                    (t_decide - t_observe) * 1000,
                    (time.perf_counter() - t_decide) * 1000,
                    was,
                    plan.phase,
                    len(observed.pods or ()),
                    len(plan.actions),
                    "written" if plan.status is not None else "unchanged",
                    plan.requeue_at.isoformat() if plan.requeue_at else "-",
                )
            if verdict is not None and plan.verdict_use is not VerdictUse.NONE:
                use = plan.verdict_use
            if plan.empty:
                RECONCILES.labels(outcome="idle").inc()
                return use
            if quick and plan.status is None:
                # Nothing to write (e.g. a redelivered verdict of a reset under way): then the
                # deletes are not guarded by the status write's resourceVersion and must carry
                # the uids of what they delete, so decide again from a full read.
                continue
            try:
                outcomes = await self.executor.carry_out(aw, plan, observed, verdict=verdict)
            except KubeApiError as exc:
                if exc.conflict:
                    # Someone else wrote first: recompute from the fresh object, never overwrite.
                    CONFLICTS.inc()
                    RECONCILES.labels(outcome="conflict").inc()
                    created = {}
                    continue
                raise TransientError(f"writing AppWrapper {key[0]}/{key[1]}: {exc}") from exc
            self.incidents.track(key, plan, was=was)
            if plan.requeue_at is not None:
                self.queue.requeue_at(plan.requeue_at, key)
            if not any(isinstance(a, CreateComponent) for a in plan.actions):
                RECONCILES.labels(outcome="done").inc()
                return use
            created = outcomes
        RECONCILES.labels(outcome="passes-exhausted").inc()
        self.queue.requeue_at(self.clock(), key)
        return use
