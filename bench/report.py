"""From what a run recorded to what it reports: latency samples, percentiles, cost figures, and
the tables printed for a run (``compare.py`` lines two runs' figures up by name).

Pure functions of the recorded data, except ``cost``, which reads each controller process's peak
RSS at the moment it is called (the end of the run).
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from bench.config import FAULT_KINDS, BenchConfig
from bench.correctness import VIOLATIONS
from bench.procstat import usage
from bench.samples import Snapshot, Window
from bench.tracker import Fault

MEASURES = ("detection", "verdict", "reaction", "recovery")


# ------------------------------------------------------------------ statistics


def percentiles(samples: list[float]) -> dict[str, float]:
    """Nearest-rank percentiles (n, p50, p90, p99, max, mean); {} without samples."""
    if not samples:
        return {}
    ordered = sorted(samples)

    def pct(p: float) -> float:
        index = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
        return ordered[index]

    return {
        "n": float(len(ordered)),
        "p50": pct(50),
        "p90": pct(90),
        "p99": pct(99),
        "max": ordered[-1],
        "mean": statistics.fmean(ordered),
    }


def fmt_ms(stats: dict[str, float]) -> str:
    if not stats:
        return "no samples"
    return (
        f"n={int(stats['n'])} p50={stats['p50'] * 1000:.1f}ms p90={stats['p90'] * 1000:.1f}ms "
        f"p99={stats['p99'] * 1000:.1f}ms max={stats['max'] * 1000:.1f}ms"
    )


# ------------------------------------------------------------------ what the JSON holds


def fault_record(f: Fault) -> dict[str, Any]:
    """One fault as the JSON's "records" hold it: its times as seconds after the fault."""
    keep = ("id", "kind", "aw", "node", "pod", "exit_code", "counted", "timed", "reason")
    out: dict[str, Any] = {k: getattr(f, k) for k in keep}
    for name in ("t_verdict", "t_unhealthy", "t_delete", "t_recovered", "t_done", "deadline"):
        value = getattr(f, name)
        out[name.removeprefix("t_") + "_after_s"] = None if value is None else round(value - f.t0, 4)
    return out


def latencies(faults: Sequence[Fault], cfg: BenchConfig) -> dict[str, dict[str, list[float]]]:
    """Samples in seconds per measure and fault kind ("all" pools the kinds)."""
    pause = cfg.seconds(cfg.retry_pause)
    grace = cfg.seconds(cfg.failure_grace)
    out: dict[str, dict[str, list[float]]] = {m: {} for m in MEASURES}

    def add(measure: str, kind: str, value: float) -> None:
        out[measure].setdefault(kind, []).append(value)
        out[measure].setdefault("all", []).append(value)

    for f in faults:
        if not f.timed:
            continue
        start = f.deadline if f.kind == "stuck-init" else f.t0
        if start is None:
            continue
        if f.t_unhealthy is not None:
            add("detection", f.kind, f.t_unhealthy - start)
        if f.t_verdict is not None:
            add("verdict", f.kind, f.t_verdict - start)
        if f.t_unhealthy is not None and f.t_delete is not None:
            add("reaction", f.kind, f.t_delete - f.t_unhealthy)
        if f.t_recovered is not None:
            add(
                "recovery", f.kind, f.t_recovered - f.t0 - pause - (grace if f.kind == "pod-failure" else 0.0)
            )
    return out


def _counted_requests(key: str) -> bool:
    # Left out of the totals (still shown per request): a WATCH is counted when it ends, every
    # few minutes at random; Events are written by the scheduler and Job controller minutes
    # after set-up (their broadcasters are rate-limited), while neither controller writes one
    # without a transition. Both would make two idle windows differ by dozens a minute.
    return not key.startswith("WATCH") and not key.endswith(" events")


def cost(
    processes: Mapping[str, int],
    start_cpu: Mapping[str, float],
    end_cpu: Mapping[str, float],
    idle: Window | None,
    baseline: Window | None,
    fault_start: Snapshot,
    fault_end: Snapshot,
    faults: int,
) -> dict[str, Any]:
    per_process: dict[str, dict[str, float | None]] = {}
    for name, pid in processes.items():
        peak: float | None = None
        with contextlib.suppress(OSError):
            peak = usage(pid).peak_rss_mib
        per_process[name] = {
            "cpu_s": end_cpu.get(name, 0.0) - start_cpu.get(name, 0.0),
            "cpu_fault_phase_s": fault_end.cpu.get(name, 0.0) - fault_start.cpu.get(name, 0.0),
            "idle_cpu_percent": None if idle is None else idle.cpu_percent.get(name),
            "peak_rss_mib": peak,
        }
    out: dict[str, Any] = {"processes": per_process}
    out["total_cpu_s"] = sum(p["cpu_s"] or 0.0 for p in per_process.values())
    if idle is not None:
        out["idle_cpu_percent_total"] = sum(idle.cpu_percent.get(n, 0.0) for n in processes)
    if idle is not None and baseline is not None:
        keys = sorted(set(idle.api_per_min) | set(baseline.api_per_min))
        by_request = {k: idle.api_per_min.get(k, 0.0) - baseline.api_per_min.get(k, 0.0) for k in keys}
        counted = [k for k in keys if _counted_requests(k)]
        with_controller = sum(idle.api_per_min.get(k, 0.0) for k in counted)
        stopped = sum(baseline.api_per_min.get(k, 0.0) for k in counted)
        out["api_requests_per_min_idle"] = {
            "with_controller": with_controller,
            "controller_stopped": stopped,
            "controller": with_controller - stopped,
            # Differences below one request a minute are noise of the two windows.
            "controller_by_request": {k: round(n, 1) for k, n in by_request.items() if abs(n) >= 1},
        }
        out["nats_messages_per_min_idle"] = sum(idle.nats_per_min.values())
    span = fault_end.wall - fault_start.wall
    delta = {s: fault_end.nats[s] - fault_start.nats.get(s, 0) for s in fault_end.nats}
    idle_rate = 0.0 if idle is None else sum(idle.nats_per_min.values()) / 60.0
    if delta:
        out["nats_messages_fault_phase"] = delta
        out["nats_messages_per_fault"] = (sum(delta.values()) - idle_rate * span) / faults if faults else None
    return out


