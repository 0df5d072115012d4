"""A failed pod its controller deletes at once is still judged: a real health process on a NATS
server of the test's own, fed what the watcher publishes when, say, KubeRay replaces a failed Ray
worker within milliseconds: the pod Failed, then its tombstone, back to back. Both are folded in
before health's next evaluation, which must still find the failure."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from respawn.testbed.nats import NatsServer
from respawn.testbed.services import ServiceProcess
from shared import subjects
from shared.bus import Bus
from tests.integration.conftest import services_on
from tests.integration.healthfeed import MEMBERSHIP, Workload, healthy, owned, shape, verdicts, workloads
from tests.waiting import holds, until

pytestmark = pytest.mark.nats

APPWRAPPERS = 40


@pytest.fixture
def health(own_nats: NatsServer, tmp_path: Path) -> Iterator[ServiceProcess]:
    # No Kubernetes: health is started without access to it, so the path is never read.
    with services_on(tmp_path / "no-kubeconfig", own_nats.url, tmp_path / "logs") as start:
        yield start("health", env=MEMBERSHIP)


async def test_a_failed_pod_deleted_right_after_its_failure_still_resets_its_appwrapper(
    health: ServiceProcess, own_bus: Bus
) -> None:
    await until(
        "health to own every partition",
        lambda: owned(health),
        done=lambda n: n == subjects.partitions(),
        within=30,
    )
    batch = workloads("departed", APPWRAPPERS)
    await healthy(own_bus, "departed", batch, within=30)

    async def fail_and_delete(w: Workload) -> None:
        await w.publish_pod(own_bus, failed=True)
        await w.publish_pod(own_bus, failed=True, deleted=True)

    # Health stalls (as a replica starved of CPU does) while the pairs are stored, so that it
    # takes each pair in together once it runs again.
    os.kill(health.pid, signal.SIGSTOP)
    try:
        await asyncio.gather(*(fail_and_delete(w) for w in batch))
    finally:
        os.kill(health.pid, signal.SIGCONT)
    expected = {w.name: [("Healthy", "", 1), ("Unhealthy", "FoundFailedPods", 2)] for w in batch}

    async def seen() -> dict[str, list[tuple[str, str, int]]]:
        return shape(await verdicts(own_bus, "departed"))

    await until(
        "every AppWrapper to be judged unhealthy for its failed pod",
        seen,
        done=lambda got: got == expected,
        within=30,
    )
    await holds(
        "one Unhealthy verdict each, and nothing more", seen, done=lambda got: got == expected, during=1.0
    )
