"""Reading what Respawn published, as an external subscriber would (test helper)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

import nats
from nats.js.errors import NotFoundError

from shared.messages import Message, decode

M = TypeVar("M", bound=Message)


class Observer:
    def __init__(self, url: str) -> None:
        self.url = url
        self.nc: Any = None

    async def __aenter__(self) -> Observer:
        self.nc = await nats.connect(self.url)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.nc.close()

    async def last(self, stream: str, subject: str, cls: type[M]) -> M | None:
        try:
            raw = await self.nc.jetstream().get_last_msg(stream, subject)
        except NotFoundError:
            return None
        return decode(cls, raw.data)

    async def wait_last(
        self, stream: str, subject: str, cls: type[M], check: Callable[[M], bool], *, within: float = 30
    ) -> M:
        deadline = time.monotonic() + within
        seen: M | None = None
        while time.monotonic() < deadline:
            seen = await self.last(stream, subject, cls)
            if seen is not None and check(seen):
                return seen
            await asyncio.sleep(0.1)
        raise AssertionError(f"timed out after {within}s waiting on {subject}; last message: {seen!r}")

    async def all(self, stream: str, subject_filter: str, cls: type[M]) -> list[M]:
        """Every message currently stored for ``subject_filter`` (ordered, oldest first)."""
        js = self.nc.jetstream()
        sub = await js.subscribe(subject_filter, stream=stream, ordered_consumer=True)
        out: list[M] = []
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=0.5)
                except TimeoutError:
                    return out
                out.append(decode(cls, msg.data))
        finally:
            await sub.unsubscribe()
