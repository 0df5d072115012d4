"""How a message of the members bucket's stream is read: a put, or a key that is gone."""

from __future__ import annotations

import pytest

from shared.bus.membership import _operation


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        (None, "PUT"),
        ({}, "PUT"),
        ({"Nats-Msg-Id": "x"}, "PUT"),
        ({"KV-Operation": "DEL"}, "DEL"),
        ({"KV-Operation": "PURGE"}, "PURGE"),
        # Markers the server places itself (nats-server 2.11+) when a key ages out or is removed.
        ({"Nats-Marker-Reason": "MaxAge"}, "PURGE"),
        ({"Nats-Marker-Reason": "Purge"}, "PURGE"),
        ({"Nats-Marker-Reason": "Remove"}, "DEL"),
        # A reason unknown today still stands for a key that is gone.
        ({"Nats-Marker-Reason": "SomethingNew"}, "PURGE"),
        # The client's own operation wins over a marker's reason.
        ({"KV-Operation": "DEL", "Nats-Marker-Reason": "MaxAge"}, "DEL"),
    ],
)
def test_a_message_is_read_as_a_put_or_as_a_key_that_is_gone(
    headers: dict[str, str] | None, expected: str
) -> None:
    assert _operation(headers) == expected
