"""Autopilot service: when node verdicts are published, with which id, and what survives a restart.

The pure helpers are tested directly; the service's handler runs against an in-memory bus that
records publications, so the publication rules are checked without a NATS server.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.autopilot.nodes import NodeHealthState, ResourceNodes, apply, rebuild
from services.autopilot.service import (
    AutopilotService,
    NodeChange,
    consumer_name,
    due_verdicts,
    node_changes,
    sets_of,
    unhealthy_counts,
    verdict_msg_id,
)
from shared import subjects
from shared.bus import Delivery, TransientError
from shared.config import AutopilotConfig, OperatorConfig, ResourceTaint
from shared.messages import NodeObservation, NodeVerdict, decode
from shared.runtime import Runtime
from tests.unit.test_autopilot_nodes import GPU, HEALTH, NOW, RDMA, TAINTS


def node(name: str, value: str | None = None, *, deleted: bool = False) -> NodeObservation:
    labels = {} if value is None else {HEALTH: value}
    return NodeObservation(name=name, observed_at=NOW, labels=labels, deleted=deleted)


def nv(
    resource: str = GPU,
    *,
    no_execute: Sequence[str] = (),
    no_schedule: Sequence[str] = (),
    prefer: Sequence[str] = (),
    at: datetime = NOW,
) -> NodeVerdict:
    return NodeVerdict(
        resource=resource,
        no_execute=tuple(no_execute),
        no_schedule=tuple(no_schedule),
        prefer_no_schedule=tuple(prefer),
        decided_at=at,
    )


# ------------------------------------------------------------------ pure helpers


def test_msg_id_is_the_same_for_the_same_sets_and_cause_whatever_the_order() -> None:
    a = nv(no_execute=("n1", "n2"), no_schedule=("n3",))
    b = nv(no_execute=("n2", "n1"), no_schedule=("n3",), at=NOW + timedelta(seconds=5))
    assert verdict_msg_id(a, "obs-7") == verdict_msg_id(b, "obs-7")


def test_msg_id_differs_by_sets_effect_resource_and_cause() -> None:
    base = nv(no_execute=("n1",))
    ids = {
        verdict_msg_id(base, "obs-7"),
        verdict_msg_id(base, "obs-8"),
        verdict_msg_id(nv(no_schedule=("n1",)), "obs-7"),
        verdict_msg_id(nv(prefer=("n1",)), "obs-7"),
        verdict_msg_id(nv(), "obs-7"),
        verdict_msg_id(nv(RDMA, no_execute=("n1",)), "obs-7"),
    }
    assert len(ids) == 6


def test_sets_of_none_is_empty_and_of_a_verdict_is_its_sets() -> None:
    assert sets_of(None) == ResourceNodes()
    assert sets_of(nv(no_execute=("a",), no_schedule=("b",), prefer=("c",))) == ResourceNodes(
        no_schedule=frozenset({"b"}), prefer_no_schedule=frozenset({"c"}), no_execute=frozenset({"a"})
    )


def test_due_verdicts_without_history_covers_every_resource_asked_for_even_healthy_ones() -> None:
    state, _ = apply(NodeHealthState(), node("n1", "EVICT"), TAINTS)
    due = due_verdicts(state, {}, [GPU, RDMA], NOW)
    assert [(v.resource, v.no_execute) for v in due] == [(GPU, ("n1",)), (RDMA, ())]


def test_due_verdicts_skips_resources_whose_sets_match_the_last_published() -> None:
    state, _ = apply(NodeHealthState(), node("n1", "EVICT"), TAINTS)
    published = {GPU: nv(no_execute=("n1",)), RDMA: nv(RDMA, no_schedule=("old",))}
    due = due_verdicts(state, published, [GPU, RDMA], NOW)
    assert [(v.resource, v.no_schedule) for v in due] == [(RDMA, ())]


def test_due_verdicts_never_moves_decided_at_backwards() -> None:
    later = NOW + timedelta(minutes=1)
    due = due_verdicts(NodeHealthState(), {GPU: nv(no_execute=("n1",), at=later)}, [GPU], NOW)
    assert len(due) == 1 and due[0].decided_at == later and due[0].no_execute == ()
    due = due_verdicts(NodeHealthState(), {GPU: nv(no_execute=("n1",), at=NOW)}, [GPU], later)
    assert due[0].decided_at == later


def test_node_changes_lists_each_moved_node_once_with_both_effects() -> None:
    before = ResourceNodes(no_schedule=frozenset({"a", "b"}), prefer_no_schedule=frozenset({"c"}))
    after = ResourceNodes(
        no_execute=frozenset({"a"}), no_schedule=frozenset({"b"}), prefer_no_schedule=frozenset({"d"})
    )
    assert node_changes(GPU, before, after) == [
        NodeChange(GPU, "a", "NoSchedule", "NoExecute"),
        NodeChange(GPU, "c", "PreferNoSchedule", None),
        NodeChange(GPU, "d", None, "PreferNoSchedule"),
    ]
    assert node_changes(GPU, after, after) == []
    assert NodeChange(GPU, "c", "PreferNoSchedule", None).describe() == (
        f"node c: {GPU} PreferNoSchedule -> healthy"
    )


def test_unhealthy_counts_include_zeros_for_every_effect() -> None:
    state = rebuild([node("a", "EVICT"), node("b", "EVICT"), node("c", "WARN")], TAINTS)
    assert unhealthy_counts(state, [GPU, RDMA]) == {
        (GPU, "NoExecute"): 2,
        (GPU, "NoSchedule"): 0,
        (GPU, "PreferNoSchedule"): 1,
        (RDMA, "NoExecute"): 0,
        (RDMA, "NoSchedule"): 0,
        (RDMA, "PreferNoSchedule"): 0,
    }


def test_consumer_names_are_valid_nats_names_and_unique_per_start() -> None:
    a, b = consumer_name("host.example.com-12"), consumer_name("host.example.com-12")
    assert a != b
    for name in (a, b, consumer_name("***"), consumer_name("x" * 300)):
        assert re.fullmatch(r"autopilot-[A-Za-z0-9_-]+", name), name
        assert len(name) <= 100


# ------------------------------------------------------------------ the handler, on an in-memory bus


@dataclass
class FakeBus:
    """Records publications and stores the last message per subject, as the node-verdict stream does."""

    last: dict[str, tuple[str, bytes]] = field(default_factory=dict)
    sent: list[tuple[str, NodeVerdict, str]] = field(default_factory=list)
    failing: bool = False

    async def publish(self, subject: str, message: NodeVerdict, *, msg_id: str | None) -> Any:
        if self.failing:
            raise TimeoutError("nats: timeout")
        assert msg_id
        self.sent.append((subject, message, msg_id))
        self.last[subject] = (msg_id, message.encode())
        return SimpleNamespace(duplicate=False)

    async def replay(
        self, stream: str, durable: str, filters: str, cls: type[NodeVerdict], handler: Any, **options: Any
    ) -> Any:
        """Autopilot's one read of the node-verdict stream: the last verdict per resource."""
        assert stream == subjects.NODE_VERDICTS_STREAM
        assert options == {"last_per_subject": True, "follow": False}
        for _, data in self.last.values():
            await handler(decode(cls, data), delivery(0))
        return SimpleNamespace()

    def verdict(self, resource: str = GPU) -> NodeVerdict:
        return decode(NodeVerdict, self.last[subjects.node_verdict(resource)][1])


