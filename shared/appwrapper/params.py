"""Per-AppWrapper fault-tolerance parameters from ``workload.codeflare.dev.appwrapper/*`` annotations.

The resolution rules are upstream's, so an annotated AppWrapper behaves the same under Respawn:

* Durations use Go ``time.ParseDuration`` syntax (:mod:`shared.durations`).
* Admission, warmup, failure, retry-pause, forceful-deletion and deletion-on-failure periods are
  clamped to ``[0, grace_period_maximum]``; the operator defaults are clamped the same way.
* A malformed value falls back to the operator default (upstream logs it; we also return a
  warning so that the verdict can tell the user).
* ``successTTLDuration`` applies only when ``0 < value < default``: it may shorten the TTL, never
  lengthen it.
* ``retryLimit`` is a Go ``strconv.Atoi`` integer. Upstream does not clamp it, but a negative
  limit behaves exactly like 0 there (``resettingCount < limit`` never holds), so it is clamped
  to 0 here, with a warning.
* ``terminalExitCodes`` / ``retryableExitCodes`` are comma-separated integers; entries that do
  not parse are ignored, as upstream ignores them (e.g. ``"3, 10"`` means only 3, because
  ``" 10"`` is not an integer to ``Atoi``), and each ignored entry is reported as a warning.

Nothing here reads a clock or does I/O.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Final

from shared.appwrapper.constants import ANNOTATION_PREFIX
from shared.durations import format_go_duration, parse_go_duration
from shared.faulttolerance import FaultTolerance

__all__ = [
    "ADMISSION_GRACE_PERIOD_ANNOTATION",
    "DELETION_ON_FAILURE_GRACE_PERIOD_ANNOTATION",
    "FAILURE_GRACE_PERIOD_ANNOTATION",
    "FORCEFUL_DELETION_GRACE_PERIOD_ANNOTATION",
    "RETRYABLE_EXIT_CODES_ANNOTATION",
    "RETRY_LIMIT_ANNOTATION",
    "RETRY_PAUSE_PERIOD_ANNOTATION",
    "SUCCESS_TTL_ANNOTATION",
    "TERMINAL_EXIT_CODES_ANNOTATION",
    "WARMUP_GRACE_PERIOD_ANNOTATION",
    "EffectiveParams",
    "ExitCodePolicy",
    "effective_fault_tolerance",
    "exit_code_policy",
]

ADMISSION_GRACE_PERIOD_ANNOTATION: Final = f"{ANNOTATION_PREFIX}admissionGracePeriodDuration"
WARMUP_GRACE_PERIOD_ANNOTATION: Final = f"{ANNOTATION_PREFIX}warmupGracePeriodDuration"
FAILURE_GRACE_PERIOD_ANNOTATION: Final = f"{ANNOTATION_PREFIX}failureGracePeriodDuration"
RETRY_PAUSE_PERIOD_ANNOTATION: Final = f"{ANNOTATION_PREFIX}retryPausePeriodDuration"
RETRY_LIMIT_ANNOTATION: Final = f"{ANNOTATION_PREFIX}retryLimit"
DELETION_ON_FAILURE_GRACE_PERIOD_ANNOTATION: Final = (
    f"{ANNOTATION_PREFIX}deletionOnFailureGracePeriodDuration"
)
FORCEFUL_DELETION_GRACE_PERIOD_ANNOTATION: Final = f"{ANNOTATION_PREFIX}forcefulDeletionGracePeriodDuration"
SUCCESS_TTL_ANNOTATION: Final = f"{ANNOTATION_PREFIX}successTTLDuration"
TERMINAL_EXIT_CODES_ANNOTATION: Final = f"{ANNOTATION_PREFIX}terminalExitCodes"
RETRYABLE_EXIT_CODES_ANNOTATION: Final = f"{ANNOTATION_PREFIX}retryableExitCodes"

# Go's strconv.Atoi: optional sign, ASCII digits only, no spaces or underscores (Python's int()
# is more lenient, so it is not used directly).
_GO_INT: Final = re.compile(r"[+-]?[0-9]+")
_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1
# status.resettingCount is an int32; a larger limit could never be reached.
_INT32_MAX: Final = (1 << 31) - 1


def _go_atoi(text: str) -> int | None:
    if not _GO_INT.fullmatch(text):
        return None
    value = int(text)
    return value if _INT64_MIN <= value <= _INT64_MAX else None


@dataclass(frozen=True, slots=True)
class EffectiveParams:
    """The parameters that apply to one AppWrapper, and what was wrong with its annotations."""

    ft: FaultTolerance
    # One human-readable sentence per ignored or adjusted annotation, in annotation order.
    warnings: tuple[str, ...] = ()


def _clamp(value: timedelta, maximum: timedelta) -> timedelta:
    return max(timedelta(0), min(value, maximum))


def _parse_annotation(
    annotations: Mapping[str, str], key: str, fallback: str
) -> tuple[timedelta | None, str]:
    """The annotation's duration, or None with a warning (naming key and value) when malformed."""
    raw = annotations[key]
    if not isinstance(raw, str):
        return None, f"{key}: not a string; using the default {fallback}"
    try:
        return parse_go_duration(raw), ""
    except ValueError as exc:
        return None, f"{key}: {exc}; using the default {fallback}"


