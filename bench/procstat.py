"""CPU time and memory of processes on this machine, read from /proc, and waiting for them to
go quiet."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Mapping
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


def cpu_seconds(processes: Mapping[str, int]) -> dict[str, float]:
    """CPU seconds of each named process still alive (one that has exited is left out)."""
    out = {}
    for name, pid in processes.items():
        with contextlib.suppress(OSError):
            out[name] = usage(pid).cpu_seconds
    return out


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


def usage_lines(pids: Mapping[str, int]) -> list[str]:
    """One line per process: CPU seconds so far, RSS and peak RSS."""
    lines = []
    for name, pid in sorted(pids.items()):
        u = usage(pid)
        lines.append(
            f"  {name}: cpu {u.cpu_seconds:.1f}s, rss {u.rss_mib:.0f} MiB, peak rss {u.peak_rss_mib:.0f} MiB"
        )
    return lines
