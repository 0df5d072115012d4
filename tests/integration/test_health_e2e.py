"""Health verdicts end to end: watcher, health and lifecycle as separate processes on the testbed.

Each test submits an AppWrapper that lifecycle really runs (kwok simulates the pods), injects one
fault through the pod simulation contract or the API, and reads the verdict stream
``respawn.verdict.<ns>.<name>`` as an external subscriber would. Grace periods are shortened with
the per-AppWrapper annotations so every fault is judged within seconds.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import nats
import pytest
import pytest_asyncio

from respawn.testbed import manifests, sim
from respawn.testbed.cluster import kubectl
from respawn.testbed.modes import Endpoints
from respawn.testbed.services import ServiceProcess
from shared import subjects
from shared.appwrapper.constants import Reason
from shared.appwrapper.model import read_appwrapper
from shared.appwrapper.params import (
    FAILURE_GRACE_PERIOD_ANNOTATION,
)
from shared.messages import PodObservation, Verdict, decode
from tests.integration.conftest import ServiceFactory
from tests.integration.objects import apply, wait_phase
from tests.integration.observe import Observer
from tests.waiting import holds, until

pytestmark = pytest.mark.testbed

VERDICTS = subjects.VERDICTS_STREAM
OBSERVATIONS = subjects.OBSERVATIONS_STREAM
# Operator default of FailureGracePeriod (no configuration is given to the services).
DEFAULT_FAILURE_GRACE = timedelta(minutes=1)


# ---------------------------------------------------------------------------------- manifests


def appwrapper(name: str, workload: dict[str, Any], **annotations: str) -> dict[str, Any]:
    """A runnable (not suspended) AppWrapper; lifecycle deploys it at once, as after Kueue admission."""
    return manifests.appwrapper(name, manifests.component(workload), annotations=annotations, suspend=False)


def pod(name: str, **template: Any) -> dict[str, Any]:
    return manifests.pod(name, container="c", **template)


def job(name: str, *, parallelism: int = 1, **template: Any) -> dict[str, Any]:
    pod_template = manifests.pod_template(container="c", **template)
    return manifests.job(name, pods=parallelism, backoffLimit=0, template=pod_template)


def get(kubeconfig: Path, namespace: str, *what: str) -> Any:
    return sim.get_json(kubeconfig, *what, "-n", namespace)


async def pod_names(kubeconfig: Path, namespace: str, *, count: int = 1) -> list[str]:
    pods = await until(
        f"{count} pods in {namespace}",
        lambda: get(kubeconfig, namespace, "pods")["items"],
        done=lambda items: len(items) >= count,
    )
    return sorted(p["metadata"]["name"] for p in pods)


# ---------------------------------------------------------------------------------- the stack


@dataclass
class Stack:
    kubeconfig: Path
    nats_url: str
    # RESPAWN_INSTANCE of the health process: its observation consumer is named after it.
    health_instance: str
    health: ServiceProcess
    service: ServiceFactory


@pytest.fixture
def stack(testbed: Endpoints, appwrapper_crd: Path, service: ServiceFactory) -> Stack:
    instance = uuid.uuid4().hex[:8]
    # Started side by side: each start waits for its process to be ready, which takes seconds.
    with ThreadPoolExecutor(max_workers=3) as pool:
        starts = [
            pool.submit(service, "watcher"),
            pool.submit(service, "health", env={"RESPAWN_INSTANCE": instance}),
            pool.submit(service, "lifecycle"),
        ]
        health = [started.result() for started in starts][1]
    return Stack(testbed.kubeconfig, testbed.nats_url, instance, health, service)


@dataclass
class VerdictFeed:
    """Every verdict published for one AppWrapper, in order, read as an external subscriber would."""

    nc: Any
    namespace: str
    name: str
    seen: list[Verdict] = field(default_factory=list)
    sub: Any = None

    @property
    def subject(self) -> str:
        return subjects.verdict(self.namespace, self.name)

    async def start(self) -> None:
        js = self.nc.jetstream()
        self.sub = await js.subscribe(self.subject, stream=VERDICTS, ordered_consumer=True)

    async def wait(self, check: Callable[[Verdict], bool], *, within: float = 30) -> Verdict:
        """The first verdict (already seen or arriving within ``within`` seconds) that passes ``check``."""

        async def read() -> list[tuple[int, str, str, str]]:
            # The next verdict, if one comes within a second, then a summary of all seen so far.
            with contextlib.suppress(TimeoutError):
                msg = await self.sub.next_msg(timeout=1.0)
                self.seen.append(decode(Verdict, msg.data, msg.headers))
            return [(v.seq, v.state, v.reason, v.message) for v in self.seen]

        if not any(check(v) for v in self.seen):
            await until(
                f"a matching verdict on {self.subject}",
                read,
                done=lambda _: any(check(v) for v in self.seen),
                within=within,
                every=0,
            )
        return next(v for v in self.seen if check(v))

    async def count(self) -> int:
        """How many verdicts the stream holds for this AppWrapper."""
        info = await self.nc.jetstream().stream_info(VERDICTS, subjects_filter=self.subject)
        return int((info.state.subjects or {}).get(self.subject, 0))


@pytest_asyncio.fixture
async def nc(stack: Stack) -> AsyncIterator[Any]:
    conn = await nats.connect(stack.nats_url)
    yield conn
    await conn.close()


async def feed(nc: Any, namespace: str, name: str) -> VerdictFeed:
    f = VerdictFeed(nc, namespace, name)
    await f.start()
    return f


Submit = Callable[..., Awaitable[VerdictFeed]]


@pytest.fixture
def submit(stack: Stack, nc: Any, namespace: str) -> Submit:
    """``submit(name, workload, **clocks)``: follow the AppWrapper's verdicts, then submit it around
    ``workload`` with the fault-tolerance parameters ``clocks`` (``manifests.fault_tolerance``)."""

    async def follow_and_apply(name: str, workload: dict[str, Any], **clocks: Any) -> VerdictFeed:
        verdicts = await feed(nc, namespace, name)
        apply(stack.kubeconfig, namespace, appwrapper(name, workload, **manifests.fault_tolerance(**clocks)))
        return verdicts

    return follow_and_apply


def unhealthy(reason: str) -> Callable[[Verdict], bool]:
    return lambda v: v.state == "Unhealthy" and v.reason == reason


def healthy(reason: str = "") -> Callable[[Verdict], bool]:
    return lambda v: v.state == "Healthy" and v.reason == reason


# ---------------------------------------------------------------------------------- faults


async def test_failed_pod_is_healthy_during_the_failure_grace_period_then_unhealthy(
    stack: Stack, namespace: str, submit: Submit
) -> None:
    kc = stack.kubeconfig
    verdicts = await submit(
        "fp", pod("fp-0", annotations={sim.FAIL_AFTER: "1s"}), failure_grace="3s", retry_limit=0
    )
    grace = await verdicts.wait(healthy(Reason.FOUND_FAILED_PODS))
    # Read while the grace period runs: once Failed, lifecycle deletes the pod.
    node = get(kc, namespace, "pod", "fp-0")["spec"]["nodeName"]
    final = await verdicts.wait(unhealthy(Reason.FOUND_FAILED_PODS))

    # Inside the grace period: Healthy, naming the condition and when it turns Unhealthy.
    assert grace.first_unhealthy_at is not None and grace.deadline is not None
    assert grace.deadline - grace.first_unhealthy_at == timedelta(seconds=3)
    assert grace.decided_at < grace.deadline
    # After it: Unhealthy with the same clock, retryable (exit code 1 is not terminal).
    assert final.first_unhealthy_at == grace.first_unhealthy_at and final.deadline == grace.deadline
    assert final.decided_at >= final.deadline
    assert final.terminal is False and final.counts_toward_retry is True
    # Its only pod failed with an error of its own: the application's fault, no node blamed.
    assert (final.failure_class, final.failure_code, final.fault_kind) == (
        "Unknown",
        "ExitCode:1",
        "Application",
    )
    assert final.nodes == () and node
    assert "fp-0" in final.message
    assert final.seq > grace.seq and final.attempt_started_at == grace.attempt_started_at
    assert final.ref.uid == get(kc, namespace, "appwrapper", "fp")["metadata"]["uid"]


def stuck_in_init(kubeconfig: Path, namespace: str, name: str) -> bool:
    pods = get(kubeconfig, namespace, "pods", "--field-selector", f"metadata.name={name}")["items"]
    if not pods:
        return False
    status = pods[0].get("status", {})
    init = status.get("initContainerStatuses") or [{}]
    return bool(
        status.get("phase") == "Pending"
        and pods[0]["spec"].get("nodeName")
        and "running" in init[0].get("state", {})
    )


def unschedulable(kubeconfig: Path, namespace: str, name: str) -> bool:
    pods = get(kubeconfig, namespace, "pods", "--field-selector", f"metadata.name={name}")["items"]
    conditions = pods[0].get("status", {}).get("conditions") or [] if pods else []
    return any(
        c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
        for c in conditions
    )


def quota_refused(kubeconfig: Path, namespace: str) -> bool:
    events = get(kubeconfig, namespace, "events", "--field-selector", "reason=FailedCreate")["items"]
    return any("exceeded quota" in e.get("message", "") for e in events)


async def test_pod_stuck_in_init_is_unhealthy_after_warmup(
    stack: Stack, namespace: str, submit: Submit
) -> None:
    kc = stack.kubeconfig
    verdicts = await submit(
        "si",
        pod("si-0", annotations={sim.STUCK_INIT: "true"}, init_container=True),
        admission_grace="1s",
        warmup_grace="2s",
        failure_grace="3s",
        retry_limit=0,
    )
    # The pod exists, scheduled but stuck in its init container (read before the verdict: once
    # the AppWrapper fails, lifecycle deletes it).
    await until("pod si-0 scheduled and stuck in init", lambda: stuck_in_init(kc, namespace, "si-0"))
    final = await verdicts.wait(unhealthy(Reason.INSUFFICIENT_PODS_READY))

    # All expected pods exist, so the warmup period applies, then the failure grace period.
    assert final.attempt_started_at is not None
    assert final.first_unhealthy_at == final.attempt_started_at + timedelta(seconds=2)
    assert final.deadline == final.attempt_started_at + timedelta(seconds=5)
    assert "1 pods pending; 0 pods running" in final.message and "warmup" in final.message
    assert final.terminal is False


async def test_pod_never_scheduled_is_unhealthy_after_warmup(
    stack: Stack, namespace: str, submit: Submit
) -> None:
    kc = stack.kubeconfig
    unschedulable_pod = pod("ns-0", gpus=9)  # every node has 8
    # The admission grace is long enough that a pod created late on a loaded machine is still
    # seen before it ends: the verdict must come from the warmup rule, not from admission.
    verdicts = await submit(
        "ns", unschedulable_pod, admission_grace="20s", warmup_grace="2s", failure_grace="2s", retry_limit=0
    )
    await until("pod ns-0 reported Unschedulable", lambda: unschedulable(kc, namespace, "ns-0"))
    final = await verdicts.wait(unhealthy(Reason.INSUFFICIENT_PODS_READY))

    # An unscheduled pod exists (Pending), as upstream counts it: the warmup period applies.
    assert final.attempt_started_at is not None
    assert final.deadline == final.attempt_started_at + timedelta(seconds=4)
    assert "1 pods pending; 0 pods running; 0 pods succeeded" in final.message
    assert final.terminal is False


async def test_pods_that_cannot_be_created_are_unhealthy_after_admission(
    stack: Stack, namespace: str, submit: Submit
) -> None:
    kc = stack.kubeconfig
    # The namespace admits one pod: the Job's second pod is refused by the quota, never created.
    apply(
        kc,
        namespace,
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "one-pod"},
            "spec": {"hard": {"pods": "1"}},
        },
    )
    # Until the quota controller has computed its usage, admission refuses every pod.
    await until(
        "the quota's usage computed",
        lambda: "used" in get(kc, namespace, "resourcequota", "one-pod")["status"],
    )
    verdicts = await submit(
        "adm",
        job("adm-job", parallelism=2),
        admission_grace="1s",
        warmup_grace="1m",
        failure_grace="3s",
        retry_limit=0,
    )
    # One pod of two is created, the other refused (checked before the AppWrapper fails and
    # lifecycle deletes its resources).
    await until("one pod created", lambda: len(get(kc, namespace, "pods")["items"]) == 1)
    await until("the second pod refused by the quota", lambda: quota_refused(kc, namespace))
    grace = await verdicts.wait(healthy(Reason.INSUFFICIENT_PODS_READY))
    final = await verdicts.wait(unhealthy(Reason.INSUFFICIENT_PODS_READY))

    # Not every expected pod exists: the admission period applies (not the one-minute warmup).
    assert final.attempt_started_at is not None
    assert (
        final.first_unhealthy_at
        == grace.first_unhealthy_at
        == final.attempt_started_at + timedelta(seconds=1)
    )
    assert final.deadline == grace.deadline == final.attempt_started_at + timedelta(seconds=4)
    assert "expected 2" in final.message and "admission" in final.message


async def test_failed_job_is_unhealthy_at_once(stack: Stack, namespace: str, submit: Submit) -> None:
    # The failed pod alone would wait a minute; the Job's Failed condition does not wait.
    failing = job("fj-job", annotations={sim.FAIL_AFTER: "1s"})
    verdicts = await submit("fj", failing, failure_grace="1m", retry_limit=0)
    final = await verdicts.wait(unhealthy(Reason.FAILED_COMPONENT))

    # The reason the Job controller gave (backoffLimit 0, one failed pod) is passed on.
    assert "Job/fj-job" in final.message and "BackoffLimitExceeded" in final.message
    assert final.terminal is False
    assert final.first_unhealthy_at is not None and final.decided_at - final.first_unhealthy_at < timedelta(
        seconds=30
    )


async def test_externally_deleted_component_is_unhealthy_and_terminal(
    stack: Stack, namespace: str, submit: Submit
) -> None:
    kc = stack.kubeconfig
    verdicts = await submit("dc", job("dc-job"), retry_limit=3)
    (pod,) = await pod_names(kc, namespace)
    await until(
        "the Job's pod Running", lambda: get(kc, namespace, "pod", pod)["status"].get("phase") == "Running"
    )
    await verdicts.wait(healthy())

    sim.delete_component(kc, namespace, "job", "dc-job")
    final = await verdicts.wait(unhealthy(Reason.MISSING_COMPONENT))

    assert "Job/dc-job" in final.message
    # Terminal although retries remain: upstream fails a workload whose resources were removed.
    assert final.terminal is True


async def test_terminal_exit_code_makes_the_failure_terminal(
    stack: Stack, namespace: str, submit: Submit
) -> None:
    kc = stack.kubeconfig
    verdicts = await submit(
        "te",
        pod("te-0", annotations={sim.FAIL_AFTER: "1s", sim.EXIT_CODE: "42"}),
        terminal_exit_codes="3,42",
        failure_grace="1s",
        retry_limit=3,
    )
    final = await verdicts.wait(unhealthy(Reason.FOUND_FAILED_PODS))

    assert final.terminal is True
    assert (final.failure_class, final.failure_code) == ("Permanent", "ExitCode:42")
    assert "Permanent (ExitCode:42)" in final.message and "te-0" in final.message
    # Lifecycle acts on it: Failed without using any of the three retries.
    aw = await wait_phase(kc, namespace, "te", "Failed")
    assert read_appwrapper(aw).resetting_count == 0


async def test_idle_healthy_appwrapper_produces_no_verdict_churn(
    stack: Stack, nc: Any, namespace: str, submit: Submit
) -> None:
    kc = stack.kubeconfig
    verdicts = await submit("idle", pod("idle-0"))
    first = await verdicts.wait(lambda v: True)
    assert first.state == "Healthy" and first.reason == "" and first.seq == 1
    await until(
        "pod idle-0 Running", lambda: get(kc, namespace, "pod", "idle-0")["status"].get("phase") == "Running"
    )
    assert await verdicts.count() == 1

    # Status updates that change observations but not health: container restarts and readiness
    # flips on the pod, a label on its node.
    idle = get(kc, namespace, "pod", "idle-0")
    sim.label_node(kc, idle["spec"]["nodeName"], "respawn.dev/churn-test", namespace)
    try:
        statuses = idle["status"]["containerStatuses"]
        for restarts in (1, 2, 3):
            for cs in statuses:
                cs["restartCount"], cs["ready"] = restarts, restarts % 2 == 0
            kubectl(
                kc,
                "patch",
                "pod",
                "idle-0",
                "-n",
                namespace,
                "--subresource=status",
                "--type=merge",
                "-p",
                json.dumps({"status": {"containerStatuses": statuses}}),
            )
    finally:
        sim.label_node(kc, idle["spec"]["nodeName"], "respawn.dev/churn-test", None)

    # Wait until health has taken in the last of those updates (acknowledged it), then for a
    # quiet second in which it evaluates them, checking all the while that nothing was published.
    js = nc.jetstream()
    obs_subject = subjects.appwrapper_obs(namespace, "idle", "pod", "idle-0")
    async with Observer(stack.nats_url) as obs:
        await obs.wait_last(
            OBSERVATIONS,
            obs_subject,
            PodObservation,
            lambda m: [c.restart_count for c in m.containers] == [3],
        )
    last_seq = (await js.get_last_msg(OBSERVATIONS, obs_subject)).seq

    async def taken_in() -> bool:
        assert await verdicts.count() == 1, "a verdict was published for an unchanged state"
        # health-<instance>-<run>-p<partition>: one per partition it owns, unique per run, so it
        # is found by its prefix and its partition's filter.
        consumers = await js.consumers_info(OBSERVATIONS)
        part = subjects.appwrapper_obs_partition_filter(subjects.partition(namespace, "idle"))
        ours = [
            c
            for c in consumers
            if c.name.startswith(f"health-{stack.health_instance}") and c.config.filter_subject == part
        ]
        assert len(ours) == 1, f"expected one consumer of idle's partition for this health instance: {ours}"
        return bool(ours[0].ack_floor.stream_seq >= last_seq)

    await until("health to take in the pod updates", taken_in, within=20, every=0.1)
    await holds("no verdict for an unchanged state", verdicts.count, done=lambda n: n == 1, during=1.0)

    # A real change, made after those updates, is the very next verdict: health is alive and
    # nothing was published in between.
    sim.fail_pod(kc, namespace, "idle-0", exit_code=7)
    change = await verdicts.wait(healthy(Reason.FOUND_FAILED_PODS))
    assert [v.seq for v in verdicts.seen] == [1, 2] and change.seq == 2
    assert await verdicts.count() == 2


async def test_malformed_annotation_is_reported_and_the_default_is_used(
    stack: Stack, namespace: str, submit: Submit
) -> None:
    verdicts = await submit("bad", pod("bad-0", annotations={sim.FAIL_AFTER: "1s"}), failure_grace="abc")
    first = await verdicts.wait(lambda v: True)
    grace = await verdicts.wait(healthy(Reason.FOUND_FAILED_PODS))

    for verdict in (first, grace):
        assert any(FAILURE_GRACE_PERIOD_ANNOTATION in w and "'abc'" in w for w in verdict.warnings), verdict
    # The operator default (1m) is the failure grace period in force.
    assert grace.first_unhealthy_at is not None and grace.deadline is not None
    assert grace.deadline - grace.first_unhealthy_at == DEFAULT_FAILURE_GRACE


async def test_a_grace_period_survives_a_restart_of_health(
    stack: Stack, namespace: str, submit: Submit
) -> None:
    verdicts = await submit(
        "rs", pod("rs-0", annotations={sim.FAIL_AFTER: "1s"}), failure_grace="6s", retry_limit=0
    )
    grace = await verdicts.wait(healthy(Reason.FOUND_FAILED_PODS))
    assert grace.deadline is not None
    # Killed inside the grace period; its replacement rebuilds the state from the streams.
    stack.health.kill()
    stack.service("health", instance="2", env={"RESPAWN_INSTANCE": f"{uuid.uuid4().hex[:8]}-2"})
    assert datetime.now(UTC) < grace.deadline, "the restart took longer than the grace period"
    final = await verdicts.wait(unhealthy(Reason.FOUND_FAILED_PODS))

    # The deadline computed before the restart holds after it (it comes from the pod, not a timer).
    assert final.deadline == grace.deadline and final.first_unhealthy_at == grace.first_unhealthy_at
    assert final.decided_at >= grace.deadline
    # Nothing was repeated: one verdict per change, seq continuing across the restart.
    assert [v.seq for v in verdicts.seen] == list(range(1, len(verdicts.seen) + 1))
    assert [v.reason for v in verdicts.seen if v.state == "Healthy" and v.reason] == [
        Reason.FOUND_FAILED_PODS
    ]
    assert await verdicts.count() == len(verdicts.seen)
