"""Fault-tolerance benchmark at scale, for Respawn or the upstream AppWrapper controller.

On the local testbed (started here with enough kwok nodes unless --state-dir names a running
one, and torn down afterwards), it submits N AppWrappers -- wrapped batch/v1 Jobs and
PyTorchJobs, a fraction of them requesting GPUs --, waits until every pod runs and the
controller has reported so (PodsReady True everywhere), measures the idle cost, then injects
faults at a Poisson rate through the pod simulation contract:

  pod-failure  a running pod's status is patched to Failed with an exit code (as sim.fail_pod)
  evict        a node under running GPU pods is labelled autopilot.ibm.com/gpuhealth=EVICT; the
               label is removed again once every affected AppWrapper runs elsewhere
  stuck-init   an AppWrapper whose pods never finish their init container is submitted
               (retryLimit 1: one reset when the warmup grace runs out, then Failed)

and measures, from watch events (arrival times at this process) and the API server's timestamps:

  detection    fault written -> AppWrapper Unhealthy=True written (Respawn: also -> verdict on
               the stream); for stuck-init, from the warmup deadline
  reaction     Unhealthy=True -> first delete of the wrapped resource
  recovery     fault -> all pods Running again, minus the configured grace and pause periods
  correctness  every fault led to exactly one reset, resettingCount matches the counted faults,
               no orphaned pods or components (at the end, and after deleting every AppWrapper)
  cost         CPU seconds per phase (set-up, catch-up, idle, faults, baseline, clean-up) and over
               the whole run, and peak RSS, per controller process (every replica) and per
               service, API requests per minute at idle
               (apiserver_request_total with the controller running, minus the same window with
               it stopped), NATS messages per fault (stream sequence numbers)

.venv/bin/python -m bench.run --controller respawn --appwrappers 100 --pods-per-aw 8 \\
    --fault-rate 0.2 --duration 120 [--state-dir DIR] [--seed 1] [--replicas health=2,...] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import resource
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import nats

from bench import report, upstream
from bench.cleanup import delete_all
from bench.config import CONTROLLERS, BenchConfig, BenchError, PlannedFault, add_arguments, config_from
from bench.controller import paused, resume
from bench.correctness import end_state, judge
from bench.driver import Driver
from bench.plan import AwSpec, nodes_needed, plan_faults, plan_workload
from bench.procstat import cpu_seconds, settle
from bench.progress import Log, stderr_log
from bench.samples import Mark, Sampler, Snapshot, Window, latency_between, mark
from bench.session import Session
from bench.testbed import OPERATOR_PROCESSES, ready_nodes, testbed
from bench.tracker import Tracker, subscribe_verdicts, watch
from respawn.testbed.cluster import kubectl
from respawn.testbed.errors import TestbedError
from shared.kube import Kube, KubeApiError

# How long the testbed's controllers may take to go quiet after set-up.
TESTBED_QUIET_LIMIT = 600.0
# The testbed's processes that keep reacting to a set-up for a while: the controller manager
# (Endpoints of the PyTorchJobs' Services, garbage collection) and the training operator (the
# PyTorchJobs' status and Events, about 1,000 writes a minute for minutes after a set-up of
# 10,000 AppWrappers). Their catch-up, counted in the idle window but not in the baseline, would
# be charged to the controller under test, which is woken by every one of those writes.
QUIET_BEFORE_IDLE = ("kube-controller-manager", *OPERATOR_PROCESSES)
# Requests of a kind served fewer times than this in the fault phase have no percentiles worth
# showing (a p99 of 10 is the largest).
FAULT_LATENCY_MIN_COUNT = 20


@dataclass
class Bench:
    """What the phases of one run share."""

    cfg: BenchConfig
    session: Session
    tracker: Tracker
    driver: Driver
    sampler: Sampler
    processes: dict[str, int]  # the controller's
    testbed_processes: dict[str, int]
    log: Log
    t_start: float
    # Where each phase ended (report.PHASES), after the start of set-up: the CPU of each phase.
    marks: list[Mark] = field(default_factory=list)

    def mark(self, phase: str) -> None:
        # The testbed's processes too: where the machine's two cores went in each phase.
        self.marks.append(mark(phase, {**self.processes, **self.testbed_processes}))


@dataclass
class FaultPhase:
    settled: bool
    seconds: float
    start: Snapshot
    end: Snapshot


@dataclass
class Cleanup:
    seconds: float
    left: list[str]  # what was still there when the time ran out
    api_requests: dict[str, float]  # every client's, while the workload was deleted
    # Messages stored in each stream meanwhile (none for a controller that uses no NATS).
    nats_messages: dict[str, int] = field(default_factory=dict)


@dataclass
class CpuReading:
    controller: dict[str, float]  # CPU seconds per process
    bench: float  # this process's


async def run_bench(
    cfg: BenchConfig,
    *,
    kubeconfig: Path,
    nats_url: str,
    processes: Mapping[str, int],
    testbed_processes: Mapping[str, int] | None = None,
    namespace: str | None = None,
    log: Log = stderr_log,
) -> dict[str, Any]:
    """One benchmark run against a testbed on which the controller under test already runs.

    ``processes`` are the controller's processes (measured, and stopped for the baseline
    window); ``namespace`` an existing one to use, else one is created (and deleted).
    """
    workload = plan_workload(cfg)
    planned = plan_faults(cfg)
    ns = namespace or f"bench-{cfg.controller}-{cfg.seed}-{int(time.time())}"
    result: dict[str, Any] = {"controller": cfg.controller, "config": asdict(cfg), "namespace": ns}
    async with contextlib.AsyncExitStack() as stack:
        bench = await connect(
            stack,
            cfg,
            kubeconfig=kubeconfig,
            nats_url=nats_url,
            namespace=ns,
            create_namespace=namespace is None,
            processes=dict(processes),
            testbed_processes=dict(testbed_processes or {}),
            log=log,
        )
        cpu_before = read_cpu(bench)
        bench.mark("start")
        result["setup"] = await set_up(bench, workload)  # marks "setup" when every AppWrapper runs
        bench.mark("catch_up")
        idle = await idle_window(bench)
        bench.mark("idle")
        faults = await fault_phase(bench, planned)
        bench.mark("faults")
        end = await end_state(bench.session, bench.tracker, bench.t_start)
        baseline = await baseline_window(bench)
        cpu_after = read_cpu(bench)
        bench.mark("baseline")
        cleanup = await clean_up(bench)
        bench.mark("cleanup")
        result.update(
            summary(bench, workload, planned, faults, end, cleanup, idle, baseline, cpu_before, cpu_after)
        )
    return result


# ------------------------------------------------------------------ the phases, in order


async def connect(
    stack: contextlib.AsyncExitStack,
    cfg: BenchConfig,
    *,
    kubeconfig: Path,
    nats_url: str,
    namespace: str,
    create_namespace: bool,
    processes: dict[str, int],
    testbed_processes: dict[str, int],
    log: Log,
) -> Bench:
    """Connect to the API server and NATS, and follow the namespace on watches and the verdict
    stream. Everything opened here is closed (and the namespace deleted, and the controller
    resumed) when ``stack`` closes, whatever happened in between."""
    kube = await Kube.connect(kubeconfig)
    stack.push_async_callback(kube.close)
    t_start = time.time()
    if create_namespace:
        stack.push_async_callback(_delete_namespace, kubeconfig, namespace)
    session = await Session.open(kube, kubeconfig, namespace)
    if create_namespace:
        await session.create_namespace()
    tracker = Tracker(cfg.seconds(cfg.warmup_grace))
    driver = Driver(cfg, session, tracker, log)
    # Last in, first out: the labels are lifted and the controller resumed before anything closes.
    stack.push_async_callback(_quietly, functools.partial(driver.lift_evictions, force=True))
    stack.callback(resume, processes)  # never leave the controller stopped
    tasks = await watch(session, tracker)
    stack.push_async_callback(_cancel, tasks)
    nc = await nats.connect(nats_url, name="respawn-bench")
    stack.push_async_callback(_quietly, nc.close)
    await subscribe_verdicts(nc, namespace, tracker)
    sampler = Sampler(kubeconfig, {**processes, **testbed_processes}, nc.jetstream())
    return Bench(cfg, session, tracker, driver, sampler, processes, testbed_processes, log, t_start)


async def set_up(bench: Bench, workload: Sequence[AwSpec]) -> dict[str, Any]:
    """Submit the workload; wait until every AppWrapper runs with all its pods, then until the
    controller has reported so, then for the testbed to go quiet. Returns the set-up's times."""
    cfg, log, ns = bench.cfg, bench.log, bench.session.namespace
    log(f"submitting {len(workload)} AppWrappers x {cfg.pods_per_aw} pods into namespace {ns}")
    t_submit = time.monotonic()
    await bench.driver.submit(workload)
    submit_s = time.monotonic() - t_submit
    if not await bench.driver.wait_all_idle(cfg.setup_timeout, "set-up"):
        ready, total = bench.tracker.workload_idle()
        raise BenchError(f"only {ready}/{total} AppWrappers were running after {cfg.setup_timeout:.0f}s")
    setup_s = time.monotonic() - t_submit
    bench.mark("setup")
    log(f"all {len(workload)} AppWrappers running after {setup_s:.1f}s")
    # Steady state: the controller has also caught up with the start (every PodsReady True).
    remaining = max(0.0, cfg.setup_timeout - setup_s)
    if not await bench.driver.wait_all_idle(remaining, "controller catching up", reported=True):
        ready, total = bench.tracker.workload_idle(reported=True)
        raise BenchError(
            f"the controller reported only {ready}/{total} AppWrappers ready (PodsReady) "
            f"after {cfg.setup_timeout:.0f}s"
        )
    reported_s = time.monotonic() - t_submit
    log(f"the controller reported all ready after {reported_s:.1f}s")
    await asyncio.sleep(cfg.quiesce_seconds)
    quiet_s = await testbed_quiet(bench)
    return {
        "submit_s": submit_s,
        "all_running_s": setup_s,
        "all_reported_s": reported_s,
        "testbed_quiet_s": quiet_s,
    }


