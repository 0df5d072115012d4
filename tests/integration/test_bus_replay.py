"""Bus.replay against a real nats-server: load a stream into memory, say when that is done, follow it.

Each test has a stream of its own, so the stream's sequences are the test's own messages (1, 2,
...). Where a test shows that the end of the replay is found from the server's counts rather than
from a quiet period, the consumer's idle fetch waits far longer than the test allows.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime

import nats.js.errors
import pytest

from respawn.testbed.nats import NatsServer
from shared import subjects
from shared.bus import Bus, BusError, Delivery, Handler, Replay, StreamSpec, TransientError
from shared.bus.replay import CaughtUp
from shared.messages import ObjectRef, Verdict
from tests.waiting import until

pytestmark = pytest.mark.nats

# Longer than any wait below: a replay that needed an idle fetch to run out would time out.
NEVER = 60.0
SOON = 10.0


def uid() -> str:
    return uuid.uuid4().hex[:10]


def verdict(name: str, seq: int = 0) -> Verdict:
    return Verdict(
        ref=ObjectRef(namespace="ns", name=name, uid=f"uid-{name}"),
        state="Healthy",
        decided_at=datetime(2025, 1, 1, tzinfo=UTC),
        seq=seq,
    )


@dataclass
class Stream:
    name: str
    prefix: str

    @property
    def everything(self) -> str:
        return f"{self.prefix}.>"

    def subject(self, key: str) -> str:
        return f"{self.prefix}.{key}"


async def new_stream(bus: Bus) -> Stream:
    name = f"T_{uid()}"
    stream = Stream(name, f"respawn-test.{name.lower()}")
    await bus.ensure_stream(StreamSpec(name=name, subjects=(stream.everything,)))
    return stream


@dataclass
class Recorder:
    """What a replay's handler and ``on_caught_up`` saw, by stream sequence."""

    handled: list[int] = field(default_factory=list)
    # A copy of ``handled`` at each call of on_caught_up.
    at_catch_up: list[list[int]] = field(default_factory=list)

    async def handle(self, message: Verdict, delivery: Delivery) -> None:
        self.handled.append(delivery.stream_seq)

    async def caught_up(self) -> None:
        self.at_catch_up.append(list(self.handled))


async def publish(bus: Bus, stream: Stream, *keys: str) -> None:
    for index, key in enumerate(keys):
        await bus.publish(stream.subject(key), verdict(key, index), msg_id=None)


async def consumer_exists(bus: Bus, stream: str, durable: str) -> bool:
    try:
        await bus.js.consumer_info(stream, durable)
    except nats.js.errors.NotFoundError:
        return False
    return True


async def replay(
    bus: Bus,
    stream: Stream,
    recorder: Recorder,
    *,
    handler: Handler[Verdict] | None = None,
    filter_subjects: str | None = None,
    on_caught_up: CaughtUp | None = None,
    durable: str | None = None,
    **options: object,
) -> Replay[Verdict]:
    """A replay of ``stream`` (or of ``filter_subjects``) into ``recorder`` (or ``handler``),
    whose idle fetch waits NEVER unless told otherwise."""
    options.setdefault("fetch_timeout", NEVER)
    return await bus.replay(
        stream.name,
        durable or f"t_{uid()}",
        filter_subjects or stream.everything,
        Verdict,
        handler or recorder.handle,
        on_caught_up=on_caught_up or recorder.caught_up,
        **options,  # type: ignore[arg-type]
    )


def held(recorder: Recorder) -> tuple[Handler[Verdict], asyncio.Event, asyncio.Event]:
    """A handler into ``recorder`` that sets ``entered`` at its first message and holds that one
    until ``release`` is set."""
    entered, release = asyncio.Event(), asyncio.Event()

    async def handle(message: Verdict, delivery: Delivery) -> None:
        if not entered.is_set():
            entered.set()
            await release.wait()
        await recorder.handle(message, delivery)

    return handle, entered, release


# ------------------------------------------------------------------ the end of the replay


async def test_everything_stored_is_handled_before_the_replay_is_caught_up_then_it_follows(
    bus: Bus,
) -> None:
    stream = await new_stream(bus)
    await publish(bus, stream, "a", "b", "a", "c", "b")
    seen = Recorder()
    r = await replay(bus, stream, seen)
    await asyncio.wait_for(r.wait_caught_up(), SOON)
    assert r.caught_up
    assert seen.at_catch_up == [[1, 2, 3, 4, 5]]

    await publish(bus, stream, "d")
    await until("the message published after the replay", lambda: seen.handled == [1, 2, 3, 4, 5, 6])
    assert len(seen.at_catch_up) == 1  # once, however much follows


