"""Polling with a deadline: the one way tests wait for something (never sleep-and-hope)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def until(what: str, check: Callable[[], T], *, within: float = 30, every: float = 0.2) -> T:
    """Poll ``check`` until it returns something truthy; fail naming ``what`` after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}; last seen: {value!r}")
        await asyncio.sleep(every)


async def until_async(
    what: str, check: Callable[[], Awaitable[T]], *, within: float = 30, every: float = 0.1
) -> T:
    """As :func:`until`, for a check that has to await."""
    deadline = time.monotonic() + within
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}; last seen: {value!r}")
        await asyncio.sleep(every)


def until_sync(what: str, check: Callable[[], T], *, within: float = 60, every: float = 0.2) -> T:
    """As :func:`until`, for synchronous tests."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}; last seen: {value!r}")
        time.sleep(every)
