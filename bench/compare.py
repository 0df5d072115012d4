"""Respawn and the upstream AppWrapper controller back to back, with the same seed.

Each controller gets a fresh testbed of the same size (unless --state-dir names one to reuse,
which must then run no Respawn services), the same AppWrappers and the same fault plan;
--replicas applies to Respawn's services only. Prints one table with both and the ratio, a
table of each phase's CPU with the ratio Respawn / upstream, and writes the JSON (and, with
matplotlib installed -- ``pip install -e '.[bench]'`` --, a PNG of the latency distributions)
into --out.

.venv/bin/python -m bench.compare --appwrappers 100 --pods-per-aw 8 --fault-rate 0.2 --duration 120
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench import run, upstream
from bench.config import CONTROLLERS, BenchError, add_arguments, config_from
from bench.report import (
    describe,
    figures,
    format_value,
    phase_rows,
    phase_table,
    testbed_lines,
    violation_lines,
)
from respawn.testbed.errors import TestbedError

RESULTS = Path(__file__).resolve().parent / "results"
# The latencies the plot shows, one panel each (the verdict is drawn into detection's).
PLOTTED = ("detection", "reaction", "recovery")


def result_stem(appwrappers: int, pods_per_aw: int, seed: int, replicas: Sequence[tuple[str, int]]) -> str:
    """The files' common name; replicas other than one of each service are in it (as
    ``-health2-lifecycle2``), so that such a run does not overwrite the default one's results."""
    extra = "".join(f"-{service}{count}" for service, count in replicas if count != 1)
    return f"compare-n{appwrappers}x{pods_per_aw}-seed{seed}{extra}"


def compare_rows(results: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, str, str, str]]:
    """(figure, Respawn, upstream, upstream ÷ Respawn) for every figure either run has."""
    by_controller = {c: {n: (v, u) for n, v, u in figures(r)} for c, r in results.items() if "error" not in r}
    names: list[str] = []
    for c in CONTROLLERS:
        for name in by_controller.get(c, {}):
            if name not in names:
                names.append(name)
    rows = []
    for name in names:
        cells = []
        values: list[float | None] = []
        for c in CONTROLLERS:
            value, unit = by_controller.get(c, {}).get(name, (None, ""))
            values.append(value)
            cells.append(format_value(value, unit) if c in by_controller else "n/a")
        unit = next(
            (u for c in CONTROLLERS for n, (_, u) in by_controller.get(c, {}).items() if n == name), ""
        )
        ours, theirs = values
        ratio = "—"
        if unit != "count" and ours is not None and theirs is not None and ours > 0:
            ratio = f"{theirs / ours:,.1f}x"
        rows.append((name, cells[0], cells[1], ratio))
    return rows


def cpu_phase_rows(results: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, str, str, str, str, str]]:
    """(phase, wall Respawn, wall upstream, CPU-s Respawn, CPU-s upstream, Respawn ÷ upstream)
    for every phase of a run and the whole run: what each controller's processes cost in each
    phase. The ratio is this way round because a cost is compared, not a latency."""
    per_controller = {c: phase_rows(r) for c, r in results.items() if "error" not in r}
    labels = next((rows for rows in per_controller.values()), [])
    out = []
    for i, (label, _, _) in enumerate(labels):
        walls: list[str] = []
        cpus: list[float | None] = []
        for c in CONTROLLERS:
            if c not in per_controller:
                walls.append("n/a")
                cpus.append(None)
                continue
            _, wall, cpu = per_controller[c][i]
            walls.append(format_value(wall, "s"))
            cpus.append(cpu)
        ours, theirs = cpus
        ratio = "—" if ours is None or theirs is None or theirs <= 0 else f"{ours / theirs:,.2f}x"
        # Two decimals: a quiet phase costs hundredths of a CPU-second, and the ratio of two
        # values shown as 0.0 would look like a division by zero.
        cells = [
            ("—" if v is None else f"{v:,.2f} cpu-s") if c in per_controller else "n/a"
            for c, v in zip(CONTROLLERS, cpus, strict=True)
        ]
        out.append((label, walls[0], walls[1], cells[0], cells[1], ratio))
    return out


