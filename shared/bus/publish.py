"""Publishing a message and waiting for JetStream to store it (docs/messages.md, "Headers")."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import nats.errors
import nats.js.errors
from opentelemetry.trace import SpanKind, Tracer
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay

from shared import metrics
from shared.bus.backoff import backoff
from shared.bus.headers import MSG_ID_HEADER
from shared.messages import SCHEMA_HEADER, Message
from shared.telemetry import inject_headers

# Raised while a server restarts or a leader moves; worth retrying a publish for.
TRANSIENT_PUBLISH_ERRORS: tuple[type[BaseException], ...] = (
    TimeoutError,  # nats.errors.TimeoutError derives from it
    nats.errors.NoRespondersError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,
    nats.js.errors.ServiceUnavailableError,
)


@dataclass(frozen=True)
class Published:
    stream: str
    seq: int
    duplicate: bool


async def publish(
    js: Any,
    tracer: Tracer,
    *,
    service: str,
    subject: str,
    message: Message,
    msg_id: str | None,
    headers: Mapping[str, str] | None,
    ack_timeout: float,
    retry_for: float,
) -> Published:
    """See :meth:`shared.bus.Bus.publish`."""
    msg_id = msg_id or uuid.uuid4().hex
    payload = message.encode()
    all_headers: dict[str, str] = dict(headers or {})
    all_headers[MSG_ID_HEADER] = msg_id
    all_headers[SCHEMA_HEADER] = message.schema_id()
    attributes = {
        "messaging.system": "nats",
        "messaging.operation.type": "send",
        "messaging.destination.name": subject,
        "messaging.message.id": msg_id,
    }
    with tracer.start_as_current_span(
        f"send {message.KIND}", kind=SpanKind.PRODUCER, attributes=attributes
    ) as span:
        inject_headers(all_headers)
        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(TRANSIENT_PUBLISH_ERRORS),
            stop=stop_after_delay(retry_for),
            wait=backoff(0.05, 2.0),
            reraise=True,
        ):
            with attempt:
                ack = await js.publish(subject, payload, timeout=ack_timeout, headers=all_headers)
        span.set_attribute("nats.jetstream.stream", ack.stream)
        span.set_attribute("nats.jetstream.sequence", ack.seq)
    duplicate = bool(ack.duplicate)
    if not duplicate:
        metrics.BUS_MESSAGES_PUBLISHED.labels(service=service, kind=message.KIND).inc()
    return Published(stream=ack.stream, seq=int(ack.seq), duplicate=duplicate)
