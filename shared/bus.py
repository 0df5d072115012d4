"""The one adapter between Respawn's services and NATS JetStream.

Everything a service does on the bus goes through :class:`Bus`:

- set-up at start, idempotent and safe to race with other replicas: the streams of
  docs/messages.md (:meth:`Bus.ensure_streams`), KV buckets (:meth:`Bus.kv`) and durable
  pull consumers (:meth:`Bus.ensure_consumer`);
- :meth:`Bus.publish` of a :class:`shared.messages.Message` with a ``Nats-Msg-Id`` for
  de-duplication, the schema header and the W3C trace context;
- :meth:`Bus.consume`, a supervised pull loop that acks a message only after its handler
  returned, naks it (with a delay) when the handler asks to be retried, and moves what can
  never be processed to ``respawn.deadletter.<service>`` instead of crashing or looping.

The connection reconnects forever with exponential backoff; consumers re-bind after every
reconnect, because a pull subscription does not reliably resume on its own after a server
restart (nats-io/nats.py#504).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import random
import re
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.js import api
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import (
    INVALID_SPAN,
    NoOpTracerProvider,
    ProxyTracerProvider,
    Span,
    SpanKind,
    Status,
    StatusCode,
    TracerProvider,
)
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from shared import metrics, subjects
from shared.messages import SCHEMA_HEADER, InvalidMessage, Message, UnsupportedSchemaVersion, decode
from shared.telemetry import extract_context, inject_headers

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)

MSG_ID_HEADER = "Nats-Msg-Id"
TRACEPARENT_HEADER = "traceparent"
# Headers added to a dead-lettered copy (docs/messages.md, "Dead letters").
DL_REASON_HEADER = "Respawn-Dead-Letter-Reason"
DL_ERROR_HEADER = "Respawn-Dead-Letter-Error"
DL_SUBJECT_HEADER = "Respawn-Original-Subject"
DL_STREAM_HEADER = "Respawn-Original-Stream"
DL_SEQUENCE_HEADER = "Respawn-Original-Sequence"
DL_CONSUMER_HEADER = "Respawn-Consumer"
DL_DELIVERIES_HEADER = "Respawn-Deliveries"

DL_INVALID = "invalid"
DL_UNSUPPORTED_VERSION = "unsupported-version"
DL_MAX_DELIVERIES = "max-deliveries"

_MAX_HEADER_VALUE = 1024
_DAY = 24 * 3600.0

# Raised while a server restarts or a leader moves; worth retrying a publish for.
_TRANSIENT_PUBLISH_ERRORS: tuple[type[BaseException], ...] = (
    TimeoutError,  # nats.errors.TimeoutError derives from it
    nats.errors.NoRespondersError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,
    nats.js.errors.ServiceUnavailableError,
)


# Re-exported so that services choose where a consumer starts without importing nats themselves.
DeliverPolicy = api.DeliverPolicy


class BusError(RuntimeError):
    """The bus could not be set up or reached; the message names cause and fix."""


class TransientError(Exception):
    """Raised by a handler to have the message redelivered after ``delay`` seconds.

    Use it for conditions expected to clear by themselves: a Kubernetes conflict or
    timeout, a KV revision conflict, a dependency that is not ready yet.
    """

    def __init__(self, message: str = "", *, delay: float = 1.0) -> None:
        super().__init__(message or "transient error")
        self.delay = max(0.0, delay)


class KvConflict(Exception):
    """A KV write lost a compare-and-set race (the revision moved on)."""


# ------------------------------------------------------------------ streams


@dataclass(frozen=True)
class StreamSpec:
    """What a stream must look like; ``None`` limits mean "unlimited"."""

    name: str
    subjects: tuple[str, ...]
    description: str = ""
    max_msgs_per_subject: int = -1
    max_age: float | None = None  # seconds
    max_msgs: int | None = None

    def config(self, *, replicas: int, duplicate_window: float) -> api.StreamConfig:
        return api.StreamConfig(
            name=self.name,
            description=self.description or None,
            subjects=list(self.subjects),
            retention=api.RetentionPolicy.LIMITS,
            storage=api.StorageType.FILE,
            discard=api.DiscardPolicy.OLD,
            num_replicas=replicas,
            duplicate_window=duplicate_window,
            max_msgs_per_subject=self.max_msgs_per_subject,
            max_age=self.max_age,
            max_msgs=self.max_msgs,
        )


# Per-subject history kept for the retained, public streams: enough for an external
# subscriber to see one AppWrapper's recent story without unbounded growth.
VERDICT_HISTORY = 64
LIFECYCLE_HISTORY = 64


def default_streams() -> tuple[StreamSpec, ...]:
    """Respawn's streams (docs/messages.md, "Streams")."""
    return (
        StreamSpec(
            name=subjects.OBSERVATIONS_STREAM,
            subjects=(f"{subjects.OBS_PREFIX}.>",),
            description="Latest observed state of each watched object (one message per subject)",
            # Observations are "latest state": a newer one replaces the older, so a
            # consumer that falls behind skips straight to the present.
            max_msgs_per_subject=1,
        ),
        StreamSpec(
            name=subjects.VERDICTS_STREAM,
            subjects=(f"{subjects.VERDICT_PREFIX}.>",),
            description="Health verdicts per AppWrapper (public interface)",
            max_msgs_per_subject=VERDICT_HISTORY,
            max_age=30 * _DAY,
        ),
        StreamSpec(
            name=subjects.NODE_VERDICTS_STREAM,
            subjects=(f"{subjects.NODE_VERDICT_PREFIX}.>",),
            description="Latest unhealthy-node sets per resource",
            max_msgs_per_subject=1,
        ),
        StreamSpec(
            name=subjects.LIFECYCLE_STREAM,
            subjects=(f"{subjects.LIFECYCLE_PREFIX}.>",),
            description="What lifecycle did to each AppWrapper (public interface)",
            max_msgs_per_subject=LIFECYCLE_HISTORY,
            max_age=30 * _DAY,
        ),
        StreamSpec(
            name=subjects.DEAD_LETTER_STREAM,
            subjects=(f"{subjects.DEAD_LETTER_PREFIX}.>",),
            description="Messages a consumer could not process, with the reason in headers",
            max_age=14 * _DAY,
            max_msgs=100_000,
        ),
    )


