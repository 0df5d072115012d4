"""Tracing and logging set-up shared by every service.

Tracing: one incident (first unhealthy observation → verdict → reset → running again)
is one trace across services, so the W3C trace context travels in NATS message headers
(:func:`inject_headers` on publish, :func:`extract_context` on consume). Where spans go is
configured the OpenTelemetry way, by the standard ``OTEL_*`` environment variables, and the
SDK's own parts read them: the exporters named by ``OTEL_TRACES_EXPORTER`` are the SDK's
registered ones (entry points), each reading its ``OTEL_EXPORTER_OTLP_*`` settings; the
sampler reads ``OTEL_TRACES_SAMPLER``; the resource ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES``; the batch processor ``OTEL_BSP_*``. What Respawn adds
(docs/observability.md):

- ``OTEL_TRACES_EXPORTER`` unset: OTLP when an endpoint is set
  (``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), else nothing
  (rather than the specification's OTLP to localhost, which would fail in a cluster without
  a collector); ``RESPAWN_TRACE_CONSOLE=1`` prints spans to stdout (development);
- ``otlp`` without a protocol set means ``http/protobuf`` (the specification's default);
- ``RESPAWN_TRACE_FILE=path`` adds spans appended to a file as JSON lines (the demo uses it);
- no exporter at all: no SDK, and the API's no-op tracer still forwards the incoming context,
  so a service without tracing does not break the trace of the ones around it.

Logging: one line per record, UTC timestamps, the service name, and the trace and span id
when a span is active, so a log line can be found from a trace and back; as text, or with
``RESPAWN_LOG_FORMAT=json`` one JSON object per line (for Loki, Elasticsearch and the like).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Literal, TextIO

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

log = logging.getLogger(__name__)

LOG_LEVEL_ENV = "RESPAWN_LOG_LEVEL"
LOG_FORMAT_ENV = "RESPAWN_LOG_FORMAT"
TRACE_CONSOLE_ENV = "RESPAWN_TRACE_CONSOLE"
TRACE_FILE_ENV = "RESPAWN_TRACE_FILE"
TRACES_EXPORTER_ENV = "OTEL_TRACES_EXPORTER"
OTLP_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
OTLP_TRACES_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
OTLP_PROTOCOL_ENV = "OTEL_EXPORTER_OTLP_PROTOCOL"
OTLP_TRACES_PROTOCOL_ENV = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"

# The entry point group under which the SDK and exporter packages register span exporters.
_EXPORTER_GROUP = "opentelemetry_traces_exporter"
_OTLP_BY_PROTOCOL = {"grpc": "otlp_proto_grpc", "http/protobuf": "otlp_proto_http"}
_DEFAULT_OTLP_PROTOCOL = "http/protobuf"
# Not an entry point: RESPAWN_TRACE_FILE's exporter.
FILE_EXPORTER = "file"

LogFormat = Literal["text", "json"]

_TRUE = {"1", "true", "yes", "on"}


class TelemetryError(ValueError):
    """The environment asks for tracing or logging that cannot be set up (says what to fix)."""


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


def _otlp_entry_point(name: str, env: Mapping[str, str]) -> str:
    """``otlp`` → the exporter of the configured protocol (the specific names stay)."""
    if name != "otlp":
        return name
    protocol = (env.get(OTLP_TRACES_PROTOCOL_ENV) or env.get(OTLP_PROTOCOL_ENV) or "").strip().lower()
    protocol = protocol or _DEFAULT_OTLP_PROTOCOL
    if protocol not in _OTLP_BY_PROTOCOL:
        raise TelemetryError(f"{OTLP_PROTOCOL_ENV}={protocol!r} is not supported; use grpc or http/protobuf")
    return _OTLP_BY_PROTOCOL[protocol]


def trace_exporter_names(env: Mapping[str, str]) -> list[str]:
    """The span exporters the environment asks for, as entry point names (``otlp_proto_grpc``,
    ``otlp_proto_http``, ``console``, …) plus ``file`` (pure; see the module docstring)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() in _TRUE:
        return []
    names: list[str] = []
    listed = env.get(TRACES_EXPORTER_ENV, "").strip()
    if listed:
        for raw in listed.split(","):
            name = raw.strip().lower()
            if name and name != "none" and _otlp_entry_point(name, env) not in names:
                names.append(_otlp_entry_point(name, env))
    elif env.get(OTLP_TRACES_ENDPOINT_ENV, "").strip() or env.get(OTLP_ENDPOINT_ENV, "").strip():
        names.append(_otlp_entry_point("otlp", env))
    elif env.get(TRACE_CONSOLE_ENV, "").strip().lower() in _TRUE:
        names.append("console")
    if env.get(TRACE_FILE_ENV, "").strip():
        names.append(FILE_EXPORTER)
    return names


