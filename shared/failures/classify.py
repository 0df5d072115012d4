"""Classify one failed pod: exactly one class and one code, from an ordered list of patterns.

Order of precedence (the first that decides wins):

1. The upstream annotations ``terminalExitCodes`` / ``retryableExitCodes`` with their upstream
   meaning: a non-zero exit code of a (non-init) container that they make terminal makes the
   failure ``Permanent`` with the code ``ExitCode:<n>``. An exit code listed in
   ``retryableExitCodes`` is retryable: nothing below may make that failure ``Permanent`` (it
   becomes ``Unknown``, a counted retry, as upstream retries it).
2. The workload's own patterns (the ``respawn.dev/failure-patterns`` annotation).
3. The operator's table: its own patterns ahead of the defaults, or instead of them.
4. No pattern matched: ``Unknown``, with the failure's own code.

Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from shared.appwrapper.params import (
    RETRYABLE_EXIT_CODES_ANNOTATION,
    TERMINAL_EXIT_CODES_ANNOTATION,
    ExitCodePolicy,
)
from shared.failures.facts import FailureFacts
from shared.failures.patterns import CODE_PATTERN, FailureClass, FailurePattern

__all__ = ["Classification", "Source", "classify", "own_code"]

Source = Literal["terminalExitCodes", "retryableExitCodes", "workload", "operator", "none"]


@dataclass(frozen=True, slots=True)
class Classification:
    failure_class: FailureClass
    code: str
    # What decided: an upstream annotation, a workload pattern, the operator's table (its own
    # patterns and the defaults), or nothing (the fallback).
    source: Source
    # The position of the deciding pattern in its list (workload patterns, or the operator's
    # table), counted from 0; None for an annotation or the fallback.
    index: int | None = None

    def describe(self, pod: str) -> str:
        where = {
            "terminalExitCodes": f"by {TERMINAL_EXIT_CODES_ANNOTATION}",
            "retryableExitCodes": f"by {RETRYABLE_EXIT_CODES_ANNOTATION}",
            "workload": f"by workload failure pattern {self.index}",
            "operator": f"by failure table row {self.index}",
            "none": "as no failure pattern matched",
        }[self.source]
        return f"pod {pod} failed with {self.code}: {self.failure_class} {where}"


def own_code(facts: FailureFacts) -> str:
    """The code a failure has of itself: ``Signal:SIGKILL``, ``ExitCode:1``, else the pod's
    reason (when it is a valid code), else ``Unknown``."""
    first = facts.first_failed
    if first is not None and first.exit_code is not None:
        return f"Signal:{first.signal}" if first.signal else f"ExitCode:{first.exit_code}"
    if CODE_PATTERN.fullmatch(facts.reason):
        return facts.reason
    return "Unknown"


def classify(
    facts: FailureFacts,
    *,
    exit_codes: ExitCodePolicy,
    workload: Sequence[FailurePattern] = (),
    table: Sequence[FailurePattern] = (),
) -> Classification:
    """The class and code of one failed pod (see the module docstring for the order)."""
    codes = facts.exit_codes(init=False)
    for code in codes:
        if exit_codes.is_terminal(code):
            source: Source = "terminalExitCodes" if code in exit_codes.terminal else "retryableExitCodes"
            return Classification(FailureClass.PERMANENT, f"ExitCode:{code}", source)
    # Listed by the workload as retryable (and, being past the loop, none is terminal).
    retryable = next((code for code in codes if code in exit_codes.retryable), None)

    found = _first_match(facts, workload, "workload") or _first_match(facts, table, "operator")
    if found is None:
        found = Classification(FailureClass.UNKNOWN, own_code(facts), "none")
    if retryable is not None and found.failure_class is FailureClass.PERMANENT:
        return Classification(FailureClass.UNKNOWN, f"ExitCode:{retryable}", "retryableExitCodes")
    return found


def _first_match(
    facts: FailureFacts, patterns: Sequence[FailurePattern], source: Source
) -> Classification | None:
    for index, pattern in enumerate(patterns):
        if pattern.matches(facts):
            code = pattern.code if pattern.code is not None else own_code(facts)
            return Classification(pattern.failure_class, code, source, index)
    return None
