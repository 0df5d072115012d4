"""The bus adapter against a real nats-server with JetStream."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import msgpack
import pytest
from nats.js import api
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import REGISTRY

from respawn.testbed.nats import NatsServer
from shared import subjects
from shared.bus import (
    DL_CONSUMER_HEADER,
    DL_ERROR_HEADER,
    DL_MAX_DELIVERIES,
    DL_REASON_HEADER,
    DL_SEQUENCE_HEADER,
    DL_STREAM_HEADER,
    DL_SUBJECT_HEADER,
    DL_UNSUPPORTED_VERSION,
    MSG_ID_HEADER,
    Bus,
    BusError,
    Delivery,
    StreamSpec,
    TransientError,
    default_streams,
)
from shared.bus.consume import IDLE_WAIT
from shared.bus.pull import Puller
from shared.messages import SCHEMA_HEADER, NodeObservation, ObjectRef, Verdict
from tests.nats_fixtures import dead_letters, read_all
from tests.waiting import until

pytestmark = pytest.mark.nats


# ------------------------------------------------------------------ helpers


def uid() -> str:
    return uuid.uuid4().hex[:10]


async def eventually(
    check: Callable[[], bool | Awaitable[bool]], *, within: float = 15.0, what: str = "condition"
) -> None:
    await until(what, check, within=within, every=0.02)


def verdict(name: str, *, seq: int = 0) -> Verdict:
    return Verdict(
        ref=ObjectRef(namespace="ns", name=name, uid=f"uid-{name}"),
        state="Healthy",
        decided_at=datetime(2025, 1, 1, tzinfo=UTC),
        seq=seq,
    )


async def ignore(msg: Verdict, delivery: Delivery) -> None:
    """A handler that accepts every message."""


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


# ------------------------------------------------------------------ set-up


async def test_setup_twice_is_idempotent(bus: Bus) -> None:
    await bus.ensure_streams()  # the fixture already did it once
    for spec in default_streams():
        info = await bus.js.stream_info(spec.name)
        assert sorted(info.config.subjects) == sorted(spec.subjects)
        assert info.config.max_msgs_per_subject == spec.max_msgs_per_subject
        assert info.config.duplicate_window == pytest.approx(bus.duplicate_window)
    obs = await bus.js.stream_info(subjects.OBSERVATIONS_STREAM)
    assert obs.config.max_msgs_per_subject == 1  # observations keep only the latest state

    durable = f"t_{uid()}"
    config = api.ConsumerConfig(
        name=durable,
        durable_name=durable,
        ack_policy=api.AckPolicy.EXPLICIT,
        filter_subject=subjects.verdict("x", durable),
        max_deliver=5,
    )
    await bus.ensure_consumer(subjects.VERDICTS_STREAM, config)
    await bus.ensure_consumer(subjects.VERDICTS_STREAM, config.evolve(max_deliver=7))
    info = await bus.js.consumer_info(subjects.VERDICTS_STREAM, durable)
    assert info.config.max_deliver == 7  # updated in place, not duplicated or refused


async def test_stream_with_other_config_is_updated_or_kept_without_crashing(
    bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    name = f"T_{uid()}"
    subject = f"respawn-test.{name}.>"
    await bus.js.add_stream(
        api.StreamConfig(name=name, subjects=[subject], max_msgs_per_subject=5, storage=api.StorageType.FILE)
    )
    spec = StreamSpec(name=name, subjects=(subject,), max_msgs_per_subject=1)
    await bus.ensure_stream(spec)
    assert (await bus.js.stream_info(name)).config.max_msgs_per_subject == 1

    # The storage type can never change; the bus logs and keeps the stream as it is.
    mem = f"T_{uid()}"
    mem_subject = f"respawn-test.{mem}.>"
    await bus.js.add_stream(
        api.StreamConfig(name=mem, subjects=[mem_subject], storage=api.StorageType.MEMORY)
    )
    with caplog.at_level("ERROR", logger="shared.bus"):
        await bus.ensure_stream(StreamSpec(name=mem, subjects=(mem_subject,)))
    assert (await bus.js.stream_info(mem)).config.storage == api.StorageType.MEMORY
    assert any(mem in r.getMessage() and "refused" in r.getMessage() for r in caplog.records)


async def test_connect_failure_names_the_server() -> None:
    with pytest.raises(BusError, match=r"could not connect to NATS at nats://127\.0\.0\.1:1 within"):
        await Bus.connect("nats://127.0.0.1:1", name="nobody", connect_deadline=1.0)


# ------------------------------------------------------------------ publish


async def test_publish_deduplicates_by_msg_id_and_sets_headers(bus: Bus) -> None:
    subject = subjects.verdict("dedup", uid())
    provider = TracerProvider()
    with provider.get_tracer("test").start_as_current_span("incident") as span:
        first = await bus.publish(subject, verdict("a", seq=1), msg_id="same-id")
    second = await bus.publish(subject, verdict("a", seq=2), msg_id="same-id")
    assert first.stream == subjects.VERDICTS_STREAM
    assert not first.duplicate
    assert second.duplicate
    assert second.seq == first.seq

    stored = await bus.js.get_last_msg(subjects.VERDICTS_STREAM, subject)
    assert stored.seq == first.seq
    assert stored.headers[MSG_ID_HEADER] == "same-id"
    assert stored.headers[SCHEMA_HEADER] == "verdict/v1"
    # The active trace travels with the message (W3C traceparent: version-trace-span-flags).
    assert stored.headers["traceparent"].split("-")[1] == format(span.get_span_context().trace_id, "032x")
    info = await bus.js.stream_info(subjects.VERDICTS_STREAM, subjects_filter=subject)
    assert info.state.subjects == {subject: 1}


async def test_public_messages_go_in_the_configured_encoding_and_a_mixed_stream_reads_whole(
    bus: Bus, nats_url: str
) -> None:
    ns = f"enc{uid()}"
    subject = subjects.verdict(ns, "aw")
    buses = {"json": bus}
    for encoding in ("cloudevents", "msgpack"):
        buses[encoding] = await Bus.connect(
            nats_url, name=f"test-{encoding}-{uid()}", public_encoding=encoding
        )
    try:
        for seq, b in enumerate(buses.values(), start=1):
            await b.publish(subject, verdict("aw", seq=seq), msg_id=f"{ns}-{seq}")
        # An observation is internal: msgpack whatever the public encoding.
        obs_subject = subjects.node_obs(f"n-{ns}")
        await buses["cloudevents"].publish(
            obs_subject,
            NodeObservation(name=f"n-{ns}", observed_at=datetime(2025, 1, 1, tzinfo=UTC)),
            msg_id=None,
        )
    finally:
        for encoding in ("cloudevents", "msgpack"):
            await buses[encoding].close()
    stored = await read_all(bus, subjects.VERDICTS_STREAM, subject, 3)
    as_json, as_cloudevent, as_msgpack = stored
    assert as_json.headers["content-type"] == "application/json"
    assert not any(k.startswith("ce-") for k in as_json.headers)
    assert json.loads(as_json.data)["seq"] == 1
    assert as_cloudevent.headers["content-type"] == "application/json"
    assert {k: v for k, v in as_cloudevent.headers.items() if k.startswith("ce-")} == {
        "ce-specversion": "1.0",
        "ce-id": f"{ns}-2",
        "ce-type": "dev.respawn.verdict.v1",
        "ce-source": buses["cloudevents"].service,
        "ce-subject": "ns/aw",
        "ce-time": "2025-01-01T00:00:00Z",
    }
    assert json.loads(as_cloudevent.data)["seq"] == 2
    assert "content-type" not in as_msgpack.headers
    assert msgpack.unpackb(as_msgpack.data)["seq"] == 3
    [obs] = await read_all(bus, subjects.OBSERVATIONS_STREAM, obs_subject, 1)
    assert "content-type" not in obs.headers and msgpack.unpackb(obs.data)["name"] == f"n-{ns}"

    # One consumer reads all three, each by its header.
    seen: list[int] = []

    async def handler(msg: Verdict, delivery: Delivery) -> None:
        seen.append(msg.seq)

    consumer = await bus.consume(subjects.VERDICTS_STREAM, f"t_{uid()}", subject, Verdict, handler)
    await eventually(lambda: len(seen) == 3, what="all three verdicts handled")
    assert seen == [1, 2, 3]
    await consumer.stop()


# ------------------------------------------------------------------ consume


async def test_ack_only_after_the_handler_returns(bus: Bus) -> None:
    subject = subjects.verdict("ack", uid())
    durable = f"t_{uid()}"
    entered = asyncio.Event()
    release = asyncio.Event()
    done: list[int] = []

    async def handler(msg: Verdict, delivery: Delivery) -> None:
        entered.set()
        await release.wait()
        done.append(msg.seq)

    await bus.publish(subject, verdict("a", seq=7), msg_id=None)
    consumer = await bus.consume(subjects.VERDICTS_STREAM, durable, subject, Verdict, handler)
    await asyncio.wait_for(entered.wait(), 15)
    info = await bus.js.consumer_info(subjects.VERDICTS_STREAM, durable)
    assert info.num_ack_pending == 1  # delivered, handler still running: not acked yet
    release.set()

    async def acked() -> bool:
        i = await bus.js.consumer_info(subjects.VERDICTS_STREAM, durable)
        return bool(i.num_ack_pending == 0 and i.ack_floor.stream_seq == i.delivered.stream_seq)

    await eventually(acked, what="the ack")
    assert done == [7]
    assert (
        metric("respawn_bus_messages_acked_total", service=bus.service, stream=subjects.VERDICTS_STREAM) == 1
    )
    await consumer.stop()


async def test_keyed_concurrency_overlaps_subjects_and_keeps_each_subject_in_order(bus: Bus) -> None:
    run = uid()
    ns = f"keyed{run}"
    slow, fast = subjects.verdict(ns, f"slow-{run}"), subjects.verdict(ns, f"fast-{run}")
    release = asyncio.Event()
    order: list[tuple[str, int]] = []
    active: dict[str, int] = {}
    overlap: list[str] = []

    async def handler(msg: Verdict, delivery: Delivery) -> None:
        name = msg.ref.name
        active[name] = active.get(name, 0) + 1
        if active[name] > 1:
            overlap.append(name)  # two messages of one subject at once: order broken
        try:
            if name.startswith("slow") and msg.seq == 1:
                await release.wait()  # the slow subject's first message blocks ...
            order.append((name.split("-")[0], msg.seq))
        finally:
            active[name] -= 1

    for seq in (1, 2, 3):
        await bus.publish(slow, verdict(f"slow-{run}", seq=seq), msg_id=None)
    for seq in (1, 2, 3):
        await bus.publish(fast, verdict(f"fast-{run}", seq=seq), msg_id=None)
    filters = subjects.verdict_filter(ns)
    consumer = await bus.consume(
        subjects.VERDICTS_STREAM, f"t_{uid()}", filters, Verdict, handler, concurrency=4
    )
    # ... yet the other subject's messages are all handled meanwhile, in their order,
    await eventually(lambda: [o for o in order if o[0] == "fast"] == [("fast", 1), ("fast", 2), ("fast", 3)])
    assert not any(o[0] == "slow" for o in order)
    release.set()
    # and the blocked subject then goes on in its own order.
    await eventually(lambda: [o for o in order if o[0] == "slow"] == [("slow", 1), ("slow", 2), ("slow", 3)])
    assert overlap == []

    async def all_acked() -> bool:
        i = await bus.js.consumer_info(subjects.VERDICTS_STREAM, consumer.durable)
        return bool(i.num_ack_pending == 0 and i.num_pending == 0)

    await eventually(all_acked, what="every message acked")
    await consumer.stop()


async def test_concurrency_below_one_is_refused(bus: Bus) -> None:
    with pytest.raises(ValueError, match="concurrency must be at least 1"):
        await bus.consume(
            subjects.VERDICTS_STREAM,
            f"t_{uid()}",
            subjects.verdict("x", uid()),
            Verdict,
            ignore,
            concurrency=0,
        )


async def test_transient_error_redelivers_the_message(bus: Bus) -> None:
    subject = subjects.verdict("transient", uid())
    seen: list[tuple[int, int]] = []

    async def handler(msg: Verdict, delivery: Delivery) -> None:
        seen.append((msg.seq, delivery.num_delivered))
        if delivery.num_delivered == 1:
            raise TransientError("not yet", delay=0.1)

    await bus.publish(subject, verdict("a", seq=1), msg_id=None)
    await bus.consume(subjects.VERDICTS_STREAM, f"t_{uid()}", subject, Verdict, handler)
    await eventually(lambda: len(seen) >= 2, what="the redelivery")
    assert seen[:2] == [(1, 1), (1, 2)]
    await eventually(
        lambda: (
            metric("respawn_bus_messages_acked_total", service=bus.service, stream=subjects.VERDICTS_STREAM)
            == 1
        ),
        what="the ack after the retry",
    )
    labels = {"service": bus.service, "stream": subjects.VERDICTS_STREAM, "reason": "transient"}
    assert metric("respawn_bus_messages_naked_total", **labels) == 1


async def test_garbage_and_newer_versions_are_dead_lettered_and_consuming_goes_on(bus: Bus) -> None:
    subject = subjects.verdict("poison", uid())
    durable = f"t_{uid()}"
    handled: list[int] = []

    async def handler(msg: Verdict, delivery: Delivery) -> None:
        handled.append(msg.seq)

    newer = verdict("a", seq=2).model_dump(mode="json") | {"schema_version": 99}
    garbage_ack = await bus.js.publish(subject, b"\xc1 definitely not msgpack")
    newer_ack = await bus.js.publish(subject, msgpack.packb(newer))
    await bus.publish(subject, verdict("a", seq=3), msg_id=None)

    consumer = await bus.consume(subjects.VERDICTS_STREAM, durable, subject, Verdict, handler)
    await eventually(lambda: handled == [3], what="the good message after two bad ones")
    assert consumer.running

    letters = await dead_letters(bus, 2)
    by_seq = {int(m.headers[DL_SEQUENCE_HEADER]): m for m in letters}
    assert set(by_seq) == {garbage_ack.seq, newer_ack.seq}
    garbage = by_seq[garbage_ack.seq]
    assert garbage.data == b"\xc1 definitely not msgpack"  # the raw bytes, untouched
    assert garbage.headers[DL_REASON_HEADER] == "invalid"
    assert garbage.headers[DL_SUBJECT_HEADER] == subject
    assert garbage.headers[DL_STREAM_HEADER] == subjects.VERDICTS_STREAM
    assert garbage.headers[DL_CONSUMER_HEADER] == durable
    assert "not msgpack" in garbage.headers[DL_ERROR_HEADER]
    assert by_seq[newer_ack.seq].headers[DL_REASON_HEADER] == DL_UNSUPPORTED_VERSION
    assert "newer than supported" in by_seq[newer_ack.seq].headers[DL_ERROR_HEADER]

    base = {"service": bus.service, "stream": subjects.VERDICTS_STREAM}
    assert metric("respawn_bus_dead_lettered_total", **base, reason="invalid") == 1
    assert metric("respawn_bus_dead_lettered_total", **base, reason=DL_UNSUPPORTED_VERSION) == 1

    async def nothing_pending() -> bool:
        info = await bus.js.consumer_info(subjects.VERDICTS_STREAM, durable)
        return bool(info.num_ack_pending == 0 and info.num_pending == 0)

    await eventually(nothing_pending, what="terminated poison messages to leave the consumer")


async def test_handler_crash_is_retried_then_dead_lettered_when_deliveries_run_out(bus: Bus) -> None:
    subject = subjects.verdict("crash", uid())
    attempts: list[int] = []
    handled: list[int] = []

    async def handler(msg: Verdict, delivery: Delivery) -> None:
        if msg.seq == 1:
            attempts.append(delivery.num_delivered)
            raise RuntimeError("boom")
        handled.append(msg.seq)

    await bus.publish(subject, verdict("a", seq=1), msg_id=None)
    await bus.publish(subject, verdict("a", seq=2), msg_id=None)
    await bus.consume(subjects.VERDICTS_STREAM, f"t_{uid()}", subject, Verdict, handler, max_deliver=2)

    base = {"service": bus.service, "stream": subjects.VERDICTS_STREAM}
    await eventually(
        lambda: metric("respawn_bus_dead_lettered_total", **base, reason=DL_MAX_DELIVERIES) == 1,
        what="the dead letter after the last delivery",
    )
    assert attempts == [1, 2]
    assert handled == [2]
    assert metric("respawn_bus_handler_errors_total", **base) == 2
    [letter] = await dead_letters(bus, 1)
    assert letter.headers[DL_REASON_HEADER] == DL_MAX_DELIVERIES
    assert "RuntimeError: boom" in letter.headers[DL_ERROR_HEADER]


async def test_stop_is_prompt_and_readiness_follows(bus: Bus) -> None:
    consumer = await bus.consume(
        subjects.VERDICTS_STREAM,
        f"t_{uid()}",
        subjects.verdict("stop", uid()),
        Verdict,
        ignore,
        fetch_timeout=5.0,
    )
    await eventually(bus.ready, what="the consumer to bind")
    started = time.monotonic()
    await consumer.stop()
    assert time.monotonic() - started < 2.0  # does not wait for the 5 s fetch
    assert consumer.task is not None and consumer.task.done()
    assert not consumer.running
    assert consumer not in bus.consumers


async def test_stopping_a_busy_keyed_consumer_waits_for_its_handler_only(bus: Bus) -> None:
    """A consumer that handles subjects side by side, stopped while a handler runs: it lets the
    handler finish (its message is acked), then stops at once, not when its wait for more
    messages would have ended."""
    ns = f"busystop{uid()}"
    started, release = asyncio.Event(), asyncio.Event()
    handled: list[int] = []

    async def handler(msg: Verdict, delivery: Delivery) -> None:
        started.set()
        await release.wait()
        handled.append(msg.seq)

    consumer = await bus.consume(
        subjects.VERDICTS_STREAM,
        f"t_{uid()}",
        subjects.verdict_filter(ns),
        Verdict,
        handler,
        concurrency=4,
        fetch_timeout=5.0,
    )
    await bus.publish(subjects.verdict(ns, "a"), verdict("a", seq=1), msg_id=None)
    await asyncio.wait_for(started.wait(), 10)
    stopping = asyncio.create_task(consumer.stop(grace=10.0))
    await asyncio.sleep(0.2)
    assert not stopping.done()  # the handler is still under way
    release.set()
    released = time.monotonic()
    await asyncio.wait_for(stopping, 10)
    assert time.monotonic() - released < 2.0, "stop waited for more than the handler"
    assert handled == [1]
    info = await bus.js.consumer_info(subjects.VERDICTS_STREAM, consumer.durable)
    assert info.num_ack_pending == 0 and info.num_pending == 0


async def test_cancelled_flushes_leave_the_connection_working(bus: Bus) -> None:
    """A flush whose caller is cancelled leaves its PONG to come. nats-py's reader stopped for
    good on such a PONG, and from then on nothing reached the process: no message, no ack, no
    reply. The connection must go on working."""
    for _ in range(3):
        flush = asyncio.create_task(bus.nc.flush())
        await asyncio.sleep(0)  # its PING is on its way
        flush.cancel()
        await asyncio.gather(flush, return_exceptions=True)
    await bus.nc.flush(timeout=5)  # a later flush gets its own PONG
    ns = f"flush{uid()}"
    published = await bus.publish(subjects.verdict(ns, "a"), verdict("a", seq=1), msg_id=None)
    assert published.seq > 0  # the stream's acknowledgement, a reply, arrived


async def test_a_consumer_fed_one_message_at_a_time_asks_the_server_once_not_per_message(bus: Bus) -> None:
    """One pull request stays outstanding and every message that arrives is handled at once; the
    pull requests are counted on their own subject, as the server receives them."""
    subject = subjects.verdict("trickle", uid())
    durable = f"t_{uid()}"
    requests: list[bytes] = []

    async def count(msg: object) -> None:
        requests.append(getattr(msg, "data", b""))

    watch = await bus.nc.subscribe(
        f"$JS.API.CONSUMER.MSG.NEXT.{subjects.VERDICTS_STREAM}.{durable}", cb=count
    )
    handled: list[float] = []

    async def note(msg: Verdict, delivery: Delivery) -> None:
        handled.append(time.monotonic())

    consumer = await bus.consume(subjects.VERDICTS_STREAM, durable, subject, Verdict, note, fetch_timeout=0.2)
    try:
        await eventually(lambda: len(requests) >= 1, what="the first pull request")
        lags = []
        for seq in range(1, 21):
            sent = time.monotonic()
            await bus.publish(subject, verdict("a", seq=seq), msg_id=None)
            await eventually(_count_is(handled, seq), what=f"message {seq} handled")
            lags.append(handled[-1] - sent)
        # 20 messages one at a time, with the loop's 0.2 s fetch timeouts running out between
        # them: the first request (128 messages, 30 s) is still the one outstanding.
        assert len(requests) == 1, [r.decode() for r in requests]
        assert json.loads(requests[0]) == {"batch": 128, "expires": 30_000_000_000}
        assert max(lags) < 1.0  # none waited for a request or a timeout
    finally:
        await consumer.stop()
        await watch.unsubscribe()


def _count_is(handled: list[float], n: int) -> Callable[[], bool]:
    return lambda: len(handled) == n


async def test_messages_a_stopped_consumer_held_go_to_the_next_at_once_not_after_the_ack_wait(
    bus: Bus,
) -> None:
    """The first consumer is handed five messages and stops while the first is being handled: the
    four it held are nak'ed, so that the next consumer on the durable gets them at once."""
    subject = subjects.verdict("handover", uid())
    durable = f"t_{uid()}"
    entered = asyncio.Event()
    first: list[int] = []

    async def stuck(msg: Verdict, delivery: Delivery) -> None:
        first.append(msg.seq)
        entered.set()
        await asyncio.sleep(3600)

    for seq in range(1, 6):
        await bus.publish(subject, verdict("a", seq=seq), msg_id=None)
    a = await bus.consume(subjects.VERDICTS_STREAM, durable, subject, Verdict, stuck, ack_wait=60.0)
    await asyncio.wait_for(entered.wait(), 15)
    await a.stop(grace=0.5)
    assert first == [1]
    second: list[int] = []

    async def keep(msg: Verdict, delivery: Delivery) -> None:
        second.append(msg.seq)

    started = time.monotonic()
    b = await bus.consume(subjects.VERDICTS_STREAM, durable, subject, Verdict, keep, ack_wait=60.0)
    try:
        await eventually(lambda: {2, 3, 4, 5} <= set(second), within=20, what="the held messages")
        assert time.monotonic() - started < 20  # far below the 60 s ack wait
    finally:
        await b.stop()


