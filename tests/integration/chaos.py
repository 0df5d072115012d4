"""Chaos on the testbed (test support): Respawn's services as replicated processes that a
background thread SIGKILLs at random and starts again, and a fault plan injected one pod
failure at a time into workloads that are healthy at that moment.

The ledger (faults injected per AppWrapper, kills per process) is what the tests compare
the AppWrappers' final status with: 0 lost and 0 duplicated resets.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from respawn.testbed import manifests, sim
from respawn.testbed.errors import TestbedError
from respawn.testbed.services import ServiceProcess, spawn_service, stop_all
from shared.appwrapper.constants import APPWRAPPER_LABEL
from shared.appwrapper.model import read_appwrapper
from tests.integration.objects import FAST_RESET, apply
from tests.waiting import PATIENCE

# Every service, the replicated ones twice, as a production install runs them.
REPLICAS: tuple[tuple[str, str], ...] = (
    ("watcher", ""),
    ("health", "a"),
    ("health", "b"),
    ("lifecycle", "a"),
    ("lifecycle", "b"),
    ("autopilot", ""),
)


class Fleet:
    """One process per entry of :data:`REPLICAS`, each restartable by its name."""

    def __init__(self, kubeconfig: Path, nats_url: str, log_dir: Path) -> None:
        self.kubeconfig = kubeconfig
        self.nats_url = nats_url
        self.log_dir = log_dir
        self.procs: dict[str, ServiceProcess] = {}
        self.specs = {f"{s}-{i}" if i else s: (s, i) for s, i in REPLICAS}
        self._lock = threading.Lock()

    def start(self, name: str, *, attempts: int = 3) -> None:
        service, instance = self.specs[name]
        last: TestbedError | None = None
        # A process started while NATS or the API server is itself restarting may exit before it
        # is ready; that is the platform's restart loop, so try again as a kubelet would.
        for _ in range(attempts):
            try:
                sp = spawn_service(
                    service,
                    kubeconfig=self.kubeconfig,
                    nats_url=self.nats_url,
                    log_dir=self.log_dir,
                    instance=instance,
                    ready_timeout=90,
                )
            except TestbedError as exc:
                last = exc
                continue
            with self._lock:
                self.procs[name] = sp
            return
        raise TestbedError(f"{name} did not start again after {attempts} attempts: {last}")

    def start_all(self) -> None:
        for name in self.specs:
            self.start(name)

    def kill(self, name: str) -> None:
        with self._lock:
            sp = self.procs.pop(name)
        sp.kill()

    def stop_all(self) -> None:
        with self._lock:
            procs, self.procs = list(self.procs.values()), {}
        stop_all(procs)

    def dead(self) -> list[str]:
        """Processes that exited on their own (not killed by the chaos)."""
        with self._lock:
            return [name for name, sp in self.procs.items() if not sp.alive()]


class Killer(threading.Thread):
    """Every ``every`` seconds: SIGKILL one process picked at random, then start it again."""

    def __init__(self, fleet: Fleet, *, every: float, seed: int) -> None:
        super().__init__(name="chaos-killer", daemon=True)
        self.fleet = fleet
        self.every = every
        self.rng = random.Random(seed)
        self.kills: Counter[str] = Counter()
        self.errors: list[str] = []
        self._halt = threading.Event()

    def run(self) -> None:
        names = sorted(self.fleet.specs)
        # Event.wait paces the kills; nothing waits on a condition here.
        while not self._halt.wait(self.every):
            name = self.rng.choice(names)
            try:
                self.fleet.kill(name)
                self.kills[name] += 1
                self.fleet.start(name)
            except (TestbedError, KeyError) as exc:
                self.errors.append(f"{name}: {exc}")
                return

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=120)


@contextlib.contextmanager
def killing(fleet: Fleet, *, every: float, seed: int) -> Iterator[Killer]:
    killer = Killer(fleet, every=every, seed=seed)
    killer.start()
    try:
        yield killer
    finally:
        killer.stop()


# ----------------------------------------------------------------------------- workloads


@dataclass
class Workload:
    """One AppWrapper of the plan: how many faults it gets, and what it must end as."""

    name: str
    faults: int
    retry_limit: int
    injected: int = 0

    @property
    def expected_phase(self) -> str:
        return "Failed" if self.injected > self.retry_limit else "Succeeded"

    @property
    def expected_resets(self) -> int:
        """Every injected fault is one reset, up to the retry limit (the fault past it fails
        the workload instead)."""
        return min(self.injected, self.retry_limit)


@dataclass
class Plan:
    namespace: str
    workloads: list[Workload]
    pods: int = 2
    # A pod completes this long after it starts; faults go only into pods younger than
    # ``fault_window`` so an injected failure never races the pod's own completion.
    # The margin between the two is what a loaded machine may delay an injection by: the test
    # process polls the pods, and on 2 busy cores a pass can take seconds.
    # Both stretch with the tests' patience (tests/waiting.py): on a machine shared with other
    # workers an injection comes later.
    succeed_after: int = round(30 * PATIENCE)
    fault_window: float = 20.0 * PATIENCE
    rng: random.Random = field(default_factory=lambda: random.Random(1))

    @property
    def total_faults(self) -> int:
        return sum(w.faults for w in self.workloads)

    @property
    def injected(self) -> int:
        return sum(w.injected for w in self.workloads)


def plan(namespace: str, count: int, *, doomed: int = 0, seed: int = 1) -> Plan:
    """``count`` workloads with 0, 1 or 2 faults each; ``doomed`` more that get one fault past
    their retry limit of 1 and must end Failed."""
    rng = random.Random(seed)
    workloads = [Workload(f"w{i:02d}", faults=i % 3, retry_limit=4) for i in range(count)]
    workloads += [Workload(f"d{i:02d}", faults=2, retry_limit=1) for i in range(doomed)]
    return Plan(namespace, workloads, rng=rng)


def submit(kubeconfig: Path, p: Plan) -> None:
    for w in p.workloads:
        annotations = {**FAST_RESET, **manifests.fault_tolerance(retry_limit=w.retry_limit)}
        aw = manifests.job_appwrapper(
            w.name,
            pods=p.pods,
            pod_annotations={sim.SUCCEED_AFTER: f"{p.succeed_after}s"},
            annotations=annotations,
        )
        apply(kubeconfig, p.namespace, aw)


def items(kubeconfig: Path, kind: str, namespace: str) -> list[dict[str, Any]]:
    """``kubectl get`` of a list; [] while the API server does not answer (it may be restarting)."""
    try:
        listed = sim.get_json(kubeconfig, kind, "-n", namespace)
    except TestbedError:
        return []
    items: list[dict[str, Any]] = listed["items"]
    return items


def _age(obj: dict[str, Any], now: datetime) -> float:
    created = datetime.fromisoformat(obj["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
    return (now - created).total_seconds()


def healthy_targets(p: Plan, appwrappers: list[dict[str, Any]], pods: list[dict[str, Any]]) -> dict[str, str]:
    """Workload name → a pod to fail, for each workload that has faults left and is healthy now:
    Running, every earlier fault counted, and exactly its pods Running and young."""
    by_name = {aw["metadata"]["name"]: read_appwrapper(aw) for aw in appwrappers}
    pods_of: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        owner = (pod["metadata"].get("labels") or {}).get(APPWRAPPER_LABEL)
        if owner:
            pods_of.setdefault(owner, []).append(pod)
    now = datetime.now(UTC)
    targets: dict[str, str] = {}
    for w in p.workloads:
        aw = by_name.get(w.name)
        if w.injected >= w.faults or aw is None:
            continue
        if aw.phase != "Running" or aw.resetting_count != w.injected:
            continue
        mine = pods_of.get(w.name, [])
        ready = [
            pod
            for pod in mine
            if (pod.get("status") or {}).get("phase") == "Running"
            and not pod["metadata"].get("deletionTimestamp")
            and _age(pod, now) < p.fault_window
        ]
        if len(mine) == p.pods and len(ready) == p.pods:
            targets[w.name] = p.rng.choice(ready)["metadata"]["name"]
    return targets


def inject_round(kubeconfig: Path, p: Plan) -> int:
    """Fail one pod in each workload that has faults left and is healthy now; returns how many."""
    targets = healthy_targets(
        p, items(kubeconfig, "appwrappers", p.namespace), items(kubeconfig, "pods", p.namespace)
    )
    done = 0
    for w in p.workloads:
        if w.name in targets and _fail(kubeconfig, p.namespace, targets[w.name]):
            w.injected += 1
            done += 1
    return done


def _fail(kubeconfig: Path, namespace: str, pod: str) -> bool:
    try:
        sim.fail_pod(kubeconfig, namespace, pod, exit_code=1)
    except TestbedError:
        return False  # the API server is restarting: this fault was not injected
    return True


@dataclass
class Outcome:
    name: str
    phase: str
    resets: int
    expected_phase: str
    expected_resets: int

    @property
    def right(self) -> bool:
        return (self.phase, self.resets) == (self.expected_phase, self.expected_resets)


def outcomes(kubeconfig: Path, p: Plan) -> list[Outcome]:
    by_name = {
        aw["metadata"]["name"]: read_appwrapper(aw) for aw in items(kubeconfig, "appwrappers", p.namespace)
    }
    out = []
    for w in p.workloads:
        aw = by_name.get(w.name)
        phase, resets = (aw.phase, aw.resetting_count) if aw is not None else ("<gone>", -1)
        out.append(Outcome(w.name, phase, resets, w.expected_phase, w.expected_resets))
    return out


def ledger(p: Plan, found: list[Outcome], kills: Counter[str], extra: dict[str, int]) -> str:
    lost = sum(max(0, o.expected_resets - o.resets) for o in found)
    duplicated = sum(max(0, o.resets - o.expected_resets) for o in found)
    wrong = [
        f"{o.name}: {o.phase}/{o.resets}, expected {o.expected_phase}/{o.expected_resets}"
        for o in found
        if not o.right
    ]
    parts = [
        f"{len(p.workloads)} workloads",
        f"{p.injected} faults injected",
        f"{sum(kills.values())} kills ({', '.join(f'{k} {v}' for k, v in sorted(kills.items()))})",
        *(f"{v} {k}" for k, v in extra.items()),
        f"lost {lost}",
        f"duplicated {duplicated}",
    ]
    return "; ".join(parts) + (f"; wrong: {wrong}" if wrong else "")
