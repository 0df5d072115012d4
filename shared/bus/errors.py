"""What the bus raises, and what a handler raises to have its message retried."""

from __future__ import annotations


class BusError(RuntimeError):
    """The bus could not be set up or reached; the message names cause and fix."""


class TransientError(Exception):
    """Raised by a handler to have the message redelivered after ``delay`` seconds.

    Use it for conditions expected to clear by themselves: a Kubernetes conflict or
    timeout, a dependency that is not ready yet.
    """

    def __init__(self, message: str = "", *, delay: float = 1.0) -> None:
        super().__init__(message or "transient error")
        self.delay = max(0.0, delay)
