"""Autopilot node-set logic: which nodes are unhealthy per resource, and when that changes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hypothesis import given
from hypothesis import strategies as st

from services.autopilot.nodes import NodeHealthState, ResourceNodes, apply, from_verdict, rebuild, verdicts
from shared.config import ResourceTaint
from shared.messages import NodeObservation
from tests.autopilot_taints import GPU, HEALTH, NOW, RDMA, TAINTS


def node(name: str, labels: Mapping[str, str] | None = None, *, deleted: bool = False) -> NodeObservation:
    return NodeObservation(name=name, observed_at=NOW, labels=dict(labels or {}), deleted=deleted)


def fold(
    observations: Sequence[NodeObservation], taints: Mapping[str, Sequence[ResourceTaint]] = TAINTS
) -> tuple[NodeHealthState, frozenset[str]]:
    """Apply observations in order; return the final state and the changes of the last one."""
    state, changed = NodeHealthState(), frozenset[str]()
    for observation in observations:
        state, changed = apply(state, observation, taints)
    return state, changed


def test_matching_label_puts_node_in_the_set_of_its_effect() -> None:
    state, changed = fold(
        [node("n1", {HEALTH: "EVICT"}), node("n2", {HEALTH: "ERR"}), node("n3", {HEALTH: "WARN"})]
    )
    gpu = state.nodes(GPU)
    assert gpu.no_execute == {"n1"}
    assert gpu.no_schedule == {"n2"}
    assert gpu.prefer_no_schedule == {"n3"}
    assert changed == {GPU}


def test_label_with_unconfigured_value_or_key_does_not_match() -> None:
    state, changed = fold([node("n1", {HEALTH: "PASS"}), node("n2", {"other.io/health": "EVICT"})])
    assert not state.nodes(GPU)
    assert changed == frozenset()


def test_node_whose_label_no_longer_matches_is_removed() -> None:
    state, changed = fold([node("n1", {HEALTH: "EVICT"}), node("n1", {HEALTH: "PASS"})])
    assert state.effect_of(GPU, "n1") is None
    assert GPU not in state.by_resource
    assert changed == {GPU}


def test_node_whose_label_is_removed_is_removed() -> None:
    state, changed = fold([node("n1", {HEALTH: "ERR", "zone": "a"}), node("n1", {"zone": "a"})])
    assert state.effect_of(GPU, "n1") is None
    assert changed == {GPU}


def test_deleted_node_is_removed_even_if_its_last_labels_matched() -> None:
    state, changed = fold([node("n1", {HEALTH: "EVICT"}), node("n1", {HEALTH: "EVICT"}, deleted=True)])
    assert not state.nodes(GPU).no_execute
    assert changed == {GPU}


def test_node_moves_between_sets_when_its_value_changes() -> None:
    state, changed = fold([node("n1", {HEALTH: "WARN"}), node("n1", {HEALTH: "EVICT"})])
    gpu = state.nodes(GPU)
    assert gpu.no_execute == {"n1"}
    assert not gpu.prefer_no_schedule
    assert changed == {GPU}


def test_strongest_effect_wins_when_a_node_matches_several_entries() -> None:
    taints = {
        GPU: [
            ResourceTaint(key="a.io/health", value="bad", effect="PreferNoSchedule"),
            ResourceTaint(key="b.io/health", value="bad", effect="NoExecute"),
            ResourceTaint(key="c.io/health", value="bad", effect="NoSchedule"),
        ]
    }
    all_three = {"a.io/health": "bad", "b.io/health": "bad", "c.io/health": "bad"}
    state, _ = fold([node("n1", all_three), node("n2", {"a.io/health": "bad", "c.io/health": "bad"})], taints)
    gpu = state.nodes(GPU)
    assert gpu.no_execute == {"n1"}
    assert gpu.no_schedule == {"n2"}
    assert not gpu.prefer_no_schedule


def test_same_value_listed_with_two_effects_takes_the_stronger() -> None:
    taints = {
        GPU: [
            ResourceTaint(key=HEALTH, value="ERR", effect="NoSchedule"),
            ResourceTaint(key=HEALTH, value="ERR", effect="PreferNoSchedule"),
        ]
    }
    state, _ = fold([node("n1", {HEALTH: "ERR"})], taints)
    assert state.effect_of(GPU, "n1") == "NoSchedule"


def test_same_observation_again_changes_nothing() -> None:
    first, changed = fold([node("n1", {HEALTH: "EVICT"})])
    second, changed_again = apply(first, node("n1", {HEALTH: "EVICT"}), TAINTS)
    assert changed == {GPU}
    assert changed_again == frozenset()
    assert second is first


def test_unrelated_label_change_is_not_a_change() -> None:
    state, _ = fold([node("n1", {HEALTH: "ERR", "heartbeat": "1"})])
    _, changed = apply(state, node("n1", {HEALTH: "ERR", "heartbeat": "2"}), TAINTS)
    assert changed == frozenset()


def test_only_the_resources_whose_sets_moved_are_reported() -> None:
    taints = {
        GPU: [ResourceTaint(key=HEALTH, value="EVICT", effect="NoExecute")],
        RDMA: [ResourceTaint(key="rdma.io/health", value="DOWN", effect="NoSchedule")],
    }
    state, _ = fold([node("n1", {HEALTH: "EVICT"})], taints)
    state, changed = apply(state, node("n2", {"rdma.io/health": "DOWN"}), taints)
    assert changed == {RDMA}
    assert state.nodes(GPU).no_execute == {"n1"}
    assert state.nodes(RDMA).no_schedule == {"n2"}


def test_one_label_can_flag_several_resources() -> None:
    taints = {
        GPU: [ResourceTaint(key=HEALTH, value="EVICT", effect="NoExecute")],
        RDMA: [ResourceTaint(key=HEALTH, value="EVICT", effect="NoSchedule")],
    }
    state, changed = fold([node("n1", {HEALTH: "EVICT"})], taints)
    assert changed == {GPU, RDMA}
    assert state.no_execute_resources("n1") == {GPU}
    assert state.nodes(RDMA).no_schedule == {"n1"}


def test_resource_dropped_from_configuration_is_cleaned_when_its_nodes_are_seen() -> None:
    state, _ = fold([node("n1", {HEALTH: "EVICT"})])
    state, changed = apply(state, node("n1", {HEALTH: "EVICT"}), {})
    assert changed == {GPU}
    assert not state.by_resource


def test_verdicts_are_complete_sorted_and_stamped() -> None:
    state, _ = fold([node("b", {HEALTH: "EVICT"}), node("a", {HEALTH: "EVICT"}), node("c", {HEALTH: "WARN"})])
    [verdict] = verdicts(state, {GPU}, NOW)
    assert verdict.resource == GPU
    assert verdict.no_execute == ("a", "b")
    assert verdict.prefer_no_schedule == ("c",)
    assert verdict.no_schedule == ()
    assert verdict.decided_at == NOW


def test_verdicts_only_for_requested_resources_and_empty_when_recovered() -> None:
    state, changed = fold([node("n1", {HEALTH: "EVICT"}), node("n1", {})])
    result = verdicts(state, changed, NOW)
    assert [v.resource for v in result] == [GPU]
    assert (result[0].no_schedule, result[0].prefer_no_schedule, result[0].no_execute) == ((), (), ())
    assert verdicts(state, [], NOW) == []


def test_from_verdict_restores_the_sets_a_verdict_describes() -> None:
    state, _ = fold([node("n1", {HEALTH: "EVICT"}), node("n2", {HEALTH: "ERR"})])
    [verdict] = verdicts(state, [GPU], NOW)
    assert from_verdict(NodeHealthState(), verdict).nodes(GPU) == state.nodes(GPU)
    [empty] = verdicts(NodeHealthState(), [GPU], NOW)
    assert GPU not in from_verdict(state, empty).by_resource


def test_resource_nodes_avoided_is_noschedule_and_noexecute() -> None:
    sets = ResourceNodes(
        no_schedule=frozenset({"a"}), prefer_no_schedule=frozenset({"b"}), no_execute=frozenset({"c"})
    )
    assert sets.avoided == {"a", "c"}


_values = st.sampled_from(["WARN", "TESTING", "ERR", "EVICT", "PASS"])
_observations = st.builds(
    lambda name, value, deleted: node(name, {HEALTH: value} if value != "PASS" else {}, deleted=deleted),
    st.sampled_from(["n1", "n2", "n3", "n4"]),
    _values,
    st.booleans(),
)


@given(st.lists(_observations, max_size=30))
def test_state_depends_only_on_the_latest_observation_of_each_node(
    observations: list[NodeObservation],
) -> None:
    state, _ = fold(observations)
    latest = {o.name: o for o in observations}
    assert state == rebuild(reversed(list(latest.values())), TAINTS)
    for sets in state.by_resource.values():
        assert not (sets.no_schedule & sets.no_execute)
        assert not (sets.no_schedule & sets.prefer_no_schedule)
        assert not (sets.prefer_no_schedule & sets.no_execute)


@given(st.lists(_observations, min_size=1, max_size=30))
def test_change_is_reported_exactly_when_the_published_verdict_would_differ(
    observations: list[NodeObservation],
) -> None:
    state = NodeHealthState()
    for observation in observations:
        new, changed = apply(state, observation, TAINTS)
        differs = verdicts(new, [GPU], NOW) != verdicts(state, [GPU], NOW)
        assert (GPU in changed) == differs
        state = new