async def test_consumer_keeps_working_across_a_server_restart(own_nats: NatsServer, own_bus: Bus) -> None:
    server, b = own_nats, own_bus
    subject = subjects.verdict("restart", uid())
    handled: list[int] = []

    async def handler(msg: Verdict, delivery: Delivery) -> None:
        handled.append(msg.seq)

    await b.consume(subjects.VERDICTS_STREAM, "restart", subject, Verdict, handler, fetch_timeout=0.5)
    await b.publish(subject, verdict("a", seq=1), msg_id="one")
    await eventually(lambda: handled == [1], what="the message before the restart")

    await asyncio.to_thread(server.stop)
    await eventually(lambda: not b.ready(), what="readiness to drop with the server")
    # A publish while the server is down keeps retrying until JetStream is back...
    pending = asyncio.create_task(b.publish(subject, verdict("a", seq=2), msg_id="two"))
    await asyncio.to_thread(server.start)
    await asyncio.wait_for(pending, 30)
    # ...and the consumer re-binds after reconnecting and goes on.
    await b.publish(subject, verdict("a", seq=3), msg_id="three")
    await eventually(lambda: handled == [1, 2, 3], within=30, what="the messages after the restart")
    assert b.reconnects >= 1
    await eventually(b.ready, what="readiness after the restart")


