"""autopilot's shell on a real nats-server: when node verdicts are published, with which id, and
what survives a restart or a refused publish.

Node observations are published on RESPAWN_OBSERVATIONS as the watcher publishes them; the
service runs in this process (it needs no Kubernetes) on a server of its own per test, so stream
sequences and stored verdicts are this test's alone. What it published is read twice: every
publication as it crosses the wire (a subscription on the node-verdict subjects, on the service's
own connection), and what JetStream stored. A publish is refused for real, by lowering the
node-verdict stream's maximum message size below any verdict's and restoring it afterwards.

tests/integration/test_autopilot_service.py runs autopilot as a process on the testbed, fed by
the watcher from real node labels.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from respawn.testbed.nats import NatsServer, start_nats
from services.autopilot.nodes import rebuild
from services.autopilot.service import AutopilotService, sets_of
from shared import subjects
from shared.bus import MSG_ID_HEADER, Bus
from shared.config import AutopilotConfig, NodeQuarantineConfig, OperatorConfig, ResourceTaint
from shared.kubetime import utcnow
from shared.messages import NODE_STATE_RESOURCE, NodeObservation, NodeVerdict, decode
from shared.runtime import Runtime
from tests.autopilot_taints import GPU, HEALTH, NOW, RDMA, TAINTS
from tests.nats_fixtures import connected_bus
from tests.waiting import until

pytestmark = pytest.mark.nats

RDMA_TAINTS = {RDMA: [ResourceTaint(key="rdma-health", value="BAD", effect="NoExecute")]}


def node(name: str, value: str | None = None, *, deleted: bool = False) -> NodeObservation:
    labels = {} if value is None else {HEALTH: value}
    return NodeObservation(name=name, observed_at=NOW, labels=labels, deleted=deleted)


async def observe(bus: Bus, *observations: NodeObservation) -> int:
    """Publish node observations as the watcher does; the stream sequence of the last one."""
    seq = 0
    for observation in observations:
        seq = (await bus.publish(subjects.node_obs(observation.name), observation, msg_id=None)).seq
    return seq


@contextlib.asynccontextmanager
async def autopilot(
    bus: Bus,
    taints: Mapping[str, list[ResourceTaint]] = TAINTS,
    *,
    monitor: bool = True,
    quarantine: bool = True,
    node_state: bool = False,
) -> AsyncIterator[AutopilotService]:
    """One autopilot replica running on ``bus``; stopped (its consumer deleted) on leaving.

    The node-state verdict is off unless asked for: the tests that count the verdicts on the wire
    are about the resources' sets, which a deleted node would otherwise interleave with it."""
    config = OperatorConfig(
        autopilot=AutopilotConfig(
            resource_taints=dict(taints), monitor_nodes=monitor, publish_node_state=node_state
        ),
        node_quarantine=NodeQuarantineConfig(enabled=quarantine),
    )
    svc = AutopilotService(Runtime(name="autopilot", config=config, bus=bus, kube=None, probes=None))
    task = asyncio.create_task(svc.run())
    try:
        yield svc
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def caught_up(svc: AutopilotService) -> None:
    await until("autopilot to finish its replay", lambda: svc.caught_up)


async def handled(svc: AutopilotService, seq: int) -> None:
    await until(f"autopilot to handle observation {seq}", lambda: svc.last_seq >= seq)


@dataclasses.dataclass
class Wire:
    """Every node verdict published on a connection, as (msg id, verdict), in order."""

    bus: Bus
    seen: list[tuple[str, NodeVerdict]] = dataclasses.field(default_factory=list)

    async def sent(self) -> list[tuple[str, NodeVerdict]]:
        # A PONG on the same connection comes after every message published on it before.
        await self.bus.nc.flush()
        return list(self.seen)


@contextlib.asynccontextmanager
async def wire(bus: Bus) -> AsyncIterator[Wire]:
    tap = Wire(bus)

    async def keep(msg: Any) -> None:
        tap.seen.append(
            ((msg.headers or {}).get(MSG_ID_HEADER, ""), decode(NodeVerdict, msg.data, msg.headers))
        )

    sub = await bus.nc.subscribe(subjects.node_verdict_filter(), cb=keep)
    try:
        yield tap
    finally:
        await sub.unsubscribe()


