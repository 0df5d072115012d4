"""Attempt identity, stopping a workload and per-pod-set completion policies, end to end.

watcher, health and lifecycle run as separate processes on the testbed; each test submits
AppWrappers to a fresh namespace and follows them through the real API server.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from respawn.testbed import manifests, sim
from respawn.testbed.cluster import kubectl
from respawn.testbed.modes import Endpoints
from respawn.testbed.services import ServiceProcess
from shared.appwrapper.model import read_appwrapper
from tests.integration.conftest import ServiceFactory, services_on
from tests.integration.objects import (
    FAST_RESET,
    apply,
    events_of,
    events_when,
    get_appwrapper,
    has_event,
    jobs,
    labelled_pods,
    running_pods,
    wait_phase,
)
from tests.waiting import until

pytestmark = pytest.mark.testbed


@pytest.fixture(scope="module")
def observers(
    testbed: Endpoints, appwrapper_crd: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """watcher and health, shared by this module's tests; each test starts its own lifecycle."""
    with services_on(
        testbed.kubeconfig, testbed.nats_url, tmp_path_factory.mktemp("observers") / "logs"
    ) as start:
        start("watcher")
        start("health")
        yield


@pytest.fixture
def lifecycle(observers: None, service: ServiceFactory) -> ServiceProcess:
    return service("lifecycle")


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    container = pod["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


async def test_the_pods_of_the_second_attempt_carry_attempt_2(
    testbed: Endpoints, namespace: str, lifecycle: ServiceProcess
) -> None:
    kc = testbed.kubeconfig
    annotations = {**FAST_RESET, **manifests.fault_tolerance(retry_pause="1s")}
    apply(kc, namespace, manifests.job_appwrapper("again", annotations=annotations))
    first = await until("a running pod", lambda: running_pods(kc, namespace, "again"))
    uid = get_appwrapper(kc, namespace, "again")["metadata"]["uid"]  # type: ignore[index]
    assert first[0]["metadata"]["labels"]["respawn.dev/attempt"] == "1"
    assert env_of(first[0])["RESPAWN_ATTEMPT"] == "1"
    assert env_of(first[0])["RESPAWN_ATTEMPT_ID"] == f"{uid}-1"

    sim.fail_pod(kc, namespace, first[0]["metadata"]["name"], exit_code=1)
    second = await until(
        "a running pod of the next attempt",
        lambda: [
            p
            for p in running_pods(kc, namespace, "again")
            if p["metadata"]["name"] != first[0]["metadata"]["name"]
        ],
        within=40,
    )
    pod = second[0]
    assert pod["metadata"]["labels"]["respawn.dev/attempt"] == "2"
    assert pod["metadata"]["labels"]["respawn.dev/pod-set"] == "0"
    assert env_of(pod)["RESPAWN_ATTEMPT"] == "2"
    assert env_of(pod)["RESPAWN_ATTEMPT_ID"] == f"{uid}-2"
    aw = get_appwrapper(kc, namespace, "again")
    assert aw is not None and aw["status"]["attempt"] == 2
    assert read_appwrapper(aw).resetting_count == 1


async def test_the_stop_annotation_deletes_everything_and_ends_failed_stopped_without_retry(
    testbed: Endpoints, namespace: str, lifecycle: ServiceProcess
) -> None:
    kc = testbed.kubeconfig
    apply(kc, namespace, manifests.job_appwrapper("halt", pods=2, annotations=FAST_RESET))
    await until("two running pods", lambda: running_pods(kc, namespace, "halt"), done=lambda p: len(p) == 2)

    kubectl(kc, "annotate", "appwrapper", "halt", "-n", namespace, "respawn.dev/stop=true")
    failed = await wait_phase(kc, namespace, "halt", "Failed", within=30)
    assert read_appwrapper(failed).resetting_count == 0
    final = await until(
        "resources and quota released",
        lambda: get_appwrapper(kc, namespace, "halt"),
        done=lambda aw: read_appwrapper(aw).condition("QuotaReserved").get("status") == "False",
        within=30,
    )
    assert read_appwrapper(final).condition("ResourcesDeployed")["status"] == "False"
    assert read_appwrapper(final).phase == "Failed"
    assert jobs(kc, namespace) == []
    assert labelled_pods(kc, namespace, "halt") == []
    await events_when(
        kc,
        namespace,
        "halt",
        "Failed: respawn.dev/stop=true",
        has_event("Failed", "respawn.dev/stop=true"),
    )
    # Nothing retried: no reset was ever started.
    assert "Resetting" not in {e["reason"] for e in events_of(kc, namespace, "halt")}


async def test_a_launcher_plus_servers_workload_succeeds_when_the_launcher_succeeds(
    testbed: Endpoints, namespace: str, lifecycle: ServiceProcess
) -> None:
    kc = testbed.kubeconfig
    launcher = manifests.job(
        "launcher",
        pods=1,
        backoffLimit=0,
        template=manifests.pod_template(annotations={sim.SUCCEED_AFTER: "3s"}),
    )
    # The servers run until someone stops them.
    servers = manifests.job("servers", pods=2, backoffLimit=0, template=manifests.pod_template())
    annotations = {**FAST_RESET, "respawn.dev/completion-policy": '{"0": {"minSucceeded": 1}}'}
    aw = manifests.appwrapper(
        "serve", manifests.component(launcher), manifests.component(servers), annotations=annotations
    )
    apply(kc, namespace, aw)
    running = await until(
        "the launcher and two servers running",
        lambda: running_pods(kc, namespace, "serve"),
        done=lambda p: len(p) == 3,
    )
    sets = sorted(p["metadata"]["labels"]["respawn.dev/pod-set"] for p in running)
    assert sets == ["0", "1", "1"]

    done = await wait_phase(kc, namespace, "serve", "Succeeded", within=40)
    assert read_appwrapper(done).resetting_count == 0
    # The servers are not left running: everything is deleted, as after a success's time to live.
    final = await until(
        "the servers deleted",
        lambda: get_appwrapper(kc, namespace, "serve"),
        done=lambda aw: read_appwrapper(aw).condition("ResourcesDeployed").get("status") == "False",
        within=40,
    )
    assert read_appwrapper(final).phase == "Succeeded"
    assert jobs(kc, namespace) == []
    assert labelled_pods(kc, namespace, "serve") == []
