"""Polling with a deadline for the single-service benchmarks: the tools' one helper
(``respawn.waiting``), ending the benchmark with a message naming what did not happen."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from respawn.waiting import WaitTimeout
from respawn.waiting import until as _until

T = TypeVar("T")


async def until(what: str, check: Callable[[], Awaitable[T]], *, within: float, every: float) -> T:
    """Poll ``check`` until it returns something truthy; exit naming ``what`` after ``within`` s."""
    try:
        return await _until(what, check, within=within, every=every)
    except WaitTimeout:
        raise SystemExit(f"{what}: not within {within:.0f}s") from None
