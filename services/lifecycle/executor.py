"""Carrying out a :class:`~services.lifecycle.machine.Plan` against Kubernetes and the bus.

The order is the machine's (see its module docstring and docs/lifecycle.md): finalizer added,
status written (a conflict propagates as a :class:`KubeApiError`, and nothing else of the plan
is done), deletes, the other actions in order, finalizer removed. Nothing here decides anything
the plan did not say; the only judgement left is what a failed call means for the call itself
(a NotFound delete is success, a failed Event is not a reason to stop).

Guards that hold whatever the plan says:

- a component is only ever deleted with the uid of an object confirmed to be this AppWrapper's as
  a precondition; a delete without one is refused (and counted);
- Events with an id are created under a name derived from it, so a second copy is refused by the
  API server (AlreadyExists) rather than recorded twice; announcements report whether they were
  all delivered, so that the caller records them as sent only then.

Every response carrying a time the API server wrote (a created object's creationTimestamp, a
status write's managedFields) is a sample for the :class:`ServerClock`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, assert_never

from opentelemetry import trace

from services.lifecycle.actions import (
    Action,
    CreateComponent,
    CreateOutcome,
    CreateResult,
    DeleteComponent,
    DeletePods,
    EmitEvent,
    ExcludeNodes,
    LifecycleEventType,
    PublishLifecycleEvent,
)
from services.lifecycle.announcements import event_name
from services.lifecycle.latencies import ResetTimes
from services.lifecycle.machine import FinalizerChange, Plan
from services.lifecycle.observed import Observed, ObservedComponent, controller_uid
from services.lifecycle.placement.exclusion import excluded_nodes_patch
from services.lifecycle.serverclock import ServerClock
from shared import metrics, subjects
from shared.appwrapper.constants import FINALIZER
from shared.kube import KubeApiError, ResourceRef
from shared.kubetime import format_kube_time, parse_kube_time
from shared.messages import Message, Verdict

__all__ = ["COMPONENT", "EVENTS", "Carried", "Executor", "KubeWrites", "Publisher"]

log = logging.getLogger(__name__)
tracer = trace.get_tracer("respawn.lifecycle")

# The source of the Kubernetes Events lifecycle records.
COMPONENT = "respawn-lifecycle"
EVENTS = ResourceRef(group="", version="v1", plural="events", kind="Event", namespaced=True)

PHASES = metrics.counter("respawn_lifecycle_phase_transitions", "Phase transitions", ["phase"])
RESETS = metrics.counter(
    "respawn_lifecycle_resets", "Resets started, by cause and failure class", ["reason", "failure_class"]
)
ESCALATIONS = metrics.counter(
    "respawn_lifecycle_deletion_escalations", "Deletions escalated to grace period 0"
)
UNHEALTHY_TO_RESET = metrics.histogram(
    "respawn_lifecycle_unhealthy_to_reset_seconds",
    "From the first unhealthy observation to the reset's status write",
    buckets=metrics.LATENCY_BUCKETS,
)
REACTION_SECONDS = metrics.histogram(
    "respawn_lifecycle_reaction_seconds",
    "From an Unhealthy verdict (its decided_at) to the first delete of the reset it started",
    buckets=metrics.LATENCY_BUCKETS,
)
RECOVERY_SECONDS = metrics.histogram(
    "respawn_lifecycle_recovery_seconds",
    "From a failure (the verdict's first_unhealthy_at) to the AppWrapper's phase Running again "
    "after the reset (or resets) it caused",
    buckets=metrics.LATENCY_BUCKETS,
)
REFUSED_DELETES = metrics.counter(
    "respawn_lifecycle_deletes_refused",
    "Component deletes not made: no object confirmed to be the AppWrapper's (no uid to guard them)",
)
ANNOUNCEMENTS = metrics.counter(
    "respawn_lifecycle_announcements",
    "Announcements sent, by kind (event, message) and outcome (sent, duplicate, failed)",
    ["kind", "outcome"],
)

_DELETES = (DeleteComponent, DeletePods)


def _starts_reset(plan: Plan) -> bool:
    return any(
        isinstance(a, PublishLifecycleEvent) and a.event.event == LifecycleEventType.RESET_STARTED
        for a in plan.actions
    )


class KubeWrites(Protocol):
    """The calls the executor makes (a subset of :class:`shared.kube.Kube`)."""

    # A deliberate mirror: these signatures repeat those of shared.kube.Kube, so that the executor
    # names only what it uses and its tests may put a pass-through wrapper (fault injection, call
    # records) in front of the real client; keep the two in step.

    async def resource(self, api_version: str, kind: str) -> ResourceRef: ...

    async def get(self, ref: ResourceRef, name: str, namespace: str | None = None) -> dict[str, Any]: ...

    async def create(
        self,
        ref: ResourceRef,
        body: Mapping[str, Any],
        namespace: str | None = None,
        *,
        dry_run: bool = False,
    ) -> dict[str, Any]: ...

    async def replace(self, ref: ResourceRef, body: Mapping[str, Any]) -> dict[str, Any]: ...

    async def replace_status(self, ref: ResourceRef, body: Mapping[str, Any]) -> dict[str, Any]: ...

    async def patch(
        self,
        ref: ResourceRef,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        patch_type: str = "application/merge-patch+json",
    ) -> dict[str, Any]: ...

    async def delete(
        self,
        ref: ResourceRef,
        name: str,
        namespace: str | None = None,
        *,
        grace_period_seconds: int | None = None,
        uid: str | None = None,
    ) -> dict[str, Any] | None: ...

    async def create_event(
        self,
        involved: Mapping[str, Any],
        *,
        type_: str,
        reason: str,
        message: str,
        component: str,
        now_iso: str,
    ) -> None: ...


class Publisher(Protocol):
    """The bus, as far as the executor uses it."""

    async def publish(self, subject: str, message: Message, *, msg_id: str | None) -> Any: ...


@dataclass(slots=True)
class Carried:
    """How carrying out a plan went."""

    # The outcome of each CreateComponent, by component index.
    outcomes: dict[int, CreateOutcome] = field(default_factory=dict)
    # Whether every announcement of the plan was delivered (only then may it be recorded as sent).
    announced: bool = True
    # The AppWrapper as the last write returned it (or as given, when nothing was written).
    aw: dict[str, Any] = field(default_factory=dict)


class Executor:
    def __init__(
        self,
        kube: KubeWrites,
        bus: Publisher,
        *,
        appwrappers: ResourceRef,
        pods: ResourceRef,
        clock: ServerClock | None = None,
    ) -> None:
        """``clock``: the server's time (times written into Events; sampled from responses)."""
        self.kube = kube
        self.bus = bus
        self.appwrappers = appwrappers
        self.pods = pods
        self.server_clock = clock if clock is not None else ServerClock()
        self.clock = self.server_clock.now
        self.resets = ResetTimes()

    async def carry_out(
        self,
        aw: dict[str, Any],
        plan: Plan,
        observed: Observed | None = None,
        *,
        verdict: Verdict | None = None,
    ) -> Carried:
        """Carry out ``plan``: the outcome of each CreateComponent by component index, and
        whether its announcements were all delivered.

        ``observed`` is what the plan was computed from: deletes name the objects seen there.
        ``verdict`` is the one the plan applied (for the unhealthy-to-reset metric).
        """
        meta = aw["metadata"]
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        resource_version = plan.resource_version or meta.get("resourceVersion", "")
        if plan.finalizer is FinalizerChange.ADD and FINALIZER not in (meta.get("finalizers") or []):
            # A merge patch, not a PUT of the whole object: the spec is the user's and may be
            # nested deeper than a recursive encoder survives; the resourceVersion in it is a
            # precondition (a newer object -> 409), as it would be in a PUT.
            finalizers = [*(meta.get("finalizers") or []), FINALIZER]
            patch = {"metadata": {"resourceVersion": resource_version, "finalizers": finalizers}}
            updated = await self.kube.patch(self.appwrappers, meta["name"], patch, meta.get("namespace"))
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
                # The status subresource takes only the status (and the resourceVersion as a
                # precondition) from what it is sent, so the user's spec is not sent along.
                body = {
                    "apiVersion": aw.get("apiVersion"),
                    "kind": aw.get("kind"),
                    "metadata": {**aw["metadata"], "resourceVersion": resource_version},
                    "status": plan.status,
                }
                t_write = time.perf_counter()
                was = str((aw.get("status") or {}).get("phase", ""))
                # A span per status write, naming the phase it moves to: in an incident's trace,
                # the write to Resetting is the reaction and the one to Running the recovery.
                with tracer.start_as_current_span(
                    "lifecycle.write_status",
                    attributes={"appwrapper.phase": plan.phase, "appwrapper.previous_phase": was},
                ):
                    aw = await self.kube.replace_status(self.appwrappers, body)
                self.server_clock.written_before(_status_written_at(aw), self.server_clock.local())
                log.debug(
                    "%s/%s status written in %.0f ms",
                    meta.get("namespace"),
                    meta.get("name"),
                    (time.perf_counter() - t_write) * 1000,
                )
            self.record_transition(plan, verdict)
            if verdict is not None and verdict.state == "Unhealthy" and _starts_reset(plan):
                self.resets.started(key, verdict)
            recovery = self.resets.phase(key, plan.phase, self.clock())
            if recovery is not None:
                RECOVERY_SECONDS.observe(recovery)
        carried = Carried(aw=aw)
        outcomes = carried.outcomes
        # Deletes first (in their planned order: pods before components when forceful): they are
        # what a reset waits for, while events and announcements only describe it.
        for delete in [a for a in plan.actions if isinstance(a, _DELETES)]:
            t_delete = time.perf_counter()
            await self.act(aw, delete, observed)
            reaction = self.resets.deleted(key, self.clock())
            if reaction is not None:
                REACTION_SECONDS.observe(reaction)
            log.debug(
                "%s/%s %s in %.0f ms",
                meta.get("namespace"),
                meta.get("name"),
                type(delete).__name__,
                (time.perf_counter() - t_delete) * 1000,
            )
        for action in plan.actions:
            if isinstance(action, (*_DELETES, EmitEvent, PublishLifecycleEvent)):
                continue
            if isinstance(action, CreateComponent):
                with tracer.start_as_current_span(
                    "lifecycle.create_component", attributes={"component": action.index}
                ):
                    outcomes[action.index] = await self.create(action, meta.get("uid", ""))
            else:
                await self.act(aw, action, observed)
        carried.announced = await self.announce(aw, plan.actions)
        if plan.finalizer is FinalizerChange.REMOVE:
            await self.remove_finalizer(meta["name"], meta.get("namespace"), aw["metadata"])
        return carried

    async def announce(self, aw: Mapping[str, Any], actions: Sequence[Action]) -> bool:
        """Send the announcements among ``actions`` (a plan's, or those owed after a crash);
        whether all were delivered.

        The Events go out side by side, beside the lifecycle messages, which go out one after
        another in the plan's order (a reader of the stream sees them as they happened): one
        after another, a pass that announces a phase change waited for a round trip per
        Event, and a mass start of thousands of AppWrappers for all of them in turn.
        """
        events = [a for a in actions if isinstance(a, EmitEvent)]
        messages = [a for a in actions if isinstance(a, PublishLifecycleEvent)]

        async def in_order() -> bool:
            delivered = True
            for message in messages:
                delivered = await self.announce_one(aw, message) and delivered
            return delivered

        results = await asyncio.gather(in_order(), *(self.announce_one(aw, event) for event in events))
        return all(results)

    async def announce_one(self, aw: Mapping[str, Any], action: EmitEvent | PublishLifecycleEvent) -> bool:
        """One announcement; whether it was delivered (a copy refused as a duplicate was).

        A failure is logged, never raised: the workload's progress does not wait for its
        announcements, which a later pass re-sends (the caller does not record them as sent).
        """
        meta = aw["metadata"]
        if isinstance(action, PublishLifecycleEvent):
            event = action.event
            try:
                published = await self.bus.publish(
                    subjects.lifecycle_event(event.ref.namespace, event.ref.name), event, msg_id=action.msg_id
                )
            except Exception as exc:  # the bus retried for a while already; a later pass re-sends
                ANNOUNCEMENTS.labels(kind="message", outcome="failed").inc()
                log.warning(
                    "publishing %s of %s/%s failed (it will be re-sent): %s",
                    event.event,
                    event.ref.namespace,
                    event.ref.name,
                    exc,
                )
                return False
            duplicate = bool(getattr(published, "duplicate", False))
            ANNOUNCEMENTS.labels(kind="message", outcome="duplicate" if duplicate else "sent").inc()
            log.info(
                "%s/%s %s %s%s%s",
                event.ref.namespace,
                event.ref.name,
                event.event,
                event.phase,
                f" ({event.reason}: {event.message})" if event.reason else "",
                " (a copy: dropped as a duplicate)" if duplicate else "",
            )
            return True
        try:
            if action.id:
                await self.create_event(aw, action)
            else:
                await self.kube.create_event(
                    aw,
                    type_=action.type,
                    reason=action.reason,
                    message=action.message,
                    component=COMPONENT,
                    now_iso=format_kube_time(self.clock()),
                )
        except KubeApiError as exc:
            if exc.already_exists:
                ANNOUNCEMENTS.labels(kind="event", outcome="duplicate").inc()
                return True
            ANNOUNCEMENTS.labels(kind="event", outcome="failed").inc()
            log.warning(
                "recording event %s on %s/%s failed: %s",
                action.reason,
                meta.get("namespace"),
                meta["name"],
                exc,
            )
            return False
        ANNOUNCEMENTS.labels(kind="event", outcome="sent").inc()
        return True

    async def create_event(self, aw: Mapping[str, Any], action: EmitEvent) -> None:
        """A core/v1 Event on ``aw`` named after ``action.id`` (AlreadyExists: a copy)."""
        meta = aw["metadata"]
        namespace = meta.get("namespace") or "default"
        now = format_kube_time(self.clock())
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": event_name(meta["name"], action.id), "namespace": namespace},
            "involvedObject": {
                "apiVersion": aw.get("apiVersion", ""),
                "kind": aw.get("kind", ""),
                "name": meta["name"],
                "namespace": namespace,
                "uid": meta.get("uid", ""),
                "resourceVersion": meta.get("resourceVersion", ""),
            },
            "type": action.type,
            "reason": action.reason,
            "message": action.message[:1024],
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        sent = self.server_clock.local()
        created = await self.kube.create(EVENTS, body, namespace)
        self.server_clock.created(
            parse_kube_time((created.get("metadata") or {}).get("creationTimestamp")),
            sent,
            self.server_clock.local(),
        )

    async def record(self, aw: Mapping[str, Any], annotations: Mapping[str, str | None]) -> bool:
        """Record what a reconcile owes the AppWrapper's own annotations: the announced
        transition (``respawn.dev/announced``) and the incident's trace
        (``respawn.dev/incident-trace``; None removes it).

        A merge patch without a precondition: it touches only those annotations, and a value
        overwritten by a slower replica with an older transition only makes the next pass re-send
        that transition's announcements, which their ids make harmless.
        """
        meta = aw["metadata"]
        try:
            await self.kube.patch(
                self.appwrappers,
                meta["name"],
                {"metadata": {"annotations": dict(annotations)}},
                meta.get("namespace"),
            )
        except KubeApiError as exc:
            if not exc.not_found:
                log.warning(
                    "recording %s on %s/%s failed (recorded by a later pass): %s",
                    ", ".join(sorted(annotations)),
                    meta.get("namespace"),
                    meta["name"],
                    exc,
                )
            return False
        return True

    async def record_incarnation(
        self, ref: Mapping[str, Any], annotations: Mapping[str, str | None]
    ) -> bool | None:
        """:meth:`record` for a record written later (:mod:`services.lifecycle.records`), on the
        incarnation ``ref`` names (name, namespace, uid): True when written, False when it failed
        (worth another try), None when that incarnation is gone (deleted, or replaced by one of
        the same name: the uid in the patch makes the API server refuse it)."""
        patch: dict[str, Any] = {"metadata": {"annotations": dict(annotations)}}
        if ref.get("uid"):
            patch["metadata"]["uid"] = ref["uid"]
        try:
            await self.kube.patch(self.appwrappers, ref["name"], patch, ref.get("namespace"))
        except KubeApiError as exc:
            if exc.not_found or exc.conflict or exc.invalid:
                return None
            log.warning(
                "recording %s on %s/%s failed (tried again): %s",
                ", ".join(sorted(annotations)),
                ref.get("namespace"),
                ref["name"],
                exc,
            )
            return False
        return True

    async def sync_clock(self) -> None:
        """Sample the server's clock with a dry-run create (the server sets the creationTimestamp
        of an object it would create; nothing is stored)."""
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": "respawn-lifecycle-clock.", "namespace": "default"},
            "involvedObject": {"apiVersion": "v1", "kind": "Namespace", "name": "default"},
            "type": "Normal",
            "reason": "ClockProbe",
            "message": "dry run: never stored",
            "source": {"component": COMPONENT},
        }
        sent = self.server_clock.local()
        try:
            probe = await self.kube.create(EVENTS, body, "default", dry_run=True)
        except KubeApiError as exc:
            log.warning("sampling the API server's clock failed: %s", exc)
            return
        self.server_clock.created(
            parse_kube_time((probe.get("metadata") or {}).get("creationTimestamp")),
            sent,
            self.server_clock.local(),
        )

    def record_transition(self, plan: Plan, verdict: Verdict | None) -> None:
        """The metrics of a status write: count what the plan announces."""
        for action in plan.actions:
            if not isinstance(action, PublishLifecycleEvent):
                continue
            event = action.event
            if event.event == LifecycleEventType.PHASE_CHANGED:
                PHASES.labels(phase=event.phase).inc()
            elif event.event == LifecycleEventType.RESET_STARTED:
                RESETS.labels(reason=event.reason or "-", failure_class=event.failure_class or "-").inc()
                if verdict is not None and verdict.first_unhealthy_at is not None:
                    UNHEALTHY_TO_RESET.observe(
                        max(0.0, (self.clock() - verdict.first_unhealthy_at).total_seconds())
                    )
            elif event.event == LifecycleEventType.DELETION_FORCEFUL:
                ESCALATIONS.inc()

    async def act(self, aw: Mapping[str, Any], action: Action, observed: Observed | None = None) -> None:
        """Carry out one action (but a create: see :meth:`create`). Deletes carry the uid seen in
        ``observed`` as a precondition.

        A plan that changes no status is not guarded by the resourceVersion of a status write,
        so it may have been computed from a view that is stale by now: e.g. a deletion step of a
        reset that another replica has meanwhile completed, recreating the Job under the same
        name. Deleting by name alone would then delete the new attempt's Job (and fail the
        AppWrapper with MissingComponent); with the uid, the delete leaves a namesake alone.
        """
        meta = aw["metadata"]
        namespace = meta.get("namespace", "")
        match action:
            case DeleteComponent():
                await self.delete_component(action, observed)
            case DeletePods():
                with tracer.start_as_current_span(
                    "lifecycle.force_delete_pods" if action.force else "lifecycle.delete_leftover_pods",
                    attributes={"pods": len(action.names)},
                ):
                    await self.delete_pods(action.namespace, action.names, observed, force=action.force)
            case ExcludeNodes():
                try:
                    await self.kube.patch(
                        self.appwrappers,
                        meta["name"],
                        {"metadata": {"annotations": excluded_nodes_patch(action.nodes)}},
                        meta.get("namespace"),
                    )
                except KubeApiError as exc:
                    log.warning("recording excluded nodes on %s/%s failed: %s", namespace, meta["name"], exc)
                    return
                log.info(
                    "%s/%s: excluding nodes %s on the next attempt",
                    namespace,
                    meta["name"],
                    ", ".join(action.nodes),
                )
            case EmitEvent() | PublishLifecycleEvent():
                # Events are best effort, never a reason to stop; see announce_one.
                await self.announce_one(aw, action)
            case CreateComponent():
                raise TypeError("a CreateComponent has an outcome: carry it out with create()")
            case _:
                assert_never(action)

    async def delete_component(self, action: DeleteComponent, observed: Observed | None) -> None:
        """Delete a wrapped resource confirmed to be this AppWrapper's: with its uid (the
        action's, or the one seen in ``observed`` under that name with our controller owner
        reference) as a precondition; grace period 0 when ``action.force``. NotFound is success.

        Without a uid the delete is refused: by name alone it could remove an object of that name
        that is not ours (another team's, or a namesake created since the plan was computed).
        """
        seen = observed.component(action.index) if observed is not None else ObservedComponent()
        uid = action.uid or (seen.uid if seen.name == action.name and seen.controlled_by_us else "")
        if not uid:
            REFUSED_DELETES.inc()
            log.warning(
                "not deleting %s %s/%s: no object of that name is confirmed to be this AppWrapper's",
                action.kind,
                action.namespace,
                action.name,
            )
            return
        span = "lifecycle.force_delete_component" if action.force else "lifecycle.delete_component"
        with tracer.start_as_current_span(span, attributes={"component": action.index}):
            try:
                ref = await self.kube.resource(action.api_version, action.kind)
                await self.kube.delete(
                    ref,
                    action.name,
                    action.namespace if ref.namespaced else None,
                    grace_period_seconds=0 if action.force else None,
                    uid=uid,
                )
            except KubeApiError as exc:
                if not exc.not_found:
                    log.warning(
                        "deleting %s %s/%s failed: %s", action.kind, action.namespace, action.name, exc
                    )

    async def delete_pods(
        self, namespace: str, names: Sequence[str], observed: Observed | None, *, force: bool
    ) -> None:
        """Delete pods by name, each with the uid seen in ``observed`` as a precondition (so a
        namesake created since is left alone); grace period 0 when ``force``."""
        seen_pods = (observed.pods if observed is not None else None) or ()
        pod_uids = {p.name: p.uid for p in seen_pods}
        limit = asyncio.Semaphore(16)  # a 64-pod workload: a few rounds, not 64 in a row

        async def delete(pod: str) -> None:
            async with limit:
                try:
                    await self.kube.delete(
                        self.pods,
                        pod,
                        namespace,
                        grace_period_seconds=0 if force else None,
                        uid=pod_uids.get(pod) or None,
                    )
                except KubeApiError as exc:
                    # Gone already (the garbage collector or another replica was first), or
                    # replaced by a namesake (uid precondition): either way not ours to retry.
                    if not (exc.not_found or exc.conflict):
                        log.warning("deleting pod %s/%s failed: %s", namespace, pod, exc)

        await asyncio.gather(*(delete(pod) for pod in names))

    async def create(self, action: CreateComponent, aw_uid: str) -> CreateOutcome:
        """Create a component; how the call ended is for the machine to judge (see CreateOutcome)."""
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
            sent = self.server_clock.local()
            created = await self.kube.create(ref, body, namespace if ref.namespaced else None)
            created_meta = created["metadata"]
            self.server_clock.created(
                parse_kube_time(created_meta.get("creationTimestamp")), sent, self.server_clock.local()
            )
            return CreateOutcome(
                CreateResult.CREATED, name=created_meta["name"], uid=str(created_meta.get("uid") or "")
            )
        except KubeApiError as exc:
            if exc.already_exists:
                name = str((body.get("metadata") or {}).get("name") or "")
                try:
                    existing = await self.kube.get(ref, name, namespace if ref.namespaced else None)
                except KubeApiError as get_exc:
                    return CreateOutcome(CreateResult.ERROR, name=name, message=get_exc.message)
                ours = bool(aw_uid) and controller_uid(existing) == aw_uid
                return CreateOutcome(
                    CreateResult.ALREADY_EXISTS,
                    name=name,
                    controlled_by_us=ours,
                    message=exc.message,
                    uid=str((existing.get("metadata") or {}).get("uid") or "") if ours else "",
                )
            if exc.invalid:
                return CreateOutcome(CreateResult.INVALID, message=exc.message)
            return CreateOutcome(CreateResult.ERROR, message=exc.message)

    async def remove_finalizer(self, name: str, namespace: str | None, known: Mapping[str, Any]) -> None:
        """Remove our finalizer. ``known``: the metadata the plan was carried out on; the first
        attempt patches against its resourceVersion (one request instead of a read and a patch),
        and only if the object has changed since is it read afresh."""
        if known.get("resourceVersion"):
            finalizers = [f for f in known.get("finalizers") or [] if f != FINALIZER]
            try:
                # A resourceVersion in a merge patch is a precondition: a newer object -> 409.
                await self.kube.patch(
                    self.appwrappers,
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
            fresh = await self.kube.get(self.appwrappers, name, namespace)
            finalizers = [f for f in fresh["metadata"].get("finalizers") or [] if f != FINALIZER]
            if len(finalizers) != len(fresh["metadata"].get("finalizers") or []):
                await self.kube.patch(
                    self.appwrappers,
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


def _status_written_at(aw: Mapping[str, Any]) -> datetime | None:
    """The newest managedFields time of a status write in ``aw`` (the server's clock)."""
    newest: datetime | None = None
    for entry in (aw.get("metadata") or {}).get("managedFields") or []:
        if isinstance(entry, Mapping) and entry.get("subresource") == "status":
            when = parse_kube_time(entry.get("time"))
            if when is not None and (newest is None or when > newest):
                newest = when
    return newest
