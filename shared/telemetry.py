"""Tracing and logging set-up shared by every service.

Tracing: one incident (first unhealthy observation → verdict → reset → running again)
is one trace across services, so the W3C trace context travels in NATS message headers
(:func:`inject_headers` on publish, :func:`extract_context` on consume). Where spans go is
chosen by environment, the OpenTelemetry way:

- ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) set → OTLP/HTTP;
- ``RESPAWN_TRACE_CONSOLE=1`` → spans printed to stdout (development);
- ``RESPAWN_TRACE_FILE=path`` → spans appended to a file as JSON lines (the demo uses it);
- otherwise no SDK at all: the API's no-op tracer still forwards the incoming context, so a
  service without tracing does not break the trace of the ones around it.

Logging: one line per record, UTC timestamps, the service name, and the trace and span id
when a span is active, so a log line can be found from a trace and back.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Literal, TextIO

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

log = logging.getLogger(__name__)

LOG_LEVEL_ENV = "RESPAWN_LOG_LEVEL"
TRACE_CONSOLE_ENV = "RESPAWN_TRACE_CONSOLE"
TRACE_FILE_ENV = "RESPAWN_TRACE_FILE"
OTLP_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
OTLP_TRACES_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"

TraceExport = Literal["otlp", "file", "console", "none", "custom"]

_TRUE = {"1", "true", "yes", "on"}


# ------------------------------------------------------------------ propagation


def inject_headers(
    headers: MutableMapping[str, str], context: Context | None = None
) -> MutableMapping[str, str]:
    """Add ``traceparent``/``tracestate`` (and baggage) of ``context`` (default: current) to ``headers``."""
    propagate.inject(headers, context=context)
    return headers


def extract_context(headers: Mapping[str, str] | None) -> Context:
    """The trace context carried by message headers (an empty context if there is none)."""
    return propagate.extract(headers or {})


def current_trace_id() -> str:
    """The active trace id as 32 hex digits, or "" when no valid span is active."""
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else ""


# ------------------------------------------------------------------ tracing


def select_trace_export(env: Mapping[str, str]) -> TraceExport:
    """Which exporter the environment asks for (pure; see the module docstring)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() in _TRUE:
        return "none"
    if env.get(OTLP_TRACES_ENDPOINT_ENV, "").strip() or env.get(OTLP_ENDPOINT_ENV, "").strip():
        return "otlp"
    if env.get(TRACE_FILE_ENV, "").strip():
        return "file"
    if env.get(TRACE_CONSOLE_ENV, "").strip().lower() in _TRUE:
        return "console"
    return "none"


def _file_exporter(path: str) -> SpanExporter:
    """Spans as JSON lines appended to ``path``: a trace a person can open without a collector."""
    out = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the provider
    return ConsoleSpanExporter(out=out, formatter=lambda span: span.to_json(indent=None) + "\n")


def _otlp_exporter(env: Mapping[str, str]) -> SpanExporter:
    # Imported lazily: the OTLP exporter pulls in protobuf and requests, which a service
    # that does not export should not pay for at start-up.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    endpoint = env.get(OTLP_TRACES_ENDPOINT_ENV, "").strip()
    if not endpoint:
        endpoint = env[OTLP_ENDPOINT_ENV].strip().rstrip("/") + "/v1/traces"
    return OTLPSpanExporter(endpoint=endpoint)


def build_tracer_provider(
    service_name: str, env: Mapping[str, str], *, exporter: SpanExporter | None = None
) -> TracerProvider | None:
    """An SDK provider exporting as the environment asks, or None for the no-op API.

    ``exporter`` overrides the choice (tests pass an in-memory exporter).
    """
    if exporter is None:
        choice = select_trace_export(env)
        if choice == "none":
            return None
        if choice == "otlp":
            exporter = _otlp_exporter(env)
        elif choice == "file":
            exporter = _file_exporter(env[TRACE_FILE_ENV].strip())
        else:
            exporter = ConsoleSpanExporter()
    resource = Resource.create({"service.name": service_name, "service.namespace": "respawn"})
    provider = TracerProvider(resource=resource)
    # Batch, never simple: a simple processor exports on the caller's thread and would
    # stall the event loop on every span end.
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


