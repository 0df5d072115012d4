"""What the watches show: the benchmark's view of its namespace, and when each fault was
detected, acted on and recovered from.

Timestamps are arrival times of watch events (and verdict messages) at this process, so every
latency derived from them includes one delivery: an upper bound. Handlers never block, so one
slow handler cannot delay the arrival time of the next event.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bench.plan import AwSpec
from bench.session import COMPONENTS, Session
from respawn.testbed.cluster import GPU_RESOURCE
from shared import subjects
from shared.appwrapper.constants import APPWRAPPER_LABEL
from shared.kube.watch import list_then_watch
from shared.kubetime import parse_kube_time
from shared.messages import LifecycleEvent, Verdict, decode

# How long the watches may take to list what exists before the run gives up.
SYNC_TIMEOUT = 60.0

Handler = Callable[[str, Mapping[str, Any], float], None]


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
    # Respawn: its lifecycle's announcement of the reset (Resetting or Failed) on its stream, and
    # the time that announcement gives for the decision (before the status write).
    t_announced: float | None = None
    t_decided: float | None = None
    t_unhealthy: float | None = None
    reason: str = ""
    t_delete: float | None = None
    t_recovered: float | None = None
    t_done: float | None = None


# The phases whose announcement is the reset's (or the failure's) decision being written.
ANNOUNCED_PHASES = ("Resetting", "Failed")


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

    def running_pods(self) -> int:
        return sum(1 for p in self.pods.values() if p.phase == "Running" and not p.deleting)

    def settled(self) -> bool:
        """Every workload idle again, every fault over, no node left labelled."""
        ready, total = self.workload_idle()
        return ready == total and all(f.t_done is not None for f in self.faults) and not self.evictions

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
            deployed_at = parse_kube_time(rec.deployed_at)
            for f in rec.faults:
                if f.kind == "stuck-init" and f.deadline is None and deployed_at is not None:
                    f.deadline = deployed_at.timestamp() + self.warmup_seconds
        rec.resetting_count = int(status.get("resettingCount") or 0)
        entry = (now, phase, rec.resetting_count, str(unhealthy_cond.get("reason", "")) if unhealthy else "")
        if not rec.history or rec.history[-1][1:] != entry[1:]:
            rec.history.append(entry)
        self._check(rec, now)

    def _owner(self, meta: Mapping[str, Any]) -> AwRec | None:
        """The AppWrapper of the workload an object is labelled for, if any."""
        return self.aws.get((meta.get("labels") or {}).get(APPWRAPPER_LABEL, ""))

    def on_pod(self, etype: str, obj: Mapping[str, Any], now: float) -> None:
        meta = obj.get("metadata", {})
        if (rec := self._owner(meta)) is None:
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
        if (rec := self._owner(meta)) is None:
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

    def on_lifecycle(self, event: LifecycleEvent, now: float) -> None:
        """Lifecycle entered a phase: a reset (or a failure) is the announcement of what the
        watch later shows as Unhealthy, arriving without the watch's delivery."""
        if event.event != "PhaseChanged" or event.phase not in ANNOUNCED_PHASES:
            return
        rec = self.aws.get(event.ref.name)
        if rec is None:
            return
        decided = event.at.timestamp()
        for f in rec.active():
            if f.t_announced is None and now >= f.t0:
                f.t_announced = now
                f.t_decided = decided

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


# ------------------------------------------------------------------ feeding it


async def _follow(session: Session, key: str, handler: Handler, synced: asyncio.Event) -> None:
    namespace = None if key == "node" else session.namespace
    async for event in list_then_watch(session.kube, session.refs[key], namespace=namespace):
        if event.type == "SYNCED":
            synced.set()
            continue
        handler(event.type, event.obj, time.time())


async def watch(session: Session, tracker: Tracker) -> list[asyncio.Task[None]]:
    """Start a watch of each kind the tracker follows; returns once every one has listed what
    exists (the tasks run until cancelled)."""
    handlers: dict[str, Handler] = {
        "aw": tracker.on_appwrapper,
        "pod": tracker.on_pod,
        **{key: tracker.on_component for key in COMPONENTS},
        "node": tracker.on_node,
    }
    synced = {key: asyncio.Event() for key in handlers}
    tasks = [asyncio.create_task(_follow(session, k, h, synced[k])) for k, h in handlers.items()]
    try:
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in synced.values())), SYNC_TIMEOUT)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    return tasks


async def subscribe_verdicts(nc: Any, namespace: str, tracker: Tracker) -> None:
    """Feed Respawn's verdicts and lifecycle announcements for the namespace to the tracker
    (upstream publishes neither)."""

    async def on_lifecycle(msg: Any) -> None:
        now = time.time()
        with contextlib.suppress(Exception):  # not an announcement this benchmark can read
            tracker.on_lifecycle(decode(LifecycleEvent, msg.data, msg.headers), now)

    await nc.subscribe(subjects.lifecycle_filter(namespace), cb=on_lifecycle)

    async def on_verdict(msg: Any) -> None:
        now = time.time()
        with contextlib.suppress(Exception):  # not a verdict this benchmark can read
            tracker.on_verdict(decode(Verdict, msg.data, msg.headers), now)

    await nc.subscribe(subjects.verdict_filter(namespace), cb=on_verdict)
