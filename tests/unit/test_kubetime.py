"""shared.kubetime: the one reader and writer of metav1.Time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.kubetime import as_utc, format_kube_time, parse_kube_time, utcnow

NOW = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


def test_as_utc_reads_naive_times_as_utc_and_converts_other_zones() -> None:
    assert as_utc(datetime(2025, 1, 1, 12, 0)) == NOW
    plus_two = NOW.astimezone(timezone(timedelta(hours=2)))
    converted = as_utc(plus_two)
    assert converted == NOW and converted.tzinfo is UTC


def test_format_is_rfc3339_utc_whole_seconds() -> None:
    assert format_kube_time(NOW.replace(microsecond=999_999)) == "2025-01-01T12:00:00Z"
    assert format_kube_time(NOW.astimezone(timezone(timedelta(hours=-5)))) == "2025-01-01T12:00:00Z"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("2025-01-01T12:00:00Z", NOW),
        ("2025-01-01T14:00:00+02:00", NOW),
        ("2025-01-01T12:00:00", NOW),
        (NOW, NOW),
        ("", None),
        (None, None),
        (12, None),
        ("yesterday", None),
    ],
)
def test_parse_reads_what_the_api_server_writes_and_nothing_else(raw: object, expected: object) -> None:
    assert parse_kube_time(raw) == expected


# metav1.Time is Unix time: nothing before 1970 is ever written.
@given(st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(9999, 1, 1), timezones=st.just(UTC)))
def test_format_then_parse_round_trips_to_the_second(value: datetime) -> None:
    assert parse_kube_time(format_kube_time(value)) == value.replace(microsecond=0)


def test_utcnow_is_aware_utc() -> None:
    assert utcnow().tzinfo is UTC