async def test_an_empty_stream_or_subject_set_is_caught_up_from_the_consumers_counts(bus: Bus) -> None:
    stream = await new_stream(bus)
    seen = Recorder()
    r = await replay(bus, stream, seen)
    await asyncio.wait_for(r.wait_caught_up(), SOON)  # an idle fetch would take NEVER
    assert seen.at_catch_up == [[]]

    # Messages on other subjects of the stream are not the replay's: its subject set is empty.
    await publish(bus, stream, "other")
    only = Recorder()
    r = await replay(bus, stream, only, filter_subjects=stream.subject("mine"))
    await asyncio.wait_for(r.wait_caught_up(), SOON)
    assert only.at_catch_up == [[]]


async def test_messages_published_during_the_replay_cannot_hold_it_open(bus: Bus) -> None:
    stream = await new_stream(bus)
    await publish(bus, stream, *(f"k{i}" for i in range(5)))
    seen = Recorder()
    replays: list[Replay[Verdict]] = []

    async def handle(message: Verdict, delivery: Delivery) -> None:
        seen.handled.append(delivery.stream_seq)
        if not (replays and replays[0].caught_up):
            # Always one more behind this one: no delivery ever has nothing pending.
            await bus.publish(stream.subject(f"new{delivery.stream_seq}"), verdict("new"), msg_id=None)

    r = await replay(bus, stream, seen, handler=handle)
    replays.append(r)
    await asyncio.wait_for(r.wait_caught_up(), SOON)
    # Caught up when the last message stored at the start was handled, not later.
    assert seen.at_catch_up == [[1, 2, 3, 4, 5]]
    # What arrived meanwhile is followed: one published per message handled before the end.
    await until("the messages published during the replay", lambda: seen.handled == list(range(1, 11)))


async def test_a_message_handed_back_for_a_retry_holds_the_replay_open(bus: Bus) -> None:
    stream = await new_stream(bus)
    await publish(bus, stream, "a", "b", "c", "d")
    seen = Recorder()
    retried: list[int] = []

    async def handle(message: Verdict, delivery: Delivery) -> None:
        if delivery.stream_seq == 1 and not retried:
            retried.append(delivery.stream_seq)
            raise TransientError("not yet", delay=0.5)
        await seen.handle(message, delivery)

    r = await replay(bus, stream, seen, handler=handle)
    await asyncio.wait_for(r.wait_caught_up(), SOON)
    # The last message was handled before the first came back, yet the end waited for it.
    assert retried == [1]
    assert seen.at_catch_up == [[2, 3, 4, 1]]


async def test_a_dead_lettered_last_message_still_ends_the_replay(bus: Bus) -> None:
    stream = await new_stream(bus)
    await publish(bus, stream, "a", "b")
    await bus.js.publish(stream.subject("garbage"), b"\xc1 not msgpack")
    seen = Recorder()
    r = await replay(bus, stream, seen)
    await asyncio.wait_for(r.wait_caught_up(), SOON)
    assert seen.at_catch_up == [[1, 2]]
    dead_letters = subjects.dead_letter(bus.service)
    info = await bus.js.stream_info(subjects.DEAD_LETTER_STREAM, subjects_filter=dead_letters)
    assert info.state.subjects == {dead_letters: 1}  # a following replay is a consumer: it dead-letters


async def test_a_read_returns_the_last_message_per_subject_and_leaves_nothing_behind(bus: Bus) -> None:
    stream = await new_stream(bus)
    await publish(bus, stream, "a", "b", "a", "b", "c")
    await bus.js.publish(stream.subject("c"), b"\xc1 not msgpack")  # the last of c is garbage
    latest: dict[str, int] = {}

    async def keep(message: Verdict, delivery: Delivery) -> None:
        latest[delivery.subject] = delivery.stream_seq

    durable = f"t_{uid()}"
    r = await bus.replay(
        stream.name, durable, stream.everything, Verdict, keep, last_per_subject=True, follow=False
    )
    assert r.caught_up
    assert latest == {stream.subject("a"): 3, stream.subject("b"): 4}
    assert not await consumer_exists(bus, stream.name, durable)
    assert r.consumer not in bus.consumers
    # A read is not the messages' consumer: it skips what it cannot decode without a dead letter.
    info = await bus.js.stream_info(subjects.DEAD_LETTER_STREAM)
    assert subjects.dead_letter(bus.service) not in (info.state.subjects or {})


# ------------------------------------------------------------------ the consumer under the replay


