"""autopilot, as a separate process on the testbed: node health labels → node verdicts on NATS.

The watcher turns the kwok nodes into observations; autopilot turns their health labels into the
complete unhealthy-node sets per resource. Nodes are cluster-wide and the testbed is shared, so
these tests only assert on the node they label, and always remove the label afterwards.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from respawn.testbed import sim
from respawn.testbed.modes import Endpoints
from respawn.testbed.nats import NatsServer
from respawn.testbed.services import ServiceProcess
from shared import subjects
from shared.messages import NodeObservation, NodeVerdict
from tests.integration.conftest import ServiceFactory, services_on
from tests.integration.observe import Observer
from tests.waiting import until

pytestmark = pytest.mark.testbed

GPU = "nvidia.com/gpu"
HEALTH = "autopilot.ibm.com/gpuhealth"
VERDICT = subjects.node_verdict(GPU)
NODE_VERDICTS = subjects.NODE_VERDICTS_STREAM
OBS = subjects.OBSERVATIONS_STREAM

# The default taints plus ERR, which upstream's documentation uses and its code default does not.
WITH_ERR = {
    "RESPAWN_AUTOPILOT_RESOURCE_TAINTS": json.dumps(
        {
            GPU: [
                {"key": HEALTH, "value": "WARN", "effect": "PreferNoSchedule"},
                {"key": HEALTH, "value": "TESTING", "effect": "NoSchedule"},
                {"key": HEALTH, "value": "ERR", "effect": "NoSchedule"},
                {"key": HEALTH, "value": "EVICT", "effect": "NoExecute"},
            ]
        }
    )
}


def effect_of(verdict: NodeVerdict, node: str) -> str | None:
    """The set ``node`` is in, checking that it is in at most one."""
    found = [
        effect
        for effect, nodes in (
            ("NoExecute", verdict.no_execute),
            ("NoSchedule", verdict.no_schedule),
            ("PreferNoSchedule", verdict.prefer_no_schedule),
        )
        if node in nodes
    ]
    assert len(found) <= 1, f"{node} is in several sets of {verdict!r}"
    return found[0] if found else None


def is_(node: str, effect: str | None) -> Callable[[NodeVerdict], bool]:
    return lambda v: effect_of(v, node) == effect


async def label(obs: Observer, kubeconfig: Path, node: str, value: str | None) -> None:
    """Set (None: remove) the health label and wait until the watcher has published the node with it."""
    sim.label_node(kubeconfig, node, HEALTH, value)
    await obs.wait_last(
        OBS, subjects.node_obs(node), NodeObservation, lambda m: m.labels.get(HEALTH) == value
    )


@pytest.fixture
def node(testbed: Endpoints) -> Iterator[str]:
    """A kwok node for this test, healthy at the start; its health label is removed however the test ends."""
    kc = testbed.kubeconfig
    names = sorted(
        item["metadata"]["name"]
        for item in sim.get_json(kc, "nodes")["items"]
        if item["metadata"]["name"].startswith("kwok-")
    )
    assert names, "the testbed has no kwok node"
    name = names[-1]
    sim.label_node(kc, name, HEALTH, None)
    try:
        yield name
    finally:
        sim.label_node(kc, name, HEALTH, None)


def gauge(sp: ServiceProcess, effect: str) -> float:
    """The replica's count of unhealthy GPU nodes with ``effect``."""
    for family in text_string_to_metric_families(sp.metrics()):
        for sample in family.samples:
            if sample.name == "respawn_autopilot_unhealthy_nodes" and sample.labels == {
                "resource": GPU,
                "effect": effect,
            }:
                return float(sample.value)
    raise AssertionError(f"{sp.name} exports no unhealthy-node count for {GPU} {effect}")


async def test_health_labels_put_the_node_in_the_set_of_their_effect_and_removal_clears_it(
    testbed: Endpoints, appwrapper_crd: Path, node: str, service: ServiceFactory
) -> None:
    kc = testbed.kubeconfig
    service("watcher")
    service("autopilot", env=WITH_ERR)
    async with Observer(testbed.nats_url) as obs:
        # The node starts healthy (a verdict exists: autopilot states the sets once at start-up).
        await obs.wait_last(NODE_VERDICTS, VERDICT, NodeVerdict, is_(node, None))

        await label(obs, kc, node, "EVICT")
        await obs.wait_last(NODE_VERDICTS, VERDICT, NodeVerdict, is_(node, "NoExecute"))

        await label(obs, kc, node, "ERR")
        await obs.wait_last(NODE_VERDICTS, VERDICT, NodeVerdict, is_(node, "NoSchedule"))

        await label(obs, kc, node, "WARN")
        await obs.wait_last(NODE_VERDICTS, VERDICT, NodeVerdict, is_(node, "PreferNoSchedule"))

        await label(obs, kc, node, "PASS")  # a value with no entry: healthy
        await obs.wait_last(NODE_VERDICTS, VERDICT, NodeVerdict, is_(node, None))

        # The same sets as three steps ago, well within the de-duplication window: published again.
        await label(obs, kc, node, "EVICT")
        await obs.wait_last(NODE_VERDICTS, VERDICT, NodeVerdict, is_(node, "NoExecute"))

        await label(obs, kc, node, "TESTING")
        await obs.wait_last(NODE_VERDICTS, VERDICT, NodeVerdict, is_(node, "NoSchedule"))

        await label(obs, kc, node, None)
        cleared = await obs.wait_last(NODE_VERDICTS, VERDICT, NodeVerdict, is_(node, None))
        assert cleared.resource == GPU


