"""Application fault or infrastructure fault: which nodes, if any, one failed attempt blames.

When every pod of an attempt fails within a few seconds of the others, with the same code, and
none of the failures is ``Transient``, the application failed the same way everywhere (a bug, a
bad input, a wrong argument): no node is to blame, and keeping the next attempt off these nodes
would only shrink where it can run. Otherwise something failed in one place first: the nodes of
the pods that failed first (within the same window of the earliest failure) are blamed, and those
of pods that only followed (a collective operation that timed out because a peer died) are not.

Pure: the failure times come with the failures; no clock is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Final

from shared.failures.patterns import FailureClass

__all__ = ["DEFAULT_WINDOW", "Attribution", "FaultKind", "PodFailure", "attribute"]

DEFAULT_WINDOW: Final = timedelta(seconds=5)


class FaultKind(StrEnum):
    APPLICATION = "Application"
    INFRASTRUCTURE = "Infrastructure"


@dataclass(frozen=True, slots=True)
class PodFailure:
    pod: str
    node: str
    code: str
    failure_class: FailureClass
    # None: not known; such a failure cannot be shown to be simultaneous with the others.
    failed_at: datetime | None


@dataclass(frozen=True, slots=True)
class Attribution:
    kind: FaultKind
    # The nodes to blame (sorted); empty for an application fault.
    nodes: tuple[str, ...]
    message: str


def attribute(
    failures: Sequence[PodFailure], *, pods: int, window: timedelta = DEFAULT_WINDOW
) -> Attribution:
    """Judge one attempt from its failed pods; ``pods`` is how many pods the attempt had."""
    if not failures:
        return Attribution(FaultKind.INFRASTRUCTURE, (), "no failed pods")
    timed = [f.failed_at for f in failures if f.failed_at is not None]
    first = min(timed) if timed else None
    codes = {f.code for f in failures}
    together = first is not None and len(timed) == len(failures) and max(timed) - first <= window
    transient = any(f.failure_class is FailureClass.TRANSIENT for f in failures)
    if len(failures) >= pods and together and len(codes) == 1 and not transient:
        return Attribution(
            FaultKind.APPLICATION,
            (),
            f"all {len(failures)} pods failed with {next(iter(codes))} within {window.total_seconds():g}s: "
            "an application fault, no node blamed",
        )
    # Blame the first to fail, and any whose time is unknown (it cannot be cleared).
    blamed = sorted(
        {
            f.node
            for f in failures
            if f.node and (f.failed_at is None or (first is not None and f.failed_at - first <= window))
        }
    )
    why = (
        "not every pod failed"
        if len(failures) < pods
        else "a transient failure"
        if transient
        else "different codes"
        if len(codes) > 1
        else f"failures more than {window.total_seconds():g}s apart"
    )
    shown = ", ".join(blamed) if blamed else "none (no failed pod had a node)"
    return Attribution(
        FaultKind.INFRASTRUCTURE, tuple(blamed), f"{why}: an infrastructure fault; nodes blamed: {shown}"
    )
