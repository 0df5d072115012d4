"""The API requests lifecycle makes, per AppWrapper and per reconcile pass, over one life of each
AppWrapper: created, running, one fault, reset, running again, deleted.

On the local testbed (a running one with --state-dir, which must run no Respawn services:
`respawn local up --no-services`; otherwise one started here and torn down after), it starts the
services a reset needs, watcher, health and lifecycle, each its own process, from this checkout
or from --services-from DIR (another checkout of Respawn, e.g. the code before a change, with
the Kubernetes layer's request counter). Then N AppWrappers, each one Job of --pods pods with no
failure grace and no retry pause, go through three phases:

  create    submitted; until every one is Running with PodsReady True
  reset     one pod of each fails (the status a kubelet writes for a crash); until every one is
            Running again with resettingCount 1 and PodsReady True
  clean-up  every AppWrapper deleted; until no AppWrapper, Job or labelled pod is left

Each phase ends once lifecycle has made no reconcile pass for 2 s. For each phase it reads, from
lifecycle's /metrics before and after, lifecycle's own count of its requests by verb and resource
(respawn_kube_requests_total) and its reconcile passes (respawn_lifecycle_reconcile_passes_total),
and prints them per AppWrapper and per pass, with each service's CPU-seconds in the phase
(/proc/<pid>/stat before and after): per AppWrapper, and lifecycle's per pass; and, from the
watcher's /metrics, the watch events it published and those it skipped as unchanged, by
observation kind, per AppWrapper: the messages each phase sends through the bus. The API server's
own apiserver_request_total over the same window (every client's: the other services, the
controller manager, kwok, this benchmark) is in the JSON for reference.

.venv/bin/python -m bench.apirequests [--appwrappers 100] [--pods 1] [--state-dir DIR]
    [--services-from DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client.parser import text_string_to_metric_families

from bench import procstat
from bench.polling import until
from bench.samples import api_requests
from bench.session import Session
from bench.testbed import running_state
from bench.workload import failed_pod_status, job_appwrapper
from respawn.testbed import cluster, manifests
from respawn.testbed.cluster import State, kubectl
from respawn.testbed.process import pid_alive
from respawn.testbed.services import SERVICES, ServiceProcess, install_crd, spawn_service
from shared.appwrapper.constants import APPWRAPPER_LABEL

# What a reset needs: observations, verdicts, and the service measured.
NEEDED = ("watcher", "health", "lifecycle")
# The verbs of the table, in this order.
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete")
# How long each phase may take.
PHASE_LIMIT = 600.0
# Lifecycle is done with a phase once it has made no pass for this long.
QUIET = 2.0
CONCURRENCY = 16


@dataclass
class Reading:
    """Lifecycle's counters at one instant, and the API server's."""

    requests: dict[tuple[str, str], float]  # (verb, resource) -> count
    passes: float
    conflicts: float  # status writes that lost to a newer version (409)
    apiserver: dict[str, float]
    cpu: dict[str, float]  # service -> CPU seconds so far (/proc)
    # ("published" | "unchanged", observation kind) -> the watcher's count so far
    observations: dict[tuple[str, str], float] = field(default_factory=dict)


@dataclass
class Phase:
    name: str
    seconds: float
    passes: float
    conflicts: float = 0.0
    requests: dict[tuple[str, str], float] = field(default_factory=dict)
    apiserver: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)  # service -> CPU seconds in the phase
    # ("published" | "unchanged", observation kind) -> the watcher's count in the phase
    observations: dict[tuple[str, str], float] = field(default_factory=dict)


# A counter's labels, as a reading keys them.
K = TypeVar("K")


def grown(before: Mapping[K, float], after: Mapping[K, float]) -> dict[K, float]:
    """What each counter grew by between two readings, leaving out those that did not (pure)."""
    return {
        key: value - before.get(key, 0.0) for key, value in after.items() if value != before.get(key, 0.0)
    }


# The watcher's counters of what it did with each watch event: published it, or skipped it as
# unchanged in what the observation carries.
WATCHER_COUNTERS = {
    "respawn_watcher_observations_published_total": "published",
    "respawn_watcher_observations_unchanged_total": "unchanged",
}


def watcher_counters(metrics_text: str) -> dict[tuple[str, str], float]:
    """The watcher's observations published and skipped as unchanged, by observation kind."""
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            what = WATCHER_COUNTERS.get(sample.name)
            if what is not None:
                key = (what, sample.labels.get("kind", ""))
                out[key] = out.get(key, 0.0) + sample.value
    return out


