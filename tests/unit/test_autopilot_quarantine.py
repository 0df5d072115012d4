"""Node quarantine decisions: counting, de-duplication, threshold, window, cap, expiry, dry run."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.autopilot.marks import NodeMarks, NodeState, due_marks, mark_patch
from services.autopilot.quarantine import (
    DRY_RUN,
    HELD,
    QUARANTINED,
    RELEASED,
    QuarantineBook,
    QuarantinePolicy,
    adopt,
    blamed_nodes,
    entries_of,
    failure_counts,
    observe,
    quarantine_verdict,
    record,
    settle,
)
from shared.messages import QUARANTINE_RESOURCE, ObjectRef, Verdict

T0 = datetime(2030, 1, 1, tzinfo=UTC)
POLICY = QuarantinePolicy(
    threshold=3, window=timedelta(minutes=10), duration=timedelta(minutes=30), max_share=0.5
)
NODES = 10  # cap 5 with POLICY


def fault(
    workload: str,
    nodes: Sequence[str],
    at: datetime,
    *,
    attempt: int = 0,
    kind: str = "Infrastructure",
    state: str = "Unhealthy",
) -> Verdict:
    return Verdict(
        ref=ObjectRef(namespace="ns", name=workload, uid=f"uid-{workload}"),
        state=state,  # type: ignore[arg-type]
        nodes=tuple(nodes),
        resetting_count=attempt,
        decided_at=at,
        fault_kind=kind,
        failure_class="Transient",
        failure_code="ExitCode:1",
    )


def fold(
    verdicts: Sequence[Verdict],
    policy: QuarantinePolicy = POLICY,
    nodes: int = NODES,
    book: QuarantineBook | None = None,
) -> QuarantineBook:
    book = book or QuarantineBook()
    for verdict in verdicts:
        book = observe(book, verdict, policy, verdict.decided_at, nodes)
    return book


def three_faults(node: str = "bad", start: datetime = T0) -> list[Verdict]:
    return [fault(f"w{i}-{node}", [node], start + timedelta(seconds=i)) for i in range(3)]


def test_a_node_blamed_threshold_times_within_the_window_is_quarantined() -> None:
    book = fold(three_faults())
    entry = book.entries["bad"]
    assert entry.state == QUARANTINED
    assert entry.failures == 3
    assert entry.workloads == ("ns/w0-bad", "ns/w1-bad", "ns/w2-bad")
    assert entry.since == T0 + timedelta(seconds=2)
    assert entry.until == T0 + timedelta(seconds=2) + POLICY.duration
    verdict = quarantine_verdict(book, T0)
    assert verdict.resource == QUARANTINE_RESOURCE
    assert verdict.no_schedule == ("bad",)
    assert verdict.quarantine == entries_of(book)


def test_fewer_failures_than_the_threshold_quarantine_nothing() -> None:
    book = fold(three_faults()[:2])
    assert book.entries == {}
    assert failure_counts(book) == {"bad": 2}


def test_application_faults_and_unclassified_verdicts_blame_no_node() -> None:
    verdicts = [
        fault("a", ["bad"], T0, kind="Application"),
        fault("b", ["bad"], T0, kind=""),
        fault("c", ["bad"], T0, state="Healthy"),
    ]
    assert all(blamed_nodes(v) == () for v in verdicts)
    assert fold(verdicts * 3).failures == {}


def test_a_repeated_verdict_about_the_same_attempt_counts_once() -> None:
    same = fault("w", ["bad"], T0)
    book = fold([same, same, same.model_copy(update={"decided_at": T0 + timedelta(seconds=5), "seq": 2})])
    assert failure_counts(book) == {"bad": 1}
    # The next attempt of the same AppWrapper is a new failure.
    book = fold([fault("w", ["bad"], T0 + timedelta(seconds=6), attempt=1)], book=book)
    assert failure_counts(book) == {"bad": 2}


def test_failures_older_than_the_window_do_not_count() -> None:
    spaced = [fault(f"w{i}", ["bad"], T0 + i * timedelta(minutes=6)) for i in range(3)]
    book = fold(spaced)
    assert book.entries == {}
    assert failure_counts(book) == {"bad": 2}


def test_quarantine_ends_after_its_duration_and_used_failures_no_longer_count() -> None:
    policy = QuarantinePolicy(
        threshold=3, window=timedelta(hours=1), duration=timedelta(minutes=10), max_share=0.5
    )
    book = fold(three_faults(), policy)
    until = book.entries["bad"].until
    assert until is not None
    just_before = settle(book, policy, until - timedelta(seconds=1), NODES)
    assert just_before.quarantined() == {"bad"}
    after = settle(book, policy, until, NODES)
    assert after.quarantined() == frozenset()
    assert after.entries["bad"].state == RELEASED
    # The failures the quarantine used up do not count again, even delivered once more.
    again = fold([*three_faults(), fault("x", ["bad"], until + timedelta(seconds=1))], policy, book=after)
    assert again.entries["bad"].state == RELEASED
    assert failure_counts(again) == {"bad": 1}
    # Once they have all left the window, the release is forgotten.
    assert "bad" not in settle(after, policy, T0 + timedelta(hours=1, seconds=2), NODES).entries


def test_the_cap_quarantines_the_worst_nodes_and_holds_the_rest() -> None:
    # 4 nodes at 50 %: two places. "c" has four failures, "a" and "b" three, "a" due first.
    verdicts = [*three_faults("a"), *three_faults("b", T0 + timedelta(seconds=10))]
    verdicts += [fault(f"c{i}", ["c"], T0 + timedelta(seconds=20 + i)) for i in range(4)]
    verdicts.sort(key=lambda v: v.decided_at)
    # Fold them at once (as a replica that catches up does): the worst go first.
    book = QuarantineBook()
    for verdict in verdicts:
        book = record(book, verdict, POLICY, verdict.decided_at)
    book = settle(book, POLICY, T0 + timedelta(seconds=30), 4)
    assert book.quarantined() == {"c", "a"}
    assert book.entries["b"].state == HELD
    assert book.entries["b"].until is None
    assert quarantine_verdict(book, T0).no_schedule == ("a", "c")
    # When a place frees up, the held node takes it.
    until = book.entries["a"].until
    assert until is not None
    later = settle(book, POLICY, until, 4)
    assert later.quarantined() == set()  # b's failures left the window meanwhile
    assert "b" not in later.entries


def test_a_held_node_takes_a_freed_place_while_it_is_still_due() -> None:
    policy = QuarantinePolicy(
        threshold=3, window=timedelta(hours=2), duration=timedelta(minutes=1), max_share=0.25
    )
    book = fold([*three_faults("a"), *three_faults("b", T0 + timedelta(seconds=10))], policy, nodes=4)
    assert book.quarantined() == {"a"}
    assert book.held() == {"b"}
    book = settle(book, policy, T0 + timedelta(minutes=2), 4)
    assert book.quarantined() == {"b"}
    assert book.entries["a"].state == RELEASED


def test_dry_run_reports_but_keeps_nobody_off() -> None:
    policy = QuarantinePolicy(
        threshold=3, window=timedelta(minutes=10), duration=timedelta(minutes=30), max_share=0.5, dry_run=True
    )
    book = fold(three_faults(), policy)
    assert book.entries["bad"].state == DRY_RUN
    assert book.quarantined() == frozenset()
    assert quarantine_verdict(book, T0).no_schedule == ()


def test_the_cap_rounds_down_but_allows_one_node_of_a_small_cluster_and_never_the_only_one() -> None:
    default = QuarantinePolicy()  # a share of 0.1
    assert default.cap(1) == 0
    assert default.cap(2) == 1
    assert default.cap(4) == 1
    assert default.cap(25) == 2
    assert QuarantinePolicy(max_share=0.3).cap(10) == 3
    assert QuarantinePolicy(max_share=0).cap(50) == 0
    book = fold(three_faults(), nodes=1)
    assert book.quarantined() == frozenset()
    assert book.entries["bad"].state == HELD


def test_adopting_the_stored_entries_restores_the_quarantine_without_recounting() -> None:
    original = fold(three_faults())
    # A replica that starts replays the same verdicts and the stored entries.
    restarted = fold(three_faults(), nodes=0)  # before it knows the nodes: nothing decided
    assert restarted.quarantined() == frozenset()
    restarted = adopt(restarted, entries_of(original))
    assert restarted.entries == original.entries
    assert failure_counts(restarted) == {}
    assert settle(restarted, POLICY, T0 + timedelta(minutes=1), NODES).quarantined() == {"bad"}


# ------------------------------------------------------------------ properties

nodes_st = st.sampled_from(["n0", "n1", "n2", "n3", "n4", "n5"])
verdict_st = st.builds(
    lambda w, ns, sec, attempt, kind: fault(
        f"w{w}", ns, T0 + timedelta(seconds=sec), attempt=attempt, kind=kind
    ),
    st.integers(0, 6),
    st.lists(nodes_st, min_size=1, max_size=3),
    st.integers(0, 3600),
    st.integers(0, 2),
    st.sampled_from(["Infrastructure", "Infrastructure", "Application", ""]),
)
policy_st = st.builds(
    QuarantinePolicy,
    threshold=st.integers(1, 4),
    window=st.sampled_from([timedelta(minutes=5), timedelta(minutes=20), timedelta(hours=2)]),
    duration=st.sampled_from([timedelta(minutes=1), timedelta(minutes=10)]),
    max_share=st.sampled_from([0.0, 0.2, 0.5, 1.0]),
    dry_run=st.booleans(),
)


@settings(max_examples=300)
@given(st.lists(verdict_st, max_size=30), policy_st, st.integers(0, 12))
def test_never_more_than_the_cap_and_never_an_expired_quarantine(
    verdicts: list[Verdict], policy: QuarantinePolicy, node_count: int
) -> None:
    book = QuarantineBook()
    for verdict in sorted(verdicts, key=lambda v: v.decided_at):
        book = observe(book, verdict, policy, verdict.decided_at, node_count)
        assert len(book.active()) <= policy.cap(node_count)
        assert book.clock is not None
        for entry in book.entries.values():
            if entry.state in (QUARANTINED, DRY_RUN):
                assert entry.until is not None and entry.until > book.clock
                assert entry.failures >= policy.threshold
            assert entry.since <= book.clock
    if policy.dry_run:
        assert book.quarantined() == frozenset()
    assert set(quarantine_verdict(book, T0).no_schedule) == book.quarantined()


@settings(max_examples=300)
@given(st.lists(verdict_st, max_size=30), policy_st, st.data())
def test_delivering_verdicts_again_changes_nothing(
    verdicts: list[Verdict], policy: QuarantinePolicy, data: st.DataObject
) -> None:
    ordered = sorted(verdicts, key=lambda v: v.decided_at)
    once = fold(ordered, policy)
    # Each verdict delivered again, right after itself, any number of times.
    repeats = data.draw(st.lists(st.integers(0, 2), min_size=len(ordered), max_size=len(ordered)))
    doubled = [v for v, n in zip(ordered, repeats, strict=True) for _ in range(1 + n)]
    assert fold(doubled, policy).entries == once.entries
    assert failure_counts(fold(doubled, policy)) == failure_counts(once)


@settings(max_examples=200)
@given(st.lists(verdict_st, max_size=30), policy_st, st.integers(0, 7200))
def test_every_quarantine_ends_once_its_duration_has_passed(
    verdicts: list[Verdict], policy: QuarantinePolicy, later: int
) -> None:
    book = fold(sorted(verdicts, key=lambda v: v.decided_at), policy, nodes=12)
    now = T0 + timedelta(hours=1, seconds=later) + policy.duration
    moved = settle(book, policy, now, 12)
    for node in book.active():
        entry = book.entries[node]
        assert entry.until is not None
        if entry.until <= now:
            # Released, forgotten, or quarantined again from now on: never the old quarantine.
            after = moved.entries.get(node)
            assert after is None or node not in moved.active() or after.since == now


# ------------------------------------------------------------------ marks on the Node objects

MARKS = NodeMarks(label="respawn.dev/quarantined", taint="respawn.dev/quarantined")
OTHER_TAINT = {"key": "gpu", "value": "x", "effect": "NoSchedule"}
MARK_TAINT = {"key": "respawn.dev/quarantined", "value": "true", "effect": "NoSchedule"}


def test_marks_are_added_to_quarantined_nodes_and_removed_from_the_others() -> None:
    nodes: dict[str, NodeState] = {
        "bad": ({}, (OTHER_TAINT,)),
        "done": ({"respawn.dev/quarantined": "true"}, (MARK_TAINT,)),
        "half": ({"respawn.dev/quarantined": "true"}, ()),
        "fine": ({}, ()),
    }
    assert due_marks(MARKS, frozenset({"bad", "half"}), nodes) == [
        ("bad", True),
        ("done", False),
        ("half", True),
    ]
    assert due_marks(NodeMarks(), frozenset({"bad"}), nodes) == []
    # Only the label configured: a node with the label only is complete.
    assert due_marks(NodeMarks(label="respawn.dev/quarantined"), frozenset({"half"}), nodes) == [
        ("done", False)
    ]


def test_the_patch_keeps_other_taints_and_is_guarded_by_the_resource_version() -> None:
    node = {"metadata": {"resourceVersion": "42"}, "spec": {"taints": [OTHER_TAINT, MARK_TAINT]}}
    added = mark_patch(MARKS, {**node, "spec": {"taints": [OTHER_TAINT]}}, True)
    assert added == {
        "metadata": {"resourceVersion": "42", "labels": {"respawn.dev/quarantined": "true"}},
        "spec": {"taints": [OTHER_TAINT, MARK_TAINT]},
    }
    removed = mark_patch(MARKS, node, False)
    assert removed == {
        "metadata": {"resourceVersion": "42", "labels": {"respawn.dev/quarantined": None}},
        "spec": {"taints": [OTHER_TAINT]},
    }
    assert "spec" not in mark_patch(NodeMarks(label="k"), node, True)


def test_mark_keys_must_be_label_keys() -> None:
    from pydantic import ValidationError

    from shared.config import NodeQuarantineConfig

    assert NodeQuarantineConfig(nodeLabel="respawn.dev/quarantined").marks_nodes
    assert not NodeQuarantineConfig().marks_nodes
    with pytest.raises(ValidationError):
        NodeQuarantineConfig(nodeTaint="not a key")