# ------------------------------------------------------------------ figures and tables


def figures(result: Mapping[str, Any]) -> list[tuple[str, float | None, str]]:
    """(name, value, unit) rows, the same names for every controller (compare.py lines them up)."""
    rows: list[tuple[str, float | None, str]] = []
    lat = result.get("latency", {})
    for measure in MEASURES:
        for kind in ("all", *FAULT_KINDS):
            samples = lat.get(measure, {}).get(kind, [])
            if measure == "recovery" and kind == "stuck-init":
                continue
            if not samples and measure == "verdict":
                continue
            if not samples and kind != "all":
                continue
            stats = percentiles(samples)
            label = f"{measure} {kind}"
            rows.append((f"{label} n", stats.get("n", 0.0), "count"))
            for p in ("p50", "p90", "p99", "max") if kind == "all" else ("p50", "p99"):
                rows.append((f"{label} {p}", stats.get(p), "s"))
    c = result.get("correctness", {})
    faults = result.get("faults", {})
    rows.append(("faults injected", float(sum(faults.get("injected", {}).values())), "count"))
    for kind in FAULT_KINDS:
        rows.append((f"faults injected {kind}", float(faults.get("injected", {}).get(kind, 0)), "count"))
    for key in VIOLATIONS:
        rows.append((f"correctness {key}", float(len(c.get(key, []))), "count"))
    rows.append(("set-up: all running", result.get("setup", {}).get("all_running_s"), "s"))
    rows.append(("set-up: controller reported all ready", result.get("setup", {}).get("all_reported_s"), "s"))
    rows.append(("set-up: then testbed quiet after", result.get("setup", {}).get("testbed_quiet_s"), "s"))
    rows.append(("cleanup: all deleted", result.get("cleanup_s"), "s"))
    cst = result.get("cost", {})
    rows.append(("cpu total (controller)", cst.get("total_cpu_s"), "cpu-s"))
    rows.append(("idle cpu (controller)", cst.get("idle_cpu_percent_total"), "% of a core"))
    for name, p in sorted(cst.get("processes", {}).items()):
        rows.append((f"cpu {name}", p.get("cpu_s"), "cpu-s"))
        rows.append((f"peak rss {name}", p.get("peak_rss_mib"), "MiB"))
    api = cst.get("api_requests_per_min_idle", {})
    by_request = api.get("controller_by_request")
    # From the per-request differences, so results saved before WATCH and Events were left out of
    # the totals read the same way as new ones.
    idle_requests = (
        None if by_request is None else sum(n for k, n in by_request.items() if _counted_requests(k))
    )
    rows.append(("api requests/min idle (controller)", idle_requests, "req/min"))
    rows.append(("nats messages per fault", cst.get("nats_messages_per_fault"), "msg"))
    return rows


def format_value(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if unit == "s":
        return f"{value * 1000:,.1f} ms" if abs(value) < 10 else f"{value:,.1f} s"
    if unit == "count":
        return f"{value:,.0f}"
    return f"{value:,.1f} {unit}"


def describe(cfg: Mapping[str, Any], *, duration: bool = True) -> str:
    """The run's scale and fault load in one line (table headings, the plot's title)."""
    load = f"{cfg.get('fault_rate')} faults/s" + (f" for {cfg.get('duration')}s" if duration else "")
    scale = f"{cfg.get('appwrappers')} AppWrappers x {cfg.get('pods_per_aw')} pods"
    return f"{scale}, {load}, seed {cfg.get('seed')}"


def violation_lines(correctness: Mapping[str, Any]) -> list[str]:
    """The first ten entries of each kind of violation, one line each."""
    return [f"  {key}: {item}" for key in VIOLATIONS for item in correctness.get(key, [])[:10]]


def render(result: Mapping[str, Any]) -> str:
    lines = [
        f"## {result['controller']}: {describe(result.get('config', {}))}",
        "",
        "| figure | value |",
        "|---|---|",
    ]
    for name, value, unit in figures(result):
        if name.endswith(" n") and not value:
            continue
        lines.append(f"| {name} | {format_value(value, unit)} |")
    c = result.get("correctness", {})
    lines.append("")
    lines.append(f"correctness: {'OK' if c.get('ok') else 'VIOLATIONS'}")
    lines.extend(violation_lines(c))
    for name, events in c.get("timelines", {}).items():
        lines.append(f"  timeline of {name}:")
        lines.extend(f"    {event}" for event in events)
    if result.get("logs"):
        lines.append(f"  the testbed's logs are kept in {result['logs']}")
    api = result.get("cost", {}).get("api_requests_per_min_idle")
    if api:
        lines.append(
            f"API requests/min at idle: {api['with_controller']:,.0f} with the controller, "
            f"{api['controller_stopped']:,.0f} with it stopped; by request: {api['controller_by_request']}"
        )
    return "\n".join(lines)
