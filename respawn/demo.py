"""`make demo`: the local stack, the four services, a realistic mix of workloads and one fault after another.

A live table shows each AppWrapper's phase, attempts and latest verdict while faults are
injected through the testbed's pod simulation contract:

- a training worker crashes (exit code 139, SIGSEGV)     → reset, recreated, Succeeded
- a node under a running 8-GPU job is labelled EVICT     → migrated without counting a retry
- an init container never finishes                       → warmup grace runs out, reset, then Failed
- a pod is stuck terminating during a reset              → forceful deletion, then recreated
- a job that always fails                                → retries exhausted, Failed, resources removed

It ends with one line per incident (detection latency, recovery time, attempts, nodes avoided),
leaves the traces in ``demo-output/traces.jsonl`` (or sends them to an OTLP collector when
``OTEL_EXPORTER_OTLP_ENDPOINT`` is set) and tears everything down.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from respawn.testbed import cluster, manifests, services, sim
from respawn.testbed.cluster import Log, State, kubectl
from respawn.waiting import WaitTimeout, until
from shared import subjects
from shared.messages import LifecycleEvent, Verdict, decode

NS = "demo"
OUTPUT = Path("demo-output")
ANNOTATION = "workload.codeflare.dev.appwrapper/"
TERMINAL = ("Succeeded", "Failed")


def job_appwrapper(
    name: str,
    *,
    pods: int,
    gpus: int = 0,
    pod_annotations: dict[str, str] | None = None,
    params: dict[str, str] | None = None,
) -> dict[str, Any]:
    defaults = {
        "failureGracePeriodDuration": "0s",
        "retryPausePeriodDuration": "2s",
        "warmupGracePeriodDuration": "10s",
        "forcefulDeletionGracePeriodDuration": "5s",
    }
    return manifests.job_appwrapper(
        name,
        pods=pods,
        gpus=gpus,
        pod_annotations=pod_annotations,
        annotations={ANNOTATION + k: v for k, v in {**defaults, **(params or {})}.items()},
        namespace=NS,
        job_name=name,
        init_container=True,
    )


def pytorchjob_appwrapper(name: str) -> dict[str, Any]:
    template = manifests.pod_template(
        annotations={sim.SUCCEED_AFTER: "25s"},
        gpus=2,
        container="pytorch",
        image="pytorch",
        restart_policy=None,
    )
    job = manifests.pytorchjob(name, replicas={"Master": 1, "Worker": 2}, template=template)
    return manifests.appwrapper(name, manifests.component(job), namespace=NS)


WORKLOADS: list[tuple[str, dict[str, Any], str]] = [
    (
        "llm-train",
        job_appwrapper("llm-train", pods=2, gpus=8, pod_annotations={sim.SUCCEED_AFTER: "45s"}),
        "2 x 8-GPU training job",
    ),
    ("pytorch-ft", pytorchjob_appwrapper("pytorch-ft"), "PyTorchJob, master + 2 workers"),
    (
        "crashy",
        job_appwrapper("crashy", pods=2, gpus=1, pod_annotations={sim.SUCCEED_AFTER: "30s"}),
        "worker will crash once",
    ),
    (
        "stuck-init",
        job_appwrapper(
            "stuck-init", pods=1, pod_annotations={sim.STUCK_INIT: "true"}, params={"retryLimit": "1"}
        ),
        "init container never finishes",
    ),
    (
        "sticky",
        job_appwrapper(
            "sticky", pods=1, pod_annotations={sim.STUCK_TERMINATING: "true", sim.SUCCEED_AFTER: "40s"}
        ),
        "pod will be stuck terminating",
    ),
    (
        "doomed",
        job_appwrapper(
            "doomed",
            pods=1,
            pod_annotations={sim.FAIL_AFTER: "3s", sim.EXIT_CODE: "2"},
            params={"retryLimit": "2"},
        ),
        "always fails",
    ),
]


@dataclass
class Incident:
    # ``injected_at``: just before the fault is written (kubectl runs in a thread so the event
    # loop keeps stamping verdicts as they arrive): detection figures are upper bounds.
    name: str
    fault: str
    injected_at: float
    detected_at: float | None = None
    recovered_at: float | None = None
    outcome: str = ""
    nodes_avoided: list[str] = field(default_factory=list)


@dataclass
class Board:
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    verdict_times: dict[str, list[tuple[float, Verdict]]] = field(default_factory=dict)
    events: dict[str, list[tuple[float, LifecycleEvent]]] = field(default_factory=dict)
    appwrappers: dict[str, dict[str, Any]] = field(default_factory=dict)


def _table(board: Board, started: float, note: str) -> Table:
    table = Table(title=f"Respawn demo  +{time.monotonic() - started:5.1f}s  {note}", expand=False)
    for col in ("AppWrapper", "phase", "attempts", "unhealthy", "latest verdict"):
        table.add_column(col)
    for name, _, what in WORKLOADS:
        aw = board.appwrappers.get(name, {})
        status = aw.get("status") or {}
        unhealthy = next(
            (
                c.get("reason", "")
                for c in status.get("conditions", [])
                if c["type"] == "Unhealthy" and c["status"] == "True"
            ),
            "",
        )
        v = board.verdicts.get(name)
        verdict = f"{v.state} {v.reason}".strip() if v else ""
        table.add_row(
            f"{name} ({what})",
            status.get("phase", "-"),
            str(status.get("resettingCount", 0)),
            unhealthy,
            verdict,
        )
    return table


async def _follow_streams(nats_url: str, board: Board) -> None:
    import nats

    nc = await nats.connect(nats_url)
    js = nc.jetstream()

    async def on_verdict(msg: Any) -> None:
        v = decode(Verdict, msg.data, msg.headers)
        if v.ref.namespace == NS:
            board.verdicts[v.ref.name] = v
            board.verdict_times.setdefault(v.ref.name, []).append((time.monotonic(), v))

    async def on_event(msg: Any) -> None:
        e = decode(LifecycleEvent, msg.data, msg.headers)
        if e.ref.namespace == NS:
            board.events.setdefault(e.ref.name, []).append((time.monotonic(), e))

    await js.subscribe(subjects.verdict_filter(NS), cb=on_verdict, ordered_consumer=True)
    await js.subscribe(f"{subjects.LIFECYCLE_PREFIX}.{NS}.*", cb=on_event, ordered_consumer=True)
    try:
        await asyncio.Event().wait()
    finally:
        await nc.close()


def _refresh(state: State, board: Board) -> None:
    listing = sim.get_json(state.kubeconfig, "appwrappers", "-n", NS)
    board.appwrappers = {a["metadata"]["name"]: a for a in listing["items"]}


def _pods(state: State, aw: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = sim.get_json(
        state.kubeconfig, "pods", "-n", NS, "-l", f"workload.codeflare.dev/appwrapper={aw}"
    )["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def _phase(board: Board, name: str) -> str:
    return str((board.appwrappers.get(name, {}).get("status") or {}).get("phase", ""))


async def _until(check: Any, board: Board, state: State, within: float) -> bool:
    async def refreshed() -> bool:
        await asyncio.to_thread(_refresh, state, board)
        return bool(check())

    try:
        await until("the demo's next step", refreshed, within=within, every=0.3)
    except WaitTimeout:
        return False
    return True


async def _scenario(state: State, board: Board, live: Live, started: float, log: Log) -> list[Incident]:
    note = {"text": "submitting workloads"}

    async def tick() -> None:
        while True:
            await asyncio.to_thread(_refresh, state, board)
            live.update(_table(board, started, note["text"]))
            await asyncio.sleep(0.5)

    ticker = asyncio.create_task(tick())
    incidents: list[Incident] = []
    try:
        kubectl(state.kubeconfig, "create", "namespace", NS, check=False)
        for _, manifest, _ in WORKLOADS:
            kubectl(state.kubeconfig, "apply", "-f", "-", stdin=json.dumps(manifest))
        note["text"] = "waiting for the workloads to run"
        await _until(
            lambda: all(
                _phase(board, n) in ("Running", *TERMINAL) for n in ("llm-train", "crashy", "sticky")
            ),
            board,
            state,
            90,
        )
        # stuck-init never gets Running pods: the warmup grace period is the fault.
        incidents.append(Incident("stuck-init", "stuck init (10s warmup)", time.monotonic()))
        incidents.append(Incident("doomed", "always exits 2", time.monotonic()))

        note["text"] = "fault: a training worker crashes (exit 139, SIGSEGV)"
        victim = next(p for p in _pods(state, "crashy") if p["status"].get("phase") == "Running")
        inc = Incident("crashy", "worker exit 139", time.monotonic())
        await asyncio.to_thread(sim.fail_pod, state.kubeconfig, NS, victim["metadata"]["name"], exit_code=139)
        inc.nodes_avoided = [victim["spec"].get("nodeName", "")]
        incidents.append(inc)
        await asyncio.sleep(3)

        note["text"] = "fault: the node under llm-train is labelled EVICT"
        target = next(p for p in _pods(state, "llm-train") if p["status"].get("phase") == "Running")
        node = target["spec"]["nodeName"]
        inc = Incident("llm-train", f"{node} labelled EVICT", time.monotonic())
        await asyncio.to_thread(
            sim.label_node, state.kubeconfig, node, "autopilot.ibm.com/gpuhealth", "EVICT"
        )
        inc.nodes_avoided = [node]
        incidents.append(inc)
        await asyncio.sleep(3)

        note["text"] = "fault: a pod stuck terminating is caught in a reset"
        victim = next(p for p in _pods(state, "sticky") if p["status"].get("phase") == "Running")
        inc = Incident("sticky", "fail + stuck terminating", time.monotonic())
        await asyncio.to_thread(sim.fail_pod, state.kubeconfig, NS, victim["metadata"]["name"], exit_code=1)
        incidents.append(inc)

        note["text"] = "watching recovery"
        await _until(lambda: all(_phase(board, n) in TERMINAL for n, _, _ in WORKLOADS), board, state, 150)
        sim.label_node(state.kubeconfig, node, "autopilot.ibm.com/gpuhealth", None)
        note["text"] = "done"
        await asyncio.to_thread(_refresh, state, board)
        live.update(_table(board, started, note["text"]))
    finally:
        ticker.cancel()
    _score(incidents, board)
    return incidents


def _score(incidents: list[Incident], board: Board) -> None:
    for inc in incidents:
        times = board.verdict_times.get(inc.name, [])
        unhealthy = [t for t, v in times if v.state == "Unhealthy" and t >= inc.injected_at - 1]
        inc.detected_at = unhealthy[0] if unhealthy else None
        status = (board.appwrappers.get(inc.name, {}).get("status")) or {}
        inc.outcome = f"{status.get('phase', '?')}, {status.get('resettingCount', 0)} resets"
        # Recovered: Running again after a reset that started after the fault.
        events = [(t, e) for t, e in board.events.get(inc.name, []) if t >= inc.injected_at - 1]
        reset = next((t for t, e in events if e.event == "ResetStarted"), None)
        if reset is not None:
            inc.recovered_at = next(
                (t for t, e in events if t > reset and e.event == "PhaseChanged" and e.phase == "Running"),
                None,
            )
        annotations = (board.appwrappers.get(inc.name, {}).get("metadata") or {}).get("annotations") or {}
        excluded = annotations.get("respawn.dev/excluded-nodes", "")
        if excluded:
            inc.nodes_avoided = sorted(set(inc.nodes_avoided) | set(excluded.split(",")))
        elif "EVICT" not in inc.fault and inc.name != "crashy":
            inc.nodes_avoided = []


def _summary(incidents: list[Incident], console: Console) -> None:
    table = Table(title="Incidents")
    for col in ("AppWrapper", "fault", "detected", "running again", "outcome", "avoided"):
        table.add_column(col)
    for inc in incidents:
        detected = f"{(inc.detected_at - inc.injected_at) * 1000:.0f} ms" if inc.detected_at else "-"
        recovered = f"{inc.recovered_at - inc.injected_at:.1f} s" if inc.recovered_at else "-"
        table.add_row(
            inc.name,
            inc.fault,
            detected,
            recovered,
            inc.outcome,
            ", ".join(n for n in inc.nodes_avoided if n),
        )
    console.print(table)


def run_demo(state_dir: Path, *, keep: bool, log: Log) -> None:
    started = time.monotonic()
    console = Console(width=max(120, Console().width))
    OUTPUT.mkdir(exist_ok=True)
    traces = (OUTPUT / "traces.jsonl").resolve()
    traces.unlink(missing_ok=True)
    state = cluster.up(state_dir, nodes=6, log=log)
    try:
        env = {} if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") else {"RESPAWN_TRACE_FILE": str(traces)}
        running = services.start_all(state, log=log, env=env)
        log(f"stack up in {time.monotonic() - started:.1f}s; services: {', '.join(running)}")
        board = Board()

        async def main() -> list[Incident]:
            follower = asyncio.create_task(_follow_streams(state.nats_url, board))
            try:
                with Live(_table(board, started, "starting"), console=console, refresh_per_second=4) as live:
                    return await _scenario(state, board, live, started, log)
            finally:
                follower.cancel()

        incidents = asyncio.run(main())
        _summary(incidents, console)
        where = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or str(traces)
        console.print(f"traces: {where}   (each incident is one trace: verdict -> reset -> recreate)")
        console.print(f"demo finished in {time.monotonic() - started:.0f}s")
    finally:
        if keep:
            log(f"testbed left running: KUBECONFIG={state.kubeconfig} NATS_URL={state.nats_url}")
        else:
            cluster.down(state_dir, log=log)
            log("testbed stopped; nothing left running")