def lifecycle_counters(metrics_text: str) -> tuple[dict[tuple[str, str], float], float, float]:
    """respawn_kube_requests_total by (verb, resource), respawn_lifecycle_reconcile_passes_total
    and respawn_lifecycle_status_conflicts_total."""
    requests: dict[tuple[str, str], float] = {}
    passes: float | None = None
    conflicts = 0.0
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == "respawn_kube_requests_total":
                key = (sample.labels.get("verb", ""), sample.labels.get("resource", ""))
                requests[key] = requests.get(key, 0.0) + sample.value
            elif sample.name == "respawn_lifecycle_reconcile_passes_total":
                passes = sample.value
            elif sample.name == "respawn_lifecycle_status_conflicts_total":
                conflicts = sample.value
    if passes is None:
        raise SystemExit(
            "lifecycle's /metrics has no respawn_lifecycle_reconcile_passes_total: the code in "
            "--services-from must count its passes and its requests (respawn_kube_requests_total)"
        )
    return requests, passes, conflicts


class Bench:
    def __init__(
        self,
        state: State,
        services: Mapping[str, ServiceProcess],
        session: Session,
        count: int,
        pods: int,
    ) -> None:
        self.state = state
        self.lifecycle = services["lifecycle"]
        self.watcher = services["watcher"]
        self.pids = {name: sp.pid for name, sp in services.items()}
        self.session = session
        self.names = [f"aw-{i:05d}" for i in range(count)]
        self.pods = pods

    async def reading(self) -> Reading:
        text = await asyncio.to_thread(self.lifecycle.metrics)
        requests, passes, conflicts = lifecycle_counters(text)
        raw = (await asyncio.to_thread(kubectl, self.state.kubeconfig, "get", "--raw", "/metrics")).stdout
        observations = watcher_counters(await asyncio.to_thread(self.watcher.metrics))
        return Reading(
            requests, passes, conflicts, api_requests(raw), procstat.cpu_seconds(self.pids), observations
        )

    async def passes(self) -> float:
        """Lifecycle's reconcile passes so far: all that waiting for quiet reads, twice a second
        (not the API server's /metrics through a kubectl process, nor the watcher's)."""
        return lifecycle_counters(await asyncio.to_thread(self.lifecycle.metrics))[1]

    async def quiet(self) -> float:
        """Wait until lifecycle has made no pass for QUIET seconds; its pass count then."""
        last = await self.passes()
        since = time.monotonic()
        while time.monotonic() - since < QUIET:
            await asyncio.sleep(0.5)
            now = await self.passes()
            if now != last:
                last, since = now, time.monotonic()
        return last

    async def phase(self, name: str, act: Callable[[], Awaitable[None]]) -> Phase:
        await self.quiet()
        before = await self.reading()
        t = time.monotonic()
        await act()
        await self.quiet()
        after = await self.reading()
        out = Phase(
            name, time.monotonic() - t, after.passes - before.passes, after.conflicts - before.conflicts
        )
        out.requests = grown(before.requests, after.requests)
        for service, value in after.cpu.items():
            out.cpu[service] = round(value - before.cpu.get(service, value), 2)
        out.observations = grown(before.observations, after.observations)
        out.apiserver = grown(before.apiserver, after.apiserver)
        print(
            f"  {name}: {out.seconds:.1f}s, {out.passes:.0f} reconcile passes, "
            f"{out.conflicts:.0f} status conflicts; CPU-s "
            + ", ".join(f"{service} {cpu:.2f}" for service, cpu in sorted(out.cpu.items())),
            file=sys.stderr,
            flush=True,
        )
        return out

    async def appwrappers(self) -> list[dict[str, Any]]:
        return [a for a in await self.session.listing("aw") if a["metadata"]["name"] in set(self.names)]

    async def all_running(self, resets: int) -> bool:
        aws = await self.appwrappers()
        done = [
            a
            for a in aws
            if (a.get("status") or {}).get("phase") == "Running"
            and (a.get("status") or {}).get("resettingCount", 0) == resets
            and any(
                c.get("type") == "PodsReady" and c.get("status") == "True"
                for c in (a.get("status") or {}).get("conditions") or []
            )
        ]
        return len(done) == len(self.names)

    async def create(self) -> None:
        annotations = manifests.fault_tolerance(failure_grace="0s", retry_pause="0s", retry_limit=5)
        sem = asyncio.Semaphore(CONCURRENCY)

        async def one(name: str) -> None:
            async with sem:
                body = job_appwrapper(name, self.pods, annotations)
                await self.session.kube.create(self.session.refs["aw"], body, self.session.namespace)

        await asyncio.gather(*(one(n) for n in self.names))
        await until("every AppWrapper Running", lambda: self.all_running(0), within=PHASE_LIMIT, every=1.0)

    async def fail_one_pod_each(self) -> None:
        kube, ns, pods_ref = self.session.kube, self.session.namespace, self.session.refs["pod"]
        listing = await kube.list(pods_ref, ns, labelSelector=APPWRAPPER_LABEL)
        victims: dict[str, dict[str, Any]] = {}
        for pod in listing.get("items", []):
            owner = (pod["metadata"].get("labels") or {}).get(APPWRAPPER_LABEL)
            running = (pod.get("status") or {}).get("phase") == "Running"
            if owner in set(self.names) and running and not pod["metadata"].get("deletionTimestamp"):
                victims.setdefault(owner, pod)
        if len(victims) != len(self.names):
            raise SystemExit(f"only {len(victims)} of {len(self.names)} AppWrappers have a running pod")
        sem = asyncio.Semaphore(CONCURRENCY)

        async def fail(pod: dict[str, Any]) -> None:
            containers = [(c["name"], c.get("image", "")) for c in pod["spec"]["containers"]]
            async with sem:
                await kube.patch(
                    pods_ref,
                    pod["metadata"]["name"],
                    failed_pod_status(containers, 1, datetime.now(UTC)),
                    ns,
                    subresource="status",
                )

        await asyncio.gather(*(fail(p) for p in victims.values()))
        await until(
            "every AppWrapper reset and Running", lambda: self.all_running(1), within=PHASE_LIMIT, every=1.0
        )

    async def clean_up(self) -> None:
        kube, ns = self.session.kube, self.session.namespace
        sem = asyncio.Semaphore(CONCURRENCY)

        async def delete(name: str) -> None:
            async with sem:
                await kube.delete(self.session.refs["aw"], name, ns)

        await asyncio.gather(*(delete(n) for n in self.names))

        async def gone() -> bool:
            left = [
                *(await self.appwrappers()),
                *(await self.session.listing("job")),
                *(
                    p
                    for p in await self.session.listing("pod")
                    if APPWRAPPER_LABEL in (p["metadata"].get("labels") or {})
                ),
            ]
            return not left

        await until("every AppWrapper, Job and pod gone", gone, within=PHASE_LIMIT, every=1.0)


