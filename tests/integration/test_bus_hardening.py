"""The bus against hostile or broken input and a NATS that loses its store, on a real nats-server.

- a message that can never be published fails at once, the connection stays up, and
  ``Bus.dead_letter`` records it (never itself too large);
- every stream is bounded, an operator's stricter limit is kept, and tombstones expire;
- a stream and durable lost with the server's store are created again, and readiness says why
  it is false meanwhile;
- a poison message is dead-lettered after a finite budget without holding up the others.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgpack
import pytest
from nats.js import api
from prometheus_client import REGISTRY

from respawn.testbed.nats import NatsServer, start_nats
from shared import subjects
from shared.bus import (
    DL_CONSUMER_HEADER,
    DL_DELIVERIES_HEADER,
    DL_ERROR_HEADER,
    DL_MAX_DELIVERIES,
    DL_MAX_ERRORS,
    DL_OBJECT_NAME_HEADER,
    DL_OBJECT_UID_HEADER,
    DL_REASON_HEADER,
    DL_SEQUENCE_HEADER,
    DL_STREAM_HEADER,
    DL_SUBJECT_HEADER,
    DL_TRUNCATED_HEADER,
    TTL_HEADER,
    Bus,
    Consumer,
    Delivery,
    Handler,
    PermanentPublishError,
    StreamLimits,
    StreamSpec,
    TransientError,
)
from shared.bus.streams import LIMITS_METADATA
from shared.messages import AppWrapperObservation, NodeObservation, ObjectRef, Verdict
from tests.nats_fixtures import dead_letters
from tests.waiting import until

pytestmark = pytest.mark.nats

NOW = datetime(2025, 1, 1, tzinfo=UTC)


def uid() -> str:
    return uuid.uuid4().hex[:10]


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def verdict(name: str, seq: int = 0) -> Verdict:
    return Verdict(
        ref=ObjectRef(namespace="ns", name=name, uid=f"uid-{name}"), state="Healthy", decided_at=NOW, seq=seq
    )


def appwrapper(name: str, *, body_bytes: int = 0, deleted: bool = False) -> AppWrapperObservation:
    return AppWrapperObservation(
        ref=ObjectRef(namespace="ns", name=name, uid=f"uid-{name}"),
        resource_version="1",
        deleted=deleted,
        observed_at=NOW,
        body={"spec": {"blob": "x" * body_bytes}} if body_bytes else {},
    )


async def subject_count(bus: Bus, stream: str, subject: str) -> int:
    info = await bus.js.stream_info(stream, subjects_filter=subject)
    return int((info.state.subjects or {}).get(subject, 0))


# ------------------------------------------------------------------ 1. permanent publish errors


async def test_a_message_over_max_payload_fails_at_once_and_the_connection_stays_up(bus: Bus) -> None:
    name = f"huge-{uid()}"
    subject = subjects.appwrapper_obs("ns", name, "appwrapper", name)
    started = time.monotonic()
    with pytest.raises(PermanentPublishError) as info:
        await bus.publish(subject, appwrapper(name, body_bytes=bus.max_payload), msg_id=None)
    assert time.monotonic() - started < 1.0  # not retried
    assert info.value.reason == "too-large" and info.value.subject == subject
    assert f"at most {bus.max_payload}" in str(info.value)
    # The server closes the connection on an oversized message, and nats-py would not reconnect:
    # nothing was sent, so the connection is as it was and the next publish goes through.
    assert bus.connected
    small = await bus.publish(subject, appwrapper(name), msg_id=None)
    assert small.stream == subjects.OBSERVATIONS_STREAM


async def test_an_invalid_subject_fails_at_once(bus: Bus) -> None:
    for subject in ("respawn.obs.v1.aw..x", "respawn.verdict.*.x", "respawn.verdict.a b"):
        with pytest.raises(PermanentPublishError) as info:
            await bus.publish(subject, verdict("a"), msg_id=None, retry_for=30.0)
        assert info.value.reason == "invalid-subject"
    assert bus.connected


async def test_an_unpublishable_object_is_dead_lettered_and_the_next_one_goes_on(bus: Bus) -> None:
    """What the watcher does with a PermanentPublishError: dead-letter that object, go on."""
    big, fine = f"big-{uid()}", f"fine-{uid()}"
    published: list[str] = []
    for name, size in ((big, 2 * bus.max_payload), (fine, 10)):
        subject = subjects.appwrapper_obs("ns", name, "appwrapper", name)
        message = appwrapper(name, body_bytes=size)
        try:
            await bus.publish(subject, message, msg_id=f"uid-{name}:1")
            published.append(name)
        except PermanentPublishError as exc:
            summary = {"kind": "AppWrapper", "namespace": "ns", "name": name, "size": len(message.encode())}
            letter = await bus.dead_letter(
                exc.subject,
                summary,
                reason=exc.reason,
                error=exc,
                kind="AppWrapper",
                namespace="ns",
                name=name,
                uid=f"uid-{name}",
                resource_version="1",
                msg_id=f"uid-{name}:1",
            )
            assert not letter.duplicate
            # The same failure again (a watch that re-lists) is stored once.
            again = await bus.dead_letter(
                exc.subject, summary, reason=exc.reason, error=exc, msg_id=f"uid-{name}:1"
            )
            assert again.duplicate
    assert published == [fine]

    [letter] = await dead_letters(bus, 1)
    assert msgpack.unpackb(letter.data)["name"] == big
    assert letter.headers[DL_REASON_HEADER] == "too-large"
    assert "too-large" in letter.headers[DL_ERROR_HEADER]
    assert letter.headers[DL_SUBJECT_HEADER] == subjects.appwrapper_obs("ns", big, "appwrapper", big)
    assert letter.headers[DL_STREAM_HEADER] == subjects.OBSERVATIONS_STREAM
    assert (letter.headers[DL_SEQUENCE_HEADER], letter.headers[DL_CONSUMER_HEADER]) == ("0", "")
    assert letter.headers[DL_DELIVERIES_HEADER] == "0"
    assert (letter.headers[DL_OBJECT_NAME_HEADER], letter.headers[DL_OBJECT_UID_HEADER]) == (
        big,
        f"uid-{big}",
    )
    labels = {"service": bus.service, "stream": subjects.OBSERVATIONS_STREAM, "reason": "too-large"}
    assert metric("respawn_bus_dead_lettered_total", **labels) == 1


async def test_a_dead_letter_is_cut_to_fit_in_one_message(bus: Bus) -> None:
    subject = subjects.verdict("ns", f"cut-{uid()}")
    payload = b"\x01" * (2 * bus.max_payload)
    await bus.dead_letter(subject, payload, reason="too-large", error="x" * 10_000)
    [letter] = await dead_letters(bus, 1)
    assert letter.headers[DL_TRUNCATED_HEADER] == str(len(payload))
    assert 0 < len(letter.data) < bus.max_payload and payload.startswith(letter.data)
    assert bus.connected


async def test_a_consumers_dead_letter_of_a_message_near_max_payload_still_fits(bus: Bus) -> None:
    """The copy carries the original bytes plus headers; a 1 MB original would not fit as it is."""
    subject = subjects.verdict("near", uid())
    garbage = b"\xc1" * (bus.max_payload - 200)  # not msgpack, and just under the limit
    ack = await bus.js.publish(subject, garbage)
    handled: list[int] = []

    async def handler(msg: Verdict, delivery: Delivery) -> None:
        handled.append(msg.seq)

    await bus.publish(subject, verdict("a", seq=2), msg_id=None)
    await bus.consume(subjects.VERDICTS_STREAM, f"t_{uid()}", subject, Verdict, handler)
    await until("the good message after the huge bad one", lambda: handled == [2])
    [letter] = await dead_letters(bus, 1)
    assert letter.headers[DL_SEQUENCE_HEADER] == str(ack.seq)
    assert letter.headers[DL_TRUNCATED_HEADER] == str(len(garbage))
    assert garbage.startswith(letter.data)
    assert bus.connected


AUTH_CONF = """
accounts {
  A {
    jetstream: enabled
    users = [
      {user: admin, password: adminpassword}
      {
        user: limited, password: limitedpassword,
        permissions: {
          publish: {allow: ["$JS.API.>", "$JS.ACK.>", "respawn.verdict.>"]}
          subscribe: {allow: ["_INBOX.>"]}
        }
      }
    ]
  }
}
"""


@pytest.fixture
async def auth_server(tmp_path: Path) -> AsyncIterator[NatsServer]:
    conf = tmp_path / "auth.conf"
    conf.write_text(AUTH_CONF)
    server = await asyncio.to_thread(start_nats, tmp_path / "nats", config_file=conf)
    try:
        yield server
    finally:
        await asyncio.to_thread(server.stop)


async def test_a_permission_violation_fails_instead_of_being_retried(auth_server: NatsServer) -> None:
    admin = await Bus.connect(auth_server.url, name=f"admin-{uid()}", user="admin", password="adminpassword")
    limited = await Bus.connect(
        auth_server.url, name=f"limited-{uid()}", user="limited", password="limitedpassword"
    )
    try:
        await admin.ensure_streams()
        started = time.monotonic()
        with pytest.raises(PermanentPublishError) as info:
            # May publish verdicts, not lifecycle events: the server says so only asynchronously.
            await limited.publish(
                subjects.lifecycle_event("ns", "x"),
                verdict("a"),
                msg_id=None,
                ack_timeout=1.0,
                retry_for=30.0,
            )
        assert info.value.reason == "permission"
        assert time.monotonic() - started < 5.0  # one ack timeout, not retry_for
        assert (await limited.publish(subjects.verdict("ns", "x"), verdict("a"), msg_id=None)).seq > 0

        # A consumer whose service may not write dead letters terminates a poison message instead
        # of redelivering it forever (it stays stored in its stream).
        subject = subjects.verdict("ns", f"poison-{uid()}")
        await admin.js.publish(subject, b"\xc1 not msgpack")
        handled: list[int] = []

        async def handler(msg: Verdict, delivery: Delivery) -> None:
            handled.append(msg.seq)

        await admin.publish(subject, verdict("a", seq=5), msg_id=None)
        durable = f"t_{uid()}"
        await limited.consume(subjects.VERDICTS_STREAM, durable, subject, Verdict, handler)
        await until("the message behind the poison one", lambda: handled == [5], within=30)

        async def settled() -> bool:
            i = await admin.js.consumer_info(subjects.VERDICTS_STREAM, durable)
            return bool(i.num_ack_pending == 0 and i.num_pending == 0)

        await until("the poison message to be terminated", settled, within=30)
        labels = {"service": limited.service, "stream": subjects.VERDICTS_STREAM, "reason": "invalid"}
        assert metric("respawn_bus_messages_terminated_total", **labels) == 1
        assert metric("respawn_bus_dead_lettered_total", **labels) == 0
    finally:
        await limited.close()
        await admin.close()


# ------------------------------------------------------------------ 2. bounded streams, TTLs


async def test_every_stream_is_created_bounded(bus: Bus) -> None:
    for name in (
        subjects.OBSERVATIONS_STREAM,
        subjects.VERDICTS_STREAM,
        subjects.NODE_VERDICTS_STREAM,
        subjects.LIFECYCLE_STREAM,
        subjects.DEAD_LETTER_STREAM,
    ):
        config = (await bus.js.stream_info(name)).config
        assert config.max_bytes > 0 and config.max_msgs > 0, name
        assert LIMITS_METADATA in (config.metadata or {}), name
    obs = (await bus.js.stream_info(subjects.OBSERVATIONS_STREAM)).config
    assert obs.allow_msg_ttl is True and obs.max_msgs_per_subject == 1


async def test_an_operators_stricter_limit_is_kept_and_a_looser_one_tightened(bus: Bus) -> None:
    name = f"T_{uid()}"
    subject = f"respawn-test.{name}.>"
    spec = StreamSpec(name=name, subjects=(subject,), max_msgs=1000, max_bytes=10_000_000, max_age=3600.0)
    await bus.ensure_stream(spec)
    config = (await bus.js.stream_info(name)).config
    assert (config.max_msgs, config.max_bytes, config.max_age) == (1000, 10_000_000, 3600.0)

    # An operator tightens two limits and loosens one on the server.
    config.max_msgs, config.max_age, config.max_bytes = 10, 60.0, 50_000_000
    config.duplicate_window = 60.0  # NATS wants it no longer than the maximum age
    await bus.js.update_stream(config)
    await bus.ensure_stream(spec)  # a service starting again
    config = (await bus.js.stream_info(name)).config
    assert (config.max_msgs, config.max_age) == (10, 60.0)  # stricter: kept
    assert config.max_bytes == 10_000_000  # looser: tightened back

    # The operator configuration raises Respawn's own limit: that one follows it.
    await bus.ensure_stream(
        StreamSpec(name=name, subjects=(subject,), max_msgs=1000, max_bytes=20_000_000, max_age=3600.0)
    )
    config = (await bus.js.stream_info(name)).config
    assert config.max_bytes == 20_000_000
    assert (config.max_msgs, config.max_age) == (10, 60.0)
    assert json.loads(config.metadata[LIMITS_METADATA])["max_bytes"] == 20_000_000


async def test_a_stream_without_limits_from_before_gets_them(bus: Bus) -> None:
    name = f"T_{uid()}"
    subject = f"respawn-test.{name}.>"
    await bus.js.add_stream(api.StreamConfig(name=name, subjects=[subject], storage=api.StorageType.FILE))
    await bus.ensure_stream(StreamSpec(name=name, subjects=(subject,), max_msgs=5, max_bytes=1_000_000))
    config = (await bus.js.stream_info(name)).config
    assert (config.max_msgs, config.max_bytes) == (5, 1_000_000)


async def test_configured_limits_reach_the_streams_and_follow_the_configuration(nats_url: str) -> None:
    dead_letter = subjects.DEAD_LETTER_STREAM
    configured = await Bus.connect(
        nats_url,
        name=f"test-{uid()}",
        stream_limits={dead_letter: StreamLimits(max_bytes=100_000_000, max_msgs=1234, max_age=3 * 86400.0)},
    )
    try:
        await configured.ensure_streams()
        config = (await configured.js.stream_info(dead_letter)).config
        assert (config.max_msgs, config.max_bytes, config.max_age) == (1234, 100_000_000, 3 * 86400.0)
    finally:
        await configured.close()
    # Those limits were Respawn's own (the stream's metadata says so), so a service configured
    # with the defaults sets the defaults again, looser as they are.
    default = await Bus.connect(nats_url, name=f"test-{uid()}")
    try:
        await default.ensure_streams()
        config = (await default.js.stream_info(dead_letter)).config
        assert (config.max_msgs, config.max_bytes, config.max_age) == (
            100_000,
            512 * 1024 * 1024,
            14 * 86400.0,
        )
    finally:
        await default.close()


async def test_a_tombstone_with_a_ttl_goes_away_with_its_subject(bus: Bus) -> None:
    name = f"gone-{uid()}"
    tomb = subjects.appwrapper_obs("ns", name, "appwrapper", name)
    alive = subjects.appwrapper_obs("ns", f"alive-{uid()}", "appwrapper", "x")
    await bus.publish(alive, appwrapper("x"), msg_id=None)
    await bus.publish(tomb, appwrapper(name), msg_id=None)
    await bus.publish(tomb, appwrapper(name, deleted=True), msg_id=None, ttl=1)
    stored = await bus.js.get_last_msg(subjects.OBSERVATIONS_STREAM, tomb)
    assert stored.headers[TTL_HEADER] == "1s"
    assert (
        await subject_count(bus, subjects.OBSERVATIONS_STREAM, tomb) == 1
    )  # the tombstone replaced the state

    async def gone() -> bool:
        return await subject_count(bus, subjects.OBSERVATIONS_STREAM, tomb) == 0

    await until("the tombstone to expire", gone, within=15)
    assert await subject_count(bus, subjects.OBSERVATIONS_STREAM, alive) == 1  # without a TTL: kept


async def test_subject_delete_markers_are_acked_not_dead_lettered(bus: Bus) -> None:
    """An operator may turn delete markers on: the server then writes messages of its own."""
    name = f"T_{uid()}"
    prefix = f"respawn-test.{name.lower()}"
    await bus.js.add_stream(
        api.StreamConfig(
            name=name,
            subjects=[f"{prefix}.>"],
            storage=api.StorageType.FILE,
            allow_msg_ttl=True,
            subject_delete_marker_ttl=60.0,
            max_age=1.0,
            duplicate_window=1.0,
        )
    )
    handled: list[int] = []

    async def handler(msg: Verdict, delivery: Delivery) -> None:
        handled.append(msg.seq)

    await bus.publish(f"{prefix}.a", verdict("a", seq=1), msg_id=None)
    durable = f"t_{uid()}"
    consumer = await bus.consume(name, durable, f"{prefix}.>", Verdict, handler)
    await until("the message", lambda: handled == [1])

    async def marker_settled() -> bool:
        info = await bus.js.stream_info(name)
        ci = await bus.js.consumer_info(name, durable)
        # The message aged out and the server wrote a marker (sequence 2) in its place.
        return bool(info.state.last_seq >= 2 and ci.ack_floor.stream_seq >= 2 and ci.num_ack_pending == 0)

    await until("the delete marker to be delivered and acked", marker_settled, within=20)
    assert handled == [1]
    base = {"service": bus.service, "stream": name}
    assert metric("respawn_bus_dead_lettered_total", **base, reason="invalid") == 0
    assert metric("respawn_bus_messages_acked_total", **base) == 2
    await consumer.stop()


# ------------------------------------------------------------------ 3. a server that loses its store


async def wipe_and_restart(server: NatsServer) -> None:
    await asyncio.to_thread(server.stop)
    shutil.rmtree(server.store_dir)
    await asyncio.to_thread(server.start)


async def test_streams_and_consumers_come_back_after_the_server_loses_its_store(
    own_nats: NatsServer, own_bus: Bus
) -> None:
    server, b = own_nats, own_bus
    verdicts: list[int] = []
    nodes: list[str] = []

    async def on_verdict(msg: Verdict, delivery: Delivery) -> None:
        verdicts.append(msg.seq)

    async def on_node(msg: NodeObservation, delivery: Delivery) -> None:
        nodes.append(msg.name)

    subject = subjects.verdict("ns", "lost")
    await b.consume(
        subjects.VERDICTS_STREAM, "lifecycle-verdicts", subject, Verdict, on_verdict, fetch_timeout=0.5
    )
    replay = await b.replay(
        subjects.OBSERVATIONS_STREAM,
        f"health-{uid()}",
        subjects.node_obs_filter(),
        NodeObservation,
        on_node,
    )
    await replay.wait_caught_up()
    await b.publish(subject, verdict("lost", seq=1), msg_id="one")
    await b.publish(subjects.node_obs("n1"), NodeObservation(name="n1", observed_at=NOW), msg_id=None)
    await until("both consumers before the loss", lambda: verdicts == [1] and nodes == ["n1"])
    await until("readiness", b.ready)

    await asyncio.to_thread(server.stop)
    await until("readiness to drop with the server", lambda: not b.ready())
    shutil.rmtree(server.store_dir)  # the store is gone: no streams, no consumers
    await asyncio.to_thread(server.start)

    # Without a restart of the client: streams and durables are created again from their specs.
    await until("readiness after the store came back", b.ready, within=30)
    await b.publish(subject, verdict("lost", seq=2), msg_id="two")
    await b.publish(subjects.node_obs("n2"), NodeObservation(name="n2", observed_at=NOW), msg_id=None)
    await until("both consumers after the loss", lambda: verdicts == [1, 2] and nodes[-1] == "n2", within=30)
    config = (await b.js.stream_info(subjects.OBSERVATIONS_STREAM)).config
    assert config.allow_msg_ttl and config.max_msgs_per_subject == 1 and config.max_bytes > 0
    durable = await b.js.consumer_info(subjects.VERDICTS_STREAM, "lifecycle-verdicts")
    assert durable.config.filter_subject == subject and durable.config.max_deliver == 10


async def test_a_publisher_alone_creates_its_stream_again(own_nats: NatsServer, own_bus: Bus) -> None:
    """The watcher has no consumer that would notice: its publish does."""
    server, b = own_nats, own_bus
    subject = subjects.node_obs("n1")
    await b.publish(subject, NodeObservation(name="n1", observed_at=NOW), msg_id=None)
    await wipe_and_restart(server)
    published = await b.publish(
        subject, NodeObservation(name="n1", observed_at=NOW), msg_id=None, retry_for=30
    )
    assert (published.stream, published.seq) == (subjects.OBSERVATIONS_STREAM, 1)  # a new, empty stream
    assert (await b.js.stream_info(subjects.OBSERVATIONS_STREAM)).config.allow_msg_ttl


async def test_readiness_says_why_while_the_stream_cannot_be_created_again(bus: Bus) -> None:
    name = f"T_{uid()}"
    prefix = f"respawn-test.{name.lower()}"
    await bus.ensure_stream(StreamSpec(name=name, subjects=(f"{prefix}.>",)))
    handled: list[int] = []

    async def handler(msg: Verdict, delivery: Delivery) -> None:
        handled.append(msg.seq)

    consumer = await bus.consume(name, f"t_{uid()}", f"{prefix}.>", Verdict, handler, fetch_timeout=0.2)
    await until("readiness", bus.ready)
    # The stream goes, and another stream holding its subjects keeps it from being created again.
    await bus.js.delete_stream(name)
    blocker = f"{name}_BLOCKER"
    await bus.js.add_stream(
        api.StreamConfig(name=blocker, subjects=[f"{prefix}.>"], storage=api.StorageType.MEMORY)
    )
    await until("readiness to drop", lambda: not bus.ready())
    problems = await until(
        "the reason: the stream cannot be created", lambda: [p for p in bus.problems() if "overlap" in p]
    )
    assert problems[0].startswith(
        f"consumer {name}/{consumer.durable}: BusError: cannot create stream {name}"
    )
    assert not bus.ready()

    await bus.js.delete_stream(blocker)
    await until("readiness once the stream could be created again", bus.ready, within=30)
    assert bus.problems() == []
    await bus.publish(f"{prefix}.a", verdict("a", seq=3), msg_id=None)
    await until("the consumer to work again", lambda: handled == [3])


# ------------------------------------------------------------------ 5. poison messages


async def consume_verdicts(bus: Bus, ns: str, handler: Handler[Verdict], **options: Any) -> Consumer[Verdict]:
    """A consumer of the verdicts of namespace ``ns``, under a durable of its own."""
    return await bus.consume(
        subjects.VERDICTS_STREAM,
        f"t_{uid()}",
        subjects.verdict_filter(ns),
        Verdict,
        handler,
        **options,
    )


async def test_a_poison_message_is_dead_lettered_and_other_keys_and_later_messages_go_on(bus: Bus) -> None:
    run = uid()
    ns = f"poison{run}"
    poison, other = subjects.verdict(ns, "bad"), subjects.verdict(ns, "good")
    handled: list[tuple[str, int]] = []
    attempts: list[int] = []

    async def handler(msg: Verdict, delivery: Delivery) -> None:
        if msg.seq == 1 and msg.ref.name == "bad":
            attempts.append(delivery.num_delivered)
            raise ValueError(f"cannot handle {msg.ref.name}")
        handled.append((msg.ref.name, msg.seq))

    await bus.publish(poison, verdict("bad", seq=1), msg_id=None)
    await bus.publish(poison, verdict("bad", seq=2), msg_id=None)
    for seq in (1, 2, 3):
        await bus.publish(other, verdict("good", seq=seq), msg_id=None)
    await consume_verdicts(bus, ns, handler, concurrency=4, max_deliver=3)
    # Neither the other key nor the poison key's next message waits for the poison one.
    await until(
        "the other messages", lambda: {("good", 1), ("good", 2), ("good", 3), ("bad", 2)} <= set(handled)
    )
    base = {"service": bus.service, "stream": subjects.VERDICTS_STREAM}
    await until(
        "the poison message's dead letter",
        lambda: metric("respawn_bus_dead_lettered_total", **base, reason=DL_MAX_DELIVERIES) == 1,
    )
    assert attempts == [1, 2, 3]
    [letter] = await dead_letters(bus, 1)
    assert "ValueError: cannot handle bad" in letter.headers[DL_ERROR_HEADER]
    assert letter.headers[DL_SUBJECT_HEADER] == poison


async def test_retries_asked_for_do_not_count_toward_the_error_budget(bus: Bus) -> None:
    """A consumer that holds messages on purpose (lifecycle's held verdicts) needs a large
    max_deliver; ``max_errors`` still dead-letters a message whose handler keeps failing."""
    ns = f"budget{uid()}"
    held, poison = subjects.verdict(ns, "held"), subjects.verdict(ns, "poison")
    seen: dict[str, list[int]] = {"held": [], "poison": []}
    done: list[str] = []

    async def handler(msg: Verdict, delivery: Delivery) -> None:
        name = msg.ref.name
        seen[name].append(delivery.num_delivered)
        if delivery.num_delivered <= 5:
            raise TransientError("not yet", delay=0.05)  # held: five times each
        if name == "poison":
            raise RuntimeError("broken")
        done.append(name)

    await bus.publish(held, verdict("held", seq=1), msg_id=None)
    await bus.publish(poison, verdict("poison", seq=1), msg_id=None)
    await consume_verdicts(bus, ns, handler, max_deliver=100_000, max_errors=2)
    base = {"service": bus.service, "stream": subjects.VERDICTS_STREAM}
    await until(
        "the failing message's dead letter",
        lambda: metric("respawn_bus_dead_lettered_total", **base, reason=DL_MAX_ERRORS) == 1,
    )
    await until("the held message to be handled", lambda: done == ["held"])
    assert seen["held"] == [1, 2, 3, 4, 5, 6]  # five retries asked for, then handled: never dead-lettered
    assert seen["poison"] == [1, 2, 3, 4, 5, 6, 7]  # five retries, then two errors: dead-lettered
    [letter] = await dead_letters(bus, 1)
    assert letter.headers[DL_REASON_HEADER] == DL_MAX_ERRORS
    assert letter.headers[DL_DELIVERIES_HEADER] == "7"
    assert "RuntimeError: broken" in letter.headers[DL_ERROR_HEADER]
