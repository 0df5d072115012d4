"""The headers the bus sets on what it publishes (docs/messages.md, "Headers")."""

from __future__ import annotations

MSG_ID_HEADER = "Nats-Msg-Id"
TRACEPARENT_HEADER = "traceparent"

_MAX_HEADER_VALUE = 1024


def header_value(text: str) -> str:
    """``text`` as a header value: on one line (CR/LF would end the header) and bounded."""
    flat = " ".join(text.split())
    return flat if len(flat) <= _MAX_HEADER_VALUE else flat[: _MAX_HEADER_VALUE - 3] + "..."
