"""Mass start: does the creation of N AppWrappers keep up with the API server?

On one local testbed (started here with enough kwok nodes unless --state-dir names a running one
without Respawn's services, and torn down afterwards) it measures two sides, one after the other:

  ceiling  no Respawn service runs. The benchmark creates, itself, the N objects lifecycle would
           create for the N AppWrappers -- one batch/v1 Job each, rendered by lifecycle's own
           templating (labels, annotations, pod-template hooks) from the same AppWrapper
           manifests -- with as many creates in flight as lifecycle has reconcile workers. This
           is the control plane's own pace: API server, Job controller, scheduler, kwok.
  respawn  the four services run, each its own process; the N AppWrappers are submitted as fast
           as the benchmark can, and lifecycle creates the Jobs.

and reports, side by side, from watch events (arrival times at this process) and the API
server's creationTimestamps:

  Jobs created/s    overall (N over first to last) and the median of 10 s windows, and, for the
                    ceiling, as the client saw its own creates; the AppWrappers' submission rate
  lag               an AppWrapper's first watch event -> its Job's (p50, p99, max)
  all running       first create (ceiling) or submission (Respawn) -> every pod Running
  cost              CPU seconds of each Respawn service and of each control-plane process over the
                    start (-> every pod Running), the catch-up (-> every AppWrapper reported
                    Running, PodsReady) and the clean-up

Each side ends by deleting what it created and waiting until nothing is left. The JSON goes to
bench/results/massstart-n<N>.json (--out DIR elsewhere).

.venv/bin/python -m bench.massstart [--appwrappers 1000] [--pods-per-aw 1] [--state-dir DIR]
    [--nodes N] [--timeout S] [--out DIR] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import report
from bench.cleanup import DELETE_CONCURRENCY, delete_all, wait_gone
from bench.config import BenchConfig, BenchError
from bench.driver import SUBMIT_CONCURRENCY, Driver
from bench.plan import AwSpec, nodes_needed, plan_workload
from bench.procstat import settle
from bench.progress import Log, stderr_log
from bench.samples import Mark, mark
from bench.session import Session
from bench.testbed import TESTBED_PROCESSES, Testbed, ready_nodes, testbed
from bench.tracker import AwRec, Tracker, watch
from bench.workload import appwrapper_manifest
from respawn.testbed.errors import TestbedError
from respawn.testbed.services import install_crd
from services.lifecycle.hooks import hooks_for
from services.lifecycle.templating import PodTemplateHook, component_identity, render_component
from shared.appwrapper.constants import APPWRAPPER_LABEL, COMPONENT_ANNOTATION
from shared.config import ConfigError, load_config
from shared.kube import KubeApiError
from shared.kubetime import parse_kube_time

# The creation rate's windows: long enough to hold many creates, short enough that a run of a
# few minutes has a dozen of them.
WINDOW = 10.0
# How long the testbed's controller manager, and then the freshly started services, may take to
# go quiet before a side starts (the previous side's clean-up, the services' own start-up).
QUIET_LIMIT = 120.0
POLL = 0.25
PROGRESS_EVERY = 15.0
RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class MassConfig:
    appwrappers: int = 1000
    pods_per_aw: int = 1
    nodes: int | None = None
    timeout: float = 3600.0  # each wait of each side: every pod Running, reported, nothing left
    state_dir: Path | None = None
    # The ceiling's creates in flight: lifecycle's reconcile workers, each of which makes at most
    # one create at a time, so lifecycle never has more creates in flight than this. The services
    # started here read the same environment (and RESPAWN_CONFIG): the count lifecycle runs with.
    ceiling_concurrency: int = field(default_factory=lambda: load_config().lifecycle.workers)

    def bench_config(self) -> BenchConfig:
        """The AppWrappers of the start: each one batch/v1 Job, no GPU, no PyTorchJob, with the
        fault-tolerance annotations bench.run gives them (a slow start resets nothing)."""
        return BenchConfig(
            appwrappers=self.appwrappers,
            pods_per_aw=self.pods_per_aw,
            gpu_fraction=0.0,
            pytorch_fraction=0.0,
            idle_seconds=0.0,
            fault_rate=0.0,
            nodes=self.nodes,
        )


class StartTracker(Tracker):
    """The benchmark's view of a namespace (``bench.tracker``), plus when each AppWrapper and its
    Job were first seen, the Jobs' creationTimestamps, and when the last pod started running."""

    def __init__(self, pods: int) -> None:
        super().__init__(0.0)
        self.pods_expected = pods
        self.aw_seen: dict[str, float] = {}  # AppWrapper name -> its first event's arrival
        self.job_seen: dict[str, float] = {}  # AppWrapper name -> its Job's first event's arrival
        self.job_stamps: dict[str, datetime] = {}  # AppWrapper name -> its Job's creationTimestamp
        self.running: set[str] = set()  # uids of the pods Running
        self.t_all_running: float | None = None

    def on_appwrapper(self, etype: str, obj: Mapping[str, Any], now: float) -> None:
        super().on_appwrapper(etype, obj, now)
        name = str(obj.get("metadata", {}).get("name", ""))
        if name in self.aws and etype != "DELETED":
            self.aw_seen.setdefault(name, now)

    def on_component(self, etype: str, obj: Mapping[str, Any], now: float) -> None:
        super().on_component(etype, obj, now)
        meta = obj.get("metadata", {})
        owner = str((meta.get("labels") or {}).get(APPWRAPPER_LABEL, ""))
        if owner in self.aws and etype != "DELETED" and owner not in self.job_seen:
            self.job_seen[owner] = now
            stamp = parse_kube_time(meta.get("creationTimestamp"))
            if stamp is not None:
                self.job_stamps[owner] = stamp

    def on_pod(self, etype: str, obj: Mapping[str, Any], now: float) -> None:
        super().on_pod(etype, obj, now)
        meta = obj.get("metadata", {})
        if self._owner(meta) is None:
            return
        uid = str(meta.get("uid", ""))
        phase = (obj.get("status") or {}).get("phase")
        if etype != "DELETED" and phase == "Running" and not meta.get("deletionTimestamp"):
            self.running.add(uid)
        else:
            self.running.discard(uid)
        if self.t_all_running is None and len(self.running) >= self.pods_expected:
            self.t_all_running = now


