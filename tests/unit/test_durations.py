"""Go duration parsing and formatting: Go's own test vectors, error messages and round trips."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.durations import _parse_nanoseconds, format_go_duration, parse_go_duration

NS = 1
US = 1000 * NS
MS = 1000 * US
S = 1000 * MS
MIN = 60 * S
H = 60 * MIN


@pytest.mark.parametrize(
    ("text", "nanoseconds"),
    [
        ("0", 0),
        ("-0", 0),
        ("+0", 0),
        ("5s", 5 * S),
        ("30s", 30 * S),
        ("90s", 90 * S),
        ("1478s", 1478 * S),
        ("-5s", -5 * S),
        ("+5s", 5 * S),
        ("-5m", -5 * MIN),
        ("5.0s", 5 * S),
        ("5.6s", 5 * S + 600 * MS),
        ("5.s", 5 * S),
        (".5s", 500 * MS),
        ("1.004s", S + 4 * MS),
        ("100.00100s", 100 * S + MS),
        ("10ns", 10 * NS),
        ("11us", 11 * US),
        ("12\u00b5s", 12 * US),
        ("12\u03bcs", 12 * US),
        ("300ms", 300 * MS),
        ("15m", 15 * MIN),
        ("16h", 16 * H),
        ("1.5h", H + 30 * MIN),
        ("1h30m", H + 30 * MIN),
        ("10.5s4m", 4 * MIN + 10 * S + 500 * MS),
        ("-2m3.4s", -(2 * MIN + 3 * S + 400 * MS)),
        ("1h2m3s4ms5us6ns", H + 2 * MIN + 3 * S + 4 * MS + 5 * US + 6 * NS),
        ("39h9m14.425s", 39 * H + 9 * MIN + 14 * S + 425 * MS),
        ("52763797000ns", 52763797000 * NS),
        ("0.3333333333333333333h", 20 * MIN),
        ("9007199254740993ns", (1 << 53) + 1),
        ("9223372036854775807ns", (1 << 63) - 1),
        ("9223372036854775.807us", (1 << 63) - 1),
        ("9223372036s854ms775us807ns", (1 << 63) - 1),
        ("-9223372036854775808ns", -(1 << 63)),
        ("-9223372036854775.808us", -(1 << 63)),
        ("-2562047h47m16.854775808s", -(1 << 63)),
        ("0.100000000000000000000h", 6 * MIN),
        ("0.830103483285477580700h", 49 * MIN + 48 * S + 372539827 * NS),
    ],
)
def test_parses_exactly_like_go(text: str, nanoseconds: int) -> None:
    assert _parse_nanoseconds(text) == nanoseconds


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", timedelta(seconds=90)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("1.5h", timedelta(hours=1, minutes=30)),
        ("-5m", timedelta(minutes=-5)),
        ("300ms", timedelta(milliseconds=300)),
        ("0", timedelta(0)),
        ("24h", timedelta(days=1)),
        ("168h", timedelta(days=7)),
        # timedelta has microsecond resolution: nanoseconds are truncated toward zero.
        ("1500ns", timedelta(microseconds=1)),
        ("-1500ns", timedelta(microseconds=-1)),
        ("999ns", timedelta(0)),
    ],
)
def test_parse_returns_timedelta(text: str, expected: timedelta) -> None:
    assert parse_go_duration(text) == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "empty"),
        ("-", "sign without a number"),
        ("+", "sign without a number"),
        ("3", "missing unit"),
        ("00", "missing unit"),
        ("s", "expected a number"),
        (".", "'.' must have digits"),
        ("-.", "'.' must have digits"),
        (".s", "'.' must have digits"),
        ("+.s", "'.' must have digits"),
        ("7d", "no day unit"),
        ("1w", "unknown unit 'w'"),
        ("5 s", "unknown unit ' s'"),
        (" 5s", "expected a number"),
        ("5s ", "unknown unit 's '"),
        ("1S", "unknown unit 'S'"),
        ("1.2.3s", "missing unit"),
        ("\x85\x85", "expected a number"),
        ("9223372036854775808ns", "out of range"),
        ("9223372036854775.808us", "out of range"),
        ("9223372036854ms775us808ns", "out of range"),
        ("-9223372036854775809ns", "out of range"),
        ("3000000h", "out of range"),
    ],
)
def test_rejects_what_go_rejects_with_a_clear_message(text: str, fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_go_duration(text)
    message = str(info.value)
    assert repr(text) in message, "the message must name the bad text"
    assert fragment in message


@pytest.mark.parametrize(
    ("td", "text"),
    [
        (timedelta(0), "0s"),
        (timedelta(microseconds=1), "1\u00b5s"),
        (timedelta(microseconds=1100), "1.1ms"),
        (timedelta(microseconds=2200), "2.2ms"),
        (timedelta(milliseconds=300), "300ms"),
        (timedelta(milliseconds=3300), "3.3s"),
        (timedelta(seconds=90), "1m30s"),
        (timedelta(minutes=4, seconds=5), "4m5s"),
        (timedelta(minutes=4, seconds=5, milliseconds=1), "4m5.001s"),
        (timedelta(hours=5, minutes=6, seconds=7, milliseconds=1), "5h6m7.001s"),
        (timedelta(minutes=8, microseconds=1), "8m0.000001s"),
        (timedelta(hours=1, minutes=30), "1h30m0s"),
        (timedelta(days=7), "168h0m0s"),
        (timedelta(minutes=-5), "-5m0s"),
        (timedelta(microseconds=-1500), "-1.5ms"),
    ],
)
def test_formats_like_go(td: timedelta, text: str) -> None:
    assert format_go_duration(td) == text


# Go's Duration range (int64 nanoseconds), in whole microseconds.
_GO_RANGE_US = ((1 << 63) - 1) // 1000


@given(st.integers(min_value=-_GO_RANGE_US, max_value=_GO_RANGE_US))
def test_format_then_parse_round_trips(micros: int) -> None:
    td = timedelta(microseconds=micros)
    assert parse_go_duration(format_go_duration(td)) == td


@given(st.text(alphabet="0123456789.+-hmsunµμd ", max_size=12))
def test_parser_only_raises_value_error(text: str) -> None:
    try:
        result = parse_go_duration(text)
    except ValueError as exc:
        assert repr(text) in str(exc)
    else:
        assert isinstance(result, timedelta)
