"""How long a failure took to become an Unhealthy verdict (docs/metrics.md). Pure.

Two figures, from the verdict alone, so that every replica (and one that replays the verdict
stream) would compute the same:

- **detection**: from the failure (``first_unhealthy_at``: the failed container's
  ``finishedAt``, the failing condition's start, the node verdict's time) to the verdict's
  ``decided_at``. It includes the grace period the workload has (``failureGracePeriod``, 1 min by
  default), which is the workload's choice.
- **delay**: from the moment the verdict was due (``deadline``, the failure time plus that grace
  period; the failure time where there is none) to ``decided_at``: Respawn's own share, what the
  detection latency objective is about.

Only the first Unhealthy verdict of an attempt counts: a later one of the same attempt (more
nodes blamed, a class learnt) would measure the same failure again.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.kubetime import as_utc
from shared.messages import Verdict

__all__ = ["Detection", "detection"]


@dataclass(frozen=True, slots=True)
class Detection:
    seconds: float
    delay_seconds: float


def _same_attempt(a: Verdict, b: Verdict) -> bool:
    return (
        a.ref.uid == b.ref.uid
        and a.resetting_count == b.resetting_count
        and a.attempt_started_at == b.attempt_started_at
    )


def detection(previous: Verdict | None, verdict: Verdict) -> Detection | None:
    """The detection figures of ``verdict``, published after ``previous`` (the AppWrapper's last
    verdict, if any); None when it is not the first Unhealthy verdict of its attempt or carries no
    failure time. Clocks of different machines may disagree a little: never below zero."""
    if verdict.state != "Unhealthy" or verdict.first_unhealthy_at is None:
        return None
    if previous is not None and previous.state == "Unhealthy" and _same_attempt(previous, verdict):
        return None
    decided = as_utc(verdict.decided_at)
    failed = as_utc(verdict.first_unhealthy_at)
    due = as_utc(verdict.deadline) if verdict.deadline is not None else failed
    return Detection(
        seconds=max(0.0, (decided - failed).total_seconds()),
        delay_seconds=max(0.0, (decided - max(due, failed)).total_seconds()),
    )
