"""One reconcile of one AppWrapper: read, decide (the pure machine), carry out; a few passes.

A pass reads the AppWrapper and what it observes, calls :func:`services.lifecycle.machine.reconcile`
and has the plan carried out. Passes repeat while the plan creates components (their outcomes
feed the next decision) or lost its status write to a newer version (it is recomputed from the
fresh object, never forced: the pass after a conflict reads the AppWrapper by a GET, as the
watch cache may not have the newer version yet). The deadlines a plan asks for go to the work
queue.

Replicas may reconcile the same AppWrapper at once; the status write carries the
resourceVersion, so one wins and the other recomputes from fresh state. Within a replica, one
AppWrapper's reconciles never overlap (a lock per AppWrapper).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from opentelemetry import trace

from services.lifecycle import announcements, validation
from services.lifecycle.actions import CreateComponent, CreateOutcome, EmitEvent
from services.lifecycle.executor import Executor
from services.lifecycle.failures import Failures
from services.lifecycle.incidents import KEEP, Incidents
from services.lifecycle.machine import FinalizerChange, reconcile
from services.lifecycle.reader import Reader
from services.lifecycle.records import DeferredRecords
from services.lifecycle.templating import PodTemplateHook
from services.lifecycle.verdicts import VerdictUse
from services.lifecycle.workqueue import Key, WorkQueue
from shared import metrics
from shared.appwrapper.constants import ANNOUNCED_ANNOTATION, INCIDENT_TRACE_ANNOTATION, Phase
from shared.appwrapper.model import as_mapping
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
# Phases whose passes conclude nothing from "no pod of the AppWrapper exists" (they count pods
# for PodsReady only): their pods may come from the pod cache's "none so far" without a LIST
# (services/lifecycle/podcache.py). The deleting phases confirm "none left" with a LIST.
_NO_CONCLUSION_FROM_NO_PODS: Final = frozenset({Phase.EMPTY, Phase.SUSPENDED, Phase.RESUMING, Phase.RUNNING})

CONFLICTS = metrics.counter(
    "respawn_lifecycle_status_conflicts", "Status writes that lost to a newer version"
)
RECONCILES = metrics.counter("respawn_lifecycle_reconciles", "Reconcile passes, by outcome", ["outcome"])
PASSES = metrics.counter(
    "respawn_lifecycle_reconcile_passes",
    "Reconcile passes: each reads the AppWrapper and what it observes, decides, and carries out "
    "the plan (a reconcile makes one or more)",
)
INVALID_VALUES = metrics.counter(
    "respawn_lifecycle_invalid_values",
    "Values of AppWrappers lifecycle could not use as given (counted when first told), by field",
    ["field"],
)


class _Announced:
    """What one reconcile knows of its AppWrapper's announcements, across its passes."""

    def __init__(self) -> None:
        # The marker of the transition whose announcements this reconcile delivered (or found
        # recorded); None when something is still owed.
        self.sent: str | None = None
        # The AppWrapper as last read or written, and the transition its status records.
        self.aw: Mapping[str, Any] | None = None
        self.transition: announcements.Transition | None = None
        # The AppWrapper goes away with this reconcile (its last finalizer was removed).
        self.vanishing = False

    def view(self, aw: Mapping[str, Any]) -> Mapping[str, Any]:
        """``aw`` with what this reconcile already delivered counted as recorded, so that a later
        pass does not send it again while the record is still to be written."""
        if self.sent is None:
            return aw
        meta = dict(aw.get("metadata") or {})
        meta["annotations"] = {**(meta.get("annotations") or {}), ANNOUNCED_ANNOTATION: self.sent}
        return {**aw, "metadata": meta}


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
        failures: Failures | None = None,
        transient_limit: int = 10,
        records: DeferredRecords | None = None,
    ) -> None:
        """``defaults``: the operator's fault-tolerance parameters (an AppWrapper's annotations
        override them); ``transient_limit``: the operator's transient retry limit (the same);
        ``on_gone`` is told of AppWrappers found deleted; ``clock`` is the
        server's time (see :class:`~services.lifecycle.serverclock.ServerClock`); ``records``:
        where an announced record alone waits to be written (None: each is written at the end of
        its reconcile; see :mod:`services.lifecycle.records`)."""
        self.reader = reader
        self.executor = executor
        self.queue = queue
        self.incidents = incidents
        self.defaults = defaults
        self.hooks = tuple(hooks)
        self.node_exclusion = node_exclusion
        self.transient_limit = transient_limit
        self.on_gone = on_gone
        self.clock = clock
        self.failures = failures if failures is not None else Failures(executor.announce_one)
        self.records = records
        self.locks: dict[Key, asyncio.Lock] = {}

    def lock(self, key: Key) -> asyncio.Lock:
        """``key``'s lock: one reconcile of an AppWrapper at a time, and no record written in the
        middle of one (:mod:`services.lifecycle.records`)."""
        return self.locks.setdefault(key, asyncio.Lock())

    async def reconcile_key(self, key: Key, verdict: Verdict | None, *, urgent: bool = False) -> VerdictUse:
        """Reconcile ``key`` with ``verdict`` (the latest for it, if any) until the plan settles.

        ``urgent``: an Unhealthy verdict has just arrived, so the first pass skips the reads a
        reset does not need (see :meth:`_reconcile`). Raises TransientError when the AppWrapper
        cannot be read or written (the caller retries). Any failure is first counted, logged
        with the AppWrapper's identity and, when it is about the object, told to its owner (see
        :mod:`services.lifecycle.failures`); ``failures.backoff(key)`` says when to retry.
        """
        async with self.lock(key):
            # An arriving Unhealthy verdict (``urgent``) is handled inside its incident's trace
            # (the bus continues the producer's context). Later passes of the same reset
            # (deletion stages, recreation, Running again) are triggered by observations and
            # timers, and are handed the same verdict as the latest: they rejoin the incident's
            # trace here, the one this process remembers or, after a restart or a takeover, the
            # one the AppWrapper's annotation records (from the cache: no request).
            if not urgent and key not in self.incidents:
                cached = self.reader.cached(key, INCIDENT_TRACE_ANNOTATION)
                if cached is not None:
                    self.incidents.adopt(key, cached)
            parent = None if urgent else self.incidents.context(key)
            with tracer.start_as_current_span(
                "lifecycle.reconcile",
                context=parent,
                attributes={"appwrapper.namespace": key[0], "appwrapper.name": key[1]},
            ):
                state = _Announced()
                try:
                    use = await self._reconcile(key, verdict, urgent=urgent, state=state)
                except Exception as exc:
                    RECONCILES.labels(outcome="failed").inc()
                    await self.failures.failed(key, state.aw, exc)
                    raise
                self.failures.succeeded(key)
                return use

    async def _reconcile(
        self, key: Key, verdict: Verdict | None, *, urgent: bool, state: _Announced
    ) -> VerdictUse:
        created: dict[int, CreateOutcome] = {}
        use = VerdictUse.NONE
        outcome = "passes-exhausted"
        incarnation = verdict.ref.uid if verdict is not None else ""
        for passes in range(MAX_PASSES):
            PASSES.inc()
            t_read = time.perf_counter()
            try:
                aw = await self.reader.appwrapper(key, incarnation)
            except KubeApiError as exc:
                raise TransientError(f"reading AppWrapper {key[0]}/{key[1]}: {exc}") from exc
            if aw is None:
                self.on_gone(key)
                if self.records is not None:
                    self.records.forget(key)
                self.reader.forget(key)
                self.failures.forget(key)
                RECONCILES.labels(outcome="gone").inc()
                return VerdictUse.SETTLED
            state.aw = aw
            if state.sent is None and self.records is not None:
                # A record this process owes, not yet written: as good as written for its passes.
                state.sent = self.records.marker(key, str(as_mapping(aw.get("metadata")).get("uid", "")))
            # Read by a GET (the cache could not answer before the span began): a reset under
            # way is still remembered, so that its annotation is kept and later passes rejoin it.
            self.incidents.adopt(key, aw)
            self.incidents.orphaned(key, aw)
            effective = validation.parameters(aw, self.defaults, self.transient_limit)
            params = effective.ft
            await self._tell_problems(aw, effective.warnings)
            was = str(as_mapping(aw.get("status")).get("phase", ""))
            t_observe = time.perf_counter()
            # An arriving Unhealthy verdict's first pass decides from the AppWrapper alone: the
            # decision (reset or fail, then delete the components it records) depends neither on
            # the pods nor on reading the components, and every read is a round trip on the way
            # to the Unhealthy status and the first delete. The machine treats what was not read
            # as unknown (no PodsReady change, no "all gone" conclusion, no missing component);
            # components are reported with the uid last confirmed ours, which is all a delete
            # needs (one never confirmed is read). Later passes, triggered by the deletion's
            # observations, read everything.
            quick = urgent and passes == 0
            # Nodes matter only to a reset after failed pods, i.e. with an Unhealthy verdict in
            # hand (they come from the node cache, free; a LIST only before it has synced).
            unhealthy = verdict is not None and verdict.state == "Unhealthy"
            # The consistency mode of deletion needs them too: which pods' nodes answer.
            observed = await self.reader.observe(
                aw,
                created,
                pods=not quick,
                components=not quick,
                nodes=unhealthy or params.consistency_mode,
                none_from_cache=was in _NO_CONCLUSION_FROM_NO_PODS
                and not as_mapping(aw.get("metadata")).get("deletionTimestamp"),
            )
            t_decide = time.perf_counter()
            now = self.clock()
            plan = reconcile(
                aw,
                observed,
                verdict,
                params,
                now,
                hooks=self.hooks,
                node_exclusion=self.node_exclusion,
                transient_limit=self.transient_limit,
            )
            # Announcements of the status in hand that a process killed after writing it never
            # sent (or never recorded as sent): derived from that status, with the ids the
            # original ones had, so a copy of one that did go out is dropped.
            view = state.view(aw)
            owed = announcements.owed(view, params.retry_limit, now)
            if log.isEnabledFor(logging.DEBUG):
                # Where a pass's time goes (read the AppWrapper / read components and pods /
                # decide), for when a verdict takes longer to apply than it should.
                log.debug(
                    "%s/%s pass (read %.0f ms, observe %.0f ms, decide %.1f ms): "
                    "phase %s -> %s, %d pods observed, %d actions, status %s, requeue %s, %d owed",
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
                    len(owed),
                )
            if verdict is not None and plan.verdict_use is not VerdictUse.NONE:
                use = plan.verdict_use
            if quick and plan.status is None:
                # Nothing to write (e.g. a redelivered verdict of a reset under way): then the
                # deletes are not guarded by the status write's resourceVersion, so decide again
                # from a full read.
                continue
            current = announcements.transition_of(aw)
            # Owed announcements go first: they describe the status in hand, which the plan
            # (if it writes one) comes after. owed() is empty when nothing is owed, or for an
            # AppWrapper last written before the record existed, whose transition is adopted.
            covered = announcements.covers(announcements.announced_marker(view), current)
            if not covered:
                covered = await self.executor.announce(aw, owed) if owed else True
            state.transition = current
            if covered and current is not None:
                state.sent = current.marker
            if plan.empty:
                RECONCILES.labels(outcome="idle").inc()
                outcome = ""
                break
            try:
                carried = await self.executor.carry_out(aw, plan, observed, verdict=verdict)
            except KubeApiError as exc:
                if exc.conflict:
                    # Someone else wrote first: recompute from the fresh object, never overwrite.
                    # It is read by a GET: the cache may not have it yet, and a pass on the cached
                    # one would lose again, until the passes run out.
                    CONFLICTS.inc()
                    RECONCILES.labels(outcome="conflict").inc()
                    self.reader.refresh(key)
                    created = {}
                    continue
                raise TransientError(f"writing AppWrapper {key[0]}/{key[1]}: {exc}") from exc
            state.aw = carried.aw
            state.vanishing = plan.finalizer is FinalizerChange.REMOVE
            if plan.status is not None:
                after = announcements.transition_of({"metadata": aw.get("metadata"), "status": plan.status})
                if after != current:
                    # A new transition: announced by the plan itself.
                    state.sent = after.marker if carried.announced and after is not None else None
                elif not carried.announced:
                    state.sent = None
                state.transition = after
            self.incidents.track(key, plan, was=was)
            if plan.requeue_at is not None:
                self.queue.requeue_at(plan.requeue_at, key)
            if not any(isinstance(a, CreateComponent) for a in plan.actions):
                RECONCILES.labels(outcome="done").inc()
                outcome = ""
                break
            created = carried.outcomes
        if outcome:
            RECONCILES.labels(outcome=outcome).inc()
            self.queue.requeue_at(self.clock(), key)
        await self._record(key, state)
        return use

    async def _record(self, key: Key, state: _Announced) -> None:
        """Record what this reconcile owes the AppWrapper's annotations, in one patch, only when
        they say otherwise: the transition whose announcements were all delivered, and the
        incident's trace (set when a reset began, removed when it ended). The announced record
        alone waits in ``records`` when there is one (one patch for a burst of transitions, none
        for an AppWrapper that goes away first)."""
        if state.aw is None or state.vanishing:
            if self.records is not None:
                self.records.forget(key)
            return
        annotations: dict[str, str | None] = {}
        if (
            state.sent is not None
            and state.transition is not None
            and state.sent == state.transition.marker
            and not announcements.covers(announcements.announced_marker(state.aw), state.transition)
        ):
            annotations[ANNOUNCED_ANNOTATION] = state.sent
        incident = self.incidents.annotation(key, state.aw)
        if incident is not KEEP:
            annotations[INCIDENT_TRACE_ANNOTATION] = incident if isinstance(incident, str) else None
        if self.records is not None:
            marker = annotations.get(ANNOUNCED_ANNOTATION)
            if list(annotations) == [ANNOUNCED_ANNOTATION] and marker is not None:
                self.records.owe(key, state.aw, marker)
                return
            if annotations:
                # This patch goes now, with the newest record if any: one still owed is older.
                self.records.taken(key)
        if annotations:
            await self.executor.record(state.aw, annotations)

    async def _tell_problems(self, aw: Mapping[str, Any], warnings: tuple[str, ...]) -> None:
        """Tell the AppWrapper's owner about each value lifecycle cannot use (an Event once per
        value and incarnation)."""
        found = validation.problems(aw, warnings)
        if not found:
            return
        meta = as_mapping(aw.get("metadata"))
        who = str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")
        for problem in found:
            digest = hashlib.sha256(problem.message.encode()).hexdigest()[:12]
            event = EmitEvent(
                type="Warning",
                reason=validation.INVALID_VALUE_EVENT,
                message=problem.message,
                id=f"{who}/{validation.INVALID_VALUE_EVENT}/{digest}",
            )
            if event.id in self.failures.reported:
                continue
            INVALID_VALUES.labels(field=problem.field.split("[", 1)[0]).inc()
            log.warning("%s/%s: %s", meta.get("namespace"), meta.get("name"), problem.message)
            await self.failures.reported.send(aw, event, self.executor.announce_one)
