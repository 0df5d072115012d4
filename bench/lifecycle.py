"""Benchmarks for the lifecycle service, on a running testbed with services. Prints figures only.

verdict-to-delete  with N running AppWrappers, the time from an Unhealthy verdict on the
                   stream to lifecycle's first delete call (seen as the wrapped Job's deletion
                   on a watch), sampled over several AppWrappers
reset              the overhead of a full reset of a 64-pod workload beyond its configured grace
                   and pause periods (both set to 0): from the pod failure to Running again

.venv/bin/respawn local up --state-dir .respawn --nodes 16
.venv/bin/python -m bench.lifecycle verdict-to-delete --state-dir .respawn [--appwrappers 1000] [--samples 50]
    [--namespace NS-of-an-earlier-run]
.venv/bin/python -m bench.lifecycle reset --state-dir .respawn [--pods 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats

from bench import testbed
from bench.polling import until
from bench.procstat import settle, usage_lines
from bench.report import fmt_ms, percentiles
from bench.session import Session
from bench.workload import failed_pod_status, job_appwrapper
from shared import subjects
from shared.appwrapper import params
from shared.kube.watch import list_then_watch
from shared.kubetime import parse_kube_time
from shared.messages import ObjectRef, Verdict

# The testbed these benchmarks expect (`respawn local up --nodes 16`).
NODES = 16
# How long one step of a reset (all pods running; reset done) may take.
RESET_LIMIT = 300.0


async def all_in_phase(session: Session, count: int, phase: str, limit: float) -> None:
    async def done() -> bool:
        return (
            sum(1 for a in await session.listing("aw") if (a.get("status") or {}).get("phase") == phase)
            >= count
        )

    await until(f"AppWrappers all {phase}", done, within=limit, every=1.0)


async def verdict_to_delete(state_dir: Path, count: int, samples: int, reuse: str | None) -> None:
    state = testbed.load(state_dir, NODES)
    session = await Session.connect(state.kubeconfig, reuse or f"bench-lc-{int(time.time())}")
    ns = session.namespace
    if reuse:
        # Another round on AppWrappers an earlier run left Running (those it reset are Failed).
        names = sorted(
            a["metadata"]["name"]
            for a in await session.listing("aw")
            if (a.get("status") or {}).get("phase") == "Running"
        )
        print(f"{len(names)} AppWrappers Running in {ns}")
    else:
        await session.create_namespace()
        names = [f"aw-{i}" for i in range(count)]
        sem = asyncio.Semaphore(32)
        annotations = {params.RETRY_LIMIT_ANNOTATION: "0"}

        async def create(name: str) -> None:
            async with sem:
                await session.kube.create(session.refs["aw"], job_appwrapper(name, 1, annotations), ns)

        t0 = time.perf_counter()
        await asyncio.gather(*(create(n) for n in names))
        await all_in_phase(session, len(names), "Running", 900)
        print(f"{count} AppWrappers Running after {time.perf_counter() - t0:.1f}s")
    if len(names) < samples:
        raise SystemExit(f"only {len(names)} AppWrappers Running in {ns}; fewer than --samples {samples}")
    waited = await settle(testbed.services(state))
    print(f"services quiet after {waited:.1f}s more (steady state: measuring now)")

    deleted: dict[str, float] = {}
    synced = asyncio.Event()

    async def watch_jobs() -> None:
        async for event in list_then_watch(session.kube, session.refs["job"], namespace=ns):
            if event.type == "SYNCED":
                synced.set()
                continue
            meta = event.obj.get("metadata", {})
            if event.type == "DELETED" or meta.get("deletionTimestamp"):
                deleted.setdefault(meta.get("name", ""), time.perf_counter())

    watcher = asyncio.create_task(watch_jobs())
    await asyncio.wait_for(synced.wait(), 60)
    nc = await nats.connect(state.nats_url)
    js = nc.jetstream()
    sent: dict[str, float] = {}
    by_name = {a["metadata"]["name"]: a for a in await session.listing("aw")}
    for name in names[:samples]:
        aw = by_name[name]
        cond = next(c for c in aw["status"]["conditions"] if c["type"] == "ResourcesDeployed")
        now = datetime.now(UTC)
        verdict = Verdict(
            ref=ObjectRef(namespace=ns, name=name, uid=aw["metadata"]["uid"]),
            state="Unhealthy",
            reason="FoundFailedPods",
            message="bench: synthetic verdict",
            resetting_count=0,
            first_unhealthy_at=now,
            decided_at=now,
            seq=1000,
            attempt_started_at=parse_kube_time(cond["lastTransitionTime"]),
        )
        sent[name] = time.perf_counter()
        await js.publish(
            subjects.verdict(ns, name), verdict.encode(), headers={"Nats-Msg-Id": f"bench-{name}"}
        )
        await asyncio.sleep(0.1)
    deadline = time.monotonic() + 60
    while len([n for n in sent if n in deleted]) < len(sent) and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.1)
    lat = [deleted[n] - sent[n] for n in sent if n in deleted]
    print(
        f"Unhealthy verdict on the stream -> first delete of the wrapped Job ({count} AppWrappers running):"
    )
    print(f"  {fmt_ms(percentiles(lat))}; missing: {len(sent) - len(lat)}")
    print("\n".join(usage_lines(testbed.services(state))))
    watcher.cancel()
    await nc.close()
    await session.close()
    print(json.dumps({"namespace": ns}))


async def reset_overhead(state_dir: Path, pods: int, rounds: int) -> None:
    state = testbed.load(state_dir, NODES)
    session = await Session.connect(state.kubeconfig, f"bench-reset-{int(time.time())}")
    kube, ns, aw_ref = session.kube, session.namespace, session.refs["aw"]
    await session.create_namespace()
    annotations = {
        params.FAILURE_GRACE_PERIOD_ANNOTATION: "0s",
        params.RETRY_PAUSE_PERIOD_ANNOTATION: "0s",
        params.RETRY_LIMIT_ANNOTATION: str(rounds + 1),
    }
    await kube.create(aw_ref, job_appwrapper("big", pods, annotations), ns)

    async def all_running() -> list[dict[str, Any]]:
        listing = await kube.list(session.refs["pod"], ns, fieldSelector="status.phase=Running")
        running = [p for p in listing["items"] if not p["metadata"].get("deletionTimestamp")]
        aw = await kube.get(aw_ref, "big", ns)
        return running if len(running) >= pods and aw["status"].get("phase") == "Running" else []

    def reset(count: int) -> Callable[[], Awaitable[bool]]:
        async def done() -> bool:
            status = (await kube.get(aw_ref, "big", ns)).get("status") or {}
            return bool(status.get("resettingCount", 0) == count and status.get("phase") == "Running")

        return done

    results: list[float] = []
    for attempt in range(rounds):
        # Every pod of this attempt running.
        running = await until(f"{pods} pods Running", all_running, within=RESET_LIMIT, every=0.2)
        victim = running[0]
        patch = failed_pod_status(
            [(c["name"], c.get("image", "")) for c in victim["spec"]["containers"]], 1, datetime.now(UTC)
        )
        t_fail = time.perf_counter()
        await kube.patch(session.refs["pod"], victim["metadata"]["name"], patch, ns, subresource="status")
        # Resetting, then Running again (new components created) with the count incremented.
        await until(f"reset {attempt + 1} done", reset(attempt + 1), within=RESET_LIMIT, every=0.05)
        elapsed = time.perf_counter() - t_fail
        results.append(elapsed)
        print(f"  reset {attempt + 1}: pod failure -> Running again in {elapsed * 1000:.0f} ms", flush=True)
    print(f"full reset of a {pods}-pod workload, grace and pause periods 0 (overhead = whole time):")
    print(f"  {fmt_ms(percentiles(results))}")
    print("\n".join(usage_lines(testbed.services(state))))
    await session.close()
    print(json.dumps({"namespace": ns}))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("verdict-to-delete")
    v.add_argument("--state-dir", type=Path, default=Path(".respawn"))
    v.add_argument("--appwrappers", type=int, default=1000)
    v.add_argument("--samples", type=int, default=50)
    v.add_argument("--namespace", help="reuse the Running AppWrappers an earlier run left in this namespace")
    r = sub.add_parser("reset")
    r.add_argument("--state-dir", type=Path, default=Path(".respawn"))
    r.add_argument("--pods", type=int, default=64)
    r.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.cmd == "verdict-to-delete":
        asyncio.run(
            verdict_to_delete(args.state_dir.resolve(), args.appwrappers, args.samples, args.namespace)
        )
    else:
        asyncio.run(reset_overhead(args.state_dir.resolve(), args.pods, args.rounds))


if __name__ == "__main__":
    main()