def _clamped_period(
    annotations: Mapping[str, str], key: str, default: timedelta, maximum: timedelta, warnings: list[str]
) -> timedelta:
    value = _clamp(default, maximum)
    if key not in annotations:
        return value
    parsed, problem = _parse_annotation(annotations, key, format_go_duration(value))
    raw = annotations[key]
    if parsed is None:
        warnings.append(problem)
        return value
    if parsed < timedelta(0):
        warnings.append(f"{key}={raw!r} is negative; using 0s")
        return timedelta(0)
    if parsed > maximum:
        limit = format_go_duration(maximum)
        warnings.append(f"{key}={raw!r} exceeds the grace period maximum {limit}; using {limit}")
        return maximum
    return parsed


def _retry_limit(annotations: Mapping[str, str], default: int, warnings: list[str]) -> int:
    if RETRY_LIMIT_ANNOTATION not in annotations:
        return default
    raw = annotations[RETRY_LIMIT_ANNOTATION]
    limit = _go_atoi(raw) if isinstance(raw, str) else None
    if limit is None:
        warnings.append(f"{RETRY_LIMIT_ANNOTATION}={raw!r} is not an integer; using the default {default}")
        return default
    if limit < 0:
        warnings.append(f"{RETRY_LIMIT_ANNOTATION}={raw!r} is negative; using 0")
        return 0
    if limit > _INT32_MAX:
        warnings.append(f"{RETRY_LIMIT_ANNOTATION}={raw!r} is too large; using {_INT32_MAX}")
        return _INT32_MAX
    return limit


def _success_ttl(annotations: Mapping[str, str], default: timedelta, warnings: list[str]) -> timedelta:
    if SUCCESS_TTL_ANNOTATION not in annotations:
        return default
    fallback = format_go_duration(default)
    ttl, problem = _parse_annotation(annotations, SUCCESS_TTL_ANNOTATION, fallback)
    raw = annotations[SUCCESS_TTL_ANNOTATION]
    if ttl is None:
        warnings.append(problem)
        return default
    if ttl <= timedelta(0):
        warnings.append(f"{SUCCESS_TTL_ANNOTATION}={raw!r} is not positive; using the default {fallback}")
        return default
    if ttl > default:
        warnings.append(
            f"{SUCCESS_TTL_ANNOTATION}={raw!r} may only shorten the success TTL; using the default {fallback}"
        )
        return default
    return ttl


def effective_fault_tolerance(annotations: Mapping[str, str], defaults: FaultTolerance) -> EffectiveParams:
    """Apply an AppWrapper's annotation overrides to the operator ``defaults``."""
    maximum = defaults.grace_period_maximum
    warnings: list[str] = []

    def period(key: str, default: timedelta) -> timedelta:
        return _clamped_period(annotations, key, default, maximum, warnings)

    ft = dataclasses.replace(
        defaults,
        admission_grace=period(ADMISSION_GRACE_PERIOD_ANNOTATION, defaults.admission_grace),
        warmup_grace=period(WARMUP_GRACE_PERIOD_ANNOTATION, defaults.warmup_grace),
        failure_grace=period(FAILURE_GRACE_PERIOD_ANNOTATION, defaults.failure_grace),
        retry_pause=period(RETRY_PAUSE_PERIOD_ANNOTATION, defaults.retry_pause),
        retry_limit=_retry_limit(annotations, defaults.retry_limit, warnings),
        deletion_on_failure_grace=period(
            DELETION_ON_FAILURE_GRACE_PERIOD_ANNOTATION, defaults.deletion_on_failure_grace
        ),
        forceful_deletion_grace=period(
            FORCEFUL_DELETION_GRACE_PERIOD_ANNOTATION, defaults.forceful_deletion_grace
        ),
        success_ttl=_success_ttl(annotations, defaults.success_ttl, warnings),
    )
    return EffectiveParams(ft=ft, warnings=tuple(warnings))


@dataclass(frozen=True, slots=True)
class ExitCodePolicy:
    """Which container exit codes make a failed pod a terminal (not retried) failure.

    Upstream semantics: only non-zero exit codes of terminated (non-init) containers of Failed
    pods are looked at. A code listed in ``terminal`` is terminal. If ``retryable`` is non-empty,
    any code *not* listed in it is terminal too. A code listed in both is therefore terminal:
    the terminal list wins.
    """

    terminal: frozenset[int] = frozenset()
    # Empty means the annotation is absent (or had no valid entry): every code is retryable.
    retryable: frozenset[int] = frozenset()
    warnings: tuple[str, ...] = ()

    def is_terminal(self, exit_code: int) -> bool:
        if exit_code == 0:
            return False
        if exit_code in self.terminal:
            return True
        return bool(self.retryable) and exit_code not in self.retryable


def _exit_codes(annotations: Mapping[str, str], key: str, warnings: list[str]) -> frozenset[int]:
    if key not in annotations:
        return frozenset()
    raw = annotations[key]
    if not isinstance(raw, str):
        warnings.append(f"{key}: not a string; ignored")
        return frozenset()
    codes: set[int] = set()
    for entry in raw.split(","):
        code = _go_atoi(entry)
        if code is None:
            warnings.append(f"{key}={raw!r}: entry {entry!r} is not an integer exit code; ignored")
        else:
            codes.add(code)
    return frozenset(codes)


def exit_code_policy(annotations: Mapping[str, str]) -> ExitCodePolicy:
    """Read ``terminalExitCodes`` and ``retryableExitCodes`` from an AppWrapper's annotations."""
    warnings: list[str] = []
    terminal = _exit_codes(annotations, TERMINAL_EXIT_CODES_ANNOTATION, warnings)
    retryable = _exit_codes(annotations, RETRYABLE_EXIT_CODES_ANNOTATION, warnings)
    return ExitCodePolicy(terminal=terminal, retryable=retryable, warnings=tuple(warnings))
