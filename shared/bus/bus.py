"""The :class:`Bus`: one service's connection to NATS JetStream, and everything it does on it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from nats.js import api
from opentelemetry import trace
from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider, TracerProvider

from shared.bus.connection import ConnectionState, open_connection
from shared.bus.consume import Consumer, DeliverPolicy, consumer_config, ensure_consumer
from shared.bus.delivery import Handler, M
from shared.bus.publish import Published, publish
from shared.bus.replay import CaughtUp, Replay, start_replay
from shared.bus.streams import StreamSpec, default_streams, ensure_stream
from shared.messages import Message


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
        self._replays: list[Replay[Any]] = []

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
        (None: forever), then :class:`~shared.bus.BusError` names the server and the last error.
        ``replicas`` and ``duplicate_window`` apply to the streams this bus creates.
        """
        if replicas < 1:
            raise ValueError(f"replicas must be at least 1, got {replicas}")
        state = ConnectionState(service=name)
        nc = await open_connection(
            [url] if isinstance(url, str) else list(url),
            name=name,
            state=state,
            user=user,
            password=password,
            token=token,
            creds=creds,
            inbox_prefix=inbox_prefix,
            connect_deadline=connect_deadline,
            reconnect_wait_max=reconnect_wait_max,
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
    def reconnects(self) -> int:
        """How many times the connection was re-established (consumers re-bind on change)."""
        return self._state.reconnects

    @property
    def consumers(self) -> tuple[Consumer[Any], ...]:
        return tuple(self._consumers)

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

    async def close(self) -> None:
        """Stop every replay (deleting its consumer) and consumer, flush, and close the
        connection. Safe to call twice."""
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

    async def ensure_streams(self, specs: Sequence[StreamSpec] | None = None) -> None:
        """Create or reconcile Respawn's streams (all of :func:`default_streams` by default)."""
        for spec in specs if specs is not None else default_streams():
            await self.ensure_stream(spec)

    async def ensure_stream(self, spec: StreamSpec) -> None:
        """Create the stream, or update it where it differs; never fails on a refused update."""
        await ensure_stream(self._js, spec, replicas=self.replicas, duplicate_window=self.duplicate_window)

    async def ensure_consumer(self, stream: str, config: api.ConsumerConfig) -> None:
        """Create the durable consumer or update it in place; a refused update is logged."""
        await ensure_consumer(self._js, stream, config)

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
        )

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
    ) -> Consumer[M]:
        """Create-or-update the durable pull consumer and start its loop.

        Messages are handled one at a time, in order; with ``concurrency`` > 1, messages on
        different subjects are handled concurrently (up to that many at once) and those on one
        subject still one after another, in order. ``handler(message, delivery)``:
        returning acks; raising :class:`~shared.bus.TransientError` naks with its delay; any other
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
    ) -> Replay[M]:
        """Load ``stream`` (its messages on ``filter_subjects``: all of them, or only the last per
        subject) into memory through ``handler``, then follow it (see :mod:`shared.bus.replay`).

        ``durable`` names this run's own consumer (:func:`~shared.bus.replay_consumer_name`); a
        consumer of that name left from before is deleted first. With ``follow`` the replay keeps
        delivering until it is stopped, and ``on_caught_up`` runs once it has caught up; without,
        this returns once caught up, the consumer already deleted.
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
        )
