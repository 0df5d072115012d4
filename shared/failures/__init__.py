"""Failure classes: every pod failure gets a class (Transient, Permanent, Unknown) and a code.

* :mod:`~shared.failures.facts`: what a failure is judged on;
* :mod:`~shared.failures.patterns`: the pattern syntax (v1) and matching;
* :mod:`~shared.failures.defaults`: the default table;
* :mod:`~shared.failures.classify`: the order of precedence, and the classification itself;
* :mod:`~shared.failures.annotation`: a workload's own patterns and transient retry limit;
* :mod:`~shared.failures.budget`: retry or fail, counted or not;
* :mod:`~shared.failures.blame`: application fault or infrastructure fault, and which nodes.

All of it is pure (docs/failures.md).
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.failures.defaults import DEFAULT_PATTERNS
from shared.failures.patterns import FailurePattern

__all__ = ["failure_table"]


def failure_table(
    operator: Sequence[FailurePattern] = (), *, replace_defaults: bool = False
) -> tuple[FailurePattern, ...]:
    """The operator's table: its own patterns ahead of the defaults, or instead of them."""
    return tuple(operator) if replace_defaults else (*operator, *DEFAULT_PATTERNS)