def service(bus: FakeBus, taints: Mapping[str, list[ResourceTaint]] = TAINTS) -> AutopilotService:
    config = OperatorConfig(autopilot=AutopilotConfig(resource_taints=dict(taints)))
    rt = Runtime(name="autopilot", config=config, bus=bus, kube=None, probes=None)  # type: ignore[arg-type]
    return AutopilotService(rt)


def delivery(seq: int, pending: int = 0) -> Delivery:
    return Delivery(
        subject="s", headers={}, stream=subjects.OBSERVATIONS_STREAM, consumer="c", stream_seq=seq,
        num_delivered=1, num_pending=pending, msg_id="", trace_context=None, _msg=None,  # type: ignore[arg-type]
    )  # fmt: skip


async def test_nothing_is_published_during_the_replay_and_the_full_sets_once_it_ends() -> None:
    bus = FakeBus()
    svc = service(bus)
    await svc.on_node(node("n1", "EVICT"), delivery(1, pending=2))
    await svc.on_node(node("n2", "ERR"), delivery(2, pending=1))
    assert bus.sent == [] and not svc.caught_up
    await svc.on_node(node("n3", "WARN"), delivery(3, pending=0))
    assert bus.sent == [] and not svc.caught_up
    await svc.finish_replay()  # what the bus calls once the replay has caught up
    assert svc.caught_up
    assert len(bus.sent) == 1
    v = bus.verdict()
    assert (v.no_execute, v.no_schedule, v.prefer_no_schedule) == (("n1",), ("n2",), ("n3",))
    assert bus.sent[0][2].startswith(f"nodeverdict:{GPU}:start-3:")


