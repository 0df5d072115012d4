"""The pure parts of shared/bus: when a replay has caught up, every delay, what goes on the wire.

Everything that talks to a server is tested against a real nats-server in
tests/integration/test_bus.py and tests/integration/test_bus_replay.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.bus import (
    DL_CONSUMER_HEADER,
    DL_DELIVERIES_HEADER,
    DL_ERROR_HEADER,
    DL_REASON_HEADER,
    DL_SEQUENCE_HEADER,
    DL_STREAM_HEADER,
    DL_SUBJECT_HEADER,
    MSG_ID_HEADER,
    DeliverPolicy,
    StreamSpec,
    default_streams,
    error_delay,
    replay_consumer_name,
)
from shared.bus.backoff import backoff, delay
from shared.bus.connection import reconnect_handler
from shared.bus.consume import Outcome, consumer_config
from shared.bus.deadletter import dead_letter_headers
from shared.bus.headers import header_value
from shared.bus.replay import ReplayProgress
from shared.bus.streams import stream_differences

DONE, RETRY = Outcome.DONE, Outcome.RETRY

# ------------------------------------------------------------------ when a replay has caught up


def test_a_replay_ends_when_the_mark_is_settled_even_with_more_pending() -> None:
    progress = ReplayProgress(mark=3)
    assert not progress.settled(1, 5, DONE)
    assert not progress.settled(2, 4, DONE)
    assert progress.settled(3, 3, DONE)  # newer messages pending: they are followed, not waited for
    assert not progress.settled(4, 2, DONE)  # says so once


def test_a_replay_ends_at_a_delivery_with_nothing_pending_before_the_mark() -> None:
    # The mark's message was replaced (a stream keeping one message per subject) or is on a
    # subject outside the replay's filter: the last delivery has nothing behind it.
    progress = ReplayProgress(mark=10)
    assert not progress.settled(4, 1, DONE)
    assert progress.settled(7, 0, DONE)


def test_an_empty_replay_ends_from_the_consumers_counts() -> None:
    progress = ReplayProgress(mark=0)
    assert progress.drained(0, 0)
    assert not progress.drained(0, 0)
    still = ReplayProgress(mark=5)
    assert not still.drained(2, 0)
    assert not still.drained(0, 1)  # delivered, not yet acknowledged


def test_a_message_handed_back_for_a_retry_holds_the_replay_open_until_it_is_settled() -> None:
    progress = ReplayProgress(mark=3)
    assert not progress.settled(1, 2, RETRY)
    assert not progress.settled(2, 1, DONE)
    assert not progress.settled(3, 0, DONE)  # the mark, but 1 is still to come back
    assert progress.settled(1, 0, DONE)
    assert progress.caught_up


def test_a_retry_of_a_message_the_stream_no_longer_holds_is_ended_by_the_consumers_counts() -> None:
    progress = ReplayProgress(mark=2)
    progress.settled(1, 1, RETRY)
    progress.settled(2, 0, DONE)
    assert not progress.caught_up
    assert progress.drained(0, 0)
    assert progress.retrying == set()


@given(
    stored=st.integers(0, 12),
    arriving=st.integers(0, 6),
    retries=st.sets(st.integers(1, 18)),
)
def test_a_replay_ends_and_never_before_every_message_up_to_the_mark_was_settled(
    stored: int, arriving: int, retries: set[int]
) -> None:
    """One consumer handling one message at a time, in stream order; a message handed back for a
    retry comes again after the others. ``stored`` messages were there when the replay began
    (the mark), ``arriving`` came during it."""
    progress = ReplayProgress(mark=stored)
    queue = list(range(1, stored + arriving + 1))
    delivered: set[int] = set()
    handed_back: set[int] = set()
    done: set[int] = set()
    ended_with: set[int] | None = None
    if progress.drained(len(queue), 0):  # what the loop asks when it binds
        ended_with = set(done)
    while queue:
        seq = queue.pop(0)
        delivered.add(seq)
        # The server's pending count: messages not delivered yet (redeliveries are not counted).
        pending = sum(1 for s in queue if s not in delivered)
        if seq in retries and seq not in handed_back:
            handed_back.add(seq)
            queue.append(seq)
            outcome = RETRY
        else:
            done.add(seq)
            outcome = DONE
        if progress.settled(seq, pending, outcome):
            ended_with = set(done)
    if progress.drained(0, 0):  # what the loop asks when a fetch comes back empty
        ended_with = set(done)
    assert ended_with is not None, "the replay never ended"
    assert set(range(1, stored + 1)) <= ended_with


# ------------------------------------------------------------------ delays


def test_error_delay_starts_at_half_a_second_and_doubles_up_to_thirty() -> None:
    assert [error_delay(n) for n in range(0, 8)] == [0.5, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0]
    assert error_delay(10_000) == 30.0  # no overflow however many deliveries
    assert error_delay(3, base=1.0, cap=3.0) == 3.0


def test_backoff_doubles_from_the_first_delay_to_the_cap_with_at_most_the_first_delay_of_jitter() -> None:
    wait = backoff(0.05, 2.0)
    for attempt in range(1, 40):
        base = min(2.0, 0.05 * 2 ** (attempt - 1))
        for _ in range(20):
            assert base <= delay(wait, attempt) <= base + 0.05


@dataclass
class FakeServerEntry:
    """What nats-py's reconnect handler is given per server: its failed attempts."""

    name: str
    reconnects: int


