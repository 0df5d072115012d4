"""Two replicas of every service share the work: each does part of it, none all of it, and the
workloads end exactly as with one replica. Then the replica that owns a failing workload is
SIGKILLed, one service after another, and the fault is still handled (docs/scaling.md)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from respawn.testbed import manifests, sim
from respawn.testbed.modes import Endpoints
from respawn.testbed.services import ServiceProcess
from shared import subjects
from shared.appwrapper.model import read_appwrapper
from shared.partitions import assign, partition_of
from tests.integration.chaos import items
from tests.integration.conftest import ServiceFactory, services_on
from tests.integration.objects import FAST_RESET, apply
from tests.waiting import until_sync

pytestmark = pytest.mark.testbed

SERVICES = ("watcher", "health", "lifecycle", "autopilot")
WORKLOADS = 12
# Fast membership, so that a killed replica's share moves within a second or two.
ENV = {
    "RESPAWN_SCALING_HEARTBEAT": "200ms",
    "RESPAWN_SCALING_MEMBER_TTL": "1s",
    "RESPAWN_LIFECYCLE_RESYNC_PERIOD": "2s",
}


class Replicas:
    def __init__(self, start: ServiceFactory) -> None:
        self.start_service = start
        self.procs: dict[str, ServiceProcess] = {}

    def start(self, name: str) -> None:
        service, index = name.rsplit("-", 1)
        self.procs[name] = self.start_service(service, instance=index, env={**ENV, "RESPAWN_INSTANCE": name})

    def metric(self, name: str, metric: str) -> float:
        """The sum of ``metric``'s samples (every label set) on replica ``name``."""
        total = 0.0
        for line in self.procs[name].metrics().splitlines():
            match = re.match(rf"^{metric}(\{{[^}}]*\}})? ([0-9.e+-]+)$", line)
            if match:
                total += float(match.group(2))
        return total


@pytest.fixture
def replicas(testbed: Endpoints, appwrapper_crd: Path, tmp_path: Path) -> Iterator[Replicas]:
    with services_on(testbed.kubeconfig, testbed.nats_url, tmp_path / "logs") as start:
        fleet = Replicas(start)
        for service in SERVICES:
            for i in range(2):
                fleet.start(f"{service}-{i}")
        yield fleet


def owner(service: str, namespace: str, name: str) -> str:
    part = partition_of(namespace, name, subjects.partitions())
    shares = assign(subjects.partitions(), [f"{service}-0", f"{service}-1"])
    return next(member for member, share in shares.items() if part in share)


def resets(kubeconfig: Path, namespace: str) -> dict[str, tuple[str, int]]:
    return {
        aw["metadata"]["name"]: (read_appwrapper(aw).phase, read_appwrapper(aw).resetting_count)
        for aw in items(kubeconfig, "appwrappers", namespace)
    }


def running_pod(kubeconfig: Path, namespace: str, name: str) -> str | None:
    for pod in items(kubeconfig, "pods", namespace):
        labels = pod["metadata"].get("labels") or {}
        if (
            labels.get("workload.codeflare.dev/appwrapper") == name
            and (pod.get("status") or {}).get("phase") == "Running"
            and not pod["metadata"].get("deletionTimestamp")
        ):
            return str(pod["metadata"]["name"])
    return None


def settle(kubeconfig: Path, namespace: str, expected: dict[str, int]) -> None:
    until_sync(
        f"every workload Running with its faults counted: {expected}",
        lambda: resets(kubeconfig, namespace),
        done=lambda found: found == {n: ("Running", r) for n, r in expected.items()},
        within=90,
        every=0.5,
    )


def fail_one_pod(kubeconfig: Path, namespace: str, name: str) -> None:
    pod = until_sync(f"a Running pod of {name}", lambda: running_pod(kubeconfig, namespace, name), within=60)
    sim.fail_pod(kubeconfig, namespace, pod, exit_code=1)


def test_two_replicas_of_each_service_share_the_work_and_lose_nothing_when_one_dies(
    testbed: Endpoints, namespace: str, replicas: Replicas
) -> None:
    kube = testbed.kubeconfig
    names = [f"s{i:02d}" for i in range(WORKLOADS)]
    for name in names:
        apply(kube, namespace, manifests.job_appwrapper(name, pods=2, annotations={**FAST_RESET}))
    settle(kube, namespace, dict.fromkeys(names, 0))

    # One fault in every workload: every one reset once, as with one replica of each service.
    for name in names:
        fail_one_pod(kube, namespace, name)
    settle(kube, namespace, dict.fromkeys(names, 1))

    # Each replica did part of the work and none all of it.
    published = [
        replicas.metric(f"watcher-{i}", "respawn_watcher_observations_published_total") for i in (0, 1)
    ]
    held = [replicas.metric(f"health-{i}", "respawn_health_appwrappers") for i in (0, 1)]
    reset = [replicas.metric(f"lifecycle-{i}", "respawn_lifecycle_resets_total") for i in (0, 1)]
    active = [replicas.metric(f"autopilot-{i}", "respawn_partitions_owned") for i in (0, 1)]
    assert all(n > 0 for n in published), published
    # The gauge counts every AppWrapper a replica holds, also those earlier tests of the session
    # left in other namespaces: so each holds some, and together at least this test's.
    assert all(n > 0 for n in held) and sum(held) >= WORKLOADS, held
    assert all(0 < n < WORKLOADS for n in reset) and sum(reset) == WORKLOADS, reset
    assert sorted(active) == [0, 1], active
    for service in ("watcher", "health", "lifecycle"):
        owned = [replicas.metric(f"{service}-{i}", "respawn_partitions_owned") for i in (0, 1)]
        assert sorted(owned) == [subjects.partitions() // 2] * 2, (service, owned)

    # Kill the replica that owns a workload while that workload fails, one service at a time.
    expected = dict.fromkeys(names, 1)
    for n, service in enumerate(("watcher", "health", "lifecycle")):
        name = names[n]
        victim = owner(service, namespace, name)
        replicas.procs.pop(victim).kill()
        fail_one_pod(kube, namespace, name)
        expected[name] = 2
        settle(kube, namespace, expected)
        replicas.start(victim)