async def stored(bus: Bus, resource: str = GPU) -> tuple[str, NodeVerdict]:
    """The verdict JetStream holds for ``resource`` (the stream keeps the last one), with its id."""
    msg = await bus.js.get_last_msg(subjects.NODE_VERDICTS_STREAM, subjects.node_verdict(resource))
    return (msg.headers or {}).get(MSG_ID_HEADER, ""), decode(NodeVerdict, msg.data, msg.headers)


async def stored_count(bus: Bus) -> int:
    """How many verdicts JetStream has stored since the stream was made (duplicates are not)."""
    return int((await bus.js.stream_info(subjects.NODE_VERDICTS_STREAM)).state.last_seq)


@contextlib.asynccontextmanager
async def refusing_verdicts(bus: Bus) -> AsyncIterator[None]:
    """The node-verdict stream refuses every message (its maximum size is 1 byte) until left."""
    info = await bus.js.stream_info(subjects.NODE_VERDICTS_STREAM)
    await bus.js.update_stream(dataclasses.replace(info.config, max_msg_size=1))
    try:
        yield
    finally:
        await bus.js.update_stream(info.config)


def naked(bus: Bus) -> float:
    """Observations this bus's consumers handed back for redelivery after a transient failure."""
    labels = {"service": bus.service, "stream": subjects.OBSERVATIONS_STREAM, "reason": "transient"}
    return REGISTRY.get_sample_value("respawn_bus_messages_naked_total", labels) or 0.0


def sets(verdict: NodeVerdict) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    return verdict.no_execute, verdict.no_schedule, verdict.prefer_no_schedule


# ------------------------------------------------------------------ publication rules


async def test_nothing_is_published_during_the_replay_and_the_full_sets_once_it_ends(own_bus: Bus) -> None:
    last = await observe(own_bus, node("n1", "EVICT"), node("n2", "ERR"), node("n3", "WARN"))
    async with wire(own_bus) as tap, autopilot(own_bus) as svc:
        await caught_up(svc)
        # One verdict for three observations: none was published while they were replayed.
        [(msg_id, verdict)] = await tap.sent()
    assert sets(verdict) == (("n1",), ("n2",), ("n3",))
    assert msg_id.startswith(f"nodeverdict:{GPU}:start-{last}:")
    assert await stored(own_bus) == (msg_id, verdict)


async def test_after_the_replay_only_changes_publish_and_heartbeats_do_not(own_bus: Bus) -> None:
    await observe(own_bus, node("n1"))
    async with wire(own_bus) as tap, autopilot(own_bus) as svc:
        await caught_up(svc)
        assert [sets(v) for _, v in await tap.sent()] == [((), (), ())]
        # A heartbeat (nothing moved), then a change: only the change is published.
        await observe(own_bus, node("n1"))
        evicted = await observe(own_bus, node("n1", "EVICT"))
        await handled(svc, evicted)
        sent = await tap.sent()
        assert len(sent) == 2
        assert sent[-1][1].no_execute == ("n1",)
        assert sent[-1][0].startswith(f"nodeverdict:{GPU}:obs-{evicted}:")
        # The same again: nothing; the node deleted: its sets are cleared.
        await observe(own_bus, node("n1", "EVICT"))
        # Deleted now (a tombstone dated NOW would be past the hour a deleted node is kept).
        gone = await observe(own_bus, NodeObservation(name="n1", observed_at=utcnow(), deleted=True))
        await handled(svc, gone)
        sent = await tap.sent()
    assert len(sent) == 3
    assert sets(sent[-1][1]) == ((), (), ())
    assert (await stored(own_bus))[1].no_execute == ()


async def test_a_set_that_returns_to_an_earlier_value_gets_a_new_id(own_bus: Bus) -> None:
    await observe(own_bus, node("n1", "EVICT"))
    async with wire(own_bus) as tap, autopilot(own_bus) as svc:
        await caught_up(svc)
        # One at a time: the stream keeps only a node's latest observation, so a PASS published
        # right before the EVICT could be replaced by it before autopilot reads it.
        passed = await observe(own_bus, node("n1", "PASS"))
        await handled(svc, passed)
        again = await observe(own_bus, node("n1", "EVICT"))
        await handled(svc, again)
        sent = await tap.sent()
    ids = [msg_id for msg_id, _ in sent]
    assert len(ids) == 3 and len(set(ids)) == 3, ids
    # JetStream stored all three: the third was not dropped as a repeat of the first.
    assert await stored_count(own_bus) == 3
    assert (await stored(own_bus))[1].no_execute == ("n1",)