async def test_a_consumer_deleted_during_the_replay_is_created_again_and_the_replay_completes(
    bus: Bus,
) -> None:
    stream = await new_stream(bus)
    await publish(bus, stream, "a", "b", "c")
    seen = Recorder()
    handle, entered, release = held(seen)
    durable = f"t_{uid()}"
    r = await replay(bus, stream, seen, handler=handle, durable=durable)
    await asyncio.wait_for(entered.wait(), SOON)
    await bus.js.delete_consumer(stream.name, durable)
    release.set()
    await asyncio.wait_for(r.wait_caught_up(), SOON)
    # Every message, in order: those delivered before the delete are handled (their acks go
    # nowhere), and a consumer created again before the catch-up delivers from the start again.
    assert seen.at_catch_up in ([[1, 2, 3]], [[1, 1, 2, 3]], [[1, 2, 1, 2, 3]], [[1, 2, 3, 1, 2, 3]])
    # The loop finds its consumer gone at its next pull and creates it again.
    await until("the consumer created again", lambda: consumer_exists(bus, stream.name, durable), within=SOON)


async def test_a_server_restart_during_the_replay_does_not_lose_it(
    own_nats: NatsServer, own_bus: Bus
) -> None:
    server, b = own_nats, own_bus
    stream = await new_stream(b)
    await publish(b, stream, "a", "b", "c")
    seen = Recorder()
    handle, entered, release = held(seen)
    r = await replay(b, stream, seen, handler=handle)
    await asyncio.wait_for(entered.wait(), SOON)
    await asyncio.to_thread(server.stop)
    await until("the bus to see the server gone", lambda: not b.connected)
    await asyncio.to_thread(server.start)
    await until("the bus to reconnect", lambda: b.connected and b.reconnects >= 1, within=30)
    release.set()
    await asyncio.wait_for(r.wait_caught_up(), 30)
    # The consumer survived in the server's store; the unacknowledged first message may
    # come again, but nothing is missing and nothing came after the end.
    assert set(seen.at_catch_up[0]) == {1, 2, 3} and seen.at_catch_up[0][-1] == 3
    assert len(seen.at_catch_up) == 1


async def test_stop_and_close_delete_the_replays_consumer(bus: Bus, nats_url: str) -> None:
    stream = await new_stream(bus)
    first, second = f"t_{uid()}", f"t_{uid()}"
    r = await replay(bus, stream, Recorder(), durable=first)
    await r.stop()
    assert not await consumer_exists(bus, stream.name, first)
    assert r.consumer not in bus.consumers

    other = await Bus.connect(nats_url, name=f"test-{uid()}")
    try:
        await replay(other, stream, Recorder(), durable=second)
        assert await consumer_exists(bus, stream.name, second)
        await other.close()
        assert not await consumer_exists(bus, stream.name, second)
    finally:
        await other.close()


async def test_a_consumer_left_under_the_same_name_is_replaced_not_resumed(bus: Bus) -> None:
    stream = await new_stream(bus)
    await publish(bus, stream, "a", "b", "c")
    durable = f"t_{uid()}"
    earlier = Recorder()
    consumer = await bus.consume(stream.name, durable, stream.everything, Verdict, earlier.handle)

    async def all_acked() -> bool:
        info = await bus.js.consumer_info(stream.name, durable)
        return bool(info.num_pending == 0 and info.num_ack_pending == 0 and info.ack_floor.stream_seq == 3)

    await until("the earlier consumer to ack everything", all_acked)
    await consumer.stop()

    seen = Recorder()
    r = await replay(bus, stream, seen, durable=durable)
    await asyncio.wait_for(r.wait_caught_up(), SOON)
    assert seen.at_catch_up == [[1, 2, 3]]  # resuming would have delivered nothing


# ------------------------------------------------------------------ catching up


async def test_a_failing_catch_up_is_retried_until_it_succeeds(bus: Bus) -> None:
    stream = await new_stream(bus)
    await publish(bus, stream, "a")
    calls: list[int] = []

    async def catch_up() -> None:
        calls.append(len(calls) + 1)
        if len(calls) == 1:
            raise TransientError("the first attempt fails")

    seen = Recorder()
    r = await replay(bus, stream, seen, on_caught_up=catch_up)
    await asyncio.wait_for(r.wait_caught_up(), SOON)
    assert calls == [1, 2]
    assert r.caught_up


async def test_waiting_for_a_replay_that_stops_before_catching_up_fails(bus: Bus) -> None:
    stream = await new_stream(bus)
    await publish(bus, stream, "a")
    release = asyncio.Event()

    async def stuck(message: Verdict, delivery: Delivery) -> None:
        await release.wait()

    r = await bus.replay(stream.name, f"t_{uid()}", stream.everything, Verdict, stuck)
    waiting = asyncio.create_task(r.wait_caught_up())
    await r.stop(grace=0.1)
    with pytest.raises(BusError, match="stopped before it caught up"):
        await asyncio.wait_for(waiting, SOON)
    assert not r.caught_up