async def test_after_the_replay_only_changes_publish_and_heartbeats_do_not() -> None:
    bus = FakeBus()
    svc = service(bus)
    await svc.on_node(node("n1"), delivery(1))
    await svc.finish_replay()
    assert bus.verdict().no_execute == ()
    await svc.on_node(node("n1"), delivery(2))  # heartbeat: nothing moved
    assert len(bus.sent) == 1
    await svc.on_node(node("n1", "EVICT"), delivery(3))
    assert bus.verdict().no_execute == ("n1",) and bus.sent[-1][2].startswith(f"nodeverdict:{GPU}:obs-3:")
    await svc.on_node(node("n1", "EVICT"), delivery(4))
    assert len(bus.sent) == 2
    await svc.on_node(node("n1", deleted=True), delivery(5))
    assert bus.verdict().no_execute == () and len(bus.sent) == 3


async def test_a_set_that_returns_to_an_earlier_value_gets_a_new_id() -> None:
    bus = FakeBus()
    svc = service(bus)
    await svc.on_node(node("n1", "EVICT"), delivery(1))
    await svc.finish_replay()
    await svc.on_node(node("n1", "PASS"), delivery(2))
    await svc.on_node(node("n1", "EVICT"), delivery(3))
    ids = [msg_id for _, _, msg_id in bus.sent]
    assert len(ids) == 3 and len(set(ids)) == 3
    assert bus.verdict().no_execute == ("n1",)


async def test_a_failed_publish_keeps_the_old_state_so_the_redelivery_publishes_the_same_verdict() -> None:
    bus = FakeBus()
    svc = service(bus)
    await svc.on_node(node("n0"), delivery(1))
    await svc.finish_replay()
    bus.failing = True
    with pytest.raises(TransientError):
        await svc.on_node(node("n1", "EVICT"), delivery(2))
    assert svc.state.nodes(GPU).no_execute == frozenset()
    bus.failing = False
    await svc.on_node(node("n1", "EVICT"), delivery(2))  # the redelivery
    assert bus.verdict().no_execute == ("n1",)
    assert bus.sent[-1][2].startswith(f"nodeverdict:{GPU}:obs-2:")


async def test_a_failed_publish_at_the_end_of_the_replay_is_retried() -> None:
    bus = FakeBus(failing=True)
    svc = service(bus)
    await svc.on_node(node("n1", "EVICT"), delivery(1))
    with pytest.raises(TransientError):
        await svc.finish_replay()
    assert not svc.caught_up
    bus.failing = False
    await svc.finish_replay()  # the bus retries it until it succeeds
    assert svc.caught_up and bus.verdict().no_execute == ("n1",)


