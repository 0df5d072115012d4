"""What the benchmark does to the cluster: it creates the workload and injects the planned
faults (the kinds are described in ``bench.run``), each on a target drawn with the seed from the
AppWrappers healthy at that moment; a kind with no eligible target becomes a pod failure.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime

from bench.config import BenchConfig, PlannedFault
from bench.plan import AwSpec
from bench.progress import Log
from bench.session import Session
from bench.tracker import AwRec, Eviction, PodRec, Tracker
from bench.workload import appwrapper_manifest, failed_pod_status
from shared.kube import KubeApiError

EVICT_LABEL = "autopilot.ibm.com/gpuhealth"
EVICT_VALUE = "EVICT"
EXIT_CODES = (1, 2, 137, 143)
TRANSIENT_EXIT_CODES = frozenset({137, 143})
# Creations in flight at once: enough to load the API server, not so many that requests time out.
SUBMIT_CONCURRENCY = 32
# How often waits look at the tracker again, and how often they say how far they are.
POLL = 0.25
PROGRESS_EVERY = 15.0


def pick_pod_failure(tracker: Tracker, rng: random.Random) -> tuple[AwRec, PodRec] | None:
    """A pod of an idle AppWrapper."""
    idle = [r for _, r in sorted(tracker.aws.items()) if tracker.idle(r)]
    if not idle:
        return None
    rec = rng.choice(idle)
    pods = sorted((tracker.pods[u] for u in rec.pods), key=lambda p: p.name)
    return rec, rng.choice(pods)


def pick_eviction(tracker: Tracker, rng: random.Random) -> tuple[str, list[AwRec]] | None:
    """A node whose GPU pods all belong to idle AppWrappers, with room for them elsewhere."""
    if tracker.evictions:
        return None  # one labelled node at a time
    gpu_pods: dict[str, set[str]] = {}
    gpus_used: Counter[str] = Counter()
    for pod in tracker.pods.values():
        if pod.gpu and pod.node and pod.phase in ("Pending", "Running"):
            gpus_used[pod.node] += 1
            if not pod.deleting:
                gpu_pods.setdefault(pod.node, set()).add(pod.aw)
    free_elsewhere = {
        node: tracker.node_gpus.get(node, 0) - gpus_used[node]
        for node, labels in tracker.node_labels.items()
        if labels.get(EVICT_LABEL) is None
    }
    candidates = []
    for node, names in sorted(gpu_pods.items()):
        if tracker.node_labels.get(node, {}).get(EVICT_LABEL) is not None:
            continue
        if not all(tracker.idle(tracker.aws[n]) for n in names):
            continue
        room = sum(free for other, free in free_elsewhere.items() if other != node)
        if room >= gpus_used[node]:
            candidates.append(node)
    if not candidates:
        return None
    node = rng.choice(candidates)
    return node, [tracker.aws[n] for n in sorted(gpu_pods[node])]


class Driver:
    def __init__(self, cfg: BenchConfig, session: Session, tracker: Tracker, log: Log) -> None:
        self.cfg = cfg
        self.session = session
        self.tracker = tracker
        self.log = log
        self.rng = random.Random(f"targets-{cfg.seed}")
        self.skipped: Counter[str] = Counter()
        self.fell_back: Counter[str] = Counter()
        self.stuck_count = 0

    # -------------------------------------------------------------- the workload

    async def submit(self, workload: Sequence[AwSpec]) -> None:
        for spec in workload:
            self.tracker.aws[spec.name] = AwRec(spec)
        sem = asyncio.Semaphore(SUBMIT_CONCURRENCY)

        async def create(spec: AwSpec) -> None:
            async with sem:
                await self._create(spec)

        await asyncio.gather(*(create(s) for s in workload))

    async def _create(self, spec: AwSpec) -> None:
        s = self.session
        await s.kube.create(s.refs["aw"], appwrapper_manifest(spec, self.cfg), s.namespace)

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
            if time.monotonic() - last_report > PROGRESS_EVERY:
                self.log(
                    f"{what}: {ready}/{total} AppWrappers {'reported ' if reported else ''}ready, "
                    f"{self.tracker.running_pods()} pods running"
                )
                last_report = time.monotonic()
            await asyncio.sleep(POLL)

    # -------------------------------------------------------------- faults

    async def inject_and_settle(self, planned: Sequence[PlannedFault], settle_timeout: float) -> bool:
        """Each planned fault at its time after now, then poll (with a deadline) until every fault
        is over and every workload idle again; whether it settled.

        Meanwhile a side task lifts each EVICT label once its AppWrappers have all moved; what is
        still labelled at the end is lifted regardless."""
        start = time.monotonic()
        lifter = asyncio.create_task(self._lift_evictions_continually())
        try:
            await asyncio.gather(*(self._planned_fault(p, start) for p in planned))
            self.log(f"{len(self.tracker.faults)} faults injected; waiting for every AppWrapper to recover")
            deadline = time.monotonic() + settle_timeout
            while not self.tracker.settled() and time.monotonic() < deadline:  # noqa: ASYNC110 - polling with a deadline
                await asyncio.sleep(POLL)
            settled = self.tracker.settled()
        finally:
            lifter.cancel()
        await self.lift_evictions(force=True)
        return settled

    async def _planned_fault(self, planned: PlannedFault, start: float) -> None:
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

    async def inject(self, kind: str) -> bool:
        """One fault of ``kind`` now; False when no target is eligible (or it vanished)."""
        if kind == "pod-failure":
            return await self._fail_pod()
        if kind == "evict":
            return await self._evict()
        return await self._stuck_init()

    async def _fail_pod(self) -> bool:
        now = time.time()
        pick = pick_pod_failure(self.tracker, self.rng)
        if pick is None:
            return False
        rec, pod = pick
        code = self.rng.choice(EXIT_CODES)
        # By the default failure table a container stopped by SIGKILL (137) or SIGTERM (143) is
        # Transient: retried without counting toward resettingCount (docs/failures.md).
        fault = self.tracker.add_fault(
            "pod-failure",
            rec,
            now,
            counted=code not in TRANSIENT_EXIT_CODES,
            node=pod.node,
            pod=pod.name,
            exit_code=code,
        )
        s = self.session
        patch = failed_pod_status(pod.containers, code, datetime.fromtimestamp(now, UTC))
        try:
            await s.kube.patch(s.refs["pod"], pod.name, patch, s.namespace, subresource="status")
        except KubeApiError as exc:
            self.tracker.withdraw(fault)
            self.log(f"pod failure on {pod.name} not written ({exc}); another target")
            return False
        return True

    async def _evict(self) -> bool:
        now = time.time()
        picked = pick_eviction(self.tracker, self.rng)
        if picked is None:
            return False
        node, affected = picked
        eviction = Eviction(node, now, {r.spec.name for r in affected})
        self.tracker.evictions[node] = eviction
        self.tracker.eviction_log.append(eviction)
        for rec in affected:
            self.tracker.add_fault("evict", rec, now, counted=False, node=node)
        await self._label(node, EVICT_VALUE)
        return True

    async def _stuck_init(self) -> bool:
        """A new AppWrapper whose pods never finish initialising."""
        now = time.time()
        self.stuck_count += 1
        spec = AwSpec(f"init-{self.stuck_count:03d}", "stuck-init", self.cfg.stuck_init_pods, False)
        rec = AwRec(spec)
        self.tracker.aws[spec.name] = rec
        self.tracker.add_fault("stuck-init", rec, now, counted=True)
        await self._create(spec)
        return True

    async def _label(self, node: str, value: str | None) -> None:
        s = self.session
        await s.kube.patch(s.refs["node"], node, {"metadata": {"labels": {EVICT_LABEL: value}}})

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
                await self._label(node, None)

    async def _lift_evictions_continually(self) -> None:
        while True:
            await self.lift_evictions()
            await asyncio.sleep(POLL)
