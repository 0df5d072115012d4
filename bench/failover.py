"""Failover: SIGKILL the replica that owns a workload, fail one of its pods at that moment, and
time the verdict and the reset (docs/scaling.md).

Two replicas of every service run on a local testbed, each with its own ``RESPAWN_INSTANCE``
(``health-0``, ``health-1``, …) and the production membership settings (heartbeat 1 s, member
TTL 5 s). For each trial, for the service under test: pick a Running AppWrapper, work out which
replica owns its partition (the same :func:`shared.partitions.assign` the services compute),
SIGKILL that replica, fail one of the AppWrapper's pods, and measure from the pod failure to

- the Unhealthy verdict on ``RESPAWN_VERDICTS``;
- the ``ResetStarted`` lifecycle event on ``RESPAWN_LIFECYCLE``.

The killed replica is started again (under the same name, as a container restart in the same pod
would) once the reset was seen, and the next trial waits for the workload to run again. A trial
whose verdict or reset does not arrive within the deadline is counted as lost.

    python -m bench.failover --services watcher,health,lifecycle --trials 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats

from respawn.testbed import cluster, manifests, sim
from respawn.testbed.cluster import State, kubectl
from respawn.testbed.errors import TestbedError
from respawn.testbed.services import SERVICES, ServiceProcess, install_crd, spawn_service
from shared import subjects
from shared.appwrapper.constants import APPWRAPPER_LABEL
from shared.messages import LifecycleEvent, Verdict, decode
from shared.partitions import assign, partition_of

NAMESPACE = "failover"
REPLICAS = 2
FAST = manifests.fault_tolerance(failure_grace="0s", retry_pause="1s", forceful_deletion_grace="5s")


@dataclass
class Trial:
    service: str
    appwrapper: str
    killed: str
    verdict: float | None = None  # seconds from the pod failure
    reset: float | None = None

    @property
    def lost(self) -> bool:
        return self.verdict is None or self.reset is None


@dataclass
class Fleet:
    state: State
    procs: dict[str, ServiceProcess] = field(default_factory=dict)

    def start(self, name: str) -> None:
        service = name.rsplit("-", 1)[0]
        self.procs[name] = spawn_service(
            service,
            kubeconfig=self.state.kubeconfig,
            nats_url=self.state.nats_url,
            log_dir=self.state.state_dir / "logs",
            instance=name.rsplit("-", 1)[1],
            env={"RESPAWN_INSTANCE": name},
            ready_timeout=120,
        )

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.stop()
        self.procs.clear()


def owner(service: str, namespace: str, name: str) -> str:
    members = [f"{service}-{i}" for i in range(REPLICAS)]
    part = partition_of(namespace, name, subjects.partitions())
    return next(m for m, share in assign(subjects.partitions(), members).items() if part in share)


def get(state: State, kind: str) -> list[dict[str, Any]]:
    try:
        listed = sim.get_json(state.kubeconfig, kind, "-n", NAMESPACE)
    except TestbedError:
        return []
    return list(listed["items"])


def running(state: State) -> dict[str, list[str]]:
    """Running AppWrappers with all their pods Running → their pods' names."""
    pods: dict[str, list[str]] = {}
    for pod in get(state, "pods"):
        label = (pod["metadata"].get("labels") or {}).get(APPWRAPPER_LABEL)
        if (
            label
            and pod.get("status", {}).get("phase") == "Running"
            and not pod["metadata"].get("deletionTimestamp")
        ):
            pods.setdefault(label, []).append(pod["metadata"]["name"])
    out = {}
    for aw in get(state, "appwrappers"):
        name = aw["metadata"]["name"]
        if (aw.get("status") or {}).get("phase") == "Running" and len(pods.get(name, [])) == 2:
            out[name] = pods[name]
    return out


async def wait_for(what: str, check: Any, deadline: float) -> Any:
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        await asyncio.sleep(0.2)
    raise TimeoutError(what)


