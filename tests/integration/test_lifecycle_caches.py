"""Lifecycle reads from its watch caches, on the testbed's API server.

- A reset of a running AppWrapper, end to end (watcher, health and lifecycle as processes),
  reads neither the AppWrapper nor its Job by a GET: lifecycle's own request counter
  (``respawn_kube_requests_total``, from its /metrics) says so, while it counts the reset's writes.
- The caches' keep predicate and reshard, on real watches: a cache holds only the objects of the
  AppWrappers it keeps, and a reshard drops what it no longer keeps and lists what it newly
  keeps, after which its watch goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from respawn.testbed import manifests, sim
from respawn.testbed.cluster import kubectl
from respawn.testbed.modes import Endpoints
from respawn.testbed.services import ServiceProcess, spawn_service
from services.lifecycle.awcache import AppWrapperCache
from services.lifecycle.cache import WatchedCache
from services.lifecycle.componentcache import ComponentCache
from services.lifecycle.workqueue import Key
from shared.appwrapper.constants import API_VERSION, APPWRAPPER_LABEL, KIND
from shared.appwrapper.model import read_appwrapper
from shared.kube import Kube
from tests.integration.conftest import ServiceFactory
from tests.integration.objects import FAST_RESET, apply, get_appwrapper, jobs, running_pods, wait_phase
from tests.waiting import until

pytestmark = pytest.mark.testbed


def requests_of(sp: ServiceProcess) -> dict[tuple[str, str], float]:
    """The service's own count of its API requests, by (verb, resource)."""
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(sp.metrics()):
        for sample in family.samples:
            if sample.name == "respawn_kube_requests_total":
                out[(sample.labels["verb"], sample.labels["resource"])] = sample.value
    return out


def made(
    before: dict[tuple[str, str], float], after: dict[tuple[str, str], float]
) -> dict[tuple[str, str], float]:
    """The requests made between two readings."""
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0) > 0}


@pytest.fixture(scope="module")
def observers(
    testbed: Endpoints, appwrapper_crd: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """watcher and health, each its own process, for this module's lifecycle."""
    logs = tmp_path_factory.mktemp("observers") / "logs"
    started = [
        spawn_service(name, kubeconfig=testbed.kubeconfig, nats_url=testbed.nats_url, log_dir=logs)
        for name in ("watcher", "health")
    ]
    try:
        yield
    finally:
        for sp in started:
            sp.stop()


def pods_ready(aw: dict[str, Any] | None) -> bool:
    return read_appwrapper(aw).condition("PodsReady").get("status") == "True"


async def test_a_reset_of_a_running_appwrapper_reads_neither_it_nor_its_job_by_a_get(
    testbed: Endpoints, namespace: str, observers: None, service: ServiceFactory
) -> None:
    kc = testbed.kubeconfig
    lifecycle = service("lifecycle")
    annotations = {**FAST_RESET, **manifests.fault_tolerance(retry_pause="0s")}
    apply(kc, namespace, manifests.job_appwrapper("steady", pods=2, annotations=annotations))
    await wait_phase(kc, namespace, "steady", "Running", within=60)
    await until(
        "both pods running", lambda: running_pods(kc, namespace, "steady"), done=lambda p: len(p) == 2
    )
    running = await until("PodsReady", lambda: get_appwrapper(kc, namespace, "steady"), done=pods_ready)
    [first_job] = jobs(kc, namespace)

    before = requests_of(lifecycle)
    victim = running_pods(kc, namespace, "steady")[0]["metadata"]["name"]
    sim.fail_pod(kc, namespace, victim, exit_code=1)
    done = await until(
        "reset and running again",
        lambda: get_appwrapper(kc, namespace, "steady"),
        done=lambda aw: (
            read_appwrapper(aw).resetting_count == 1
            and read_appwrapper(aw).phase == "Running"
            and pods_ready(aw)
        ),
        within=60,
    )
    [second_job] = jobs(kc, namespace)
    reset = made(before, requests_of(lifecycle))

    # The reset took place: a new Job, status writes, a delete and a create, all counted.
    assert second_job["metadata"]["uid"] != first_job["metadata"]["uid"]
    assert done["metadata"]["uid"] == running["metadata"]["uid"]
    assert reset.get(("update", "appwrappers/status"), 0) >= 2, reset
    assert reset.get(("delete", "jobs"), 0) >= 1 and reset.get(("create", "jobs"), 0) == 1, reset
    # And none of its reads was a GET of the AppWrapper or of its Job: they came from the caches.
    assert reset.get(("get", "appwrappers"), 0) == 0, reset
    assert reset.get(("get", "jobs"), 0) == 0, reset
    assert not any(verb == "list" and resource in ("appwrappers", "jobs") for verb, resource in reset), reset


# ------------------------------------------------------------------ keep and reshard, for real


class Owned:
    def __init__(self, *names: str) -> None:
        self.names = set(names)

    def __call__(self, key: Key) -> bool:
        return key[1] in self.names


def names(cache: WatchedCache[Any]) -> list[str]:
    return sorted(str(entry.value["metadata"]["name"]) for entry in cache.entries())


def labelled_configmap(name: str, appwrapper: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {APPWRAPPER_LABEL: appwrapper}},
        "data": {"k": "v"},
    }


