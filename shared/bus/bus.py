"""The :class:`Bus`: one service's connection to NATS JetStream, and everything it does on it."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import msgpack
from nats.js import api
from opentelemetry import trace
from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider, TracerProvider

from shared import metrics, subjects
from shared.bus.connection import ConnectionState, TlsFiles, connect_options, open_connection, redact
from shared.bus.consume import (
    Consumer,
    DeliverPolicy,
    StreamMissing,
    consumer_config,
    delete_consumer,
    ensure_consumer,
)
from shared.bus.deadletter import (
    DL_OBJECT_KIND_HEADER,
    DL_OBJECT_NAME_HEADER,
    DL_OBJECT_NAMESPACE_HEADER,
    DL_OBJECT_RESOURCE_VERSION_HEADER,
    DL_OBJECT_UID_HEADER,
    fit,
    unpublished_headers,
)
from shared.bus.delivery import Handler, M
from shared.bus.errors import BusError
from shared.bus.publish import Published, publish, send
from shared.bus.pull import JS_API_PREFIX
from shared.bus.replay import CaughtUp, Replay, start_replay
from shared.bus.streams import (
    UNAVAILABLE,
    UNAVAILABLE_FOR,
    StreamLimits,
    StreamSpec,
    default_streams,
    ensure_stream,
    sequences,
    stream_for,
    wait_out_unavailable,
)
from shared.messages import ENCODINGS, Encoding, Message

log = logging.getLogger(__name__)

# How long deleting a consumer may take; past it the server's inactivity timeout removes it.
_DELETE_TIMEOUT = 2.0
# How often the consumer lag gauges are refreshed (docs/metrics.md), and how long one consumer's
# info may take: a server that does not answer leaves the last value in place.
CONSUMER_LAG_PERIOD = 10.0
_LAG_TIMEOUT = 2.0


class Bus:
    """A connection to NATS JetStream for one service (see :mod:`shared.bus`)."""

    def __init__(
        self,
        nc: Any,
        *,
        service: str,
        replicas: int,
        duplicate_window: float,
        tracer_provider: TracerProvider | None,
        state: ConnectionState,
        stream_limits: Mapping[str, StreamLimits] | None = None,
        public_encoding: Encoding = "json",
    ) -> None:
        if public_encoding not in ENCODINGS:
            raise ValueError(
                f"public_encoding must be one of {', '.join(ENCODINGS)}, got {public_encoding!r}"
            )
        self._nc = nc
        # How the public messages (verdicts, lifecycle events) are encoded; the rest is msgpack.
        self.public_encoding: Encoding = public_encoding
        self._js = nc.jetstream(prefix=JS_API_PREFIX)
        self.service = service
        self.replicas = replicas
        self.duplicate_window = duplicate_window
        self.tracer = trace.get_tracer("respawn.bus", tracer_provider=tracer_provider)
        self._own_provider = tracer_provider is not None
        self._state = state
        state.on_reconnect.append(self._wake_consumers)
        self._consumers: list[Consumer[Any]] = []
        self._replays: list[Replay[Any]] = []
        self._stream_limits = dict(stream_limits or {})
        # The streams this bus sets up (and creates again should the server lose them), by name:
        # Respawn's own with the configured limits, and any other this bus was asked to ensure.
        self._streams: dict[str, StreamSpec] = {s.name: s for s in default_streams(self._stream_limits)}
        self._lag_task: asyncio.Task[None] | None = None
        self._lag_series: set[tuple[str, str, str]] = set()

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
        nkey_seed_file: str | Path | None = None,
        tls: TlsFiles | None = None,
        stream_limits: Mapping[str, StreamLimits] | None = None,
        public_encoding: Encoding = "json",
    ) -> Bus:
        """Connect as service ``name``; reconnects forever once connected.

        The first connection is retried (with backoff) for ``connect_deadline`` seconds
        (None: forever), then :class:`~shared.bus.BusError` names the server (never its
        credentials) and the last error. Credentials: ``user``/``password``, a ``token``, a JWT
        ``creds`` file or an ``nkey_seed_file`` (both need the ``nkeys`` package). ``tls``
        verifies the server against a CA and may present a client certificate; with it, a
        server that does not require TLS is refused. ``replicas``, ``duplicate_window`` and
        ``stream_limits`` (by stream name, docs/configuration.md ``nats.streams``) apply to the
        streams this bus creates. ``public_encoding`` (docs/configuration.md
        ``nats.publicEncoding``) is how :meth:`publish` encodes the public messages.
        """
        if replicas < 1:
            raise ValueError(f"replicas must be at least 1, got {replicas}")
        state = ConnectionState(service=name)
        options = connect_options(
            [url] if isinstance(url, str) else list(url),
            name=name,
            state=state,
            user=user,
            password=password,
            token=token,
            creds=creds,
            nkey_seed_file=nkey_seed_file,
            tls=tls,
            inbox_prefix=inbox_prefix,
            reconnect_wait_max=reconnect_wait_max,
        )
        nc = await open_connection(options, state=state, tls=tls, connect_deadline=connect_deadline)
        return cls(
            nc,
            service=name,
            replicas=replicas,
            duplicate_window=duplicate_window,
            tracer_provider=tracer_provider,
            state=state,
            stream_limits=stream_limits,
            public_encoding=public_encoding,
        )

    # -------------------------------------------------------------- state

    @property
    def nc(self) -> Any:
        """The underlying nats-py client, for tools and tests (services use the methods below)."""
        return self._nc

    @property
    def js(self) -> Any:
        """The underlying JetStream context, for tools and tests (services use the methods below)."""
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
    def max_payload(self) -> int:
        """The largest message (headers and payload) the server takes, from its INFO."""
        return int(self._nc.max_payload)

    @property
    def reconnects(self) -> int:
        """How many times the connection was re-established (consumers re-bind on change)."""
        return self._state.reconnects

    @property
    def consumers(self) -> tuple[Consumer[Any], ...]:
        return tuple(self._consumers)

    def _wake_consumers(self) -> None:
        # An idle consumer waits for a message for up to IDLE_WAIT: after a reconnect it must
        # bind again now (the server may have lost its pull request, or its consumer).
        for consumer in self._consumers:
            consumer.wake()

    def _forget(self, consumer: Consumer[Any]) -> None:
        with contextlib.suppress(ValueError):
            self._consumers.remove(consumer)

    def _adopt(self, replay: Replay[Any], consumer: Consumer[Any]) -> None:
        self._replays.append(replay)
        self._consumers.append(consumer)

    def _forget_replay(self, replay: Replay[Any]) -> None:
        with contextlib.suppress(ValueError):
            self._replays.remove(replay)

    def ready(self) -> bool:
        """Connected and every consumer started by this bus is bound and running."""
        return self.connected and all(c.running for c in self._consumers)

    def problems(self) -> list[str]:
        """Why the bus is not :meth:`ready`, one line each (empty when it is): for readiness
        output and logs, e.g. ``consumer RESPAWN_VERDICTS/lifecycle-verdicts: BusError: cannot create
        stream RESPAWN_VERDICTS: ...``."""
        found = (
            [] if self.connected else [f"not connected to NATS ({self._state.last_error or 'reconnecting'})"]
        )
        for consumer in self._consumers:
            problem = consumer.problem
            if problem:
                found.append(f"consumer {consumer.stream}/{consumer.durable}: {redact(problem)}")
        return found

    # -------------------------------------------------------------- consumer lag

    def watch_lag(self, period: float = CONSUMER_LAG_PERIOD) -> None:
        """Refresh ``respawn_bus_consumer_pending`` and ``respawn_bus_consumer_ack_pending`` for
        every consumer of this bus every ``period`` seconds, until :meth:`close`."""
        if self._lag_task is None or self._lag_task.done():
            self._lag_task = asyncio.create_task(self._watch_lag(period), name=f"{self.service}-lag")

    async def _watch_lag(self, period: float) -> None:
        while True:
            try:
                await self.refresh_lag()
            except Exception:  # a bug here must not stop the refresh for good
                log.exception("refreshing the consumer lag failed")
            await asyncio.sleep(period)

    async def refresh_lag(self) -> None:
        """Ask the server how far behind each consumer of this bus is, and set the gauges.

        A consumer whose info cannot be read now (disconnected, server busy) keeps its last
        value; the series of a consumer this bus no longer runs is removed, so a replay or a
        partition let go of leaves no stale lag behind.
        """
        current: set[tuple[str, str, str]] = set()
        for consumer in list(self._consumers):
            labels = (self.service, consumer.stream, consumer.durable)
            current.add(labels)
            if not self.connected:
                continue
            try:
                pending, ack_pending = await asyncio.wait_for(consumer.pending(), _LAG_TIMEOUT)
            except Exception as exc:
                log.debug("consumer info of %s/%s: %s", consumer.stream, consumer.durable, redact(str(exc)))
                continue
            metrics.CONSUMER_PENDING.labels(*labels).set(pending)
            metrics.CONSUMER_ACK_PENDING.labels(*labels).set(ack_pending)
        for labels in self._lag_series - current:
            for gauge in (metrics.CONSUMER_PENDING, metrics.CONSUMER_ACK_PENDING):
                with contextlib.suppress(KeyError):
                    gauge.remove(*labels)
        self._lag_series = current

    async def close(self) -> None:
        """Stop every replay (deleting its consumer) and consumer, flush, and close the
        connection. Safe to call twice."""
        lag, self._lag_task = self._lag_task, None
        if lag is not None:
            lag.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await lag
        for labels in self._lag_series:
            for gauge in (metrics.CONSUMER_PENDING, metrics.CONSUMER_ACK_PENDING):
                with contextlib.suppress(KeyError):
                    gauge.remove(*labels)
        self._lag_series = set()
        for replay in list(self._replays):
            await replay.stop()
        for consumer in list(self._consumers):
            await consumer.stop()
        self._consumers.clear()
        self._state.closing = True
        if not self._nc.is_closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._nc.flush(), 2.0)
            await self._nc.close()

    # -------------------------------------------------------------- set-up

    async def ensure_streams(
        self, specs: Sequence[StreamSpec] | None = None, *, unavailable_for: float = UNAVAILABLE_FOR
    ) -> None:
        """Create or reconcile Respawn's streams (all of :func:`default_streams`, with this bus's
        ``stream_limits``, by default).

        JetStream without a metadata leader (a NATS cluster that lost its quorum, or one still
        electing after a restart) answers 503 or not at all: that is waited out for up to
        ``unavailable_for`` seconds, then a :class:`BusError` says so, so that a service exits
        with one clear line instead of a traceback.
        """
        for spec in specs if specs is not None else default_streams(self._stream_limits):
            try:
                await wait_out_unavailable(
                    f"setting up stream {spec.name}",
                    functools.partial(self.ensure_stream, spec),
                    unavailable_for,
                )
            except UNAVAILABLE as exc:
                raise BusError(
                    f"JetStream is unavailable (no metadata leader: a NATS cluster without quorum?) "
                    f"and stream {spec.name} could not be set up within {unavailable_for:.0f}s: "
                    f"{getattr(exc, 'description', None) or type(exc).__name__}"
                ) from exc

    async def ensure_stream(self, spec: StreamSpec) -> None:
        """Create the stream, or update it where it differs; never fails on a refused update, and
        never loosens a limit an operator made stricter (see :mod:`shared.bus.streams`)."""
        self._streams[spec.name] = spec
        await ensure_stream(
            self._js,
            spec,
            replicas=self.replicas,
            duplicate_window=self.duplicate_window,
            may_update=self.may_update(spec),
        )

    def may_update(self, spec: StreamSpec) -> bool:
        """Whether this bus brings ``spec``'s stream up to date: it is the stream's owner, or no
        Respawn service at all (a tool or a test, which the NATS permissions govern alone)."""
        services = {s.owner for s in default_streams()}
        return not spec.owner or self.service == spec.owner or self.service not in services

    async def ensure_consumer(self, stream: str, config: api.ConsumerConfig) -> None:
        """Create the durable consumer or update it in place; a refused update is logged.

        A stream that is gone (the server lost its store) is created again from its spec first.
        """
        try:
            await ensure_consumer(self._js, stream, config)
        except StreamMissing:
            await self.restore_stream(stream)
            await ensure_consumer(self._js, stream, config)

    async def delete_consumer(self, stream: str, durable: str) -> None:
        """Delete this service's consumer ``durable`` of ``stream``; one already gone is fine.

        For a consumer whose replay never started (its start was cancelled after the server had
        created it): a started replay deletes its own (:meth:`Replay.stop`). A failure is only
        logged: the server removes the consumer once it has been inactive for long enough.
        """
        try:
            await asyncio.wait_for(delete_consumer(self._js, stream, durable), _DELETE_TIMEOUT)
        except Exception as exc:
            log.info(
                "could not delete consumer %s/%s (%s: %s); the server removes it once inactive",
                stream,
                durable,
                type(exc).__name__,
                exc,
            )

    async def restore_stream(self, stream: str) -> None:
        """Create ``stream`` again from the spec this bus knows for it (:class:`BusError` if it
        knows none, or NATS refuses)."""
        spec = self._streams.get(stream)
        if spec is None:
            raise BusError(f"stream {stream} does not exist and this service has no specification for it")
        log.warning("stream %s is missing (did the NATS server lose its store?); creating it again", stream)
        await self.ensure_stream(spec)

    async def _restore_for(self, subject: str) -> bool:
        spec = stream_for(subject, self._streams.values())
        if spec is None:
            return False
        await self.ensure_stream(spec)
        return True

    async def subjects(
        self, stream: str, subjects_filter: str, *, request_timeout: float = 10.0
    ) -> dict[str, int]:
        """The subjects of ``stream`` that match ``subjects_filter`` and hold messages, with how
        many each holds (``STREAM.INFO`` with a subjects filter, every page of it).

        For reconciling a stream with the world: the watcher compares the observations stored
        with the objects it listed, to publish the deletes it missed. :class:`BusError` when
        the server refuses or does not answer.
        """
        found: dict[str, int] = {}
        while True:
            request = json.dumps({"subjects_filter": subjects_filter, "offset": len(found)}).encode()
            try:
                reply = await self._nc.request(
                    f"$JS.API.STREAM.INFO.{stream}", request, timeout=request_timeout
                )
                info = json.loads(reply.data)
            except Exception as exc:
                raise BusError(f"cannot list the subjects of stream {stream}: {exc!r}") from exc
            if "error" in info:
                raise BusError(f"cannot list the subjects of stream {stream}: {info['error']}")
            page = (info.get("state") or {}).get("subjects") or {}
            before = len(found)
            found.update({str(k): int(v) for k, v in page.items()})
            # The server pages a long subject list (total/offset/limit); an empty or repeated
            # page ends it too, so a server that does not page cannot loop this.
            if len(found) >= int(info.get("total") or 0) or len(found) == before:
                return found

    async def sequences(self, stream: str) -> tuple[int, int]:
        """``stream``'s first and last sequence (``STREAM.INFO``): a message published with a
        sequence below the first is no longer stored. :class:`BusError` when the server refuses
        or does not answer."""
        try:
            return await sequences(self._js, stream)
        except Exception as exc:
            raise BusError(f"cannot read the state of stream {stream}: {exc!r}") from exc

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
        ttl: float | None = None,
    ) -> Published:
        """Publish ``message`` and wait for JetStream to store it.

        ``msg_id`` de-duplicates within the stream's duplicate window: derive it from what
        the message is about (e.g. uid + resourceVersion) so a republished observation is
        absorbed. Without one a random id is used, which still makes this method's own
        retries (for up to ``retry_for`` seconds, e.g. across a server restart) safe.

        ``ttl`` (seconds, at least 1; nats-server 2.11+, on a stream that allows per-message
        TTLs such as ``RESPAWN_OBSERVATIONS``): the server removes the message that long after
        storing it. Give it to tombstones, so a deleted object's subject goes away.

        A public message (``message.PUBLIC``) is encoded as :attr:`public_encoding` says, with
        the headers that tell how (``content-type``, and the CloudEvents ``ce-*``); any other is
        msgpack.

        :class:`~shared.bus.PermanentPublishError` (with a ``reason``) at once when this message
        can never be published: larger than the server's ``max_payload``, an invalid subject, a
        permission violation, or refused for good by JetStream. Dead-letter what it was about
        (:meth:`dead_letter`) and go on. Other failures are retried for ``retry_for`` seconds,
        then raised as they are.
        """
        return await publish(
            self._js,
            self.tracer,
            service=self.service,
            subject=subject,
            message=message,
            msg_id=msg_id,
            headers=headers,
            ack_timeout=ack_timeout,
            retry_for=retry_for,
            ttl=ttl,
            max_payload=self.max_payload,
            state=self._state,
            restore_stream=self._restore_for,
            encoding=self.public_encoding if message.PUBLIC else "msgpack",
        )

    async def _send(
        self, subject: str, payload: bytes, headers: dict[str, str], *, retry_for: float
    ) -> Published:
        """Publish raw bytes (a dead letter) with the retries and checks of :meth:`publish`."""
        ack = await send(
            self._js,
            subject,
            payload,
            headers,
            ack_timeout=5.0,
            retry_for=retry_for,
            state=self._state,
            restore_stream=self._restore_for,
        )
        return Published(stream=ack.stream, seq=int(ack.seq), duplicate=bool(ack.duplicate))

    async def dead_letter(
        self,
        subject: str,
        payload: bytes | Message | Mapping[str, Any],
        *,
        reason: str,
        error: str | BaseException,
        kind: str = "",
        namespace: str = "",
        name: str = "",
        uid: str = "",
        resource_version: str = "",
        headers: Mapping[str, str] | None = None,
        msg_id: str | None = None,
        retry_for: float = 30.0,
    ) -> Published:
        """Dead-letter something that never became a stored message: an object that could not
        be published (e.g. a :class:`~shared.bus.PermanentPublishError`), or one a service
        cannot turn into a message at all.

        Written to ``respawn.deadletter.<service>`` (stream ``RESPAWN_DEAD_LETTER``) with the
        headers of a consumer's dead letters (docs/messages.md, "Dead letters"): ``reason``,
        ``error``, ``subject`` as the original subject and its stream, sequence ``0``, no
        consumer, ``0`` deliveries, plus the object's identity (``kind``, ``namespace``,
        ``name``, ``uid``, ``resource_version``) and any other ``headers``. ``payload`` is
        what is worth keeping: the message, or a summary of the object (a mapping is packed as
        msgpack). The dead letter is cut to fit in one message, so it is never itself too
        large. ``msg_id`` de-duplicates repeats (default: from the subject and payload).

        Counted in ``respawn_bus_dead_lettered_total{service,stream,reason}``. Raises
        :class:`~shared.bus.BusError` (or a subclass) if even the dead letter cannot be written.
        """
        if isinstance(payload, Message):
            data = payload.encode()
        elif isinstance(payload, bytes | bytearray | memoryview):
            data = bytes(payload)
        else:
            data = msgpack.packb(dict(payload), default=str)
        original = stream_for(subject, self._streams.values())
        identity = {
            DL_OBJECT_KIND_HEADER: kind,
            DL_OBJECT_NAMESPACE_HEADER: namespace,
            DL_OBJECT_NAME_HEADER: name,
            DL_OBJECT_UID_HEADER: uid,
            DL_OBJECT_RESOURCE_VERSION_HEADER: resource_version,
        }
        extra = {**(headers or {}), **{k: v for k, v in identity.items() if v}}
        error_text = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else error
        all_headers = unpublished_headers(
            extra,
            service=self.service,
            reason=reason,
            error=redact(error_text),
            subject=subject,
            stream=original.name if original else "",
            payload=data,
            msg_id=msg_id,
        )
        all_headers, data = fit(all_headers, data, self.max_payload)
        published = await self._send(
            subjects.dead_letter(self.service), data, all_headers, retry_for=retry_for
        )
        if not published.duplicate:
            metrics.BUS_DEAD_LETTERED.labels(
                service=self.service, stream=original.name if original else "", reason=reason
            ).inc()
        log.error("dead-lettered %s (%s): %s", subject, reason, redact(error_text))
        return published

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
        deliver_policy: api.DeliverPolicy = DeliverPolicy.ALL,
        inactive_threshold: float | None = None,
        concurrency: int = 1,
        max_errors: int | None = None,
    ) -> Consumer[M]:
        """Create-or-update the durable pull consumer and start its loop.

        Messages are handled one at a time, in order; with ``concurrency`` > 1, messages on
        different subjects are handled concurrently (up to that many at once) and those on one
        subject still one after another, in order. ``handler(message, delivery)``:
        returning acks; raising :class:`~shared.bus.TransientError` naks with its delay; any other
        exception is logged and naked with a growing delay. On the ``max_deliver``-th
        failed delivery, and for undecodable or newer-version messages at once, the raw
        message goes to ``respawn.deadletter.<service>`` and is terminated. A message that
        fails is naked, so the messages behind it (and, with ``concurrency``, other subjects)
        go on meanwhile.

        ``max_errors`` is the poison budget of a consumer whose handler asks for redelivery on
        purpose (:class:`~shared.bus.TransientError`, e.g. a verdict held until it applies) and
        so needs a large ``max_deliver``: a message whose handler *raised an unexpected
        exception* that many times is dead-lettered (reason ``max-errors``) however few of
        its deliveries were retries. The count is kept by the replica handling the message
        (a restart starts it again). None: ``max_deliver`` alone bounds the errors.
        Handlers must be idempotent: an ack can be lost and the message redelivered.
        """
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        if max_errors is not None and max_errors < 1:
            raise ValueError(f"max_errors must be at least 1, got {max_errors}")
        filters = (filter_subjects,) if isinstance(filter_subjects, str) else tuple(filter_subjects)
        if not filters:
            raise ValueError("consume needs at least one filter subject")
        config = consumer_config(
            durable,
            filters,
            deliver_policy=deliver_policy,
            ack_wait=ack_wait,
            max_deliver=max_deliver,
            max_ack_pending=max_ack_pending,
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
            max_errors=max_errors,
        )
        consumer.start()
        self._consumers.append(consumer)
        return consumer

    async def replay(
        self,
        stream: str,
        durable: str,
        filter_subjects: str | Sequence[str],
        message_cls: type[M],
        handler: Handler[M],
        *,
        last_per_subject: bool = False,
        follow: bool = True,
        on_caught_up: CaughtUp | None = None,
        inactive_threshold: float = 300.0,
        batch: int = 128,
        fetch_timeout: float = 1.0,
        max_deliver: int = 10,
        ack_wait: float = 30.0,
        start_time: datetime | None = None,
    ) -> Replay[M]:
        """Load ``stream`` (its messages on ``filter_subjects``: all of them, or only the last per
        subject) into memory through ``handler``, then follow it (see :mod:`shared.bus.replay`).

        ``durable`` names this run's own consumer (:func:`~shared.bus.replay_consumer_name`); a
        consumer of that name left from before is deleted first. With ``follow`` the replay keeps
        delivering until it is stopped, and ``on_caught_up`` runs once it has caught up; without,
        this returns once caught up, the consumer already deleted. With ``start_time``, only
        the messages stored from then on are replayed (a history kept for longer than needed).
        """
        filters = (filter_subjects,) if isinstance(filter_subjects, str) else tuple(filter_subjects)
        return await start_replay(
            self,
            stream=stream,
            durable=durable,
            filter_subjects=filters,
            message_cls=message_cls,
            handler=handler,
            last_per_subject=last_per_subject,
            follow=follow,
            on_caught_up=on_caught_up,
            inactive_threshold=inactive_threshold,
            batch=batch,
            fetch_timeout=fetch_timeout,
            max_deliver=max_deliver,
            ack_wait=ack_wait,
            start_time=start_time,
        )