async def testbed_quiet(bench: Bench, *, window: float = 5.0) -> float | None:
    """Wait until the controllers the set-up woke are quiet (each < 10 % of a core over ``window``): the
    controller manager and the wrapped kinds' operators. The seconds waited, or None if they were
    not within the limit (the run goes on; the idle figures then include their work)."""
    pids = {name: pid for name, pid in bench.testbed_processes.items() if name in QUIET_BEFORE_IDLE}
    if not pids:
        return 0.0
    names = " and ".join(sorted(pids))
    bench.log(f"waiting for {names} to finish reacting to the set-up")
    try:
        return await settle(pids, quiet=0.1, window=window, limit=TESTBED_QUIET_LIMIT)
    except TimeoutError:
        bench.log(f"{names} still busy after {TESTBED_QUIET_LIMIT:.0f}s; measuring anyway")
        return None


async def idle_window(bench: Bench) -> Window | None:
    """Rates over ``--idle`` seconds with the controller running (None when --idle is 0)."""
    if bench.cfg.idle_seconds <= 0:
        return None
    bench.log(f"idle window ({bench.cfg.idle_seconds:.0f}s, controller running)")
    return await bench.sampler.window(bench.cfg.idle_seconds)


async def fault_phase(bench: Bench, planned: Sequence[PlannedFault]) -> FaultPhase:
    """Inject the planned faults and wait for every AppWrapper to recover."""
    cfg = bench.cfg
    bench.log(f"injecting {len(planned)} faults over {cfg.duration:.0f}s")
    # With the API server's metrics: its own time to serve what it was asked in this phase.
    start = await bench.sampler.snapshot()
    t_faults = time.monotonic()
    settled = await bench.driver.inject_and_settle(planned, cfg.settle_timeout)
    end = await bench.sampler.snapshot()
    seconds = time.monotonic() - t_faults
    bench.log(f"fault phase {'settled' if settled else 'did NOT settle'} after {seconds:.1f}s")
    return FaultPhase(settled, seconds, start, end)


