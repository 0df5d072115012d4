"""Node exclusion on retry: the excluded-node list kept in an AppWrapper annotation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.lifecycle.placement.exclusion import (
    DEFAULT_MAX_EXCLUDED_NODES,
    EXCLUDED_NODES_ANNOTATION,
    NODE_EXCLUSION_ANNOTATION,
    decide_exclusions,
    exclusion_enabled,
    format_excluded_nodes,
    parse_excluded_nodes,
)

CLUSTER = frozenset(f"n{i}" for i in range(20))


def excluded(*nodes: str) -> dict[str, str]:
    return {EXCLUDED_NODES_ANNOTATION: ",".join(nodes)}


def test_default_bound_is_eight() -> None:
    assert DEFAULT_MAX_EXCLUDED_NODES == 8


def test_failed_node_is_appended_after_existing_ones() -> None:
    decision = decide_exclusions(excluded("n1", "n2"), failed_nodes=["n3"], candidates=CLUSTER)
    assert decision.enabled
    assert decision.nodes == ("n1", "n2", "n3")
    assert decision.added == ("n3",)
    assert decision.annotation_patch() == {EXCLUDED_NODES_ANNOTATION: "n1,n2,n3"}
    assert "n3" in decision.note


def test_first_exclusion_without_annotation() -> None:
    decision = decide_exclusions({}, failed_nodes=["n5", "n5", ""], candidates=CLUSTER)
    assert decision.nodes == ("n5",)
    assert decision.warnings == ()


def test_node_failing_again_is_not_duplicated_and_becomes_newest() -> None:
    decision = decide_exclusions(excluded("n1", "n2", "n3"), failed_nodes=["n1"], candidates=CLUSTER)
    assert decision.nodes == ("n2", "n3", "n1")
    assert decision.added == ()


def test_bound_drops_the_oldest() -> None:
    decision = decide_exclusions(
        excluded("n1", "n2", "n3"), failed_nodes=["n4", "n5"], candidates=CLUSTER, limit=3
    )
    assert decision.nodes == ("n3", "n4", "n5")
    assert decision.dropped_for_limit == ("n1", "n2")
    assert "at most 3" in decision.note


def test_default_bound_applies() -> None:
    current = [f"n{i}" for i in range(8)]
    decision = decide_exclusions(excluded(*current), failed_nodes=["n8"], candidates=CLUSTER)
    assert decision.nodes == (*current[1:], "n8")


def test_limit_zero_excludes_nothing() -> None:
    decision = decide_exclusions({}, failed_nodes=["n1"], candidates=CLUSTER, limit=0)
    assert decision.nodes == ()
    assert decision.added == ()
    assert decision.annotation_patch() == {EXCLUDED_NODES_ANNOTATION: None}


def test_negative_limit_or_min_nodes_is_an_error() -> None:
    with pytest.raises(ValueError, match="limit"):
        decide_exclusions({}, failed_nodes=[], candidates=CLUSTER, limit=-1)
    with pytest.raises(ValueError, match="min_nodes"):
        decide_exclusions({}, failed_nodes=[], candidates=CLUSTER, min_nodes=-1)


def test_exclusion_that_leaves_no_candidate_drops_the_oldest_candidate_exclusions() -> None:
    # n0 is no longer a candidate (say, cordoned): keeping it excluded costs nothing.
    decision = decide_exclusions(
        excluded("n0", "n1", "n2"), failed_nodes=["n3"], candidates={"n1", "n2", "n3"}, min_nodes=1
    )
    assert decision.nodes == ("n0", "n2", "n3")
    assert decision.dropped_for_capacity == ("n1",)
    assert "n1" in decision.note
    assert "no node would be left" in decision.note


def test_workload_needing_several_nodes_keeps_enough_of_them() -> None:
    decision = decide_exclusions(
        excluded("a", "b"), failed_nodes=["c"], candidates={"a", "b", "c", "d"}, min_nodes=3
    )
    assert decision.nodes == ("c",)
    assert decision.dropped_for_capacity == ("a", "b")


def test_only_failed_node_can_host_so_it_is_not_excluded() -> None:
    decision = decide_exclusions({}, failed_nodes=["n1"], candidates={"n1"})
    assert decision.nodes == ()
    assert decision.added == ()
    assert decision.dropped_for_capacity == ("n1",)
    assert decision.annotation_patch() == {EXCLUDED_NODES_ANNOTATION: None}


def test_when_no_node_can_host_anyway_exclusions_are_kept() -> None:
    decision = decide_exclusions(excluded("n1"), failed_nodes=["n2"], candidates=set(), min_nodes=1)
    assert decision.nodes == ("n1", "n2")
    assert decision.dropped_for_capacity == ()


def test_enough_candidates_left_means_nothing_is_dropped() -> None:
    decision = decide_exclusions(excluded("n1"), failed_nodes=["n2"], candidates={"n1", "n2", "n3"})
    assert decision.nodes == ("n1", "n2")
    assert decision.dropped_for_capacity == ()
    assert "no longer" not in decision.note


def test_opt_out_excludes_nothing_and_clears_the_annotation() -> None:
    annotations = {NODE_EXCLUSION_ANNOTATION: "false", **excluded("n1")}
    decision = decide_exclusions(annotations, failed_nodes=["n2"], candidates=CLUSTER)
    assert not decision.enabled
    assert decision.nodes == ()
    assert decision.note == ""
    assert decision.annotation_patch() == {EXCLUDED_NODES_ANNOTATION: None}


@pytest.mark.parametrize(
    ("value", "enabled"), [("false", False), (" False ", False), ("true", True), ("TRUE", True)]
)
def test_opt_out_values(value: str, enabled: bool) -> None:
    assert exclusion_enabled({NODE_EXCLUSION_ANNOTATION: value}) == (enabled, None)


def test_malformed_opt_out_keeps_exclusion_on_with_a_warning() -> None:
    on, warning = exclusion_enabled({NODE_EXCLUSION_ANNOTATION: "nope"})
    assert on
    assert warning is not None and NODE_EXCLUSION_ANNOTATION in warning
    decision = decide_exclusions({NODE_EXCLUSION_ANNOTATION: "nope"}, failed_nodes=["n1"], candidates=CLUSTER)
    assert decision.nodes == ("n1",)
    assert decision.warnings == (warning,)


def test_malformed_list_is_treated_as_empty_with_a_warning() -> None:
    decision = decide_exclusions(
        {EXCLUDED_NODES_ANNOTATION: "n1,Not_A_Node"}, failed_nodes=["n2"], candidates=CLUSTER
    )
    assert decision.nodes == ("n2",)
    assert len(decision.warnings) == 1
    assert EXCLUDED_NODES_ANNOTATION in decision.warnings[0]


@pytest.mark.parametrize(
    ("value", "nodes"),
    [
        (None, ()),
        ("", ()),
        ("n1", ("n1",)),
        (" n1 , node-2.example.com ", ("n1", "node-2.example.com")),
        ("n1,n1,n2", ("n1", "n2")),
        ("n1,,n2,", ("n1", "n2")),
    ],
)
def test_parse_well_formed(value: str | None, nodes: tuple[str, ...]) -> None:
    assert parse_excluded_nodes(value) == (nodes, None)


@pytest.mark.parametrize("value", ['["n1"]', "UPPER", "a b", "-n1", "n1.", "x" * 254, "n1;n2"])
def test_parse_malformed(value: str) -> None:
    nodes, warning = parse_excluded_nodes(value)
    assert nodes == ()
    assert warning is not None


_names = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?(\.[a-z0-9]{1,5})?\Z")


@given(st.lists(_names, max_size=10, unique=True))
def test_format_then_parse_round_trips(nodes: list[str]) -> None:
    assert parse_excluded_nodes(format_excluded_nodes(nodes)) == (tuple(nodes), None)


_pool = st.sampled_from([f"n{i}" for i in range(12)])


@given(
    current=st.lists(_pool, max_size=10, unique=True),
    failed=st.lists(_pool | st.just(""), max_size=4),
    candidates=st.sets(_pool, max_size=12),
    limit=st.integers(0, 10),
    min_nodes=st.integers(0, 4),
)
def test_decision_invariants(
    current: list[str], failed: list[str], candidates: set[str], limit: int, min_nodes: int
) -> None:
    decision = decide_exclusions(
        excluded(*current), failed_nodes=failed, candidates=candidates, limit=limit, min_nodes=min_nodes
    )
    nodes = decision.nodes
    assert len(nodes) <= limit
    assert len(set(nodes)) == len(nodes)
    assert set(nodes) <= set(current) | set(failed)
    assert "" not in nodes
    if len(candidates) >= min_nodes:
        assert len(candidates - set(nodes)) >= min_nodes
    # Whatever was dropped for capacity was a candidate, and nothing was dropped needlessly.
    assert set(decision.dropped_for_capacity) <= candidates
    if decision.dropped_for_capacity:
        assert len(candidates - set(nodes)) == min_nodes
    # Each newly failed node is excluded unless one of the two rules dropped it.
    for node in set(failed) - {""}:
        dropped = set(decision.dropped_for_limit) | set(decision.dropped_for_capacity)
        assert node in nodes or node in dropped
