"""Autopilot service: the pure helpers that decide which node verdicts are due and their ids.

The service around them (when it publishes, what survives a restart or a refused publish) runs on
a real nats-server in tests/integration/test_autopilot_bus.py.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from opentelemetry.context import Context

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
from shared.bus import Delivery
from shared.config import AutopilotConfig, OperatorConfig, ResourceTaint
from shared.messages import NodeObservation, NodeVerdict
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


# ------------------------------------------------------------------ active and standby


class Unused:
    """The bus of a replica whose test never reaches it: any use fails the test."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"this replica must not use its bus (it used .{name})")


def replica(taints: Mapping[str, list[ResourceTaint]] = TAINTS) -> AutopilotService:
    """A replica whose membership never runs: a standby until its share is set by hand."""
    config = OperatorConfig(autopilot=AutopilotConfig(resource_taints=dict(taints)))
    return AutopilotService(Runtime(name="autopilot", config=config, bus=Unused(), kube=None, probes=None))  # type: ignore[arg-type]


def delivery(seq: int) -> Delivery:
    return Delivery("s", {}, "stream", "consumer", seq, 1, 0, "", Context(), None)


async def test_a_standby_follows_the_stored_verdicts_and_the_nodes_and_publishes_nothing() -> None:
    svc = replica()
    assert not svc.active() and not svc.ready()
    await svc.on_verdict(nv(no_execute=("n1",)), delivery(5))
    # An older verdict delivered late does not replace a newer one.
    await svc.on_verdict(nv(), delivery(3))
    assert svc.published[GPU].no_execute == ("n1",)
    svc.caught_up = True
    # A change, once replayed: judged (its bus would fail the test if it published).
    await svc.on_node(node("n2", "EVICT"), delivery(7))
    assert svc.state.nodes(GPU).no_execute == {"n2"}
    assert svc.last_seq == 7


async def test_the_replay_ends_once_the_share_is_known_and_a_standby_is_ready_without_publishing() -> None:
    svc = replica()
    finished = asyncio.create_task(svc.finish_replay())
    await asyncio.sleep(0)
    assert not finished.done()  # it waits to know whether it is the active replica
    await svc.moved(frozenset(), frozenset())  # the standby: no partition
    svc.membership.first_share.set()
    await finished
    assert svc.caught_up and svc.ready() and not svc.active()