# ------------------------------------------------------------------ logging


class _ContextFilter(logging.Filter):
    """Adds ``service`` and ``trace`` (" trace_id=… span_id=…" or "") to every record."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def filter(self, record: logging.LogRecord) -> bool:
        record.service = self.service
        ctx = trace.get_current_span().get_span_context()
        record.trace = f" trace_id={ctx.trace_id:032x} span_id={ctx.span_id:016x}" if ctx.is_valid else ""
        return True


class _OneLineFormatter(logging.Formatter):
    """``2025-01-02T03:04:05.678Z INFO health respawn.bus: message trace_id=…``."""

    converter = staticmethod(time.gmtime)

    def __init__(self) -> None:
        super().__init__(
            fmt="%(asctime)s.%(msecs)03dZ %(levelname)s %(service)s %(name)s: %(message)s%(trace)s",
            datefmt="%Y-%m-%dT%H:%M:%S",
        )

    def formatMessage(self, record: logging.LogRecord) -> str:
        # A message containing newlines would break "one record, one line" for log shippers;
        # tracebacks (added after this) keep their lines because people read them.
        record.message = record.message.replace("\r", "\\r").replace("\n", "\\n")
        return super().formatMessage(record)


_HANDLER_MARK = "_respawn_handler"


def parse_log_level(raw: str | None) -> int:
    """A ``logging`` level from a name such as "debug" or "INFO" (default INFO)."""
    if raw is None or not raw.strip():
        return logging.INFO
    name = raw.strip().upper()
    level = logging.getLevelNamesMapping().get(name)
    if level is None:
        raise ValueError(f"{LOG_LEVEL_ENV}={raw!r} is not a log level; use DEBUG, INFO, WARNING or ERROR")
    return level


def setup_logging(service_name: str, *, level: int | None = None, stream: TextIO | None = None) -> None:
    """Route every logger through one one-line handler on the root logger (idempotent)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, _HANDLER_MARK, False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    setattr(handler, _HANDLER_MARK, True)
    handler.addFilter(_ContextFilter(service_name))
    handler.setFormatter(_OneLineFormatter())
    root.addHandler(handler)
    root.setLevel(level if level is not None else logging.INFO)
    # nats-py logs every reconnect attempt at ERROR; the bus reports connection state itself.
    logging.getLogger("nats.aio.client").setLevel(logging.CRITICAL)


# ------------------------------------------------------------------ both


@dataclass
class Telemetry:
    """What :func:`setup_telemetry` configured; call :meth:`shutdown` on exit to flush spans."""

    service_name: str
    export: TraceExport
    provider: TracerProvider | None

    def shutdown(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()


def setup_telemetry(
    service_name: str,
    *,
    env: Mapping[str, str] | None = None,
    log_stream: TextIO | None = None,
    exporter: SpanExporter | None = None,
) -> Telemetry:
    """Configure logging and tracing for one service process from the environment."""
    env = os.environ if env is None else env
    setup_logging(service_name, level=parse_log_level(env.get(LOG_LEVEL_ENV)), stream=log_stream)
    provider = build_tracer_provider(service_name, env, exporter=exporter)
    export: TraceExport = select_trace_export(env) if exporter is None else "custom"
    if provider is not None:
        if isinstance(trace.get_tracer_provider(), TracerProvider):
            # OpenTelemetry allows one global provider per process; keep the first.
            log.warning("a tracer provider is already installed; keeping it")
            provider.shutdown()
            provider = None
        else:
            trace.set_tracer_provider(provider)
    log.info("telemetry ready: trace export %s", export)
    return Telemetry(service_name=service_name, export=export, provider=provider)
