"""Time as Kubernetes writes it: the one place that reads and writes metav1.Time and normalises zones.

Observations, statuses and node labels come from several producers. Comparing a naive with an
aware datetime raises, and a naive value silently read as local time would shift every
grace-period deadline by the host's UTC offset, so every timestamp goes through ``as_utc`` once
on the way in.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

__all__ = ["as_utc", "format_kube_time", "parse_kube_time", "utcnow"]


def utcnow() -> datetime:
    """The current time, aware, in UTC (the services' one clock read; decisions take it as input)."""
    return datetime.now(UTC)


def as_utc(value: datetime) -> datetime:
    """``value`` as an aware UTC datetime; a naive value is taken to be UTC already."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def format_kube_time(value: datetime) -> str:
    """RFC 3339 in UTC with second precision: the wire format of metav1.Time."""
    return as_utc(value).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_kube_time(value: Any) -> datetime | None:
    """A metav1.Time (RFC 3339 string, or a datetime) as an aware UTC datetime.

    None when absent or unreadable: a malformed timestamp written by a user or a buggy client is
    treated as missing rather than allowed to stop the service reading it.
    """
    if isinstance(value, datetime):
        return as_utc(value)
    if not isinstance(value, str) or not value:
        return None
    try:
        # Python 3.11's fromisoformat reads the "Z" suffix.
        return as_utc(datetime.fromisoformat(value))
    except ValueError:
        return None