async def baseline_window(bench: Bench) -> Window | None:
    """The idle window again with the controller stopped: what the testbed costs without it."""
    if bench.cfg.idle_seconds <= 0:
        return None
    bench.log(f"baseline window ({bench.cfg.idle_seconds:.0f}s, controller stopped)")
    with paused(bench.processes):
        return await bench.sampler.window(bench.cfg.idle_seconds)


async def clean_up(bench: Bench) -> Cleanup:
    """Delete every AppWrapper and wait until nothing of the workload is left."""
    bench.log("deleting every AppWrapper")
    start = await bench.sampler.snapshot()
    try:
        seconds, left = await delete_all(bench.session, bench.tracker, bench.cfg.cleanup_timeout, bench.log)
    except KubeApiError as exc:  # the run's figures are kept whatever the clean-up does
        seconds, left = float("nan"), [f"clean-up failed: {exc}"]
    end = await bench.sampler.snapshot()
    # Requests of every client (controller, garbage collector, kwok, this benchmark) while the
    # workload was deleted: where a slow clean-up's API time goes.
    requests = {
        k: n - start.api.get(k, 0.0)
        for k, n in end.api.items()
        if not k.startswith("WATCH") and n - start.api.get(k, 0.0) >= 1
    }
    messages = {stream: n - start.nats.get(stream, 0) for stream, n in end.nats.items()}
    return Cleanup(seconds, left, dict(sorted(requests.items(), key=lambda kv: -kv[1])), messages)


# ------------------------------------------------------------------ parts of the result


def describe_workload(workload: Sequence[AwSpec]) -> dict[str, int]:
    return {
        "appwrappers": len(workload),
        "pods": sum(s.pods for s in workload),
        "gpu_appwrappers": sum(1 for s in workload if s.gpu),
        "pytorchjobs": sum(1 for s in workload if s.kind == "pytorchjob"),
    }


