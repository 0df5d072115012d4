"""Polling with a deadline: the one way the tools, benchmarks and tests wait (never sleep-and-hope).

:func:`until` calls ``check`` every ``every`` seconds until ``done`` holds for what it returned
(by default: until it returns something truthy), and returns that value; after ``within`` seconds
it fails, naming what it waited for and the last value seen. :func:`holds` is the other half:
``check`` must keep holding for a while (nothing happens that should not). ``check`` may be a
plain function or a coroutine function; the ``*_sync`` forms are for tests that are not async.

An exception raised by ``check`` is not retried: it fails the wait at once, so a check may assert
what must stay true while it waits (or stop the wait when a process it waits for has died). A
timeout raises :class:`WaitTimeout`, which is both an ``AssertionError`` (a failed test) and a
``TimeoutError`` (for the tools). The polling itself is tenacity's.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar, overload

from tenacity import AsyncRetrying, RetryCallState, Retrying, retry_if_result, stop_after_delay, wait_fixed

__all__ = ["WaitTimeout", "eventually", "holds", "holds_sync", "until", "until_sync"]

T = TypeVar("T")


class WaitTimeout(AssertionError, TimeoutError):
    """What a wait raises when its condition did not come true (or stopped holding) in time."""


Check = Callable[[], T | Awaitable[T]]


def _last(state: RetryCallState) -> Any:
    return state.outcome.result() if state.outcome is not None else None


def _until(what: str, done: Callable[[Any], object], within: float, every: float) -> dict[str, Any]:
    def timed_out(state: RetryCallState) -> NoReturn:
        raise WaitTimeout(f"timed out after {within}s waiting for {what}; last seen: {_last(state)!r}")

    return {
        "stop": stop_after_delay(within),
        "wait": wait_fixed(every),
        "retry": retry_if_result(lambda value: not done(value)),
        "retry_error_callback": timed_out,
    }


def _holds(during: float, every: float) -> dict[str, Any]:
    # Every result is retried (a failing one raised already) until ``during`` is over; then the
    # callback ends the polling normally.
    return {
        "stop": stop_after_delay(during),
        "wait": wait_fixed(every),
        "retry": retry_if_result(lambda _: True),
        "retry_error_callback": _last,
    }


def _holding(what: str, done: Callable[[Any], object], value: T) -> T:
    if not done(value):
        raise WaitTimeout(f"{what} stopped holding; seen: {value!r}")
    return value


async def _called(check: Check[T]) -> T:
    value = check()
    return await value if inspect.isawaitable(value) else value


@overload
async def until(
    what: str,
    check: Callable[[], Awaitable[T]],
    *,
    done: Callable[[T], object] = bool,
    within: float = 30,
    every: float = 0.2,
) -> T: ...


@overload
async def until(
    what: str,
    check: Callable[[], T],
    *,
    done: Callable[[T], object] = bool,
    within: float = 30,
    every: float = 0.2,
) -> T: ...


async def until(
    what: str, check: Check[T], *, done: Callable[[T], object] = bool, within: float = 30, every: float = 0.2
) -> T:
    """The first value of ``check`` for which ``done`` holds, polled for up to ``within`` seconds."""

    async def attempt() -> T:
        return await _called(check)

    result: T = await AsyncRetrying(**_until(what, done, within, every))(attempt)
    return result


def until_sync(
    what: str,
    check: Callable[[], T],
    *,
    done: Callable[[T], object] = bool,
    within: float = 60,
    every: float = 0.2,
) -> T:
    """As :func:`until`, blocking, for tests that are not async."""
    result: T = Retrying(**_until(what, done, within, every))(check)
    return result


async def holds(
    what: str, check: Check[T], *, during: float, done: Callable[[T], object] = bool, every: float = 0.1
) -> None:
    """Fail as soon as ``done`` does not hold for a value of ``check``, polled for ``during`` seconds."""

    async def attempt() -> T:
        return _holding(what, done, await _called(check))

    await AsyncRetrying(**_holds(during, every))(attempt)


def holds_sync(
    what: str,
    check: Callable[[], T],
    *,
    during: float,
    done: Callable[[T], object] = bool,
    every: float = 0.1,
) -> None:
    """As :func:`holds`, blocking, for tests that are not async."""
    Retrying(**_holds(during, every))(lambda: _holding(what, done, check()))


def eventually(check: Callable[[], bool], *, within: float, every: float = 0.05) -> bool:
    """Whether ``check`` came true within ``within`` seconds, for waits whose timeout is no error
    (a process that may need a stronger signal, a port that may stay busy)."""
    try:
        until_sync("a condition", check, within=within, every=every)
    except WaitTimeout:
        return False
    return True