def _file_exporter(path: str) -> SpanExporter:
    """Spans as JSON lines appended to ``path``: a trace a person can open without a collector."""
    out = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the provider
    return ConsoleSpanExporter(out=out, formatter=lambda span: span.to_json(indent=None) + "\n")


def _exporter(name: str, env: Mapping[str, str]) -> SpanExporter:
    """The exporter registered under ``name``, built with no arguments so that it reads its
    own ``OTEL_EXPORTER_*`` settings (endpoint, headers, certificates, timeout, compression)."""
    if name == FILE_EXPORTER:
        return _file_exporter(env[TRACE_FILE_ENV].strip())
    found = list(entry_points(group=_EXPORTER_GROUP, name=name))
    if not found:
        installed = sorted({e.name for e in entry_points(group=_EXPORTER_GROUP)})
        raise TelemetryError(
            f"{TRACES_EXPORTER_ENV}: no span exporter {name!r} is installed "
            f"(installed: {', '.join(installed) or 'none'}; or none, to export nothing)"
        )
    try:
        exporter = found[0].load()()
    except Exception as exc:
        raise TelemetryError(f"{TRACES_EXPORTER_ENV}: the {name!r} exporter cannot start: {exc}") from exc
    if not isinstance(exporter, SpanExporter):
        raise TelemetryError(f"{TRACES_EXPORTER_ENV}: {name!r} is not a span exporter")
    return exporter


def service_resource(service_name: str) -> Resource:
    """The process's resource: ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME`` (read by
    the SDK) win; ``service.name`` defaults to the service, ``service.namespace`` to respawn."""
    given = OTELResourceDetector().detect().attributes
    defaults = {"service.name": service_name, "service.namespace": "respawn"}
    return Resource.create({k: v for k, v in defaults.items() if k not in given})


def build_tracer_provider(
    service_name: str, env: Mapping[str, str] | None = None, *, exporter: SpanExporter | None = None
) -> TracerProvider | None:
    """An SDK provider exporting as the environment asks, or None for the no-op API.

    ``env`` (default: the process environment) chooses the exporters; the SDK's parts
    (exporters, sampler, resource, batch processor) read the process environment themselves.
    ``exporter`` overrides the choice (tests pass an in-memory exporter).
    """
    env = os.environ if env is None else env
    if exporter is not None:
        exporters = [exporter]
    else:
        exporters = [_exporter(name, env) for name in trace_exporter_names(env)]
    if not exporters:
        return None
    # No sampler given: the SDK takes OTEL_TRACES_SAMPLER (and _ARG), parentbased_always_on by
    # default, so a sampled incident stays sampled across services.
    provider = TracerProvider(resource=service_resource(service_name))
    for each in exporters:
        # Batch, never simple: a simple processor exports on the caller's thread and would
        # stall the event loop on every span end.
        provider.add_span_processor(BatchSpanProcessor(each))
    return provider


# ------------------------------------------------------------------ logging


