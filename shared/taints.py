"""What a configured resource taint means, shared by the node-set logic and the affinity injection.

Autopilot does not read real Kubernetes taints: a health checker labels a node (for example
``autopilot.ibm.com/gpuhealth=EVICT``) and the operator configuration maps such label values,
per extended resource, to a taint *effect*. This module holds the effect vocabulary, the order
of strength between effects, and the matching rule, so that the node sets and the injected
anti-affinities can never disagree about which label values count.

Functions here accept any object with ``key``, ``value`` and ``effect`` attributes (the
configuration's ``ResourceTaint`` model is one), so the pure logic does not depend on how the
configuration is loaded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final, Literal, Protocol

Effect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]

NO_SCHEDULE: Final = "NoSchedule"
PREFER_NO_SCHEDULE: Final = "PreferNoSchedule"
NO_EXECUTE: Final = "NoExecute"

# Stronger effects win when one node matches several entries: a node marked for eviction must be
# evicted even if another label only asks to avoid it.
_STRENGTH: Final[Mapping[str, int]] = {PREFER_NO_SCHEDULE: 1, NO_SCHEDULE: 2, NO_EXECUTE: 3}

# Effects that forbid new pods (required anti-affinity) rather than merely discourage them.
REQUIRED_EFFECTS: Final = frozenset({NO_SCHEDULE, NO_EXECUTE})


class TaintSpec(Protocol):
    """One ``resourceTaints`` entry: nodes labelled ``key=value`` get ``effect`` for the resource."""

    @property
    def key(self) -> str: ...

    @property
    def value(self) -> str: ...

    @property
    def effect(self) -> str: ...


ResourceTaints = Mapping[str, Sequence[TaintSpec]]


def strength(effect: str) -> int:
    """Rank of an effect; 0 for anything that is not a known effect."""
    return _STRENGTH.get(effect, 0)


def strongest_effect(labels: Mapping[str, str], taints: Iterable[TaintSpec]) -> Effect | None:
    """The strongest effect among the entries whose label ``key`` equals ``value`` on the node."""
    best: Effect | None = None
    for taint in taints:
        if labels.get(taint.key) != taint.value:
            continue
        effect = taint.effect
        if effect == NO_EXECUTE:
            return NO_EXECUTE
        if effect == NO_SCHEDULE and best != NO_SCHEDULE:
            best = NO_SCHEDULE
        elif effect == PREFER_NO_SCHEDULE and best is None:
            best = PREFER_NO_SCHEDULE
    return best


def values_by_key(taints: Iterable[TaintSpec], effects: frozenset[str]) -> dict[str, list[str]]:
    """Label values per key for the entries with one of ``effects``, in configuration order, deduplicated.

    Order is kept stable so that the injected pod specs are byte-for-byte reproducible, which
    makes re-creation idempotent and diffs readable.
    """
    out: dict[str, list[str]] = {}
    for taint in taints:
        if taint.effect not in effects:
            continue
        values = out.setdefault(taint.key, [])
        if taint.value not in values:
            values.append(taint.value)
    return out
