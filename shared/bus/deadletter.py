"""What a dead letter carries (docs/messages.md, "Dead letters"); pure, no I/O.

The consumer loop (:mod:`shared.bus.consume`) publishes the copy and then terminates the
original; this module only decides the copy's headers.
"""

from __future__ import annotations

from collections.abc import Mapping

from shared.bus.headers import MSG_ID_HEADER, header_value

DL_REASON_HEADER = "Respawn-Dead-Letter-Reason"
DL_ERROR_HEADER = "Respawn-Dead-Letter-Error"
DL_SUBJECT_HEADER = "Respawn-Original-Subject"
DL_STREAM_HEADER = "Respawn-Original-Stream"
DL_SEQUENCE_HEADER = "Respawn-Original-Sequence"
DL_CONSUMER_HEADER = "Respawn-Consumer"
DL_DELIVERIES_HEADER = "Respawn-Deliveries"

DL_INVALID = "invalid"
DL_UNSUPPORTED_VERSION = "unsupported-version"
DL_MAX_DELIVERIES = "max-deliveries"


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
