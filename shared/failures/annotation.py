"""A workload's own failure settings, from its AppWrapper's annotations.

* ``respawn.dev/failure-patterns``: patterns (syntax v1, :mod:`shared.failures.patterns`) tried
  after the upstream exit-code annotations and before the operator's table. JSON or YAML: a list
  of patterns, or ``{version: 1, patterns: [...]}``. A value that cannot be used is refused as a
  whole (no pattern of it applies) with a reason the caller shows the user; this never raises.
* ``respawn.dev/transient-retry-limit``: the workload's own transient retry limit; a malformed
  value falls back to the operator's default with a warning, as upstream's ``retryLimit`` does.

Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import yaml
from pydantic import ValidationError

from shared.appwrapper.constants import RESPAWN_PREFIX
from shared.failures.patterns import FailurePattern

__all__ = [
    "FAILURE_PATTERNS_ANNOTATION",
    "MAX_ANNOTATION_BYTES",
    "MAX_WORKLOAD_PATTERNS",
    "PATTERN_SYNTAX_VERSION",
    "TRANSIENT_RETRY_LIMIT_ANNOTATION",
    "TransientRetryLimit",
    "WorkloadPatterns",
    "describe_errors",
    "transient_retry_limit",
    "workload_patterns",
]

FAILURE_PATTERNS_ANNOTATION: Final = f"{RESPAWN_PREFIX}failure-patterns"
TRANSIENT_RETRY_LIMIT_ANNOTATION: Final = f"{RESPAWN_PREFIX}transient-retry-limit"
PATTERN_SYNTAX_VERSION: Final = 1
# Every failure is matched against the workload's patterns; keep that cheap and the value small.
MAX_WORKLOAD_PATTERNS: Final = 32
MAX_ANNOTATION_BYTES: Final = 16 * 1024
_INT32_MAX: Final = (1 << 31) - 1


@dataclass(frozen=True, slots=True)
class WorkloadPatterns:
    patterns: tuple[FailurePattern, ...] = ()
    # Why the annotation was refused ('' when it was not, or is absent): one sentence that names
    # the annotation and the offending entry.
    error: str = ""


def describe_errors(exc: ValidationError, prefix: str = "") -> str:
    """One line per problem, each with where it is (``[2].exitCodes[0]``)."""
    problems = []
    for err in exc.errors(include_url=False):
        where = prefix
        for part in err["loc"]:
            if isinstance(part, int):
                where += f"[{part}]"
            elif part not in ("function-after", "function-before"):
                where += f".{part}" if where else str(part)
        message = str(err["msg"]).removeprefix("Value error, ")
        problems.append(f"{where}: {message}" if where else message)
    return "; ".join(problems)


def _refused(reason: str) -> WorkloadPatterns:
    return WorkloadPatterns(error=f"{FAILURE_PATTERNS_ANNOTATION} refused: {reason}")


def _load(raw: str) -> Any:
    # JSON is YAML; a YAML reader takes both. Deep nesting can exhaust the parser's recursion.
    return yaml.safe_load(raw)


def workload_patterns(annotations: Mapping[str, Any]) -> WorkloadPatterns:
    """The workload's failure patterns, or why they were refused. Never raises."""
    if FAILURE_PATTERNS_ANNOTATION not in annotations:
        return WorkloadPatterns()
    raw = annotations[FAILURE_PATTERNS_ANNOTATION]
    if not isinstance(raw, str):
        return _refused("not a string")
    if len(raw.encode("utf-8", "surrogatepass")) > MAX_ANNOTATION_BYTES:
        return _refused(f"longer than {MAX_ANNOTATION_BYTES} bytes")
    try:
        data = _load(raw)
    except (yaml.YAMLError, RecursionError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return _refused(f"not valid JSON or YAML ({first})")
    prefix = ""
    if isinstance(data, dict):
        unknown = sorted(str(k) for k in data if k not in ("version", "patterns"))
        if unknown:
            return _refused(f"unknown key {unknown[0]!r} (expected 'version' and 'patterns')")
        version = data.get("version", PATTERN_SYNTAX_VERSION)
        if version != PATTERN_SYNTAX_VERSION or isinstance(version, bool):
            return _refused(f"version {version!r} is not supported (only {PATTERN_SYNTAX_VERSION})")
        data = data.get("patterns", [])
        prefix = "patterns"
    if not isinstance(data, list):
        return _refused("expected a list of patterns, or {version: 1, patterns: [...]}")
    if len(data) > MAX_WORKLOAD_PATTERNS:
        return _refused(f"{len(data)} patterns, at most {MAX_WORKLOAD_PATTERNS} are allowed")
    patterns: list[FailurePattern] = []
    for index, entry in enumerate(data):
        if not isinstance(entry, dict):
            return _refused(
                f"{prefix}[{index}]: a pattern is a mapping of fields, not {type(entry).__name__}"
            )
        try:
            patterns.append(FailurePattern.model_validate(entry))
        except ValidationError as exc:
            return _refused(describe_errors(exc, f"{prefix}[{index}]"))
        except (RecursionError, ValueError, TypeError) as exc:  # pragma: no cover - defensive
            return _refused(f"{prefix}[{index}]: {exc}")
    return WorkloadPatterns(patterns=tuple(patterns))


@dataclass(frozen=True, slots=True)
class TransientRetryLimit:
    limit: int
    warning: str = ""


def transient_retry_limit(annotations: Mapping[str, Any], default: int) -> TransientRetryLimit:
    """The workload's transient retry limit: the annotation if it is a non-negative integer
    (Go ``Atoi`` syntax, as upstream's ``retryLimit``), else ``default`` with a warning."""
    if TRANSIENT_RETRY_LIMIT_ANNOTATION not in annotations:
        return TransientRetryLimit(default)
    raw = annotations[TRANSIENT_RETRY_LIMIT_ANNOTATION]
    key = TRANSIENT_RETRY_LIMIT_ANNOTATION
    text = raw.strip() if isinstance(raw, str) else ""
    digits = text[1:] if text[:1] in "+-" else text
    if not isinstance(raw, str) or raw != text or not digits.isascii() or not digits.isdigit():
        return TransientRetryLimit(default, f"{key}={raw!r} is not an integer; using the default {default}")
    value = int(text)
    if value < 0:
        return TransientRetryLimit(default, f"{key}={raw!r} is negative; using the default {default}")
    if value > _INT32_MAX:
        return TransientRetryLimit(_INT32_MAX, f"{key}={raw!r} is too large; using {_INT32_MAX}")
    return TransientRetryLimit(value)