def _stream_differences(desired: api.StreamConfig, actual: api.StreamConfig) -> list[str]:
    """The settings that differ, as "field: actual -> desired" (only fields we manage)."""

    def norm_limit(value: Any) -> Any:
        return -1 if value in (None, 0) else value

    def norm_age(value: Any) -> float:
        return float(value or 0.0)

    checks: list[tuple[str, Any, Any]] = [
        ("subjects", sorted(actual.subjects or []), sorted(desired.subjects or [])),
        ("retention", actual.retention, desired.retention),
        ("storage", actual.storage, desired.storage),
        ("discard", actual.discard, desired.discard),
        ("num_replicas", actual.num_replicas or 1, desired.num_replicas or 1),
        (
            "max_msgs_per_subject",
            norm_limit(actual.max_msgs_per_subject),
            norm_limit(desired.max_msgs_per_subject),
        ),
        ("max_msgs", norm_limit(actual.max_msgs), norm_limit(desired.max_msgs)),
        ("max_age", norm_age(actual.max_age), norm_age(desired.max_age)),
        (
            "duplicate_window",
            round(norm_age(actual.duplicate_window), 3),
            round(norm_age(desired.duplicate_window), 3),
        ),
    ]
    return [f"{name}: {have!r} -> {want!r}" for name, have, want in checks if have != want]


# ------------------------------------------------------------------ KV


@dataclass(frozen=True)
class KvEntry:
    key: str
    value: bytes
    revision: int


class KvStore:
    """A KV bucket with compare-and-set helpers. Keys match ``[-/_=.a-zA-Z0-9]+``."""

    def __init__(self, kv: Any, bucket: str) -> None:
        self._kv = kv
        self.bucket = bucket

    async def get(self, key: str) -> KvEntry | None:
        """The current value, or None if the key does not exist or was deleted."""
        try:
            entry = await self._kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            return None
        return KvEntry(key=key, value=bytes(entry.value or b""), revision=int(entry.revision))

    async def put(self, key: str, value: bytes) -> int:
        """Write unconditionally; returns the new revision."""
        return int(await self._kv.put(key, value))

    async def create(self, key: str, value: bytes) -> int:
        """Write only if the key does not exist (a deleted key counts as absent)."""
        try:
            return int(await self._kv.create(key, value))
        except nats.js.errors.KeyWrongLastSequenceError as exc:
            raise KvConflict(f"{self.bucket}/{key} already exists") from exc

    async def update(self, key: str, value: bytes, *, revision: int) -> int:
        """Write only if the key is still at ``revision`` (from :meth:`get`)."""
        if revision <= 0:
            # nats-py treats 0 as "must not exist"; make that an explicit create instead.
            raise ValueError("update needs the revision from get(); use create() for a new key")
        try:
            return int(await self._kv.update(key, value, last=revision))
        except nats.js.errors.KeyWrongLastSequenceError as exc:
            raise KvConflict(f"{self.bucket}/{key} changed since revision {revision}") from exc

    async def delete(self, key: str, *, revision: int | None = None) -> None:
        """Delete (optionally only if still at ``revision``); deleting a missing key is fine."""
        try:
            await self._kv.delete(key, last=revision)
        except nats.js.errors.KeyWrongLastSequenceError as exc:
            raise KvConflict(f"{self.bucket}/{key} changed since revision {revision}") from exc

    async def keys(self) -> list[str]:
        try:
            return sorted(await self._kv.keys())
        except nats.js.errors.NoKeysError:
            return []

    async def update_with(
        self,
        key: str,
        change: Callable[[KvEntry | None], bytes | None],
        *,
        attempts: int = 10,
    ) -> KvEntry | None:
        """Read, apply ``change`` (pure: old entry → new bytes, or None for "leave it"), write
        with compare-and-set, and start over from a fresh read when another writer won.

        Returns the entry as written (or as found, when ``change`` returned None). Raises
        :class:`KvConflict` after ``attempts`` lost races.
        """
        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(KvConflict),
            stop=stop_after_attempt(attempts),
            wait=wait_random(0, 0.02),
            reraise=True,
        ):
            with attempt:
                current = await self.get(key)
                new = change(current)
                if new is None:
                    return current
                if current is None:
                    revision = await self.create(key, new)
                else:
                    revision = await self.update(key, new, revision=current.revision)
                return KvEntry(key=key, value=new, revision=revision)
        raise AssertionError("unreachable")  # pragma: no cover


