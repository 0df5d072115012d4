"""lifecycle: verdicts and observations → AppWrapper status, component creation and deletion.

The only writer of AppWrapper status and the only creator/deleter of wrapped resources. All
decisions are made by the pure :func:`services.lifecycle.machine.reconcile`; this module reads
the cluster, calls it, and carries out its plan (see the machine's docstring for the order).

Work arrives three ways, all leading to "reconcile AppWrapper ns/name":
- verdicts (a durable consumer shared by all replicas: each verdict goes to one replica and is
  acked only after the status write it causes has succeeded);
- observations of AppWrappers, their pods and components (a shared durable consumer; they are
  only triggers, the reconcile reads the authoritative state from the API server);
- deadlines the machine asks for (``requeue_at``) and a periodic resync, so that a replica that
  dies with timers pending loses nothing: another replica's resync picks the work up.

Replicas may reconcile the same AppWrapper at once; the status write carries the
resourceVersion, so one wins and the other recomputes from fresh state (never overwrites).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections.abc import Awaitable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace

from services.lifecycle.actions import (
    CreateComponent,
    CreateOutcome,
    CreateResult,
    DeleteComponent,
    DeleteLeftoverPods,
    EmitEvent,
    ForceDeleteComponent,
    ForceDeletePods,
    LifecycleEventType,
    PublishLifecycleEvent,
)
from services.lifecycle.hooks import hooks_for
from services.lifecycle.machine import FinalizerChange, Plan, reconcile
from services.lifecycle.observed import Observed, ObservedComponent, ObservedPod, Presence
from services.lifecycle.placement.exclusion import decide_exclusions
from services.lifecycle.podcache import PodCache
from services.lifecycle.templating import PodTemplateHook
from services.lifecycle.verdicts import VerdictUse
from shared import metrics, subjects
from shared.appwrapper.constants import API_VERSION, APPWRAPPER_LABEL, FINALIZER, KIND, Reason
from shared.appwrapper.params import effective_fault_tolerance
from shared.appwrapper.podsets import component_pod_sets, get_at_path
from shared.bus import DeliverPolicy, Delivery, TransientError
from shared.faulttolerance import FaultTolerance
from shared.kube import Kube, KubeApiError, ResourceRef
from shared.kube.watch import list_pages
from shared.kubetime import utcnow
from shared.messages import AnyObservation, AppWrapperObservation, Message, PodObservation, Verdict
from shared.runtime import Runtime, entry

log = logging.getLogger(__name__)
tracer = trace.get_tracer("respawn.lifecycle")

COMPONENT = "respawn-lifecycle"
MAX_PASSES = 6  # reconcile passes per trigger (creates feed their outcomes into the next pass)
OBSERVATION_DEBOUNCE = timedelta(milliseconds=200)

PHASES = metrics.counter("respawn_lifecycle_phase_transitions", "Phase transitions", ["phase"])
RESETS = metrics.counter("respawn_lifecycle_resets", "Resets started, by cause", ["reason"])
ESCALATIONS = metrics.counter(
    "respawn_lifecycle_deletion_escalations", "Deletions escalated to grace period 0"
)
UNHEALTHY_TO_RESET = metrics.histogram(
    "respawn_lifecycle_unhealthy_to_reset_seconds",
    "From the first unhealthy observation to the reset's status write",
)
QUEUE = metrics.gauge("respawn_lifecycle_queue_depth", "AppWrappers waiting to be reconciled")
CONFLICTS = metrics.counter(
    "respawn_lifecycle_status_conflicts", "Status writes that lost to a newer version"
)
RECONCILES = metrics.counter("respawn_lifecycle_reconciles", "Reconcile passes, by outcome", ["outcome"])

Key = tuple[str, str]
_DELETES = (DeleteComponent, ForceDeleteComponent, DeleteLeftoverPods, ForceDeletePods)
# Phases that end an incident's trace (besides Running again after a reset).
_INCIDENT_ENDS = ("Succeeded", "Failed", "Suspended")


def key_of(message: Message) -> Key | None:
    ref = getattr(message, "ref", None)
    if ref is None:
        return None
    if isinstance(message, AppWrapperObservation | Verdict):
        return ref.namespace, ref.name
    appwrapper = getattr(message, "appwrapper", "")
    return (ref.namespace, appwrapper) if appwrapper else None


def needs_attention(aw: Mapping[str, Any]) -> bool:
    """Whether the periodic resync should reconcile this AppWrapper (it has work or a clock pending).

    Running workloads are driven by verdicts and observations; finished ones only while they
    still hold resources or quota (deletion, success TTL, deletion-on-failure grace).
    """
    meta = aw.get("metadata") or {}
    status = aw.get("status") or {}
    if meta.get("deletionTimestamp"):
        return True
    phase = status.get("phase", "")
    conditions = {
        c.get("type"): c.get("status") for c in status.get("conditions") or [] if isinstance(c, Mapping)
    }
    holding = conditions.get("ResourcesDeployed") == "True" or conditions.get("QuotaReserved") == "True"
    if phase in ("Failed", "Succeeded"):
        return holding
    if phase == "Suspended":
        return holding or not (aw.get("spec") or {}).get("suspend", False)
    return bool(phase != "Running")


def nodes_needed(aw: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]]) -> int:
    """How many nodes the workload needs at least, judged by its extended-resource requests.

    Node exclusion must not exclude so many nodes that the workload cannot fit: for each
    extended resource (e.g. nvidia.com/gpu) the pods ask for, the total request divided by the
    largest per-node allocatable, rounded up. Unparseable quantities count as one.
    """
    totals: dict[str, int] = {}
    for comp in (aw.get("spec") or {}).get("components") or []:
        try:
            pod_sets = component_pod_sets(comp)
        except Exception:  # a malformed component is reported elsewhere
            continue
        for ps in pod_sets:
            try:
                template = get_at_path(comp.get("template") or {}, ps.path)
            except Exception:
                continue
            containers = ((template or {}).get("spec") or {}).get("containers") or []
            for c in containers:
                res = c.get("resources") or {}
                wanted = {**(res.get("requests") or {}), **(res.get("limits") or {})}
                for name, qty in wanted.items():
                    if "/" in name:  # extended resources only (cpu/memory rarely decide placement here)
                        totals[name] = totals.get(name, 0) + _quantity(qty) * ps.count
    needed = 1
    for name, total in totals.items():
        per_node = max(
            (_quantity(((n.get("status") or {}).get("allocatable") or {}).get(name, 0)) for n in nodes),
            default=0,
        )
        if per_node > 0:
            needed = max(needed, -(-total // per_node))
    return needed


def _quantity(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 1


async def _unknown() -> ObservedComponent:
    return ObservedComponent()


def _controller_uid(obj: Mapping[str, Any]) -> str:
    for owner in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if owner.get("controller"):
            return str(owner.get("uid", ""))
    return ""


class Lifecycle:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.kube: Kube = rt.require_kube()
        self.defaults: FaultTolerance = rt.config.to_fault_tolerance()
        self.hooks: Sequence[PodTemplateHook] = hooks_for(rt.config)
        self.aw_ref: ResourceRef | None = None
        self.pods_ref: ResourceRef | None = None
        self.latest: dict[Key, Verdict] = {}
        self.incidents: dict[Key, otel_context.Context] = {}
        self.locks: dict[Key, asyncio.Lock] = {}
        # (priority, arrival, key); priority 0 for AppWrappers in the middle of a reset, 1 for
        # the rest. A key is queued once, at its best priority (``queued``).
        self.queue: asyncio.PriorityQueue[tuple[int, int, Key]] = asyncio.PriorityQueue()
        self.queued: dict[Key, int] = {}
        self.arrivals = 0
        self.timers: list[tuple[datetime, Key]] = []
        self.debounced: set[Key] = set()
        self.wake = asyncio.Event()
        # Pod changes trigger reconciles exactly as pod observations on the bus do.
        self.pod_cache = PodCache(on_change=self.debounce)
        settings = rt.config.lifecycle
        self.resync_seconds = settings.resync_period.total_seconds()
        self.workers = settings.workers
        self.verdict_concurrency = settings.verdict_concurrency

    # ------------------------------------------------------------------ triggers

    def enqueue(self, key: Key) -> None:
        """Queue a reconcile of ``key``; the passes of a reset under way go first.

        With thousands of AppWrappers a burst of observations (a mass start, say) can queue a
        reconcile of nearly every one of them. A reset waiting its turn behind them would keep
        a workload down for minutes for a pass that takes milliseconds.
        """
        priority = 0 if key in self.incidents else 1
        queued = self.queued.get(key)
        if queued is None or priority < queued:
            self.queued[key] = priority
            self.arrivals += 1
            self.queue.put_nowait((priority, self.arrivals, key))
            QUEUE.set(len(self.queued))

    async def next_key(self) -> Key:
        """The next key to reconcile, skipping entries superseded by a higher-priority one."""
        while True:
            priority, _, key = await self.queue.get()
            if self.queued.get(key) == priority:
                del self.queued[key]
                QUEUE.set(len(self.queued))
                return key

    def requeue_at(self, when: datetime, key: Key) -> None:
        heapq.heappush(self.timers, (when, key))
        self.wake.set()

    async def on_verdict(self, verdict: Verdict, delivery: Delivery) -> None:
        key = (verdict.ref.namespace, verdict.ref.name)
        known = self.latest.get(key)
        if known is None or known.ref.uid != verdict.ref.uid or known.seq <= verdict.seq:
            self.latest[key] = verdict
        if verdict.state == "Healthy":
            # A Healthy verdict changes at most a condition; it must not wait in line in front of
            # the verdicts that reset or finish workloads (the consumer is sequential). The
            # coalescing workers apply it with the AppWrapper's next reconcile.
            self.enqueue(key)
            return
        started = utcnow()
        use = await self.reconcile_key(key, verdict, urgent=verdict.state == "Unhealthy")
        log.debug(
            "verdict %s/%s %s seq %d (decided %.0f ms before arrival): %s after %.0f ms",
            key[0],
            key[1],
            verdict.state,
            verdict.seq,
            (started - verdict.decided_at).total_seconds() * 1000,
            use,
            (utcnow() - started).total_seconds() * 1000,
        )
        if use is VerdictUse.HELD:
            # Not applicable yet (e.g. the workload is still being created): keep it unacked.
            raise TransientError(f"verdict for {key[0]}/{key[1]} held", delay=1.0)

    async def on_observation(self, message: Message, delivery: Delivery) -> None:
        if isinstance(message, PodObservation) and self.pod_cache.synced:
            # The pod cache's own watch triggers the same reconcile, after the cache has the
            # change (a trigger from the bus could arrive first and read the cache stale).
            return
        key = key_of(message)
        if key is not None and key[1]:
            self.debounce(key)

    def debounce(self, key: Key) -> None:
        """Reconcile ``key`` a short moment from now, once however many triggers arrive.

        Observations come in bursts (a Job's pods start or go away together): reconcile once a
        short moment after the first, not once per pod."""
        if key not in self.debounced:
            self.debounced.add(key)
            self.requeue_at(utcnow() + OBSERVATION_DEBOUNCE, key)

    async def worker(self) -> None:
        while True:
            key = await self.next_key()
            try:
                await self.reconcile_key(key, self.latest.get(key))
            except Exception:
                log.exception("reconciling %s/%s failed; retrying in 1s", *key)
                self.requeue_at(utcnow(), key)
                await asyncio.sleep(1.0)

    async def timer(self) -> None:
        while True:
            if not self.timers:
                self.wake.clear()
                await self.wake.wait()
                continue
            when, key = self.timers[0]
            delay = (when - utcnow()).total_seconds()
            if delay > 0:
                self.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), timeout=min(delay, 30.0))
                continue
            heapq.heappop(self.timers)
            self.debounced.discard(key)
            self.enqueue(key)

    async def resync(self) -> None:
        """Reconcile every AppWrapper that is not at rest, now and then (covers lost timers)."""
        assert self.aw_ref is not None
        while True:
            try:
                # Page by page: a LIST of 10,000 whole AppWrappers (templates included) parsed at
                # once would set the process's peak memory every period.
                async for page, _ in list_pages(self.kube, self.aw_ref):
                    for aw in page:
                        if needs_attention(aw):
                            meta = aw.get("metadata", {})
                            self.enqueue((meta.get("namespace", ""), meta.get("name", "")))
            except KubeApiError as exc:
                log.warning("resync list failed: %s", exc)
            await asyncio.sleep(self.resync_seconds)

    # ------------------------------------------------------------------ reconcile

    async def reconcile_key(self, key: Key, verdict: Verdict | None, *, urgent: bool = False) -> VerdictUse:
        lock = self.locks.setdefault(key, asyncio.Lock())
        async with lock:
            # A verdict arrives inside its incident's trace (the bus continues the producer's
            # context). Later passes of the same reset (deletion stages, recreation) are
            # triggered by observations and timers, so they rejoin the incident's trace here.
            incident = self.incidents.get(key)
            parent = None if verdict is not None and verdict.state == "Unhealthy" else incident
            with tracer.start_as_current_span(
                "lifecycle.reconcile",
                context=parent,
                attributes={"appwrapper.namespace": key[0], "appwrapper.name": key[1]},
            ):
                return await self._reconcile(key, verdict, urgent=urgent)

    async def _reconcile(self, key: Key, verdict: Verdict | None, *, urgent: bool = False) -> VerdictUse:
        """Reconcile until the plan settles. ``urgent``: an Unhealthy verdict has just arrived,
        so the first pass skips the pod LIST (see below)."""
        assert self.aw_ref is not None
        created: dict[int, CreateOutcome] = {}
        use = VerdictUse.NONE
        for passes in range(MAX_PASSES):
            t_read = time.perf_counter()
            try:
                aw = await self.kube.get(self.aw_ref, key[1], key[0])
            except KubeApiError as exc:
                if exc.not_found:
                    self.latest.pop(key, None)
                    RECONCILES.labels(outcome="gone").inc()
                    return VerdictUse.SETTLED
                raise TransientError(f"reading AppWrapper {key[0]}/{key[1]}: {exc}") from exc
            aw.setdefault("apiVersion", API_VERSION)
            aw.setdefault("kind", KIND)
            annotations = (aw.get("metadata") or {}).get("annotations") or {}
            params = effective_fault_tolerance(annotations, self.defaults).ft
            t_observe = time.perf_counter()
            # An arriving Unhealthy verdict's first pass decides from the AppWrapper alone: the
            # decision (reset or fail, then delete the components it records) depends neither on
            # the pods nor on reading the components, and every read is a round trip on the way
            # to the Unhealthy status and the first delete. The machine treats what was not read
            # as unknown (no PodsReady change, no "all gone" conclusion, no missing component);
            # later passes, triggered by the deletion's observations, read everything.
            quick = urgent and passes == 0
            observed = await self.observe(aw, created, pods=not quick, components=not quick)
            t_decide = time.perf_counter()
            now = utcnow()
            plan = reconcile(aw, observed, verdict, params, now, hooks=self.hooks)
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
                    (aw.get("status") or {}).get("phase", ""),
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
                outcomes = await self.carry_out(aw, plan, verdict, observed)
            except KubeApiError as exc:
                if exc.conflict:
                    # Someone else wrote first: recompute from the fresh object, never overwrite.
                    CONFLICTS.inc()
                    RECONCILES.labels(outcome="conflict").inc()
                    created = {}
                    continue
                raise TransientError(f"writing AppWrapper {key[0]}/{key[1]}: {exc}") from exc
            await self.exclude_failed_nodes(aw, plan)
            self.track_incident(key, plan)
            if plan.requeue_at is not None:
                self.requeue_at(plan.requeue_at, key)
            creates = [a for a in plan.actions if isinstance(a, CreateComponent)]
            if not creates:
                RECONCILES.labels(outcome="done").inc()
                return use
            created = outcomes
        RECONCILES.labels(outcome="passes-exhausted").inc()
        self.requeue_at(utcnow(), key)
        return use

    async def observe(
        self,
        aw: Mapping[str, Any],
        created: Mapping[int, CreateOutcome],
        *,
        pods: bool = True,
        components: bool = True,
    ) -> Observed:
        """Authoritative reads of every component (unless ``components`` is False) and the
        labelled pods (unless ``pods`` is False), issued concurrently; what is not read is
        unknown."""
        meta = aw.get("metadata") or {}
        namespace, name, uid = meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", "")
        spec_components = (aw.get("spec") or {}).get("components") or []
        statuses = (aw.get("status") or {}).get("componentStatus") or []
        reads: list[Awaitable[ObservedComponent]] = []
        for index, comp in enumerate(spec_components):
            template = comp.get("template") if isinstance(comp, Mapping) else None
            if not components or not isinstance(template, Mapping):
                reads.append(_unknown())
                continue
            comp_name = ""
            if index < len(statuses) and isinstance(statuses[index], Mapping):
                comp_name = str(statuses[index].get("name") or "")
            comp_name = comp_name or str((template.get("metadata") or {}).get("name") or "")
            if index in created and created[index].name:
                comp_name = created[index].name
            reads.append(self.observe_component(template, namespace, comp_name, uid))
        if not pods:
            return Observed(components=tuple(await asyncio.gather(*reads)), pods=None, created=dict(created))
        seen, listed = await asyncio.gather(asyncio.gather(*reads), self.observe_pods(namespace, name))
        return Observed(components=tuple(seen), pods=listed, created=dict(created))

    async def observe_pods(self, namespace: str, name: str) -> tuple[ObservedPod, ...] | None:
        """The AppWrapper's pods: from the pod cache, or a LIST where the cache cannot answer
        (before it has synced, and whenever the answer would be "none": see PodCache)."""
        assert self.pods_ref is not None
        cached = self.pod_cache.pods(namespace, name)
        if cached is not None:
            return cached
        try:
            listing = await self.kube.list(
                self.pods_ref, namespace, labelSelector=f"{APPWRAPPER_LABEL}={name}"
            )
        except KubeApiError as exc:
            log.warning("listing pods of %s/%s failed: %s", namespace, name, exc)
            return None
        return tuple(ObservedPod.of(p) for p in listing.get("items", []))

    async def observe_component(
        self, template: Mapping[str, Any], namespace: str, name: str, aw_uid: str
    ) -> ObservedComponent:
        if not name:
            return ObservedComponent(presence=Presence.ABSENT)
        try:
            ref = await self.kube.resource(str(template.get("apiVersion", "")), str(template.get("kind", "")))
            obj = await self.kube.get(ref, name, namespace if ref.namespaced else None)
        except KubeApiError as exc:
            if exc.not_found:
                return ObservedComponent(presence=Presence.ABSENT, name=name)
            return ObservedComponent(presence=Presence.UNKNOWN, name=name)
        presence = Presence.DELETING if obj["metadata"].get("deletionTimestamp") else Presence.PRESENT
        return ObservedComponent(
            presence=presence,
            controlled_by_us=_controller_uid(obj) == aw_uid,
            name=name,
            uid=str(obj["metadata"].get("uid") or ""),
        )

    # ------------------------------------------------------------------ carrying out a plan

    async def carry_out(
        self, aw: dict[str, Any], plan: Plan, verdict: Verdict | None, observed: Observed | None = None
    ) -> dict[int, CreateOutcome]:
        """Carry out ``plan``; returns the outcome of each CreateComponent by component index.

        ``observed`` is what the plan was computed from: deletes name the objects seen there.
        """
        assert self.aw_ref is not None
        meta = aw["metadata"]
        resource_version = plan.resource_version or meta.get("resourceVersion", "")
        if plan.finalizer is FinalizerChange.ADD and FINALIZER not in (meta.get("finalizers") or []):
            body = {**aw, "metadata": {**meta, "finalizers": [*(meta.get("finalizers") or []), FINALIZER]}}
            body["metadata"]["resourceVersion"] = resource_version
            updated = await self.kube.replace(self.aw_ref, body)
            # Only the finalizer changed, and we changed it: the plan still holds.
            resource_version = updated["metadata"]["resourceVersion"]
            aw = updated
        # Our finalizer is the last one and goes in this plan: the AppWrapper vanishes as soon as
        # it is removed, so its final status (deletion complete, resources released) would be
        # written for nobody to read. At a clean-up of 10,000 AppWrappers that is 10,000 status
        # writes the API server is spared; the announcements still go out below.
        vanishing = (
            plan.finalizer is FinalizerChange.REMOVE
            and bool(meta.get("deletionTimestamp"))
            and list(meta.get("finalizers") or []) == [FINALIZER]
        )
        if plan.status is not None:
            if not vanishing:
                body = {**aw, "status": plan.status}
                body["metadata"] = {**aw["metadata"], "resourceVersion": resource_version}
                t_write = time.perf_counter()
                aw = await self.kube.replace_status(self.aw_ref, body)
                log.debug(
                    "%s/%s status written in %.0f ms",
                    meta.get("namespace"),
                    meta.get("name"),
                    (time.perf_counter() - t_write) * 1000,
                )
            self.record_transition(aw, plan, verdict)
        outcomes: dict[int, CreateOutcome] = {}
        # Deletes first (in their planned order: pods before components when forceful): they are
        # what a reset waits for, while events and announcements only describe it.
        for delete in [a for a in plan.actions if isinstance(a, _DELETES)]:
            t_delete = time.perf_counter()
            await self.act(aw, delete, observed)
            log.debug(
                "%s/%s %s in %.0f ms",
                meta.get("namespace"),
                meta.get("name"),
                type(delete).__name__,
                (time.perf_counter() - t_delete) * 1000,
            )
        for action in plan.actions:
            if isinstance(action, _DELETES):
                continue
            if isinstance(action, CreateComponent):
                with tracer.start_as_current_span(
                    "lifecycle.create_component", attributes={"component": action.index}
                ):
                    outcomes[action.index] = await self.create(action, meta.get("uid", ""))
            else:
                await self.act(aw, action, observed)
        if plan.finalizer is FinalizerChange.REMOVE:
            await self.remove_finalizer(meta["name"], meta.get("namespace"), aw["metadata"])
        return outcomes

    async def remove_finalizer(self, name: str, namespace: str | None, known: Mapping[str, Any]) -> None:
        """Remove our finalizer. ``known``: the metadata the plan was carried out on; the first
        attempt patches against its resourceVersion (one request instead of a read and a patch),
        and only if the object has changed since is it read afresh."""
        assert self.aw_ref is not None
        if known.get("resourceVersion"):
            finalizers = [f for f in known.get("finalizers") or [] if f != FINALIZER]
            try:
                # A resourceVersion in a merge patch is a precondition: a newer object -> 409.
                await self.kube.patch(
                    self.aw_ref,
                    name,
                    {"metadata": {"resourceVersion": known["resourceVersion"], "finalizers": finalizers}},
                    namespace,
                )
                return
            except KubeApiError as exc:
                if exc.not_found:
                    return
                if not exc.conflict:
                    raise
        try:
            fresh = await self.kube.get(self.aw_ref, name, namespace)
            finalizers = [f for f in fresh["metadata"].get("finalizers") or [] if f != FINALIZER]
            if len(finalizers) != len(fresh["metadata"].get("finalizers") or []):
                await self.kube.patch(
                    self.aw_ref,
                    name,
                    [
                        {
                            "op": "test",
                            "path": "/metadata/resourceVersion",
                            "value": fresh["metadata"]["resourceVersion"],
                        },
                        {"op": "replace", "path": "/metadata/finalizers", "value": finalizers},
                    ],
                    namespace,
                    patch_type="application/json-patch+json",
                )
        except KubeApiError as exc:
            # Gone already: another replica removed the finalizer first, which is the goal.
            if not exc.not_found:
                raise

    def track_incident(self, key: Key, plan: Plan) -> None:
        """Remember the trace of a reset until the workload runs again (or ends)."""
        kinds = {a.event.event for a in plan.actions if isinstance(a, PublishLifecycleEvent)}
        if LifecycleEventType.RESET_STARTED in kinds:
            self.incidents[key] = otel_context.get_current()
        elif LifecycleEventType.PHASE_CHANGED in kinds and plan.phase in ("Running", *_INCIDENT_ENDS):
            self.incidents.pop(key, None)

    async def exclude_failed_nodes(self, aw: Mapping[str, Any], plan: Plan) -> None:
        """Node exclusion on retry: keep the next attempt off the nodes where pods just failed.

        Recorded in the AppWrapper's ``respawn.dev/excluded-nodes`` annotation (read by the
        node-exclusion template hook when components are recreated). Autopilot migrations are
        not recorded here: anti-affinity already keeps pods off nodes Autopilot flags.
        """
        if not self.rt.config.node_exclusion.enabled:
            return
        started = [
            a.event
            for a in plan.actions
            if isinstance(a, PublishLifecycleEvent) and a.event.event == LifecycleEventType.RESET_STARTED
        ]
        if not started or not started[0].nodes or started[0].reason != str(Reason.FOUND_FAILED_PODS):
            return
        meta = aw.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        try:
            nodes_ref = await self.kube.resource("v1", "Node")
            listing = await self.kube.list(nodes_ref)
        except KubeApiError as exc:
            log.warning(
                "node exclusion skipped for %s/%s: cannot list nodes: %s",
                meta.get("namespace"),
                meta.get("name"),
                exc,
            )
            return
        usable = [
            n
            for n in listing.get("items", [])
            if not (n.get("spec") or {}).get("unschedulable")
            and any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in (n.get("status") or {}).get("conditions") or []
            )
        ]
        candidates = [n["metadata"]["name"] for n in usable]
        decision = decide_exclusions(
            annotations,
            failed_nodes=started[0].nodes,
            candidates=candidates,
            limit=self.rt.config.node_exclusion.max_nodes,
            min_nodes=nodes_needed(aw, usable),
        )
        if not decision.enabled:
            return
        patch = decision.annotation_patch()
        if all(annotations.get(k) == v for k, v in patch.items()):
            return
        assert self.aw_ref is not None
        try:
            await self.kube.patch(
                self.aw_ref, meta["name"], {"metadata": {"annotations": patch}}, meta.get("namespace")
            )
        except KubeApiError as exc:
            log.warning(
                "recording excluded nodes on %s/%s failed: %s", meta.get("namespace"), meta.get("name"), exc
            )
            return
        log.info(
            "%s/%s: excluding nodes %s on the next attempt",
            meta.get("namespace"),
            meta.get("name"),
            ", ".join(decision.nodes),
        )
        message = (
            decision.note or f"the next attempts avoid nodes {', '.join(decision.nodes)} where pods failed"
        )
        await self.act(aw, EmitEvent(type="Normal", reason="NodesExcluded", message=message))

    def record_transition(self, aw: Mapping[str, Any], plan: Plan, verdict: Verdict | None) -> None:
        for action in plan.actions:
            if not isinstance(action, PublishLifecycleEvent):
                continue
            event = action.event
            if event.event == LifecycleEventType.PHASE_CHANGED:
                PHASES.labels(phase=event.phase).inc()
            elif event.event == LifecycleEventType.RESET_STARTED:
                RESETS.labels(reason=event.reason or "-").inc()
                if verdict is not None and verdict.first_unhealthy_at is not None:
                    UNHEALTHY_TO_RESET.observe(
                        max(0.0, (utcnow() - verdict.first_unhealthy_at).total_seconds())
                    )
            elif event.event == LifecycleEventType.DELETION_FORCEFUL:
                ESCALATIONS.inc()

    async def act(self, aw: Mapping[str, Any], action: object, observed: Observed | None = None) -> None:
        """Carry out one action. Deletes carry the uid seen in ``observed`` as a precondition.

        A plan that changes no status is not guarded by the resourceVersion of a status write,
        so it may have been computed from a view that is stale by now: e.g. a deletion step of a
        reset that another replica has meanwhile completed, recreating the Job under the same
        name. Deleting by name alone would then delete the new attempt's Job (and fail the
        AppWrapper with MissingComponent); with the uid, the delete leaves a namesake alone.
        """
        meta = aw["metadata"]
        namespace = meta.get("namespace", "")
        if isinstance(action, DeleteComponent | ForceDeleteComponent):
            grace = 0 if isinstance(action, ForceDeleteComponent) else None
            span = "lifecycle.force_delete_component" if grace == 0 else "lifecycle.delete_component"
            seen = observed.component(action.index) if observed is not None else ObservedComponent()
            uid = seen.uid if seen.name == action.name else ""
            with tracer.start_as_current_span(span, attributes={"component": action.index}):
                try:
                    ref = await self.kube.resource(action.api_version, action.kind)
                    await self.kube.delete(
                        ref,
                        action.name,
                        action.namespace if ref.namespaced else None,
                        grace_period_seconds=grace,
                        uid=uid or None,
                    )
                except KubeApiError as exc:
                    if not exc.not_found:
                        log.warning("deleting %s %s/%s failed: %s", action.kind, namespace, action.name, exc)
        elif isinstance(action, DeleteLeftoverPods | ForceDeletePods):
            forced = isinstance(action, ForceDeletePods)
            with tracer.start_as_current_span(
                "lifecycle.force_delete_pods" if forced else "lifecycle.delete_leftover_pods",
                attributes={"pods": len(action.names)},
            ):
                await self.delete_pods(action.namespace, action.names, observed, forced=forced)
        elif isinstance(action, EmitEvent):
            try:
                await self.kube.create_event(
                    aw,
                    type_=action.type,
                    reason=action.reason,
                    message=action.message,
                    component=COMPONENT,
                    now_iso=utcnow().strftime("%Y-%m-%dT%H:%M:%SZ"),
                )
            except KubeApiError as exc:  # events are best effort, never a reason to stop
                log.warning(
                    "recording event %s on %s/%s failed: %s", action.reason, namespace, meta["name"], exc
                )
        elif isinstance(action, PublishLifecycleEvent):
            event = action.event
            await self.rt.bus.publish(
                subjects.lifecycle_event(event.ref.namespace, event.ref.name), event, msg_id=action.msg_id
            )
            log.info(
                "%s/%s %s %s%s",
                event.ref.namespace,
                event.ref.name,
                event.event,
                event.phase,
                f" ({event.reason}: {event.message})" if event.reason else "",
            )

    async def delete_pods(
        self, namespace: str, names: Sequence[str], observed: Observed | None, *, forced: bool
    ) -> None:
        """Delete pods by name, each with the uid seen in ``observed`` as a precondition (so a
        namesake created since is left alone); grace period 0 when ``forced``."""
        assert self.pods_ref is not None
        pods_ref = self.pods_ref
        seen_pods = (observed.pods if observed is not None else None) or ()
        pod_uids = {p.name: p.uid for p in seen_pods}
        limit = asyncio.Semaphore(16)  # a 64-pod workload: a few rounds, not 64 in a row

        async def delete(pod: str) -> None:
            async with limit:
                try:
                    await self.kube.delete(
                        pods_ref,
                        pod,
                        namespace,
                        grace_period_seconds=0 if forced else None,
                        uid=pod_uids.get(pod) or None,
                    )
                except KubeApiError as exc:
                    # Gone already (the garbage collector or another replica was first), or
                    # replaced by a namesake (uid precondition): either way not ours to retry.
                    if not (exc.not_found or exc.conflict):
                        log.warning("deleting pod %s/%s failed: %s", namespace, pod, exc)

        await asyncio.gather(*(delete(pod) for pod in names))

    async def create(self, action: CreateComponent, aw_uid: str) -> CreateOutcome:
        body = action.body
        api_version, kind = str(body.get("apiVersion", "")), str(body.get("kind", ""))
        namespace = str((body.get("metadata") or {}).get("namespace") or "")
        try:
            ref = await self.kube.resource(api_version, kind)
        except KubeApiError as exc:
            if exc.not_found:
                return CreateOutcome(CreateResult.NO_MATCH, message=exc.message)
            return CreateOutcome(CreateResult.ERROR, message=exc.message)
        try:
            created = await self.kube.create(ref, body, namespace if ref.namespaced else None)
            return CreateOutcome(CreateResult.CREATED, name=created["metadata"]["name"])
        except KubeApiError as exc:
            if exc.already_exists:
                name = str((body.get("metadata") or {}).get("name") or "")
                try:
                    existing = await self.kube.get(ref, name, namespace if ref.namespaced else None)
                except KubeApiError as get_exc:
                    return CreateOutcome(CreateResult.ERROR, name=name, message=get_exc.message)
                ours = _controller_uid(existing) == aw_uid
                return CreateOutcome(
                    CreateResult.ALREADY_EXISTS, name=name, controlled_by_us=ours, message=exc.message
                )
            if exc.invalid:
                return CreateOutcome(CreateResult.INVALID, message=exc.message)
            if exc.not_found and "namespaces" in exc.message:
                return CreateOutcome(CreateResult.ERROR, message=exc.message)
            return CreateOutcome(CreateResult.ERROR, message=exc.message)

    # ------------------------------------------------------------------ main

    async def resolve(self, api_version: str, kind: str) -> ResourceRef:
        """Wait for a kind to be served (e.g. the CRD installed after the controller)."""
        delay = 0.5
        while True:
            try:
                return await self.kube.resource(api_version, kind)
            except KubeApiError as exc:
                log.warning("%s %s not available yet (%s); retrying in %.0fs", api_version, kind, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)

    async def run(self) -> None:
        self.aw_ref = await self.resolve(API_VERSION, KIND)
        self.pods_ref = await self.resolve("v1", "Pod")
        tasks = [
            asyncio.create_task(self.worker(), name=f"lifecycle-worker-{i}") for i in range(self.workers)
        ]
        tasks.append(asyncio.create_task(self.timer(), name="lifecycle-timers"))
        tasks.append(asyncio.create_task(self.resync(), name="lifecycle-resync"))
        tasks.append(
            asyncio.create_task(self.pod_cache.run(self.kube, self.pods_ref), name="lifecycle-pod-cache")
        )
        verdicts = await self.rt.bus.consume(
            subjects.VERDICTS_STREAM,
            "lifecycle-verdicts",
            subjects.verdict_filter(),
            Verdict,
            self.on_verdict,
            max_deliver=100_000,  # held verdicts are redelivered until they apply
            ack_wait=60.0,
            # One AppWrapper's verdicts in order, different AppWrappers' at once: a verdict takes
            # a few API round trips, and a burst of them must not queue behind each other.
            concurrency=self.verdict_concurrency,
        )
        observations = await self.rt.bus.consume(
            subjects.OBSERVATIONS_STREAM,
            "lifecycle-observations",
            subjects.appwrapper_obs_filter(),
            AnyObservation,
            self.on_observation,
            # A durable created for the first time starts at the current end of the stream: the initial
            # resync covers existing AppWrappers, and verdicts from before this controller ran are old.
            deliver_policy=DeliverPolicy.NEW,
        )
        self.rt.add_check("consumers", lambda: verdicts.running and observations.running)
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()


async def main(rt: Runtime) -> None:
    await Lifecycle(rt).run()


def run() -> None:
    entry("lifecycle", main)


__all__ = ["Lifecycle", "key_of", "run"]
