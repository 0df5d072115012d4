"""The pure parts of shared/bus: when a replay has caught up, every delay, what goes on the wire.

Everything that talks to a server is tested against a real nats-server in
tests/integration/test_bus.py and tests/integration/test_bus_replay.py.
"""

from __future__ import annotations

import json
import re
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats.errors
import nats.js.errors
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared import subjects
from shared.bus import (
    DL_CONSUMER_HEADER,
    DL_DELIVERIES_HEADER,
    DL_ERROR_HEADER,
    DL_REASON_HEADER,
    DL_SEQUENCE_HEADER,
    DL_SERVICE_HEADER,
    DL_STREAM_HEADER,
    DL_SUBJECT_HEADER,
    DL_TRUNCATED_HEADER,
    MSG_ID_HEADER,
    BusError,
    DeliverPolicy,
    PermanentPublishError,
    StreamLimits,
    StreamSpec,
    TlsFiles,
    default_streams,
    error_delay,
    redact,
    redact_url,
    replay_consumer_name,
)
from shared.bus.backoff import backoff, delay
from shared.bus.connection import (
    ConnectionState,
    connect_options,
    reconnect_handler,
    servers_text,
    tls_context,
)
from shared.bus.consume import Outcome, consumer_config
from shared.bus.deadletter import dead_letter_headers, fit, unpublished_headers
from shared.bus.headers import header_value, headers_size, subject_problem, ttl_value, wire_size
from shared.bus.publish import check_publishable, permanent_reason
from shared.bus.replay import ReplayProgress
from shared.bus.streams import (
    LIMIT_FIELDS,
    LIMITS_METADATA,
    applied_limits,
    desired_config,
    reconcile_limits,
    stream_differences,
    stream_for,
    subject_matches,
)

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


# ------------------------------------------------------------------ credentials never logged

_userinfo_chars = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="/?#\x00"),
    min_size=1,
    max_size=30,
)
_hosts = st.from_regex(r"[a-z][a-z0-9-]{0,20}(\.[a-z][a-z0-9-]{0,10}){0,2}", fullmatch=True)
_schemes = st.sampled_from(["nats", "tls", "ws", "wss"])


@given(
    scheme=_schemes, user=_userinfo_chars, password=_userinfo_chars, host=_hosts, port=st.integers(1, 65535)
)
def test_redact_url_drops_user_and_password_and_keeps_the_server(
    scheme: str, user: str, password: str, host: str, port: int
) -> None:
    url = f"{scheme}://{user}:{password}@{host}:{port}"
    redacted = redact_url(url)
    assert redacted == f"{scheme}://{host}:{port}"
    assert redact_url(redacted) == redacted


@given(scheme=_schemes, host=_hosts, port=st.integers(1, 65535), path=st.sampled_from(["", "/", "/x?y=1"]))
def test_redact_url_leaves_a_url_without_credentials_alone(
    scheme: str, host: str, port: int, path: str
) -> None:
    url = f"{scheme}://{host}:{port}{path}"
    assert redact_url(url) == url


@given(
    before=st.text(alphabet=st.characters(blacklist_characters=":@"), max_size=20),
    user=st.from_regex(r"[A-Za-z0-9_.-]{1,12}", fullmatch=True),
    password=st.text(
        alphabet=st.characters(blacklist_categories=("Cs", "Zs", "Cc")), min_size=8, max_size=30
    ).filter(lambda p: not any(c in p for c in "/?#") and not p.isspace()),
    host=_hosts,
)
def test_redact_removes_credentials_from_urls_in_any_text(
    before: str, user: str, password: str, host: str
) -> None:
    text = f"{before} no nats://{user}:{password}@{host}:4222 nor tls://{password}@{host}:4223, sorry"
    assert redact(text) == f"{before} no nats://{host}:4222 nor tls://{host}:4223, sorry"