@contextlib.asynccontextmanager
async def running(cache: WatchedCache[Any], kube: Kube, ref: Any, **kw: Any) -> AsyncIterator[None]:
    task = asyncio.create_task(cache.run(kube, ref, **kw))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_reshard_drops_what_is_no_longer_kept_and_lists_what_newly_is(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str
) -> None:
    kc = testbed.kubeconfig
    for name in ("a", "b"):
        apply(kc, namespace, manifests.job_appwrapper(name, suspend=True))
        apply(kc, namespace, labelled_configmap(f"{name}-config", name))
    owned = Owned("a")
    triggers: list[Key] = []
    kube = await Kube.connect(kc)
    try:
        aw_ref = await kube.resource(API_VERSION, KIND)
        cm_ref = await kube.resource("v1", "ConfigMap")
        aws = AppWrapperCache(on_change=triggers.append, keep=owned)
        configmaps = ComponentCache(cm_ref, on_change=triggers.append, keep=owned)
        async with running(aws, kube, aw_ref), running(configmaps, kube, cm_ref):
            await until("the caches synced", lambda: aws.synced and configmaps.synced)

            def of(cache: WatchedCache[Any]) -> list[str]:
                return [n for n in names(cache) if n.startswith(("a", "b"))]

            assert of(aws) == ["a"] and of(configmaps) == ["a-config"]
            assert not aws.lookup((namespace, "b")).known

            # b becomes ours: listed again, b's objects are there once the reshard returns.
            owned.names = {"a", "b"}
            assert not configmaps.answers((namespace, "b")), "b's ConfigMap was turned away"
            await asyncio.wait_for(asyncio.gather(aws.reshard(), configmaps.reshard()), 30)
            assert of(aws) == ["a", "b"] and of(configmaps) == ["a-config", "b-config"]
            assert configmaps.answers((namespace, "b"))
            found = aws.lookup((namespace, "b"))
            assert found.known and found.obj is not None and found.obj["spec"]["suspend"] is True

            # a goes to another replica: dropped at once, and its changes no longer trigger.
            owned.names = {"b"}
            await asyncio.wait_for(asyncio.gather(aws.reshard(), configmaps.reshard()), 30)
            assert of(aws) == ["b"] and of(configmaps) == ["b-config"]
            triggers.clear()
            kubectl(kc, "label", "configmap", "a-config", "-n", namespace, "touched=1")

            # The restarted watches go on: a change of b's objects arrives and triggers.
            kubectl(kc, "label", "configmap", "b-config", "-n", namespace, "touched=1")
            kubectl(kc, "annotate", "appwrapper", "b", "-n", namespace, "touched=1")
            await until("b's AppWrapper change seen", lambda: (namespace, "b") in triggers)
            await until(
                "b's annotation in the cache",
                lambda: ((aws.lookup((namespace, "b")).obj or {}).get("metadata") or {}).get("annotations"),
                done=lambda a: isinstance(a, dict) and a.get("touched") == "1",
            )
            assert (namespace, "a") not in triggers
            kubectl(kc, "delete", "configmap", "b-config", "-n", namespace)
            await until("b's ConfigMap gone", lambda: configmaps.get(namespace, "b-config") is None)
            assert configmaps.answers((namespace, "b"))
    finally:
        await kube.close()
