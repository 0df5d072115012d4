"""Benchmarks for the health service. Prints figures; asserts nothing.

throughput  health replicas (separate processes, 1 or more per run) consuming observations
            from JetStream (decode, fold in, evaluate, publish verdicts when due, ack), against
            a real nats-server; per replica count: observations/s, verdicts/s, and per replica
            the observations delivered, AppWrappers held, CPU and RSS
latency     on a running testbed with services (`respawn local up --nodes 80`): from a pod's
            Failed status write in the API server to the Unhealthy verdict on the stream,
            with FailureGracePeriod 0

.venv/bin/python -m bench.health throughput [--appwrappers 2000] [--pods 8] [--replicas 1,2,4]
.venv/bin/python -m bench.health latency --state-dir .respawn [--appwrappers 1000] [--pods 8] [--samples 100]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
from prometheus_client.parser import text_string_to_metric_families

from bench import testbed
from bench.polling import until
from bench.procstat import settle, usage, usage_lines
from bench.report import fmt_ms, percentiles
from bench.session import Session
from bench.workload import failed_pod_status, job_appwrapper, observed_job_appwrapper
from respawn.testbed.cluster import _http_ok
from respawn.testbed.nats import start_nats
from respawn.testbed.ports import free_port
from respawn.testbed.process import Proc, start, stop_pid, wait_until
from shared import subjects
from shared.appwrapper import params
from shared.appwrapper.constants import APPWRAPPER_LABEL
from shared.bus import Bus
from shared.kubetime import format_kube_time
from shared.messages import AppWrapperObservation, ContainerState, ObjectRef, PodObservation, Verdict, decode
from shared.partitions import assign

# The testbed the latency benchmark expects (`respawn local up --nodes 80`).
NODES = 80
# How long 1,000 AppWrappers x 8 pods may take to start on that testbed.
START_LIMIT = 1800.0


@dataclass
class Replica:
    """One health process of a throughput run, with what it had used when the backlog arrived."""

    name: str
    proc: Proc
    port: int
    cpu0: float = 0.0
    rss0_mib: float = 0.0
    consumed0: float = 0.0

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def owned(self) -> float:
        return self.metrics().get(("respawn_partitions_owned", (("group", "health"),)), 0.0)

    def consumed(self) -> float:
        """Observations delivered to it (its consumers' messages on the observation stream)."""
        labels = (("service", "respawn-health"), ("stream", subjects.OBSERVATIONS_STREAM))
        return self.metrics().get(("respawn_bus_messages_consumed_total", labels), 0.0)

    def held(self) -> float:
        return self.metrics().get(("respawn_health_appwrappers", ()), 0.0)


@dataclass
class Row:
    """The figures of one replica count."""

    replicas: int
    observations: int
    verdicts: int
    seconds: float
    delivered: list[float]
    held: list[float]
    cpu: list[float]
    rss_mib: list[float]
    rss_growth_mib: list[float]

    @property
    def obs_per_s(self) -> float:
        return self.observations / self.seconds

    @property
    def cpu_us_per_obs(self) -> float:
        return sum(self.cpu) / self.observations * 1e6

    @property
    def bytes_per_appwrapper(self) -> float:
        return sum(self.rss_growth_mib) * 2**20 / max(1.0, sum(self.held))


def backlog(appwrappers: int, pods: int) -> list[tuple[str, bytes, str]]:
    """(subject, payload, message id) of every observation: ``appwrappers`` AppWrappers Running
    with ``pods`` pods Running each, as the watcher would publish them."""
    now = datetime.now(UTC)
    deployed = format_kube_time(now)
    messages: list[tuple[str, bytes, str]] = []
    for i in range(appwrappers):
        ns, name, uid = "bench", f"aw-{i}", f"uid-{i}"
        body = observed_job_appwrapper(ns, name, uid, pods, deployed)
        container = body["spec"]["components"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
        obs = AppWrapperObservation(
            ref=ObjectRef(namespace=ns, name=name, uid=uid), observed_at=now, body=body
        )
        messages.append((subjects.appwrapper_obs(ns, name, "appwrapper", name), obs.encode(), f"aw:{uid}"))
        for p in range(pods):
            pod = PodObservation(
                ref=ObjectRef(namespace=ns, name=f"{name}-{p}", uid=f"{uid}-{p}"),
                appwrapper=name,
                observed_at=now,
                created_at=now,
                phase="Running",
                node_name=f"node-{p % 4}",
                scheduled=True,
                containers=(ContainerState(name=container["name"], state="running", ready=True),),
            )
            subject = subjects.appwrapper_obs(ns, name, "pod", f"{name}-{p}")
            messages.append((subject, pod.encode(), f"pod:{uid}-{p}"))
    return messages


def ready(r: Replica) -> bool:
    return _http_ok(f"http://127.0.0.1:{r.port}/readyz")


async def start_replicas(tmp: Path, url: str, count: int) -> list[Replica]:
    """``count`` health processes, each ready (its share settled and replayed), the partitions
    split between them as :func:`shared.partitions.assign` says."""
    replicas = []
    for i in range(count):
        port = free_port()
        name = f"bench-{i}"
        env = {
            **os.environ,
            "NATS_URL": url,
            "RESPAWN_INSTANCE": name,
            "RESPAWN_PROBE_PORT": str(port),
            "RESPAWN_PROBE_LOOPBACK": "1",
            "RESPAWN_LOG_LEVEL": "WARNING",
            # The replicas are frozen together while the backlog is published: a long member TTL
            # keeps them from taking each other for dead when they wake up.
            "RESPAWN_SCALING_MEMBER_TTL": "10m",
        }
        proc = start(name, [sys.executable, "-m", "services.health"], tmp / f"{name}.log", env=env)
        replicas.append(Replica(name, proc, port))
    for r in replicas:
        wait_until(r.proc, functools.partial(ready, r), timeout=60, what="ready")
    shares = assign(subjects.partitions(), [r.name for r in replicas])

    async def settled() -> bool:
        return all(r.owned() == len(shares[r.name]) and ready(r) for r in replicas)

    await until(f"{count} health replicas to split the partitions", settled, within=60, every=0.1)
    return replicas


async def drained(js: Any, appwrappers: int) -> bool:
    """Every health consumer of the observations has nothing pending or unacknowledged, and every
    AppWrapper's verdict is on the stream."""
    infos = await js.consumers_info(subjects.OBSERVATIONS_STREAM)
    ours = [c for c in infos if c.name.startswith("health-")]
    if not ours or any(c.num_pending or c.num_ack_pending for c in ours):
        return False
    verdicts = (await js.stream_info(subjects.VERDICTS_STREAM)).state.messages
    return bool(verdicts >= appwrappers)


async def throughput_run(messages: list[tuple[str, bytes, str]], appwrappers: int, count: int) -> Row:
    tmp = Path(tempfile.mkdtemp(prefix="respawn-bench-"))
    server = start_nats(tmp / "nats")
    replicas: list[Replica] = []
    try:
        bus = await Bus.connect(server.url, name="bench")
        await bus.ensure_streams()
        replicas = await start_replicas(tmp, server.url, count)
        for r in replicas:
            u = usage(r.proc.pid)
            r.cpu0, r.rss0_mib, r.consumed0 = u.cpu_seconds, u.rss_mib, r.consumed()
        js = bus.js
        # Freeze the (caught-up, idle) replicas while the backlog is published, so what is
        # measured is their own steady-state rate (live path: fold, evaluate, publish, ack), not
        # the bench publisher's.
        for r in replicas:
            os.kill(r.proc.pid, signal.SIGSTOP)
        t_pub = time.perf_counter()
        window = 512
        for start_at in range(0, len(messages), window):
            chunk = messages[start_at : start_at + window]
            await asyncio.gather(*(js.publish(s, m, headers={"Nats-Msg-Id": i}) for s, m, i in chunk))
        pub_s = time.perf_counter() - t_pub
        t_first = time.perf_counter()
        for r in replicas:
            os.kill(r.proc.pid, signal.SIGCONT)
        await until("the backlog judged", lambda: drained(js, appwrappers), within=600, every=0.02)
        elapsed = time.perf_counter() - t_first
        after = [usage(r.proc.pid) for r in replicas]
        verdicts = int((await js.stream_info(subjects.VERDICTS_STREAM)).state.messages)
        row = Row(
            replicas=count,
            observations=len(messages),
            verdicts=verdicts,
            seconds=elapsed,
            delivered=[r.consumed() - r.consumed0 for r in replicas],
            held=[r.held() for r in replicas],
            cpu=[u.cpu_seconds - r.cpu0 for u, r in zip(after, replicas, strict=True)],
            rss_mib=[u.rss_mib for u in after],
            rss_growth_mib=[u.rss_mib - r.rss0_mib for u, r in zip(after, replicas, strict=True)],
        )
        print(
            f"{count} replica(s): backlog published in {pub_s:.2f}s ({len(messages) / pub_s:,.0f} msg/s, "
            f"bench publisher); judged in {elapsed:.2f}s -> {row.obs_per_s:,.0f} obs/s, "
            f"{verdicts / elapsed:,.0f} verdicts/s",
            flush=True,
        )
        for r, delivered, held, cpu, rss in zip(
            replicas, row.delivered, row.held, row.cpu, row.rss_mib, strict=True
        ):
            print(
                f"  {r.name}: {delivered:,.0f} observations delivered, {held:,.0f} AppWrappers held, "
                f"cpu {cpu:.2f}s, rss {rss:.0f} MiB",
                flush=True,
            )
        await bus.close()
        return row
    finally:
        for r in replicas:
            with contextlib.suppress(ProcessLookupError):
                os.kill(r.proc.pid, signal.SIGCONT)  # a stopped process cannot handle SIGTERM
            stop_pid(r.proc.pid)
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)  # the server's store: 18,000 observations per run


def table(rows: list[Row]) -> str:
    """The figures of every replica count as a Markdown table (for bench/README.md)."""

    def each(values: list[float], fmt: str) -> str:
        return " / ".join(format(v, fmt) for v in values)

    lines = [
        "| replicas | obs/s | verdicts/s | observations delivered, per replica | CPU-s per replica "
        "| CPU-s total | CPU-µs per observation | RSS MiB per replica | RSS per AppWrapper held |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.replicas} | {r.obs_per_s:,.0f} | {r.verdicts / r.seconds:,.0f} "
            f"| {each(r.delivered, ',.0f')} | {each(r.cpu, '.2f')} | {sum(r.cpu):.2f} "
            f"| {r.cpu_us_per_obs:.0f} | {each(r.rss_mib, '.0f')} | {r.bytes_per_appwrapper / 1024:.1f} KiB |"
        )
    return "\n".join(lines)


async def throughput(appwrappers: int, pods: int, replica_counts: list[int]) -> None:
    messages = backlog(appwrappers, pods)
    print(
        f"health throughput: {len(messages)} observations ({appwrappers} AppWrappers x {pods} pods "
        f"+ AppWrapper), {subjects.partitions()} partitions, replicas {', '.join(map(str, replica_counts))}",
        flush=True,
    )
    rows = [await throughput_run(messages, appwrappers, count) for count in replica_counts]
    print(table(rows))


async def latency(state_dir: Path, appwrappers: int, pods: int, samples: int) -> None:
    state = testbed.load(state_dir, NODES)
    session = await Session.connect(state.kubeconfig, f"bench-{int(time.time())}")
    kube, ns, pod_ref = session.kube, session.namespace, session.refs["pod"]
    await session.create_namespace()
    t0 = time.perf_counter()
    sem = asyncio.Semaphore(32)
    annotations = {params.FAILURE_GRACE_PERIOD_ANNOTATION: "0s", params.RETRY_LIMIT_ANNOTATION: "0"}

    async def create(i: int) -> None:
        async with sem:
            await kube.create(session.refs["aw"], job_appwrapper(f"aw-{i}", pods, annotations), ns)

    await asyncio.gather(*(create(i) for i in range(appwrappers)))
    print(
        f"created {appwrappers} AppWrappers in {time.perf_counter() - t0:.1f}s; waiting for all pods Running"
    )

    async def all_running() -> bool:
        listing = await kube.list(pod_ref, ns, fieldSelector="status.phase=Running")
        running = len(listing.get("items", []))
        if running < appwrappers * pods:
            print(
                f"  {running}/{appwrappers * pods} pods running after {time.perf_counter() - t0:.0f}s",
                flush=True,
            )
        return running >= appwrappers * pods

    await until("all pods Running", all_running, within=START_LIMIT, every=5)
    print(f"all {appwrappers * pods} pods Running after {time.perf_counter() - t0:.1f}s")
    # Health has to have seen every pod Running before the faults: wait until the services are quiet.
    await settle(testbed.services(state))

    nc = await nats.connect(state.nats_url)
    received: dict[str, float] = {}

    async def on_verdict(msg: Any) -> None:
        v = decode(Verdict, msg.data, msg.headers)
        if v.state == "Unhealthy" and v.ref.name not in received:
            received[v.ref.name] = time.perf_counter()

    await nc.subscribe(subjects.verdict_filter(ns), cb=on_verdict)
    by_aw: dict[str, dict[str, Any]] = {}
    for p in (await kube.list(pod_ref, ns))["items"]:
        by_aw.setdefault(p["metadata"]["labels"].get(APPWRAPPER_LABEL, ""), p)
    sent: dict[str, float] = {}
    now = datetime.now(UTC)
    for name in sorted(by_aw)[:samples]:
        pod = by_aw[name]
        patch = failed_pod_status(
            [(c["name"], c.get("image", "")) for c in pod["spec"]["containers"]], 1, now
        )
        sent[name] = time.perf_counter()
        await kube.patch(pod_ref, pod["metadata"]["name"], patch, ns, subresource="status")
        await asyncio.sleep(0.05)
    deadline = time.monotonic() + 60
    while len(received) < len(sent) and time.monotonic() < deadline:  # noqa: ASYNC110 - polling a deadline
        await asyncio.sleep(0.1)
    lat = [received[n] - sent[n] for n in sent if n in received]
    print(
        f"pod Failed status write -> Unhealthy verdict on the stream "
        f"({appwrappers} AppWrappers x {pods} pods running, FailureGracePeriod 0):"
    )
    print(f"  {fmt_ms(percentiles(lat))}; missing: {len(sent) - len(lat)}")
    print("\n".join(usage_lines(testbed.services(state))))
    print(json.dumps({"namespace": ns}))
    await nc.close()
    await session.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("throughput")
    t.add_argument("--appwrappers", type=int, default=2000)
    t.add_argument("--pods", type=int, default=8)
    t.add_argument(
        "--replicas",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[1],
        help="health replica counts to measure one after the other, e.g. 1,2,4 (default 1)",
    )
    lat = sub.add_parser("latency")
    lat.add_argument("--state-dir", type=Path, default=Path(".respawn"))
    lat.add_argument("--appwrappers", type=int, default=1000)
    lat.add_argument("--pods", type=int, default=8)
    lat.add_argument("--samples", type=int, default=100)
    args = parser.parse_args()
    if args.cmd == "throughput":
        asyncio.run(throughput(args.appwrappers, args.pods, args.replicas))
    else:
        asyncio.run(latency(args.state_dir.resolve(), args.appwrappers, args.pods, args.samples))


if __name__ == "__main__":
    main()
