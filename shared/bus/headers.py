"""The headers the bus sets on what it publishes (docs/messages.md, "Headers"), and the wire
rules every publish is checked against before it is sent; pure, no I/O."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

MSG_ID_HEADER = "Nats-Msg-Id"
TRACEPARENT_HEADER = "traceparent"
# Per-message TTL (nats-server 2.11+; the stream must allow it): the server removes the message
# once it is this old. Respawn puts it on tombstones, so a deleted object's subject goes away.
TTL_HEADER = "Nats-TTL"
# Set by the server on the messages it writes itself (subject delete markers, nats-server 2.11+):
# they carry no payload of ours.
MARKER_REASON_HEADER = "Nats-Marker-Reason"

_MAX_HEADER_VALUE = 1024

# What nats-py puts around the headers of an HPUB: "NATS/1.0\r\n", then "key: value\r\n" per
# header, then "\r\n". The server counts these bytes and the payload against max_payload.
_HEADER_LINE = len(b"NATS/1.0\r\n")
_HEADER_END = len(b"\r\n")
_PER_HEADER = len(b": \r\n")

_WHITESPACE = re.compile(r"\s")


def header_value(text: str) -> str:
    """``text`` as a header value: on one line (CR/LF would end the header) and bounded."""
    flat = " ".join(text.split())
    return flat if len(flat) <= _MAX_HEADER_VALUE else flat[: _MAX_HEADER_VALUE - 3] + "..."


def headers_size(headers: Mapping[str, str] | None) -> int:
    """Bytes the header block of a message takes on the wire (0 without headers)."""
    if not headers:
        return 0
    return (
        _HEADER_LINE
        + _HEADER_END
        + sum(_PER_HEADER + len(k.strip().encode()) + len(v.strip().encode()) for k, v in headers.items())
    )


def wire_size(payload: bytes, headers: Mapping[str, str] | None) -> int:
    """What the server checks against its ``max_payload``: header block plus payload."""
    return headers_size(headers) + len(payload)


def subject_problem(subject: str) -> str | None:
    """Why ``subject`` cannot be published on, or None if it can.

    The server would store a message published on a wildcard subject, where every consumer
    filter would then match it, and answers a subject with an empty token with silence; both
    are refused here instead.
    """
    if not subject:
        return "the subject is empty"
    if _WHITESPACE.search(subject):
        return "the subject contains whitespace"
    tokens = subject.split(".")
    if any(not t for t in tokens):
        return "the subject has an empty token"
    if any(t in ("*", ">") for t in tokens):
        return "the subject has a wildcard token"
    return None


def ttl_value(seconds: float) -> str:
    """A ``Nats-TTL`` value: whole seconds (the server's unit), rounded up, at least one."""
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"a message TTL must be a positive number of seconds, got {seconds!r}")
    return f"{max(1, math.ceil(seconds))}s"
