"""Replaying a stream into memory, then following it: the one way a service loads state from the bus.

A replay is a durable pull consumer of its own, newly created for one run of one replica
(:func:`replay_consumer_name`), that delivers the stream (or a filtered subject set; every
message, or only the last one per subject) to a handler that folds it into memory, then goes on
delivering what arrives. The handler and the consumer loop are those of :meth:`Bus.consume
<shared.bus.Bus.consume>`: acks, retries, dead letters, re-binding after a reconnect.

When the replay has *caught up*, ``on_caught_up`` runs (retried until it succeeds) and
:meth:`Replay.wait_caught_up` returns. Caught up means: every message that was in the stream
when the replay began has been settled — handled, or given up on — and nothing handed back for a
retry is still outstanding. It is decided from what the server reports, never from a quiet
period (:class:`ReplayProgress`):

- the stream's last sequence is taken before the consumer is created (the *mark*); a delivery
  at or past the mark, or one the server delivered with nothing pending behind it, ends the
  replay once settled. Messages published during the replay therefore cannot hold it open;
- an empty stream (or subject set), a last message that was dead-lettered, or one that vanished
  while waiting for a retry never produce such a delivery, so whenever the loop (re)binds or a
  fetch comes back empty, the consumer's own counts are asked: nothing pending and nothing
  unacknowledged ends the replay too;
- a consumer deleted during the replay (or lost with a server's store) is created again by the
  loop and delivers from the beginning again; a server restart that keeps the consumer resumes
  it. Either way the handler may see a message twice, so it must be idempotent (folding the
  latest state is);
- ``on_caught_up`` runs in the consumer's own task, between two handler calls, exactly once.

The consumer is deleted when the replay stops (:meth:`Replay.stop`, :meth:`Bus.close
<shared.bus.Bus.close>`); should the process die first, the server removes it after
``inactive_threshold``. A replay with ``follow=False`` is a read of stored state: it stops (and
deletes its consumer) as soon as it caught up, and neither dead-letters nor traces what it
reads, because those messages belong to their real consumers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic

from shared.bus.backoff import until_done
from shared.bus.consume import (
    Consumer,
    DeliverPolicy,
    Outcome,
    consumer_config,
    delete_consumer,
    stream_missing,
)
from shared.bus.delivery import Handler, M
from shared.bus.errors import BusError
from shared.bus.streams import last_sequence

if TYPE_CHECKING:
    from shared.bus.bus import Bus

log = logging.getLogger(__name__)

CaughtUp = Callable[[], Awaitable[None]]

# How long deleting the consumer may take when a replay stops; past it the server's inactivity
# timeout removes the consumer instead.
_DELETE_TIMEOUT = 2.0


def replay_consumer_name(service: str, instance: str | None = None) -> str:
    """A durable name for one run of one replica that replays a stream into memory.

    Unique on every start (reusing a durable would resume after the last ack instead of
    replaying, while the previous run's in-memory state is gone) and valid in NATS (no dots or
    wildcards, which host names may contain). The server removes it once the run is gone (see
    ``inactive_threshold`` of :meth:`shared.bus.Bus.replay`).
    """
    raw = instance or os.environ.get("RESPAWN_INSTANCE") or f"{socket.gethostname()}-{os.getpid()}"
    safe = re.sub(r"[^A-Za-z0-9_-]+", "-", raw).strip("-")[:64] or "replica"
    return f"{service}-{safe}-{uuid.uuid4().hex[:8]}"


@dataclass
class ReplayProgress:
    """Whether a replay has caught up, from what the consumer loop reports (pure, no I/O).

    ``mark`` is the stream's last sequence when the replay began (0: it was empty).
    """

    mark: int
    reached: int = 0  # highest stream sequence settled so far
    retrying: set[int] = field(default_factory=set)  # handed back for a retry, not settled since
    caught_up: bool = False

    def settled(self, stream_seq: int, num_pending: int, outcome: Outcome) -> bool:
        """A delivery was settled; True if the replay has just caught up."""
        if self.caught_up:
            return False
        if outcome is Outcome.RETRY:
            self.retrying.add(stream_seq)
            return False
        self.retrying.discard(stream_seq)
        self.reached = max(self.reached, stream_seq)
        # Messages are handled one at a time in stream order, so settling the mark (or a message
        # with nothing behind it) means everything before it was settled too, except retries.
        if not self.retrying and (num_pending == 0 or self.reached >= self.mark):
            self.caught_up = True
        return self.caught_up

    def drained(self, num_pending: int, num_ack_pending: int) -> bool:
        """The consumer reported its counts; True if the replay has just caught up."""
        if self.caught_up:
            return False
        if num_pending == 0 and num_ack_pending == 0:
            # Nothing left to deliver and nothing unacknowledged: a retry still on the list was
            # of a message the stream no longer holds.
            self.retrying.clear()
            self.caught_up = True
        return self.caught_up


class Replay(Generic[M]):
    """A running replay (see the module docstring); made by :meth:`shared.bus.Bus.replay`."""

    def __init__(
        self, bus: Bus, *, stream: str, durable: str, mark: int, on_caught_up: CaughtUp | None
    ) -> None:
        self._bus = bus
        self.stream = stream
        self.durable = durable
        self._progress = ReplayProgress(mark=mark)
        self._on_caught_up = on_caught_up
        self._done = asyncio.Event()
        self._consumer: Consumer[M] | None = None

    @property
    def consumer(self) -> Consumer[M]:
        if self._consumer is None:
            raise RuntimeError("the replay has not started")
        return self._consumer

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The consumer loop (runs until the replay stops)."""
        return self._consumer.task if self._consumer is not None else None

    @property
    def caught_up(self) -> bool:
        """The replay has caught up and ``on_caught_up`` has returned."""
        return self._done.is_set()

    async def wait_caught_up(self) -> None:
        """Return once caught up; :class:`BusError` if the replay stopped before that."""
        task = self.task
        if task is None:
            raise RuntimeError("the replay has not started")
        done = asyncio.ensure_future(self._done.wait())
        try:
            await asyncio.wait({done, task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            done.cancel()
        if not self._done.is_set():
            raise BusError(f"the replay of {self.stream} ({self.durable}) stopped before it caught up")

    async def stop(self, *, grace: float = 10.0) -> None:
        """Stop the consumer loop and delete the consumer. Safe to call twice."""
        self._bus._forget_replay(self)
        if self._consumer is not None:
            await self._consumer.stop(grace=grace)
        try:
            await asyncio.wait_for(delete_consumer(self._bus.js, self.stream, self.durable), _DELETE_TIMEOUT)
        except Exception as exc:
            log.info(
                "could not delete consumer %s/%s (%s: %s); the server removes it once inactive",
                self.stream,
                self.durable,
                type(exc).__name__,
                exc,
            )

    def _attach(self, consumer: Consumer[M]) -> None:
        self._consumer = consumer

    # -------------------------------------------------------------- told by the consumer loop

    async def bound(self, consumer: Consumer[Any]) -> None:
        await self._ask(consumer)

    async def idle(self, consumer: Consumer[Any]) -> None:
        await self._ask(consumer)

    def waiting(self) -> bool:
        return not self._progress.caught_up

    async def settled(
        self, consumer: Consumer[Any], stream_seq: int, num_pending: int, outcome: Outcome
    ) -> None:
        if self._progress.settled(stream_seq, num_pending, outcome):
            await self._finish()

    async def _ask(self, consumer: Consumer[Any]) -> None:
        if self._progress.caught_up:
            return
        try:
            num_pending, num_ack_pending = await consumer.pending()
        except Exception as exc:  # asked again at the next bind or empty fetch
            log.info(
                "replay of %s: reading the consumer's counts failed (%s: %s)",
                self.stream,
                type(exc).__name__,
                exc,
            )
            return
        if self._progress.drained(num_pending, num_ack_pending):
            await self._finish()

    async def _finish(self) -> None:
        log.info("replayed %s (%s)", self.stream, self.durable)
        if self._on_caught_up is not None:
            await until_done(f"catching up after the replay of {self.stream}", self._on_caught_up)
        self._done.set()


async def start_replay(
    bus: Bus,
    *,
    stream: str,
    durable: str,
    filter_subjects: Sequence[str],
    message_cls: type[M],
    handler: Handler[M],
    last_per_subject: bool,
    follow: bool,
    on_caught_up: CaughtUp | None,
    inactive_threshold: float,
    batch: int,
    fetch_timeout: float,
    max_deliver: int,
    ack_wait: float,
    start_time: datetime | None = None,
) -> Replay[M]:
    """See :meth:`shared.bus.Bus.replay`."""
    config = consumer_config(
        durable,
        filter_subjects,
        deliver_policy=DeliverPolicy.LAST_PER_SUBJECT if last_per_subject else DeliverPolicy.ALL,
        ack_wait=ack_wait,
        max_deliver=max_deliver,
        max_ack_pending=1024,
        inactive_threshold=inactive_threshold,
        start_time=start_time,
    )
    # A replay starts from the beginning: a consumer left under this name would resume after
    # its last ack.
    await delete_consumer(bus.js, stream, durable)
    # Taken before the consumer exists, so every message up to the mark is in its view.
    try:
        mark = await last_sequence(bus.js, stream)
    except Exception as exc:
        if not stream_missing(exc):
            raise
        # Lost with the server's store: an empty stream again, with nothing to replay.
        await bus.restore_stream(stream)
        mark = 0
    await bus.ensure_consumer(stream, config)
    replay: Replay[M] = Replay(bus, stream=stream, durable=durable, mark=mark, on_caught_up=on_caught_up)
    consumer = Consumer(
        bus,
        stream=stream,
        durable=durable,
        filter_subjects=tuple(filter_subjects),
        message_cls=message_cls,
        handler=handler,
        batch=batch,
        fetch_timeout=fetch_timeout,
        max_deliver=max_deliver,
        consumer_config=config,
        observer=replay,
        dead_letters=follow,
        spans=follow,
    )
    replay._attach(consumer)
    bus._adopt(replay, consumer)
    consumer.start()
    if not follow:
        try:
            await replay.wait_caught_up()
        finally:
            await replay.stop()
    return replay
