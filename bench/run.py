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
  cost         CPU seconds and peak RSS per controller process, API requests per minute at idle
               (apiserver_request_total with the controller running, minus the same window with
               it stopped), NATS messages per fault (stream sequence numbers)

.venv/bin/python -m bench.run --controller respawn --appwrappers 100 --pods-per-aw 8 \\
    --fault-rate 0.2 --duration 120 [--state-dir DIR] [--seed 1] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import resource
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import nats
from prometheus_client.parser import text_string_to_metric_families

from bench import upstream
from bench.common import percentiles, settle, usage
from respawn.testbed import cluster, sim
from respawn.testbed.cluster import GPU_RESOURCE, State, kubectl
from respawn.testbed.errors import TestbedError
from respawn.testbed.process import pid_alive, stop_pid
from respawn.testbed.services import SERVICES, install_crd, start_service
from shared import subjects
from shared.appwrapper import params
from shared.appwrapper.constants import API_VERSION, APPWRAPPER_LABEL, KIND
from shared.durations import parse_go_duration
from shared.kube import Kube, KubeApiError, ResourceRef
from shared.kube.watch import list_then_watch
from shared.messages import Verdict, decode

Log = Callable[[str], None]

CONTROLLERS = ("respawn", "upstream")
FAULT_KINDS = ("pod-failure", "evict", "stuck-init")
DEFAULT_MIX = (("pod-failure", 0.7), ("evict", 0.15), ("stuck-init", 0.15))
EVICT_LABEL = "autopilot.ibm.com/gpuhealth"
EVICT_VALUE = "EVICT"
EXIT_CODES = (1, 2, 137, 143)
# kwok nodes take 110 pods and 8 GPUs each; keep a margin below the pod limit.
PODS_PER_NODE = 100
GPUS_PER_NODE = 8
# Retries far above what a run injects: the retry limit is not what is measured.
RETRY_LIMIT = "1000"
VIOLATIONS = (
    "lost",
    "duplicated",
    "unexpected",
    "count_mismatches",
    "wrong_phase",
    "orphans",
    "unrecovered",
    "orphans_after_delete",
)
TESTBED_PROCESSES = ("kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler", "kwok")


class BenchError(Exception):
    """A run cannot go ahead; the message is one line naming cause and fix."""


def stderr_log(line: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ configuration and plans


@dataclass(frozen=True)
class PlannedFault:
    at: float  # seconds after the fault phase starts
    kind: str


@dataclass(frozen=True)
class BenchConfig:
    controller: str = "respawn"
    appwrappers: int = 100
    pods_per_aw: int = 8
    fault_rate: float = 0.2  # faults per second, Poisson arrivals
    duration: float = 120.0  # seconds of fault injection
    seed: int = 1
    max_faults: int | None = None
    mix: tuple[tuple[str, float], ...] = DEFAULT_MIX
    gpu_fraction: float = 0.25
    pytorch_fraction: float = 0.4
    # Per-AppWrapper annotations, so both controllers run with the same periods.
    failure_grace: str = "0s"
    retry_pause: str = "0s"
    warmup_grace: str = "10s"  # stuck-init AppWrappers (admission and warmup)
    setup_grace: str = "10m"  # admission and warmup of the N AppWrappers: start-up at scale is slow
    stuck_init_pods: int = 1
    idle_seconds: float = 60.0  # each idle window (0: no idle-cost measurement)
    quiesce_seconds: float = 15.0
    settle_timeout: float = 300.0
    setup_timeout: float = 1800.0
    cleanup_timeout: float = 300.0
    retry_ineligible: float = 15.0  # how long a fault waits for an eligible target
    nodes: int | None = None
    fault_plan: tuple[PlannedFault, ...] | None = None

    def seconds(self, duration: str) -> float:
        return parse_go_duration(duration).total_seconds()


@dataclass(frozen=True)
class AwSpec:
    name: str
    kind: str  # job | pytorchjob | stuck-init
    pods: int
    gpu: bool


def plan_workload(cfg: BenchConfig) -> list[AwSpec]:
    """The N AppWrappers: exact shares of GPU and PyTorchJob workloads, placed by the seed."""
    rng = random.Random(f"workload-{cfg.seed}")
    n = cfg.appwrappers
    n_gpu = min(n, max(1 if cfg.gpu_fraction > 0 else 0, round(n * cfg.gpu_fraction)))
    n_pt = min(n, round(n * cfg.pytorch_fraction))
    gpu = [True] * n_gpu + [False] * (n - n_gpu)
    pytorch = [True] * n_pt + [False] * (n - n_pt)
    rng.shuffle(gpu)
    rng.shuffle(pytorch)
    width = len(str(max(n - 1, 0)))
    return [
        AwSpec(f"aw-{i:0{width}d}", "pytorchjob" if pytorch[i] else "job", cfg.pods_per_aw, gpu[i])
        for i in range(n)
    ]


def plan_faults(cfg: BenchConfig) -> list[PlannedFault]:
    """Poisson arrivals at ``fault_rate`` over ``duration``, kinds drawn from ``mix``."""
    if cfg.fault_plan is not None:
        return list(cfg.fault_plan)
    rng = random.Random(f"faults-{cfg.seed}")
    kinds = [k for k, _ in cfg.mix]
    weights = [w for _, w in cfg.mix]
    out: list[PlannedFault] = []
    at = 0.0
    while cfg.fault_rate > 0:
        at += rng.expovariate(cfg.fault_rate)
        if at > cfg.duration or (cfg.max_faults is not None and len(out) >= cfg.max_faults):
            break
        out.append(PlannedFault(round(at, 3), rng.choices(kinds, weights)[0]))
    return out


def nodes_needed(cfg: BenchConfig, workload: Sequence[AwSpec], planned: Sequence[PlannedFault]) -> int:
    stuck = sum(1 for f in planned if f.kind == "stuck-init") * cfg.stuck_init_pods
    pods = sum(s.pods for s in workload) + stuck
    gpu_pods = sum(s.pods for s in workload if s.gpu)
    # Headroom for a labelled node, pods kept off the nodes they failed on, terminating pods.
    return max(4, math.ceil(max(pods / PODS_PER_NODE, gpu_pods / GPUS_PER_NODE) * 1.25) + 2)


def appwrapper_manifest(spec: AwSpec, cfg: BenchConfig) -> dict[str, Any]:
    stuck = spec.kind == "stuck-init"
    grace = cfg.warmup_grace if stuck else cfg.setup_grace
    annotations = {
        params.ADMISSION_GRACE_PERIOD_ANNOTATION: grace,
        params.WARMUP_GRACE_PERIOD_ANNOTATION: grace,
        params.FAILURE_GRACE_PERIOD_ANNOTATION: cfg.failure_grace,
        params.RETRY_PAUSE_PERIOD_ANNOTATION: cfg.retry_pause,
        params.RETRY_LIMIT_ANNOTATION: "1" if stuck else RETRY_LIMIT,
    }
    resources = {"limits": {GPU_RESOURCE: "1"}} if spec.gpu else {}

    def pod_template(container: str) -> dict[str, Any]:
        pod: dict[str, Any] = {
            "restartPolicy": "Never",
            "containers": [
                {"name": container, "image": "registry.invalid/trainer:1", "resources": resources}
            ],
        }
        if stuck:
            pod["initContainers"] = [{"name": "setup", "image": "registry.invalid/setup:1"}]
        metadata = {"annotations": {sim.STUCK_INIT: "true"}} if stuck else {}
        return {"metadata": metadata, "spec": pod}

    if spec.kind == "pytorchjob":
        replicas: dict[str, Any] = {
            # The training operator finds the framework container by this name.
            "Master": {"replicas": 1, "restartPolicy": "Never", "template": pod_template("pytorch")}
        }
        if spec.pods > 1:
            replicas["Worker"] = {
                "replicas": spec.pods - 1,
                "restartPolicy": "Never",
                "template": pod_template("pytorch"),
            }
        template: dict[str, Any] = {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": spec.name},
            "spec": {"pytorchReplicaSpecs": replicas},
        }
    else:
        template = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": spec.name},
            "spec": {
                "parallelism": spec.pods,
                "completions": spec.pods,
                "backoffLimit": 0,
                "template": pod_template("train"),
            },
        }
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": spec.name, "annotations": annotations},
        "spec": {"components": [{"template": template}]},
    }