def per(value: float, count: float) -> str:
    return f"{value / count:.2f}" if count else "-"


def table(phases: list[Phase], count: int) -> str:
    """Lifecycle's requests per AppWrapper and per pass, by phase and verb (and resource)."""
    lines = [
        f"lifecycle's API requests, {count} AppWrappers (per AppWrapper | per reconcile pass)",
        f"{'phase':<10} {'passes/AW':>9}  " + "  ".join(f"{v:>13}" for v in VERBS) + f"  {'all':>13}",
    ]
    total = Phase("total", sum(p.seconds for p in phases), sum(p.passes for p in phases))
    for p in phases:
        for key, value in p.requests.items():
            total.requests[key] = total.requests.get(key, 0.0) + value
    for p in [*phases, total]:
        by_verb = {v: sum(n for (verb, _), n in p.requests.items() if verb == v) for v in VERBS}
        cells = [f"{per(by_verb[v], count):>6}|{per(by_verb[v], p.passes):<6}" for v in VERBS]
        every = sum(by_verb.values())
        lines.append(
            f"{p.name:<10} {per(p.passes, count):>9}  "
            + "  ".join(cells)
            + f"  {per(every, count):>6}|{per(every, p.passes):<6}"
        )
    services = sorted({service for p in phases for service in p.cpu})
    if services:
        lines.append("CPU-seconds by service (ms per AppWrapper; lifecycle also ms per pass):")
        for p in phases:
            cpu = {s: p.cpu.get(s, 0.0) for s in services}
            cells = [f"{s} {cpu[s]:.2f} ({per(1000 * cpu[s], count)})" for s in services]
            lifecycle = per(1000 * p.cpu.get("lifecycle", 0.0), p.passes)
            lines.append(f"  {p.name:<10} " + ", ".join(cells) + f"; lifecycle per pass {lifecycle} ms")
    kinds = sorted({kind for p in phases for _, kind in p.observations})
    if kinds:
        lines.append("watch events the watcher published | skipped as unchanged (per AppWrapper):")
        for p in phases:
            cells = [
                f"{kind} {per(p.observations.get(('published', kind), 0.0), count)}"
                f"|{per(p.observations.get(('unchanged', kind), 0.0), count)}"
                for kind in kinds
            ]
            lines.append(f"  {p.name:<10} " + ", ".join(cells))
    lines.append("by resource (total per AppWrapper):")
    for (verb, resource), value in sorted(total.requests.items()):
        lines.append(f"  {verb:<7} {resource:<28} {per(value, count)}")
    return "\n".join(lines)


