"""Publishing a message and waiting for JetStream to store it (docs/messages.md, "Headers").

A publish is retried while the failure can clear by itself (a server restarting, a leader
moving, the connection reconnecting) and fails at once with
:class:`~shared.bus.errors.PermanentPublishError` when no retry can help, so that one bad
object is dead-lettered instead of holding up everything behind it:

- a message (payload and headers) above the server's ``max_payload`` is refused before it is
  sent: the server would answer it by closing the connection, and nats-py would not reconnect;
- a subject with an empty token, a wildcard or whitespace is refused before it is sent;
- a publish the server reports as a permission violation (it does so in an asynchronous error,
  and never answers the request) fails when its acknowledgement times out;
- a message JetStream itself refuses for good (too large for the stream, a TTL the stream
  does not allow, ...) fails with JetStream's reason.

A subject no stream captures any more (the server lost its store) gets its stream created again
from the specs the bus knows, and the publish goes on.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import nats.errors
import nats.js.errors
from opentelemetry.trace import SpanKind, Tracer
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay

from shared import metrics
from shared.bus.backoff import backoff, delay
from shared.bus.connection import ConnectionState
from shared.bus.errors import INVALID_SUBJECT, PERMISSION, REJECTED, TOO_LARGE, PermanentPublishError
from shared.bus.headers import MSG_ID_HEADER, TTL_HEADER, subject_problem, ttl_value, wire_size
from shared.messages import SCHEMA_HEADER, Encoding, Message, encode
from shared.telemetry import inject_headers

# Raised while a server restarts or a leader moves; worth retrying a publish for.
TRANSIENT_PUBLISH_ERRORS: tuple[type[BaseException], ...] = (
    TimeoutError,  # nats.errors.TimeoutError derives from it
    nats.errors.NoRespondersError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,
    nats.js.errors.ServiceUnavailableError,
    # No stream answered: JetStream is still starting, or the stream is gone (see above).
    nats.js.errors.NoStreamResponseError,
)

# JetStream error codes (nats-server's errors.json) that refuse this one message for good.
_PERMANENT_JS_ERRORS = {
    10054: TOO_LARGE,  # message size exceeds maximum allowed (the stream's max_msg_size)
    10165: REJECTED,  # per-message TTL is invalid
    10166: REJECTED,  # per-message TTL is disabled on the stream
}

# Recreates the stream that should capture a subject; False when no known stream does.
RestoreStream = Callable[[str], Awaitable[bool]]


@dataclass(frozen=True)
class Published:
    stream: str
    seq: int
    duplicate: bool


def check_publishable(subject: str, payload: bytes, headers: Mapping[str, str], max_payload: int) -> None:
    """Refuse what can never be published, before anything is sent (pure)."""
    problem = subject_problem(subject)
    if problem is not None:
        raise PermanentPublishError(INVALID_SUBJECT, subject, problem)
    size = wire_size(payload, headers)
    if max_payload > 0 and size > max_payload:
        raise PermanentPublishError(
            TOO_LARGE,
            subject,
            f"the message is {size} bytes (payload {len(payload)}); the server takes at most {max_payload}",
        )


def permanent_reason(exc: BaseException) -> str | None:
    """The reason a publish error can never clear by retrying, None if it might (pure)."""
    if isinstance(exc, nats.errors.MaxPayloadError):
        return TOO_LARGE
    if isinstance(exc, nats.errors.BadSubjectError):
        return INVALID_SUBJECT
    if isinstance(exc, nats.errors.BadHeaderError):
        return REJECTED
    if isinstance(exc, nats.js.errors.APIError) and not isinstance(
        exc, nats.js.errors.ServiceUnavailableError
    ):
        return _PERMANENT_JS_ERRORS.get(exc.err_code or 0)
    return None


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
    ttl: float | None = None,
    max_payload: int = 0,
    state: ConnectionState | None = None,
    restore_stream: RestoreStream | None = None,
    encoding: Encoding = "msgpack",
) -> Published:
    """See :meth:`shared.bus.Bus.publish`."""
    msg_id = msg_id or uuid.uuid4().hex
    payload, encoding_headers = encode(message, encoding, msg_id=msg_id, source=service)
    all_headers: dict[str, str] = dict(headers or {})
    all_headers.update(encoding_headers)
    all_headers[MSG_ID_HEADER] = msg_id
    all_headers[SCHEMA_HEADER] = message.schema_id()
    if ttl is not None:
        all_headers[TTL_HEADER] = ttl_value(ttl)
    # OpenTelemetry's messaging semantic conventions (a producer span per publish).
    attributes: dict[str, str | int] = {
        "messaging.system": "nats",
        "messaging.operation.type": "send",
        "messaging.operation.name": "publish",
        "messaging.destination.name": subject,
        "messaging.message.id": msg_id,
        "messaging.message.body.size": len(payload),
    }
    with tracer.start_as_current_span(
        f"send {message.KIND}", kind=SpanKind.PRODUCER, attributes=attributes
    ) as span:
        inject_headers(all_headers)
        check_publishable(subject, payload, all_headers, max_payload)
        ack = await send(
            js,
            subject,
            payload,
            all_headers,
            ack_timeout=ack_timeout,
            retry_for=retry_for,
            state=state,
            restore_stream=restore_stream,
        )
        span.set_attribute("nats.jetstream.stream", ack.stream)
        span.set_attribute("nats.jetstream.sequence", ack.seq)
    duplicate = bool(ack.duplicate)
    if not duplicate:
        metrics.BUS_MESSAGES_PUBLISHED.labels(service=service, kind=message.KIND).inc()
    return Published(stream=ack.stream, seq=int(ack.seq), duplicate=duplicate)


async def send(
    js: Any,
    subject: str,
    payload: bytes,
    headers: dict[str, str],
    *,
    ack_timeout: float,
    retry_for: float,
    state: ConnectionState | None,
    restore_stream: RestoreStream | None,
) -> Any:
    """Publish to JetStream and return its ack, retrying what may clear by itself for up to
    ``retry_for`` seconds; :class:`PermanentPublishError` for what cannot."""
    began = time.monotonic()
    wait = backoff(0.05, 2.0)
    restored = False

    async def attempt() -> Any:
        nonlocal restored
        try:
            return await _send_once(js, subject, payload, headers, ack_timeout, state)
        except nats.js.errors.NoStreamResponseError:
            if restore_stream is not None and not restored:
                # Once per publish: the server may simply be starting, and then there is
                # nothing to restore (ensure_stream finds the stream and returns).
                restored = await _restore(restore_stream, subject)
            raise

    # The common case first, with no retry machinery around it: a tenacity loop per publish
    # costs a good share of a publish that succeeds at once.
    try:
        return await attempt()
    except TRANSIENT_PUBLISH_ERRORS:
        pass
    # The pause the retry loop would have taken after this first attempt.
    await asyncio.sleep(delay(wait, 1))
    return await AsyncRetrying(
        retry=retry_if_exception_type(TRANSIENT_PUBLISH_ERRORS),
        stop=stop_after_delay(max(0.0, retry_for - (time.monotonic() - began))),
        wait=wait,
        reraise=True,
    )(attempt)


async def _send_once(
    js: Any,
    subject: str,
    payload: bytes,
    headers: dict[str, str],
    ack_timeout: float,
    state: ConnectionState | None,
) -> Any:
    """One publish and its ack; what can never succeed as :class:`PermanentPublishError`."""
    started = time.monotonic()
    try:
        return await js.publish(subject, payload, timeout=ack_timeout, headers=headers)
    except TimeoutError:
        if state is not None and state.publish_denied(subject, since=started):
            raise PermanentPublishError(
                PERMISSION, subject, "the server refused it (permissions violation)"
            ) from None
        raise
    except nats.errors.Error as exc:
        reason = permanent_reason(exc)
        if reason is not None:
            detail = exc.description if isinstance(exc, nats.js.errors.APIError) else str(exc)
            raise PermanentPublishError(reason, subject, detail or type(exc).__name__) from exc
        raise


async def _restore(restore_stream: RestoreStream, subject: str) -> bool:
    try:
        return await restore_stream(subject)
    except Exception:  # the publish retries, and tries again on its next failure
        return False