async def test_a_restart_publishes_only_what_differs_from_the_stored_verdicts() -> None:
    bus = FakeBus()
    first = service(bus)
    await first.on_node(node("n1", "EVICT"), delivery(1, pending=1))
    await first.on_node(node("n2", "ERR"), delivery(2))
    await first.finish_replay()
    sent = len(bus.sent)

    # Same world: the restarted replica finds the stored sets right and publishes nothing.
    again = service(bus)
    await again.on_node(node("n1", "EVICT"), delivery(1, pending=1))
    await again.on_node(node("n2", "ERR"), delivery(2))
    await again.finish_replay()
    assert again.caught_up and len(bus.sent) == sent

    # n1 recovered and n2 went to NoExecute while no autopilot ran: both show at start-up.
    later = service(bus)
    await later.on_node(node("n1", "PASS"), delivery(3, pending=1))
    await later.on_node(node("n2", "EVICT"), delivery(4))
    await later.finish_replay()
    assert len(bus.sent) == sent + 1
    v = bus.verdict()
    assert (v.no_execute, v.no_schedule) == (("n2",), ())


async def test_a_resource_no_longer_configured_is_cleared_at_start_up() -> None:
    bus = FakeBus()
    rdma = {RDMA: [ResourceTaint(key="rdma-health", value="BAD", effect="NoExecute")]}
    first = service(bus, {**TAINTS, **rdma})
    await first.on_node(
        NodeObservation(name="n1", observed_at=NOW, labels={"rdma-health": "BAD"}), delivery(1)
    )
    await first.finish_replay()
    assert bus.verdict(RDMA).no_execute == ("n1",)
    second = service(bus, TAINTS)
    await second.on_node(
        NodeObservation(name="n1", observed_at=NOW, labels={"rdma-health": "BAD"}), delivery(1)
    )
    await second.finish_replay()
    assert bus.verdict(RDMA).no_execute == ()


async def test_monitor_off_clears_stored_sets_without_reading_nodes() -> None:
    bus = FakeBus()
    first = service(bus)
    await first.on_node(node("n1", "EVICT"), delivery(1))
    await first.finish_replay()
    assert bus.verdict().no_execute == ("n1",)
    config = OperatorConfig(autopilot=AutopilotConfig(resource_taints=TAINTS, monitor_nodes=False))
    off = AutopilotService(Runtime(name="autopilot", config=config, bus=bus, kube=None, probes=None))  # type: ignore[arg-type]
    await off.finish_replay()
    assert off.caught_up and off.consumer is None
    assert bus.verdict().no_execute == ()


# ------------------------------------------------------------------ the rule as a whole

names = st.sampled_from(["n1", "n2", "n3"])
values = st.sampled_from([None, "PASS", "WARN", "ERR", "EVICT"])
events = st.lists(st.tuples(names, values, st.booleans()), max_size=25)


@settings(max_examples=60, deadline=None)
@given(before=events, during=events, after=events)
async def test_published_sets_always_match_the_latest_state_of_every_node(
    before: list[tuple[str, str | None, bool]],
    during: list[tuple[str, str | None, bool]],
    after: list[tuple[str, str | None, bool]],
) -> None:
    """Whatever happens, and across a restart, the last stored verdict equals the sets computed
    from the latest observation of each node."""
    bus = FakeBus()
    latest: dict[str, NodeObservation] = {}
    seq = 0

    async def feed(svc: AutopilotService, batch: list[tuple[str, str | None, bool]]) -> None:
        nonlocal seq
        for name, value, deleted in batch:
            seq += 1
            obs = node(name, value, deleted=deleted)
            latest[name] = obs
            await svc.on_node(obs, delivery(seq))

    first = service(bus)
    await first.finish_replay()
    await feed(first, before)
    # Down: observations arrive with no autopilot running.
    for name, value, deleted in during:
        latest[name] = node(name, value, deleted=deleted)
    second = service(bus)
    replay = list(latest.values())
    for index, obs in enumerate(replay):
        seq += 1
        await second.on_node(obs, delivery(seq, pending=len(replay) - index - 1))
    await second.finish_replay()
    await feed(second, after)
    expected = rebuild(latest.values(), TAINTS).nodes(GPU)
    assert sets_of(bus.verdict()) == expected