def test_reconnect_picks_the_server_tried_least_and_waits_by_its_attempts() -> None:
    choose = reconnect_handler(2.0)
    servers = [FakeServerEntry("a", 5), FakeServerEntry("b", 0), FakeServerEntry("c", 3)]
    server, wait = choose(servers, {})
    assert server.name == "b" and 0.05 <= wait <= 0.1
    server, wait = choose([FakeServerEntry("a", 30)], {})
    assert 2.0 <= wait <= 2.05  # capped, and jittered so replicas do not reconnect in step


# ------------------------------------------------------------------ on the wire


def test_dead_letter_headers_keep_the_originals_but_nats_ones_and_say_where_and_why() -> None:
    headers = dead_letter_headers(
        {
            "Nats-Msg-Id": "orig",
            "Nats-Expected-Stream": "X",
            "traceparent": "00-abc",
            "Respawn-Schema": "v/1",
        },
        service="respawn-health",
        reason="invalid",
        error="bad\r\nthing",
        subject="respawn.obs.v1.node.n1",
        stream="RESPAWN_OBSERVATIONS",
        sequence=42,
        consumer="health-x",
        deliveries=3,
    )
    assert headers == {
        "traceparent": "00-abc",
        "Respawn-Schema": "v/1",
        DL_REASON_HEADER: "invalid",
        DL_ERROR_HEADER: "bad thing",
        DL_SUBJECT_HEADER: "respawn.obs.v1.node.n1",
        DL_STREAM_HEADER: "RESPAWN_OBSERVATIONS",
        DL_SEQUENCE_HEADER: "42",
        DL_CONSUMER_HEADER: "health-x",
        DL_DELIVERIES_HEADER: "3",
        MSG_ID_HEADER: "respawn-health:health-x:RESPAWN_OBSERVATIONS:42",
    }


def test_header_values_are_one_bounded_line() -> None:
    assert header_value("a\nb\r\n  c") == "a b c"
    long = header_value("x" * 5000)
    assert len(long) == 1024 and long.endswith("...")


def test_stream_differences_ignore_how_unlimited_is_spelt_and_name_what_differs() -> None:
    spec = StreamSpec(name="S", subjects=("a.>",), max_msgs_per_subject=1)
    desired = spec.config(replicas=1, duplicate_window=120.0)
    same = spec.config(replicas=1, duplicate_window=120.0)
    same.max_msgs, same.max_age, same.subjects = 0, 0.0, ["a.>"]
    assert stream_differences(desired, same) == []
    other = StreamSpec(name="S", subjects=("a.>", "b.>"), max_msgs_per_subject=5).config(
        replicas=3, duplicate_window=60.0
    )
    assert [d.split(":")[0] for d in stream_differences(desired, other)] == [
        "subjects",
        "num_replicas",
        "max_msgs_per_subject",
        "duplicate_window",
    ]


def test_default_streams_keep_the_documented_names() -> None:
    assert [s.name for s in default_streams()] == [
        "RESPAWN_OBSERVATIONS",
        "RESPAWN_VERDICTS",
        "RESPAWN_NODE_VERDICTS",
        "RESPAWN_LIFECYCLE",
        "RESPAWN_DEAD_LETTER",
    ]


def test_consumer_config_uses_one_filter_field_or_the_other() -> None:
    def config(filters: list[str]) -> object:
        return consumer_config(
            "d",
            filters,
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            ack_wait=30.0,
            max_deliver=10,
            max_ack_pending=1024,
            inactive_threshold=300.0,
        )

    one = config(["a.>"])
    assert (one.filter_subject, one.filter_subjects) == ("a.>", None)  # type: ignore[attr-defined]
    two = config(["a.>", "b.>"])
    assert (two.filter_subject, two.filter_subjects) == (None, ["a.>", "b.>"])  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="at least one filter"):
        config([])


@pytest.mark.parametrize("instance", ["host.example.com-12", "***", "x" * 300, None])
def test_replay_consumer_names_are_valid_nats_names_and_new_on_every_start(instance: str | None) -> None:
    a, b = replay_consumer_name("health", instance), replay_consumer_name("health", instance)
    assert a != b
    for name in (a, b):
        assert re.fullmatch(r"health-[A-Za-z0-9_-]+", name), name
        assert len(name) <= 100
