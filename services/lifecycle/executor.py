"""Carrying out a :class:`~services.lifecycle.machine.Plan` against Kubernetes and the bus.

The order is the machine's (see its module docstring and docs/lifecycle.md): finalizer added,
status written (a conflict propagates as a :class:`KubeApiError`, and nothing else of the plan
is done), deletes, the other actions in order, finalizer removed. Nothing here decides anything
the plan did not say; the only judgement left is what a failed call means for the call itself
(a NotFound delete is success, a failed Event is not a reason to stop).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
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
from services.lifecycle.machine import FinalizerChange, Plan
from services.lifecycle.observed import Observed, ObservedComponent, controller_uid
from services.lifecycle.placement.exclusion import excluded_nodes_patch
from shared import metrics, subjects
from shared.appwrapper.constants import FINALIZER
from shared.kube import KubeApiError, ResourceRef
from shared.kubetime import utcnow
from shared.messages import Message, Verdict

__all__ = ["COMPONENT", "Executor", "KubeWrites", "Publisher"]

log = logging.getLogger(__name__)
tracer = trace.get_tracer("respawn.lifecycle")

# The source of the Kubernetes Events lifecycle records.
COMPONENT = "respawn-lifecycle"

PHASES = metrics.counter("respawn_lifecycle_phase_transitions", "Phase transitions", ["phase"])
RESETS = metrics.counter("respawn_lifecycle_resets", "Resets started, by cause", ["reason"])
ESCALATIONS = metrics.counter(
    "respawn_lifecycle_deletion_escalations", "Deletions escalated to grace period 0"
)
UNHEALTHY_TO_RESET = metrics.histogram(
    "respawn_lifecycle_unhealthy_to_reset_seconds",
    "From the first unhealthy observation to the reset's status write",
)

_DELETES = (DeleteComponent, DeletePods)


class KubeWrites(Protocol):
    """The calls the executor makes (a subset of :class:`shared.kube.Kube`)."""

    async def resource(self, api_version: str, kind: str) -> ResourceRef: ...

    async def get(self, ref: ResourceRef, name: str, namespace: str | None = None) -> dict[str, Any]: ...

    async def create(
        self, ref: ResourceRef, body: Mapping[str, Any], namespace: str | None = None
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


class Executor:
    def __init__(
        self,
        kube: KubeWrites,
        bus: Publisher,
        *,
        appwrappers: ResourceRef,
        pods: ResourceRef,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.kube = kube
        self.bus = bus
        self.appwrappers = appwrappers
        self.pods = pods
        self.clock = clock

    async def carry_out(
        self,
        aw: dict[str, Any],
        plan: Plan,
        observed: Observed | None = None,
        *,
        verdict: Verdict | None = None,
    ) -> dict[int, CreateOutcome]:
        """Carry out ``plan``; returns the outcome of each CreateComponent by component index.

        ``observed`` is what the plan was computed from: deletes name the objects seen there.
        ``verdict`` is the one the plan applied (for the unhealthy-to-reset metric).
        """
        meta = aw["metadata"]
        resource_version = plan.resource_version or meta.get("resourceVersion", "")
        if plan.finalizer is FinalizerChange.ADD and FINALIZER not in (meta.get("finalizers") or []):
            body = {**aw, "metadata": {**meta, "finalizers": [*(meta.get("finalizers") or []), FINALIZER]}}
            body["metadata"]["resourceVersion"] = resource_version
            updated = await self.kube.replace(self.appwrappers, body)
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
                aw = await self.kube.replace_status(self.appwrappers, body)
                log.debug(
                    "%s/%s status written in %.0f ms",
                    meta.get("namespace"),
                    meta.get("name"),
                    (time.perf_counter() - t_write) * 1000,
                )
            self.record_transition(plan, verdict)
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

    def record_transition(self, plan: Plan, verdict: Verdict | None) -> None:
        """The metrics of a status write: count what the plan announces."""
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
            case EmitEvent():
                try:
                    await self.kube.create_event(
                        aw,
                        type_=action.type,
                        reason=action.reason,
                        message=action.message,
                        component=COMPONENT,
                        now_iso=self.clock().strftime("%Y-%m-%dT%H:%M:%SZ"),
                    )
                except KubeApiError as exc:  # events are best effort, never a reason to stop
                    log.warning(
                        "recording event %s on %s/%s failed: %s", action.reason, namespace, meta["name"], exc
                    )
            case PublishLifecycleEvent():
                event = action.event
                await self.bus.publish(
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
            case CreateComponent():
                raise TypeError("a CreateComponent has an outcome: carry it out with create()")
            case _:
                assert_never(action)

    async def delete_component(self, action: DeleteComponent, observed: Observed | None) -> None:
        """Delete a wrapped resource, with the uid seen in ``observed`` under that name as a
        precondition; grace period 0 when ``action.force``. NotFound is success."""
        seen = observed.component(action.index) if observed is not None else ObservedComponent()
        uid = seen.uid if seen.name == action.name else ""
        span = "lifecycle.force_delete_component" if action.force else "lifecycle.delete_component"
        with tracer.start_as_current_span(span, attributes={"component": action.index}):
            try:
                ref = await self.kube.resource(action.api_version, action.kind)
                await self.kube.delete(
                    ref,
                    action.name,
                    action.namespace if ref.namespaced else None,
                    grace_period_seconds=0 if action.force else None,
                    uid=uid or None,
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
            created = await self.kube.create(ref, body, namespace if ref.namespaced else None)
            return CreateOutcome(CreateResult.CREATED, name=created["metadata"]["name"])
        except KubeApiError as exc:
            if exc.already_exists:
                name = str((body.get("metadata") or {}).get("name") or "")
                try:
                    existing = await self.kube.get(ref, name, namespace if ref.namespaced else None)
                except KubeApiError as get_exc:
                    return CreateOutcome(CreateResult.ERROR, name=name, message=get_exc.message)
                ours = controller_uid(existing) == aw_uid
                return CreateOutcome(
                    CreateResult.ALREADY_EXISTS, name=name, controlled_by_us=ours, message=exc.message
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