# ------------------------------------------------------------------ publish / consume


@dataclass(frozen=True)
class Published:
    stream: str
    seq: int
    duplicate: bool


@dataclass(frozen=True)
class Delivery:
    """How a message arrived; passed to handlers beside the decoded message."""

    subject: str
    headers: Mapping[str, str]
    stream: str
    consumer: str
    stream_seq: int
    num_delivered: int
    num_pending: int
    msg_id: str
    # The producer's trace context; the bus already runs the handler inside a span that
    # continues it, so handlers need this only to link work done later.
    trace_context: Context
    _msg: Any = field(repr=False, compare=False)

    async def in_progress(self) -> None:
        """Tell JetStream the handler is still working (resets the ack wait)."""
        await self._msg.in_progress()


Handler = Callable[[M, Delivery], Awaitable[None]]


def _header_value(text: str) -> str:
    # Header values cannot carry CR/LF; keep them bounded too.
    flat = " ".join(text.split())
    return flat if len(flat) <= _MAX_HEADER_VALUE else flat[: _MAX_HEADER_VALUE - 3] + "..."


def error_delay(num_delivered: int, *, base: float = 0.5, cap: float = 30.0) -> float:
    """Redelivery delay after an unexpected handler error: doubles per delivery, capped."""
    exponent = min(max(0, num_delivered - 1), 32)
    return min(cap, base * float(2**exponent))


# How long a busy consumer's batch fetch may wait for more messages (seconds).
BUSY_FETCH_TIMEOUT = 0.05


