"""cancel_and_wait ends a task even when a cancellation is lost on the way."""

from __future__ import annotations

import asyncio

from shared.tasks import cancel_and_wait


async def test_a_task_that_swallows_a_cancellation_is_cancelled_again_until_it_ends() -> None:
    swallowed = 0

    async def stubborn() -> None:
        # What a loop around asyncio.wait_for does when a cancellation arrives together with
        # the result it waits for: it takes the result and goes round again.
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                if swallowed == 2:
                    raise
                swallowed += 1

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait([task], every=0.02), timeout=5)
    assert task.cancelled() and swallowed == 2


async def test_tasks_already_done_are_left_as_they_are() -> None:
    async def done() -> int:
        return 7

    finished = asyncio.create_task(done())
    await finished
    await cancel_and_wait([finished])
    assert finished.result() == 7
