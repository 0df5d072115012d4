"""Switching controllers on the testbed: upstream AppWrapper ⇄ Respawn, with workloads running.

The upstream controller (``bench/upstream.py``: the pinned release, webhooks off) runs
AppWrappers; it is stopped and Respawn's watcher, health and lifecycle start, as
docs/migration.md tells an operator to do. What upstream deployed must keep running untouched
(same Job, same pods, resettingCount unchanged, no deletion), and a pod failure afterwards is
Respawn's to handle. The other way round, the upstream controller takes over what Respawn
deployed, again without touching it.

The upstream controller watches every namespace of the shared testbed, so each test runs it only
while no Respawn service runs, as the cut-over does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench import upstream
from respawn.testbed import manifests, sim
from respawn.testbed.cluster import kubectl
from respawn.testbed.modes import Endpoints
from shared import subjects
from shared.appwrapper.constants import CRD_NAME, FINALIZER
from shared.appwrapper.model import read_appwrapper
from shared.messages import LifecycleEvent, Verdict
from tests.integration.conftest import CRD_DIR, services_on
from tests.integration.objects import FAST_RESET, apply, get_appwrapper, jobs, labelled_pods, running_pods
from tests.integration.observe import Observer
from tests.waiting import holds, until

pytestmark = pytest.mark.testbed

PODS = 2
# How long a workload must stay untouched after the other controller took over: several of
# lifecycle's passes and health's evaluations (they run on every observation and on timers).
QUIET = 8.0


def apply_crd(kubeconfig: Path, *source: str) -> None:
    """Apply a CRD as docs/migration.md does (server-side, taking over every field), and wait
    until it is served."""
    kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", *source)
    kubectl(kubeconfig, "wait", "--for=condition=Established", "--timeout=60s", f"crd/{CRD_NAME}")


@contextlib.contextmanager
def upstream_crd(kubeconfig: Path) -> Iterator[None]:
    """Upstream's own CRD in place of Respawn's, as on a cluster that runs upstream; Respawn's is
    put back however the block ends (the cut-over's step), so that later tests find it."""
    apply_crd(kubeconfig, "-f", str(upstream.module_dir() / upstream.UPSTREAM_CRD))
    try:
        yield
    finally:
        apply_crd(kubeconfig, "-k", str(CRD_DIR))


def crd_rules(kubeconfig: Path) -> int:
    """How many CEL rules the served CRD has (upstream's has none, Respawn's several)."""
    return kubectl(kubeconfig, "get", "crd", CRD_NAME, "-o", "json").stdout.count("x-kubernetes-validations")


@contextlib.contextmanager
def upstream_controller(kubeconfig: Path, log_dir: Path) -> Iterator[upstream.UpstreamController]:
    controller = upstream.start(kubeconfig, log_dir)
    try:
        yield controller
    finally:
        controller.stop()


@contextlib.contextmanager
def respawn_services(testbed: Endpoints, log_dir: Path) -> Iterator[None]:
    with services_on(testbed.kubeconfig, testbed.nats_url, log_dir) as start:
        for name in ("watcher", "health", "lifecycle"):
            start(name)
        yield


def snapshot(kubeconfig: Path, namespace: str, name: str) -> dict[str, Any]:
    """What a restart or a reset would change: the AppWrapper's uid, phase and resettingCount,
    its Job's uid, its pods' uids, and whether anything of it is being deleted."""
    aw = get_appwrapper(kubeconfig, namespace, name)
    fields = read_appwrapper(aw)
    job_name = f"{name}-job"
    own_jobs = [j for j in jobs(kubeconfig, namespace) if j["metadata"]["name"] == job_name]
    pods = labelled_pods(kubeconfig, namespace, name)
    return {
        "uid": (aw or {}).get("metadata", {}).get("uid"),
        "phase": fields.phase,
        "resettingCount": fields.resetting_count,
        "jobs": sorted(j["metadata"]["uid"] for j in own_jobs),
        "pods": sorted(p["metadata"]["uid"] for p in pods),
        "deleting": sorted(
            o["metadata"]["name"] for o in [*own_jobs, *pods] if o["metadata"].get("deletionTimestamp")
        ),
        "finalizers": (aw or {}).get("metadata", {}).get("finalizers", []),
    }


async def running(kubeconfig: Path, namespace: str, name: str) -> dict[str, Any]:
    """The snapshot once the AppWrapper is Running with all its pods running."""
    found: dict[str, Any] = await until(
        f"{namespace}/{name} Running with {PODS} running pods",
        lambda: (snapshot(kubeconfig, namespace, name), running_pods(kubeconfig, namespace, name)),
        done=lambda seen: seen[0]["phase"] == "Running" and len(seen[1]) == PODS,
        within=60,
    )
    return found[0]


async def healthy_verdict(nats_url: str, namespace: str, name: str) -> Verdict:
    """Health's latest verdict on the AppWrapper, once it says Healthy: health has folded in the
    adopted pods and judged them."""
    async with Observer(nats_url) as obs:
        return await obs.wait_last(
            subjects.VERDICTS_STREAM,
            subjects.verdict(namespace, name),
            Verdict,
            lambda v: v.state == "Healthy",
            within=60,
        )


async def lifecycle_events(nats_url: str, namespace: str, name: str) -> list[LifecycleEvent]:
    async with Observer(nats_url) as obs:
        return await obs.all(
            subjects.LIFECYCLE_STREAM, subjects.lifecycle_event(namespace, name), LifecycleEvent
        )


async def untouched(kubeconfig: Path, namespace: str, name: str, before: dict[str, Any]) -> None:
    await holds(
        f"{namespace}/{name} running untouched",
        lambda: snapshot(kubeconfig, namespace, name),
        done=lambda now: now == before,
        during=QUIET,
        every=0.5,
    )


async def settled(kubeconfig: Path, namespace: str, name: str, phase: str) -> dict[str, Any]:
    """The snapshot once the AppWrapper is in ``phase`` and nothing of it is being deleted."""
    found: dict[str, Any] = await until(
        f"{namespace}/{name} to settle in {phase}",
        lambda: snapshot(kubeconfig, namespace, name),
        done=lambda seen: seen["phase"] == phase and not seen["deleting"],
        within=60,
    )
    return found


async def test_respawn_adopts_what_upstream_runs_and_handles_the_next_fault(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str, tmp_path: Path
) -> None:
    kc = testbed.kubeconfig
    names = ("adopted-a", "adopted-b")
    with upstream_crd(kc), upstream_controller(kc, tmp_path / "logs"):
        assert crd_rules(kc) == 0, "upstream's CRD is served"
        for name in names:
            apply(kc, namespace, manifests.job_appwrapper(name, pods=PODS, annotations=FAST_RESET))
        # Beside the running ones, one that Kueue (or a user) keeps suspended and one that is done.
        apply(kc, namespace, manifests.job_appwrapper("held", pods=PODS, suspend=True))
        apply(
            kc,
            namespace,
            manifests.job_appwrapper("done", pods=PODS, pod_annotations={sim.SUCCEED_AFTER: "1s"}),
        )
        before = {name: await running(kc, namespace, name) for name in names}
        others = {
            "held": await settled(kc, namespace, "held", "Suspended"),
            "done": await settled(kc, namespace, "done", "Succeeded"),
        }
    # Respawn's CRD is served again (upstream_crd put it back): replacing the CRD kept every
    # AppWrapper and what it runs (checked below, against what upstream left).
    assert crd_rules(kc) > 0
    for name, seen in before.items():
        # Upstream's own finalizer, the one Respawn removes on deletion: the same string.
        assert seen["finalizers"] == [FINALIZER], name
        assert seen["resettingCount"] == 0, name
    assert others["held"]["jobs"] == [] and others["held"]["pods"] == []
    assert len(others["done"]["jobs"]) == 1

    with respawn_services(testbed, tmp_path / "respawn-logs"):
        for name in names:
            await healthy_verdict(testbed.nats_url, namespace, name)
        for name, seen in {**before, **others}.items():
            await untouched(kc, namespace, name, seen)
        # All Respawn said of a running one: its recent transition to Running, announced once
        # more (docs/migration.md); no reset began.
        announced = await lifecycle_events(testbed.nats_url, namespace, "adopted-b")
        assert announced, "the recent transition to Running is announced"
        assert {(e.event, e.phase) for e in announced} == {("PhaseChanged", "Running")}, announced

        # A fault after the switch is Respawn's: reset, recreated, Running again.
        victim = "adopted-a"
        pod = running_pods(kc, namespace, victim)[0]["metadata"]["name"]
        sim.fail_pod(kc, namespace, pod, exit_code=1)
        after = await until(
            f"{victim} reset by Respawn and Running again",
            lambda: (snapshot(kc, namespace, victim), running_pods(kc, namespace, victim)),
            done=lambda seen: (
                seen[0]["resettingCount"] == 1 and seen[0]["phase"] == "Running" and len(seen[1]) == PODS
            ),
            within=60,
        )
        assert after[0]["jobs"] != before[victim]["jobs"], "the reset recreates the Job"
        assert not set(after[0]["pods"]) & set(before[victim]["pods"])
        # The other workload was not disturbed by its neighbour's reset.
        await untouched(kc, namespace, "adopted-b", before["adopted-b"])


async def test_upstream_takes_back_what_respawn_runs(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str, tmp_path: Path
) -> None:
    kc = testbed.kubeconfig
    name = "rolled-back"
    with respawn_services(testbed, tmp_path / "respawn-logs"):
        apply(kc, namespace, manifests.job_appwrapper(name, pods=PODS, annotations=FAST_RESET))
        before = await running(kc, namespace, name)
    assert before["finalizers"] == [FINALIZER]

    with upstream_controller(kc, tmp_path / "logs") as controller:
        await untouched(kc, namespace, name, before)
        assert controller.alive()