class Consumer(Generic[M]):
    """A running pull loop over one durable consumer (see :meth:`Bus.consume`)."""

    def __init__(
        self,
        bus: Bus,
        *,
        stream: str,
        durable: str,
        filter_subjects: tuple[str, ...],
        message_cls: type[M],
        handler: Handler[M],
        batch: int,
        fetch_timeout: float,
        max_deliver: int,
        consumer_config: api.ConsumerConfig,
        concurrency: int = 1,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self._bus = bus
        self.stream = stream
        self.durable = durable
        self.filter_subjects = filter_subjects
        self._cls = message_cls
        self._handler = handler
        self._batch = batch
        self._fetch_timeout = fetch_timeout
        self._max_deliver = max_deliver
        self._config = consumer_config
        self._concurrency = concurrency
        self._inflight: set[asyncio.Task[None]] = set()
        self._idle = True
        self._psub: Any = None
        self._generation = -1
        self._stopping = False
        self._busy = False
        self._bound = False
        self._task: asyncio.Task[None] | None = None
        labels = {"service": bus.service, "stream": stream}
        self._m_consumed = metrics.BUS_MESSAGES_CONSUMED.labels(**labels)
        self._m_acked = metrics.BUS_MESSAGES_ACKED.labels(**labels)
        self._m_errors = metrics.BUS_HANDLER_ERRORS.labels(**labels)
        self._m_seconds = metrics.BUS_HANDLER_SECONDS.labels(**labels)
        self._labels = labels
        self._span_name = f"process {message_cls.KIND}"

    # -------------------------------------------------------------- control

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"bus-consume-{self.stream}-{self.durable}")

    @property
    def running(self) -> bool:
        """Bound to the server and looping (for readiness)."""
        return self._task is not None and not self._task.done() and self._bound and not self._stopping

    @property
    def task(self) -> asyncio.Task[None] | None:
        return self._task

    async def stop(self, *, grace: float = 10.0) -> None:
        """Stop after the message being handled (if any, waiting up to ``grace`` seconds);
        fetched messages not yet handled are nak'ed so another replica gets them at once."""
        self._stopping = True
        self._bus._forget(self)
        task = self._task
        if task is None or task.done():
            return
        if not self._busy:
            task.cancel()  # idle in fetch or in a retry wait: nothing to lose
        _, pending = await asyncio.wait({task}, timeout=grace)
        if pending:
            log.warning(
                "consumer %s/%s: handler still busy after %.0fs; cancelling it",
                self.stream,
                self.durable,
                grace,
            )
            task.cancel()
            await asyncio.wait({task})
        if not task.cancelled() and task.exception() is not None:
            log.error("consumer %s/%s ended with %r", self.stream, self.durable, task.exception())

    # -------------------------------------------------------------- loop

    async def _run(self) -> None:
        if self._concurrency > 1:
            await self._run_keyed()
            return
        try:
            while not self._stopping:
                msgs = await self._next_batch()
                self._busy = True
                try:
                    for index, msg in enumerate(msgs):
                        if self._stopping:
                            # Hand the rest back at once instead of letting their ack wait run out.
                            for rest in msgs[index:]:
                                await self._settle(rest.nak(), "nak")
                            break
                        await self._process_guarded(msg)
                finally:
                    self._busy = False
        finally:
            await self._unbind()

    async def _process_guarded(self, msg: Any) -> None:
        try:
            await self._process(msg)
        except Exception:  # a bug here must not end the loop
            log.exception(
                "consumer %s/%s: processing %s failed; it will be redelivered",
                self.stream,
                self.durable,
                msg.subject,
            )
            await self._settle(msg.nak(delay=1.0), "nak")

    async def _unbind(self) -> None:
        self._bound = False
        psub, self._psub = self._psub, None
        if psub is not None:
            with contextlib.suppress(Exception):
                await psub.unsubscribe()

    async def _run_keyed(self) -> None:
        """Handle messages of different subjects concurrently, those of one subject in order.

        A subject names one object (e.g. one AppWrapper's verdicts), so a slow handler for one
        object no longer delays every other object's messages, while each object still sees its
        own messages one after another. At most ``concurrency`` messages are in flight; the next
        fetch asks only for as many as there are free slots.
        """
        slots = asyncio.Semaphore(self._concurrency)
        tails: dict[str, asyncio.Task[None]] = {}

        async def chain(previous: asyncio.Task[None] | None, msg: Any) -> None:
            try:
                if previous is not None:
                    await asyncio.wait({previous})
                if self._stopping:
                    # Hand it back at once instead of letting its ack wait run out.
                    await self._settle(msg.nak(), "nak")
                    return
                await self._process_guarded(msg)
            finally:
                slots.release()

        def done(task: asyncio.Task[None], *, subject: str) -> None:
            self._inflight.discard(task)
            if tails.get(subject) is task:
                del tails[subject]
            self._busy = bool(self._inflight)

        try:
            while not self._stopping:
                await slots.acquire()  # at least one free slot before fetching
                slots.release()
                free = self._concurrency - len(self._inflight)
                msgs = await self._next_batch(max(1, min(self._batch, free)))
                for msg in msgs:
                    await slots.acquire()
                    task = asyncio.create_task(chain(tails.get(msg.subject), msg))
                    tails[msg.subject] = task
                    self._inflight.add(task)
                    self._busy = True
                    task.add_done_callback(functools.partial(done, subject=msg.subject))
        finally:
            if self._inflight:
                # Let handlers that already started finish (stop() bounds how long).
                await asyncio.wait(set(self._inflight))
            await self._unbind()

    async def _next_batch(self, size: int | None = None) -> list[Any]:
        """One fetch of up to ``size`` messages (default: the batch size), (re)binding first
        when needed; errors back off and retry forever."""
        size = size or self._batch

        def before_sleep(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            log.warning(
                "consumer %s/%s: %s: %s; retrying in %.1fs",
                self.stream,
                self.durable,
                type(exc).__name__,
                exc,
                state.upcoming_sleep,
            )

        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(Exception),
            wait=wait_exponential(multiplier=0.1, max=5.0) + wait_random(0, 0.1),
            before_sleep=before_sleep,
        ):
            with attempt:
                if self._psub is None or self._generation != self._bus.reconnects:
                    await self._bind()
                try:
                    if self._idle:
                        # nats-py's fetch(n > 1) holds on to a lingering pull until n messages or
                        # the timeout, so one message arriving on an idle consumer would wait up
                        # to fetch_timeout. Waiting for exactly one returns the moment it arrives.
                        msgs = list(await self._psub.fetch(1, timeout=self._fetch_timeout))
                    else:
                        # Busy: take what is there now (the no-wait probe returns at once), and
                        # linger only briefly when the backlog has just run dry.
                        msgs = list(await self._psub.fetch(size, timeout=BUSY_FETCH_TIMEOUT))
                except TimeoutError:  # nothing to do: the normal idle case
                    msgs = []
                except Exception:
                    self._bound = False
                    self._psub = None
                    raise
                self._idle = not msgs
                return msgs
        raise AssertionError("unreachable")  # pragma: no cover

    async def _bind(self) -> None:
        self._bound = False
        old, self._psub = self._psub, None
        if old is not None:
            with contextlib.suppress(Exception):
                await old.unsubscribe()
        generation = self._bus.reconnects
        # Create-or-update every time: after a restart with a lost store the durable is gone.
        await self._bus.ensure_consumer(self.stream, self._config)
        self._psub = await self._bus.js.pull_subscribe_bind(durable=self.durable, stream=self.stream)
        self._generation = generation
        self._bound = True

    # -------------------------------------------------------------- one message

    async def _process(self, msg: Any) -> None:
        self._m_consumed.inc()
        try:
            md = msg.metadata
        except Exception:  # not a JetStream message; nothing to ack
            log.error(
                "consumer %s/%s got a non-JetStream message on %s", self.stream, self.durable, msg.subject
            )
            return
        headers: Mapping[str, str] = msg.headers or {}
        try:
            message = decode(self._cls, msg.data)
        except InvalidMessage as exc:
            reason = DL_UNSUPPORTED_VERSION if isinstance(exc, UnsupportedSchemaVersion) else DL_INVALID
            log.error(
                "consumer %s/%s: dead-lettering %s seq %d: %s",
                self.stream,
                self.durable,
                msg.subject,
                md.sequence.stream,
                exc,
            )
            await self._dead_letter(msg, md, reason, str(exc))
            return
        # Extracting and starting a span costs about as much as decoding; skip both when
        # nothing records spans and no trace came with the message (propagation needs neither).
        traced = TRACEPARENT_HEADER in headers or self._bus.tracing
        ctx = extract_context(headers) if traced else Context()
        delivery = Delivery(
            subject=msg.subject,
            headers=headers,
            stream=md.stream,
            consumer=md.consumer,
            stream_seq=int(md.sequence.stream),
            num_delivered=int(md.num_delivered),
            num_pending=int(md.num_pending or 0),
            msg_id=headers.get(MSG_ID_HEADER, ""),
            trace_context=ctx,
            _msg=msg,
        )
        if not traced:
            await self._handle(msg, md, message, delivery, INVALID_SPAN)
            return
        attributes = {
            "messaging.system": "nats",
            "messaging.operation.type": "process",
            "messaging.destination.name": msg.subject,
            "messaging.consumer.group.name": self.durable,
            "messaging.message.id": delivery.msg_id,
            "nats.jetstream.stream": md.stream,
            "nats.jetstream.delivery_count": delivery.num_delivered,
        }
        with self._bus.tracer.start_as_current_span(
            self._span_name,
            context=ctx,
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            await self._handle(msg, md, message, delivery, span)

    async def _handle(self, msg: Any, md: Any, message: M, delivery: Delivery, span: Span) -> None:
        """Run the handler and settle the message by its outcome (ack, nak or dead letter)."""
        exhausted = self._max_deliver > 0 and delivery.num_delivered >= self._max_deliver
        started = time.perf_counter()
        try:
            await self._handler(message, delivery)
        except TransientError as exc:
            self._m_seconds.observe(time.perf_counter() - started)
            span.set_attribute("respawn.retry_delay_s", exc.delay)
            if exhausted:
                await self._dead_letter(msg, md, DL_MAX_DELIVERIES, f"transient: {exc}")
            else:
                log.info("%s seq %d: retry in %.1fs: %s", msg.subject, delivery.stream_seq, exc.delay, exc)
                await self._nak(msg, exc.delay, "transient")
            return
        except Exception as exc:
            self._m_seconds.observe(time.perf_counter() - started)
            self._m_errors.inc()
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            log.exception(
                "handler failed for %s seq %d (delivery %d)",
                msg.subject,
                delivery.stream_seq,
                delivery.num_delivered,
            )
            if exhausted:
                await self._dead_letter(msg, md, DL_MAX_DELIVERIES, f"{type(exc).__name__}: {exc}")
            else:
                await self._nak(msg, error_delay(delivery.num_delivered), "error")
            return
        self._m_seconds.observe(time.perf_counter() - started)
        if await self._settle(msg.ack(), "ack"):
            self._m_acked.inc()

    async def _nak(self, msg: Any, delay: float, reason: str) -> None:
        if await self._settle(msg.nak(delay=delay if delay > 0 else None), "nak"):
            metrics.BUS_MESSAGES_NAKED.labels(**self._labels, reason=reason).inc()

    async def _settle(self, op: Awaitable[None], what: str) -> bool:
        """Run ack/nak/term; a failure only means JetStream will redeliver, so log and go on."""
        try:
            await op
        except nats.errors.MsgAlreadyAckdError:
            return False
        except Exception as exc:
            log.warning("consumer %s/%s: %s failed (%s: %s); the message will be redelivered",
                        self.stream, self.durable, what, type(exc).__name__, exc)  # fmt: skip
            return False
        return True

    async def _dead_letter(self, msg: Any, md: Any, reason: str, error: str) -> None:
        """Copy the raw message to the dead-letter subject, then terminate it.

        The copy is published first: if that fails the message is nak'ed, not lost.
        """
        headers = {k: v for k, v in (msg.headers or {}).items() if not k.startswith("Nats-")}
        headers.update(
            {
                DL_REASON_HEADER: reason,
                DL_ERROR_HEADER: _header_value(error),
                DL_SUBJECT_HEADER: msg.subject,
                DL_STREAM_HEADER: md.stream,
                DL_SEQUENCE_HEADER: str(md.sequence.stream),
                DL_CONSUMER_HEADER: md.consumer,
                DL_DELIVERIES_HEADER: str(md.num_delivered),
                # One dead letter per (service, consumer, stream message), even if the
                # message is dead-lettered again after a lost term.
                MSG_ID_HEADER: f"{self._bus.service}:{md.consumer}:{md.stream}:{md.sequence.stream}",
            }
        )
        try:
            await self._bus.js.publish(
                subjects.dead_letter(self._bus.service), bytes(msg.data), headers=headers, timeout=5.0
            )
        except Exception as exc:
            log.error(
                "dead-lettering %s seq %s failed (%s); will retry", msg.subject, md.sequence.stream, exc
            )
            await self._nak(msg, error_delay(int(md.num_delivered)), "dead-letter-failed")
            return
        metrics.BUS_DEAD_LETTERED.labels(**self._labels, reason=reason).inc()
        if await self._settle(msg.term(), "term"):
            metrics.BUS_MESSAGES_TERMINATED.labels(**self._labels, reason=reason).inc()


# ------------------------------------------------------------------ the bus


def replay_consumer_name(service: str, instance: str | None = None) -> str:
    """A durable name for one run of one replica that replays a stream into memory.

    Unique on every start (reusing a durable would resume after the last ack instead of
    replaying, while the previous run's in-memory state is gone) and valid in NATS (no dots or
    wildcards, which host names may contain). The server removes it once the run is gone (see
    ``inactive_threshold`` of :meth:`Bus.consume`).
    """
    raw = instance or os.environ.get("RESPAWN_INSTANCE") or f"{socket.gethostname()}-{os.getpid()}"
    safe = re.sub(r"[^A-Za-z0-9_-]+", "-", raw).strip("-")[:64] or "replica"
    return f"{service}-{safe}-{uuid.uuid4().hex[:8]}"


class Bus:
    """A connection to NATS JetStream for one service (see the module docstring)."""

    def __init__(
        self,
        nc: Any,
        *,
        service: str,
        replicas: int,
        duplicate_window: float,
        tracer_provider: TracerProvider | None,
        state: _ConnectionState,
    ) -> None:
        self._nc = nc
        self._js = nc.jetstream()
        self.service = service
        self.replicas = replicas
        self.duplicate_window = duplicate_window
        self.tracer = trace.get_tracer("respawn.bus", tracer_provider=tracer_provider)
        self._own_provider = tracer_provider is not None
        self._state = state
        self._consumers: list[Consumer[Any]] = []

    @classmethod
    async def connect(
        cls,
        url: str | Sequence[str],
        *,
        name: str,
        user: str | None = None,
        password: str | None = None,
        token: str | None = None,
        creds: str | Path | None = None,
        inbox_prefix: str | None = None,
        replicas: int = 1,
        duplicate_window: float = 120.0,
        connect_deadline: float | None = 60.0,
        reconnect_wait_max: float = 2.0,
        tracer_provider: TracerProvider | None = None,
    ) -> Bus:
        """Connect as service ``name``; reconnects forever once connected.

        The first connection is retried (with backoff) for ``connect_deadline`` seconds
        (None: forever), then :class:`BusError` names the server and the last error.
        ``replicas`` and ``duplicate_window`` apply to the streams this bus creates.
        """
        if replicas < 1:
            raise ValueError(f"replicas must be at least 1, got {replicas}")
        state = _ConnectionState(service=name)
        servers = [url] if isinstance(url, str) else list(url)
        options: dict[str, Any] = {
            "servers": servers,
            "name": name,
            "allow_reconnect": True,
            "max_reconnect_attempts": -1,
            "reconnect_to_server_handler": _backoff_handler(reconnect_wait_max),
            "connect_timeout": 2,
            # Only the first connection uses this fixed wait; reconnects use the backoff handler.
            "reconnect_time_wait": 0.5,
            "error_cb": state.on_error,
            "disconnected_cb": state.on_disconnected,
            "reconnected_cb": state.on_reconnected,
            "closed_cb": state.on_closed,
        }
        if user is not None:
            options["user"] = user
        if password is not None:
            options["password"] = password
        if token is not None:
            options["token"] = token
        if creds is not None:
            options["user_credentials"] = str(creds)
        if inbox_prefix:
            # Per-user inbox: with NATS subject permissions a user may be limited to its own replies.
            options["inbox_prefix"] = inbox_prefix
        where = ", ".join(servers)
        try:
            async with asyncio.timeout(connect_deadline):
                nc = await nats.connect(**options)
        except TimeoutError:
            raise BusError(
                f"could not connect to NATS at {where} within {connect_deadline:.0f}s "
                f"(last error: {state.last_error or 'none'}); check NATS_URL and that the server is up"
            ) from None
        except nats.errors.Error as exc:
            raise BusError(
                f"could not connect to NATS at {where}: {exc}; check the URL and credentials"
            ) from exc
        log.info(
            "connected to NATS at %s as %s", nc.connected_url.netloc if nc.connected_url else where, name
        )
        return cls(
            nc,
            service=name,
            replicas=replicas,
            duplicate_window=duplicate_window,
            tracer_provider=tracer_provider,
            state=state,
        )

    # -------------------------------------------------------------- state

    @property
    def nc(self) -> Any:
        """The underlying nats-py client (for what this adapter does not cover)."""
        return self._nc

    @property
    def js(self) -> Any:
        """The underlying JetStream context."""
        return self._js

    @property
    def connected(self) -> bool:
        return bool(self._nc.is_connected)

    @property
    def tracing(self) -> bool:
        """Whether spans are recorded (an SDK provider is installed or was given)."""
        return self._own_provider or not isinstance(
            trace.get_tracer_provider(), ProxyTracerProvider | NoOpTracerProvider
        )

    @property
    def reconnects(self) -> int:
        """How many times the connection was re-established (consumers re-bind on change)."""
        return self._state.reconnects

    @property
    def consumers(self) -> tuple[Consumer[Any], ...]:
        return tuple(self._consumers)

    def _forget(self, consumer: Consumer[Any]) -> None:
        with contextlib.suppress(ValueError):
            self._consumers.remove(consumer)

    def ready(self) -> bool:
        """Connected and every consumer started by this bus is bound and running."""
        return self.connected and all(c.running for c in self._consumers)

    async def close(self) -> None:
        """Stop every consumer, flush, and close the connection. Safe to call twice."""
        for consumer in list(self._consumers):
            await consumer.stop()
        self._consumers.clear()
        self._state.closing = True
        if not self._nc.is_closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._nc.flush(), 2.0)
            await self._nc.close()

    # -------------------------------------------------------------- set-up

    async def ensure_streams(self, specs: Sequence[StreamSpec] | None = None) -> None:
        """Create or reconcile Respawn's streams (all of :func:`default_streams` by default)."""
        for spec in specs if specs is not None else default_streams():
            await self.ensure_stream(spec)

    async def ensure_stream(self, spec: StreamSpec) -> None:
        """Create the stream, or update it where it differs; never fails on a refused update."""
        desired = spec.config(replicas=self.replicas, duplicate_window=self.duplicate_window)
        try:
            info = await self._js.stream_info(spec.name)
        except nats.js.errors.NotFoundError:
            try:
                await self._js.add_stream(desired)
                log.info("created stream %s on %s", spec.name, ", ".join(spec.subjects))
                return
            except nats.js.errors.APIError as exc:
                try:
                    # Another replica may have created it a moment ago.
                    info = await self._js.stream_info(spec.name)
                except nats.js.errors.NotFoundError:
                    raise BusError(
                        f"cannot create stream {spec.name}: {exc.description or exc}; "
                        f"check replicas ({self.replicas}) against the NATS cluster size and JetStream limits"
                    ) from exc
        differences = _stream_differences(desired, info.config)
        if not differences:
            return
        try:
            await self._js.update_stream(desired)
        except nats.js.errors.APIError as exc:
            log.error(
                "stream %s differs from the expected configuration (%s) and NATS refused the update (%s); "
                "continuing with the existing configuration",
                spec.name,
                "; ".join(differences),
                exc.description or exc,
            )
            return
        log.warning("updated stream %s: %s", spec.name, "; ".join(differences))

    async def ensure_consumer(self, stream: str, config: api.ConsumerConfig) -> None:
        """Create the durable consumer or update it in place; a refused update is logged."""
        try:
            await self._js.add_consumer(stream, config=config)
        except nats.js.errors.APIError as exc:
            try:
                await self._js.consumer_info(stream, config.durable_name)
            except nats.js.errors.NotFoundError:
                raise BusError(
                    f"cannot create consumer {config.durable_name} on {stream}: {exc.description or exc}"
                ) from exc
            log.error(
                "consumer %s on %s exists with a configuration NATS will not change (%s); using it as it is",
                config.durable_name,
                stream,
                exc.description or exc,
            )

    async def kv(
        self,
        bucket: str,
        *,
        history: int = 1,
        ttl: float | None = None,
        description: str = "",
    ) -> KvStore:
        """Bind the KV bucket, creating it first if it does not exist."""
        try:
            kv = await self._js.key_value(bucket)
        except nats.js.errors.BucketNotFoundError:
            try:
                kv = await self._js.create_key_value(
                    bucket=bucket,
                    history=history,
                    ttl=ttl,
                    description=description or None,
                    replicas=self.replicas,
                    storage=api.StorageType.FILE,
                )
                log.info("created KV bucket %s", bucket)
            except nats.js.errors.APIError as exc:
                try:
                    kv = await self._js.key_value(bucket)  # created concurrently by another replica
                except nats.js.errors.BucketNotFoundError:
                    raise BusError(f"cannot create KV bucket {bucket}: {exc.description or exc}") from exc
        return KvStore(kv, bucket)

    # -------------------------------------------------------------- publish

    async def publish(
        self,
        subject: str,
        message: Message,
        *,
        msg_id: str | None,
        headers: Mapping[str, str] | None = None,
        ack_timeout: float = 5.0,
        retry_for: float = 30.0,
    ) -> Published:
        """Publish ``message`` and wait for JetStream to store it.

        ``msg_id`` de-duplicates within the stream's duplicate window: derive it from what
        the message is about (e.g. uid + resourceVersion) so a republished observation is
        absorbed. Without one a random id is used, which still makes this method's own
        retries (for up to ``retry_for`` seconds, e.g. across a server restart) safe.
        """
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
        with self.tracer.start_as_current_span(
            f"send {message.KIND}", kind=SpanKind.PRODUCER, attributes=attributes
        ) as span:
            inject_headers(all_headers)
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type(_TRANSIENT_PUBLISH_ERRORS),
                stop=stop_after_delay(retry_for),
                wait=wait_exponential(multiplier=0.05, max=2.0) + wait_random(0, 0.05),
                reraise=True,
            ):
                with attempt:
                    ack = await self._js.publish(subject, payload, timeout=ack_timeout, headers=all_headers)
            span.set_attribute("nats.jetstream.stream", ack.stream)
            span.set_attribute("nats.jetstream.sequence", ack.seq)
        duplicate = bool(ack.duplicate)
        if not duplicate:
            metrics.BUS_MESSAGES_PUBLISHED.labels(service=self.service, kind=message.KIND).inc()
        return Published(stream=ack.stream, seq=int(ack.seq), duplicate=duplicate)

    # -------------------------------------------------------------- consume

    async def consume(
        self,
        stream: str,
        durable: str,
        filter_subjects: str | Sequence[str],
        message_cls: type[M],
        handler: Handler[M],
        *,
        batch: int = 128,
        max_ack_pending: int = 1024,
        ack_wait: float = 30.0,
        max_deliver: int = 10,
        fetch_timeout: float = 1.0,
        deliver_policy: api.DeliverPolicy = api.DeliverPolicy.ALL,
        inactive_threshold: float | None = None,
        concurrency: int = 1,
    ) -> Consumer[M]:
        """Create-or-update the durable pull consumer and start its loop.

        Messages are handled one at a time, in order; with ``concurrency`` > 1, messages on
        different subjects are handled concurrently (up to that many at once) and those on one
        subject still one after another, in order. ``handler(message, delivery)``:
        returning acks; raising :class:`TransientError` naks with its delay; any other
        exception is logged and naked with a growing delay. On the ``max_deliver``-th
        failed delivery, and for undecodable or newer-version messages at once, the raw
        message goes to ``respawn.deadletter.<service>`` and is terminated.
        Handlers must be idempotent: an ack can be lost and the message redelivered.
        """
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        filters = (filter_subjects,) if isinstance(filter_subjects, str) else tuple(filter_subjects)
        if not filters:
            raise ValueError("consume needs at least one filter subject")
        config = api.ConsumerConfig(
            name=durable,
            durable_name=durable,
            deliver_policy=deliver_policy,
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=ack_wait,
            max_deliver=max_deliver,
            max_ack_pending=max_ack_pending,
            filter_subject=filters[0] if len(filters) == 1 else None,
            filter_subjects=list(filters) if len(filters) > 1 else None,
            # Per-instance consumers (a replica that replays a stream into memory) are removed
            # by the server once their instance is gone for this long.
            inactive_threshold=inactive_threshold,
        )
        await self.ensure_consumer(stream, config)
        consumer = Consumer(
            self,
            stream=stream,
            durable=durable,
            filter_subjects=filters,
            message_cls=message_cls,
            handler=handler,
            batch=batch,
            fetch_timeout=fetch_timeout,
            max_deliver=max_deliver,
            consumer_config=config,
            concurrency=concurrency,
        )
        consumer.start()
        self._consumers.append(consumer)
        return consumer


