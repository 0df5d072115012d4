"""A failed pod's node state (docs/failures.md#node-state): autopilot's list of lost nodes, how
health reads a pod's node state from it, and the classification that follows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.autopilot.nodestate import (
    KEEP_DELETED,
    LostNodes,
    expire,
    lost_state,
    node_state_verdict,
    observe,
)
from services.health.rules import evaluate
from services.health.state import (
    AppWrapperHealth,
    apply,
    node_changes,
    node_state_of,
    touched_by,
    with_node_verdicts,
)
from services.watcher.translate import node_observation
from shared.messages import NODE_STATE_RESOURCE, LostNode, NodeObservation, NodeVerdict, Verdict
from tests.unit.test_health_rules import (
    MIN,
    SEC,
    T0,
    aw_obs,
    component,
    failed_pod,
    fold,
    running,
)

LEEWAY = timedelta(minutes=1)


def node(
    name: str,
    ready: str = "True",
    *,
    since: datetime | None = T0,
    at: datetime = T0,
    deleted: bool = False,
) -> NodeObservation:
    return NodeObservation(
        name=name,
        observed_at=at,
        deleted=deleted,
        ready=ready == "True",
        ready_status=ready,
        ready_since=since,
    )


def fold_nodes(observations: Sequence[NodeObservation]) -> LostNodes:
    state = LostNodes()
    for observation in observations:
        state = observe(state, observation)
    return state


def lost_verdict(*entries: LostNode, at: datetime = T0) -> NodeVerdict:
    return NodeVerdict(resource=NODE_STATE_RESOURCE, decided_at=at, lost_nodes=entries)


# ------------------------------------------------------------------ the watcher's side


def test_the_watcher_reports_the_ready_conditions_status_and_transition_time() -> None:
    obj = {
        "metadata": {"name": "n1"},
        "status": {
            "conditions": [
                {"type": "MemoryPressure", "status": "False"},
                {"type": "Ready", "status": "Unknown", "lastTransitionTime": "2026-03-01T12:00:00Z"},
            ]
        },
    }
    obs = node_observation(obj, deleted=False, now=T0 + MIN)
    assert (obs.ready, obs.ready_status, obs.ready_since) == (False, "Unknown", T0)
    bare = node_observation({"metadata": {"name": "n2"}}, deleted=False, now=T0)
    assert (bare.ready, bare.ready_status, bare.ready_since) == (False, "", None)


# ------------------------------------------------------------------ the reducer (autopilot)


@pytest.mark.parametrize(
    ("observation", "expected"),
    [
        (node("n1", "True"), None),
        (node("n1", "False"), "NotReady"),
        (node("n1", "", since=None), "NotReady"),
        (node("n1", "Unknown"), "Unknown"),
        (node("n1", "True", deleted=True), "Deleted"),
    ],
    ids=["ready", "not-ready", "no-condition", "unknown", "deleted"],
)
def test_lost_state_of_an_observation(observation: NodeObservation, expected: str | None) -> None:
    assert lost_state(observation) == expected


def test_a_node_is_listed_while_lost_and_leaves_the_list_when_ready_again() -> None:
    state = fold_nodes(
        [node("n1"), node("n2", "False", since=T0 + SEC), node("n3", "Unknown", since=T0 + 2 * SEC)]
    )
    assert state.listed() == (
        LostNode(node="n2", state="NotReady", since=T0 + SEC),
        LostNode(node="n3", state="Unknown", since=T0 + 2 * SEC),
    )
    # No memory of having been NotReady once Ready again.
    assert observe(state, node("n2", "True", since=T0 + MIN)).listed() == (
        LostNode(node="n3", state="Unknown", since=T0 + 2 * SEC),
    )


def test_an_unchanged_state_is_the_same_value_and_keeps_its_since() -> None:
    state = fold_nodes([node("n1", "False", since=None, at=T0)])
    # A later observation of the same state (labels changed, say) changes nothing.
    assert observe(state, node("n1", "False", since=None, at=T0 + MIN)) is state
    assert state.entries["n1"].since == T0
    assert observe(LostNodes(), node("n1")) == LostNodes()


def test_a_deleted_node_is_dated_by_its_tombstone_and_forgotten_an_hour_later() -> None:
    state = fold_nodes([node("n1", "False"), node("n1", deleted=True, at=T0 + MIN)])
    assert state.listed() == (LostNode(node="n1", state="Deleted", since=T0 + MIN),)
    assert expire(state, T0 + MIN + KEEP_DELETED - SEC) is state
    assert expire(state, T0 + MIN + KEEP_DELETED) == LostNodes()
    # A NotReady node is never forgotten by time: only its recovery removes it.
    lasting = fold_nodes([node("n2", "False")])
    assert expire(lasting, T0 + 10 * KEEP_DELETED) is lasting
    # A node of the same name created again is Ready and leaves the list.
    assert observe(state, node("n1", "True", at=T0 + 2 * MIN)) == LostNodes()


def test_the_verdict_carries_the_complete_sorted_list_and_no_sets() -> None:
    state = fold_nodes([node("b", "False"), node("a", deleted=True)])
    verdict = node_state_verdict(state, T0)
    assert verdict.resource == NODE_STATE_RESOURCE
    assert [e.node for e in verdict.lost_nodes] == ["a", "b"]
    assert (verdict.no_execute, verdict.no_schedule, verdict.prefer_no_schedule) == ((), (), ())


readiness = st.sampled_from(["True", "False", "Unknown", ""])
events = st.lists(
    st.tuples(st.sampled_from(["n1", "n2", "n3"]), readiness, st.booleans(), st.integers(0, 100)), max_size=20
)


@given(events)
def test_replaying_the_latest_observation_of_each_node_gives_the_same_list(
    history: list[tuple[str, str, bool, int]],
) -> None:
    """What a restarted replica rebuilds from the stream (the last message per node) lists the
    same nodes in the same states as a replica that saw every message."""
    observations = [
        node(name, ready, since=T0 + timedelta(seconds=t), at=T0 + timedelta(seconds=t), deleted=deleted)
        for name, ready, deleted, t in history
    ]
    latest = {o.name: o for o in observations}
    full = fold_nodes(observations)
    replayed = fold_nodes(list(latest.values()))
    # (Their ``since`` may differ only where a state repeats with another transition time, which a
    # node's condition never does.)
    assert {n: e.state for n, e in full.entries.items()} == {n: e.state for n, e in replayed.entries.items()}


# ------------------------------------------------------------------ a pod's node state (health)


def test_node_state_of_a_failed_pod() -> None:
    verdict = lost_verdict(
        LostNode(node="gone", state="Deleted", since=T0),
        LostNode(node="late", state="NotReady", since=T0 + 5 * MIN),
        LostNode(node="silent", state="Unknown", since=T0 + 30 * SEC),
    )
    failed_at = T0 + SEC
    assert node_state_of(verdict, "gone", failed_at, LEEWAY) == "Deleted"
    # Lost within the leeway after the failure: the node controller noticed late.
    assert node_state_of(verdict, "silent", failed_at, LEEWAY) == "Unknown"
    # Lost well after the failure: the node was Ready when the pod failed.
    assert node_state_of(verdict, "late", failed_at, LEEWAY) == "Ready"
    assert node_state_of(verdict, "fine", failed_at, LEEWAY) == "Ready"
    # Unknown: no verdict held (autopilot does not publish it), or no node.
    assert node_state_of(None, "gone", failed_at, LEEWAY) == ""
    assert node_state_of(verdict, "", failed_at, LEEWAY) == ""


def test_a_node_state_verdict_affects_only_appwrappers_with_a_failed_pod_on_a_node_that_moved() -> None:
    state = fold([aw_obs(), failed_pod("p0", node="n1", finished_at=T0 + MIN), *running("p1", node="n2")])
    before = lost_verdict(LostNode(node="n9", state="NotReady", since=T0))
    on_failed = lost_verdict(*before.lost_nodes, LostNode(node="n1", state="Deleted", since=T0))
    on_running = lost_verdict(*before.lost_nodes, LostNode(node="n2", state="Deleted", since=T0))
    assert touched_by(state, node_changes(before, on_failed), on_failed)
    assert touched_by(state, node_changes(None, on_failed), on_failed)
    assert not touched_by(state, node_changes(before, on_running), on_running)
    assert not touched_by(state, node_changes(before, before), before)


# ------------------------------------------------------------------ the classification


def judged(health: AppWrapperHealth, now: datetime) -> Verdict:
    decision = evaluate(health, now)
    assert decision.verdict is not None
    return decision.verdict


def failed_on_lost_node(state: str, *, since: datetime) -> AppWrapperHealth:
    """Two pods; p0 failed with exit code 1 at T0 + 1 min on node n1, which is ``state``."""
    return fold(
        [
            aw_obs(),
            failed_pod("p0", node="n1", finished_at=T0 + MIN),
            *running("p1", node="n2"),
            lost_verdict(LostNode(node="n1", state=state, since=since), at=since),  # type: ignore[arg-type]
        ]
    )


@pytest.mark.parametrize("state", ["NotReady", "Unknown", "Deleted"])
def test_a_pod_failed_with_its_node_is_transient_node_lost(state: str) -> None:
    verdict = judged(failed_on_lost_node(state, since=T0 + MIN - SEC), T0 + 3 * MIN)
    assert (verdict.state, verdict.reason) == ("Unhealthy", "FoundFailedPods")
    assert (verdict.failure_class, verdict.failure_code, verdict.fault_kind) == (
        "Transient",
        "NodeLost",
        "Infrastructure",
    )
    assert verdict.nodes == ("n1",)
    assert not verdict.terminal
    assert "pod p0 failed with NodeLost: Transient by failure table row 0" in verdict.message


def test_a_node_lost_well_after_the_pod_failed_leaves_the_failure_its_own() -> None:
    # The kubelet of n1 went quiet five minutes after the crash: the crash is the application's.
    verdict = judged(failed_on_lost_node("Unknown", since=T0 + 6 * MIN), T0 + 7 * MIN)
    assert (verdict.failure_class, verdict.failure_code) == ("Unknown", "ExitCode:1")


def test_without_a_node_state_verdict_the_row_does_not_match() -> None:
    health = fold([aw_obs(), failed_pod("p0", node="n1", finished_at=T0 + MIN), *running("p1", node="n2")])
    verdict = judged(health, T0 + 3 * MIN)
    assert (verdict.failure_class, verdict.failure_code) == ("Unknown", "ExitCode:1")


def test_a_failed_job_whose_pod_lost_its_node_is_transient_at_once() -> None:
    health = fold(
        [
            lost_verdict(LostNode(node="n1", state="Deleted", since=T0 + 30 * SEC)),
            aw_obs(),
            *running("p1", node="n2"),
            component(failed=True, status_message="BackoffLimitExceeded", observed_at=T0 + MIN),
            failed_pod("p0", node="n1", finished_at=T0 + MIN),
        ]
    )
    verdict = judged(health, T0 + MIN)
    assert (verdict.state, verdict.reason) == ("Unhealthy", "FailedComponent")
    assert (verdict.failure_class, verdict.failure_code) == ("Transient", "NodeLost")


def test_a_node_state_that_arrives_within_the_grace_period_reclassifies_the_failure() -> None:
    """The decision is taken on the node state held when it is taken."""
    health = fold([aw_obs(), failed_pod("p0", node="n1", finished_at=T0 + MIN), *running("p1", node="n2")])
    pending = evaluate(health, T0 + MIN + SEC)
    assert pending.verdict is not None
    assert (pending.verdict.state, pending.verdict.failure_class) == ("Healthy", "Unknown")
    later = apply(pending.state, lost_verdict(LostNode(node="n1", state="Deleted", since=T0 + MIN + 2 * SEC)))
    regraded = evaluate(later, T0 + MIN + 3 * SEC)
    assert regraded.verdict is not None
    assert (regraded.verdict.state, regraded.verdict.failure_class, regraded.verdict.failure_code) == (
        "Healthy",
        "Transient",
        "NodeLost",
    )


def test_the_leeway_comes_from_the_operators_settings() -> None:
    health = failed_on_lost_node("NotReady", since=T0 + 3 * MIN)
    assert judged(health, T0 + 4 * MIN).failure_code == "ExitCode:1"
    wider = replace(health, failures=replace(health.failures, node_lost_leeway=timedelta(minutes=5)))
    assert judged(wider, T0 + 4 * MIN).failure_code == "NodeLost"


def test_a_state_takes_the_node_verdicts_it_lacks_before_it_is_judged_and_only_those() -> None:
    """Health applies a node verdict at once only to the AppWrappers it may change; any other
    takes it (and every later one) before it is next judged."""
    state = fold([aw_obs(), *running("p0", node="n1")])
    first = lost_verdict(LostNode(node="n9", state="NotReady", since=T0))
    later = lost_verdict(LostNode(node="n8", state="Deleted", since=T0), at=T0 + MIN)
    assert with_node_verdicts(state, {}) is state
    synced = with_node_verdicts(state, {first.resource: first})
    assert synced.node_verdicts == {first.resource: first}
    assert with_node_verdicts(synced, {first.resource: first}) is synced, "nothing new: the same state"
    assert with_node_verdicts(synced, {later.resource: later}).node_verdicts == {later.resource: later}
    # An older decision than the one held is not taken.
    newer = with_node_verdicts(state, {later.resource: later})
    assert with_node_verdicts(newer, {first.resource: first}).node_verdicts == {later.resource: later}
    # The same as applying them one by one as they came.
    assert with_node_verdicts(state, {later.resource: later}) == apply(apply(state, first), later)


def test_the_nodes_a_verdict_moved_are_computed_once_and_decide_what_it_touches() -> None:
    state = fold([aw_obs(), failed_pod("p0", node="n1", finished_at=T0 + MIN), *running("p1", node="n2")])
    before = lost_verdict(LostNode(node="n9", state="NotReady", since=T0))
    on_failed = lost_verdict(*before.lost_nodes, LostNode(node="n1", state="Deleted", since=T0))
    assert node_changes(before, on_failed) == {"n1"}
    assert node_changes(None, on_failed) == {"n1", "n9"}
    assert node_changes(before, before) == frozenset()
    assert touched_by(state, node_changes(before, on_failed), on_failed)
    assert not touched_by(state, frozenset({"n2"}), on_failed), "a running pod's node: no class to change"
    assert not touched_by(state, frozenset(), on_failed)
