"""What a handler receives beside the decoded message, and the handler's type."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from opentelemetry.context import Context

from shared.messages import Message

M = TypeVar("M", bound=Message)


@dataclass(frozen=True)
class Delivery:
    """How a message arrived; passed to handlers beside the decoded message."""

    subject: str
    headers: Mapping[str, str]
    stream: str
    consumer: str
    stream_seq: int
    num_delivered: int
    num_pending: int
    msg_id: str
    # The producer's trace context; the bus already runs the handler inside a span that
    # continues it, so handlers need this only to link work done later.
    trace_context: Context
    _msg: Any = field(repr=False, compare=False)

    async def in_progress(self) -> None:
        """Tell JetStream the handler is still working (resets the ack wait)."""
        await self._msg.in_progress()


Handler = Callable[[M, Delivery], Awaitable[None]]
