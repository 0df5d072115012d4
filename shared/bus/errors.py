"""What the bus raises, and what a handler raises to have its message retried."""

from __future__ import annotations

# Why a publish can never succeed, whatever the retries (:class:`PermanentPublishError`, and the
# dead-letter reason of :meth:`shared.bus.Bus.dead_letter`).
TOO_LARGE = "too-large"  # message (payload + headers) above the server's max_payload
PERMISSION = "permission"  # the NATS user may not publish on the subject
INVALID_SUBJECT = "invalid-subject"  # empty tokens, wildcards, whitespace
REJECTED = "rejected"  # JetStream refused this message for good (e.g. a TTL the stream does not allow)


class BusError(RuntimeError):
    """The bus could not be set up or reached; the message names cause and fix."""


class PermanentPublishError(BusError):
    """This one message can never be published; retrying cannot help.

    The caller should dead-letter the object it was about (:meth:`shared.bus.Bus.dead_letter`)
    and go on with the next: ``reason`` is one of ``too-large``, ``permission``,
    ``invalid-subject`` or ``rejected``, ``subject`` the subject it was meant for.
    """

    def __init__(self, reason: str, subject: str, detail: str) -> None:
        super().__init__(f"cannot publish on {subject} ({reason}): {detail}")
        self.reason = reason
        self.subject = subject
        self.detail = detail


class TransientError(Exception):
    """Raised by a handler to have the message redelivered after ``delay`` seconds.

    Use it for conditions expected to clear by themselves: a Kubernetes conflict or
    timeout, a dependency that is not ready yet, a message that cannot be applied yet. It
    counts toward the consumer's ``max_deliver`` (every delivery does) but never toward its
    ``max_errors`` poison budget (see :meth:`shared.bus.Bus.consume`).
    """

    def __init__(self, message: str = "", *, delay: float = 1.0) -> None:
        super().__init__(message or "transient error")
        self.delay = max(0.0, delay)