async def test_an_idle_consumer_binds_again_as_soon_as_the_connection_is_back(
    own_nats: NatsServer, own_bus: Bus
) -> None:
    """An idle loop waits for a message for up to IDLE_WAIT (30 s), not per fetch timeout: the
    reconnect itself wakes it, so a message published after the server restarted (its pull
    request lost with it) is handled within seconds, far sooner than that wait."""
    server, b = own_nats, own_bus
    subject = subjects.verdict("idle-restart", uid())
    handled: list[int] = []

    async def handler(msg: Verdict, delivery: Delivery) -> None:
        handled.append(msg.seq)

    await b.consume(subjects.VERDICTS_STREAM, f"t_{uid()}", subject, Verdict, handler, fetch_timeout=0.2)
    await b.publish(subject, verdict("a", seq=1), msg_id=None)
    await eventually(lambda: handled == [1], what="the message before the restart")
    reconnects = b.reconnects
    await asyncio.to_thread(server.stop)
    await asyncio.to_thread(server.start)
    await eventually(lambda: b.reconnects > reconnects, within=30, what="the reconnect")
    back = time.monotonic()
    await b.publish(subject, verdict("a", seq=2), msg_id=None, retry_for=30)
    await eventually(lambda: handled == [1, 2], within=30, what="the message after the restart")
    assert time.monotonic() - back < IDLE_WAIT / 3