async def run(args: argparse.Namespace) -> list[Trial]:
    directory = Path(tempfile.mkdtemp(prefix="respawn-failover-"))
    print(f"testbed in {directory}", file=sys.stderr)
    state = cluster.up(directory, nodes=4, log=lambda m: print(m, file=sys.stderr))
    fleet = Fleet(state)
    trials: list[Trial] = []
    try:
        install_crd(state.kubeconfig)
        for service in SERVICES:
            for i in range(REPLICAS):
                fleet.start(f"{service}-{i}")
        kubectl(state.kubeconfig, "create", "namespace", NAMESPACE)
        for i in range(args.appwrappers):
            aw = manifests.job_appwrapper(
                f"fo-{i:02d}",
                pods=2,
                annotations={**FAST, **manifests.fault_tolerance(retry_limit=100)},
            )
            kubectl(state.kubeconfig, "apply", "-n", NAMESPACE, "-f", "-", stdin=json.dumps(aw))
        await wait_for(
            "every AppWrapper running",
            lambda: len(running(state)) == args.appwrappers,
            time.monotonic() + 180,
        )
        nc = await nats.connect(state.nats_url)
        verdicts: dict[str, float] = {}
        resets: dict[str, float] = {}

        async def on_verdict(msg: Any) -> None:
            v = decode(Verdict, msg.data, msg.headers)
            if v.state == "Unhealthy":
                verdicts.setdefault(v.ref.name, time.monotonic())

        async def on_event(msg: Any) -> None:
            e = decode(LifecycleEvent, msg.data, msg.headers)
            if e.event == "ResetStarted":
                resets.setdefault(e.ref.name, time.monotonic())

        js = nc.jetstream()
        await js.subscribe(
            subjects.verdict_filter(NAMESPACE),
            cb=on_verdict,
            ordered_consumer=True,
            deliver_policy=nats.js.api.DeliverPolicy.NEW,
        )
        await js.subscribe(
            f"{subjects.LIFECYCLE_PREFIX}.{NAMESPACE}.*",
            cb=on_event,
            ordered_consumer=True,
            deliver_policy=nats.js.api.DeliverPolicy.NEW,
        )
        used: set[str] = set()
        for service in args.services:
            for _ in range(args.trials):
                candidates = await wait_for(
                    "a running workload",
                    lambda: {k: v for k, v in running(state).items() if k not in used},
                    time.monotonic() + 120,
                )
                name = sorted(candidates)[0]
                used.add(name)
                victim = owner(service, NAMESPACE, name)
                trial = Trial(service, name, victim)
                fleet.procs.pop(victim).kill()
                failed_at = time.monotonic()
                sim.fail_pod(state.kubeconfig, NAMESPACE, candidates[name][0], exit_code=1)
                deadline = failed_at + args.deadline
                try:
                    trial.verdict = (
                        await wait_for("verdict", lambda n=name: verdicts.get(n), deadline) - failed_at
                    )
                    trial.reset = await wait_for("reset", lambda n=name: resets.get(n), deadline) - failed_at
                except TimeoutError:
                    pass
                trials.append(trial)
                print(
                    f"{service}: killed {victim}, {name}: "
                    f"verdict {fmt(trial.verdict)}, reset {fmt(trial.reset)}",
                    file=sys.stderr,
                )
                fleet.start(victim)
        await nc.close()
    finally:
        fleet.stop()
        cluster.down(directory, keep_logs=any(t.lost for t in trials))
    return trials


def fmt(value: float | None) -> str:
    return "LOST" if value is None else f"{value:.2f} s"


def report(trials: list[Trial]) -> str:
    lines = [
        "| replica killed | trials | verdict after the pod failure (median / max) "
        "| reset (median / max) | lost |",
        "|---|---|---|---|---|",
    ]
    for service in dict.fromkeys(t.service for t in trials):
        mine = [t for t in trials if t.service == service]
        v = [t.verdict for t in mine if t.verdict is not None]
        r = [t.reset for t in mine if t.reset is not None]
        lines.append(f"| {service} | {len(mine)} | {stat(v)} | {stat(r)} | {sum(t.lost for t in mine)} |")
    return "\n".join(lines)


def stat(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s / {max(values):.2f} s" if values else "—"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--services", default="watcher,health,lifecycle", help="whose owner replica to kill, in turn"
    )
    parser.add_argument("--trials", type=int, default=3, help="kills per service")
    parser.add_argument("--appwrappers", type=int, default=12)
    parser.add_argument("--deadline", type=float, default=60.0, help="seconds before a trial counts as lost")
    args = parser.parse_args()
    args.services = [s for s in args.services.split(",") if s]
    unknown = set(args.services) - set(SERVICES)
    if unknown:
        parser.error(f"unknown service(s): {', '.join(sorted(unknown))}")
    if args.trials * len(args.services) > args.appwrappers:
        parser.error("need at least one AppWrapper per trial (--appwrappers)")
    trials = asyncio.run(run(args))
    print(report(trials))
    sys.exit(1 if any(t.lost for t in trials) else 0)


if __name__ == "__main__":
    main()
