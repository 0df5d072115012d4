"""From what a run recorded to what it reports: latency samples, percentiles, cost figures, and
the tables printed for a run (``compare.py`` lines two runs' figures up by name).

Pure functions of the recorded data, except ``cost``, which reads each controller process's peak
RSS at the moment it is called (the end of the run).

A run's CPU is reported per phase: ``PHASES`` in order cover it from the first AppWrapper
submitted to the last object of the workload gone, so the phases add up to the whole run.
"""

from __future__ import annotations

import contextlib
import itertools
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from bench.config import FAULT_KINDS, BenchConfig
from bench.correctness import VIOLATIONS
from bench.procstat import usage
from bench.samples import Mark, Snapshot, Window
from bench.tracker import Fault
from respawn.testbed.services import service_of

# Measures only Respawn has (its streams); a controller without them shows no row for them.
RESPAWN_ONLY = ("verdict", "decided", "announced")
MEASURES = ("detection", "verdict", "decided", "announced", "reaction", "recovery")
# The phases of a run, in order; each ends where the next begins.
PHASES = ("setup", "catch_up", "idle", "faults", "baseline", "cleanup")
PHASE_LABELS = {
    "setup": "set-up: submission → every AppWrapper running",
    "catch_up": "catch-up: → controller reported ready, testbed quiet",
    "idle": "idle window",
    "faults": "faults: injection → every AppWrapper recovered",
    "baseline": "end state + baseline window (controller stopped)",
    "cleanup": "clean-up: deletion → nothing left",
}
WHOLE_RUN = "whole run"


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
    for name in (
        "t_verdict",
        "t_decided",
        "t_announced",
        "t_unhealthy",
        "t_delete",
        "t_recovered",
        "t_done",
        "deadline",
    ):
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
        if f.t_decided is not None:
            add("decided", f.kind, f.t_decided - start)
        if f.t_announced is not None:
            add("announced", f.kind, f.t_announced - start)
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
    marks: Sequence[Mark] = (),
) -> dict[str, Any]:
    """The cost figures of the JSON's "cost" (bench/README.md, "The JSON"). ``start_cpu`` and
    ``end_cpu`` bound ``cpu_s`` (set-up to the end of the baseline window); ``marks`` bound
    the phases, the first the start of set-up and the last the end of clean-up."""
    per_process: dict[str, dict[str, Any]] = {}
    for name, pid in processes.items():
        peak: float | None = None
        with contextlib.suppress(OSError):
            peak = usage(pid).peak_rss_mib
        per_process[name] = {
            "service": service_name(name),
            "cpu_s": end_cpu.get(name, 0.0) - start_cpu.get(name, 0.0),
            "cpu_fault_phase_s": fault_end.cpu.get(name, 0.0) - fault_start.cpu.get(name, 0.0),
            "idle_cpu_percent": None if idle is None else idle.cpu_percent.get(name),
            "peak_rss_mib": peak,
        }
        if marks:
            per_process[name]["cpu_phases_s"] = phase_cpu(marks, name)
            per_process[name]["cpu_whole_run_s"] = whole_run_cpu(marks, name)
    out: dict[str, Any] = {"processes": per_process}
    out["total_cpu_s"] = sum(p["cpu_s"] or 0.0 for p in per_process.values())
    if marks:
        out["cpu_phases_s"] = {
            phase: round(sum(p["cpu_phases_s"].get(phase) or 0.0 for p in per_process.values()), 3)
            for phase in (m.phase for m in marks[1:])
        }
        out["whole_run_cpu_s"] = round(sum(p["cpu_whole_run_s"] or 0.0 for p in per_process.values()), 3)
    out["services"] = by_service(per_process)
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


def service_name(process: str) -> str:
    """The service a controller process belongs to: ``health`` for ``health`` and its replicas
    ``health-0``, ``health-1``; a process of no Respawn service (upstream's) is its own."""
    return service_of(process) or process


def phase_cpu(marks: Sequence[Mark], process: str) -> dict[str, float | None]:
    """CPU seconds of ``process`` in each phase the marks bound (None: it did not run
    throughout)."""
    return {
        b.phase: round(b.cpu[process] - a.cpu[process], 3) if process in a.cpu and process in b.cpu else None
        for a, b in itertools.pairwise(marks)
    }


