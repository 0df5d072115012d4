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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats

from bench.common import fmt_ms, percentiles, settle, usage
from respawn.testbed import manifests
from respawn.testbed.cluster import State
from shared import subjects
from shared.kube import Kube, ResourceRef
from shared.kube.watch import list_then_watch
from shared.messages import ObjectRef, Verdict


def appwrapper(name: str, pods: int, annotations: dict[str, str]) -> dict[str, Any]:
    return manifests.job_appwrapper(name, pods=pods, annotations=annotations, job_name=name)


def parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


async def setup(state_dir: Path) -> tuple[State, Kube, ResourceRef, ResourceRef, ResourceRef]:
    state = State.load(state_dir)
    if state is None:
        raise SystemExit(
            f"no testbed in {state_dir}; run: respawn local up --state-dir {state_dir} --nodes 16"
        )
    kube = await Kube.connect(state.kubeconfig)
    aw_ref = await kube.resource("workload.codeflare.dev/v1beta2", "AppWrapper")
    job_ref = await kube.resource("batch/v1", "Job")
    ns_ref = await kube.resource("v1", "Namespace")
    return state, kube, aw_ref, job_ref, ns_ref


async def wait_phase(
    kube: Kube, aw_ref: ResourceRef, ns: str, names: list[str], phase: str, limit: float
) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        listing = await kube.list(aw_ref, ns)
        done = sum(1 for a in listing["items"] if (a.get("status") or {}).get("phase") == phase)
        if done >= len(names):
            return
        await asyncio.sleep(1.0)
    raise SystemExit(f"AppWrappers not all {phase} after {limit:.0f}s")


def report_processes(state: State) -> None:
    for name, pid in sorted(state.pids.items()):
        if name in ("watcher", "health", "lifecycle", "autopilot"):
            u = usage(pid)
            print(
                f"  {name}: cpu {u.cpu_seconds:.1f}s, rss {u.rss_mib:.0f} MiB, peak {u.peak_rss_mib:.0f} MiB"
            )


async def verdict_to_delete(state_dir: Path, count: int, samples: int, reuse: str | None) -> None:
    state, kube, aw_ref, job_ref, ns_ref = await setup(state_dir)
    if reuse:
        # Another round on AppWrappers an earlier run left Running (those it reset are Failed).
        ns = reuse
        listing = await kube.list(aw_ref, ns)
        names = sorted(
            a["metadata"]["name"]
            for a in listing["items"]
            if (a.get("status") or {}).get("phase") == "Running"
        )
        print(f"{len(names)} AppWrappers Running in {ns}")
    else:
        ns = f"bench-lc-{int(time.time())}"
        await kube.create(ns_ref, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        names = [f"aw-{i}" for i in range(count)]
        sem = asyncio.Semaphore(32)
        annotations = {"workload.codeflare.dev.appwrapper/retryLimit": "0"}

        async def create(name: str) -> None:
            async with sem:
                await kube.create(aw_ref, appwrapper(name, 1, annotations), ns)

        t0 = time.perf_counter()
        await asyncio.gather(*(create(n) for n in names))
        await wait_phase(kube, aw_ref, ns, names, "Running", 900)
        print(f"{count} AppWrappers Running after {time.perf_counter() - t0:.1f}s")
    if len(names) < samples:
        raise SystemExit(f"only {len(names)} AppWrappers Running in {ns}; fewer than --samples {samples}")
    services = {n: p for n, p in state.pids.items() if n in ("watcher", "health", "lifecycle", "autopilot")}
    waited = await settle(services)
    print(f"services quiet after {waited:.1f}s more (steady state: measuring now)")

    deleted: dict[str, float] = {}

    async def watch_jobs() -> None:
        async for event in list_then_watch(kube, job_ref, namespace=ns):
            meta = event.obj.get("metadata", {})
            if event.type == "DELETED" or meta.get("deletionTimestamp"):
                deleted.setdefault(meta.get("name", ""), time.perf_counter())

    watcher = asyncio.create_task(watch_jobs())
    await asyncio.sleep(1.0)
    nc = await nats.connect(state.nats_url)
    js = nc.jetstream()
    sent: dict[str, float] = {}
    listing = await kube.list(aw_ref, ns)
    by_name = {a["metadata"]["name"]: a for a in listing["items"]}
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
            attempt_started_at=parse_time(cond["lastTransitionTime"]),
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
    report_processes(state)
    watcher.cancel()
    await nc.close()
    await kube.close()
    print(json.dumps({"namespace": ns}))


async def reset_overhead(state_dir: Path, pods: int, rounds: int) -> None:
    state, kube, aw_ref, _job_ref, ns_ref = await setup(state_dir)
    pod_ref = await kube.resource("v1", "Pod")
    ns = f"bench-reset-{int(time.time())}"
    await kube.create(ns_ref, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    annotations = {
        "workload.codeflare.dev.appwrapper/failureGracePeriodDuration": "0s",
        "workload.codeflare.dev.appwrapper/retryPausePeriodDuration": "0s",
        "workload.codeflare.dev.appwrapper/retryLimit": str(rounds + 1),
    }
    await kube.create(aw_ref, appwrapper("big", pods, annotations), ns)
    results: list[float] = []
    for attempt in range(rounds):
        # Wait for all pods of this attempt to run.
        while True:
            listing = await kube.list(pod_ref, ns, fieldSelector="status.phase=Running")
            running = [p for p in listing["items"] if not p["metadata"].get("deletionTimestamp")]
            aw = await kube.get(aw_ref, "big", ns)
            if len(running) >= pods and aw["status"].get("phase") == "Running":
                break
            await asyncio.sleep(0.2)
        victim = running[0]["metadata"]["name"]
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        patch = {
            "status": {
                "phase": "Failed",
                "containerStatuses": [
                    {
                        "name": "c",
                        "image": "x",
                        "ready": False,
                        "restartCount": 0,
                        "state": {"terminated": {"exitCode": 1, "reason": "Error", "finishedAt": stamp}},
                    }
                ],
            }
        }
        t_fail = time.perf_counter()
        await kube.patch(pod_ref, victim, patch, ns, subresource="status")
        # Resetting, then Running again (new components created) with the count incremented.
        while True:
            aw = await kube.get(aw_ref, "big", ns)
            status = aw.get("status") or {}
            if status.get("resettingCount", 0) == attempt + 1 and status.get("phase") == "Running":
                break
            await asyncio.sleep(0.05)
        elapsed = time.perf_counter() - t_fail
        results.append(elapsed)
        print(f"  reset {attempt + 1}: pod failure -> Running again in {elapsed * 1000:.0f} ms", flush=True)
    print(f"full reset of a {pods}-pod workload, grace and pause periods 0 (overhead = whole time):")
    print(f"  {fmt_ms(percentiles(results))}")
    report_processes(state)
    await kube.close()
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