async def test_an_idle_consumer_does_not_wake_per_fetch_timeout(
    bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With nothing to deliver, the loop waits in one fetch (fetch_timeout 0.1 s would have been
    some 20 fetches in 2 s), and still handles the next message at once."""
    fetches: list[float] = []
    take = Puller.take

    async def counted(self: Puller, batch: int, within: float) -> list[object]:
        fetches.append(within)
        return await take(self, batch, within)

    monkeypatch.setattr(Puller, "take", counted)
    subject = subjects.verdict("idle", uid())
    handled: list[float] = []

    async def handler(msg: Verdict, delivery: Delivery) -> None:
        handled.append(time.monotonic())

    await bus.consume(subjects.VERDICTS_STREAM, f"t_{uid()}", subject, Verdict, handler, fetch_timeout=0.1)
    await eventually(lambda: len(fetches) >= 1, what="the first fetch")
    await asyncio.sleep(2.0)  # the quiet being measured, not a wait for something to happen
    assert len(fetches) <= 2, fetches
    assert all(w == IDLE_WAIT for w in fetches)
    sent = time.monotonic()
    await bus.publish(subject, verdict("a", seq=1), msg_id=None)
    await eventually(lambda: len(handled) == 1, what="the message")
    assert handled[0] - sent < 1.0


async def test_trace_context_round_trips_from_producer_to_consumer(nats_url: str) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    b = await Bus.connect(nats_url, name=f"test-{uid()}", tracer_provider=provider)
    try:
        await b.ensure_streams()
        subject = subjects.verdict("trace", uid())
        onward = subjects.lifecycle_event("trace", uid())
        seen: list[tuple[int, int, int]] = []

        async def handler(msg: Verdict, delivery: Delivery) -> None:
            remote = trace.get_current_span(delivery.trace_context).get_span_context()
            current = trace.get_current_span().get_span_context()
            seen.append((remote.trace_id, remote.span_id, current.trace_id))
            # Work done by the handler (here: a publish) continues the same trace.
            await b.publish(onward, verdict("b"), msg_id=None)

        with provider.get_tracer("test").start_as_current_span("incident") as root:
            await b.publish(subject, verdict("a"), msg_id=None)
        trace_id = root.get_span_context().trace_id

        await b.consume(subjects.VERDICTS_STREAM, f"t_{uid()}", subject, Verdict, handler)
        await eventually(lambda: len(seen) == 1, what="the traced message")

        spans = {
            (s.name, (s.attributes or {}).get("messaging.destination.name")): s
            for s in exporter.get_finished_spans()
        }
        producer = spans[("send verdict", subject)]
        assert producer.parent is not None and producer.parent.span_id == root.get_span_context().span_id
        assert seen[0] == (trace_id, producer.context.span_id, trace_id)
        consumer = spans[("process verdict", subject)]
        assert consumer.parent is not None and consumer.parent.span_id == producer.context.span_id
        assert consumer.kind == trace.SpanKind.CONSUMER
        onward_producer = spans[("send verdict", onward)]
        assert (
            onward_producer.parent is not None and onward_producer.parent.span_id == consumer.context.span_id
        )

        onward_msg = await b.js.get_last_msg(subjects.LIFECYCLE_STREAM, onward)
        assert onward_msg.headers["traceparent"].split("-")[1] == format(trace_id, "032x")
    finally:
        await b.close()
        provider.shutdown()


async def test_a_service_without_tracing_still_passes_the_trace_on(bus: Bus) -> None:
    subject = subjects.verdict("passthrough", uid())
    onward = subjects.lifecycle_event("passthrough", uid())
    seen: list[int] = []

    async def handler(msg: Verdict, delivery: Delivery) -> None:
        seen.append(trace.get_current_span().get_span_context().trace_id)
        await bus.publish(onward, verdict("b"), msg_id=None)

    upstream = TracerProvider()  # another service, which does trace
    with upstream.get_tracer("test").start_as_current_span("incident") as root:
        await bus.publish(subject, verdict("a"), msg_id=None)
    trace_id = root.get_span_context().trace_id

    await bus.consume(subjects.VERDICTS_STREAM, f"t_{uid()}", subject, Verdict, handler)
    await eventually(lambda: len(seen) == 1, what="the traced message")
    assert seen == [trace_id]
    onward_msg = await bus.js.get_last_msg(subjects.LIFECYCLE_STREAM, onward)
    assert onward_msg.headers["traceparent"].split("-")[1] == format(trace_id, "032x")