# ------------------------------------------------------------------ what is created


def ceiling_job(
    spec: AwSpec, cfg: BenchConfig, namespace: str, hooks: Sequence[PodTemplateHook]
) -> dict[str, Any]:
    """The Job lifecycle would create for ``spec``'s AppWrapper, rendered by lifecycle's own code
    with its pod-template ``hooks``. Without the owner reference: there is no AppWrapper to own
    it, and the garbage collector deletes what names an owner that does not exist."""
    aw = appwrapper_manifest(spec, cfg)
    uid = str(uuid.uuid4())
    aw["metadata"].update(namespace=namespace, uid=uid)
    body = render_component(
        aw,
        0,
        hooks=hooks,
        annotations={COMPONENT_ANNOTATION: component_identity(uid, datetime.now(UTC), 0)},
    )
    body["metadata"].pop("ownerReferences", None)
    return body


# ------------------------------------------------------------------ figures


def creation_rates(times: Sequence[float], t0: float) -> dict[str, Any]:
    """Creation times (watch arrivals, seconds of the wall clock) as rates: N over first to last,
    and per 10 s window from the first; the median counts only whole windows (a window that
    ends after the last creation is cut short), or the overall rate when there is none."""
    if not times:
        return {"n": 0}
    ordered = sorted(times)
    first, last = ordered[0], ordered[-1]
    span = last - first
    overall = len(ordered) / span if span > 0 else None
    whole = int(span // WINDOW)
    counts = [0] * whole
    for t in ordered:
        index = int((t - first) // WINDOW)
        if index < whole:
            counts[index] += 1
    windows = [c / WINDOW for c in counts]
    # The median proper (two windows: their mean), not the nearest rank: a start of a few dozen
    # seconds has only a few windows.
    p50 = statistics.median(windows) if windows else overall
    return {
        "n": len(ordered),
        "first_after_s": round(first - t0, 3),
        "last_after_s": round(last - t0, 3),
        "per_s_overall": overall,
        "per_s_p50_10s": p50,
        "windows_per_s": windows,
    }


def stamp_rate(stamps: Sequence[datetime]) -> dict[str, Any]:
    """N over the creationTimestamps' span, the API server's own clock. The stamps are whole
    seconds, so the span counts the first and the last second both: last - first + 1 s."""
    if not stamps:
        return {"n": 0}
    span = (max(stamps) - min(stamps)).total_seconds() + 1.0
    return {"n": len(stamps), "span_s": span, "per_s": len(stamps) / span}


def cost(marks: Sequence[Mark], controller: Mapping[str, int], cluster: Mapping[str, int]) -> dict[str, Any]:
    """CPU seconds of each process in each phase the marks bound; summed over the control plane
    (``TESTBED_PROCESSES``), over the controller, and per service (its replicas together)."""
    per_process: dict[str, dict[str, Any]] = {
        name: {"service": report.service_name(name), "cpu_phases_s": report.phase_cpu(marks, name)}
        for name in [*controller, *cluster]
    }

    def summed(names: Sequence[str]) -> dict[str, float | None]:
        return {
            m.phase: report.sum_known([per_process[n]["cpu_phases_s"].get(m.phase) for n in names])
            for m in marks[1:]
        }

    return {
        "phases_s": report.phase_seconds(marks),
        "control_plane_cpu_phases_s": summed([n for n in cluster if n in TESTBED_PROCESSES]),
        "controller_cpu_phases_s": summed(list(controller)),
        "processes": per_process,
        "services": {
            service: {"processes": s["processes"], "cpu_phases_s": s["cpu_phases_s"]}
            for service, s in report.by_service({n: per_process[n] for n in controller}).items()
        },
    }


# ------------------------------------------------------------------ one side


@dataclass
class Side:
    name: str
    cfg: MassConfig
    session: Session
    tracker: StartTracker
    controller: dict[str, int]  # the Respawn processes (none for the ceiling)
    cluster: dict[str, int]  # the testbed's own processes
    log: Log

    @property
    def processes(self) -> dict[str, int]:
        return {**self.controller, **self.cluster}

    async def wait(
        self, what: str, done: Callable[[], bool], progress: Callable[[], str], limit: float
    ) -> None:
        deadline = time.monotonic() + limit
        last = time.monotonic()
        while not done():
            if time.monotonic() > deadline:
                raise BenchError(f"{self.name}: {what} not within {limit:.0f}s ({progress()})")
            if time.monotonic() - last > PROGRESS_EVERY:
                self.log(f"{self.name}: {progress()}")
                last = time.monotonic()
            await asyncio.sleep(POLL)

    def progress(self) -> str:
        t = self.tracker
        return (
            f"{len(t.aw_seen)} AppWrappers, {len(t.job_seen)} Jobs, "
            f"{len(t.running)}/{t.pods_expected} pods Running"
        )

    async def create_jobs(self, bodies: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """The ceiling's creates, ``ceiling_concurrency`` in flight; the client's view of them."""
        s = self.session
        sem = asyncio.Semaphore(self.cfg.ceiling_concurrency)
        latencies: list[float] = []

        async def create(body: dict[str, Any]) -> float:
            async with sem:
                sent = time.time()
                await s.kube.create(s.refs["job"], body, s.namespace)
                done = time.time()
                latencies.append(done - sent)
                return done

        t0 = time.time()
        answered = await asyncio.gather(*(create(b) for b in bodies))
        seconds = max(answered) - t0
        return {
            "concurrency": self.cfg.ceiling_concurrency,
            "seconds": seconds,
            "per_s": len(bodies) / seconds if seconds > 0 else None,
            "request_s": report.percentiles(latencies),
        }

    async def delete_jobs(self, names: Sequence[str], limit: float) -> tuple[float, list[str]]:
        """The ceiling's clean-up: every Job deleted (in the background: the garbage collector
        removes the pods), until nothing is left."""
        t = time.monotonic()
        s, sem = self.session, asyncio.Semaphore(DELETE_CONCURRENCY)

        async def delete(name: str) -> None:
            async with sem:
                await s.kube.delete(s.refs["job"], name, s.namespace)

        await asyncio.gather(*(delete(n) for n in names))
        return await wait_gone(s, self.tracker, t, limit)


async def measure(
    side_name: str,
    cfg: MassConfig,
    *,
    kubeconfig: Path,
    controller: Mapping[str, int],
    cluster: Mapping[str, int],
    log: Log = stderr_log,
) -> dict[str, Any]:
    """One side of the benchmark, in a namespace of its own (deleted at the end)."""
    bench_cfg = cfg.bench_config()
    workload = plan_workload(bench_cfg)
    pods = sum(s.pods for s in workload)
    namespace = f"bench-massstart-{side_name}-{int(time.time())}"
    async with contextlib.AsyncExitStack() as stack:
        session = await Session.connect(kubeconfig, namespace)
        stack.push_async_callback(session.close)
        await session.create_namespace()
        stack.push_async_callback(_delete_namespace, session)
        tracker = StartTracker(pods)
        for spec in workload:
            # The ceiling has no AppWrapper: none is waited for in its clean-up.
            tracker.aws[spec.name] = AwRec(spec, gone=side_name == "ceiling")
        tasks = await watch(session, tracker)
        stack.push_async_callback(_cancel, tasks)
        side = Side(side_name, cfg, session, tracker, dict(controller), dict(cluster), log)
        await _quiet(side)

        result: dict[str, Any] = {"namespace": namespace, "appwrappers": len(workload), "pods": pods}
        # Rendered before the clock starts: the ceiling is the control plane's pace, not ours.
        jobs: list[dict[str, Any]] = []
        if side_name == "ceiling":
            hooks = hooks_for(load_config())  # lifecycle's, as it runs here (same environment)
            jobs = [ceiling_job(spec, bench_cfg, namespace, hooks) for spec in workload]
        marks = [mark("begin", side.processes)]
        t0 = time.time()
        if side_name == "ceiling":
            log(f"ceiling: creating {len(jobs)} Jobs, {cfg.ceiling_concurrency} in flight")
            result["client"] = await side.create_jobs(jobs)
        else:
            log(f"respawn: submitting {len(workload)} AppWrappers, {SUBMIT_CONCURRENCY} in flight")
            await Driver(bench_cfg, session, tracker, log).submit(workload)
            seconds = time.time() - t0
            result["submission"] = {
                "concurrency": SUBMIT_CONCURRENCY,
                "seconds": seconds,
                "per_s": len(workload) / seconds if seconds > 0 else None,
            }
        await side.wait(
            "every pod Running", lambda: tracker.t_all_running is not None, side.progress, cfg.timeout
        )
        marks.append(mark("start", side.processes))
        assert tracker.t_all_running is not None
        result["all_pods_running_s"] = tracker.t_all_running - t0
        log(f"{side_name}: every pod Running after {result['all_pods_running_s']:.1f}s")
        result["jobs_created"] = creation_rates(list(tracker.job_seen.values()), t0)
        result["jobs_created_stamps"] = stamp_rate(list(tracker.job_stamps.values()))
        if side_name == "respawn":
            lags = [tracker.job_seen[n] - t for n, t in tracker.aw_seen.items() if n in tracker.job_seen]
            result["lag_s"] = report.percentiles(lags)

            def reported() -> bool:
                ready, total = tracker.workload_idle(reported=True)
                return ready == total

            await side.wait("every AppWrapper reported Running", reported, side.progress, cfg.timeout)
            result["all_reported_s"] = time.time() - t0
            marks.append(mark("catch_up", side.processes))
            log(f"respawn: every AppWrapper reported Running after {result['all_reported_s']:.1f}s")

        log(f"{side_name}: deleting everything")
        try:
            if side_name == "ceiling":
                seconds, left = await side.delete_jobs([j["metadata"]["name"] for j in jobs], cfg.timeout)
            else:
                seconds, left = await delete_all(session, tracker, cfg.timeout, log)
        except KubeApiError as exc:  # the figures are kept whatever the clean-up does
            seconds, left = float("nan"), [f"clean-up failed: {exc}"]
        marks.append(mark("cleanup", side.processes))
        result["cleanup_s"] = seconds
        result["left"] = left
        result["cost"] = cost(marks, side.controller, side.cluster)
        log(f"{side_name}: clean-up took {seconds:.1f}s" + (f", left: {left}" if left else ""))
    return result


async def _quiet(side: Side) -> None:
    """Wait for the controller manager (the previous side's garbage collection), then the
    services (their start-up), to go quiet: their work must not be charged to this start."""
    for name, pids, quiet in (
        (
            "the controller manager",
            {k: v for k, v in side.cluster.items() if k == "kube-controller-manager"},
            0.1,
        ),
        ("the services", side.controller, 0.05),
    ):
        if not pids:
            continue
        try:
            await settle(pids, quiet=quiet, window=2.0, limit=QUIET_LIMIT)
        except TimeoutError:
            side.log(f"{side.name}: {name} still busy after {QUIET_LIMIT:.0f}s; starting anyway")


async def _cancel(tasks: Sequence[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _delete_namespace(session: Session) -> None:
    with contextlib.suppress(Exception):
        await session.kube.delete(await session.kube.resource("v1", "Namespace"), session.namespace)


# ------------------------------------------------------------------ the two sides, the table


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarise(ceiling: Mapping[str, Any], respawn: Mapping[str, Any]) -> dict[str, float | None]:
    """Respawn's creation rates over the ceiling's."""
    c, r = ceiling["jobs_created"], respawn["jobs_created"]
    return {
        "per_s_overall": ratio(r.get("per_s_overall"), c.get("per_s_overall")),
        "per_s_p50_10s": ratio(r.get("per_s_p50_10s"), c.get("per_s_p50_10s")),
        "per_s_stamps": ratio(
            respawn["jobs_created_stamps"].get("per_s"), ceiling["jobs_created_stamps"].get("per_s")
        ),
        "all_pods_running_s": ratio(respawn.get("all_pods_running_s"), ceiling.get("all_pods_running_s")),
    }


def _rate(value: float | None) -> str:
    return "—" if value is None else f"{value:,.1f}/s"


def _secs(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value * 1000:,.0f} ms" if abs(value) < 1 else f"{value:,.1f} s"


def _cpu(value: float | None) -> str:
    return "—" if value is None else f"{value:,.2f}"


def _times(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


def _phase_cpu(side: Mapping[str, Any], name: str, phase: str, *, service: bool = False) -> float | None:
    group = side["cost"]["services" if service else "processes"].get(name) or {}
    value: float | None = (group.get("cpu_phases_s") or {}).get(phase)
    return value


def render(result: Mapping[str, Any]) -> str:
    c, r, q = result["ceiling"], result["respawn"], result["ratio"]
    cfg = result["config"]
    lag = r.get("lag_s") or {}
    rows: list[tuple[str, str, str, str]] = [
        ("AppWrappers submitted (client)", "—", _rate(r["submission"]["per_s"]), ""),
        ("Jobs created, client view", _rate(c["client"]["per_s"]), "—", ""),
        (
            "**Jobs created, overall** (watch: N over first to last)",
            _rate(c["jobs_created"].get("per_s_overall")),
            _rate(r["jobs_created"].get("per_s_overall")),
            _times(q["per_s_overall"]),
        ),
        (
            "Jobs created, overall (creationTimestamps)",
            _rate(c["jobs_created_stamps"].get("per_s")),
            _rate(r["jobs_created_stamps"].get("per_s")),
            _times(q["per_s_stamps"]),
        ),
        (
            f"Jobs created, p50 of {WINDOW:.0f} s windows",
            _rate(c["jobs_created"].get("per_s_p50_10s")),
            _rate(r["jobs_created"].get("per_s_p50_10s")),
            _times(q["per_s_p50_10s"]),
        ),
        (
            "AppWrapper → its Job, p50 / p99 / max",
            "—",
            " / ".join(_secs(lag.get(p)) for p in ("p50", "p99", "max")),
            "",
        ),
        (
            "every Job created after",
            _secs(c["jobs_created"].get("last_after_s")),
            _secs(r["jobs_created"].get("last_after_s")),
            "",
        ),
        (
            "**every pod Running after**",
            _secs(c["all_pods_running_s"]),
            _secs(r["all_pods_running_s"]),
            _times(q["all_pods_running_s"]),
        ),
        ("every AppWrapper reported Running after", "—", _secs(r.get("all_reported_s")), ""),
        ("clean-up: nothing left after", _secs(c["cleanup_s"]), _secs(r["cleanup_s"]), ""),
    ]
    plane_c, plane_r = (side["cost"]["control_plane_cpu_phases_s"].get("start") for side in (c, r))
    rows.append(
        ("**CPU-s control plane, start**", _cpu(plane_c), _cpu(plane_r), _times(ratio(plane_r, plane_c)))
    )
    for name in c["cost"]["processes"]:
        rows.append(
            (
                f"CPU-s {name}, start",
                _cpu(_phase_cpu(c, name, "start")),
                _cpu(_phase_cpu(r, name, "start")),
                _times(ratio(_phase_cpu(r, name, "start"), _phase_cpu(c, name, "start"))),
            )
        )
    own = r["cost"]["controller_cpu_phases_s"]
    rows.append(
        (
            "**CPU-s Respawn's services, start / catch-up**",
            "—",
            f"{_cpu(own.get('start'))} / {_cpu(own.get('catch_up'))}",
            "",
        )
    )
    for service in r["cost"]["services"]:
        rows.append(
            (
                f"CPU-s {service}, start / catch-up",
                "—",
                f"{_cpu(_phase_cpu(r, service, 'start', service=True))} / "
                f"{_cpu(_phase_cpu(r, service, 'catch_up', service=True))}",
                "",
            )
        )
    lines = [
        f"## mass start: {cfg['appwrappers']:,} AppWrappers x {cfg['pods_per_aw']} pod(s), "
        f"{result['testbed']['nodes']} kwok nodes",
        "",
        "| figure | ceiling (no Respawn) | Respawn | Respawn ÷ ceiling |",
        "|---|---|---|---|",
        *(f"| {a} | {b} | {d} | {e} |" for a, b, d, e in rows),
    ]
    for name, side in (("ceiling", c), ("respawn", r)):
        if side["left"]:
            lines.append(f"{name}: left after the clean-up: {', '.join(side['left'])}")
    return "\n".join(lines)


def cluster_processes(bed: Testbed) -> dict[str, int]:
    """The testbed's processes measured on both sides: the control plane's, and nats-server (idle
    on the ceiling's side, Respawn's bus on the other)."""
    out = dict(bed.testbed_processes)
    nats = bed.state.pids.get("nats-server")
    if nats:
        out["nats-server"] = nats
    return out


def run(cfg: MassConfig, *, log: Log = stderr_log) -> dict[str, Any]:
    """The ceiling on the testbed alone, then Respawn's services started on it and the start
    measured again; the services started here are stopped after, a testbed started here torn
    down."""
    bench_cfg = cfg.bench_config()
    nodes = cfg.nodes or nodes_needed(bench_cfg, plan_workload(bench_cfg), [])
    sides: dict[str, dict[str, Any]] = {}
    with testbed("none", nodes, cfg.state_dir, log) as bare:
        kubeconfig = bare.state.kubeconfig
        cluster = cluster_processes(bare)
        # Served on both sides alike: the benchmark's watches (bench.tracker) follow AppWrappers.
        install_crd(kubeconfig)
        sides["ceiling"] = asyncio.run(
            measure(
                "ceiling", cfg, kubeconfig=kubeconfig, controller={}, cluster=bare.testbed_processes, log=log
            )
        )
        # The same testbed, reused: the services are started on it, and stopped again on the way out.
        with testbed("respawn", nodes, bare.state.state_dir, log) as bed:
            sides["respawn"] = asyncio.run(
                measure(
                    "respawn",
                    cfg,
                    kubeconfig=kubeconfig,
                    controller=bed.processes,
                    cluster=cluster,
                    log=log,
                )
            )
        testbed_info = {"nodes": nodes if bare.own else ready_nodes(kubeconfig), "reused": not bare.own}
        bare.ok = not sides["ceiling"]["left"] and not sides["respawn"]["left"]
    config = {
        **{k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()},
        "lifecycle_workers": load_config().lifecycle.workers,
        "submit_concurrency": SUBMIT_CONCURRENCY,
        "window_s": WINDOW,
    }
    return {
        "config": config,
        "testbed": testbed_info,
        **sides,
        "ratio": summarise(sides["ceiling"], sides["respawn"]),
    }


def result_path(out: Path, cfg: MassConfig) -> Path:
    suffix = "" if cfg.pods_per_aw == 1 else f"x{cfg.pods_per_aw}"
    return out / f"massstart-n{cfg.appwrappers}{suffix}.json"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    d = MassConfig  # its plain defaults (building one reads the configuration, below)
    parser.add_argument("--appwrappers", type=int, default=d.appwrappers)
    parser.add_argument("--pods-per-aw", type=int, default=d.pods_per_aw)
    parser.add_argument("--nodes", type=int, default=None, help="kwok nodes (default: from the workload)")
    parser.add_argument(
        "--state-dir", type=Path, default=None, help="reuse the testbed running there (without services)"
    )
    parser.add_argument(
        "--timeout", type=float, default=d.timeout, help="seconds each wait of each side may take"
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the JSON goes")
    parser.add_argument("--json", action="store_true", help="print the result as JSON instead of the table")
    args = parser.parse_args(argv)
    if args.appwrappers < 1 or args.pods_per_aw < 1:
        parser.error("--appwrappers and --pods-per-aw must be at least 1")
    try:
        cfg = MassConfig(
            appwrappers=args.appwrappers,
            pods_per_aw=args.pods_per_aw,
            nodes=args.nodes,
            timeout=args.timeout,
            state_dir=args.state_dir,
        )
        result = run(cfg)
    except (BenchError, TestbedError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    path = result_path(args.out, cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(json.dumps(result, indent=2, default=str) if args.json else render(result))
    stderr_log(f"written to {path}")


if __name__ == "__main__":
    main()
