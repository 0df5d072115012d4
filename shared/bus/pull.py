"""A continuous pull from one durable JetStream consumer: the pattern of the NATS clients'
``Consume()`` APIs, which nats-py does not have.

nats-py's ``fetch`` asks the server for messages on every call: on a consumer that is fed one
message at a time (a pod changed, a verdict came) each message costs a pull request, a
"no messages" probe and a lingering request after it, besides the message and its ack; and an
idle consumer asks again every second. :class:`Puller` keeps one pull request outstanding
(``batch`` messages, expiring after ``expires`` seconds) on an inbox of its own and hands out
what arrives; it asks again only when that request is used up or over. A message then costs its
delivery and its acknowledgement, and an idle consumer one request per ``expires``.

The server ends a request with a status message on the inbox: 408 (expired), 404 (nothing, for
a request that does not wait), 409 (e.g. the consumer's leader moved, too many waiting
requests, the server shutting down; or the consumer was deleted), 503 (no consumer answers).
The first three only mean "ask again"; a deleted or missing consumer raises
:class:`ConsumerGone`, so that the caller binds (and creates) it again. A request the server
lost without a word (it restarted under a connection that came back) is asked again once it
should have expired.

Only one request is outstanding at a time, so the messages come in stream order, as
:class:`~shared.bus.replay.Replay` needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from typing import Any

from nats.js import api

from shared.bus.errors import BusError

__all__ = ["JS_API_PREFIX", "ConsumerGone", "Puller"]

# The JetStream API's subject prefix (no domain): the bus's JetStream context and its pulls use it.
JS_API_PREFIX = "$JS.API"

STATUS_HEADER = api.Header.STATUS
DESCRIPTION_HEADER = api.Header.DESCRIPTION
# How long past its expiry a request may stay silent before it counts as lost (seconds).
LOST_AFTER = 2.0
# How long closing may wait for the subscription to hand over what it holds (seconds).
DRAIN_TIMEOUT = 2.0


class ConsumerGone(BusError):
    """The consumer does not exist (any more): bind, and so create, it again."""


def request_body(batch: int, expires: float) -> bytes:
    """The body of a pull request for ``batch`` messages, expiring after ``expires`` seconds (pure)."""
    return json.dumps({"batch": batch, "expires": int(expires * 1_000_000_000)}).encode()


def ends_request(status: str, description: str) -> bool:
    """Whether a status message ends the outstanding request and it may simply be asked again
    (True), or says the consumer is gone (raises :class:`ConsumerGone`). Heartbeats (100) end
    nothing (False). Pure."""
    if status == api.StatusCode.CONTROL_MESSAGE:  # 100: a heartbeat
        return False
    if status == "503" or (status == "409" and "consumer deleted" in description.lower()):
        raise ConsumerGone(f"the consumer is gone ({status} {description})".rstrip())
    if status == "409" and "push based" in description.lower():
        raise ConsumerGone(f"the consumer cannot be pulled from ({status} {description})")
    return True


class Puller:
    """One outstanding pull request on ``api_prefix.CONSUMER.MSG.NEXT.<stream>.<durable>``."""

    def __init__(self, nc: Any, *, api_prefix: str, stream: str, durable: str, expires: float) -> None:
        self._nc = nc
        self._next_subject = f"{api_prefix}.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self._expires = expires
        self._sub: Any = None
        self._inbox = ""
        self._queue: deque[Any] = deque()
        self._waiter: asyncio.Future[None] | None = None
        # What the outstanding request may still deliver; 0: none is outstanding.
        self._remaining = 0
        self._asked_at = 0.0
        self._interrupted = False

    async def start(self) -> None:
        self._inbox = self._nc.new_inbox()
        self._sub = await self._nc.subscribe(self._inbox, cb=self._arrived)

    async def _arrived(self, msg: Any) -> None:
        self._queue.append(msg)
        _wake(self._waiter)

    async def _ask(self, batch: int) -> None:
        self._remaining = batch
        self._asked_at = time.monotonic()
        await self._nc.publish(self._next_subject, request_body(batch, self._expires), reply=self._inbox)

    def interrupt(self) -> None:
        """Make the :meth:`take` under way (or the next one) return at once, with what has
        arrived: the caller has something to look at (e.g. the connection came back)."""
        self._interrupted = True
        _wake(self._waiter)

    def _lost(self, now: float) -> bool:
        return now - self._asked_at > self._expires + LOST_AFTER

    async def take(self, batch: int, within: float) -> list[Any]:
        """Up to ``batch`` messages: what has arrived, or else the first to arrive within
        ``within`` seconds (none: ``[]``; also at once after :meth:`interrupt`). ``batch`` is
        also the size of a new request, so a caller that can only take a few at a time is not
        sent more."""
        deadline = time.monotonic() + within
        msgs: list[Any] = []
        while True:
            while self._queue and len(msgs) < batch:
                msg = self._queue.popleft()
                headers = msg.headers
                status = headers.get(STATUS_HEADER) if headers else None
                if status is None:
                    self._remaining = max(0, self._remaining - 1)
                    msgs.append(msg)
                elif ends_request(status, headers.get(DESCRIPTION_HEADER, "")):
                    self._remaining = 0
            if msgs or self._interrupted:
                self._interrupted = False
                return msgs
            now = time.monotonic()
            if self._remaining == 0 or self._lost(now):
                await self._ask(batch)
            left = deadline - now
            if left <= 0:
                return msgs
            await self._wait(min(left, self._asked_at + self._expires + LOST_AFTER - now + 0.01))

    async def _wait(self, seconds: float) -> None:
        """Until a message arrives or ``seconds`` pass; a timer and a future, which cost far
        less than ``asyncio.wait_for`` and a task per call."""
        if self._queue:
            return
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        self._waiter = waiter
        timer = loop.call_later(max(0.0, seconds), _wake, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    async def close(self) -> list[Any]:
        """Stop pulling; returns the messages that arrived and were never handed out (the
        caller naks them, so that the next to pull gets them at once, not after ack_wait)."""
        sub, self._sub = self._sub, None
        if sub is not None:
            try:
                # Unsubscribe, then let the subscription hand over what it still holds; bounded,
                # as the connection may be down.
                async with asyncio.timeout(DRAIN_TIMEOUT):
                    await sub.drain()
            except Exception:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
        left: list[Any] = []
        while self._queue:
            msg = self._queue.popleft()
            if not (msg.headers and STATUS_HEADER in msg.headers):
                left.append(msg)
        self._remaining = 0
        return left


def _wake(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)
