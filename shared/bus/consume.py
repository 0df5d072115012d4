"""Durable pull consumers: the supervised loop behind :meth:`shared.bus.Bus.consume` and
:meth:`shared.bus.Bus.replay`.

A message is acked only after its handler returned, nak'ed (with a delay) when the handler
asks to be retried or fails, and what can never be processed is moved to
``respawn.deadletter.<service>`` instead of crashing or looping (docs/messages.md, "Delivery
and acknowledgement", "Dead letters"): a poison message is given up on after ``max_deliver``
deliveries or ``max_errors`` handler errors, and never holds up the messages behind it. The
loop re-binds after every reconnect, because a pull subscription does not reliably resume on
its own after a server restart (nats-io/nats.py#504), and re-creates its consumer when binding
or fetching fails, so a consumer deleted under it comes back; if its stream is gone too (the
server lost its store), the bus creates the stream again from its spec first. Until it is bound
again, :attr:`Consumer.problem` says why (for readiness).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, Protocol

import nats.errors
import nats.js.errors
from nats.js import api
from opentelemetry.context import Context
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Status, StatusCode
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

from shared import metrics, subjects
from shared.bus.backoff import backoff, error_delay
from shared.bus.connection import redact
from shared.bus.deadletter import (
    DL_INVALID,
    DL_MAX_DELIVERIES,
    DL_MAX_ERRORS,
    DL_UNSUPPORTED_VERSION,
    dead_letter_headers,
    fit,
)
from shared.bus.delivery import Delivery, Handler, M
from shared.bus.errors import BusError, PermanentPublishError, TransientError
from shared.bus.headers import MARKER_REASON_HEADER, MSG_ID_HEADER, TRACEPARENT_HEADER
from shared.bus.pull import JS_API_PREFIX, Puller
from shared.messages import InvalidMessage, UnsupportedSchemaVersion, decode
from shared.telemetry import extract_context

if TYPE_CHECKING:
    from shared.bus.bus import Bus

log = logging.getLogger(__name__)

# Re-exported so that services choose where a consumer starts without importing nats themselves.
DeliverPolicy = api.DeliverPolicy

# How long one pull request lasts (seconds; at least the fetch timeout): an idle consumer asks
# the server once per this, whatever its fetch timeout (see shared.bus.pull).
PULL_EXPIRES = 30.0
# How long an idle loop waits for a message before it looks around again (seconds). Nothing
# needs it sooner: a message, a reconnect (Bus wakes every consumer) and stop() end the wait at
# once, and the server ends a request with a status message when the consumer goes. A short wait
# made every idle consumer wake its process once per fetch timeout for nothing (16 partitions:
# 16 wake-ups a second in an idle lifecycle). A replay still catching up waits only the fetch
# timeout, as it asks the server how far it is after every empty fetch.
IDLE_WAIT = PULL_EXPIRES
# The pause after a fetch that failed, before the first retry; the retries after it double up to
# 5 s (shared.bus.backoff).
FIRST_RETRY_DELAY = 0.1

# JetStream's error code for "stream not found" (nats-server's errors.json, JSStreamNotFoundErr).
STREAM_NOT_FOUND = 10059

# Messages whose handler errors are being counted (see ``max_errors``); at most max_ack_pending
# are in flight at once, so this bound is only reached by messages that left the stream.
_ERROR_COUNTS_KEPT = 10_000


class StreamMissing(BusError):
    """The stream a consumer belongs to does not exist (any more)."""


def stream_missing(exc: BaseException) -> bool:
    return isinstance(exc, nats.js.errors.NotFoundError) and exc.err_code == STREAM_NOT_FOUND


class Outcome(enum.Enum):
    """How a delivered message was settled."""

    DONE = "done"  # handled and acked, or given up on (dead-lettered or dropped) and terminated
    RETRY = "retry"  # nak'ed: it will be delivered again


class LoopObserver(Protocol):
    """Told what a consumer loop does, from the loop's own task: so between two handler calls.

    The methods must not raise; :class:`shared.bus.replay.Replay` is the one implementation.
    """

    async def bound(self, consumer: Consumer[Any]) -> None:
        """The loop (re)bound to its consumer and is about to fetch."""

    async def settled(
        self, consumer: Consumer[Any], stream_seq: int, num_pending: int, outcome: Outcome
    ) -> None:
        """A delivery was settled; ``num_pending`` is what the server had pending when it delivered."""

    async def idle(self, consumer: Consumer[Any]) -> None:
        """A fetch returned nothing."""

    def waiting(self) -> bool:
        """Whether the loop should come back from an empty fetch after the fetch timeout (to
        call :meth:`idle`) rather than wait for a message."""


def consumer_config(
    durable: str,
    filters: Sequence[str],
    *,
    deliver_policy: api.DeliverPolicy,
    ack_wait: float,
    max_deliver: int,
    max_ack_pending: int,
    inactive_threshold: float | None,
    start_time: datetime | None = None,
) -> api.ConsumerConfig:
    """A durable pull consumer with explicit acks on ``filters``; with ``start_time``, it
    delivers the messages stored from then on (whatever ``deliver_policy`` says)."""
    if not filters:
        raise ValueError("a consumer needs at least one filter subject")
    return api.ConsumerConfig(
        name=durable,
        durable_name=durable,
        deliver_policy=deliver_policy if start_time is None else api.DeliverPolicy.BY_START_TIME,
        opt_start_time=start_time,
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


async def ensure_consumer(js: Any, stream: str, config: api.ConsumerConfig) -> None:
    """Create the durable consumer or update it in place; a refused update is logged.

    :class:`StreamMissing` when the stream does not exist (see :meth:`shared.bus.Bus.ensure_consumer`,
    which creates it again).
    """
    try:
        await js.add_consumer(stream, config=config)
    except nats.js.errors.APIError as exc:
        if stream_missing(exc):
            raise StreamMissing(f"stream {stream} does not exist") from exc
        try:
            await js.consumer_info(stream, config.durable_name)
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


async def delete_consumer(js: Any, stream: str, durable: str) -> None:
    """Delete the consumer; one that is already gone is fine."""
    with contextlib.suppress(nats.js.errors.NotFoundError):
        await js.delete_consumer(stream, durable)


def _position(msg: Any) -> tuple[int, int] | None:
    """(stream sequence, pending) of a JetStream message, None for anything else."""
    try:
        md = msg.metadata
        return int(md.sequence.stream), int(md.num_pending or 0)
    except Exception:
        return None


class Consumer(Generic[M]):
    """A running pull loop over one durable consumer (see :meth:`shared.bus.Bus.consume`)."""

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
        observer: LoopObserver | None = None,
        dead_letters: bool = True,
        spans: bool = True,
        max_errors: int | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        if observer is not None and concurrency > 1:
            # The observer reasons about stream order, which only one message at a time keeps.
            raise ValueError("an observed consumer handles one message at a time")
        self._bus = bus
        self.stream = stream
        self.durable = durable
        self.filter_subjects = filter_subjects
        self._cls = message_cls
        self._handler = handler
        self._batch = batch
        self._fetch_timeout = fetch_timeout
        self._max_deliver = max_deliver
        if max_errors is not None and max_errors < 1:
            raise ValueError(f"max_errors must be at least 1, got {max_errors}")
        self._max_errors = max_errors
        # Handler errors per stream sequence, when max_errors is set (see Bus.consume).
        self._errors: OrderedDict[int, int] = OrderedDict()
        self._config = consumer_config
        self._concurrency = concurrency
        self._observer = observer
        self._dead_letters = dead_letters
        self._spans = spans
        self._inflight: set[asyncio.Task[None]] = set()
        self._puller: Puller | None = None
        self._generation = -1
        self._stopping = False
        self._busy = False
        self._bound = False
        self._problem = ""
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
    def problem(self) -> str:
        """Why the loop is not running, for readiness: the last error binding or fetching,
        "" while it runs."""
        if self.running:
            return ""
        if self._task is None:
            return "not started"
        if self._stopping or self._task.done():
            return "stopped"
        return self._problem or "binding"

    @property
    def task(self) -> asyncio.Task[None] | None:
        return self._task

    def wake(self) -> None:
        """End the wait for a message under way, so the loop looks around now (the bus calls it
        on a reconnect, after which the loop binds again)."""
        if self._puller is not None:
            self._puller.interrupt()

    async def pending(self) -> tuple[int, int]:
        """What the server holds for this consumer: (not yet delivered, delivered but not acked)."""
        info = await self._bus.js.consumer_info(self.stream, self.durable)
        return int(info.num_pending or 0), int(info.num_ack_pending or 0)

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
        else:
            # The handlers under way finish. A keyed loop meanwhile waits for its next messages
            # (slots are free): it must see that it is stopping now, not when that wait ends
            # (longer than the grace), or every busy consumer would hold a shutdown up for the
            # whole grace.
            self.wake()
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
                index = 0
                try:
                    while index < len(msgs) and not self._stopping:
                        msg = msgs[index]
                        outcome = await self._process_guarded(msg)
                        index += 1
                        position = _position(msg)
                        if self._observer is not None and outcome is not None and position is not None:
                            await self._observer.settled(self, *position, outcome)
                finally:
                    self._busy = False
                    # Stopping, or cancelled in a handler: what was not handled (the interrupted
                    # one included; handlers are idempotent) goes back at once, instead of
                    # waiting out its ack wait.
                    for rest in msgs[index:]:
                        await self._settle(rest.nak(), "nak")
        finally:
            await self._unbind()

    async def _process_guarded(self, msg: Any) -> Outcome | None:
        try:
            return await self._process(msg)
        except Exception:  # a bug here must not end the loop
            log.exception(
                "consumer %s/%s: processing %s failed; it will be redelivered",
                self.stream,
                self.durable,
                msg.subject,
            )
            await self._settle(msg.nak(delay=1.0), "nak")
            return Outcome.RETRY

    async def _unbind(self) -> None:
        self._bound = False
        puller, self._puller = self._puller, None
        if puller is None:
            return
        # Messages that arrived and were never handled go back at once: whoever pulls next
        # (this loop bound again, or the replica that took the partition over) gets them now
        # rather than after ack_wait.
        for msg in await puller.close():
            await self._settle(msg.nak(), "nak")

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
                if self._stopping:
                    break
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
        try:
            # The common case, with no retry machinery around it: on an idle consumer this runs
            # once per message, and a tenacity loop per fetch costs as much as the fetch itself.
            return await self._fetch(size)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._log_retry(exc, FIRST_RETRY_DELAY)
            await asyncio.sleep(FIRST_RETRY_DELAY)

        def before_sleep(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            self._log_retry(exc, state.upcoming_sleep)

        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(Exception),
            wait=backoff(2 * FIRST_RETRY_DELAY, 5.0),
            before_sleep=before_sleep,
        ):
            with attempt:
                return await self._fetch(size)
        raise AssertionError("unreachable")  # pragma: no cover

    def _log_retry(self, exc: BaseException | None, delay: float) -> None:
        self._problem = redact(f"{type(exc).__name__}: {exc}")
        log.warning(
            "consumer %s/%s: %s: %s; retrying in %.1fs",
            self.stream,
            self.durable,
            type(exc).__name__,
            exc,
            delay,
        )

    async def _fetch(self, size: int) -> list[Any]:
        if self._puller is None or self._generation != self._bus.reconnects:
            await self._bind()
            if self._observer is not None:
                await self._observer.bound(self)
        assert self._puller is not None
        catching_up = self._observer is not None and self._observer.waiting()
        within = self._fetch_timeout if catching_up else max(self._fetch_timeout, IDLE_WAIT)
        try:
            msgs = await self._puller.take(size, within)
        except Exception:
            # A deleted consumer says so on the pull (or nothing answers it): bind, and so
            # create, it again.
            await self._unbind()
            raise
        self._problem = ""
        if not msgs and self._observer is not None:
            await self._observer.idle(self)
        return msgs

    async def _bind(self) -> None:
        await self._unbind()
        generation = self._bus.reconnects
        # Create-or-update every time: after a restart with a lost store the durable is gone,
        # and so may be its stream (the bus creates that again from its spec).
        await self._bus.ensure_consumer(self.stream, self._config)
        puller = Puller(
            self._bus.nc,
            api_prefix=JS_API_PREFIX,
            stream=self.stream,
            durable=self.durable,
            expires=max(self._fetch_timeout, PULL_EXPIRES),
        )
        await puller.start()
        self._puller = puller
        self._generation = generation
        self._bound = True

    # -------------------------------------------------------------- one message

    async def _process(self, msg: Any) -> Outcome | None:
        self._m_consumed.inc()
        try:
            md = msg.metadata
        except Exception:  # not a JetStream message; nothing to ack
            log.error(
                "consumer %s/%s got a non-JetStream message on %s", self.stream, self.durable, msg.subject
            )
            return None
        headers: Mapping[str, str] = msg.headers or {}
        if MARKER_REASON_HEADER in headers:
            # Written by the server itself (a subject delete marker): it carries no message of
            # ours, and its subject's last message already told the handler what it needed.
            if await self._settle(msg.ack(), "ack"):
                self._m_acked.inc()
            return Outcome.DONE
        try:
            message = decode(self._cls, msg.data, headers)
        except InvalidMessage as exc:
            reason = DL_UNSUPPORTED_VERSION if isinstance(exc, UnsupportedSchemaVersion) else DL_INVALID
            return await self._give_up(msg, md, reason, str(exc))
        # Extracting and starting a span costs about as much as decoding; skip both when
        # nothing records spans and no trace came with the message (propagation needs neither).
        traced = self._spans and (TRACEPARENT_HEADER in headers or self._bus.tracing)
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
            return await self._handle(msg, md, message, delivery, INVALID_SPAN)
        # OpenTelemetry's messaging semantic conventions (a consumer span per message handled).
        attributes = {
            "messaging.system": "nats",
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.message.body.size": len(msg.data or b""),
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
            return await self._handle(msg, md, message, delivery, span)

    async def _handle(self, msg: Any, md: Any, message: M, delivery: Delivery, span: Span) -> Outcome:
        """Run the handler and settle the message by its outcome (ack, nak or give up)."""
        exhausted = self._max_deliver > 0 and delivery.num_delivered >= self._max_deliver
        started = time.perf_counter()
        try:
            await self._handler(message, delivery)
        except TransientError as exc:
            self._m_seconds.observe(time.perf_counter() - started)
            span.set_attribute("respawn.retry_delay_s", exc.delay)
            if exhausted:
                return await self._give_up(msg, md, DL_MAX_DELIVERIES, f"transient: {exc}")
            log.info("%s seq %d: retry in %.1fs: %s", msg.subject, delivery.stream_seq, exc.delay, exc)
            await self._nak(msg, exc.delay, "transient")
            return Outcome.RETRY
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
            error = f"{type(exc).__name__}: {exc}"
            if exhausted:
                self._errors.pop(delivery.stream_seq, None)
                return await self._give_up(msg, md, DL_MAX_DELIVERIES, error)
            errors = self._count_error(delivery.stream_seq)
            if self._max_errors is not None and errors >= self._max_errors:
                self._errors.pop(delivery.stream_seq, None)
                return await self._give_up(msg, md, DL_MAX_ERRORS, f"{error} (error {errors})")
            await self._nak(msg, error_delay(errors or delivery.num_delivered), "error")
            return Outcome.RETRY
        self._m_seconds.observe(time.perf_counter() - started)
        if self._errors:
            self._errors.pop(delivery.stream_seq, None)
        if await self._settle(msg.ack(), "ack"):
            self._m_acked.inc()
        # Handled even if the ack was lost: the handler's work is done, a redelivery repeats it.
        return Outcome.DONE

    def _count_error(self, stream_seq: int) -> int:
        """This message's handler errors so far, with this one (0 without ``max_errors``).

        Counted in memory by this replica: a restart, or another replica taking the message,
        starts again from zero, so the budget is per replica run; still finite. Deliveries
        cannot be used: a consumer with max_errors redelivers on purpose (TransientError)
        as often as it needs.
        """
        if self._max_errors is None:
            return 0
        count = self._errors.pop(stream_seq, 0) + 1
        self._errors[stream_seq] = count
        while len(self._errors) > _ERROR_COUNTS_KEPT:
            self._errors.popitem(last=False)
        return count

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

    def _tell(self, level: int, doing: str, msg: Any, md: Any, reason: str, error: str) -> None:
        log.log(
            level,
            "consumer %s/%s: %s %s seq %d (%s): %s",
            self.stream,
            self.durable,
            doing,
            msg.subject,
            md.sequence.stream,
            reason,
            error,
        )

    async def _give_up(self, msg: Any, md: Any, reason: str, error: str) -> Outcome:
        """Stop delivering a message that can never be processed: dead-letter it, or (for a
        consumer that only reads stored state, see :meth:`shared.bus.Bus.replay`) drop it."""
        if self._dead_letters:
            return await self._dead_letter(msg, md, reason, error)
        self._tell(logging.WARNING, "skipping", msg, md, reason, error)
        if await self._settle(msg.term(), "term"):
            metrics.BUS_MESSAGES_TERMINATED.labels(**self._labels, reason=reason).inc()
        return Outcome.DONE

    async def _dead_letter(self, msg: Any, md: Any, reason: str, error: str) -> Outcome:
        """Copy the raw message to the dead-letter subject, then terminate it.

        The copy is published first: if that fails the message is nak'ed, not lost.
        """
        self._tell(logging.ERROR, "dead-lettering", msg, md, reason, error)
        headers = dead_letter_headers(
            msg.headers or {},
            service=self._bus.service,
            reason=reason,
            error=error,
            subject=msg.subject,
            stream=md.stream,
            sequence=int(md.sequence.stream),
            consumer=md.consumer,
            deliveries=int(md.num_delivered),
        )
        headers, payload = fit(headers, bytes(msg.data), self._bus.max_payload)
        try:
            await self._bus._send(subjects.dead_letter(self._bus.service), payload, headers, retry_for=5.0)
        except PermanentPublishError as exc:
            # The copy can never be written (e.g. the service may not publish dead letters):
            # keeping the original in redelivery would loop on it forever. It stays stored in
            # its stream; only this consumer stops trying it.
            log.error(
                "dead-lettering %s seq %s is impossible (%s); terminating it without a copy",
                msg.subject,
                md.sequence.stream,
                exc,
            )
            if await self._settle(msg.term(), "term"):
                metrics.BUS_MESSAGES_TERMINATED.labels(**self._labels, reason=reason).inc()
            return Outcome.DONE
        except Exception as exc:
            log.error(
                "dead-lettering %s seq %s failed (%s); will retry", msg.subject, md.sequence.stream, exc
            )
            await self._nak(msg, error_delay(int(md.num_delivered)), "dead-letter-failed")
            return Outcome.RETRY
        metrics.BUS_DEAD_LETTERED.labels(**self._labels, reason=reason).inc()
        if await self._settle(msg.term(), "term"):
            metrics.BUS_MESSAGES_TERMINATED.labels(**self._labels, reason=reason).inc()
        return Outcome.DONE
