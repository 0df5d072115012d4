"""Failure patterns (syntax v1): what a failure must look like to get a class and a code.

A pattern names one or more facts to match (all must hold) and the class and code a failure that
matches gets. Patterns are tried in order and the first that matches wins (docs/failures.md has
the syntax and the default table). The same model reads the operator's table
(``failures.patterns`` in the configuration) and a workload's own patterns (the
``respawn.dev/failure-patterns`` annotation, :mod:`shared.failures.annotation`).

Regular expressions are Python's (``re``). A reason must match in full (reasons are single
words); a message only somewhere (messages are prose). Both are limited in length, and what they
are matched against is at most 4 KiB (the kubelet's limit on a termination message), so one bad
expression costs little.
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Iterable
from enum import StrEnum
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    model_validator,
)
from pydantic.alias_generators import to_camel

from shared.failures.facts import SIGNALS, FailureFacts

__all__ = [
    "CODE_PATTERN",
    "MAX_REGEX_LENGTH",
    "PATTERN_FIELDS",
    "ConditionMatch",
    "FailureClass",
    "FailurePattern",
    "compiled",
]

MAX_REGEX_LENGTH: Final = 256
# Matched text is cut to this many characters: the kubelet keeps at most 4 KiB of a message.
_MAX_TEXT: Final = 4096
# A code is a short stable word a dashboard can group by: "Evicted", "ExitCode:137".
CODE_PATTERN: Final = re.compile(r"[A-Za-z][A-Za-z0-9:._/-]{0,62}")
_INT32_MIN: Final = -(1 << 31)
_INT32_MAX: Final = (1 << 31) - 1
_SIGNAL_NUMBERS: Final = {name: number for number, name in SIGNALS.items()}


class FailureClass(StrEnum):
    # Not the workload's doing (eviction, preemption, a lost node): retried without counting
    # toward retryLimit, up to the transient retry limit.
    TRANSIENT = "Transient"
    # Retrying cannot help (a terminal exit code, an invalid image): failed at once.
    PERMANENT = "Permanent"
    # Cannot tell: retried and counted toward retryLimit, as upstream retries every failure.
    UNKNOWN = "Unknown"


@functools.lru_cache(maxsize=1024)
def compiled(expression: str) -> re.Pattern[str]:
    return re.compile(expression)


# Python's own regular-expression parser (no public API; without it the check below is skipped).
try:
    _PARSER: Any = importlib.import_module("re._parser")
    _REPEATS: tuple[Any, ...] = (_PARSER.MAX_REPEAT, _PARSER.MIN_REPEAT)
except (ImportError, AttributeError):  # pragma: no cover - a Python without it
    _PARSER = None
    _REPEATS = ()


def _nested_repeat(items: Any, inside: bool = False) -> bool:
    """Whether a repeat sits inside another repeat, as in ``(a+)+``: such an expression can take
    exponential time on a text that almost matches, and a workload's pattern runs in health."""
    for op, argument in items:
        if op in _REPEATS:
            _low, high, sub = argument
            repeats = high is _PARSER.MAXREPEAT or high > 1
            if (inside and repeats) or _nested_repeat(sub, inside or repeats):
                return True
            continue
        for part in argument if isinstance(argument, tuple | list) else ():
            if isinstance(part, _PARSER.SubPattern) and _nested_repeat(part, inside):
                return True
            if isinstance(part, list) and any(
                isinstance(sub, _PARSER.SubPattern) and _nested_repeat(sub, inside) for sub in part
            ):
                return True
    return False


def _regex(value: str) -> str:
    if len(value) > MAX_REGEX_LENGTH:
        raise ValueError(f"regular expression longer than {MAX_REGEX_LENGTH} characters")
    try:
        compiled(value)
    except (re.error, RecursionError, OverflowError) as exc:
        raise ValueError(f"not a valid regular expression ({exc})") from None
    if _PARSER is not None and _nested_repeat(_PARSER.parse(value)):
        raise ValueError("a repeat inside a repeat, such as (a+)+, can take exponential time; rewrite it")
    return value


Regex = Annotated[str, Field(strict=True), AfterValidator(_regex)]


def _exit_code_ranges(value: Any) -> Any:
    """``[1, "3-5", "-2"]`` → ``((1, 1), (3, 5), (-2, -2))``."""
    if not isinstance(value, list | tuple):
        raise ValueError("expected a list of exit codes and ranges such as [1, '3-5']")
    ranges: list[tuple[int, int]] = []
    for entry in value:
        if isinstance(entry, bool):
            raise ValueError(f"{entry!r} is not an exit code")
        if isinstance(entry, int):
            low = high = entry
        elif isinstance(entry, str) and (found := re.fullmatch(r"\s*(-?\d+)\s*(?:-\s*(-?\d+)\s*)?", entry)):
            low = int(found.group(1))
            high = int(found.group(2)) if found.group(2) is not None else low
        elif isinstance(entry, tuple) and len(entry) == 2 and all(type(x) is int for x in entry):
            low, high = entry  # already parsed (a pattern built in code, or copied)
        else:
            raise ValueError(f"{entry!r} is not an exit code or a range such as '3-5'")
        if not (_INT32_MIN <= low <= high <= _INT32_MAX):
            raise ValueError(f"{entry!r}: a range must run from low to high within 32-bit integers")
        ranges.append((low, high))
    if not ranges:
        raise ValueError("must list at least one exit code")
    return tuple(ranges)


