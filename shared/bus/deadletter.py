"""What a dead letter carries (docs/messages.md, "Dead letters"); pure, no I/O.

The consumer loop (:mod:`shared.bus.consume`) and :meth:`shared.bus.Bus.dead_letter` publish the
copy; this module decides its headers and makes sure it fits in one NATS message, so that a dead
letter is never itself too large to be stored.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from shared.bus.errors import INVALID_SUBJECT, PERMISSION, REJECTED, TOO_LARGE
from shared.bus.headers import MSG_ID_HEADER, header_value, headers_size

DL_REASON_HEADER = "Respawn-Dead-Letter-Reason"
DL_ERROR_HEADER = "Respawn-Dead-Letter-Error"
DL_SUBJECT_HEADER = "Respawn-Original-Subject"
DL_STREAM_HEADER = "Respawn-Original-Stream"
DL_SEQUENCE_HEADER = "Respawn-Original-Sequence"
DL_CONSUMER_HEADER = "Respawn-Consumer"
DL_DELIVERIES_HEADER = "Respawn-Deliveries"
# Set when the copy had to be cut to fit in one message: the original payload's size in bytes.
DL_TRUNCATED_HEADER = "Respawn-Dead-Letter-Truncated"
# Who wrote a dead letter that was never a stored message (Bus.dead_letter): the service, and
# which object it was about.
DL_SERVICE_HEADER = "Respawn-Dead-Letter-Service"
DL_OBJECT_KIND_HEADER = "Respawn-Object-Kind"
DL_OBJECT_NAMESPACE_HEADER = "Respawn-Object-Namespace"
DL_OBJECT_NAME_HEADER = "Respawn-Object-Name"
DL_OBJECT_UID_HEADER = "Respawn-Object-Uid"
DL_OBJECT_RESOURCE_VERSION_HEADER = "Respawn-Object-Resource-Version"

# What a cut-down dead letter always keeps: where it came from, why, and what it was about.
_ESSENTIAL = frozenset(
    {
        MSG_ID_HEADER,
        DL_REASON_HEADER,
        DL_ERROR_HEADER,
        DL_SUBJECT_HEADER,
        DL_STREAM_HEADER,
        DL_SEQUENCE_HEADER,
        DL_CONSUMER_HEADER,
        DL_DELIVERIES_HEADER,
        DL_TRUNCATED_HEADER,
        DL_SERVICE_HEADER,
        DL_OBJECT_KIND_HEADER,
        DL_OBJECT_NAMESPACE_HEADER,
        DL_OBJECT_NAME_HEADER,
        DL_OBJECT_UID_HEADER,
        DL_OBJECT_RESOURCE_VERSION_HEADER,
    }
)

DL_INVALID = "invalid"
DL_UNSUPPORTED_VERSION = "unsupported-version"
DL_MAX_DELIVERIES = "max-deliveries"
DL_MAX_ERRORS = "max-errors"
# A message that could never be published (PermanentPublishError.reason).
DL_TOO_LARGE = TOO_LARGE
DL_PERMISSION = PERMISSION
DL_INVALID_SUBJECT = INVALID_SUBJECT
DL_REJECTED = REJECTED

# Room left for what the client and server add to a message beyond the headers and payload we
# count (e.g. the Nats-Expected-Stream a client may set), so a fitted copy is never refused.
_SLACK = 512


def dead_letter_headers(
    original: Mapping[str, str],
    *,
    service: str,
    reason: str,
    error: str,
    subject: str,
    stream: str,
    sequence: int,
    consumer: str,
    deliveries: int,
) -> dict[str, str]:
    """The original headers except the ``Nats-*`` ones, plus where the message came from and why
    it was given up on."""
    headers = {k: v for k, v in original.items() if not k.startswith("Nats-")}
    headers.update(
        {
            DL_REASON_HEADER: reason,
            DL_ERROR_HEADER: header_value(error),
            DL_SUBJECT_HEADER: subject,
            DL_STREAM_HEADER: stream,
            DL_SEQUENCE_HEADER: str(sequence),
            DL_CONSUMER_HEADER: consumer,
            DL_DELIVERIES_HEADER: str(deliveries),
            # One dead letter per (service, consumer, stream message), even if the message is
            # dead-lettered again after a lost term.
            MSG_ID_HEADER: f"{service}:{consumer}:{stream}:{sequence}",
        }
    )
    return headers


def unpublished_headers(
    extra: Mapping[str, str],
    *,
    service: str,
    reason: str,
    error: str,
    subject: str,
    stream: str,
    payload: bytes,
    msg_id: str | None,
) -> dict[str, str]:
    """Headers of a dead letter for something that never became a stored message (see
    :meth:`shared.bus.Bus.dead_letter`): the consumer dead letter's headers, with sequence 0,
    no consumer and 0 deliveries, plus the caller's (identity) headers."""
    headers = {k: header_value(v) for k, v in extra.items() if not k.startswith("Nats-")}
    identity = msg_id or hashlib.sha256(subject.encode() + b"\0" + payload).hexdigest()[:32]
    headers.update(
        {
            DL_REASON_HEADER: reason,
            DL_ERROR_HEADER: header_value(error),
            DL_SUBJECT_HEADER: subject,
            DL_STREAM_HEADER: stream,
            DL_SEQUENCE_HEADER: "0",
            DL_CONSUMER_HEADER: "",
            DL_DELIVERIES_HEADER: "0",
            DL_SERVICE_HEADER: service,
            # A repeat of the same failure (a watch that re-lists, say) is stored once.
            MSG_ID_HEADER: f"{service}:publish:{subject}:{identity}",
        }
    )
    return headers


def fit(headers: Mapping[str, str], payload: bytes, max_payload: int) -> tuple[dict[str, str], bytes]:
    """``headers`` and ``payload`` cut down, if needed, to fit in one message of ``max_payload``.

    The dead letter's own headers (where the message came from, why, and what it was about)
    always stay. When they and the original headers leave too little room, the original headers
    go first, then the payload is cut; either way :data:`DL_TRUNCATED_HEADER` gives the original
    payload's size.
    """
    budget = max(0, max_payload - _SLACK)
    fitted = dict(headers)
    if headers_size(fitted) + len(payload) <= budget:
        return fitted, payload
    fitted[DL_TRUNCATED_HEADER] = str(len(payload))
    if headers_size(fitted) > budget // 2:
        # Original headers that big are not worth more than the message they came with.
        fitted = {k: v for k, v in fitted.items() if k in _ESSENTIAL}
    room = max(0, budget - headers_size(fitted))
    return fitted, payload[:room]
