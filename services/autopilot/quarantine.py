"""Node quarantine: a node blamed for too many infrastructure faults is kept off by every workload.

Pure: a value (:class:`QuarantineBook`) and functions that fold a verdict into it or move it to
a later time, with the clock passed in. The service around it (service.py) reads the verdicts,
publishes the result and keeps the clock.

- **What counts.** An ``Unhealthy`` verdict whose fault is an ``Infrastructure`` one blames the
  nodes in its ``nodes`` field. An application fault, or a verdict that does not say which kind
  it is, blames nobody. Each node counts once per AppWrapper attempt (uid, retry count and start
  of the attempt), so a verdict delivered again, or repeated for the same attempt, counts once.
- **When.** A node blamed ``threshold`` times within ``window`` is due. Due nodes are quarantined
  for ``duration``, the worst first (most failures, then the one due longest), up to the cap,
  ``max_share`` of the known nodes; the others are *held*: reported, not quarantined, until a
  place frees up. The failures that led to a quarantine are used up by it: after the quarantine
  ends (the node is *released*), only failures since it began count again.
- **Dry run.** Decisions are the same, the entries say ``DryRun`` instead of ``Quarantined``, and
  the node verdict's ``no_schedule`` set stays empty, so placement does not change.

Two replicas folding the same verdicts reach the same counts; the quarantine entries themselves
are published (the node verdict of :data:`~shared.messages.QUARANTINE_RESOURCE`), and a replica
that starts, or follows the active one, adopts the stored entries (:func:`adopt`), so a failover
neither ends nor extends a quarantine.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from types import MappingProxyType

from shared.config import NodeQuarantineConfig
from shared.kubetime import as_utc
from shared.messages import QUARANTINE_RESOURCE, NodeVerdict, QuarantinedNode, Verdict

INFRASTRUCTURE = "Infrastructure"
QUARANTINED = "Quarantined"
DRY_RUN = "DryRun"
HELD = "Held"
RELEASED = "Released"
# Entries that take one of the cap's places.
ACTIVE_STATES = frozenset({QUARANTINED, DRY_RUN})

# (AppWrapper uid, attempt, node): what one failure is counted once by.
CountKey = tuple[str, str, str]


@dataclass(frozen=True)
class QuarantinePolicy:
    threshold: int = 3
    window: timedelta = timedelta(hours=1)
    duration: timedelta = timedelta(hours=1)
    max_share: float = 0.1
    dry_run: bool = False

    @classmethod
    def from_config(cls, config: NodeQuarantineConfig) -> QuarantinePolicy:
        return cls(
            threshold=config.threshold,
            window=config.window,
            duration=config.duration,
            max_share=config.max_share,
            dry_run=config.dry_run,
        )

    def cap(self, node_count: int) -> int:
        """How many nodes may be quarantined at once: ``max_share`` of them, rounded down, but
        at least one of two or more nodes while ``max_share`` is above 0 (rounding alone would
        switch quarantine off on every cluster of fewer than 1 / max_share nodes), and never
        the only node."""
        nodes = max(0, node_count)
        # The epsilon keeps 0.3 * 10 from rounding down to 2.
        share = max(0, math.floor(self.max_share * nodes + 1e-9))
        return max(share, 1) if self.max_share > 0 and nodes >= 2 else share


@dataclass(frozen=True)
class Failure:
    """One infrastructure fault blamed on a node."""

    at: datetime
    workload: str
    key: CountKey


@dataclass(frozen=True)
class QuarantineBook:
    """Failures per node within the window, what was counted, and the quarantine entries."""

    failures: Mapping[str, tuple[Failure, ...]] = field(default_factory=lambda: MappingProxyType({}))
    counted: Mapping[CountKey, datetime] = field(default_factory=lambda: MappingProxyType({}))
    entries: Mapping[str, QuarantinedNode] = field(default_factory=lambda: MappingProxyType({}))
    # The latest time the book was moved to: time never goes back for it, whatever the order in
    # which verdicts (stamped by several health replicas) arrive.
    clock: datetime | None = None

    def quarantined(self) -> frozenset[str]:
        """Nodes kept off (not in a dry run)."""
        return frozenset(n for n, e in self.entries.items() if e.state == QUARANTINED)

    def active(self) -> frozenset[str]:
        """Nodes that take a place under the cap (quarantined, or would be in a dry run)."""
        return frozenset(n for n, e in self.entries.items() if e.state in ACTIVE_STATES)

    def held(self) -> frozenset[str]:
        return frozenset(n for n, e in self.entries.items() if e.state == HELD)

    def count(self, node: str) -> int:
        return len(self.failures.get(node, ()))


def attempt_of(verdict: Verdict) -> str:
    """The attempt a verdict judges. An Autopilot migration resets without counting a retry, so
    the retry count alone would merge two attempts; the attempt's start tells them apart."""
    started = as_utc(verdict.attempt_started_at).isoformat() if verdict.attempt_started_at else ""
    return f"{verdict.resetting_count}@{started}"


def blamed_nodes(verdict: Verdict) -> tuple[str, ...]:
    """The nodes a verdict blames: those of an Unhealthy verdict about an infrastructure fault."""
    if verdict.state != "Unhealthy" or verdict.fault_kind != INFRASTRUCTURE:
        return ()
    return tuple(sorted({n for n in verdict.nodes if n}))


def _consumed(entry: QuarantinedNode | None, at: datetime) -> bool:
    """Whether a failure at ``at`` was already used up by the node's (current or last) quarantine."""
    return entry is not None and entry.state != HELD and as_utc(at) <= as_utc(entry.since)


