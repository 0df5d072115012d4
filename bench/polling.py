"""Polling with a deadline: how the single-service benchmarks wait (never sleep-and-hope)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def until(what: str, check: Callable[[], Awaitable[T]], *, within: float, every: float) -> T:
    """Poll ``check`` until it returns something truthy; exit naming ``what`` after ``within`` s."""
    deadline = time.monotonic() + within
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not within {within:.0f}s")
        await asyncio.sleep(every)
