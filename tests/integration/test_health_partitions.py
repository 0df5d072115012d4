"""Health replicas share the AppWrappers by partition: real health processes on a NATS server of
the test's own (health needs no Kubernetes), fed the observations the watcher would publish.

- Two replicas each hold only the AppWrappers of their own partitions, and together publish
  exactly one verdict per AppWrapper, the same as one replica alone; the second, taking half of
  what the first had judged, publishes none of those verdicts again.
- A replica SIGKILLed: the survivor takes its partitions once the member TTL has passed, judges
  their AppWrappers within a few seconds, and goes on with their verdicts' ``seq`` where the dead
  one left it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from respawn.testbed.nats import NatsServer
from respawn.testbed.services import ServiceProcess
from shared import subjects
from shared.bus import Bus
from shared.partitions import assign
from tests.integration.conftest import ServiceFactory, services_on
from tests.integration.healthfeed import (
    MEMBERSHIP,
    fail,
    healthy,
    judged,
    metric,
    owned,
    shape,
    verdicts,
    workloads,
)
from tests.waiting import holds, until

pytestmark = pytest.mark.nats

PARTITIONS = subjects.partitions()  # the services' default, as no configuration is given
APPWRAPPERS = 40
MEMBER_TTL = 1.0


@pytest.fixture
def start(own_nats: NatsServer, tmp_path: Path) -> Iterator[ServiceFactory]:
    # No Kubernetes: health is started without access to it, so the path is never read.
    with services_on(tmp_path / "no-kubeconfig", own_nats.url, tmp_path / "logs") as factory:
        yield factory


def replica(start: ServiceFactory, name: str) -> ServiceProcess:
    return start("health", instance=name, env={"RESPAWN_INSTANCE": name, **MEMBERSHIP})


def replicas(start: ServiceFactory, *names: str) -> list[ServiceProcess]:
    """Started side by side: each start waits for its process to be ready, which takes seconds."""
    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        return list(pool.map(lambda name: replica(start, name), names))


async def partition_consumers(bus: Bus) -> dict[int, list[str]]:
    """The replicas (by instance) with a consumer of each partition's observations; and
    ``-1: [...]`` for health consumers of the verdicts, which only live while a partition loads."""
    found: dict[int, list[str]] = {}
    for stream in (subjects.OBSERVATIONS_STREAM, subjects.VERDICTS_STREAM):
        for info in await bus.js.consumers_info(stream):
            if not info.name.startswith("health-"):
                continue
            member = info.name.split("-")[1]  # health-<instance>-<run>-p<partition>[-verdicts]
            part = int(info.config.filter_subject.rsplit(".", 1)[1])
            found.setdefault(part if stream == subjects.OBSERVATIONS_STREAM else -1, []).append(member)
    return {p: sorted(members) for p, members in found.items()}


def held(sp: ServiceProcess) -> float:
    return metric(sp, "respawn_health_appwrappers")


def folded(sp: ServiceProcess) -> float:
    return metric(sp, "respawn_health_observations_total")


# ------------------------------------------------------------------------------- tests


async def test_two_replicas_hold_half_each_and_judge_every_appwrapper_once_as_one_replica_does(
    start: ServiceFactory, own_bus: Bus
) -> None:
    a = replica(start, "a")
    await until("a alone owns every partition", lambda: owned(a), done=lambda n: n == PARTITIONS, within=10)
    alone = workloads("alone", APPWRAPPERS)
    await fail(own_bus, alone)
    await until(
        "a to judge every AppWrapper",
        lambda: verdicts(own_bus, "alone"),
        done=lambda found: judged(found) == APPWRAPPERS,
        within=10,
    )

    b = replica(start, "b")
    share = assign(PARTITIONS, ["a", "b"])
    await until(
        "a and b to own their shares",
        lambda: (owned(a), owned(b)),
        done=lambda got: got == (len(share["a"]), len(share["b"])),
        within=10,
    )
    pair = workloads("pair", APPWRAPPERS)
    await fail(own_bus, pair)
    await until(
        "a and b to judge every AppWrapper",
        lambda: verdicts(own_bus, "pair"),
        done=lambda found: judged(found) == APPWRAPPERS,
        within=10,
    )

    # One verdict per AppWrapper, Unhealthy at once, and nothing more: b took half of what a had
    # judged alone, read its verdicts first, and published none of them again.
    once = [("Unhealthy", "FoundFailedPods", 1)]

    async def both() -> tuple[dict[str, list[tuple[str, str, int]]], ...]:
        return shape(await verdicts(own_bus, "alone")), shape(await verdicts(own_bus, "pair"))

    await holds(
        "one verdict per AppWrapper, the same from one replica as from two",
        both,
        done=lambda got: got[0] == got[1] == {w.name: once for w in alone},
        during=1.0,
    )

    # Each holds the AppWrappers of its own partitions, and was delivered only their observations
    # since it owned them (a saw every observation of the first batch while it was alone).
    everything = alone + pair
    mine = {name: [w for w in everything if w.partition in share[name]] for name in ("a", "b")}
    assert 0 < len(mine["a"]) < len(everything) and len(mine["a"]) + len(mine["b"]) == len(everything)
    await until(
        "each replica to hold its own share",
        lambda: (held(a), held(b)),
        done=lambda got: got == (len(mine["a"]), len(mine["b"])),
        within=5,
    )
    # At least its share, and less than everything: JetStream delivers at least once, so a
    # message whose ack was late under load may be folded twice (harmless: the verdicts above
    # are still one per AppWrapper), but a replica is never delivered the other's partitions.
    a_pair = [w for w in pair if w.partition in share["a"]]
    assert 2 * len(mine["b"]) <= folded(b) < 2 * len(everything)
    assert 2 * len(alone) + 2 * len(a_pair) <= folded(a) < 2 * len(everything)


async def test_a_killed_replicas_partitions_are_judged_by_the_survivor_within_the_member_ttl(
    start: ServiceFactory, own_bus: Bus
) -> None:
    a, b = replicas(start, "a", "b")
    share = assign(PARTITIONS, ["a", "b"])
    await until(
        "a and b to own their shares",
        lambda: (owned(a), owned(b)),
        done=lambda got: got == (len(share["a"]), len(share["b"])),
        within=10,
    )
    # One consumer per partition, its owner's; nothing left of a partition a replica took and
    # let go of while the two learned of each other (a consumer created as its load was cancelled).
    expected = {p: [member] for member, parts in share.items() for p in parts}
    await until(
        "one observation consumer per partition, its owner's, and no other",
        lambda: partition_consumers(own_bus),
        done=lambda got: got == expected,
        within=10,
    )
    # Running and healthy, each judged once by b.
    victims = [w for w in workloads("victims", 4 * APPWRAPPERS) if w.partition in share["b"]][:20]
    await healthy(own_bus, "victims", victims, within=10)
    # b counts a verdict once its publication is acknowledged, a moment after it is stored.
    await until(
        "b to count each of those verdicts once",
        lambda: metric(b, "respawn_health_verdicts_total", state="Healthy", reason="-", failure_class="-"),
        done=lambda counted: counted == len(victims),
        within=5,
    )
    assert held(a) == 0

    b.kill()
    killed = time.monotonic()
    for w in victims:
        await w.publish_pod(own_bus, failed=True)
    await until(
        "a to judge the failed pods of b's AppWrappers",
        lambda: verdicts(own_bus, "victims"),
        done=lambda found: judged(found) == len(victims),
        within=MEMBER_TTL + 10,
        every=0.1,
    )
    took = time.monotonic() - killed
    assert took < MEMBER_TTL + 3.0, f"judged {took:.1f}s after the kill"
    assert owned(a) == PARTITIONS
    # a went on from b's last verdict (seq 2): it read b's verdicts before judging, so the healthy
    # one was not published again.
    found = shape(await verdicts(own_bus, "victims"))
    assert found == {w.name: [("Healthy", "", 1), ("Unhealthy", "FoundFailedPods", 2)] for w in victims}
    assert held(a) == len(victims)