async def test_a_failed_publish_keeps_the_old_state_so_the_redelivery_publishes_the_same_verdict(
    own_bus: Bus,
) -> None:
    await observe(own_bus, node("n0"))
    async with autopilot(own_bus) as svc:
        await caught_up(svc)
        async with refusing_verdicts(own_bus):
            before = naked(own_bus)
            evicted = await observe(own_bus, node("n1", "EVICT"))
            await until("the refused verdict's observation handed back", lambda: naked(own_bus) > before)
            # Not folded in: the redelivery must find the same change to publish.
            assert svc.state.nodes(GPU).no_execute == frozenset()
            assert svc.last_seq < evicted
            assert (await stored(own_bus))[1].no_execute == ()
        msg_id, _ = await until(
            "the redelivery to publish the verdict",
            lambda: stored(own_bus),
            done=lambda found: found[1].no_execute == ("n1",),
        )
    assert msg_id.startswith(f"nodeverdict:{GPU}:obs-{evicted}:")
    assert await stored_count(own_bus) == 2


async def test_a_failed_publish_at_the_end_of_the_replay_is_retried(
    own_bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    await observe(own_bus, node("n1", "EVICT"))
    async with autopilot(own_bus) as svc:
        async with refusing_verdicts(own_bus):
            await until(
                "the catch-up to fail",
                lambda: (
                    f"catching up after the replay of {subjects.OBSERVATIONS_STREAM} failed" in caplog.text
                ),
            )
            assert not svc.caught_up
        await caught_up(svc)
    assert (await stored(own_bus))[1].no_execute == ("n1",)


# ------------------------------------------------------------------ restarts


async def test_a_restart_publishes_only_what_differs_from_the_stored_verdicts(own_bus: Bus) -> None:
    await observe(own_bus, node("n1", "EVICT"), node("n2", "ERR"))
    async with autopilot(own_bus) as first:
        await caught_up(first)
    assert sets((await stored(own_bus))[1]) == (("n1",), ("n2",), ())

    # Same world: the restarted replica finds the stored sets right and publishes nothing.
    async with wire(own_bus) as tap, autopilot(own_bus) as again:
        await caught_up(again)
        assert await tap.sent() == []

    # n1 recovered and n2 went to NoExecute while no autopilot ran: both show at start-up.
    last = await observe(own_bus, node("n1", "PASS"), node("n2", "EVICT"))
    async with wire(own_bus) as tap, autopilot(own_bus) as later:
        await caught_up(later)
        [(msg_id, verdict)] = await tap.sent()
    assert sets(verdict) == (("n2",), (), ())
    assert msg_id.startswith(f"nodeverdict:{GPU}:start-{last}:")
    assert await stored(own_bus) == (msg_id, verdict)


async def test_a_resource_no_longer_configured_is_cleared_at_start_up(own_bus: Bus) -> None:
    bad_rdma = NodeObservation(name="n1", observed_at=NOW, labels={"rdma-health": "BAD"})
    await observe(own_bus, bad_rdma)
    async with autopilot(own_bus, {**TAINTS, **RDMA_TAINTS}) as first:
        await caught_up(first)
    assert (await stored(own_bus, RDMA))[1].no_execute == ("n1",)
    async with autopilot(own_bus, TAINTS) as second:
        await caught_up(second)
    assert (await stored(own_bus, RDMA))[1].no_execute == ()


async def test_monitor_off_clears_stored_sets_without_reading_nodes(own_bus: Bus) -> None:
    await observe(own_bus, node("n1", "EVICT"))
    async with autopilot(own_bus) as first:
        await caught_up(first)
    assert (await stored(own_bus))[1].no_execute == ("n1",)
    # Node quarantine reads the nodes too (its cap is a share of them), and so does the node
    # state (off in this helper): off as well here.
    async with autopilot(own_bus, monitor=False, quarantine=False) as off:
        await caught_up(off)
        assert off.consumer is None
        # No consumer reads the node observations (the first replica's left with it).
        info = await own_bus.js.stream_info(subjects.OBSERVATIONS_STREAM)
        assert info.state.consumer_count == 0
    assert (await stored(own_bus))[1].no_execute == ()


# ------------------------------------------------------------------ the rule as a whole


@pytest.fixture(scope="module")
def property_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    # One server for every example (a server per example would dominate the run); each example
    # makes the two streams it uses afresh (empty, with no message ids remembered).
    server = start_nats(tmp_path_factory.mktemp("autopilot-property"))
    try:
        yield server
    finally:
        server.stop()


names = st.sampled_from(["n1", "n2", "n3"])
values = st.sampled_from([None, "PASS", "WARN", "ERR", "EVICT"])
events = st.lists(st.tuples(names, values, st.booleans()), max_size=12)


# Fewer examples than a pure property test: each one starts two replicas on a real server.
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(before=events, during=events, after=events)
async def test_published_sets_always_match_the_latest_state_of_every_node(
    property_nats: NatsServer,
    before: Sequence[tuple[str, str | None, bool]],
    during: Sequence[tuple[str, str | None, bool]],
    after: Sequence[tuple[str, str | None, bool]],
) -> None:
    """Whatever happens, and across a restart, the last stored verdict equals the sets computed
    from the latest observation of each node."""
    async with connected_bus(property_nats.url) as bus:
        for stream in (subjects.OBSERVATIONS_STREAM, subjects.NODE_VERDICTS_STREAM):
            await bus.js.delete_stream(stream)
        await bus.ensure_streams()
        latest: dict[str, NodeObservation] = {}

        async def feed(batch: Sequence[tuple[str, str | None, bool]]) -> int:
            seq = 0
            for name, value, deleted in batch:
                latest[name] = node(name, value, deleted=deleted)
                seq = await observe(bus, latest[name])
            return seq

        async with autopilot(bus) as first:
            await caught_up(first)
            await handled(first, await feed(before))
        # Down: observations arrive with no autopilot running.
        await feed(during)
        async with autopilot(bus) as second:
            await caught_up(second)
            await handled(second, await feed(after))
        _, verdict = await stored(bus)
    assert sets_of(verdict) == rebuild(latest.values(), TAINTS).nodes(GPU)


# ------------------------------------------------------------------ node state


async def test_lost_nodes_are_published_on_change_and_not_again_after_a_restart(own_bus: Bus) -> None:
    """The node-state verdict (docs/autopilot.md#node-state): the complete list of lost nodes,
    published when it changes, and rebuilt from the stream by a restarted replica."""
    down = NodeObservation(name="n2", observed_at=NOW, ready=False, ready_status="Unknown", ready_since=NOW)
    await observe(own_bus, node("n1"), down)
    async with wire(own_bus) as tap, autopilot(own_bus, node_state=True) as svc:
        await caught_up(svc)
        [(msg_id, verdict)] = [(i, v) for i, v in await tap.sent() if v.resource == NODE_STATE_RESOURCE]
        assert [(e.node, e.state, e.since) for e in verdict.lost_nodes] == [("n2", "Unknown", NOW)]
        assert msg_id.startswith("nodestate:start-")
        # A heartbeat of the same state: nothing; n1 deleted: listed, dated by its tombstone.
        await observe(own_bus, down)
        # Deleted now (a tombstone dated NOW would be past the hour a deleted node is kept).
        gone = await observe(own_bus, NodeObservation(name="n1", observed_at=utcnow(), deleted=True))
        await handled(svc, gone)
        published = [v for _, v in await tap.sent() if v.resource == NODE_STATE_RESOURCE]
        assert [[(e.node, e.state) for e in v.lost_nodes] for v in published] == [
            [("n2", "Unknown")],
            [("n1", "Deleted"), ("n2", "Unknown")],
        ]
    # Same world: the restarted replica rebuilds the same list (the tombstone is n1's last
    # message) and publishes nothing.
    async with wire(own_bus) as tap, autopilot(own_bus, node_state=True) as again:
        await caught_up(again)
        assert [v for _, v in await tap.sent() if v.resource == NODE_STATE_RESOURCE] == []
        assert again.lost.listed() == published[-1].lost_nodes
    # Turned off: the stored list is cleared, so health stops reading a stale one.
    async with autopilot(own_bus, node_state=False) as off:
        await caught_up(off)
    assert (await stored(own_bus, NODE_STATE_RESOURCE))[1].lost_nodes == ()
