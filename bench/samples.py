"""Cost samples: the API server's request counters, the processes' CPU time and the NATS streams'
sequence numbers at one instant, and the rates between two such instants."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench.procstat import cpu_seconds
from respawn.testbed.cluster import kubectl
from shared import subjects

# Every stream a Respawn service publishes to: their sequence numbers count its messages.
STREAMS = (
    subjects.OBSERVATIONS_STREAM,
    subjects.VERDICTS_STREAM,
    subjects.NODE_VERDICTS_STREAM,
    subjects.LIFECYCLE_STREAM,
    subjects.DEAD_LETTER_STREAM,
)


def _request_key(labels: Mapping[str, str]) -> str:
    """ "VERB resource[/subresource]" of one of the API server's request series."""
    resource = labels.get("resource", "") + ("/" + labels["subresource"] if labels.get("subresource") else "")
    return f"{labels.get('verb', '')} {resource or '-'}"


def api_requests(metrics_text: str) -> dict[str, float]:
    """apiserver_request_total (the API server's own request counter) per "VERB resource"."""
    return api_metrics(metrics_text)[0]


# The API server's own time to serve a request (apiserver_request_duration_seconds: from the
# request's arrival to its answer, watches excluded), per "VERB resource": cumulative count per
# bucket bound (seconds; +Inf included).
Buckets = dict[str, dict[float, float]]


def api_metrics(metrics_text: str) -> tuple[dict[str, float], Buckets]:
    """apiserver_request_total and apiserver_request_duration_seconds's buckets per "VERB
    resource", from one scrape of the API server's metrics."""
    requests: dict[str, float] = {}
    durations: Buckets = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == "apiserver_request_total":
                key = _request_key(sample.labels)
                requests[key] = requests.get(key, 0.0) + sample.value
            elif sample.name == "apiserver_request_duration_seconds_bucket":
                if sample.labels.get("verb") == "WATCH":
                    continue
                buckets = durations.setdefault(_request_key(sample.labels), {})
                le = float(sample.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + sample.value
    return requests, durations


def quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """The ``q`` quantile of a histogram given as cumulative counts per bucket bound, linearly
    interpolated within its bucket (as Prometheus's histogram_quantile); the largest finite bound
    when it falls in the +Inf bucket; None for no observations."""
    bounds = sorted(buckets)
    total = buckets.get(math.inf, buckets[bounds[-1]] if bounds else 0.0)
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


def latency_between(a: Buckets, b: Buckets, *, min_count: int = 1) -> dict[str, dict[str, float | None]]:
    """Per "VERB resource" served between two scrapes at least ``min_count`` times: how many, and
    the API server's own p50 / p90 / p99 time to serve them in milliseconds (bucket-interpolated:
    good to the width of the bucket it falls in), most frequent first."""
    out: dict[str, dict[str, float | None]] = {}
    for key, after in b.items():
        before = a.get(key, {})
        diff = {le: n - before.get(le, 0.0) for le, n in after.items()}
        count = diff.get(math.inf, 0.0)
        if count < min_count:
            continue
        out[key] = {"count": count}
        for name, q in (("p50_ms", 0.5), ("p90_ms", 0.9), ("p99_ms", 0.99)):
            value = quantile(q, diff)
            out[key][name] = None if value is None else round(value * 1000, 1)
    return dict(sorted(out.items(), key=lambda kv: -(kv[1]["count"] or 0.0)))


def host_cpu() -> tuple[float, float]:
    """(busy, all) clock ticks of every core since boot (/proc/stat): the whole machine's load,
    whatever runs on it (iowait counts as idle)."""
    with open("/proc/stat", encoding="ascii") as f:
        fields = [float(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
    # guest time is already counted in user time
    total = sum(fields[:8])
    return total - idle, total


@dataclass
class Snapshot:
    wall: float
    api: dict[str, float]
    cpu: dict[str, float]
    nats: dict[str, int]
    api_latency: Buckets = field(default_factory=dict)


@dataclass
class Window:
    seconds: float
    api_per_min: dict[str, float]
    cpu_percent: dict[str, float]
    nats_per_min: dict[str, float]

    @classmethod
    def between(cls, a: Snapshot, b: Snapshot) -> Window:
        span = max(b.wall - a.wall, 1e-9)
        per_min = 60.0 / span
        return cls(
            seconds=span,
            api_per_min={v: (b.api.get(v, 0.0) - a.api.get(v, 0.0)) * per_min for v in b.api},
            cpu_percent={p: (b.cpu[p] - a.cpu.get(p, b.cpu[p])) / span * 100 for p in b.cpu},
            nats_per_min={s: (b.nats[s] - a.nats.get(s, b.nats[s])) * per_min for s in b.nats},
        )


@dataclass(frozen=True)
class Mark:
    """The end of one phase of a run (``start``: the beginning of the first): when, and the CPU
    seconds each controller process had used by then. Two marks in a row bound a phase."""

    phase: str
    wall: float  # time.monotonic()
    cpu: dict[str, float]
    host: tuple[float, float] = (0.0, 0.0)  # host_cpu()


def mark(phase: str, processes: Mapping[str, int]) -> Mark:
    return Mark(phase, time.monotonic(), cpu_seconds(processes), host_cpu())


class Sampler:
    """Takes snapshots of the controller's and the testbed's processes, the API server and NATS."""

    def __init__(self, kubeconfig: Path, processes: Mapping[str, int], js: Any = None) -> None:
        self.kubeconfig = kubeconfig
        self.processes = dict(processes)
        self.js = js

    async def snapshot(self, *, api: bool = True) -> Snapshot:
        by_request: dict[str, float] = {}
        durations: Buckets = {}
        if api:
            text = (await asyncio.to_thread(kubectl, self.kubeconfig, "get", "--raw", "/metrics")).stdout
            by_request, durations = api_metrics(text)
        return Snapshot(
            time.time(), by_request, cpu_seconds(self.processes), await self.stream_seqs(), durations
        )

    async def window(self, seconds: float) -> Window:
        """The rates over the next ``seconds``."""
        a = await self.snapshot()
        await asyncio.sleep(seconds)
        b = await self.snapshot()
        return Window.between(a, b)

    async def stream_seqs(self) -> dict[str, int]:
        out: dict[str, int] = {}
        if self.js is None:
            return out
        for stream in STREAMS:
            with contextlib.suppress(Exception):  # a stream the controller does not use
                out[stream] = int((await self.js.stream_info(stream)).state.last_seq)
        return out