# ------------------------------------------------------------------ what the watches show


@dataclass
class Fault:
    id: int
    kind: str
    aw: str
    t0: float  # wall clock, just before the fault was written
    counted: bool  # does it count towards resettingCount (Autopilot resets do not)
    node: str = ""
    pod: str = ""
    exit_code: int = 0
    # False for an AppWrapper found on an EVICT node only after the label (a pod bound just before
    # it): it must be reset, but its latencies do not start at the label.
    timed: bool = True
    old_pods: frozenset[str] = frozenset()
    old_components: frozenset[str] = frozenset()
    deadline: float | None = None  # stuck-init: when the warmup grace ran out (API timestamps)
    t_verdict: float | None = None
    t_unhealthy: float | None = None
    reason: str = ""
    t_delete: float | None = None
    t_recovered: float | None = None
    t_done: float | None = None


@dataclass
class PodRec:
    uid: str
    name: str
    aw: str
    phase: str
    node: str
    deleting: bool
    gpu: bool
    containers: tuple[tuple[str, str], ...]  # (name, image)


@dataclass
class AwRec:
    spec: AwSpec
    phase: str = ""
    resetting_count: int = 0
    unhealthy: bool = False
    pods_ready: bool = False  # the controller's own PodsReady condition (both controllers write it)
    deployed_at: str = ""
    resets: int = 0
    gone: bool = False
    pods: set[str] = field(default_factory=set)
    components: set[str] = field(default_factory=set)  # live (not being deleted)
    faults: list[Fault] = field(default_factory=list)
    # (time, phase, resettingCount, Unhealthy reason) at each change, and the verdicts received:
    # the evidence printed for an AppWrapper whose resets do not add up.
    history: list[tuple[float, str, int, str]] = field(default_factory=list)
    verdicts: list[tuple[float, str, str, int]] = field(default_factory=list)

    def active(self) -> list[Fault]:
        return [f for f in self.faults if f.t_done is None]


@dataclass
class Eviction:
    node: str
    t_label: float
    affected: set[str]
    t_unlabel: float | None = None


