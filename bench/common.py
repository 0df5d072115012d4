"""Small helpers shared by the benchmark scripts: process CPU/RSS and percentiles."""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from dataclasses import dataclass

_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcUsage:
    cpu_seconds: float
    rss_mib: float
    peak_rss_mib: float


def usage(pid: int) -> ProcUsage:
    """CPU time (user+system) and current/peak RSS of a live process, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / _TICKS
    rss = peak = 0.0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
            elif line.startswith("VmHWM:"):
                peak = int(line.split()[1]) / 1024
    return ProcUsage(cpu, rss, peak)


def percentiles(samples: list[float]) -> dict[str, float]:
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


async def settle(
    pids: dict[str, int], *, quiet: float = 0.05, window: float = 2.0, limit: float = 300.0
) -> float:
    """Wait until every process in ``pids`` uses less than ``quiet`` of a core over ``window``
    seconds (set-up work such as reconciling freshly started pods has drained); returns the
    seconds waited. Measuring before that would time the tail of the set-up, not the system
    at steady state."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        before = {name: usage(pid).cpu_seconds for name, pid in pids.items()}
        await asyncio.sleep(window)
        busy = [name for name, pid in pids.items() if usage(pid).cpu_seconds - before[name] > quiet * window]
        if not busy:
            return time.monotonic() - started
    raise TimeoutError(f"services still busy after {limit:.0f}s")
