"""The times of a reset that lifecycle measures (docs/metrics.md): the reaction, from the
Unhealthy verdict to the first delete of the reset, and the recovery, from the failure to the
AppWrapper's phase Running again.

The failure's time comes with the verdict (``first_unhealthy_at``) and is carried, per
AppWrapper, until the phase is Running again or leaves the reset (Failed, Suspended,
Terminating...): a second reset before Running keeps the first failure's time, so the recovery
spans every attempt it took. Kept in memory: a reset that a lifecycle restart (or a move of its
partition to another replica) interrupts is not measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from shared.appwrapper.constants import Phase
from shared.kubetime import as_utc
from shared.messages import Verdict

__all__ = ["ResetTimes"]

Key = tuple[str, str]

# The phases of a reset on its way to Running.
_UNDER_WAY = (Phase.RESETTING, Phase.RESUMING)


@dataclass(slots=True)
class _Reset:
    verdict_at: datetime
    failed_at: datetime
    deleted: bool = False


class ResetTimes:
    def __init__(self) -> None:
        self._resets: dict[Key, _Reset] = {}

    def __len__(self) -> int:
        return len(self._resets)

    def started(self, key: Key, verdict: Verdict) -> None:
        """A reset of ``key`` started on ``verdict`` (its status written)."""
        failed = as_utc(verdict.first_unhealthy_at or verdict.decided_at)
        earlier = self._resets.get(key)
        if earlier is not None:
            failed = min(failed, earlier.failed_at)
        self._resets[key] = _Reset(verdict_at=as_utc(verdict.decided_at), failed_at=failed)

    def deleted(self, key: Key, at: datetime) -> float | None:
        """A delete of ``key``'s resources answered at ``at``: the reaction time in seconds if it
        is the first of the reset under way, else None."""
        reset = self._resets.get(key)
        if reset is None or reset.deleted:
            return None
        reset.deleted = True
        return max(0.0, (as_utc(at) - reset.verdict_at).total_seconds())

    def phase(self, key: Key, phase: str, at: datetime) -> float | None:
        """``key``'s status was written with ``phase`` at ``at``: the recovery time in seconds if
        that is Running after a reset, else None."""
        reset = self._resets.get(key)
        if reset is None or phase in _UNDER_WAY:
            return None
        del self._resets[key]
        if phase != Phase.RUNNING:
            return None
        return max(0.0, (as_utc(at) - reset.failed_at).total_seconds())

    def forget(self, key: Key) -> None:
        self._resets.pop(key, None)
