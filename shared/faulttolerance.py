"""The fault-tolerance parameters of the retry loop (operator defaults and per-AppWrapper values).

Defaults follow the AppWrapper fault-tolerance specification. Operator-level values are
loaded and validated by :mod:`shared.config`; per-AppWrapper annotation overrides are
applied by :mod:`shared.appwrapper.params`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta


@dataclass(frozen=True, slots=True)
class FaultTolerance:
    admission_grace: timedelta = timedelta(minutes=1)
    warmup_grace: timedelta = timedelta(minutes=5)
    failure_grace: timedelta = timedelta(minutes=1)
    retry_pause: timedelta = timedelta(seconds=90)
    retry_limit: int = 3
    deletion_on_failure_grace: timedelta = timedelta(0)
    forceful_deletion_grace: timedelta = timedelta(minutes=10)
    success_ttl: timedelta = timedelta(days=7)
    # Respawn addition (operator-level only): the least time between a reset's deletion being
    # complete and the components being created again under the same names, whatever the
    # retry pause. See docs/configuration.md (faultTolerance.recreateDelay).
    recreate_delay: timedelta = timedelta(seconds=2)
    # Upper bound on every grace period, including ones set by annotations.
    grace_period_maximum: timedelta = timedelta(hours=24)
    # Respawn addition (operator-level only), off by default: the retry pause doubles with every
    # reset (retry_pause * 2^(n-1) for the n-th), times 1 + up to retry_pause_jitter, never above
    # retry_pause_maximum (nor below retry_pause). See docs/configuration.md.
    retry_pause_backoff: bool = False
    retry_pause_maximum: timedelta = timedelta(minutes=30)
    retry_pause_jitter: float = 0.0
    # Respawn addition (operator-level only), off by default: never force-delete a pod on a node
    # that does not answer (FrameworkController's consistency guarantee). See docs/lifecycle.md.
    consistency_mode: bool = False
