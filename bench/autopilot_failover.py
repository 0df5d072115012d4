"""How long node verdicts wait when the active autopilot is killed.

    python -m bench.autopilot_failover [--kills 5] [--heartbeat 1s] [--member-ttl 5s] [--json]

Autopilot is active/standby (docs/autopilot.md, "Replicas"; ``bench.failover`` measures the
active-active services). A nats-server of its own and two autopilot processes; node observations
are published as the watcher publishes them. Each round SIGKILLs the active replica and, at once,
publishes an observation that moves a node between the sets; the failover time is from the kill
to the node verdict on the stream, published by the standby once it has taken over. The killed
replica is then started again, as the new standby. Before the first kill, the same change with
the active replica alive gives the time a verdict takes when nothing fails, for comparison.

Standalone: it needs only nats-server (``.venv/bin/nats-server``), no cluster (autopilot reads
no Kubernetes). ``--heartbeat`` and ``--member-ttl`` are the services' ``scaling.heartbeat`` and
``scaling.memberTtl`` (defaults: the services' own, 1s and 5s).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.error
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from respawn.testbed.nats import NatsServer, start_nats
from respawn.testbed.services import ServiceProcess, spawn_service
from shared import subjects
from shared.bus import Bus
from shared.config import AutopilotConfig
from shared.messages import NodeObservation, NodeVerdict, decode

GPU = "nvidia.com/gpu"
HEALTH = "autopilot.ibm.com/gpuhealth"
NODE = "bench-node"


def owned(sp: ServiceProcess, group: str) -> float:
    try:
        text = sp.metrics()
    except (urllib.error.URLError, OSError):
        return 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "respawn_partitions_owned" and sample.labels.get("group") == group:
                return float(sample.value)
    return 0.0


class Autopilots:
    """Two autopilot processes on ``nats``; ``replace(name)`` kills one and starts its successor."""

    def __init__(self, nats: NatsServer, log_dir: Path, env: dict[str, str]) -> None:
        self.nats = nats
        self.log_dir = log_dir
        self.env = env
        self.procs: dict[str, ServiceProcess] = {}
        self.started = 0

    def start(self) -> str:
        self.started += 1
        name = f"autopilot-{self.started}"
        self.procs[name] = spawn_service(
            "autopilot",
            # autopilot reads no Kubernetes; the variable is set for every service alike.
            kubeconfig=Path(os.devnull),
            nats_url=self.nats.url,
            log_dir=self.log_dir,
            instance=str(self.started),
            env={**self.env, "RESPAWN_INSTANCE": name},
        )
        return name

    def active(self) -> list[str]:
        return [name for name, sp in self.procs.items() if owned(sp, "autopilot")]

    def kill(self, name: str) -> None:
        self.procs.pop(name).kill()

    def stop_all(self) -> None:
        for sp in self.procs.values():
            sp.stop()
        self.procs.clear()


async def wait_for(what: str, check: Any, within: float) -> Any:
    deadline = time.monotonic() + within
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting for {what} after {within:.0f}s")
        await asyncio.sleep(0.02)


class Verdicts:
    """Every GPU node verdict as it crosses the wire, with when it arrived."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, NodeVerdict]] = []

    async def keep(self, msg: Any) -> None:
        self.seen.append((time.monotonic(), decode(NodeVerdict, msg.data, msg.headers)))

    def first_after(self, since: float, evicted: bool) -> float | None:
        for at, verdict in self.seen:
            if at >= since and (NODE in verdict.no_execute) == evicted:
                return at
        return None


async def change(bus: Bus, evicted: bool) -> None:
    labels = {HEALTH: "EVICT" if evicted else "PASS"}
    observation = NodeObservation(name=NODE, observed_at=datetime.now(UTC), labels=labels, ready=True)
    await bus.publish(subjects.node_obs(NODE), observation, msg_id=None)


async def measure(nats: NatsServer, log_dir: Path, kills: int, heartbeat: str, ttl: str) -> dict[str, Any]:
    env = {"RESPAWN_SCALING_HEARTBEAT": heartbeat, "RESPAWN_SCALING_MEMBER_TTL": ttl}
    bus = await Bus.connect(nats.url, name="bench-failover")
    verdicts = Verdicts()
    sub = await bus.nc.subscribe(subjects.node_verdict(GPU), cb=verdicts.keep)
    fleet = Autopilots(nats, log_dir, env)
    try:
        await bus.ensure_streams()
        fleet.start()
        fleet.start()
        await wait_for("one active replica", lambda: len(fleet.active()) == 1, 30)
        evicted = True
        sent = time.monotonic()
        await change(bus, evicted)
        arrived = await wait_for("the verdict", lambda: verdicts.first_after(sent, evicted), 30)
        baseline = arrived - sent
        rounds = []
        for _ in range(kills):
            [leader] = await wait_for("one active replica", lambda: fleet.active() or None, 60)
            standbys = [n for n in fleet.procs if n != leader]
            evicted = not evicted
            killed = time.monotonic()
            fleet.kill(leader)
            await change(bus, evicted)
            arrived = await wait_for(
                "the standby's verdict", lambda k=killed, e=evicted: verdicts.first_after(k, e), 60
            )
            rounds.append(arrived - killed)
            print(
                f"killed {leader}: {standbys[0]} published the verdict {arrived - killed:.2f}s later",
                flush=True,
            )
            fleet.start()  # the new standby
            await wait_for("the new replica to join", lambda: len(fleet.active()) == 1, 60)
        return {
            "service": "autopilot",
            "heartbeat": heartbeat,
            "memberTtl": ttl,
            "verdict_without_failure_s": round(baseline, 4),
            "failover_s": [round(r, 3) for r in rounds],
            "failover_min_s": round(min(rounds), 3),
            "failover_median_s": round(statistics.median(rounds), 3),
            "failover_max_s": round(max(rounds), 3),
        }
    finally:
        await sub.unsubscribe()
        fleet.stop_all()
        await bus.close()


@contextmanager
def own_nats() -> Iterator[tuple[NatsServer, Path]]:
    with tempfile.TemporaryDirectory(prefix="respawn-failover-") as tmp:
        server = start_nats(Path(tmp) / "nats")
        try:
            yield server, Path(tmp) / "logs"
        finally:
            server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.autopilot_failover", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--kills", type=int, default=5, help="how many times the active replica is killed")
    parser.add_argument("--heartbeat", default="1s", help="scaling.heartbeat of the replicas")
    parser.add_argument("--member-ttl", default="5s", help="scaling.memberTtl of the replicas")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    if args.kills < 1:
        parser.error("--kills must be at least 1")
    if GPU not in AutopilotConfig().resource_taints:
        parser.error(f"the default configuration no longer judges {GPU}")
    with own_nats() as (nats, logs):
        result = asyncio.run(measure(nats, logs, args.kills, args.heartbeat, args.member_ttl))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"{result['service']}, heartbeat {result['heartbeat']}, memberTtl {result['memberTtl']}: "
            f"failover min {result['failover_min_s']}s, median {result['failover_median_s']}s, "
            f"max {result['failover_max_s']}s over {args.kills} kills; "
            f"a verdict with no failure takes {result['verdict_without_failure_s'] * 1000:.0f}ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
