"""Go ``time.Duration`` strings, read and written exactly as Go does.

Upstream AppWrapper parses its ``*Duration`` annotations with Go's ``time.ParseDuration``, so a
value is valid here if and only if it is valid there, and it means the same number of
nanoseconds. Parsing is done in integer nanoseconds (like Go) rather than in floating point, so
"0.1s" plus "0.2s" is exactly 300ms and the int64 overflow limits match Go's.

Grammar (Go's): ``[-+]?([0-9]*(\\.[0-9]*)?[a-z]+)+`` or a bare ``0``, with units ``ns``, ``us``,
``µs`` (U+00B5 or U+03BC), ``ms``, ``s``, ``m`` and ``h``. There is deliberately no day unit:
Go has none ("7d" is rejected; write "168h"), and accepting it here would make an annotation
that upstream ignores behave differently under Respawn. No whitespace is allowed anywhere.

``timedelta`` resolves microseconds, so a parsed value is truncated toward zero to whole
microseconds (Go would keep the nanoseconds); the parsed text itself is still validated in full.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Final

__all__ = ["format_go_duration", "parse_go_duration"]

_NANOSECOND: Final = 1
_MICROSECOND: Final = 1000 * _NANOSECOND
_MILLISECOND: Final = 1000 * _MICROSECOND
_SECOND: Final = 1000 * _MILLISECOND
_MINUTE: Final = 60 * _SECOND
_HOUR: Final = 60 * _MINUTE

_UNITS: Final[dict[str, int]] = {
    "ns": _NANOSECOND,
    "us": _MICROSECOND,
    "\u00b5s": _MICROSECOND,  # micro sign
    "\u03bcs": _MICROSECOND,  # Greek small letter mu
    "ms": _MILLISECOND,
    "s": _SECOND,
    "m": _MINUTE,
    "h": _HOUR,
}
_UNIT_LIST: Final = "ns, us, µs, ms, s, m, h"

# Go's Duration is an int64 of nanoseconds. The magnitude may reach 2**63 only for a negative
# value (math.MinInt64), exactly as time.ParseDuration allows.
_MAX_MAGNITUDE: Final = 1 << 63


def _invalid(text: str, why: str) -> ValueError:
    return ValueError(f"invalid Go duration {text!r}: {why}")


def _leading_int(s: str, i: int) -> tuple[int, int, bool]:
    """Digits from ``s[i:]`` as an int; returns (value, next index, overflowed)."""
    value = 0
    while i < len(s) and "0" <= s[i] <= "9":
        value = value * 10 + (ord(s[i]) - ord("0"))
        if value > _MAX_MAGNITUDE:
            return 0, i, True
        i += 1
    return value, i, False


def _leading_fraction(s: str, i: int) -> tuple[int, float, int]:
    """Fraction digits from ``s[i:]``; returns (digits as int, 10**n as float, next index).

    Like Go, digits beyond what fits in an int64 are consumed but ignored, and the scale is a
    float: the fractional contribution below is computed in float64 exactly as Go computes it,
    so rounding of long fractions is identical.
    """
    value = 0
    scale = 1.0
    overflow = False
    while i < len(s) and "0" <= s[i] <= "9":
        if not overflow:
            candidate = value * 10 + (ord(s[i]) - ord("0"))
            if value > (_MAX_MAGNITUDE - 1) // 10 or candidate > _MAX_MAGNITUDE:
                overflow = True
            else:
                value = candidate
                scale *= 10
        i += 1
    return value, scale, i


def _parse_nanoseconds(text: str) -> int:
    s = text
    negative = False
    if s[:1] in ("-", "+"):
        negative = s[0] == "-"
        s = s[1:]
    if s == "0":
        return 0
    if s == "":
        raise _invalid(text, "empty" if text == "" else "sign without a number")
    total = 0
    i = 0
    while i < len(s):
        if not (s[i] == "." or "0" <= s[i] <= "9"):
            raise _invalid(text, f"expected a number at {s[i:]!r}")
        start = i
        whole, i, overflowed = _leading_int(s, i)
        if overflowed:
            raise _invalid(text, "out of range (Go durations are limited to about 292 years)")
        has_whole = i != start
        fraction, scale, has_fraction = 0, 1.0, False
        if i < len(s) and s[i] == ".":
            i += 1
            start = i
            fraction, scale, i = _leading_fraction(s, i)
            has_fraction = i != start
        if not has_whole and not has_fraction:
            raise _invalid(text, "a '.' must have digits before or after it")
        start = i
        while i < len(s) and not (s[i] == "." or "0" <= s[i] <= "9"):
            i += 1
        unit_text = s[start:i]
        if unit_text == "":
            raise _invalid(text, f"missing unit (one of {_UNIT_LIST})")
        unit = _UNITS.get(unit_text)
        if unit is None:
            hint = "; Go durations have no day unit, use hours (7d = 168h)" if unit_text == "d" else ""
            raise _invalid(text, f"unknown unit {unit_text!r} (valid units: {_UNIT_LIST}){hint}")
        if whole > _MAX_MAGNITUDE // unit:
            raise _invalid(text, "out of range (Go durations are limited to about 292 years)")
        value = whole * unit
        if fraction > 0:
            # Same float64 expression as Go, truncated toward zero like Go's uint64 conversion.
            value += int(float(fraction) * (float(unit) / scale))
            if value > _MAX_MAGNITUDE:
                raise _invalid(text, "out of range (Go durations are limited to about 292 years)")
        total += value
        if total > _MAX_MAGNITUDE:
            raise _invalid(text, "out of range (Go durations are limited to about 292 years)")
    if negative:
        return -total
    if total > _MAX_MAGNITUDE - 1:
        raise _invalid(text, "out of range (Go durations are limited to about 292 years)")
    return total


def parse_go_duration(text: str) -> timedelta:
    """Parse ``text`` with Go ``time.ParseDuration`` rules ("90s", "1h30m", "1.5h", "-5m", "0").

    Raises ``ValueError`` naming the text and what is wrong with it. Sub-microsecond parts are
    truncated toward zero (``timedelta`` cannot hold nanoseconds).
    """
    nanoseconds = _parse_nanoseconds(text)
    micros = abs(nanoseconds) // _MICROSECOND
    return timedelta(microseconds=-micros if nanoseconds < 0 else micros)


def _fraction(value: int, digits: int) -> tuple[int, str]:
    """Split ``value`` into (integer part, ".ddd" with trailing zeros dropped) at ``digits``."""
    unit = 10**digits
    whole, part = divmod(value, unit)
    if part == 0:
        return whole, ""
    return whole, "." + f"{part:0{digits}d}".rstrip("0")


def format_go_duration(td: timedelta) -> str:
    """Format like Go's ``Duration.String()``: "1h30m0s", "1m30s", "1.5s", "300ms", "0s".

    Durations under a second use the largest unit below a second that keeps an integer part
    ("1.5ms", "20µs", with the micro sign U+00B5 as Go writes it). Hours are the largest unit,
    as in Go ("168h0m0s" for a week). The result parses back to the same value.
    """
    # timedelta normalises to days/seconds/microseconds with only days negative, so go through
    # total microseconds to get an exact signed integer.
    micros = (td.days * 86_400 + td.seconds) * 1_000_000 + td.microseconds
    negative = micros < 0
    nanoseconds = abs(micros) * _MICROSECOND
    if nanoseconds == 0:
        return "0s"
    if nanoseconds < _SECOND:
        if nanoseconds < _MICROSECOND:
            whole, frac, unit = nanoseconds, "", "ns"
        elif nanoseconds < _MILLISECOND:
            whole, frac = _fraction(nanoseconds, 3)
            unit = "\u00b5s"
        else:
            whole, frac = _fraction(nanoseconds, 6)
            unit = "ms"
        text = f"{whole}{frac}{unit}"
    else:
        seconds, frac = _fraction(nanoseconds, 9)
        minutes, seconds = divmod(seconds, 60)
        text = f"{seconds}{frac}s"
        if minutes > 0:
            hours, minutes = divmod(minutes, 60)
            text = f"{minutes}m{text}"
            if hours > 0:
                text = f"{hours}h{text}"
    return f"-{text}" if negative else text