def test_redact_url_without_a_scheme_and_with_at_signs_in_the_password() -> None:
    assert redact_url("admin:p@ss@127.0.0.1:4222") == "127.0.0.1:4222"
    assert redact_url("nats://token@host/p@th") == "nats://host/p@th"  # an "@" after the host is no userinfo
    assert servers_text(["nats://a:b@h1:1", "nats://h2:2"]) == "nats://h1:1, nats://h2:2"


async def test_a_connection_error_is_logged_without_credentials(caplog: pytest.LogCaptureFixture) -> None:
    state = ConnectionState(service="s")
    with caplog.at_level("WARNING", logger="shared.bus"):
        await state.on_error(OSError("connect to nats://watcher:hunter2hunter2@nats:4222 failed"))
    assert "hunter2" not in caplog.text and "nats://nats:4222" in caplog.text
    assert "hunter2" not in state.last_error


# ------------------------------------------------------------------ what can be published


@pytest.mark.parametrize(
    ("subject", "problem"),
    [
        ("", "empty"),
        ("respawn.obs.v1.aw..x", "empty token"),
        ("respawn.obs.", "empty token"),
        ("respawn.verdict.*.x", "wildcard"),
        ("respawn.verdict.>", "wildcard"),
        ("respawn.verdict.a b.c", "whitespace"),
        ("respawn.verdict.a\tb", "whitespace"),
    ],
)
def test_subjects_that_cannot_be_published_on_say_why(subject: str, problem: str) -> None:
    assert problem in (subject_problem(subject) or "")
    with pytest.raises(PermanentPublishError) as info:
        check_publishable(subject, b"", {}, 1024)
    assert info.value.reason == "invalid-subject"


def test_escaped_kubernetes_names_always_make_publishable_subjects() -> None:
    for name in ("a.b", "*", ">", "with space", "", "%2E"):
        assert subject_problem(subjects.verdict(name, name)) is None


def test_wire_size_counts_the_header_block_as_nats_py_writes_it() -> None:
    headers = {"Nats-Msg-Id": "x", "K": "vv"}
    block = b"NATS/1.0\r\n" + b"Nats-Msg-Id: x\r\n" + b"K: vv\r\n" + b"\r\n"
    assert headers_size(headers) == len(block)
    assert wire_size(b"12345", headers) == len(block) + 5
    assert wire_size(b"12345", None) == wire_size(b"12345", {}) == 5


def test_a_message_over_max_payload_is_refused_before_it_is_sent() -> None:
    headers = {"Nats-Msg-Id": "x"}
    limit = wire_size(b"a" * 100, headers)
    check_publishable("a.b", b"a" * 100, headers, limit)  # exactly at the limit: fine
    with pytest.raises(PermanentPublishError) as info:
        check_publishable("a.b", b"a" * 101, headers, limit)
    assert info.value.reason == "too-large" and info.value.subject == "a.b"
    assert f"at most {limit}" in str(info.value)


def test_permanent_and_transient_publish_errors_are_told_apart() -> None:
    def api_error(code: int, err_code: int) -> Exception:
        try:
            nats.js.errors.APIError.from_error({"code": code, "err_code": err_code, "description": "x"})
        except nats.js.errors.APIError as exc:  # nats-py raises the subclass for the code
            return exc
        raise AssertionError("from_error did not raise")

    assert permanent_reason(nats.errors.MaxPayloadError()) == "too-large"
    assert permanent_reason(nats.errors.BadSubjectError()) == "invalid-subject"
    assert permanent_reason(api_error(400, 10054)) == "too-large"
    assert permanent_reason(api_error(400, 10166)) == "rejected"
    assert permanent_reason(api_error(503, 10008)) is None
    for transient in (
        nats.errors.TimeoutError(),
        nats.errors.NoRespondersError(),
        nats.errors.ConnectionReconnectingError(),
        nats.js.errors.NoStreamResponseError(),
    ):
        assert permanent_reason(transient) is None


def test_message_ttls_are_whole_seconds_of_at_least_one() -> None:
    assert ttl_value(3600) == "3600s"
    assert ttl_value(0.2) == "1s"
    assert ttl_value(1.5) == "2s"
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="positive number of seconds"):
            ttl_value(bad)


