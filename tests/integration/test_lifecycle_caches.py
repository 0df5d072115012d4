"""Lifecycle reads from its watch caches, on the testbed's API server.

- A reset of a running AppWrapper, end to end (watcher and health as processes, the lifecycle
  service in this process on a client that records every request it sends), reads neither the
  AppWrapper nor its Job by a GET, while its writes are all there.
- A cache whose watch the API server forbids answers for nothing (the reads go to the server).
- The caches' keep predicate and reshard, on real watches: a cache holds only the objects of the
  AppWrappers it keeps, and a reshard drops what it no longer keeps and lists what it newly
  keeps, after which its watch goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from respawn.testbed import manifests, sim
from respawn.testbed.cluster import kubectl
from respawn.testbed.modes import Endpoints
from respawn.testbed.services import spawn_service, stop_all
from services.lifecycle.awcache import AppWrapperCache
from services.lifecycle.cache import WatchedCache
from services.lifecycle.componentcache import ComponentCache
from services.lifecycle.service import Lifecycle
from services.lifecycle.workqueue import Key
from shared.appwrapper.constants import API_VERSION, APPWRAPPER_LABEL, KIND
from shared.appwrapper.model import read_appwrapper
from shared.bus import Bus
from shared.config import load_config
from shared.kube import Kube
from shared.kube.client import request_kind
from shared.runtime import Runtime
from tests.integration.objects import FAST_RESET, apply, get_appwrapper, jobs, running_pods, wait_phase
from tests.integration.test_deploy import service_account_kubeconfig
from tests.waiting import until

pytestmark = pytest.mark.testbed


class Counting(Kube):
    """The real client, recording each request it sends (method, path, query) before sending it.
    Nothing is faked: every request goes to the API server."""

    def __init__(self, api: Any) -> None:
        super().__init__(api)
        self.sent: list[tuple[str, str, dict[str, Any]]] = []

    async def _request(self, method: str, path: str, query: Any, **kw: Any) -> dict[str, Any]:
        self.sent.append((method, path, dict(query or {})))
        return await super()._request(method, path, query, **kw)


@contextlib.asynccontextmanager
async def lifecycle_counting(testbed: Endpoints) -> AsyncIterator[Counting]:
    """The whole lifecycle service in this process, on a counting client, until the block ends."""
    plain = await Kube.connect(testbed.kubeconfig)
    kube = Counting(plain.api)
    bus = await Bus.connect(testbed.nats_url, name=f"test-lifecycle-{uuid.uuid4().hex[:8]}")
    await bus.ensure_streams()
    try:
        rt = Runtime(name="lifecycle", config=load_config(env={}), bus=bus, kube=kube, probes=None)
        lifecycle = Lifecycle(
            rt, appwrappers=await kube.resource(API_VERSION, KIND), pods=await kube.resource("v1", "Pod")
        )
        task = asyncio.create_task(lifecycle.run(), name="lifecycle-under-test")
        try:
            yield kube
            assert not task.done(), f"the service stopped: {task}"
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    finally:
        await bus.close()
        await plain.close()


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
        stop_all(started)


def pods_ready(aw: dict[str, Any] | None) -> bool:
    return read_appwrapper(aw).condition("PodsReady").get("status") == "True"


async def test_a_reset_of_a_running_appwrapper_reads_neither_it_nor_its_job_by_a_get(
    testbed: Endpoints, namespace: str, observers: None
) -> None:
    kc = testbed.kubeconfig
    annotations = {**FAST_RESET, **manifests.fault_tolerance(retry_pause="0s")}
    async with lifecycle_counting(testbed) as kube:
        apply(kc, namespace, manifests.job_appwrapper("steady", pods=2, annotations=annotations))
        await wait_phase(kc, namespace, "steady", "Running", within=60)
        await until(
            "both pods running", lambda: running_pods(kc, namespace, "steady"), done=lambda p: len(p) == 2
        )
        running = await until("PodsReady", lambda: get_appwrapper(kc, namespace, "steady"), done=pods_ready)
        [first_job] = jobs(kc, namespace)

        before = len(kube.sent)
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
        # The requests about this namespace's objects (the service also looks after other tests'
        # AppWrappers, on their way out), by (verb, resource).
        reset = Counter(
            request_kind(method, path, query)
            for method, path, query in kube.sent[before:]
            if f"/namespaces/{namespace}/" in path
        )

    # The reset took place: a new Job, status writes, a delete and a create, all counted.
    assert second_job["metadata"]["uid"] != first_job["metadata"]["uid"]
    assert done["metadata"]["uid"] == running["metadata"]["uid"]
    assert reset[("update", "appwrappers/status")] >= 2, reset
    assert reset[("delete", "jobs")] >= 1 and reset[("create", "jobs")] == 1, reset
    # And none of its reads was a GET of the AppWrapper or of its Job: they came from the caches.
    assert reset[("get", "appwrappers")] == 0, reset
    assert reset[("get", "jobs")] == 0, reset
    assert reset[("list", "appwrappers")] == 0 and reset[("list", "jobs")] == 0, reset


# ------------------------------------------------------------------ keep and reshard, for real


class Owned:
    def __init__(self, *names: str) -> None:
        self.names = set(names)

    def __call__(self, key: Key) -> bool:
        return key[1] in self.names


def names(cache: WatchedCache[Any]) -> list[str]:
    return sorted(name for _, name in cache.held())


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


async def test_a_cache_whose_watch_is_forbidden_answers_nothing(
    testbed: Endpoints, namespace: str, tmp_path: Path
) -> None:
    """A role that grants list but not watch (lifecycle's, before it was given watch): the cache
    lists, is refused its watch, drops what it listed and answers for nothing, so every read goes
    to the API server instead of a list that would never change again."""
    kc = testbed.kubeconfig
    apply(kc, namespace, labelled_configmap("a-config", "a"))
    role = f"lifecycle-cache-{namespace}"
    rbac = [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "lister", "namespace": namespace},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": role},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": "lister", "namespace": namespace}],
        },
    ]
    kubectl(kc, "apply", "-f", "-", stdin="\n---\n".join(json.dumps(d) for d in rbac))
    try:
        token = kubectl(kc, "create", "token", "lister", "-n", namespace, "--duration=10m").stdout.strip()
        kube = await Kube.connect(service_account_kubeconfig(kc, token, tmp_path / "lister"))
        try:
            cm_ref = await kube.resource("v1", "ConfigMap")
            configmaps = ComponentCache(cm_ref)
            async with running(configmaps, kube, cm_ref):
                refused = await until("the watch refused", lambda: configmaps.forbidden, within=60)
                assert refused.forbidden
                assert not configmaps.synced and len(configmaps) == 0
                assert (
                    not configmaps.answers((namespace, "a")) and configmaps.get(namespace, "a-config") is None
                )
        finally:
            await kube.close()
    finally:
        kubectl(kc, "delete", "clusterrolebinding,clusterrole", role, "--ignore-not-found", check=False)