def render(results: Mapping[str, Mapping[str, Any]]) -> str:
    first = next(iter(results.values()))
    lines = [
        f"## {describe(first.get('config', {}))}",
        "",
        "| figure | Respawn | upstream | upstream ÷ Respawn |",
        "|---|---|---|---|",
    ]
    for name, ours, theirs, ratio in compare_rows(results):
        if name.endswith(" n") and ours in ("0", "—", "n/a") and theirs in ("0", "—", "n/a"):
            continue
        lines.append(f"| {name} | {ours} | {theirs} | {ratio} |")
    phases = cpu_phase_rows(results)
    if phases:
        lines.extend(
            [
                "",
                "CPU seconds of the controller's processes per phase:",
                "",
                "| phase | wall Respawn | wall upstream | CPU Respawn | CPU upstream | Respawn ÷ upstream |",
                "|---|---|---|---|---|---|",
            ]
        )
        lines.extend(f"| {' | '.join(row)} |" for row in phases)
    for c in CONTROLLERS:
        r = results.get(c, {})
        # A result saved before the phases were measured has nothing to show per phase.
        if "error" not in r and r.get("cost", {}).get("cpu_phases_s"):
            lines.extend(["", f"{c}, CPU seconds per service and phase (replicas summed):", ""])
            lines.extend(phase_table(r))
    for c in CONTROLLERS:
        r = results.get(c, {})
        if "error" in r:
            lines.append(f"\n{c}: not run: {r['error']}")
            continue
        correctness = r.get("correctness", {})
        verdict = "OK" if correctness.get("ok") else "VIOLATIONS"
        lines.append(f"\n{c} correctness: {verdict}")
        lines.extend(violation_lines(correctness))
        api = r.get("cost", {}).get("api_requests_per_min_idle")
        if api:
            lines.append(f"  idle API requests/min by request: {api['controller_by_request']}")
        lines.extend(f"  {line}" for line in testbed_lines(r))
    return "\n".join(lines)


def plot(results: Mapping[str, Mapping[str, Any]], path: Path) -> bool:
    """Empirical CDFs of each latency, both controllers on one log-scale axis. False without matplotlib."""
    # matplotlib is optional (the bench extra); pyproject's mypy override covers a type check
    # where it is not installed.
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import NullFormatter
    except ImportError:
        return False
    fig, axes = plt.subplots(1, len(PLOTTED), figsize=(5 * len(PLOTTED), 4), constrained_layout=True)
    styles = {"respawn": "tab:blue", "upstream": "tab:orange"}
    for ax, measure in zip(axes, PLOTTED, strict=True):
        series: list[tuple[str, list[float], str, str]] = []
        for c in CONTROLLERS:
            lat = results.get(c, {}).get("latency", {})
            series.append((c, lat.get(measure, {}).get("all", []), styles[c], "-"))
            if measure == "detection" and lat.get("verdict", {}).get("all"):
                series.append((f"{c}: verdict on the stream", lat["verdict"]["all"], styles[c], ":"))
        for label, samples, color, line in series:
            if not samples:
                continue
            ms = sorted(max(s, 1e-4) * 1000 for s in samples)
            ys = [(i + 1) / len(ms) for i in range(len(ms))]
            ax.step(ms, ys, where="post", color=color, linestyle=line, label=f"{label} (n={len(ms)})")
        ax.set_xscale("log")
        # Only decades are labelled: on a narrow range matplotlib labels minor ticks too, and
        # their labels run into each other.
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("milliseconds (log scale)")
        ax.set_ylabel("fraction of faults")
        ax.set_title(measure)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(describe(next(iter(results.values())).get("config", {}), duration=False))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the JSON and PNG go")
    parser.add_argument("--json", action="store_true", help="print the JSON instead of the table")
    parser.add_argument(
        "--load",
        action="append",
        default=[],
        metavar="CONTROLLER=FILE",
        help="use a result saved by an earlier run (its <stem>-<controller>.json) instead of running it",
    )
    args = parser.parse_args(argv)
    stem = result_stem(args.appwrappers, args.pods_per_aw, args.seed, args.replicas)
    args.out.mkdir(parents=True, exist_ok=True)
    loaded = dict(item.split("=", 1) for item in args.load)
    results: dict[str, dict[str, Any]] = {}
    for controller in CONTROLLERS:
        if controller in loaded:
            results[controller] = json.loads(Path(loaded[controller]).read_text())
            continue
        try:
            results[controller] = run.run(config_from(args, controller), args.state_dir)
            # Saved at once: a failure of the next run must not lose this one.
            (args.out / f"{stem}-{controller}.json").write_text(json.dumps(results[controller], default=str))
        except upstream.UpstreamUnavailable as exc:
            print(f"upstream controller not run: {exc}", file=sys.stderr)
            results[controller] = {"controller": controller, "error": str(exc)}
        except (BenchError, TestbedError) as exc:
            print(f"error: {controller}: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
    document = {"results": results, "table": compare_rows(results), "cpu_phases": cpu_phase_rows(results)}
    (args.out / f"{stem}.json").write_text(json.dumps(document, indent=1, default=str))
    png = args.out / f"{stem}.png"
    plotted = plot(results, png)
    print(json.dumps(document, indent=1, default=str) if args.json else render(results))
    print(
        f"wrote {args.out / (stem + '.json')}"
        + (f" and {png}" if plotted else " (no PNG: matplotlib missing)"),
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