async def test_a_permission_violation_is_remembered_for_its_subject_only() -> None:
    state = ConnectionState(service="s")
    before = time.monotonic()
    await state.on_error(Exception('nats: permissions violation for publish to "respawn.deadletter.x"'))
    assert state.publish_denied("respawn.deadletter.x", since=before)
    assert not state.publish_denied("respawn.deadletter.y", since=before)
    assert not state.publish_denied("respawn.deadletter.x", since=time.monotonic() + 1)


# ------------------------------------------------------------------ dead letters that always fit


def test_a_dead_letter_that_fits_is_left_as_it_is() -> None:
    headers = {DL_REASON_HEADER: "invalid", "traceparent": "00-a"}
    assert fit(headers, b"payload", 1024 * 1024) == (headers, b"payload")


@given(
    payload=st.integers(0, 3_000_000),
    original=st.integers(0, 2_000_000),
    max_payload=st.sampled_from([64 * 1024, 1024 * 1024, 8 * 1024 * 1024]),
)
def test_a_dead_letter_is_never_larger_than_the_server_takes(
    payload: int, original: int, max_payload: int
) -> None:
    headers = dead_letter_headers(
        {"X-Big": "h" * original, "traceparent": "00-abc"},
        service="respawn-health",
        reason="max-errors",
        error="boom " * 1000,
        subject="respawn.verdict.ns.aw",
        stream="RESPAWN_VERDICTS",
        sequence=7,
        consumer="lifecycle-verdicts",
        deliveries=3,
    )
    fitted, data = fit(headers, b"p" * payload, max_payload)
    assert wire_size(data, fitted) <= max_payload
    for key in (DL_REASON_HEADER, DL_ERROR_HEADER, DL_SUBJECT_HEADER, DL_SEQUENCE_HEADER, MSG_ID_HEADER):
        assert fitted[key] == headers[key]  # where it came from and why always stay
    assert data == (b"p" * payload)[: len(data)]  # cut, never changed
    if len(data) < payload or "X-Big" not in fitted:
        assert fitted[DL_TRUNCATED_HEADER] == str(payload)


def test_a_dead_letter_for_an_unpublishable_object_has_the_consumer_dead_letter_headers() -> None:
    headers = unpublished_headers(
        {"Respawn-Object-Name": "big"},
        service="respawn-watcher",
        reason="too-large",
        error="cannot publish\non x",
        subject="respawn.obs.v1.aw.ns.big.appwrapper.big",
        stream="RESPAWN_OBSERVATIONS",
        payload=b"summary",
        msg_id="uid-1:42",
    )
    assert headers == {
        "Respawn-Object-Name": "big",
        DL_REASON_HEADER: "too-large",
        DL_ERROR_HEADER: "cannot publish on x",
        DL_SUBJECT_HEADER: "respawn.obs.v1.aw.ns.big.appwrapper.big",
        DL_STREAM_HEADER: "RESPAWN_OBSERVATIONS",
        DL_SEQUENCE_HEADER: "0",
        DL_CONSUMER_HEADER: "",
        DL_DELIVERIES_HEADER: "0",
        DL_SERVICE_HEADER: "respawn-watcher",
        MSG_ID_HEADER: "respawn-watcher:publish:respawn.obs.v1.aw.ns.big.appwrapper.big:uid-1:42",
    }
    again = unpublished_headers(
        {}, service="w", reason="r", error="e", subject="s.t", stream="", payload=b"same", msg_id=None
    )
    assert (
        again[MSG_ID_HEADER]
        == unpublished_headers(
            {}, service="w", reason="r", error="other", subject="s.t", stream="", payload=b"same", msg_id=None
        )[MSG_ID_HEADER]
    )  # a repeat of the same failure is stored once


# ------------------------------------------------------------------ bounded streams


