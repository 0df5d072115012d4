"""How long the bus waits before trying again, as tenacity wait strategies.

Every delay of the bus comes from here, so there is one shape of backoff (doubling from a first
delay up to a cap, with a little jitter so replicas do not retry in step) instead of a formula
per call site. :func:`delay` evaluates a strategy for one attempt number, for the places that
pass a delay on instead of sleeping (a nak's redelivery delay, nats-py's reconnect handler).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from tenacity import AsyncRetrying, RetryCallState, Retrying, retry_if_exception_type
from tenacity.wait import wait_base, wait_exponential, wait_random

log = logging.getLogger(__name__)


def backoff(first: float, cap: float) -> wait_base:
    """``first`` seconds, doubling per attempt up to ``cap``, plus up to ``first`` of jitter."""
    return wait_exponential(multiplier=first, max=cap) + wait_random(0, first)


def delay(wait: wait_base, attempt: int) -> float:
    """The delay ``wait`` chooses after failed attempt number ``attempt`` (counted from 1)."""
    state = RetryCallState(retry_object=Retrying(), fn=None, args=(), kwargs={})
    state.attempt_number = max(1, attempt)
    return float(wait(state))


def error_delay(num_delivered: int, *, base: float = 0.5, cap: float = 30.0) -> float:
    """Redelivery delay after an unexpected handler error: ``base`` doubling per delivery, capped.

    No jitter: the delay is documented (docs/messages.md, "Delivery and acknowledgement") and
    each message has its own, so there is no herd to spread.
    """
    return delay(wait_exponential(multiplier=base, max=cap), num_delivered)


async def until_done(
    what: str, attempt: Callable[[], Awaitable[None]], *, wait: wait_base | None = None
) -> None:
    """Run ``attempt`` until it returns, logging each failure; only cancellation stops it."""

    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        log.warning(
            "%s failed (%s: %s); retrying in %.1fs", what, type(exc).__name__, exc, state.upcoming_sleep
        )

    async for retry in AsyncRetrying(
        retry=retry_if_exception_type(Exception),
        wait=wait if wait is not None else backoff(0.5, 5.0),
        before_sleep=before_sleep,
        reraise=True,
    ):
        with retry:
            await attempt()
