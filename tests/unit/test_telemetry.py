"""Trace-context headers, exporter choice and the log line format."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from shared.telemetry import (
    build_tracer_provider,
    current_trace_id,
    extract_context,
    inject_headers,
    parse_log_level,
    select_trace_export,
    setup_logging,
)

TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
SPAN_ID = 0x00F067AA0BA902B7


def remote_context() -> trace.Span:
    return NonRecordingSpan(
        SpanContext(
            trace_id=TRACE_ID, span_id=SPAN_ID, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED)
        )
    )


# ------------------------------------------------------------------ propagation


def test_inject_writes_w3c_traceparent_of_the_given_context() -> None:
    ctx = trace.set_span_in_context(remote_context())
    headers: dict[str, str] = {"other": "kept"}
    inject_headers(headers, ctx)
    assert headers["traceparent"] == f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01"
    assert headers["other"] == "kept"


def test_inject_uses_the_active_span_by_default() -> None:
    with trace.use_span(remote_context()):
        headers = dict(inject_headers({}))
    assert headers["traceparent"].split("-")[1] == f"{TRACE_ID:032x}"


def test_inject_without_a_trace_adds_nothing() -> None:
    assert dict(inject_headers({})) == {}


def test_extract_round_trips_inject() -> None:
    headers = dict(inject_headers({}, trace.set_span_in_context(remote_context())))
    headers["tracestate"] = "vendor=value"
    span_ctx = trace.get_current_span(extract_context(headers)).get_span_context()
    assert span_ctx.trace_id == TRACE_ID
    assert span_ctx.span_id == SPAN_ID
    assert span_ctx.is_remote
    assert span_ctx.trace_flags.sampled
    assert span_ctx.trace_state.get("vendor") == "value"


@pytest.mark.parametrize(
    "headers", [None, {}, {"traceparent": "garbage"}, {"traceparent": "00-" + "0" * 32 + "-1-01"}]
)
def test_extract_from_missing_or_bad_headers_gives_no_parent(headers: dict[str, str] | None) -> None:
    assert not trace.get_current_span(extract_context(headers)).get_span_context().is_valid


def test_current_trace_id() -> None:
    assert current_trace_id() == ""
    with trace.use_span(remote_context()):
        assert current_trace_id() == f"{TRACE_ID:032x}"


# ------------------------------------------------------------------ exporter choice


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "none"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, "otlp"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, "otlp"),
        ({"RESPAWN_TRACE_CONSOLE": "1"}, "console"),
        ({"RESPAWN_TRACE_CONSOLE": "0"}, "none"),
        ({"RESPAWN_TRACE_CONSOLE": "1", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, "otlp"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, "none"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, "none"),
    ],
)
def test_select_trace_export(env: dict[str, str], expected: str) -> None:
    assert select_trace_export(env) == expected


def test_no_exporter_means_no_sdk_provider() -> None:
    assert build_tracer_provider("health", {}) is None


def test_otlp_provider_targets_the_traces_path_and_names_the_service() -> None:
    provider = build_tracer_provider("health", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"})
    assert provider is not None
    try:
        assert provider.resource.attributes["service.name"] == "health"
        exporters = [p.span_exporter for p in provider._active_span_processor._span_processors]  # type: ignore[attr-defined]
        assert [type(e).__name__ for e in exporters] == ["OTLPSpanExporter"]
        assert exporters[0]._endpoint == "http://collector:4318/v1/traces"
    finally:
        provider.shutdown()


def test_provider_with_given_exporter_records_spans() -> None:
    exporter = InMemorySpanExporter()
    provider = build_tracer_provider("lifecycle", {}, exporter=exporter)
    assert isinstance(provider, TracerProvider)
    with provider.get_tracer("t").start_as_current_span("reset"):
        pass
    provider.force_flush()
    [span] = exporter.get_finished_spans()
    assert span.name == "reset"
    assert span.resource.attributes["service.name"] == "lifecycle"
    provider.shutdown()


# ------------------------------------------------------------------ logging


@pytest.fixture
def log_output() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    out = io.StringIO()
    setup_logging("health", level=logging.DEBUG, stream=out)
    try:
        yield out
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)


def test_log_line_has_time_level_service_logger_and_message(log_output: io.StringIO) -> None:
    logging.getLogger("respawn.test").info("verdict %s", "Unhealthy")
    [line] = log_output.getvalue().splitlines()
    stamp, level, service, logger, *message = line.split(" ")
    assert stamp.endswith("Z") and "T" in stamp
    assert (level, service, logger, " ".join(message)) == (
        "INFO",
        "health",
        "respawn.test:",
        "verdict Unhealthy",
    )


def test_log_line_carries_the_active_trace(log_output: io.StringIO) -> None:
    with trace.use_span(remote_context()):
        logging.getLogger("respawn.test").warning("inside")
    assert log_output.getvalue().rstrip().endswith(f"inside trace_id={TRACE_ID:032x} span_id={SPAN_ID:016x}")


def test_multi_line_message_stays_on_one_line(log_output: io.StringIO) -> None:
    logging.getLogger("respawn.test").error("first\nsecond")
    assert log_output.getvalue().count("\n") == 1
    assert "first\\nsecond" in log_output.getvalue()


def test_setup_logging_twice_keeps_one_handler(log_output: io.StringIO) -> None:
    second = io.StringIO()
    setup_logging("health", stream=second)
    logging.getLogger("respawn.test").info("once")
    assert log_output.getvalue() == ""
    assert second.getvalue().count("once") == 1


@pytest.mark.parametrize(
    ("raw", "level"),
    [(None, logging.INFO), ("", logging.INFO), ("debug", logging.DEBUG), (" WARNING ", logging.WARNING)],
)
def test_parse_log_level(raw: str | None, level: int) -> None:
    assert parse_log_level(raw) == level


def test_parse_log_level_rejects_unknown_names_with_the_fix() -> None:
    with pytest.raises(ValueError, match="RESPAWN_LOG_LEVEL='loud' is not a log level; use DEBUG"):
        parse_log_level("loud")


def test_trace_file_export_writes_json_lines(tmp_path: Path) -> None:
    from shared.telemetry import build_tracer_provider, select_trace_export

    path = tmp_path / "spans.jsonl"
    env = {"RESPAWN_TRACE_FILE": str(path)}
    assert select_trace_export(env) == "file"
    provider = build_tracer_provider("probe", env)
    assert provider is not None
    with provider.get_tracer("t").start_as_current_span("work"):
        pass
    provider.shutdown()
    lines = path.read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["name"] == "work"