def test_every_default_stream_is_bounded_in_bytes_and_messages() -> None:
    for spec in default_streams():
        assert spec.max_bytes and spec.max_bytes > 0, spec.name
        assert spec.max_msgs and spec.max_msgs > 0, spec.name
    by_name = {s.name: s for s in default_streams()}
    # Public history is bounded in age too; latest-state streams are not (they are loaded at start).
    assert by_name["RESPAWN_VERDICTS"].max_age == by_name["RESPAWN_LIFECYCLE"].max_age == 30 * 86400
    assert by_name["RESPAWN_DEAD_LETTER"].max_age == 14 * 86400
    assert by_name["RESPAWN_OBSERVATIONS"].max_age is None
    assert by_name["RESPAWN_OBSERVATIONS"].allow_msg_ttl  # tombstones expire
    assert by_name["RESPAWN_OBSERVATIONS"].max_msgs_per_subject == 1
    assert by_name["RESPAWN_VERDICTS"].max_msgs_per_subject == 64
    # JetStream reserves max_bytes on the server: together they fit in half of deploy/nats's 8 GB.
    assert sum(s.max_bytes or 0 for s in default_streams()) < 4 * 10**9


def test_configured_limits_replace_the_defaults_of_their_stream_only() -> None:
    specs = {
        s.name: s
        for s in default_streams(
            {"RESPAWN_VERDICTS": StreamLimits(max_bytes=10, max_msgs=0, max_age=60.0, max_msgs_per_subject=3)}
        )
    }
    verdicts = specs["RESPAWN_VERDICTS"]
    assert (verdicts.max_bytes, verdicts.max_msgs, verdicts.max_age, verdicts.max_msgs_per_subject) == (
        10,
        None,  # 0: no limit
        60.0,
        3,
    )
    assert specs["RESPAWN_LIFECYCLE"] == {s.name: s for s in default_streams()}["RESPAWN_LIFECYCLE"]
    # The duplicate window never exceeds the maximum age (NATS would refuse the stream).
    assert verdicts.config(replicas=1, duplicate_window=120.0).duplicate_window == 60.0


def test_subjects_find_their_stream() -> None:
    specs = default_streams()
    assert stream_for(subjects.verdict("ns", "aw"), specs).name == "RESPAWN_VERDICTS"  # type: ignore[union-attr]
    assert stream_for(subjects.node_obs("n1"), specs).name == "RESPAWN_OBSERVATIONS"  # type: ignore[union-attr]
    assert stream_for("respawn.other.x", specs) is None
    assert subject_matches("a.*.c", "a.b.c") and not subject_matches("a.*.c", "a.b.c.d")
    assert subject_matches("a.>", "a.b.c") and not subject_matches("a.>", "a")
    assert subject_matches("a.b", "a.b") and not subject_matches("a.b", "a.b.c")


_limit = st.one_of(st.none(), st.integers(1, 10**6).map(float))
_limits = st.fixed_dictionaries({name: _limit for name in LIMIT_FIELDS})


def test_limits_are_added_and_tightened_but_an_operators_stricter_limit_stays() -> None:
    want = {"max_msgs": 100.0, "max_bytes": 1000.0, "max_age": 60.0, "max_msgs_per_subject": 1.0}
    have = {"max_msgs": None, "max_bytes": 5000.0, "max_age": 30.0, "max_msgs_per_subject": 1.0}
    assert reconcile_limits(want, have, None) == {
        "max_msgs": 100.0,  # missing: added
        "max_bytes": 1000.0,  # looser: tightened
        "max_age": 30.0,  # stricter, and not Respawn's: kept
        "max_msgs_per_subject": 1.0,
    }
    # Respawn set 30 s itself last time; the configuration now says 60 s: follow it.
    assert reconcile_limits(want, have, {**want, "max_age": 30.0})["max_age"] == 60.0
    # The configuration dropped a limit Respawn had set: it goes; an operator's stays.
    unlimited_age = {**want, "max_age": None}
    assert reconcile_limits(unlimited_age, have, {"max_age": 30.0})["max_age"] is None
    assert reconcile_limits(unlimited_age, have, {"max_age": 45.0})["max_age"] == 30.0