def _wall(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def _requests_gpu(pod_spec: Mapping[str, Any]) -> bool:
    for c in pod_spec.get("containers") or []:
        res = c.get("resources") or {}
        for section in ("limits", "requests"):
            if str((res.get(section) or {}).get(GPU_RESOURCE, "0")) not in ("0", ""):
                return True
    return False


class Tracker:
    """The benchmark's view of its namespace, fed by watch events (handlers never block)."""

    def __init__(self, warmup_seconds: float) -> None:
        self.warmup_seconds = warmup_seconds
        self.aws: dict[str, AwRec] = {}
        self.pods: dict[str, PodRec] = {}
        self.components: dict[str, tuple[str, str, str]] = {}  # uid -> (aw, kind/name, deleting?)
        self.node_labels: dict[str, dict[str, str]] = {}
        self.node_gpus: dict[str, int] = {}
        self.evictions: dict[str, Eviction] = {}
        self.eviction_log: list[Eviction] = []
        self.faults: list[Fault] = []

    # -------------------------------------------------------------- derived state

    def idle(self, rec: AwRec) -> bool:
        """Running, healthy, every pod running, no fault in flight: a fault target."""
        if rec.spec.kind == "stuck-init" or rec.gone or rec.active():
            return False
        if rec.phase != "Running" or rec.unhealthy or len(rec.components) != 1:
            return False
        pods = [self.pods[u] for u in rec.pods]
        return len(pods) == rec.spec.pods and all(p.phase == "Running" and not p.deleting for p in pods)

    def workload_idle(self, *, reported: bool = False) -> tuple[int, int]:
        """How many running workloads are idle; ``reported``: and reported ready by the controller
        (PodsReady True).

        Pods run before the controller has written that they do: at N=10,000 the controller is
        still writing those conditions minutes after the last pod started. Idle cost measured
        before then would be the cost of catching up, not of idling."""
        normal = [r for r in self.aws.values() if r.spec.kind != "stuck-init"]
        return sum(1 for r in normal if self.idle(r) and (r.pods_ready or not reported)), len(normal)

    def leftovers(self) -> dict[str, int]:
        """What the watches still see of the workload (for the clean-up)."""
        return {
            "AppWrappers": sum(1 for r in self.aws.values() if not r.gone),
            "pods": len(self.pods),
            "components": len(self.components),
        }

    def _check(self, rec: AwRec, now: float) -> None:
        for f in rec.active():
            if f.kind == "stuck-init":
                if rec.phase == "Failed" and not rec.pods and not rec.components:
                    f.t_done = now
                continue
            if f.t_recovered is None and rec.phase == "Running":
                fresh = 0
                for uid in rec.pods:
                    pod = self.pods[uid]
                    if uid not in f.old_pods and pod.phase == "Running" and not pod.deleting:
                        fresh += 1
                if fresh >= rec.spec.pods:
                    f.t_recovered = f.t_done = now

    # -------------------------------------------------------------- handlers

    def on_appwrapper(self, etype: str, obj: Mapping[str, Any], now: float) -> None:
        rec = self.aws.get(obj.get("metadata", {}).get("name", ""))
        if rec is None:
            return
        if etype == "DELETED":
            rec.gone = True
            return
        status = obj.get("status") or {}
        phase = status.get("phase") or ""
        if phase != rec.phase:
            if phase == "Resetting":
                rec.resets += 1
            rec.phase = phase
        conditions = {c.get("type"): c for c in status.get("conditions") or []}
        unhealthy_cond = conditions.get("Unhealthy") or {}
        unhealthy = unhealthy_cond.get("status") == "True"
        if unhealthy and not rec.unhealthy:
            for f in rec.active():
                if f.t_unhealthy is None and now >= f.t0:
                    f.t_unhealthy = now
                    f.reason = str(unhealthy_cond.get("reason", ""))
        rec.unhealthy = unhealthy
        rec.pods_ready = (conditions.get("PodsReady") or {}).get("status") == "True"
        deployed = conditions.get("ResourcesDeployed") or {}
        if deployed.get("status") == "True" and not rec.deployed_at and deployed.get("lastTransitionTime"):
            rec.deployed_at = str(deployed["lastTransitionTime"])
            for f in rec.faults:
                if f.kind == "stuck-init" and f.deadline is None:
                    f.deadline = _wall(rec.deployed_at) + self.warmup_seconds
        rec.resetting_count = int(status.get("resettingCount") or 0)
        entry = (now, phase, rec.resetting_count, str(unhealthy_cond.get("reason", "")) if unhealthy else "")
        if not rec.history or rec.history[-1][1:] != entry[1:]:
            rec.history.append(entry)
        self._check(rec, now)

    def on_pod(self, etype: str, obj: Mapping[str, Any], now: float) -> None:
        meta = obj.get("metadata", {})
        rec = self.aws.get((meta.get("labels") or {}).get(APPWRAPPER_LABEL, ""))
        if rec is None:
            return
        uid = str(meta.get("uid", ""))
        if etype == "DELETED":
            self.pods.pop(uid, None)
            rec.pods.discard(uid)
        else:
            spec = obj.get("spec") or {}
            pod = PodRec(
                uid=uid,
                name=str(meta.get("name", "")),
                aw=rec.spec.name,
                phase=str((obj.get("status") or {}).get("phase", "")),
                node=str(spec.get("nodeName", "")),
                deleting=bool(meta.get("deletionTimestamp")),
                gpu=_requests_gpu(spec),
                containers=tuple(
                    (c.get("name", ""), c.get("image", "")) for c in spec.get("containers") or []
                ),
            )
            self.pods[uid] = pod
            rec.pods.add(uid)
            eviction = self.evictions.get(pod.node)
            if (
                eviction is not None
                and pod.gpu
                and pod.phase == "Running"
                and not pod.deleting
                and rec.phase == "Running"
                and rec.spec.name not in eviction.affected
            ):
                # Bound to the node just before the label: the controller has to move it too.
                eviction.affected.add(rec.spec.name)
                self.add_fault("evict", rec, now, counted=False, node=pod.node, timed=False)
        self._check(rec, now)

    def on_component(self, etype: str, obj: Mapping[str, Any], now: float) -> None:
        meta = obj.get("metadata", {})
        rec = self.aws.get((meta.get("labels") or {}).get(APPWRAPPER_LABEL, ""))
        if rec is None:
            return
        uid = str(meta.get("uid", ""))
        what = f"{obj.get('kind', '')}/{meta.get('name', '')}"
        deleting = etype == "DELETED" or bool(meta.get("deletionTimestamp"))
        if deleting:
            rec.components.discard(uid)
            for f in rec.faults:
                if f.t_delete is None and now >= f.t0 and (uid in f.old_components or f.kind == "stuck-init"):
                    f.t_delete = now
            if etype == "DELETED":
                self.components.pop(uid, None)
            else:
                self.components[uid] = (rec.spec.name, what, "deleting")
        else:
            rec.components.add(uid)
            self.components[uid] = (rec.spec.name, what, "")
        self._check(rec, now)

    def on_node(self, etype: str, obj: Mapping[str, Any], _now: float) -> None:
        name = str(obj.get("metadata", {}).get("name", ""))
        if etype == "DELETED":
            self.node_labels.pop(name, None)
            self.node_gpus.pop(name, None)
            return
        self.node_labels[name] = dict(obj.get("metadata", {}).get("labels") or {})
        allocatable = (obj.get("status") or {}).get("allocatable") or {}
        self.node_gpus[name] = int(str(allocatable.get(GPU_RESOURCE, "0")) or 0)

    def on_verdict(self, verdict: Verdict, now: float) -> None:
        rec = self.aws.get(verdict.ref.name)
        if rec is None:
            return
        rec.verdicts.append((now, verdict.state, verdict.reason, verdict.resetting_count))
        if verdict.state != "Unhealthy":
            return
        for f in rec.active():
            if f.t_verdict is None and now >= f.t0:
                f.t_verdict = now

    # -------------------------------------------------------------- faults

    def add_fault(
        self,
        kind: str,
        rec: AwRec,
        now: float,
        *,
        counted: bool,
        node: str = "",
        pod: str = "",
        exit_code: int = 0,
        timed: bool = True,
    ) -> Fault:
        fault = Fault(
            id=len(self.faults) + 1,
            kind=kind,
            aw=rec.spec.name,
            t0=now,
            counted=counted,
            node=node,
            pod=pod,
            exit_code=exit_code,
            timed=timed,
            old_pods=frozenset(rec.pods),
            old_components=frozenset(rec.components),
        )
        self.faults.append(fault)
        rec.faults.append(fault)
        return fault

    def withdraw(self, fault: Fault) -> None:
        """A fault whose write failed (its target vanished): it never happened."""
        self.faults.remove(fault)
        self.aws[fault.aw].faults.remove(fault)

    def pick_pod_failure(self, rng: random.Random) -> tuple[AwRec, PodRec] | None:
        idle = [r for _, r in sorted(self.aws.items()) if self.idle(r)]
        if not idle:
            return None
        rec = rng.choice(idle)
        pods = sorted((self.pods[u] for u in rec.pods), key=lambda p: p.name)
        return rec, rng.choice(pods)

    def pick_eviction(self, rng: random.Random) -> tuple[str, list[AwRec]] | None:
        """A node whose GPU pods all belong to idle AppWrappers, with room for them elsewhere."""
        if self.evictions:
            return None  # one labelled node at a time
        gpu_pods: dict[str, set[str]] = {}
        gpus_used: Counter[str] = Counter()
        for pod in self.pods.values():
            if pod.gpu and pod.node and pod.phase in ("Pending", "Running"):
                gpus_used[pod.node] += 1
                if not pod.deleting:
                    gpu_pods.setdefault(pod.node, set()).add(pod.aw)
        free_elsewhere = {
            node: self.node_gpus.get(node, 0) - gpus_used[node]
            for node, labels in self.node_labels.items()
            if labels.get(EVICT_LABEL) is None
        }
        candidates = []
        for node, names in sorted(gpu_pods.items()):
            if self.node_labels.get(node, {}).get(EVICT_LABEL) is not None:
                continue
            if not all(self.idle(self.aws[n]) for n in names):
                continue
            room = sum(free for other, free in free_elsewhere.items() if other != node)
            if room >= gpus_used[node]:
                candidates.append(node)
        if not candidates:
            return None
        node = rng.choice(candidates)
        return node, [self.aws[n] for n in sorted(gpu_pods[node])]


# ------------------------------------------------------------------ cost measurements


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


def _cpu(processes: Mapping[str, int]) -> dict[str, float]:
    out = {}
    for name, pid in processes.items():
        with contextlib.suppress(OSError):
            out[name] = usage(pid).cpu_seconds
    return out


# ------------------------------------------------------------------ the run itself


class Bench:
    def __init__(
        self,
        cfg: BenchConfig,
        kube: Kube,
        kubeconfig: Path,
        namespace: str,
        processes: Mapping[str, int],
        testbed_processes: Mapping[str, int],
        log: Log,
    ) -> None:
        self.cfg = cfg
        self.kube = kube
        self.kubeconfig = kubeconfig
        self.ns = namespace
        self.processes = dict(processes)
        self.testbed_processes = dict(testbed_processes)
        self.log = log
        self.tracker = Tracker(cfg.seconds(cfg.warmup_grace))
        self.rng = random.Random(f"targets-{cfg.seed}")
        self.js: Any = None
        self.skipped: Counter[str] = Counter()
        self.fell_back: Counter[str] = Counter()
        self.stuck_count = 0
        self.refs: dict[str, ResourceRef] = {}
        self.t_start = time.time()

    async def resolve(self) -> None:
        for key, (api_version, kind) in {
            "aw": (API_VERSION, KIND),
            "pod": ("v1", "Pod"),
            "node": ("v1", "Node"),
            "job": ("batch/v1", "Job"),
            "pytorchjob": ("kubeflow.org/v1", "PyTorchJob"),
        }.items():
            self.refs[key] = await self.kube.resource(api_version, kind)

    async def follow(
        self, key: str, handler: Callable[[str, Mapping[str, Any], float], None], synced: asyncio.Event
    ) -> None:
        namespace = None if key == "node" else self.ns
        async for event in list_then_watch(self.kube, self.refs[key], namespace=namespace):
            if event.type == "SYNCED":
                synced.set()
                continue
            handler(event.type, event.obj, time.time())

    # -------------------------------------------------------------- measurements

    async def snapshot(self, *, api: bool = True) -> Snapshot:
        by_request: dict[str, float] = {}
        if api:
            text = (await asyncio.to_thread(kubectl, self.kubeconfig, "get", "--raw", "/metrics")).stdout
            by_request = api_requests(text)
        return Snapshot(
            time.time(),
            by_request,
            _cpu({**self.processes, **self.testbed_processes}),
            await self.stream_seqs(),
        )

    async def stream_seqs(self) -> dict[str, int]:
        out: dict[str, int] = {}
        if self.js is None:
            return out
        for stream in (
            subjects.OBSERVATIONS_STREAM,
            subjects.VERDICTS_STREAM,
            subjects.NODE_VERDICTS_STREAM,
            subjects.LIFECYCLE_STREAM,
            subjects.DEAD_LETTER_STREAM,
        ):
            with contextlib.suppress(Exception):  # a stream the controller does not use
                out[stream] = int((await self.js.stream_info(stream)).state.last_seq)
        return out

    @contextlib.asynccontextmanager
    async def controller_stopped(self) -> AsyncIterator[None]:
        """SIGSTOP the controller's processes (their connections stay open), SIGCONT after."""
        for pid in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            for pid in self.processes.values():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    # -------------------------------------------------------------- phases

    async def submit(self, workload: Sequence[AwSpec]) -> None:
        sem = asyncio.Semaphore(32)

        async def create(spec: AwSpec) -> None:
            async with sem:
                await self.kube.create(self.refs["aw"], appwrapper_manifest(spec, self.cfg), self.ns)

        await asyncio.gather(*(create(s) for s in workload))

    async def testbed_quiet(self, limit: float) -> float | None:
        """Wait until the controller manager is quiet (< 10 % of a core over 5 s); the seconds
        waited, or None if it was not within ``limit`` (the run goes on; the idle figures then
        include its work)."""
        pid = self.testbed_processes.get("kube-controller-manager")
        if not pid:
            return 0.0
        self.log("waiting for the controller manager to finish reacting to the set-up")
        try:
            return await settle({"kube-controller-manager": pid}, quiet=0.1, window=5.0, limit=limit)
        except TimeoutError:
            self.log(f"the controller manager was still busy after {limit:.0f}s; measuring anyway")
            return None

    async def wait_all_idle(self, limit: float, what: str, *, reported: bool = False) -> bool:
        """Poll (with a deadline) until every workload runs; ``reported``: and the controller
        has written PodsReady for it."""
        deadline = time.monotonic() + limit
        last_report = 0.0
        while True:
            ready, total = self.tracker.workload_idle(reported=reported)
            if ready == total:
                return True
            if time.monotonic() > deadline:
                return False
            if time.monotonic() - last_report > 15:
                pods = sum(1 for p in self.tracker.pods.values() if p.phase == "Running" and not p.deleting)
                self.log(
                    f"{what}: {ready}/{total} AppWrappers {'reported ' if reported else ''}ready, "
                    f"{pods} pods running"
                )
                last_report = time.monotonic()
            await asyncio.sleep(0.25)

    async def inject(self, kind: str) -> bool:
        now = time.time()
        if kind == "pod-failure":
            pick = self.tracker.pick_pod_failure(self.rng)
            if pick is None:
                return False
            rec, pod = pick
            code = self.rng.choice(EXIT_CODES)
            fault = self.tracker.add_fault(
                kind, rec, now, counted=True, node=pod.node, pod=pod.name, exit_code=code
            )
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
            # The same status a kubelet writes for a crashed pod (sim.fail_pod does this through kubectl).
            statuses = [
                {
                    "name": name,
                    "image": image,
                    "ready": False,
                    "restartCount": 0,
                    "state": {
                        "terminated": {
                            "exitCode": code,
                            "reason": "Error",
                            "startedAt": stamp,
                            "finishedAt": stamp,
                        }
                    },
                }
                for name, image in pod.containers
            ]
            try:
                await self.kube.patch(
                    self.refs["pod"],
                    pod.name,
                    {"status": {"phase": "Failed", "containerStatuses": statuses}},
                    self.ns,
                    subresource="status",
                )
            except KubeApiError as exc:
                self.tracker.withdraw(fault)
                self.log(f"pod failure on {pod.name} not written ({exc}); another target")
                return False
            return True
        if kind == "evict":
            picked = self.tracker.pick_eviction(self.rng)
            if picked is None:
                return False
            node, affected = picked
            eviction = Eviction(node, now, {r.spec.name for r in affected})
            self.tracker.evictions[node] = eviction
            self.tracker.eviction_log.append(eviction)
            for rec in affected:
                self.tracker.add_fault(kind, rec, now, counted=False, node=node)
            await self.kube.patch(
                self.refs["node"], node, {"metadata": {"labels": {EVICT_LABEL: EVICT_VALUE}}}
            )
            return True
        # stuck-init: a new AppWrapper whose pods never finish initialising.
        self.stuck_count += 1
        spec = AwSpec(f"init-{self.stuck_count:03d}", "stuck-init", self.cfg.stuck_init_pods, False)
        rec = AwRec(spec)
        self.tracker.aws[spec.name] = rec
        self.tracker.add_fault(kind, rec, now, counted=True)
        await self.kube.create(self.refs["aw"], appwrapper_manifest(spec, self.cfg), self.ns)
        return True

    async def planned_fault(self, planned: PlannedFault, start: float) -> None:
        await asyncio.sleep(max(0.0, start + planned.at - time.monotonic()))
        give_up = time.monotonic() + self.cfg.retry_ineligible
        while not await self.inject(planned.kind):
            if time.monotonic() > give_up:
                if planned.kind != "pod-failure" and await self.inject("pod-failure"):
                    self.fell_back[planned.kind] += 1
                else:
                    self.skipped[planned.kind] += 1
                return
            await asyncio.sleep(0.2)

    async def lift_evictions(self, *, force: bool = False) -> None:
        """Remove an EVICT label once every AppWrapper it hit runs elsewhere again."""
        for node, eviction in list(self.tracker.evictions.items()):
            faults = [
                f
                for f in self.tracker.faults
                if f.kind == "evict" and f.node == node and f.t0 >= eviction.t_label
            ]
            if force or all(f.t_done is not None for f in faults):
                del self.tracker.evictions[node]
                eviction.t_unlabel = time.time()
                await self.kube.patch(self.refs["node"], node, {"metadata": {"labels": {EVICT_LABEL: None}}})

    async def evictions_loop(self) -> None:
        while True:
            await self.lift_evictions()
            await asyncio.sleep(0.25)

    def settled(self) -> bool:
        ready, total = self.tracker.workload_idle()
        return (
            ready == total
            and all(f.t_done is not None for f in self.tracker.faults)
            and not self.tracker.evictions
        )

    # -------------------------------------------------------------- correctness

    async def listing(self, key: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = (await self.kube.list(self.refs[key], self.ns)).get("items", [])
        return items

    async def end_state(self) -> dict[str, Any]:
        """Resets and counts per AppWrapper, and leftovers, from a fresh LIST (not the watches)."""
        aws = {a["metadata"]["name"]: a for a in await self.listing("aw")}
        pods: dict[str, list[dict[str, Any]]] = {}
        for pod in await self.listing("pod"):
            pods.setdefault((pod["metadata"].get("labels") or {}).get(APPWRAPPER_LABEL, ""), []).append(pod)
        comps: dict[str, list[dict[str, Any]]] = {}
        for key in ("job", "pytorchjob"):
            for comp in await self.listing(key):
                comps.setdefault((comp["metadata"].get("labels") or {}).get(APPWRAPPER_LABEL, ""), []).append(
                    comp
                )
        lost: list[str] = []
        duplicated: list[str] = []
        unexpected: list[str] = []
        mismatched: list[str] = []
        orphans: list[str] = []
        wrong_phase: list[str] = []
        for name, rec in sorted(self.tracker.aws.items()):
            expected = len(rec.faults)
            if rec.resets < expected:
                lost.append(f"{name}: {rec.resets} resets for {expected} faults")
            elif rec.resets > expected:
                (duplicated if expected else unexpected).append(
                    f"{name}: {rec.resets} resets for {expected} faults"
                )
            body = aws.get(name)
            if body is None:
                wrong_phase.append(f"{name}: gone")
                continue
            status = body.get("status") or {}
            counted = sum(1 for f in rec.faults if f.counted)
            if int(status.get("resettingCount") or 0) != counted:
                mismatched.append(
                    f"{name}: resettingCount {status.get('resettingCount')} for {counted} counted faults"
                )
            want = "Failed" if rec.spec.kind == "stuck-init" else "Running"
            if status.get("phase") != want:
                wrong_phase.append(f"{name}: {status.get('phase')} (expected {want})")
            mine = pods.get(name, [])
            live = [p for p in mine if not p["metadata"].get("deletionTimestamp")]
            components = comps.get(name, [])
            if want == "Failed":
                if mine or components:
                    orphans.append(f"{name} (Failed): {len(mine)} pods, {len(components)} components left")
            else:
                if len(mine) != rec.spec.pods or len(components) != 1:
                    orphans.append(
                        f"{name}: {len(mine)} pods ({len(live)} live) for {rec.spec.pods}, "
                        f"{len(components)} components"
                    )
        suspects = {
            item.split(":", 1)[0] for item in lost + duplicated + unexpected + mismatched + wrong_phase
        }
        timelines = {
            name: self.timeline(self.tracker.aws[name])
            for name in sorted(suspects)
            if name in self.tracker.aws
        }
        for owner, items in sorted({**pods, **comps}.items()):
            if owner not in self.tracker.aws:
                orphans.append(f"{len(items)} objects labelled for unknown AppWrapper {owner!r}")
        return {
            "lost": lost,
            "duplicated": duplicated,
            "unexpected": unexpected,
            "count_mismatches": mismatched,
            "wrong_phase": wrong_phase,
            "orphans": orphans,
            "timelines": timelines,
            "per_appwrapper": {
                name: {
                    "faults": len(rec.faults),
                    "counted_faults": sum(1 for f in rec.faults if f.counted),
                    "resets": rec.resets,
                    "resettingCount": int(
                        ((aws.get(name) or {}).get("status") or {}).get("resettingCount") or 0
                    ),
                    "phase": ((aws.get(name) or {}).get("status") or {}).get("phase"),
                }
                for name, rec in sorted(self.tracker.aws.items())
                if rec.faults or rec.resets
            },
        }

    def timeline(self, rec: AwRec) -> list[str]:
        """What happened to one AppWrapper, seconds from the start of the run."""
        events = [
            (t, f"phase={p} resettingCount={c}" + (f" Unhealthy={r}" if r else ""))
            for t, p, c, r in rec.history
        ]
        events += [
            (t, f"verdict {state} {reason} (count {count})") for t, state, reason, count in rec.verdicts
        ]
        events += [(f.t0, f"FAULT {f.id} {f.kind} {f.pod or f.node}") for f in rec.faults]
        return [f"{t - self.t_start:8.3f}s {what}" for t, what in sorted(events)]

    async def delete_all(self, limit: float) -> tuple[float, list[str]]:
        """Delete every AppWrapper; wait for them, their pods and components to be gone."""
        t = time.monotonic()
        sem = asyncio.Semaphore(16)

        async def delete(name: str) -> None:
            async with sem:
                await self.kube.delete(self.refs["aw"], name, self.ns)

        # One request per AppWrapper: a collection delete of thousands can outlast any request
        # timeout on a loaded API server.
        results = await asyncio.gather(*(delete(n) for n in sorted(self.tracker.aws)), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            self.log(f"{len(failed)} deletes failed (first: {failed[0]!r}); waiting anyway")
        left: list[str] = []
        confirmed_at = 0.0
        while time.monotonic() - t < limit:
            # The watches say when everything is gone; a LIST of every AppWrapper, pod and
            # component each second would itself slow a clean-up of 10,000 AppWrappers down.
            # The LISTs only confirm what the watches say (and catch anything they missed).
            tracked = self.tracker.leftovers()
            if any(tracked.values()) or time.monotonic() - confirmed_at < 10.0:
                left = [f"{n} {what}" for what, n in tracked.items()]
                await asyncio.sleep(0.5)
                continue
            confirmed_at = time.monotonic()
            try:
                aws = await self.listing("aw")
                pods = [
                    p
                    for p in await self.listing("pod")
                    if APPWRAPPER_LABEL in (p["metadata"].get("labels") or {})
                ]
                comps = [c for k in ("job", "pytorchjob") for c in await self.listing(k)]
            except KubeApiError as exc:
                left = [f"listing failed: {exc}"]
                continue
            left = [f"{len(aws)} AppWrappers", f"{len(pods)} pods", f"{len(comps)} components"]
            if not aws and not pods and not comps:
                return time.monotonic() - t, []
        return time.monotonic() - t, [f"after {limit:.0f}s: " + ", ".join(left)]


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
    kube = await Kube.connect(kubeconfig)
    ns = namespace or f"bench-{cfg.controller}-{cfg.seed}-{int(time.time())}"
    bench = Bench(cfg, kube, kubeconfig, ns, processes, testbed_processes or {}, log)
    tasks: list[asyncio.Task[None]] = []
    nc: Any = None
    result: dict[str, Any] = {"controller": cfg.controller, "config": asdict(cfg), "namespace": ns}
    try:
        await bench.resolve()
        if namespace is None:
            namespaces = await kube.resource("v1", "Namespace")
            await kube.create(namespaces, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        for spec in workload:
            bench.tracker.aws[spec.name] = AwRec(spec)
        handlers = {
            "aw": bench.tracker.on_appwrapper,
            "pod": bench.tracker.on_pod,
            "job": bench.tracker.on_component,
            "pytorchjob": bench.tracker.on_component,
            "node": bench.tracker.on_node,
        }
        synced = {key: asyncio.Event() for key in handlers}
        tasks = [asyncio.create_task(bench.follow(k, h, synced[k])) for k, h in handlers.items()]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in synced.values())), 60)
        nc = await nats.connect(nats_url, name="respawn-bench")
        bench.js = nc.jetstream()

        async def on_verdict(msg: Any) -> None:
            now = time.time()
            with contextlib.suppress(Exception):  # not a verdict this benchmark can read
                bench.tracker.on_verdict(decode(Verdict, msg.data), now)

        await nc.subscribe(f"{subjects.VERDICT_PREFIX}.{subjects.token(ns)}.*", cb=on_verdict)
        start_cpu = _cpu(processes)
        start_self = resource.getrusage(resource.RUSAGE_SELF)

        # -- set-up: every AppWrapper running with all its pods
        log(f"submitting {len(workload)} AppWrappers x {cfg.pods_per_aw} pods into namespace {ns}")
        t_submit = time.monotonic()
        await bench.submit(workload)
        submit_s = time.monotonic() - t_submit
        if not await bench.wait_all_idle(cfg.setup_timeout, "set-up"):
            ready, total = bench.tracker.workload_idle()
            raise BenchError(f"only {ready}/{total} AppWrappers were running after {cfg.setup_timeout:.0f}s")
        setup_s = time.monotonic() - t_submit
        log(f"all {len(workload)} AppWrappers running after {setup_s:.1f}s")
        # Steady state: the controller has also caught up with the start (every PodsReady True).
        remaining = max(0.0, cfg.setup_timeout - setup_s)
        if not await bench.wait_all_idle(remaining, "controller catching up", reported=True):
            ready, total = bench.tracker.workload_idle(reported=True)
            raise BenchError(
                f"the controller reported only {ready}/{total} AppWrappers ready (PodsReady) "
                f"after {cfg.setup_timeout:.0f}s"
            )
        reported_s = time.monotonic() - t_submit
        log(f"the controller reported all ready after {reported_s:.1f}s")
        result["setup"] = {"submit_s": submit_s, "all_running_s": setup_s, "all_reported_s": reported_s}
        await asyncio.sleep(cfg.quiesce_seconds)
        # The controller manager keeps writing the Endpoints of the PyTorchJobs' Services for
        # minutes after set-up; counted in the idle window but not in the baseline, that work
        # would be charged to the controller under test.
        result["setup"]["testbed_quiet_s"] = await bench.testbed_quiet(600.0)

        # -- idle cost, controller running
        idle: Window | None = None
        if cfg.idle_seconds > 0:
            log(f"idle window ({cfg.idle_seconds:.0f}s, controller running)")
            a = await bench.snapshot()
            await asyncio.sleep(cfg.idle_seconds)
            b = await bench.snapshot()
            idle = Window.between(a, b)

        # -- faults
        log(f"injecting {len(planned)} faults over {cfg.duration:.0f}s")
        fault_start = await bench.snapshot(api=False)
        t_faults = time.monotonic()
        lifter = asyncio.create_task(bench.evictions_loop())
        tasks.append(lifter)
        await asyncio.gather(*(bench.planned_fault(p, t_faults) for p in planned))
        log(f"{len(bench.tracker.faults)} faults injected; waiting for every AppWrapper to recover")
        deadline = time.monotonic() + cfg.settle_timeout
        while not bench.settled() and time.monotonic() < deadline:  # noqa: ASYNC110 - polling with a deadline
            await asyncio.sleep(0.25)
        lifter.cancel()
        settled = bench.settled()
        await bench.lift_evictions(force=True)
        fault_end = await bench.snapshot(api=False)
        faults_s = time.monotonic() - t_faults
        log(f"fault phase {'settled' if settled else 'did NOT settle'} after {faults_s:.1f}s")
        end_state = await bench.end_state()

        # -- baseline: the same window with the controller stopped
        baseline: Window | None = None
        if cfg.idle_seconds > 0:
            log(f"baseline window ({cfg.idle_seconds:.0f}s, controller stopped)")
            async with bench.controller_stopped():
                a = await bench.snapshot()
                await asyncio.sleep(cfg.idle_seconds)
                b = await bench.snapshot()
            baseline = Window.between(a, b)
        end_cpu = _cpu(processes)
        end_self = resource.getrusage(resource.RUSAGE_SELF)

        log("deleting every AppWrapper")
        cleanup_start = await bench.snapshot()
        try:
            cleanup_s, after_delete = await bench.delete_all(cfg.cleanup_timeout)
        except KubeApiError as exc:  # the run's figures are kept whatever the clean-up does
            cleanup_s, after_delete = float("nan"), [f"clean-up failed: {exc}"]
        cleanup_end = await bench.snapshot()
        # Requests of every client (controller, garbage collector, kwok, this benchmark) while
        # the workload was deleted: where a slow clean-up's API time goes.
        cleanup_requests = {
            k: n - cleanup_start.api.get(k, 0.0)
            for k, n in cleanup_end.api.items()
            if not k.startswith("WATCH") and n - cleanup_start.api.get(k, 0.0) >= 1
        }
        unrecovered = [f"fault {f.id} ({f.kind} on {f.aw})" for f in bench.tracker.faults if f.t_done is None]
        correctness = {
            **end_state,
            "unrecovered": unrecovered,
            "orphans_after_delete": after_delete,
        }
        correctness["ok"] = settled and not any(v for k, v in correctness.items() if k in VIOLATIONS)
        result.update(
            {
                "workload": {
                    "appwrappers": len(workload),
                    "pods": sum(s.pods for s in workload),
                    "gpu_appwrappers": sum(1 for s in workload if s.gpu),
                    "pytorchjobs": sum(1 for s in workload if s.kind == "pytorchjob"),
                },
                "faults": {
                    "planned": len(planned),
                    "injected": dict(Counter(f.kind for f in bench.tracker.faults if f.timed)),
                    "late_evict_victims": sum(1 for f in bench.tracker.faults if not f.timed),
                    "evictions": len(bench.tracker.eviction_log),
                    "fell_back_to_pod_failure": dict(bench.fell_back),
                    "skipped": dict(bench.skipped),
                    "phase_s": faults_s,
                    "settled": settled,
                },
                "records": [_fault_record(f) for f in bench.tracker.faults],
                "latency": latencies(bench.tracker.faults, cfg),
                "correctness": correctness,
                "cleanup_s": cleanup_s,
                "cleanup_api_requests": dict(sorted(cleanup_requests.items(), key=lambda kv: -kv[1])),
                "cost": cost(
                    processes,
                    start_cpu,
                    end_cpu,
                    idle,
                    baseline,
                    fault_start,
                    fault_end,
                    len(bench.tracker.faults),
                ),
                "bench_cpu_s": (end_self.ru_utime + end_self.ru_stime)
                - (start_self.ru_utime + start_self.ru_stime),
            }
        )
        if idle is not None:
            result["cost"]["testbed_idle_cpu_percent"] = {
                k: v for k, v in idle.cpu_percent.items() if k in bench.testbed_processes
            }
        return result
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for pid in processes.values():  # never leave the controller stopped
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        with contextlib.suppress(Exception):
            await bench.lift_evictions(force=True)
        if namespace is None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(
                    kubectl, kubeconfig, "delete", "namespace", ns, "--wait=false", check=False
                )
        if nc is not None:
            with contextlib.suppress(Exception):
                await nc.close()
        await kube.close()


# ------------------------------------------------------------------ figures


def _fault_record(f: Fault) -> dict[str, Any]:
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
    out: dict[str, dict[str, list[float]]] = {m: {} for m in ("detection", "verdict", "reaction", "recovery")}

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
        # Left out of the totals (still shown per request): a WATCH is counted when it ends, every
        # few minutes at random; Events are written by the scheduler and Job controller minutes
        # after set-up (their broadcasters are rate-limited), while neither controller writes one
        # without a transition. Both would make two idle windows differ by dozens a minute.
        counted = [k for k in keys if not k.startswith("WATCH") and not k.endswith(" events")]
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


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value * 1000:,.0f}" if value >= 1 else f"{value * 1000:.1f}"


