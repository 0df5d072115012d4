"""Reading what Respawn published, as an external subscriber would (test helper)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import nats
from nats.js.errors import NotFoundError

from shared.messages import Message, decode
from tests.waiting import until

M = TypeVar("M", bound=Message)


class Observer:
    """A NATS connection to ``url``; ``options`` go to ``nats.connect`` (a user, say)."""

    def __init__(self, url: str, **options: Any) -> None:
        self.url = url
        self.options = options
        self.nc: Any = None

    async def __aenter__(self) -> Observer:
        self.nc = await nats.connect(self.url, **self.options)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.nc.close()

    async def last(self, stream: str, subject: str, cls: type[M]) -> M | None:
        try:
            raw = await self.nc.jetstream().get_last_msg(stream, subject)
        except NotFoundError:
            return None
        return decode(cls, raw.data, raw.headers)

    async def wait_last(
        self, stream: str, subject: str, cls: type[M], check: Callable[[M], bool], *, within: float = 30
    ) -> M:
        """The last message on ``subject`` once it passes ``check``."""
        found: M = await until(
            f"a message on {subject} that passes the check",
            lambda: self.last(stream, subject, cls),
            done=lambda seen: seen is not None and check(seen),
            within=within,
            every=0.1,
        )
        return found

    async def all(self, stream: str, subject_filter: str, cls: type[M]) -> list[M]:
        """Every message currently stored for ``subject_filter`` (ordered, oldest first)."""
        js = self.nc.jetstream()
        sub = await js.subscribe(subject_filter, stream=stream, ordered_consumer=True)
        out: list[M] = []
        try:
            while True:
                try:
                    # Stored messages come at once; a second without one means none is left.
                    msg = await sub.next_msg(timeout=1.0)
                except TimeoutError:
                    return out
                out.append(decode(cls, msg.data, msg.headers))
        finally:
            await sub.unsubscribe()