async def test_a_restarted_autopilot_publishes_what_changed_while_it_was_down(
    testbed: Endpoints, appwrapper_crd: Path, node: str, service: ServiceFactory
) -> None:
    kc = testbed.kubeconfig
    service("watcher")
    autopilot = service("autopilot")
    async with Observer(testbed.nats_url) as obs:
        await label(obs, kc, node, "EVICT")
        await obs.wait_last(NODE_VERDICTS, VERDICT, NodeVerdict, is_(node, "NoExecute"))

        autopilot.stop()
        await label(obs, kc, node, "TESTING")  # NoSchedule in the default configuration
        stale = await obs.last(NODE_VERDICTS, VERDICT, NodeVerdict)
        assert stale is not None and effect_of(stale, node) == "NoExecute"
        autopilot = service("autopilot")
        # Ready means replayed and published, so the verdict is there without waiting.
        moved = await obs.wait_last(NODE_VERDICTS, VERDICT, NodeVerdict, lambda v: True, within=1)
        assert effect_of(moved, node) == "NoSchedule"

        autopilot.stop()
        await label(obs, kc, node, None)  # recovered while no autopilot runs
        autopilot = service("autopilot")
        healthy = await obs.wait_last(NODE_VERDICTS, VERDICT, NodeVerdict, lambda v: True, within=1)
        assert effect_of(healthy, node) is None


async def test_replicas_store_each_change_once(
    testbed: Endpoints, appwrapper_crd: Path, node: str, service: ServiceFactory
) -> None:
    kc = testbed.kubeconfig
    service("watcher")
    replicas = [service("autopilot", instance="a"), service("autopilot", instance="b")]
    async with Observer(testbed.nats_url) as obs:
        js = obs.nc.jetstream()
        before = (await js.stream_info(NODE_VERDICTS)).state.last_seq
        no_execute = [gauge(sp, "NoExecute") for sp in replicas]

        await label(obs, kc, node, "EVICT")
        await obs.wait_last(NODE_VERDICTS, VERDICT, NodeVerdict, is_(node, "NoExecute"))
        # Each replica moves its gauge only after its own publish returned.
        await until(
            "every replica to take the change in",
            lambda: [gauge(sp, "NoExecute") for sp in replicas],
            done=lambda counts: counts == [n + 1 for n in no_execute],
            within=30,
            every=0.1,
        )
        after = (await js.stream_info(NODE_VERDICTS)).state.last_seq
        assert after - before == 1, f"{after - before} verdicts stored for one change"


# Short, so that a failover is quick to wait for; the heartbeat well within it.
FAILOVER_ENV = {"RESPAWN_SCALING_HEARTBEAT": "200ms", "RESPAWN_SCALING_MEMBER_TTL": "2s"}
MEMBER_TTL = 2.0


def counter(sp: ServiceProcess, name: str, **labels: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(sp.metrics())
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


async def test_one_replica_publishes_and_the_standby_takes_over_when_it_is_killed(
    testbed: Endpoints, appwrapper_crd: Path, node: str, own_nats: NatsServer, tmp_path: Path
) -> None:
    # A nats-server of their own: no other test's autopilot is in their group.
    kc = testbed.kubeconfig
    with services_on(kc, own_nats.url, tmp_path / "logs") as start:
        start("watcher")
        replicas = {
            m: start("autopilot", instance=m, env={**FAILOVER_ENV, "RESPAWN_INSTANCE": f"autopilot-{m}"})
            for m in ("a", "b")
        }

        def active() -> list[str]:
            return [
                m for m, sp in replicas.items() if counter(sp, "respawn_partitions_owned", group="autopilot")
            ]

        [leader] = await until("one replica to be active", active, done=lambda found: len(found) == 1)
        [standby] = [m for m in replicas if m != leader]
        published = {m: counter(sp, "respawn_autopilot_node_verdicts_total") for m, sp in replicas.items()}
        async with Observer(own_nats.url) as obs:
            await label(obs, kc, node, "EVICT")
            await obs.wait_last(NODE_VERDICTS, VERDICT, NodeVerdict, is_(node, "NoExecute"))
            # The standby judged it too (its state is warm), and published nothing.
            await until(
                "the standby to count the node",
                lambda: gauge(replicas[standby], "NoExecute"),
                done=lambda count: count >= 1,
            )
            assert counter(replicas[standby], "respawn_autopilot_node_verdicts_total") == published[standby]
            assert counter(replicas[leader], "respawn_autopilot_node_verdicts_total") == published[leader] + 1

            # The active one killed, the node moves while nobody publishes: the standby, once the
            # member TTL has passed, takes over and publishes it.
            killed = time.monotonic()
            replicas[leader].kill()
            await label(obs, kc, node, "TESTING")  # NoSchedule in the default configuration
            moved = await obs.wait_last(NODE_VERDICTS, VERDICT, NodeVerdict, is_(node, "NoSchedule"))
            failover = time.monotonic() - killed
            assert failover < MEMBER_TTL + 3, f"judged {failover:.1f}s after the kill"
            assert effect_of(moved, node) == "NoSchedule"
            assert counter(replicas[standby], "respawn_autopilot_node_verdicts_total") > published[standby]
            assert counter(replicas[standby], "respawn_partitions_owned", group="autopilot") == 1