def figures(result: Mapping[str, Any]) -> list[tuple[str, float | None, str]]:
    """(name, value, unit) rows, the same names for every controller (compare.py lines them up)."""
    rows: list[tuple[str, float | None, str]] = []
    lat = result.get("latency", {})
    for measure in ("detection", "verdict", "reaction", "recovery"):
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
        None
        if by_request is None
        else sum(n for k, n in by_request.items() if not k.startswith("WATCH") and not k.endswith(" events"))
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


def render(result: Mapping[str, Any]) -> str:
    cfg = result.get("config", {})
    lines = [
        f"## {result['controller']}: {cfg.get('appwrappers')} AppWrappers x {cfg.get('pods_per_aw')} pods, "
        f"{cfg.get('fault_rate')} faults/s for {cfg.get('duration')}s, seed {cfg.get('seed')}",
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
    for key in VIOLATIONS:
        for item in c.get(key, [])[:10]:
            lines.append(f"  {key}: {item}")
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


# ------------------------------------------------------------------ testbed and controller


def _running_state(state_dir: Path) -> State | None:
    state = State.load(state_dir)
    if state is None:
        return None
    core = {k: v for k, v in state.running().items() if k in (*TESTBED_PROCESSES, "nats-server")}
    return state if core and all(core.values()) else None


def _ready_nodes(kubeconfig: Path) -> int:
    out = kubectl(
        kubeconfig,
        "get",
        "nodes",
        "-o",
        'jsonpath={range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\\n"}{end}',
    ).stdout.split()
    return sum(1 for s in out if s == "True")


def start_controller(controller: str, state: State, log: Log) -> tuple[dict[str, int], list[str]]:
    """Start what is not running yet; returns the controller's processes and the names started."""
    started: list[str] = []
    respawn_alive = {s: state.pids[s] for s in SERVICES if s in state.pids and pid_alive(state.pids[s])}
    if controller == "respawn":
        if len(respawn_alive) < len(SERVICES):
            install_crd(state.kubeconfig)
            for service in SERVICES:
                if service not in respawn_alive:
                    log(f"starting Respawn service {service}")
                    respawn_alive[service] = start_service(state, service)
                    started.append(service)
        return respawn_alive, started
    if respawn_alive:
        raise BenchError(
            f"the testbed in {state.state_dir} runs Respawn's services ({', '.join(respawn_alive)}), which "
            "would act on the same AppWrappers; start it with 'respawn local up --no-services' "
            "for --controller upstream"
        )
    install_crd(state.kubeconfig)
    ctl = upstream.start(state.kubeconfig, state.state_dir / "logs", log=log)
    state.pids[upstream.PROCESS_NAME] = ctl.pid  # so that `respawn local down` stops it too
    state.save()
    return {upstream.PROCESS_NAME: ctl.pid}, [upstream.PROCESS_NAME]


def run(cfg: BenchConfig, state_dir: Path | None = None, *, log: Log = stderr_log) -> dict[str, Any]:
    """Reuse the running testbed in ``state_dir``, or start one (and tear it down afterwards)."""
    if cfg.controller not in CONTROLLERS:
        raise BenchError(f"--controller must be one of {', '.join(CONTROLLERS)}")
    workload = plan_workload(cfg)
    needed = cfg.nodes or nodes_needed(cfg, workload, plan_faults(cfg))
    directory = (state_dir or Path(tempfile.mkdtemp(prefix="respawn-bench-"))).resolve()
    state = _running_state(directory)
    own = state is None
    started: list[str] = []
    ok = False

    def interrupted(signum: int, _frame: object) -> None:
        # Out of whatever the run is doing, into the clean-up below: a stopped benchmark must not
        # leave its testbed and controller processes running.
        raise KeyboardInterrupt(f"stopped by signal {signum}")

    previous = {sig: signal.signal(sig, interrupted) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        if state is None:
            if cfg.controller == "upstream":
                upstream.build(log=log)  # fail before starting anything if it cannot be built
            log(f"starting a testbed with {needed} kwok nodes in {directory}")
            state = cluster.up(directory, nodes=needed, log=log)
        else:
            have = _ready_nodes(state.kubeconfig)
            if have < needed:
                raise BenchError(
                    f"the testbed in {directory} has {have} Ready nodes; this run needs {needed} "
                    f"(start one with 'respawn local up --nodes {needed} --no-services', or omit --state-dir)"
                )
        processes, started = start_controller(cfg.controller, state, log)
        testbed = {k: v for k, v in state.pids.items() if k in TESTBED_PROCESSES}
        result = asyncio.run(
            run_bench(
                cfg,
                kubeconfig=state.kubeconfig,
                nats_url=state.nats_url,
                processes=processes,
                testbed_processes=testbed,
                log=log,
            )
        )
        result["testbed"] = {"nodes": needed if own else _ready_nodes(state.kubeconfig), "reused": not own}
        ok = bool(result["correctness"]["ok"])
        if own and not ok:
            result["logs"] = str(directory / "logs")
        return result
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if state is not None:
            for name in started:
                stop_pid(state.pids.get(name, 0))
        if own:
            # Keep every process's log when something went wrong: the evidence for the timelines.
            cluster.down(directory, keep_logs=not ok)
            if not ok:
                log(f"logs kept in {directory / 'logs'}")
        elif state is not None and started:
            for name in started:
                state.pids.pop(name, None)
                state.ports.pop(f"{name}-probes", None)
            state.save()


# ------------------------------------------------------------------ command line


def _mix(text: str) -> tuple[tuple[str, float], ...]:
    out = []
    for part in text.split(","):
        kind, _, weight = part.partition("=")
        if kind.strip() not in FAULT_KINDS:
            raise argparse.ArgumentTypeError(f"unknown fault kind {kind!r}; use {', '.join(FAULT_KINDS)}")
        try:
            value = float(weight or 1)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"weight of {kind.strip()!r} is not a number: {weight!r}"
            ) from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"weight of {kind.strip()!r} is negative: {weight}")
        out.append((kind.strip(), value))
    if not any(w > 0 for _, w in out):
        raise argparse.ArgumentTypeError("at least one fault kind needs a weight above 0")
    return tuple(out)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = BenchConfig()
    parser.add_argument("--appwrappers", type=int, default=d.appwrappers)
    parser.add_argument("--pods-per-aw", type=int, default=d.pods_per_aw)
    parser.add_argument("--fault-rate", type=float, default=d.fault_rate, help="faults per second (Poisson)")
    parser.add_argument("--duration", type=float, default=d.duration, help="seconds of fault injection")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--max-faults", type=int, default=None)
    parser.add_argument(
        "--mix", type=_mix, default=d.mix, help="e.g. pod-failure=0.7,evict=0.15,stuck-init=0.15"
    )
    parser.add_argument("--gpu-fraction", type=float, default=d.gpu_fraction)
    parser.add_argument("--pytorch-fraction", type=float, default=d.pytorch_fraction)
    parser.add_argument("--failure-grace", default=d.failure_grace)
    parser.add_argument("--retry-pause", default=d.retry_pause)
    parser.add_argument("--warmup-grace", default=d.warmup_grace, help="of the stuck-init AppWrappers")
    parser.add_argument(
        "--idle", type=float, default=d.idle_seconds, help="seconds of each idle window; 0: none"
    )
    parser.add_argument("--settle-timeout", type=float, default=d.settle_timeout)
    parser.add_argument("--setup-timeout", type=float, default=d.setup_timeout)
    parser.add_argument(
        "--cleanup-timeout", type=float, default=d.cleanup_timeout, help="for deleting every AppWrapper"
    )
    parser.add_argument("--nodes", type=int, default=None, help="kwok nodes (default: from the workload)")
    parser.add_argument("--state-dir", type=Path, default=None, help="reuse the testbed running there")


def config_from(args: argparse.Namespace, controller: str) -> BenchConfig:
    return BenchConfig(
        controller=controller,
        appwrappers=args.appwrappers,
        pods_per_aw=args.pods_per_aw,
        fault_rate=args.fault_rate,
        duration=args.duration,
        seed=args.seed,
        max_faults=args.max_faults,
        mix=args.mix,
        gpu_fraction=args.gpu_fraction,
        pytorch_fraction=args.pytorch_fraction,
        failure_grace=args.failure_grace,
        retry_pause=args.retry_pause,
        warmup_grace=args.warmup_grace,
        idle_seconds=args.idle,
        settle_timeout=args.settle_timeout,
        setup_timeout=args.setup_timeout,
        cleanup_timeout=args.cleanup_timeout,
        nodes=args.nodes,
    )


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
    print(json.dumps(result, indent=2, default=str) if args.json else render(result))


if __name__ == "__main__":
    main()