# ------------------------------------------------------------------ connection plumbing


@dataclass
class _ConnectionState:
    service: str
    reconnects: int = 0
    last_error: str = ""
    closing: bool = False
    _disconnected_at: float | None = None

    async def on_error(self, exc: Exception) -> None:
        text = f"{type(exc).__name__}: {exc}".strip()
        if text != self.last_error:  # once per distinct error, not once per reconnect attempt
            log.warning("NATS client error: %s", text)
        self.last_error = text

    async def on_disconnected(self) -> None:
        if self.closing:
            return
        if self._disconnected_at is None:
            self._disconnected_at = time.monotonic()
            log.warning("disconnected from NATS; reconnecting")

    async def on_reconnected(self) -> None:
        self.reconnects += 1
        down = time.monotonic() - self._disconnected_at if self._disconnected_at is not None else 0.0
        self._disconnected_at = None
        log.warning("reconnected to NATS after %.1fs", down)

    async def on_closed(self) -> None:
        log.info("NATS connection closed")


def _backoff_handler(cap: float) -> Callable[[list[Any], dict[str, Any]], tuple[Any, float]]:
    """Reconnect delay: 50 ms doubling per failed attempt up to ``cap``, with jitter."""

    def choose(servers: list[Any], _info: dict[str, Any]) -> tuple[Any, float]:
        server = min(servers, key=lambda s: s.reconnects)
        delay = min(cap, 0.05 * 2 ** min(server.reconnects, 16))
        return server, delay * random.uniform(0.8, 1.2)

    return choose
