"""The pure parts of the continuous pull (shared/bus/pull.py): its request and how it reads the
server's status messages."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.bus.pull import ConsumerGone, ends_request, request_body


def test_a_request_asks_for_the_batch_and_expires_in_nanoseconds() -> None:
    assert json.loads(request_body(128, 30.0)) == {"batch": 128, "expires": 30_000_000_000}
    assert json.loads(request_body(1, 0.5)) == {"batch": 1, "expires": 500_000_000}


@pytest.mark.parametrize(
    ("status", "description"),
    [
        ("408", "Request Timeout"),
        ("404", "No Messages"),
        ("409", "Leadership Change"),
        ("409", "Exceeded MaxWaiting"),
        ("409", "Server Shutdown"),
        ("409", "Message Size Exceeds MaxBytes"),
    ],
)
def test_a_request_the_server_ended_is_simply_asked_again(status: str, description: str) -> None:
    assert ends_request(status, description) is True


def test_a_heartbeat_ends_nothing() -> None:
    assert ends_request("100", "Idle Heartbeat") is False


@pytest.mark.parametrize(
    ("status", "description"),
    [("409", "Consumer Deleted"), ("503", ""), ("409", "Consumer is push based")],
)
def test_a_consumer_that_is_gone_or_cannot_be_pulled_raises(status: str, description: str) -> None:
    with pytest.raises(ConsumerGone, match=status):
        ends_request(status, description)


@given(st.text(max_size=5), st.text(max_size=40))
def test_any_status_either_ends_the_request_or_says_the_consumer_is_gone(
    status: str, description: str
) -> None:
    # Whatever a (hostile or newer) server sends, the loop gets an answer it acts on, never a crash.
    try:
        assert ends_request(status, description) in (True, False)
    except ConsumerGone:
        assert status in ("503", "409")
