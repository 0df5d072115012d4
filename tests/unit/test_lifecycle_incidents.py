"""The incident trace lifecycle keeps per AppWrapper, and the annotation that carries it across
processes (services/lifecycle/incidents.py)."""

from __future__ import annotations

from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from services.lifecycle.incidents import KEEP, Incidents, traceparent_of
from services.lifecycle.machine import Plan
from shared.appwrapper.constants import INCIDENT_TRACE_ANNOTATION

KEY = ("team", "train")
TRACE = 0x0AF7651916CD43DD8448EB211C80319C
SPAN = 0xB7AD6B7169203331
TRACEPARENT = f"00-{TRACE:032x}-{SPAN:016x}-01"


def in_span() -> otel_context.Context:
    span = NonRecordingSpan(SpanContext(TRACE, SPAN, is_remote=False, trace_flags=TraceFlags(1)))
    return trace.set_span_in_context(span)


def aw(phase: str, annotation: str | None = None) -> dict[str, Any]:
    annotations = {INCIDENT_TRACE_ANNOTATION: annotation} if annotation is not None else {}
    return {
        "metadata": {"name": "train", "namespace": "team", "annotations": annotations},
        "status": {"phase": phase},
    }


def test_a_reset_is_remembered_with_its_trace_and_annotated() -> None:
    incidents = Incidents()
    token = otel_context.attach(in_span())
    try:
        incidents.track(KEY, Plan(phase="Resetting"), was="Running")
    finally:
        otel_context.detach(token)
    assert KEY in incidents
    ctx = incidents.context(KEY)
    assert ctx is not None and traceparent_of(ctx) == TRACEPARENT
    assert incidents.annotation(KEY, aw("Resetting")) == TRACEPARENT
    assert incidents.annotation(KEY, aw("Resetting", TRACEPARENT)) is KEEP


def test_running_again_ends_the_incident_and_removes_the_annotation() -> None:
    incidents = Incidents()
    incidents.adopt(KEY, aw("Resuming", TRACEPARENT))
    incidents.track(KEY, Plan(phase="Running"), was="Resuming")
    assert KEY not in incidents
    assert incidents.annotation(KEY, aw("Running", TRACEPARENT)) is None
    assert incidents.annotation(KEY, aw("Running")) is KEEP


def test_a_new_process_rejoins_the_trace_the_annotation_records() -> None:
    incidents = Incidents()
    incidents.adopt(KEY, aw("Resetting", TRACEPARENT))
    ctx = incidents.context(KEY)
    assert ctx is not None
    span = trace.get_current_span(ctx).get_span_context()
    assert (span.trace_id, span.span_id, span.is_remote) == (TRACE, SPAN, True)
    # What this process remembers wins over a later read of the annotation.
    incidents.adopt(KEY, aw("Resetting", f"00-{1:032x}-{1:016x}-01"))
    assert traceparent_of(incidents.context(KEY) or otel_context.Context()) == TRACEPARENT


def test_an_annotation_of_an_incident_that_is_over_or_unreadable_is_not_rejoined() -> None:
    incidents = Incidents()
    incidents.adopt(KEY, aw("Running", TRACEPARENT))
    incidents.adopt(KEY, aw("Resetting", "not a traceparent"))
    incidents.adopt(KEY, aw("Resetting"))
    assert KEY not in incidents


def test_without_a_trace_nothing_is_annotated() -> None:
    incidents = Incidents()
    incidents.track(KEY, Plan(phase="Resetting"), was="Running")
    assert KEY in incidents
    assert incidents.annotation(KEY, aw("Resetting")) is KEEP


def test_a_reset_nothing_recorded_continues_in_the_current_trace() -> None:
    incidents = Incidents()
    token = otel_context.attach(in_span())
    try:
        incidents.orphaned(KEY, aw("Running"))
        assert KEY not in incidents
        incidents.orphaned(KEY, aw("Resetting"))
    finally:
        otel_context.detach(token)
    assert incidents.annotation(KEY, aw("Resetting")) == TRACEPARENT