def _signals(value: Any) -> Any:
    if not isinstance(value, list | tuple):
        raise ValueError("expected a list of signals such as [SIGKILL, SIGTERM]")
    names: list[str] = []
    for entry in value:
        if isinstance(entry, int) and not isinstance(entry, bool) and entry in SIGNALS:
            names.append(SIGNALS[entry])
        elif isinstance(entry, str) and entry.upper() in _SIGNAL_NUMBERS:
            names.append(entry.upper())
        elif isinstance(entry, str) and f"SIG{entry.upper()}" in _SIGNAL_NUMBERS:
            names.append(f"SIG{entry.upper()}")
        else:
            raise ValueError(f"{entry!r} is not a Linux signal name (SIGKILL) or number (1-31)")
    if not names:
        raise ValueError("must list at least one signal")
    return tuple(names)


def _written_ranges(ranges: tuple[tuple[int, int], ...]) -> list[int | str]:
    """The way an operator writes them: ``[1, "3-5"]``."""
    return [low if low == high else f"{low}-{high}" for low, high in ranges]


ExitCodes = Annotated[
    tuple[tuple[int, int], ...],
    BeforeValidator(_exit_code_ranges),
    PlainSerializer(_written_ranges, return_type=list[int | str]),
]
Signals = Annotated[tuple[str, ...], BeforeValidator(_signals)]
NodeStates = Annotated[tuple[Literal["Ready", "NotReady", "Unknown", "Deleted"], ...], Field(min_length=1)]


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
        frozen=True,
    )


class ConditionMatch(_Model):
    """A pod condition of this type with status True, and (if given) a reason matching in full."""

    type: str = Field(min_length=1, max_length=316, strict=True)
    reason: Regex | None = None


class FailurePattern(_Model):
    """One row of a failure table: the facts to match (all that are given) → class and code."""

    exit_codes: ExitCodes | None = None
    reason: Regex | None = None
    message: Regex | None = None
    signal: Signals | None = None
    condition: ConditionMatch | None = None
    node_state: NodeStates | None = None
    deleted_externally: bool | None = Field(default=None, strict=True)
    failure_class: FailureClass = Field(alias="class")
    # Omitted: the failure's own code (Signal:SIGKILL, ExitCode:1, else the pod's reason).
    code: str | None = Field(default=None, strict=True)
    # Free text for people reading the table (and the reason a default row exists).
    description: str = Field(default="", max_length=512, strict=True)

    @model_validator(mode="after")
    def _checked(self) -> FailurePattern:
        if all(getattr(self, name) is None for name in PATTERN_FIELDS):
            raise ValueError(
                f"a pattern must match on at least one of {', '.join(to_camel(n) for n in PATTERN_FIELDS)}"
            )
        if self.code is not None and not CODE_PATTERN.fullmatch(self.code):
            raise ValueError(
                f"code {self.code!r} must start with a letter and hold at most 63 letters, digits and ':._/-'"
            )
        return self

    def matches(self, facts: FailureFacts) -> bool:
        """Whether every fact this pattern names holds for ``facts``."""
        if self.exit_codes is not None and not any(
            low <= code <= high for code in facts.exit_codes() for low, high in self.exit_codes
        ):
            return False
        if self.reason is not None:
            reason = compiled(self.reason)
            if not any(reason.fullmatch(text[:_MAX_TEXT]) for text in _reasons(facts)):
                return False
        if self.message is not None:
            message = compiled(self.message)
            if not any(message.search(text[:_MAX_TEXT]) for text in _messages(facts)):
                return False
        if self.signal is not None and not set(self.signal).intersection(facts.signals):
            return False
        if self.condition is not None and not _condition_holds(self.condition, facts):
            return False
        if self.node_state is not None and facts.node_state not in self.node_state:
            return False
        return self.deleted_externally is None or self.deleted_externally == facts.deleted_externally


PATTERN_FIELDS: Final = (
    "exit_codes",
    "reason",
    "message",
    "signal",
    "condition",
    "node_state",
    "deleted_externally",
)


def _reasons(facts: FailureFacts) -> Iterable[str]:
    # The pod's reason, and each container's terminated or waiting reason; an empty pod reason
    # counts only when nothing else has one, so that reason: ".*" still matches such a pod.
    texts = [facts.reason, *(c.reason for c in facts.containers)]
    present = [t for t in texts if t]
    return present or [""]


def _messages(facts: FailureFacts) -> Iterable[str]:
    texts = [facts.message, *(c.message for c in facts.containers)]
    present = [t for t in texts if t]
    return present or [""]


def _condition_holds(match: ConditionMatch, facts: FailureFacts) -> bool:
    for condition in facts.true_conditions():
        if condition.type != match.type:
            continue
        if match.reason is None or compiled(match.reason).fullmatch(condition.reason[:_MAX_TEXT]):
            return True
    return False