@given(desired=_limits, actual=_limits, applied=st.one_of(st.none(), _limits))
def test_reconciled_limits_follow_the_configuration_but_never_loosen_an_operators(
    desired: dict[str, float | None], actual: dict[str, float | None], applied: dict[str, float | None] | None
) -> None:
    result = reconcile_limits(desired, actual, applied)
    for name in LIMIT_FIELDS:
        want, have, got = desired[name], actual[name], result[name]
        if have is None or (applied is not None and applied[name] == have):
            assert got == want  # none on the server, or Respawn's own: the configuration rules
        else:
            # An operator's limit: tightened to Respawn's, never loosened (None is "no limit").
            assert got is not None and got <= have
            assert got == (have if want is None else min(have, want))


def test_updating_a_stream_keeps_other_metadata_and_never_switches_ttls_off() -> None:
    spec = StreamSpec(name="S", subjects=("a.>",), max_msgs=10)
    actual = StreamSpec(name="S", subjects=("a.>",), max_msgs=5).config(replicas=1, duplicate_window=120.0)
    actual.allow_msg_ttl = True
    actual.metadata = {"_nats.ver": "2.15.1", "owner": "team-x"}
    desired = desired_config(spec, actual, replicas=1, duplicate_window=120.0)
    assert desired.max_msgs == 5  # the operator's stricter limit (no record says Respawn set it)
    assert desired.allow_msg_ttl is True
    assert desired.metadata is not None
    assert desired.metadata["owner"] == "team-x" and "_nats.ver" not in desired.metadata
    assert json.loads(desired.metadata[LIMITS_METADATA])["max_msgs"] == 10  # what Respawn wants
    assert applied_limits(desired) == spec.limits()
    created = desired_config(spec, None, replicas=1, duplicate_window=120.0)
    assert created.max_msgs == 10 and applied_limits(created) == spec.limits()
    assert stream_differences(created, created) == []


# ------------------------------------------------------------------ TLS and credentials


def test_tls_needs_a_readable_ca_and_a_complete_client_certificate(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="both cert_file and key_file"):
        TlsFiles(cert_file=tmp_path / "c.crt")
    with pytest.raises(BusError, match=r"cannot use the NATS TLS CA file .*missing\.crt.*caFile"):
        tls_context(TlsFiles(ca_file=tmp_path / "missing.crt"))
    context = tls_context(TlsFiles())  # the system's CAs
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname


def test_connect_options_carry_tls_and_refuse_two_kinds_of_credentials(tmp_path: Path) -> None:
    state = ConnectionState(service="s")
    common: dict[str, Any] = {
        "name": "s",
        "state": state,
        "user": None,
        "password": None,
        "token": None,
        "inbox_prefix": None,
        "reconnect_wait_max": 2.0,
    }
    options = connect_options(
        ["tls://h:4222"],
        creds=None,
        nkey_seed_file=None,
        tls=TlsFiles(server_name="nats.example", handshake_first=True),
        **common,
    )
    assert isinstance(options["tls"], ssl.SSLContext)
    assert (options["tls_hostname"], options["tls_handshake_first"]) == ("nats.example", True)
    with pytest.raises(BusError, match="not both"):
        connect_options(["nats://h"], creds="a", nkey_seed_file="b", tls=None, **common)
    with pytest.raises(BusError, match=r"cannot read the NATS nkey seed file .*nope"):
        connect_options(["nats://h"], creds=None, nkey_seed_file=tmp_path / "nope", tls=None, **common)


async def test_the_error_that_says_what_is_wrong_outlives_the_reset_after_it() -> None:
    state = ConnectionState(service="s")
    await state.on_error(nats.errors.Error("nats: 'Authorization Violation'"))
    await state.on_error(ConnectionResetError(104, "Connection reset by peer"))
    assert "ConnectionResetError" in state.last_error
    assert "Authorization Violation" in state.telling_error
    await state.on_error(ssl.SSLCertVerificationError("certificate verify failed"))
    await state.on_error(OSError("connection refused"))
    assert "certificate verify failed" in state.telling_error