def whole_run_cpu(marks: Sequence[Mark], process: str) -> float | None:
    """CPU seconds of ``process`` from the first mark to the last (None: it did not run
    throughout)."""
    if not marks or process not in marks[0].cpu or process not in marks[-1].cpu:
        return None
    return round(marks[-1].cpu[process] - marks[0].cpu[process], 3)


def host_busy(marks: Sequence[Mark]) -> dict[str, float | None]:
    """How busy the machine's cores were in each phase the marks bound, in percent of all of
    them (100: every core busy throughout), whatever ran on them; None without host readings."""
    out: dict[str, float | None] = {}
    for a, b in itertools.pairwise(marks):
        span = b.host[1] - a.host[1]
        out[b.phase] = round((b.host[0] - a.host[0]) / span * 100, 1) if span > 0 else None
    return out


def phase_seconds(marks: Sequence[Mark]) -> dict[str, float]:
    """How long each phase the marks bound took (wall-clock seconds)."""
    return {b.phase: round(b.wall - a.wall, 3) for a, b in itertools.pairwise(marks)}


def sum_known(values: Sequence[float | None]) -> float | None:
    """The sum of the values known (None: none is)."""
    # CPU time is counted in clock ticks (10 ms); three decimals keep float noise out of the JSON.
    known = [v for v in values if v is not None]
    return round(sum(known), 3) if known else None