def describe_faults(bench: Bench, planned: Sequence[PlannedFault], phase: FaultPhase) -> dict[str, Any]:
    faults = bench.tracker.faults
    return {
        "planned": len(planned),
        "injected": dict(Counter(f.kind for f in faults if f.timed)),
        "late_evict_victims": sum(1 for f in faults if not f.timed),
        "evictions": len(bench.tracker.eviction_log),
        "fell_back_to_pod_failure": dict(bench.driver.fell_back),
        "skipped": dict(bench.driver.skipped),
        "phase_s": phase.seconds,
        "settled": phase.settled,
    }


def read_cpu(bench: Bench) -> CpuReading:
    """CPU seconds so far of the controller's processes and of this one (what the benchmark
    itself cost)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    return CpuReading(cpu_seconds(bench.processes), own.ru_utime + own.ru_stime)


def summary(
    bench: Bench,
    workload: Sequence[AwSpec],
    planned: Sequence[PlannedFault],
    faults: FaultPhase,
    end: dict[str, Any],
    cleanup: Cleanup,
    idle: Window | None,
    baseline: Window | None,
    cpu_before: CpuReading,
    cpu_after: CpuReading,
) -> dict[str, Any]:
    """The result's figures, in the order the JSON has always had them."""
    tracked = bench.tracker.faults
    cost = report.cost(
        bench.processes,
        cpu_before.controller,
        cpu_after.controller,
        idle,
        baseline,
        faults.start,
        faults.end,
        len(tracked),
        bench.marks,
    )
    if idle is not None:
        cost["testbed_idle_cpu_percent"] = {
            k: v for k, v in idle.cpu_percent.items() if k in bench.testbed_processes
        }
    cost["testbed_cpu_phases_s"] = {n: report.phase_cpu(bench.marks, n) for n in bench.testbed_processes}
    cost["host_busy_percent"] = report.host_busy(bench.marks)
    described = describe_faults(bench, planned, faults)
    described["api_server_latency"] = latency_between(
        faults.start.api_latency, faults.end.api_latency, min_count=FAULT_LATENCY_MIN_COUNT
    )
    return {
        "workload": describe_workload(workload),
        "faults": described,
        "records": [report.fault_record(f) for f in tracked],
        "latency": report.latencies(tracked, bench.cfg),
        "correctness": judge(end, tracked, cleanup.left, settled=faults.settled),
        "cleanup_s": cleanup.seconds,
        "phases_s": report.phase_seconds(bench.marks),
        "cleanup_api_requests": cleanup.api_requests,
        "cleanup_nats_messages": cleanup.nats_messages,
        "cost": cost,
        "bench_cpu_s": cpu_after.bench - cpu_before.bench,
    }


# ------------------------------------------------------------------ closing


async def _quietly(step: Callable[..., Awaitable[Any]], *args: Any) -> None:
    """One clean-up step; its failure must not keep the others from running."""
    with contextlib.suppress(Exception):
        await step(*args)


async def _cancel(tasks: Sequence[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _delete_namespace(kubeconfig: Path, ns: str) -> None:
    with contextlib.suppress(Exception):
        await asyncio.to_thread(kubectl, kubeconfig, "delete", "namespace", ns, "--wait=false", check=False)


# ------------------------------------------------------------------ testbed and command line


def run(cfg: BenchConfig, state_dir: Path | None = None, *, log: Log = stderr_log) -> dict[str, Any]:
    """Reuse the running testbed in ``state_dir``, or start one (and tear it down afterwards)."""
    if cfg.controller not in CONTROLLERS:
        raise BenchError(f"--controller must be one of {', '.join(CONTROLLERS)}")
    if cfg.replicas and cfg.controller != "respawn":
        raise BenchError("--replicas counts Respawn's services; the upstream controller is one process")
    needed = cfg.nodes or nodes_needed(cfg, plan_workload(cfg), plan_faults(cfg))
    with testbed(cfg.controller, needed, state_dir, log, dict(cfg.replicas)) as bed:
        result = asyncio.run(
            run_bench(
                cfg,
                kubeconfig=bed.state.kubeconfig,
                nats_url=bed.state.nats_url,
                processes=bed.processes,
                testbed_processes=bed.testbed_processes,
                log=log,
            )
        )
        result["testbed"] = {
            "nodes": needed if bed.own else ready_nodes(bed.state.kubeconfig),
            "reused": not bed.own,
        }
        bed.ok = bool(result["correctness"]["ok"])
        if bed.own and not bed.ok:
            result["logs"] = str(bed.logs)
        return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--controller", choices=CONTROLLERS, required=True)
    add_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    try:
        result = run(config_from(args, args.controller), args.state_dir)
    except (upstream.UpstreamUnavailable, BenchError, TestbedError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    print(json.dumps(result, indent=2, default=str) if args.json else report.render(result))


if __name__ == "__main__":
    main()
