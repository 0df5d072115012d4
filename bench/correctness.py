"""Did every fault lead to exactly one reset, and is nothing left behind?

Judged from a fresh LIST of the namespace, not from the watches: the watches are the benchmark's
own bookkeeping, and a verdict on the controller must not rest on them alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.session import COMPONENTS, Session
from bench.tracker import AwRec, Fault, Tracker
from shared.appwrapper.constants import APPWRAPPER_LABEL

# The lists of violations in a result's "correctness"; any entry in one fails the run.
VIOLATIONS = (
    "lost",
    "duplicated",
    "unexpected",
    "count_mismatches",
    "wrong_phase",
    "orphans",
    "unrecovered",
    "orphans_after_delete",
)


def _by_owner(items: Sequence[dict[str, Any]], into: dict[str, list[dict[str, Any]]]) -> None:
    for item in items:
        into.setdefault((item["metadata"].get("labels") or {}).get(APPWRAPPER_LABEL, ""), []).append(item)


async def end_state(session: Session, tracker: Tracker, t_start: float) -> dict[str, Any]:
    """Resets and counts per AppWrapper, and leftovers, from a fresh LIST (not the watches)."""
    aws = {a["metadata"]["name"]: a for a in await session.listing("aw")}
    pods: dict[str, list[dict[str, Any]]] = {}
    _by_owner(await session.listing("pod"), pods)
    comps: dict[str, list[dict[str, Any]]] = {}
    for key in COMPONENTS:
        _by_owner(await session.listing(key), comps)
    lost: list[str] = []
    duplicated: list[str] = []
    unexpected: list[str] = []
    mismatched: list[str] = []
    orphans: list[str] = []
    wrong_phase: list[str] = []
    for name, rec in sorted(tracker.aws.items()):
        expected = len(rec.faults)
        if rec.resets < expected:
            lost.append(f"{name}: {rec.resets} resets for {expected} faults")
        elif rec.resets > expected:
            (duplicated if expected else unexpected).append(
                f"{name}: {rec.resets} resets for {expected} faults"
            )
        body = aws.get(name)
        if body is None:
            wrong_phase.append(f"{name}: gone")
            continue
        status = body.get("status") or {}
        counted = sum(1 for f in rec.faults if f.counted)
        if int(status.get("resettingCount") or 0) != counted:
            mismatched.append(
                f"{name}: resettingCount {status.get('resettingCount')} for {counted} counted faults"
            )
        want = "Failed" if rec.spec.kind == "stuck-init" else "Running"
        if status.get("phase") != want:
            wrong_phase.append(f"{name}: {status.get('phase')} (expected {want})")
        mine = pods.get(name, [])
        live = [p for p in mine if not p["metadata"].get("deletionTimestamp")]
        components = comps.get(name, [])
        if want == "Failed":
            if mine or components:
                orphans.append(f"{name} (Failed): {len(mine)} pods, {len(components)} components left")
        elif len(mine) != rec.spec.pods or len(components) != 1:
            orphans.append(
                f"{name}: {len(mine)} pods ({len(live)} live) for {rec.spec.pods}, "
                f"{len(components)} components"
            )
    suspects = {item.split(":", 1)[0] for item in lost + duplicated + unexpected + mismatched + wrong_phase}
    timelines = {
        name: timeline(tracker.aws[name], t_start) for name in sorted(suspects) if name in tracker.aws
    }
    for owner, items in sorted({**pods, **comps}.items()):
        if owner not in tracker.aws:
            orphans.append(f"{len(items)} objects labelled for unknown AppWrapper {owner!r}")

    def status_of(name: str) -> dict[str, Any]:
        return (aws.get(name) or {}).get("status") or {}

    return {
        "lost": lost,
        "duplicated": duplicated,
        "unexpected": unexpected,
        "count_mismatches": mismatched,
        "wrong_phase": wrong_phase,
        "orphans": orphans,
        "timelines": timelines,
        "per_appwrapper": {
            name: {
                "faults": len(rec.faults),
                "counted_faults": sum(1 for f in rec.faults if f.counted),
                "resets": rec.resets,
                "resettingCount": int(status_of(name).get("resettingCount") or 0),
                "phase": status_of(name).get("phase"),
            }
            for name, rec in sorted(tracker.aws.items())
            if rec.faults or rec.resets
        },
    }


def timeline(rec: AwRec, t_start: float) -> list[str]:
    """What happened to one AppWrapper, seconds from the start of the run."""
    events = [
        (t, f"phase={p} resettingCount={c}" + (f" Unhealthy={r}" if r else "")) for t, p, c, r in rec.history
    ]
    events += [(t, f"verdict {state} {reason} (count {count})") for t, state, reason, count in rec.verdicts]
    events += [(f.t0, f"FAULT {f.id} {f.kind} {f.pod or f.node}") for f in rec.faults]
    return [f"{t - t_start:8.3f}s {what}" for t, what in sorted(events)]


def judge(
    end: dict[str, Any], faults: Sequence[Fault], after_delete: list[str], *, settled: bool
) -> dict[str, Any]:
    """The result's "correctness": the end state, the faults never over, what the clean-up left,
    and "ok" when the fault phase settled without a single violation."""
    unrecovered = [f"fault {f.id} ({f.kind} on {f.aw})" for f in faults if f.t_done is None]
    out = {**end, "unrecovered": unrecovered, "orphans_after_delete": after_delete}
    out["ok"] = settled and not any(v for k, v in out.items() if k in VIOLATIONS)
    return out