def by_service(per_process: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The per-process cost figures summed per service (its replicas named in "processes");
    peak RSS both summed (an upper bound of what the service held at once) and of the largest
    replica. A value no process has is None; a process without it is left out of the sum."""
    groups: dict[str, list[str]] = {}
    for name in sorted(per_process):
        groups.setdefault(per_process[name].get("service") or service_name(name), []).append(name)
    out: dict[str, dict[str, Any]] = {}
    for service, names in groups.items():
        procs = [per_process[n] for n in names]
        phases: dict[str, float | None] = {}
        for p in procs:
            for phase, value in (p.get("cpu_phases_s") or {}).items():
                phases[phase] = sum_known([phases.get(phase), value])
        rss = [p["peak_rss_mib"] for p in procs if p.get("peak_rss_mib") is not None]
        out[service] = {
            "processes": names,
            "cpu_s": sum_known([p.get("cpu_s") for p in procs]),
            "cpu_fault_phase_s": sum_known([p.get("cpu_fault_phase_s") for p in procs]),
            "cpu_phases_s": phases,
            "cpu_whole_run_s": sum_known([p.get("cpu_whole_run_s") for p in procs]),
            "idle_cpu_percent": sum_known([p.get("idle_cpu_percent") for p in procs]),
            "peak_rss_mib_sum": sum(rss) if rss else None,
            "peak_rss_mib_max": max(rss) if rss else None,
        }
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
            if not samples and measure in RESPAWN_ONLY:
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
    # "cpu_s": set-up to the end of the baseline window, as every run has reported it; the
    # whole run adds the clean-up (runs saved before the phases were measured have no value).
    rows.append(("cpu set-up to baseline (controller)", cst.get("total_cpu_s"), "cpu-s"))
    rows.append(("cpu whole run incl. clean-up (controller)", cst.get("whole_run_cpu_s"), "cpu-s"))
    rows.append(("idle cpu (controller)", cst.get("idle_cpu_percent_total"), "% of a core"))
    processes = cst.get("processes", {})
    for service, s in services_of(result).items():
        if len(s["processes"]) > 1:
            count = len(s["processes"])
            rows.append((f"cpu {service} ({count} processes)", s.get("cpu_s"), "cpu-s"))
            rows.append((f"peak rss {service} ({count} processes, sum)", s.get("peak_rss_mib_sum"), "MiB"))
    for name, p in sorted(processes.items()):
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


def services_of(result: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The per-service cost figures of a result (computed from its processes for a result saved
    before they were recorded)."""
    cst = result.get("cost", {})
    return cst.get("services") or by_service(cst.get("processes", {}))


def phase_rows(result: Mapping[str, Any]) -> list[tuple[str, float | None, float | None]]:
    """(phase label, wall seconds, controller CPU seconds) for every phase and the whole run; a
    value the result does not have (a run saved before the phases were measured) is None, except
    the set-up's and clean-up's durations, which every run has reported."""
    cst = result.get("cost", {})
    walls = dict(result.get("phases_s") or {})
    walls.setdefault("setup", result.get("setup", {}).get("all_running_s"))
    walls.setdefault("cleanup", result.get("cleanup_s"))
    cpu = cst.get("cpu_phases_s") or {}
    rows = [(PHASE_LABELS[p], walls.get(p), cpu.get(p)) for p in PHASES]
    whole_wall = sum(result["phases_s"].values()) if result.get("phases_s") else None
    rows.append((WHOLE_RUN, whole_wall, cst.get("whole_run_cpu_s")))
    return rows


def _cell(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    return f"{value:,.1f} s" if unit == "s" else f"{value:,.2f}"


def phase_table(result: Mapping[str, Any]) -> list[str]:
    """CPU seconds per phase: the controller's in all, and each service's (its replicas summed)."""
    services = services_of(result)
    names = list(services)
    lines = [
        "| phase | wall | controller CPU-s | " + " | ".join(names) + " |",
        "|---|---|---|" + "---|" * len(names),
    ]
    for (label, wall, cpu), phase in zip(phase_rows(result), (*PHASES, WHOLE_RUN), strict=True):
        cells = [
            _cell(
                s.get("cpu_whole_run_s") if phase == WHOLE_RUN else s.get("cpu_phases_s", {}).get(phase), ""
            )
            for s in services.values()
        ]
        lines.append(f"| {label} | {_cell(wall, 's')} | {_cell(cpu, '')} | " + " | ".join(cells) + " |")
    return lines


def process_table(result: Mapping[str, Any]) -> list[str]:
    """One row per controller process (every replica): its service, CPU seconds per phase and
    over the whole run, and peak RSS."""
    processes = result.get("cost", {}).get("processes", {})
    short = {"setup": "set-up", "catch_up": "catch-up", "idle": "idle", "faults": "faults",
             "baseline": "baseline", "cleanup": "clean-up"}  # fmt: skip
    lines = [
        "| process | service | " + " | ".join(short[p] for p in PHASES) + " | whole run | peak RSS MiB |",
        "|---|---|" + "---|" * (len(PHASES) + 2),
    ]
    for name, p in sorted(processes.items(), key=lambda kv: (service_name(kv[0]), kv[0])):
        phases = p.get("cpu_phases_s") or {}
        cells = [_cell(phases.get(phase), "") for phase in PHASES]
        peak = p.get("peak_rss_mib")
        lines.append(
            f"| {name} | {p.get('service') or service_name(name)} | "
            + " | ".join(cells)
            + f" | {_cell(p.get('cpu_whole_run_s'), '')} | {'—' if peak is None else f'{peak:,.0f}'} |"
        )
    return lines


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


# How many kinds of request the fault phase's API-server latency lines show (the most frequent).
LATENCY_LINES = 8


def testbed_lines(result: Mapping[str, Any]) -> list[str]:
    """Where the testbed itself stood: how busy the machine was per phase, the testbed's own
    processes' CPU per phase, and the API server's own time to serve the fault phase's requests
    (nothing for a result saved before these were measured)."""
    lines: list[str] = []
    cost = result.get("cost", {})
    busy = cost.get("host_busy_percent") or {}
    if busy:
        shown = ", ".join(f"{phase} {'—' if v is None else f'{v:.0f} %'}" for phase, v in busy.items())
        lines.append(f"machine busy per phase (% of all its cores): {shown}")
    testbed = cost.get("testbed_cpu_phases_s") or {}
    for name, phases in testbed.items():
        shown = ", ".join(f"{phase} {_cell(value, 's')}" for phase, value in phases.items())
        lines.append(f"  {name} CPU per phase: {shown}")
    latency = result.get("faults", {}).get("api_server_latency") or {}
    if latency:
        lines.append("the API server's own time to serve, fault phase (count: p50 / p90 / p99 ms):")
        for key, f in list(latency.items())[:LATENCY_LINES]:
            lines.append(f"  {key}: {f['count']:,.0f}: {f['p50_ms']} / {f['p90_ms']} / {f['p99_ms']}")
    return lines


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
    lines.extend(["", "CPU seconds per phase (controller processes; a service's replicas summed):", ""])
    lines.extend(phase_table(result))
    lines.extend(["", "Per process:", ""])
    lines.extend(process_table(result))
    testbed = testbed_lines(result)
    if testbed:
        lines.extend(["", *testbed])
    return "\n".join(lines)