class _ContextFilter(logging.Filter):
    """Adds ``service``, ``trace_id`` and ``span_id`` ("" outside a span) and ``trace`` (" trace_id=…
    span_id=…" or "") to every record."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def filter(self, record: logging.LogRecord) -> bool:
        record.service = self.service
        ctx = trace.get_current_span().get_span_context()
        trace_id = f"{ctx.trace_id:032x}" if ctx.is_valid else ""
        span_id = f"{ctx.span_id:016x}" if ctx.is_valid else ""
        record.trace_id, record.span_id = trace_id, span_id
        record.trace = f" trace_id={trace_id} span_id={span_id}" if ctx.is_valid else ""
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


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: ``timestamp`` (RFC 3339, UTC, milliseconds),
    ``level``, ``logger``, ``message``, ``service``, ``trace_id`` and ``span_id`` inside a span,
    and ``exception`` (the traceback as one string) when the record has one."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        out: dict[str, Any] = {
            "timestamp": f"{stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "service": getattr(record, "service", ""),
        }
        trace_id = getattr(record, "trace_id", "")
        if trace_id:
            out["trace_id"] = trace_id
            out["span_id"] = getattr(record, "span_id", "")
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        # json.dumps escapes newlines, so a traceback stays on the record's one line; default=str
        # keeps a record whose arguments are not JSON from being lost.
        return json.dumps(out, ensure_ascii=False, default=str)


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


def parse_log_format(raw: str | None) -> LogFormat:
    """``text`` (the default) or ``json``."""
    name = (raw or "").strip().lower() or "text"
    if name == "text":
        return "text"
    if name == "json":
        return "json"
    raise ValueError(f"{LOG_FORMAT_ENV}={raw!r} is not a log format; use text or json")


def setup_logging(
    service_name: str, *, level: int | None = None, stream: TextIO | None = None, fmt: LogFormat = "text"
) -> None:
    """Route every logger through one handler on the root logger (idempotent): one line per
    record, as text or as a JSON object."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, _HANDLER_MARK, False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    setattr(handler, _HANDLER_MARK, True)
    handler.addFilter(_ContextFilter(service_name))
    handler.setFormatter(JsonFormatter() if fmt == "json" else _OneLineFormatter())
    root.addHandler(handler)
    root.setLevel(level if level is not None else logging.INFO)
    # nats-py logs every reconnect attempt at ERROR; the bus reports connection state itself.
    logging.getLogger("nats.aio.client").setLevel(logging.CRITICAL)


# ------------------------------------------------------------------ both


@dataclass
class Telemetry:
    """What :func:`setup_telemetry` configured; call :meth:`shutdown` on exit to flush spans."""

    service_name: str
    # The span exporters in use (entry point names, ``file``, or ``custom`` when given).
    exporters: tuple[str, ...]
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
    """Configure logging and tracing for one service process from the environment.

    Raises :class:`TelemetryError` (after logging is set up, so the caller can log it) when
    the environment asks for what cannot be.
    """
    env = os.environ if env is None else env
    try:
        level = parse_log_level(env.get(LOG_LEVEL_ENV))
        fmt = parse_log_format(env.get(LOG_FORMAT_ENV))
    except ValueError as exc:
        setup_logging(service_name, stream=log_stream)
        raise TelemetryError(str(exc)) from exc
    setup_logging(service_name, level=level, stream=log_stream, fmt=fmt)
    provider = build_tracer_provider(service_name, env, exporter=exporter)
    names = ("custom",) if exporter is not None else tuple(trace_exporter_names(env))
    if provider is not None:
        if isinstance(trace.get_tracer_provider(), TracerProvider):
            # OpenTelemetry allows one global provider per process; keep the first.
            log.warning("a tracer provider is already installed; keeping it")
            provider.shutdown()
            provider = None
        else:
            trace.set_tracer_provider(provider)
    log.info("telemetry ready: trace export %s", ", ".join(names) or "none")
    return Telemetry(service_name=service_name, exporters=names, provider=provider)