def record(book: QuarantineBook, verdict: Verdict, policy: QuarantinePolicy, now: datetime) -> QuarantineBook:
    """Count the nodes ``verdict`` blames (each once per attempt); decides nothing (see :func:`settle`)."""
    nodes = blamed_nodes(verdict)
    if not nodes:
        return book
    at = as_utc(verdict.decided_at)
    now = _later(book.clock, now)
    if at <= now - policy.window:
        return book
    workload = f"{verdict.ref.namespace}/{verdict.ref.name}"
    attempt = attempt_of(verdict)
    failures = dict(book.failures)
    counted = dict(book.counted)
    changed = False
    for node in nodes:
        key = (verdict.ref.uid, attempt, node)
        if key in counted:
            # A repeat keeps the key for a window from its latest sighting, so that a repeat
            # arriving later still finds it, however the deliveries are spaced.
            if at > counted[key]:
                counted[key] = at
                changed = True
            continue
        if _consumed(book.entries.get(node), at):
            continue
        counted[key] = at
        changed = True
        failures[node] = tuple(sorted((*failures.get(node, ()), Failure(at, workload, key)), key=_order))
    if not changed:
        return book
    return replace(book, failures=MappingProxyType(failures), counted=MappingProxyType(counted))


def _order(failure: Failure) -> tuple[datetime, CountKey]:
    return (failure.at, failure.key)


def _later(clock: datetime | None, now: datetime) -> datetime:
    now = as_utc(now)
    return now if clock is None else max(as_utc(clock), now)


def _rank(node: str, failures: tuple[Failure, ...], threshold: int) -> tuple[int, datetime, str]:
    # Worst first: the most failures, then the one due the longest, then by name (a fixed order).
    return (-len(failures), failures[threshold - 1].at, node)


def settle(book: QuarantineBook, policy: QuarantinePolicy, now: datetime, node_count: int) -> QuarantineBook:
    """Move ``book`` to ``now``: end the quarantines that ran out, forget what left the window, and
    quarantine (or hold, past the cap of ``node_count`` nodes) the nodes that are due."""
    now = _later(book.clock, now)
    horizon = now - policy.window
    entries: dict[str, QuarantinedNode] = {}
    for node, entry in book.entries.items():
        if entry.state in ACTIVE_STATES and entry.until is not None and as_utc(entry.until) <= now:
            entry = entry.model_copy(update={"state": RELEASED})
        if entry.state == RELEASED and as_utc(entry.since) <= horizon:
            continue  # every failure it used up has left the window: nothing left to remember
        entries[node] = entry
    failures = {
        node: kept
        for node, items in book.failures.items()
        if (kept := tuple(f for f in items if f.at > horizon))
    }
    counted = {key: at for key, at in book.counted.items() if at > horizon}
    due = sorted(
        (
            _rank(node, items, policy.threshold)
            for node, items in failures.items()
            if len(items) >= policy.threshold and entries.get(node, _NONE).state not in ACTIVE_STATES
        )
    )
    places = policy.cap(node_count) - sum(1 for e in entries.values() if e.state in ACTIVE_STATES)
    due_nodes: set[str] = set()
    for _, _, node in due:
        due_nodes.add(node)
        items = failures[node]
        workloads = tuple(sorted({f.workload for f in items}))
        if places > 0:
            places -= 1
            entries[node] = QuarantinedNode(
                node=node,
                state=DRY_RUN if policy.dry_run else QUARANTINED,
                failures=len(items),
                workloads=workloads,
                since=now,
                until=now + policy.duration,
            )
            del failures[node]  # used up by this quarantine
        else:
            previous = entries.get(node)
            since = previous.since if previous is not None and previous.state == HELD else now
            entries[node] = QuarantinedNode(
                node=node, state=HELD, failures=len(items), workloads=workloads, since=since
            )
    for node in [n for n, e in entries.items() if e.state == HELD and n not in due_nodes]:
        del entries[node]  # no longer due: its failures left the window
    return QuarantineBook(
        failures=MappingProxyType(failures),
        counted=MappingProxyType(counted),
        entries=MappingProxyType(entries),
        clock=now,
    )


_NONE = QuarantinedNode(node="", state=HELD, since=datetime.min)


def observe(
    book: QuarantineBook, verdict: Verdict, policy: QuarantinePolicy, now: datetime, node_count: int
) -> QuarantineBook:
    """Fold one verdict in and settle at ``now``."""
    return settle(record(book, verdict, policy, now), policy, now, node_count)


def adopt(book: QuarantineBook, entries: Iterable[QuarantinedNode]) -> QuarantineBook:
    """Take the stored quarantine entries as this replica's own (at start-up, or following the
    active replica): the failures they used up stop counting."""
    adopted = {e.node: e for e in entries}
    failures = {
        node: kept
        for node, items in book.failures.items()
        if (kept := tuple(f for f in items if not _consumed(adopted.get(node), f.at)))
    }
    return replace(book, failures=MappingProxyType(failures), entries=MappingProxyType(adopted))


def entries_of(book: QuarantineBook) -> tuple[QuarantinedNode, ...]:
    return tuple(book.entries[n] for n in sorted(book.entries))


def quarantine_verdict(book: QuarantineBook, now: datetime) -> NodeVerdict:
    """The node verdict that publishes ``book``: its quarantined nodes as the NoSchedule set."""
    return NodeVerdict(
        resource=QUARANTINE_RESOURCE,
        no_schedule=tuple(sorted(book.quarantined())),
        decided_at=now,
        quarantine=entries_of(book),
    )


def failure_counts(book: QuarantineBook) -> Mapping[str, int]:
    """Failures counted per node within the window (nodes with none are absent)."""
    return {node: len(items) for node, items in book.failures.items() if items}
