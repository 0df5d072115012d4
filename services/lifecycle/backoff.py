"""The retry pause before attempt ``k``: upstream's fixed pause, or (``retryPauseBackoff``) one that
doubles with every reset.

With the backoff on, the pause before the n-th reset's new attempt (n = k - 1) is
``retryPause * 2^(n-1)``, stretched by a jitter factor in ``[1, 1 + retryPauseJitter)`` and
capped at ``retryPauseMaximum`` (but never below ``retryPause``, which an AppWrapper's own
annotation may have set). The jitter is a function of the AppWrapper's uid and the attempt, not
a random draw: every lifecycle replica, and a replica that restarts mid-pause, computes the same
deadline, while the workloads reset by one incident (a node lost under many of them) still
spread their restarts.

Pure; no clock, no I/O.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Final

from shared.faulttolerance import FaultTolerance

__all__ = ["jitter_fraction", "retry_pause"]

# 2^40 times any pause is beyond every cap; the exponent stops there.
_MAX_DOUBLINGS: Final = 40


def jitter_fraction(appwrapper_uid: str, attempt: int) -> float:
    """A number in [0, 1), the same for the same uid and attempt."""
    digest = hashlib.sha256(f"{appwrapper_uid}/{attempt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def retry_pause(params: FaultTolerance, appwrapper_uid: str, attempt: int) -> timedelta:
    """The pause between the failure that ended attempt ``attempt - 1`` and attempt ``attempt``."""
    base = params.retry_pause
    if not params.retry_pause_backoff or base <= timedelta(0):
        return base
    resets = max(attempt - 1, 1)
    grown = base * (2 ** min(resets - 1, _MAX_DOUBLINGS))
    grown *= 1 + params.retry_pause_jitter * jitter_fraction(appwrapper_uid, attempt)
    # Whole milliseconds: the deadline is compared with clocks, not printed to the microsecond.
    grown = timedelta(milliseconds=int(grown / timedelta(milliseconds=1)))
    return max(base, min(grown, params.retry_pause_maximum))
