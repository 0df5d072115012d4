"""Resets under way, by AppWrapper: their trace context, and which keys the work queue puts first.

A reset spans several reconcile passes (the Resetting status, each deletion stage, the
recreation, the return to Running), most of them triggered by observations and timers rather
than by the verdict that started it. Each pass rejoins the trace of the verdict, so one incident
is one trace from the failure to the workload running again.

The context is also kept in the cluster, in the AppWrapper's ``respawn.dev/incident-trace``
annotation (a W3C ``traceparent``): a lifecycle replica that was restarted, or took the
AppWrapper over from another, rejoins the incident's trace from it (:meth:`Incidents.adopt`).
Which annotation change a pass owes is :meth:`Incidents.annotation`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from services.lifecycle.machine import Plan
from services.lifecycle.workqueue import Key
from shared.appwrapper.constants import INCIDENT_TRACE_ANNOTATION, Phase

__all__ = ["KEEP", "Incidents", "traceparent_of"]

# Phases that end an incident's trace (besides Running again after a reset).
_ENDS = (Phase.RUNNING, Phase.SUCCEEDED, Phase.FAILED, Phase.SUSPENDED)

# Only the W3C traceparent goes into the annotation: baggage is not the incident's to keep.
_W3C = TraceContextTextMapPropagator()
_HEADER: Final = "traceparent"

# What :meth:`Incidents.annotation` answers when the annotation is as it should be.
KEEP: Final = object()


def traceparent_of(ctx: otel_context.Context) -> str | None:
    """The ``traceparent`` of ``ctx``'s span, or None when it has no valid span."""
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, context=ctx)
    return carrier.get(_HEADER)


def _annotation(aw: Mapping[str, Any]) -> str | None:
    meta = aw.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    value = annotations.get(INCIDENT_TRACE_ANNOTATION) if isinstance(annotations, Mapping) else None
    return value if isinstance(value, str) and value else None


class Incidents:
    def __init__(self) -> None:
        self._traces: dict[Key, otel_context.Context] = {}

    def __contains__(self, key: Key) -> bool:
        """Whether ``key`` is in the middle of a reset."""
        return key in self._traces

    def context(self, key: Key) -> otel_context.Context | None:
        """The trace context of the reset under way, if any."""
        return self._traces.get(key)

    def adopt(self, key: Key, aw: Mapping[str, Any]) -> None:
        """Rejoin the incident ``aw``'s annotation records, if this process does not know of one
        for ``key`` (it was restarted, or the AppWrapper was another replica's) and the
        AppWrapper is not past it."""
        if key in self._traces:
            return
        value = _annotation(aw)
        status = aw.get("status")
        phase = status.get("phase", "") if isinstance(status, Mapping) else ""
        if value is None or phase in _ENDS:
            return
        ctx = _W3C.extract({_HEADER: value})
        if trace.get_current_span(ctx).get_span_context().is_valid:
            self._traces[key] = ctx

    def orphaned(self, key: Key, aw: Mapping[str, Any]) -> None:
        """After :meth:`adopt`: a reset under way that nothing records the trace of (its process
        died before annotating it) continues in the current pass's trace from here on."""
        status = aw.get("status")
        phase = status.get("phase", "") if isinstance(status, Mapping) else ""
        if key not in self._traces and phase == Phase.RESETTING:
            self._traces[key] = otel_context.get_current()

    def track(self, key: Key, plan: Plan, *, was: str) -> None:
        """After ``plan`` was carried out (in the current trace context) on an AppWrapper in
        phase ``was``: remember the trace of a reset it started, forget the one it ended."""
        if plan.phase == was:
            return
        if plan.phase == Phase.RESETTING:
            self._traces[key] = otel_context.get_current()
        elif plan.phase in _ENDS:
            self._traces.pop(key, None)

    def annotation(self, key: Key, aw: Mapping[str, Any]) -> str | object | None:
        """What ``aw``'s ``respawn.dev/incident-trace`` annotation should become: the incident's
        ``traceparent``, None to remove it (no incident under way), or :data:`KEEP`."""
        ctx = self._traces.get(key)
        wanted = traceparent_of(ctx) if ctx is not None else None
        return KEEP if wanted == _annotation(aw) else wanted
