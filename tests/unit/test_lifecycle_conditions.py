"""Condition helpers: metav1.Condition semantics, above all when lastTransitionTime moves."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from services.lifecycle.conditions import (
    clear_condition,
    condition_status,
    find_condition,
    is_true,
    set_condition,
    transition_time,
    truncate,
)
from shared.kubetime import as_utc, format_kube_time, parse_kube_time

T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
LATER = T0 + timedelta(minutes=5)


def one(status: str = "True", reason: str = "Resuming", at: datetime = T0) -> list[dict[str, object]]:
    return set_condition([], ctype="QuotaReserved", status=status, reason=reason, message="m", now=at)


def test_a_new_condition_gets_the_transition_time_and_generation() -> None:
    conds = set_condition(
        [],
        ctype="QuotaReserved",
        status="True",
        reason="Resuming",
        message="Suspend is false",
        now=T0,
        observed_generation=3,
    )
    assert conds == [
        {
            "type": "QuotaReserved",
            "status": "True",
            "lastTransitionTime": "2025-03-01T12:00:00Z",
            "reason": "Resuming",
            "message": "Suspend is false",
            "observedGeneration": 3,
        }
    ]


def test_the_transition_time_moves_only_when_the_status_changes() -> None:
    conds = one()
    same = set_condition(
        conds, ctype="QuotaReserved", status="True", reason="Other", message="new", now=LATER
    )
    assert same[0]["lastTransitionTime"] == "2025-03-01T12:00:00Z"
    assert (same[0]["reason"], same[0]["message"]) == ("Other", "new")
    changed = set_condition(
        same, ctype="QuotaReserved", status="False", reason="Other", message="new", now=LATER
    )
    assert changed[0]["lastTransitionTime"] == "2025-03-01T12:05:00Z"


def test_an_explicit_transition_time_is_used_on_change_only() -> None:
    marked = T0 - timedelta(seconds=42)
    conds = set_condition(
        [], ctype="Unhealthy", status="True", reason="X", message="", now=T0, transition_at=marked
    )
    assert transition_time(conds, "Unhealthy") == marked
    again = set_condition(
        conds, ctype="Unhealthy", status="True", reason="X", message="", now=LATER, transition_at=LATER
    )
    assert transition_time(again, "Unhealthy") == marked


def test_an_unreadable_transition_time_is_repaired_once() -> None:
    broken = [
        {
            "type": "QuotaReserved",
            "status": "True",
            "reason": "R",
            "message": "",
            "lastTransitionTime": "yesterday",
        }
    ]
    fixed = set_condition(broken, ctype="QuotaReserved", status="True", reason="R", message="", now=LATER)
    assert transition_time(fixed, "QuotaReserved") == LATER
    kept = set_condition(
        fixed, ctype="QuotaReserved", status="True", reason="R", message="", now=LATER + timedelta(hours=1)
    )
    assert transition_time(kept, "QuotaReserved") == LATER


def test_other_conditions_are_kept_in_order_and_duplicates_dropped() -> None:
    conds: list[object] = [
        *one(),
        {
            "type": "PodsReady",
            "status": "False",
            "reason": "R",
            "message": "",
            "lastTransitionTime": "2025-03-01T12:00:00Z",
        },
        {
            "type": "QuotaReserved",
            "status": "False",
            "reason": "dup",
            "message": "",
            "lastTransitionTime": "2025-03-01T12:00:00Z",
        },
        "not a condition",
    ]
    result = set_condition(conds, ctype="QuotaReserved", status="True", reason="Z", message="", now=LATER)
    assert [c["type"] for c in result] == ["QuotaReserved", "PodsReady"]
    assert result[0]["reason"] == "Z"


def test_clear_flips_only_a_true_condition() -> None:
    cleared = clear_condition(one(), ctype="QuotaReserved", reason="Suspended", message="", now=LATER)
    assert (cleared[0]["status"], cleared[0]["reason"], cleared[0]["lastTransitionTime"]) == (
        "False",
        "Suspended",
        "2025-03-01T12:05:00Z",
    )
    untouched = clear_condition(
        cleared, ctype="QuotaReserved", reason="Other", message="x", now=LATER + timedelta(hours=1)
    )
    assert untouched == cleared
    assert clear_condition([], ctype="QuotaReserved", reason="Other", message="", now=LATER) == []


def test_readers_tolerate_malformed_entries() -> None:
    conds = [None, 3, {"type": "Unhealthy", "status": 7}, {"type": "PodsReady", "status": "True"}]
    assert find_condition(conds, "Missing") is None
    assert condition_status(conds, "Unhealthy") is None
    assert is_true(conds, "PodsReady")
    assert transition_time(conds, "PodsReady") is None
    assert condition_status(None, "PodsReady") is None


def test_times_are_utc_whole_seconds_on_the_wire() -> None:
    naive = datetime(2025, 3, 1, 12, 0, 0, 999_999)
    assert format_kube_time(naive) == "2025-03-01T12:00:00Z"
    assert as_utc(naive).tzinfo is UTC
    assert truncate(naive) == T0
    assert parse_kube_time("2025-03-01T13:00:00+01:00") == T0
    assert parse_kube_time("2025-03-01T12:00:00.5Z") == T0 + timedelta(milliseconds=500)
    assert parse_kube_time("nonsense") is None
    assert parse_kube_time(None) is None


@given(
    statuses=st.lists(st.sampled_from(["True", "False", "Unknown"]), min_size=1, max_size=10),
    gaps=st.lists(st.integers(min_value=0, max_value=3600), min_size=10, max_size=10),
)
def test_transition_time_is_the_time_of_the_last_status_change(statuses: list[str], gaps: list[int]) -> None:
    conds: list[dict[str, object]] = []
    now = T0
    last_change = None
    previous = None
    for status, gap in zip(statuses, gaps, strict=False):
        now += timedelta(seconds=gap)
        before = copy.deepcopy(conds)
        conds = set_condition(conds, ctype="Unhealthy", status=status, reason="R", message="", now=now)
        assert before == [] or before[0]["type"] == "Unhealthy", "input untouched"
        if status != previous:
            last_change = now
        previous = status
        assert transition_time(conds, "Unhealthy") == last_change
