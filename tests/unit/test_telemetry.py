"""Trace-context headers, exporter choice from the OTEL_* environment, and the log line formats."""

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
    TelemetryError,
    build_tracer_provider,
    current_trace_id,
    extract_context,
    inject_headers,
    parse_log_format,
    parse_log_level,
    setup_logging,
    setup_telemetry,
    trace_exporter_names,
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


GRPC, HTTP = "otlp_proto_grpc", "otlp_proto_http"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, []),
        # Unset OTEL_TRACES_EXPORTER: OTLP only when a collector is named.
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, [HTTP]),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, [HTTP]),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, [GRPC]),
        ({"RESPAWN_TRACE_CONSOLE": "1"}, ["console"]),
        ({"RESPAWN_TRACE_CONSOLE": "0"}, []),
        ({"RESPAWN_TRACE_CONSOLE": "1", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, [HTTP]),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, []),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, []),
        # OTEL_TRACES_EXPORTER as the specification has it.
        ({"OTEL_TRACES_EXPORTER": "otlp"}, [HTTP]),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, [GRPC]),
        (
            {
                "OTEL_TRACES_EXPORTER": "otlp",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            },
            [HTTP],
        ),
        ({"OTEL_TRACES_EXPORTER": "otlp_proto_grpc"}, [GRPC]),
        ({"OTEL_TRACES_EXPORTER": "console, otlp"}, ["console", HTTP]),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, []),
        ({"OTEL_TRACES_EXPORTER": "console", "RESPAWN_TRACE_FILE": "/tmp/s.jsonl"}, ["console", "file"]),
        ({"RESPAWN_TRACE_FILE": "/tmp/s.jsonl"}, ["file"]),
    ],
)
def test_trace_exporter_names(env: dict[str, str], expected: list[str]) -> None:
    assert trace_exporter_names(env) == expected


def test_an_unsupported_otlp_protocol_is_refused_with_the_fix() -> None:
    with pytest.raises(TelemetryError, match="use grpc or http/protobuf"):
        trace_exporter_names({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})


def test_an_exporter_that_is_not_installed_is_refused_naming_those_that_are() -> None:
    with pytest.raises(
        TelemetryError, match=r"no span exporter 'zipkin' is installed \(installed: .*console"
    ):
        build_tracer_provider("health", {"OTEL_TRACES_EXPORTER": "zipkin"})


def test_no_exporter_means_no_sdk_provider() -> None:
    assert build_tracer_provider("health", {}) is None


def exporters_of(provider: TracerProvider) -> list[object]:
    return [p.span_exporter for p in provider._active_span_processor._span_processors]  # type: ignore[attr-defined]


def test_otlp_http_exporter_reads_its_endpoint_and_the_service_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")
    provider = build_tracer_provider("health")
    assert provider is not None
    try:
        assert provider.resource.attributes["service.name"] == "health"
        assert provider.resource.attributes["service.namespace"] == "respawn"
        [exporter] = exporters_of(provider)
        assert type(exporter).__module__.startswith("opentelemetry.exporter.otlp.proto.http")
        # The exporter itself appends the signal's path to the generic endpoint.
        assert exporter._endpoint == "http://collector:4318/v1/traces"  # type: ignore[attr-defined]
    finally:
        provider.shutdown()


def test_otlp_grpc_exporter_is_chosen_by_the_protocol(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")
    provider = build_tracer_provider("health")
    assert provider is not None
    try:
        [exporter] = exporters_of(provider)
        assert type(exporter).__module__.startswith("opentelemetry.exporter.otlp.proto.grpc")
    finally:
        provider.shutdown()


def test_service_name_and_resource_attributes_from_the_environment_win(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "respawn-health-eu")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod,service.namespace=ml")
    provider = build_tracer_provider("health", exporter=InMemorySpanExporter())
    assert provider is not None
    attributes = provider.resource.attributes
    assert (attributes["service.name"], attributes["service.namespace"]) == ("respawn-health-eu", "ml")
    assert attributes["deployment.environment"] == "prod"
    provider.shutdown()


def test_the_sampler_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    exporter = InMemorySpanExporter()
    provider = build_tracer_provider("health", exporter=exporter)
    assert provider is not None
    with provider.get_tracer("t").start_as_current_span("dropped"):
        pass
    provider.force_flush()
    assert exporter.get_finished_spans() == ()
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
    path = tmp_path / "spans.jsonl"
    provider = build_tracer_provider("probe", {"RESPAWN_TRACE_FILE": str(path)})
    assert provider is not None
    with provider.get_tracer("t").start_as_current_span("work"):
        pass
    provider.shutdown()
    lines = path.read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["name"] == "work"


# ------------------------------------------------------------------ JSON log lines


@pytest.fixture
def json_output() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    out = io.StringIO()
    setup_logging("lifecycle", level=logging.DEBUG, stream=out, fmt="json")
    try:
        yield out
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)


def test_json_log_line_has_time_level_logger_message_and_service(json_output: io.StringIO) -> None:
    logging.getLogger("respawn.test").info("verdict %s", "Unhealthy")
    [line] = json_output.getvalue().splitlines()
    record = json.loads(line)
    assert record.pop("timestamp").endswith("Z")
    assert record == {
        "level": "INFO",
        "logger": "respawn.test",
        "message": "verdict Unhealthy",
        "service": "lifecycle",
    }


def test_json_log_line_carries_the_active_trace(json_output: io.StringIO) -> None:
    with trace.use_span(remote_context()):
        logging.getLogger("respawn.test").warning("inside")
    record = json.loads(json_output.getvalue())
    assert (record["trace_id"], record["span_id"]) == (f"{TRACE_ID:032x}", f"{SPAN_ID:016x}")


def test_json_log_line_keeps_a_traceback_and_newlines_on_one_line(json_output: io.StringIO) -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("respawn.test").exception("first\nsecond")
    [line] = json_output.getvalue().splitlines()
    record = json.loads(line)
    assert record["message"] == "first\nsecond"
    assert record["exception"].startswith("Traceback") and "RuntimeError: boom" in record["exception"]


@pytest.mark.parametrize(("raw", "fmt"), [(None, "text"), ("", "text"), ("TEXT", "text"), (" json ", "json")])
def test_parse_log_format(raw: str | None, fmt: str) -> None:
    assert parse_log_format(raw) == fmt


def test_setup_telemetry_refuses_an_unknown_log_format_with_the_fix() -> None:
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    try:
        with pytest.raises(
            TelemetryError, match="RESPAWN_LOG_FORMAT='xml' is not a log format; use text or json"
        ):
            setup_telemetry("health", env={"RESPAWN_LOG_FORMAT": "xml"}, log_stream=io.StringIO())
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
