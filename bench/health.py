"""Benchmarks for the health service. Prints figures; asserts nothing.

throughput  one health process consuming observations from JetStream (decode, fold in,
            evaluate, publish verdicts when due, ack), against a real nats-server
latency     on a running testbed with services (`respawn local up --nodes 80`): from a pod's
            Failed status write in the API server to the Unhealthy verdict on the stream,
            with FailureGracePeriod 0

.venv/bin/python -m bench.health throughput [--appwrappers 2000] [--pods 8]
.venv/bin/python -m bench.health latency --state-dir .respawn [--appwrappers 1000] [--pods 8] [--samples 100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats

from bench import testbed
from bench.polling import until
from bench.procstat import settle, usage, usage_lines
from bench.report import fmt_ms, percentiles
from bench.session import Session
from bench.workload import failed_pod_status, job_appwrapper, observed_job_appwrapper
from respawn.testbed.cluster import _http_ok
from respawn.testbed.nats import start_nats
from respawn.testbed.ports import free_port
from respawn.testbed.process import start, stop_pid, wait_until
from shared import subjects
from shared.appwrapper import params
from shared.appwrapper.constants import APPWRAPPER_LABEL
from shared.bus import Bus
from shared.kubetime import format_kube_time
from shared.messages import AppWrapperObservation, ContainerState, ObjectRef, PodObservation, Verdict, decode

# The testbed the latency benchmark expects (`respawn local up --nodes 80`).
NODES = 80
# How long 1,000 AppWrappers x 8 pods may take to start on that testbed.
START_LIMIT = 1800.0


async def throughput(appwrappers: int, pods: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="respawn-bench-"))
    server = start_nats(tmp / "nats")
    proc = None
    try:
        bus = await Bus.connect(server.url, name="bench")
        await bus.ensure_streams()
        port = free_port()
        env = {
            **os.environ,
            "NATS_URL": server.url,
            "RESPAWN_INSTANCE": "bench",
            "RESPAWN_PROBE_PORT": str(port),
            "RESPAWN_PROBE_LOOPBACK": "1",
            "RESPAWN_LOG_LEVEL": "WARNING",
        }
        proc = start("health", [sys.executable, "-m", "services.health"], tmp / "health.log", env=env)
        wait_until(proc, lambda: _http_ok(f"http://127.0.0.1:{port}/readyz"), timeout=60, what="ready")
        cpu0 = usage(proc.pid)

        now = datetime.now(UTC)
        deployed = format_kube_time(now)
        messages: list[tuple[str, Any, str]] = []
        for i in range(appwrappers):
            ns, name, uid = "bench", f"aw-{i}", f"uid-{i}"
            body = observed_job_appwrapper(ns, name, uid, pods, deployed)
            container = body["spec"]["components"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
            obs = AppWrapperObservation(
                ref=ObjectRef(namespace=ns, name=name, uid=uid), observed_at=now, body=body
            )
            messages.append((subjects.appwrapper_obs(ns, name, "appwrapper", name), obs, f"aw:{uid}"))
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
                messages.append(
                    (subjects.appwrapper_obs(ns, name, "pod", f"{name}-{p}"), pod, f"pod:{uid}-{p}")
                )
        total = len(messages)
        js = bus.js
        # Freeze the (caught-up, idle) health process while the backlog is published, so what
        # is measured is its own steady-state rate (live path: fold, evaluate, publish, ack), not
        # the bench publisher's.
        os.kill(proc.pid, signal.SIGSTOP)
        t_pub = time.perf_counter()
        window = 512
        for start_at in range(0, total, window):
            chunk = messages[start_at : start_at + window]
            await asyncio.gather(
                *(js.publish(s, m.encode(), headers={"Nats-Msg-Id": i}) for s, m, i in chunk)
            )
        pub_s = time.perf_counter() - t_pub

        info = await js.stream_info(subjects.OBSERVATIONS_STREAM)
        last_seq = info.state.last_seq
        t_first = time.perf_counter()
        os.kill(proc.pid, signal.SIGCONT)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            infos = await js.consumers_info(subjects.OBSERVATIONS_STREAM)
            ci = next(c for c in infos if c.name.startswith("health-bench-"))
            if ci.ack_floor.stream_seq >= last_seq:
                # Acked is not the end: every AppWrapper's verdict must be on the stream too.
                verdicts_now = (await js.stream_info(subjects.VERDICTS_STREAM)).state.messages
                if verdicts_now >= appwrappers:
                    break
            await asyncio.sleep(0.02)
        t_done = time.perf_counter()
        cpu1 = usage(proc.pid)
        verdicts = (await js.stream_info(subjects.VERDICTS_STREAM)).state.messages
        elapsed = t_done - t_first
        print(
            f"health throughput: {total} observations ({appwrappers} AppWrappers x {pods} pods + AppWrapper)"
        )
        print(f"  published in {pub_s:.2f}s ({total / pub_s:,.0f} msg/s, bench publisher)")
        print(
            f"  consumed, evaluated, acked and verdicts published by one health process in {elapsed:.2f}s "
            f"-> {total / elapsed:,.0f} obs/s"
        )
        print(f"  verdicts published: {verdicts}")
        print(
            f"  health process: cpu {cpu1.cpu_seconds - cpu0.cpu_seconds:.2f}s, "
            f"rss {cpu1.rss_mib:.0f} MiB, peak rss {cpu1.peak_rss_mib:.0f} MiB"
        )
        await bus.close()
    finally:
        if proc is not None:
            stop_pid(proc.pid)
        server.stop()


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
        v = decode(Verdict, msg.data)
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
    lat = sub.add_parser("latency")
    lat.add_argument("--state-dir", type=Path, default=Path(".respawn"))
    lat.add_argument("--appwrappers", type=int, default=1000)
    lat.add_argument("--pods", type=int, default=8)
    lat.add_argument("--samples", type=int, default=100)
    args = parser.parse_args()
    if args.cmd == "throughput":
        asyncio.run(throughput(args.appwrappers, args.pods))
    else:
        asyncio.run(latency(args.state_dir.resolve(), args.appwrappers, args.pods, args.samples))


if __name__ == "__main__":
    main()
