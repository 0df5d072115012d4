"""Ending asyncio tasks for certain."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

__all__ = ["cancel_and_wait"]


async def cancel_and_wait(tasks: Iterable[asyncio.Future[Any]], *, every: float = 0.1) -> None:
    """Cancel ``tasks`` and return once every one of them has ended.

    One cancellation is not always enough: on Python 3.11 ``asyncio.wait_for`` returns the result
    instead of raising when what it waits for completes in the same turn of the loop as the
    cancellation (python/cpython#86296, fixed in 3.12), and a loop around it (a watch, a timer)
    then simply goes on. So a task still running ``every`` seconds later is cancelled again.
    """
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=every)
