"""Cost samples: the API server's request counters, the processes' CPU time and the NATS streams'
sequence numbers at one instant, and the rates between two such instants."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
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


def api_requests(metrics_text: str) -> dict[str, float]:
    """apiserver_request_total (the API server's own request counter) per "VERB resource"."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == "apiserver_request_total":
                labels = sample.labels
                resource = labels.get("resource", "") + (
                    "/" + labels["subresource"] if labels.get("subresource") else ""
                )
                key = f"{labels.get('verb', '')} {resource or '-'}"
                out[key] = out.get(key, 0.0) + sample.value
    return out


@dataclass
class Snapshot:
    wall: float
    api: dict[str, float]
    cpu: dict[str, float]
    nats: dict[str, int]


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


def mark(phase: str, processes: Mapping[str, int]) -> Mark:
    return Mark(phase, time.monotonic(), cpu_seconds(processes))


class Sampler:
    """Takes snapshots of the controller's and the testbed's processes, the API server and NATS."""

    def __init__(self, kubeconfig: Path, processes: Mapping[str, int], js: Any = None) -> None:
        self.kubeconfig = kubeconfig
        self.processes = dict(processes)
        self.js = js

    async def snapshot(self, *, api: bool = True) -> Snapshot:
        by_request: dict[str, float] = {}
        if api:
            text = (await asyncio.to_thread(kubectl, self.kubeconfig, "get", "--raw", "/metrics")).stdout
            by_request = api_requests(text)
        return Snapshot(time.time(), by_request, cpu_seconds(self.processes), await self.stream_seqs())

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
