"""Failure classes end to end on the testbed: watcher, health and lifecycle as separate processes.

A pod is failed the way Kubernetes records each kind of failure (a status patch through the
API, as the kubelet or the eviction machinery writes it); health classifies it, and lifecycle
spends the retry budget its class says (docs/failures.md): a Transient failure is retried
without counting toward retryLimit, an Unknown one is counted, a Permanent one fails at once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from respawn.testbed import manifests, sim
from respawn.testbed.modes import Endpoints
from shared import subjects
from shared.appwrapper.model import read_appwrapper
from shared.failures.annotation import FAILURE_PATTERNS_ANNOTATION
from shared.messages import LifecycleEvent, Verdict
from tests.integration.conftest import services_on
from tests.integration.objects import (
    FAST_RESET,
    apply,
    events_when,
    get_appwrapper,
    has_event,
    jobs,
    running_pods,
    wait_phase,
)
from tests.integration.observe import Observer
from tests.waiting import until

pytestmark = pytest.mark.testbed


@pytest.fixture(scope="module")
def services(
    testbed: Endpoints, appwrapper_crd: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """watcher, health and lifecycle, each its own process, shared by this module's tests."""
    logs = tmp_path_factory.mktemp("failure-classes") / "logs"
    with services_on(testbed.kubeconfig, testbed.nats_url, logs) as start:
        for name in ("watcher", "health", "lifecycle"):
            start(name)
        yield


def submit(kubeconfig: Path, namespace: str, name: str, annotations: Mapping[str, str] = {}) -> None:
    aw = manifests.job_appwrapper(name, annotations={**FAST_RESET, **annotations})
    apply(kubeconfig, namespace, aw)


def status(aw: dict[str, Any] | None) -> Mapping[str, Any]:
    found = (aw or {}).get("status")
    return found if isinstance(found, Mapping) else {}


async def unhealthy_event(kubeconfig: Path, namespace: str, name: str) -> str:
    """The message of the Unhealthy Event, which repeats the Unhealthy condition's (the condition
    itself is cleared when the reset completes)."""
    events = await events_when(
        kubeconfig, namespace, name, "Unhealthy", lambda es: any(e["reason"] == "Unhealthy" for e in es)
    )
    [message] = [e["message"] for e in events if e["reason"] == "Unhealthy"]
    return str(message)


async def lifecycle_events(nats_url: str, namespace: str, name: str) -> list[LifecycleEvent]:
    async with Observer(nats_url) as obs:
        return await obs.all(
            subjects.LIFECYCLE_STREAM, subjects.lifecycle_event(namespace, name), LifecycleEvent
        )


async def unhealthy_verdicts(nats_url: str, namespace: str, name: str) -> list[Verdict]:
    async with Observer(nats_url) as obs:
        found = await obs.all(subjects.VERDICTS_STREAM, subjects.verdict_filter(namespace, name), Verdict)
    return [v for v in found if v.state == "Unhealthy"]


async def first_running_pod(kubeconfig: Path, namespace: str, name: str) -> str:
    await wait_phase(kubeconfig, namespace, name, "Running")
    pods = await until("a running pod", lambda: running_pods(kubeconfig, namespace, name))
    return str(pods[0]["metadata"]["name"])


async def test_an_evicted_pod_is_retried_without_counting(
    testbed: Endpoints, namespace: str, services: None
) -> None:
    kc = testbed.kubeconfig
    submit(kc, namespace, "evicted")
    pod = await first_running_pod(kc, namespace, "evicted")
    first_job = jobs(kc, namespace)[0]["metadata"]["uid"]

    sim.evict_pod(kc, namespace, pod)
    again = await until(
        "the workload recreated after an uncounted reset",
        lambda: get_appwrapper(kc, namespace, "evicted"),
        done=lambda aw: status(aw).get("transientRetryCount") == 1 and read_appwrapper(aw).phase == "Running",
        within=40,
    )
    assert read_appwrapper(again).resetting_count == 0
    assert [j["metadata"]["uid"] for j in jobs(kc, namespace)] != [first_job]
    assert "Transient (Evicted)" in await unhealthy_event(kc, namespace, "evicted")

    [verdict] = await unhealthy_verdicts(testbed.nats_url, namespace, "evicted")
    assert (verdict.failure_class, verdict.failure_code, verdict.fault_kind) == (
        "Transient",
        "Evicted",
        "Infrastructure",
    )
    events = await lifecycle_events(testbed.nats_url, namespace, "evicted")
    [started] = [e for e in events if e.event == "ResetStarted"]
    assert (started.failure_class, started.failure_code, started.resetting_count) == (
        "Transient",
        "Evicted",
        0,
    )


async def test_an_oom_killed_pod_follows_the_default_table(
    testbed: Endpoints, namespace: str, services: None
) -> None:
    kc = testbed.kubeconfig
    submit(kc, namespace, "oom")
    pod = await first_running_pod(kc, namespace, "oom")

    sim.fail_pod(kc, namespace, pod, exit_code=137, reason="OOMKilled")
    # The default table makes OOMKilled Unknown (row 15): a counted retry.
    again = await until(
        "the workload recreated after a counted reset",
        lambda: get_appwrapper(kc, namespace, "oom"),
        done=lambda aw: read_appwrapper(aw).resetting_count == 1 and read_appwrapper(aw).phase == "Running",
        within=40,
    )
    assert status(again).get("transientRetryCount", 0) == 0
    assert "Unknown (OOMKilled)" in await unhealthy_event(kc, namespace, "oom")
    [verdict] = await unhealthy_verdicts(testbed.nats_url, namespace, "oom")
    assert (verdict.failure_class, verdict.failure_code) == ("Unknown", "OOMKilled")
    assert "by failure table row 15" in verdict.message
    events = await lifecycle_events(testbed.nats_url, namespace, "oom")
    [started] = [e for e in events if e.event == "ResetStarted"]
    assert (started.failure_class, started.failure_code, started.resetting_count) == (
        "Unknown",
        "OOMKilled",
        1,
    )


async def test_a_permanent_failure_ends_failed_at_once_without_a_reset(
    testbed: Endpoints, namespace: str, services: None
) -> None:
    kc = testbed.kubeconfig
    patterns = "version: 1\npatterns:\n  - exitCodes: [3]\n    class: Permanent\n    code: BadInput\n"
    submit(kc, namespace, "bad-input", {FAILURE_PATTERNS_ANNOTATION: patterns})
    pod = await first_running_pod(kc, namespace, "bad-input")

    sim.fail_pod(kc, namespace, pod, exit_code=3)
    failed = await wait_phase(kc, namespace, "bad-input", "Failed", within=30)
    assert read_appwrapper(failed).resetting_count == 0
    assert status(failed).get("transientRetryCount", 0) == 0
    # Failed keeps the Unhealthy condition (no reset clears it).
    assert "Permanent (BadInput)" in str(read_appwrapper(failed).condition("Unhealthy").get("message"))
    await events_when(
        kc,
        namespace,
        "bad-input",
        "Failed: permanent failure: not retried",
        has_event("Failed", "permanent failure: not retried"),
    )

    events = await lifecycle_events(testbed.nats_url, namespace, "bad-input")
    assert [e for e in events if e.event == "ResetStarted"] == []
    [ended] = [e for e in events if e.event == "PhaseChanged" and e.phase == "Failed"]
    assert (ended.failure_class, ended.failure_code) == ("Permanent", "BadInput")
