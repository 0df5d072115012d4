"""The lifecycle under kill -9 and hostile input, against the real API server and NATS.

Most tests run lifecycle's own parts inside the test process (wired as services/lifecycle/
service.py wires them), so that a crash can be placed exactly: between a status write and the
announcements that follow it, between a create and the write that records its name. The crash
is an exception no handler of the service catches, raised by a thin wrapper around the real
client at that call; everything else is the real API server's and the real JetStream's doing
(optimistic concurrency, uid preconditions, de-duplication by Nats-Msg-Id).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from respawn.testbed import manifests, sim
from respawn.testbed.cluster import kubectl
from respawn.testbed.modes import Endpoints
from services.lifecycle.executor import Executor
from services.lifecycle.failures import RECONCILE_ERROR_EVENT
from services.lifecycle.incidents import Incidents
from services.lifecycle.machine import COMPONENT_NOT_CONTROLLED_EVENT
from services.lifecycle.podcache import PodCache
from services.lifecycle.reader import Reader
from services.lifecycle.reconciler import Reconciler
from services.lifecycle.serverclock import ServerClock
from services.lifecycle.service import Lifecycle
from services.lifecycle.workqueue import WorkQueue
from shared import subjects
from shared.appwrapper.constants import (
    ANNOUNCED_ANNOTATION,
    API_VERSION,
    APPWRAPPER_LABEL,
    COMPONENT_ANNOTATION,
    KIND,
)
from shared.appwrapper.params import (
    FAILURE_GRACE_PERIOD_ANNOTATION,
    FORCEFUL_DELETION_GRACE_PERIOD_ANNOTATION,
    RETRY_PAUSE_PERIOD_ANNOTATION,
)
from shared.bus import Bus
from shared.config import load_config
from shared.faulttolerance import FaultTolerance
from shared.kube import Kube, KubeApiError, ResourceRef
from shared.kubetime import parse_kube_time, utcnow
from shared.messages import LifecycleEvent, Message
from shared.runtime import Runtime
from tests.integration.conftest import ServiceFactory
from tests.integration.observe import Observer
from tests.waiting import until

pytestmark = pytest.mark.testbed

FAST = {
    FAILURE_GRACE_PERIOD_ANNOTATION: "0s",
    RETRY_PAUSE_PERIOD_ANNOTATION: "1s",
    FORCEFUL_DELETION_GRACE_PERIOD_ANNOTATION: "5s",
}


class Killed(BaseException):
    """SIGKILL at this call: no handler of the service catches it, nothing after it runs."""


# ------------------------------------------------------------------------------ plumbing


@contextlib.asynccontextmanager
async def connected(testbed: Endpoints) -> AsyncIterator[tuple[Kube, Bus]]:
    kube = await Kube.connect(testbed.kubeconfig)
    bus = await Bus.connect(testbed.nats_url, name=f"test-lifecycle-{uuid.uuid4().hex[:8]}")
    await bus.ensure_streams()
    try:
        yield kube, bus
    finally:
        await bus.close()
        await kube.close()


# (verb, resource plural, object name) of a call, before it is made.
Hook = Callable[[str, str, str], Any]


def _named(verb: str, args: tuple[Any, ...], kw: Mapping[str, Any]) -> str:
    """The name of the object a call of ``verb`` (with lifecycle's arguments) is about."""
    if verb == "list":
        return ""
    if verb in ("get", "patch", "delete"):
        return str(args[1] if len(args) > 1 else kw["name"])
    body = args[1] if len(args) > 1 else kw["body"]
    return str((body.get("metadata") or {}).get("name") or "")


class Wrapped:
    """The real client, with a hook before each call (to crash there, or to act as someone else
    acting at that moment). Nothing is faked: every call goes to the API server. Each call is
    passed on as made (rather than through a copy of every signature of shared.kube.Kube)."""

    HOOKED = frozenset({"get", "list", "create", "replace", "replace_status", "patch", "delete"})

    def __init__(self, kube: Kube, before: Hook | None = None) -> None:
        self.kube = kube
        self.before = before

    def __getattr__(self, verb: str) -> Any:
        call = getattr(self.kube, verb)
        if verb not in self.HOOKED:
            return call

        async def hooked(ref: ResourceRef, *args: Any, **kw: Any) -> Any:
            if self.before is not None:
                result = self.before(verb, ref.plural, _named(verb, (ref, *args), kw))
                if asyncio.iscoroutine(result):
                    await result
            return await call(ref, *args, **kw)

        return hooked


class Publishing:
    """The real bus, with a hook before each publish."""

    def __init__(self, bus: Bus, before: Callable[[Message], None] | None = None) -> None:
        self.bus = bus
        self.before = before

    async def publish(self, subject: str, message: Message, *, msg_id: str | None) -> Any:
        if self.before is not None:
            self.before(message)
        return await self.bus.publish(subject, message, msg_id=msg_id)


class Instance:
    """One lifecycle instance in this process (a fresh one has nothing in memory)."""

    def __init__(
        self,
        kube: Kube | Wrapped,
        bus: Publishing,
        refs: tuple[ResourceRef, ResourceRef],
        local: Callable[[], datetime] = utcnow,
    ) -> None:
        appwrappers, pods = refs
        self.clock = ServerClock(local)
        self.queue = WorkQueue(clock=self.clock.now)
        self.reader = Reader(kube, appwrappers=appwrappers, pods=pods, pod_cache=PodCache())
        self.reconciler = Reconciler(
            reader=self.reader,
            executor=Executor(kube, bus, appwrappers=appwrappers, pods=pods, clock=self.clock),
            queue=self.queue,
            incidents=Incidents(),
            defaults=FaultTolerance(),
            clock=self.clock.now,
        )

    async def reconcile(self, namespace: str, name: str, passes: int = 1) -> None:
        try:
            for _ in range(passes):
                await self.reconciler.reconcile_key((namespace, name), None)
        finally:
            self.queue.close()


async def refs(kube: Kube) -> tuple[ResourceRef, ResourceRef]:
    return await kube.resource(API_VERSION, KIND), await kube.resource("v1", "Pod")


def apply(kubeconfig: Path, namespace: str, manifest: dict[str, Any]) -> None:
    kubectl(kubeconfig, "apply", "-n", namespace, "-f", "-", stdin=json.dumps(manifest))


async def appwrapper(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return await kube.get(await kube.resource(API_VERSION, KIND), name, namespace)
    except KubeApiError as exc:
        if exc.not_found:
            return None
        raise


def condition(aw: Mapping[str, Any] | None, ctype: str) -> dict[str, Any]:
    for cond in ((aw or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == ctype:
            return dict(cond)
    return {}


async def events(kube: Kube, namespace: str, name: str) -> list[dict[str, Any]]:
    listing = await kube.request(
        "GET",
        f"/api/v1/namespaces/{namespace}/events",
        query={"fieldSelector": f"involvedObject.name={name},involvedObject.kind=AppWrapper"},
    )
    items: list[dict[str, Any]] = listing.get("items", [])
    return items


async def announced(nats_url: str, namespace: str, name: str) -> list[LifecycleEvent]:
    async with Observer(nats_url) as obs:
        return await obs.all(
            subjects.LIFECYCLE_STREAM, subjects.lifecycle_event(namespace, name), LifecycleEvent
        )


def jobs(kubeconfig: Path, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = sim.get_json(kubeconfig, "jobs", "-n", namespace)["items"]
    return items


# ---------------------------------------------------------- 1. announcements, exactly once


async def test_an_announcement_lost_to_a_kill_after_the_status_write_arrives_exactly_once(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str
) -> None:
    kc = testbed.kubeconfig
    apply(kc, namespace, manifests.job_appwrapper("phoenix", suspend=True, annotations=FAST))
    async with connected(testbed) as (kube, bus):
        where = await refs(kube)

        def kill(*_: Any) -> None:
            raise Killed

        def kill_at_the_first_event(verb: str, plural: str, name: str) -> None:
            if verb == "create" and plural == "events":
                kill()

        # The first instance writes Suspended and dies before announcing it (an Event first,
        # then the stream message).
        with pytest.raises(Killed):
            await Instance(Wrapped(kube, kill_at_the_first_event), Publishing(bus, kill), where).reconcile(
                namespace, "phoenix"
            )
        written = await appwrapper(kube, namespace, "phoenix")
        assert (written or {}).get("status", {}).get("phase") == "Suspended"
        assert ANNOUNCED_ANNOTATION not in (written or {})["metadata"].get("annotations", {})
        assert await announced(testbed.nats_url, namespace, "phoenix") == []
        assert await events(kube, namespace, "phoenix") == []

        # A fresh instance, knowing only the status, sends what is missing; a third sends nothing.
        await Instance(kube, Publishing(bus), where).reconcile(namespace, "phoenix")
        await Instance(kube, Publishing(bus), where).reconcile(namespace, "phoenix", passes=2)

        messages = await announced(testbed.nats_url, namespace, "phoenix")
        assert [(m.event, m.phase) for m in messages] == [("PhaseChanged", "Suspended")]
        assert [e["reason"] for e in await events(kube, namespace, "phoenix")] == ["Suspended"]
        done = await appwrapper(kube, namespace, "phoenix")
        assert (done or {})["metadata"]["annotations"][ANNOUNCED_ANNOTATION].startswith("Suspended/0/")


async def test_a_kill_after_the_announcements_before_their_record_sends_no_second_copy(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str, service: ServiceFactory
) -> None:
    kc = testbed.kubeconfig
    apply(kc, namespace, manifests.job_appwrapper("twice", suspend=True, annotations=FAST))
    async with connected(testbed) as (kube, bus):
        where = await refs(kube)

        def kill_at_the_record(verb: str, plural: str, name: str) -> None:
            if verb == "patch" and plural == "appwrappers":
                raise Killed

        with pytest.raises(Killed):
            await Instance(Wrapped(kube, kill_at_the_record), Publishing(bus), where).reconcile(
                namespace, "twice"
            )
        first = await announced(testbed.nats_url, namespace, "twice")
        assert [(m.event, m.phase) for m in first] == [("PhaseChanged", "Suspended")]

        # The restarted instance re-derives them with the same ids: JetStream drops the message,
        # the API server refuses the Event (its name exists).
        await Instance(kube, Publishing(bus), where).reconcile(namespace, "twice")
        assert await announced(testbed.nats_url, namespace, "twice") == first
        assert [e["reason"] for e in await events(kube, namespace, "twice")] == ["Suspended"]

    # The real service takes over from here: admitted, it runs, and every transition is
    # announced once. Alone, it is woken by its resync (made short), not by observations.
    service("lifecycle", env={"RESPAWN_LIFECYCLE_RESYNC_PERIOD": "2s"})
    kubectl(
        kc,
        "patch",
        "appwrapper",
        "twice",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec":{"suspend":false}}',
    )
    await until(
        "Running",
        lambda: (
            sim.get_json(kc, "appwrapper", "twice", "-n", namespace).get("status", {}).get("phase")
            == "Running"
        ),
        within=60,  # a service starting, its first resync, a Job's pod scheduled and run
    )
    async with connected(testbed) as (kube, _):
        messages = await until(
            "the Running announcement",
            lambda: _with_phase(testbed.nats_url, namespace, "twice", "Running"),
        )
        phases = [m.phase for m in messages if m.event == "PhaseChanged"]
        assert phases == ["Suspended", "Resuming", "Running"]
        reasons = sorted(e["reason"] for e in await events(kube, namespace, "twice"))
        assert reasons == ["Resuming", "Running", "Suspended"]


async def _with_phase(nats_url: str, namespace: str, name: str, phase: str) -> list[LifecycleEvent]:
    messages = await announced(nats_url, namespace, name)
    return messages if any(m.phase == phase for m in messages) else []


# ------------------------------------------------- 2. never delete what is not confirmed ours


def foreign_job(name: str) -> dict[str, Any]:
    """A Job of another team, suspended (so it has no pods), with no AppWrapper as its owner."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {"team": "b"}},
        "spec": {
            "suspend": True,
            "template": {
                "spec": {"restartPolicy": "Never", "containers": [{"name": "m", "image": "busybox"}]}
            },
        },
    }


async def test_another_teams_object_of_the_same_name_survives_the_appwrapper_and_its_owner_is_told(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str, service: ServiceFactory
) -> None:
    kc = testbed.kubeconfig
    apply(kc, namespace, foreign_job("clash-job"))
    [theirs] = jobs(kc, namespace)
    # Only lifecycle runs here: no observation wakes it, its resync does (made short).
    service("lifecycle", env={"RESPAWN_LIFECYCLE_RESYNC_PERIOD": "2s"})
    apply(kc, namespace, manifests.job_appwrapper("clash", annotations=FAST))

    def released() -> dict[str, Any] | None:
        aw = sim.get_json(kc, "appwrapper", "clash", "-n", namespace)
        return aw if condition(aw, "QuotaReserved").get("status") == "False" else None

    failed = await until("the AppWrapper Failed and released", released, within=30)
    assert failed is not None and failed["status"]["phase"] == "Failed"
    unhealthy = condition(failed, "Unhealthy")
    assert (unhealthy["status"], unhealthy["reason"]) == ("True", "CreateFailed")
    assert "resource Job clash-job exists, but is not controlled by appwrapper" in unhealthy["message"]
    async with connected(testbed) as (kube, _):
        told = await until(
            "the owner to be told",
            lambda: _reasons(kube, namespace, "clash", COMPONENT_NOT_CONTROLLED_EVENT),
        )
        assert "left in place" in told[0]["message"]

    kubectl(kc, "delete", "appwrapper", "clash", "-n", namespace, "--wait=false")
    await until(
        "the AppWrapper gone",
        lambda: kubectl(kc, "get", "appwrapper", "clash", "-n", namespace, check=False).returncode != 0,
    )
    [still] = jobs(kc, namespace)
    assert still["metadata"]["uid"] == theirs["metadata"]["uid"], "never deleted, never replaced"
    assert still["metadata"].get("deletionTimestamp") is None


async def _reasons(kube: Kube, namespace: str, name: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in await events(kube, namespace, name) if e["reason"] == reason]


async def test_a_read_that_fails_never_turns_into_a_delete_by_name(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str
) -> None:
    """Before: an Unknown read counted as 'ours', and the staged deletion deleted the recorded
    name without a uid. Here every read of the Job after the create's own check fails, while the
    AppWrapper fails and deletes: the other team's Job is never touched."""
    kc = testbed.kubeconfig
    apply(kc, namespace, foreign_job("flaky-job"))
    [theirs] = jobs(kc, namespace)
    apply(kc, namespace, manifests.job_appwrapper("flaky", annotations=FAST))
    async with connected(testbed) as (kube, bus):
        where = await refs(kube)
        reads = 0
        deletes: list[str] = []

        def flaky(verb: str, plural: str, name: str) -> None:
            nonlocal reads
            if plural != "jobs":
                return
            if verb == "delete":
                deletes.append(name)
            if verb == "get":
                reads += 1
                if reads > 2:
                    raise KubeApiError(503, "ServiceUnavailable", "etcdserver: leader changed")

        await Instance(Wrapped(kube, flaky), Publishing(bus), where).reconcile(namespace, "flaky", passes=4)
        aw = await appwrapper(kube, namespace, "flaky")
        assert (aw or {})["status"]["phase"] == "Failed"
        assert condition(aw, "ResourcesDeployed")["status"] == "True", "not declared gone while unreadable"
        assert deletes == []
    [still] = jobs(kc, namespace)
    assert still["metadata"]["uid"] == theirs["metadata"]["uid"]


# ------------------------------------------------------ 3. generated names: created once


def apply_generating(kubeconfig: Path, namespace: str, name: str) -> None:
    """Apply an AppWrapper ``name`` whose Job has only a generateName (``<name>-job-``)."""
    manifest = manifests.job_appwrapper(name, annotations=FAST)
    job_meta = manifest["spec"]["components"][0]["template"]["metadata"]
    job_meta["generateName"] = job_meta.pop("name") + "-"
    apply(kubeconfig, namespace, manifest)


async def test_a_generated_name_create_whose_status_write_conflicts_is_adopted_not_duplicated(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str
) -> None:
    kc = testbed.kubeconfig
    apply_generating(kc, namespace, "gen")
    async with connected(testbed) as (kube, bus):
        where = await refs(kube)
        created = False
        bumped = False

        async def someone_writes_first(verb: str, plural: str, name: str) -> None:
            nonlocal created, bumped
            if verb == "create" and plural == "jobs":
                created = True
            elif verb == "replace_status" and created and not bumped:
                # Between the read and the write that would record the generated name, another
                # writer changes the AppWrapper: the write gets a real 409 from the API server.
                bumped = True
                await kube.patch(
                    where[0], "gen", {"metadata": {"annotations": {"example.com/touched": "1"}}}, namespace
                )

        await Instance(Wrapped(kube, someone_writes_first), Publishing(bus), where).reconcile(
            namespace, "gen", passes=2
        )
        assert bumped
        aw = await appwrapper(kube, namespace, "gen")
        [job] = jobs(kc, namespace)
        assert (aw or {})["status"]["phase"] == "Running"
        assert aw["status"]["componentStatus"][0]["name"] == job["metadata"]["name"]  # type: ignore[index]
        assert job["metadata"]["name"].startswith("gen-job-")
        assert job["metadata"]["annotations"][COMPONENT_ANNOTATION].startswith(aw["metadata"]["uid"] + "/")  # type: ignore[index]


async def test_a_generated_name_create_followed_by_a_kill_is_adopted_by_the_next_instance(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str
) -> None:
    kc = testbed.kubeconfig
    apply_generating(kc, namespace, "genkill")
    async with connected(testbed) as (kube, bus):
        where = await refs(kube)

        def kill_after_create(verb: str, plural: str, name: str) -> None:
            if verb == "replace_status" and jobs(kc, namespace):
                raise Killed

        with pytest.raises(Killed):
            await Instance(Wrapped(kube, kill_after_create), Publishing(bus), where).reconcile(
                namespace, "genkill"
            )
        assert len(jobs(kc, namespace)) == 1
        await Instance(kube, Publishing(bus), where).reconcile(namespace, "genkill", passes=2)
        aw = await appwrapper(kube, namespace, "genkill")
        [job] = jobs(kc, namespace)
        assert (aw or {})["status"]["phase"] == "Running"
        assert aw["status"]["componentStatus"][0]["name"] == job["metadata"]["name"]  # type: ignore[index]


# -------------------------------------------------------------------------- 4. clock skew


@contextlib.asynccontextmanager
async def lifecycle_in_process(
    testbed: Endpoints, *, local: Callable[[], datetime] = utcnow, resync: str = "30s"
) -> AsyncIterator[Lifecycle]:
    """The whole service in this process (its clock injected), until the block ends."""
    async with connected(testbed) as (kube, bus):
        config = load_config(env={"RESPAWN_LIFECYCLE_RESYNC_PERIOD": resync})
        rt = Runtime(name="lifecycle", config=config, bus=bus, kube=kube, probes=None)
        appwrappers, pods = await refs(kube)
        lifecycle = Lifecycle(rt, appwrappers=appwrappers, pods=pods, clock=local)
        task = asyncio.create_task(lifecycle.run(), name="lifecycle-under-test")
        try:
            yield lifecycle
            assert not task.done(), f"the service stopped: {task}"
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


@pytest.mark.parametrize("skew_minutes", [7, -7])
async def test_a_lifecycle_with_a_skewed_clock_still_resets_the_workload_it_started(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str, service: ServiceFactory, skew_minutes: int
) -> None:
    """Health tells an attempt's pods by their creationTimestamp (the API server's clock)
    against the attempt's start, which lifecycle writes. Seven minutes ahead, an uncorrected
    lifecycle writes a start after its own pods were created, and health never sees them fail."""
    kc = testbed.kubeconfig
    service("watcher")
    service("health")
    skew = timedelta(minutes=skew_minutes)
    name = f"skew{'ahead' if skew_minutes > 0 else 'behind'}"
    async with lifecycle_in_process(testbed, local=lambda: utcnow() + skew) as lifecycle:
        apply(
            kc,
            namespace,
            manifests.job_appwrapper(name, pod_annotations={sim.SUCCEED_AFTER: "6s"}, annotations=FAST),
        )
        await until("Running", lambda: _phase(testbed, namespace, name, "Running"))
        aw = sim.get_json(kc, "appwrapper", name, "-n", namespace)
        started = parse_kube_time(condition(aw, "ResourcesDeployed")["lastTransitionTime"])
        [job] = jobs(kc, namespace)
        created = parse_kube_time(job["metadata"]["creationTimestamp"])
        assert started is not None and created is not None
        assert started <= created <= started + timedelta(seconds=5), (started, created)
        assert abs(lifecycle.clock.offset + skew) < timedelta(seconds=2)

        pod = await until("a running pod", lambda: _running_pod(kc, namespace, name))
        sim.fail_pod(kc, namespace, pod)
        done = await until(
            "Succeeded after one reset", lambda: _phase(testbed, namespace, name, "Succeeded"), within=60
        )
        assert done is not None and done["status"]["resettingCount"] == 1
    messages = await announced(testbed.nats_url, namespace, name)
    assert [m.resetting_count for m in messages if m.event == "ResetStarted"] == [1]


async def _phase(testbed: Endpoints, namespace: str, name: str, phase: str) -> dict[str, Any] | None:
    aw = await asyncio.to_thread(sim.get_json, testbed.kubeconfig, "appwrapper", name, "-n", namespace)
    return aw if (aw.get("status") or {}).get("phase") == phase else None


def _running_pod(kc: Path, namespace: str, name: str) -> str:
    pods = sim.get_json(kc, "pods", "-n", namespace, "-l", f"{APPWRAPPER_LABEL}={name}")["items"]
    running = [
        p
        for p in pods
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]
    return str(running[0]["metadata"]["name"]) if running else ""


# -------------------------------------------------------------- 5. per-object failures


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_an_appwrapper_nested_deeper_than_the_default_decoder_is_served_with_the_others(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str, tmp_path: Path
) -> None:
    """About 1,000 levels of nesting are valid for the API server but beyond Python's default
    JSON recursion limit. Before, the resync died of it (RecursionError is not a KubeApiError)
    and with it the service, and again at every restart. Now the Kubernetes layer decodes such
    an answer with room for it (shared.kube.client.decode_body), so the LIST pages stay readable:
    every other AppWrapper is served, and the deep one fails with a message that says why; the
    service stays up and its resync rounds complete."""
    kc = testbed.kubeconfig
    deep = manifests.job_appwrapper("deep", annotations=FAST)
    deep["metadata"]["namespace"] = namespace
    text = json.dumps(deep).replace(
        '"spec": {"parallelism"',
        '"x-nested": ' + '{"a": ' * 990 + "{}" + "}" * 990 + ', "spec": {"parallelism"',
        1,
    )
    manifest = tmp_path / "deep.json"
    manifest.write_text(text)
    kubectl(kc, "create", "-f", str(manifest))
    try:
        failed_rounds = sum(
            metric("respawn_lifecycle_resync_failures_total", error=error)
            for error in ("RecursionError", "KubeApiError")
        )
        async with lifecycle_in_process(testbed, resync="1s") as lifecycle:
            apply(kc, namespace, manifests.job_appwrapper("good", annotations=FAST))
            lifecycle.queue.enqueue((namespace, "good"))
            await until("the good one Running", lambda: _phase(testbed, namespace, "good", "Running"))
            async with connected(testbed) as (kube, _):

                def deep_phase() -> str:
                    # jsonpath: the test's own JSON decoder has the default recursion limit.
                    args = ("get", "appwrapper", "deep", "-n", namespace, "-o", "jsonpath={.status.phase}")
                    return kubectl(kc, *args).stdout.strip()

                # Found by the resync alone: nothing enqueues the deep one here. Its Job is
                # deeper than lifecycle creates (templating.MAX_TEMPLATE_DEPTH): it fails, saying
                # why, instead of every pass dying of a RecursionError.
                await until(
                    "the deep one Failed", lambda: asyncio.to_thread(deep_phase), done=lambda p: p == "Failed"
                )
                assert not await _reasons(kube, namespace, "deep", RECONCILE_ERROR_EVENT)
            assert (
                sum(
                    metric("respawn_lifecycle_resync_failures_total", error=error)
                    for error in ("RecursionError", "KubeApiError")
                )
                == failed_rounds
            )
    finally:
        kubectl(kc, "delete", "appwrapper", "deep", "-n", namespace, "--wait=false", check=False)
