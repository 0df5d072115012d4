"""Restart storms and progress heartbeats: the parameters and the values workloads write.

* ``respawn.dev/restart-storm`` (AppWrapper annotation): ``"<K>/<W>"``, e.g. ``"3/10m"``: a
  container whose restart count rises by at least K within the Go duration W makes the workload
  Unhealthy; ``"off"`` turns restart-storm detection (CrashLoopBackOff included) off for the
  workload. A malformed value falls back to the operator's defaults with a warning, as upstream's
  duration annotations do.
* ``respawn.dev/heartbeat-timeout`` (AppWrapper annotation): a Go duration; opts the workload in
  to the progress heartbeat. A malformed value leaves the heartbeat off, with a warning.
* ``respawn.dev/heartbeat`` (on the AppWrapper or on one of its pods): an RFC 3339 time with a
  zone, written by the workload each time it makes progress.

Pure: no clock, no I/O (docs/failures.md, "Restart storms" and "Progress heartbeat").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from shared.appwrapper.constants import RESPAWN_PREFIX
from shared.durations import format_go_duration, parse_go_duration
from shared.kubetime import as_utc

__all__ = [
    "HEARTBEAT_ANNOTATION",
    "HEARTBEAT_LIMIT",
    "HEARTBEAT_TIMEOUT_ANNOTATION",
    "MAX_STORM_RESTARTS",
    "RESTART_STORM_ANNOTATION",
    "StallDefaults",
    "StallPolicy",
    "parse_heartbeat",
    "stall_policy",
]

RESTART_STORM_ANNOTATION: Final = f"{RESPAWN_PREFIX}restart-storm"
HEARTBEAT_TIMEOUT_ANNOTATION: Final = f"{RESPAWN_PREFIX}heartbeat-timeout"
HEARTBEAT_ANNOTATION: Final = f"{RESPAWN_PREFIX}heartbeat"
# Health keeps at most K + 1 restart samples per container: K is bounded so that the state is.
MAX_STORM_RESTARTS: Final = 1000
# An RFC 3339 time is at most 35 characters; the watcher carries no more of the annotation.
HEARTBEAT_LIMIT: Final = 64

_RFC3339: Final = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?([Zz]|[+-][0-9]{2}:[0-9]{2})"
)
_STORM: Final = re.compile(r"([0-9]{1,10})/(\S+)")


@dataclass(frozen=True, slots=True)
class StallDefaults:
    """The operator's defaults (``health`` in the configuration, docs/configuration.md)."""

    # A rise of the restart count by at least this many within ``storm_window``; 0: off.
    storm_restarts: int = 5
    storm_window: timedelta = timedelta(minutes=10)
    # A container waiting in CrashLoopBackOff for longer than FailureGracePeriod is a storm too.
    crash_loop_backoff: bool = True


@dataclass(frozen=True, slots=True)
class StallPolicy:
    """What applies to one AppWrapper."""

    storm_restarts: int = 5
    storm_window: timedelta = timedelta(minutes=10)
    crash_loop_backoff: bool = True
    # None: the workload did not opt in to the heartbeat.
    heartbeat_timeout: timedelta | None = None
    warnings: tuple[str, ...] = ()

    @property
    def counts_restarts(self) -> bool:
        return self.storm_restarts > 0 and self.storm_window > timedelta(0)


def _storm(raw: Any, defaults: StallDefaults, maximum: timedelta) -> tuple[int, timedelta, bool, str]:
    fallback = f"{defaults.storm_restarts}/{format_go_duration(defaults.storm_window)}"
    default = (defaults.storm_restarts, defaults.storm_window, defaults.crash_loop_backoff)
    if not isinstance(raw, str):
        return (*default, f"{RESTART_STORM_ANNOTATION}: not a string; using the default {fallback}")
    if raw == "off":
        return 0, defaults.storm_window, False, ""
    found = _STORM.fullmatch(raw)
    why = ""
    if found is None:
        why = "expected '<restarts>/<window>' such as '3/10m', or 'off'"
    else:
        restarts = int(found.group(1))
        try:
            window = parse_go_duration(found.group(2))
        except ValueError as exc:
            why = str(exc)
        else:
            if not 1 <= restarts <= MAX_STORM_RESTARTS:
                why = f"the restarts must be between 1 and {MAX_STORM_RESTARTS}"
            elif window <= timedelta(0):
                why = "the window must be positive"
            elif window > maximum:
                limit = format_go_duration(maximum)
                return (
                    restarts,
                    maximum,
                    defaults.crash_loop_backoff,
                    f"{RESTART_STORM_ANNOTATION}={raw!r} exceeds the grace period maximum {limit}; "
                    f"using {restarts}/{limit}",
                )
            else:
                return restarts, window, defaults.crash_loop_backoff, ""
    return (*default, f"{RESTART_STORM_ANNOTATION}={raw!r}: {why}; using the default {fallback}")


def _heartbeat_timeout(raw: Any, maximum: timedelta) -> tuple[timedelta | None, str]:
    key = HEARTBEAT_TIMEOUT_ANNOTATION
    if not isinstance(raw, str):
        return None, f"{key}: not a string; the heartbeat is not checked"
    try:
        timeout = parse_go_duration(raw)
    except ValueError as exc:
        return None, f"{key}: {exc}; the heartbeat is not checked"
    if timeout <= timedelta(0):
        return None, f"{key}={raw!r} is not positive; the heartbeat is not checked"
    if timeout > maximum:
        limit = format_go_duration(maximum)
        return maximum, f"{key}={raw!r} exceeds the grace period maximum {limit}; using {limit}"
    return timeout, ""


def stall_policy(
    annotations: Mapping[str, Any], defaults: StallDefaults, maximum: timedelta = timedelta(hours=24)
) -> StallPolicy:
    """The restart-storm and heartbeat parameters of one AppWrapper. Never raises.

    ``maximum`` is the grace period maximum (faultTolerance.gracePeriodCeiling): it caps the
    storm window and the heartbeat timeout as it caps every grace period set by annotation.
    """
    warnings: list[str] = []
    restarts, window, crash_loop = defaults.storm_restarts, defaults.storm_window, defaults.crash_loop_backoff
    if RESTART_STORM_ANNOTATION in annotations:
        restarts, window, crash_loop, problem = _storm(
            annotations[RESTART_STORM_ANNOTATION], defaults, maximum
        )
        if problem:
            warnings.append(problem)
    timeout = None
    if HEARTBEAT_TIMEOUT_ANNOTATION in annotations:
        timeout, problem = _heartbeat_timeout(annotations[HEARTBEAT_TIMEOUT_ANNOTATION], maximum)
        if problem:
            warnings.append(problem)
    return StallPolicy(
        storm_restarts=restarts,
        storm_window=window,
        crash_loop_backoff=crash_loop,
        heartbeat_timeout=timeout,
        warnings=tuple(warnings),
    )


def parse_heartbeat(value: Any) -> datetime | None:
    """A heartbeat value as an aware UTC time; None unless it is an RFC 3339 time with a zone."""
    if not isinstance(value, str) or not _RFC3339.fullmatch(value):
        return None
    text = value.upper().replace(" ", "T")
    whole, dot, rest = text.partition(".")
    if dot:
        # Python 3.11 reads at most microseconds; Kubernetes and `date` may write nanoseconds.
        digits = re.match(r"[0-9]+", rest)
        frac = digits.group(0) if digits else ""
        text = f"{whole}.{frac[:6].ljust(6, '0')}{rest[len(frac) :]}"
    try:
        return as_utc(datetime.fromisoformat(text))
    except ValueError:
        return None