@contextlib.contextmanager
def testbed(state_dir: Path | None, nodes: int) -> Iterator[State]:
    """The running testbed in ``state_dir`` (without Respawn services), or one started here."""
    if state_dir is not None:
        state = running_state(state_dir.resolve())
        if state is None:
            raise SystemExit(
                f"no running testbed in {state_dir}; start one with 'respawn local up --no-services'"
            )
        alive = [s for s in SERVICES if s in state.pids and pid_alive(state.pids[s])]
        if alive:
            raise SystemExit(
                f"the testbed in {state_dir} runs Respawn services ({', '.join(alive)}), whose requests and "
                "reconciles would mix with the ones measured; start it with 'respawn local up --no-services'"
            )
        yield state
        return
    directory = Path(tempfile.mkdtemp(prefix="respawn-apirequests-"))
    print(f"starting a testbed with {nodes} kwok nodes in {directory}", file=sys.stderr, flush=True)
    state = cluster.up(directory, nodes=nodes)
    try:
        yield state
    finally:
        cluster.down(directory)


async def measure(state: State, services_from: Path, count: int, pods: int) -> dict[str, Any]:
    install_crd(state.kubeconfig)
    env = {"PYTHONPATH": str(services_from), "PYTHONSAFEPATH": "1", **state.nats_tls_env()}
    logs = state.state_dir / "logs"
    started: dict[str, ServiceProcess] = {}
    try:
        for service in NEEDED:
            print(f"starting {service} from {services_from}", file=sys.stderr, flush=True)
            started[service] = await asyncio.to_thread(
                spawn_service,
                service,
                kubeconfig=state.kubeconfig,
                nats_url=state.nats_url,
                log_dir=logs,
                instance="apirequests",
                env=env,
            )
        session = await Session.connect(state.kubeconfig, f"bench-apireq-{int(time.time())}")
        try:
            await session.create_namespace()
            bench = Bench(state, started, session, count, pods)
            phases = [
                await bench.phase("create", bench.create),
                await bench.phase("reset", bench.fail_one_pod_each),
                await bench.phase("clean-up", bench.clean_up),
            ]
            with contextlib.suppress(Exception):
                await session.kube.delete(await session.kube.resource("v1", "Namespace"), session.namespace)
        finally:
            await session.close()
    finally:
        for sp in started.values():
            sp.stop()
    print(table(phases, count))
    return {
        "appwrappers": count,
        "pods_per_appwrapper": pods,
        "services_from": str(services_from),
        "phases": [
            {
                "phase": p.name,
                "seconds": round(p.seconds, 1),
                "reconcile_passes": p.passes,
                "status_conflicts": p.conflicts,
                "cpu_seconds": dict(sorted(p.cpu.items())),
                "watcher_observations": {
                    f"{what} {kind}": n for (what, kind), n in sorted(p.observations.items())
                },
                "lifecycle_requests": {
                    f"{verb} {resource}": n for (verb, resource), n in sorted(p.requests.items())
                },
                "apiserver_requests_all_clients": dict(sorted(p.apiserver.items())),
            }
            for p in phases
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--appwrappers", type=int, default=100)
    parser.add_argument("--pods", type=int, default=1, help="pods of each AppWrapper's Job")
    parser.add_argument(
        "--state-dir", type=Path, help="a running testbed without services (else one is started)"
    )
    parser.add_argument(
        "--services-from",
        type=Path,
        default=Path(__file__).resolve().parents[1],
        help="the checkout of Respawn whose services are run (default: this one)",
    )
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    # 110 pods per kwok node; room for the old and the new pods of a reset side by side.
    nodes = max(2, math.ceil(args.appwrappers * args.pods * 2 / 100))
    with testbed(args.state_dir, nodes) as state:
        result = asyncio.run(measure(state, args.services_from.resolve(), args.appwrappers, args.pods))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
