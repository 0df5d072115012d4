"""Replicas of one service find each other through the NATS KV bucket and split the partitions;
a replica that stops hands its share over at once, one that dies after the member TTL."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import nats.js.errors
import pytest
from nats.js import api
from nats.js.client import JetStreamContext

from shared.bus import Bus
from shared.bus.membership import MEMBERS_BUCKET, MEMBERS_STREAM, Membership
from tests.nats_fixtures import connected_bus
from tests.waiting import PATIENCE, until

pytestmark = pytest.mark.asyncio

PARTITIONS = 12


class Replica:
    def __init__(
        self, bus: Bus, group: str, member: str, *, heartbeat: float = 0.2, ttl: float = 1.0
    ) -> None:
        self.changes: list[tuple[frozenset[int], frozenset[int]]] = []
        self.membership = Membership(
            bus,
            group,
            partitions=PARTITIONS,
            heartbeat=heartbeat,
            ttl=ttl,
            on_change=self.changed,
            member=member,
        )
        self.task: asyncio.Task[None] | None = None

    async def changed(self, previous: frozenset[int], current: frozenset[int]) -> None:
        self.changes.append((previous, current))

    def start(self) -> None:
        self.task = asyncio.create_task(self.membership.run())

    async def stop(self) -> None:
        """A clean stop: the replica deletes its key."""
        assert self.task is not None
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task

    async def die(self) -> None:
        """As a SIGKILL would: nothing more from it, its key left behind."""
        self.membership.leave = _nothing  # type: ignore[method-assign]
        await self.stop()


async def _nothing() -> None:
    return None


@pytest.fixture
async def buses(nats_url: str) -> AsyncIterator[list[Bus]]:
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(connected_bus(nats_url)) for _ in range(3)]


def split(replicas: list[Replica]) -> list[frozenset[int]]:
    return [r.membership.owned for r in replicas]


def covers_once(replicas: list[Replica]) -> bool:
    owned = [p for share in split(replicas) for p in share]
    return sorted(owned) == list(range(PARTITIONS))


async def test_replicas_split_the_partitions_and_take_over_a_stopped_or_dead_ones_share(
    buses: list[Bus],
) -> None:
    group = f"test-{uuid.uuid4().hex[:8]}"
    replicas = [Replica(bus, group, f"r{i}") for i, bus in enumerate(buses)]
    for replica in replicas:
        replica.start()
    try:
        await until(
            "three replicas own 4 partitions each",
            lambda: covers_once(replicas) and all(len(s) == 4 for s in split(replicas)),
            within=10,
            every=0.02,
        )
        # Each one's share changed in place: no partition was owned twice at any moment.
        assert all(r.membership.members == {"r0", "r1", "r2"} for r in replicas)

        # A clean stop: the key is deleted and the others split its share at once.
        await replicas[2].stop()
        loop = asyncio.get_running_loop()
        stopped_at = loop.time()
        await until("two replicas own everything", lambda: covers_once(replicas[:2]), within=10, every=0.02)
        assert loop.time() - stopped_at < 1.0, "a cleanly stopped replica's share moved only after the TTL"

        # A death: the key stays, the share moves once the member TTL (1 s) has passed.
        await replicas[1].die()
        died_at = loop.time()
        await until(
            "the last replica owns everything",
            lambda: replicas[0].membership.owned == frozenset(range(PARTITIONS)),
            within=10,
            every=0.02,
        )
        assert 0.8 <= loop.time() - died_at < 4.0
    finally:
        for replica in replicas:
            if replica.task is not None and not replica.task.done():
                await replica.stop()


async def test_a_new_replica_takes_its_share_only_after_learning_of_the_others(buses: list[Bus]) -> None:
    group = f"test-{uuid.uuid4().hex[:8]}"
    first, second = Replica(buses[0], group, "a"), Replica(buses[1], group, "b")
    first.start()
    try:
        await until(
            "a lone replica owns everything",
            lambda: first.membership.owned == frozenset(range(PARTITIONS)),
            within=10,
        )
        second.start()
        await until(
            "the newcomer owns half",
            lambda: covers_once([first, second]) and len(second.membership.owned) == 6,
            within=10,
            every=0.02,
        )
        # The newcomer never claimed everything: its first share was already its half.
        assert second.changes[0] == (frozenset(), second.membership.owned)
    finally:
        await first.stop()
        await second.stop()


async def test_a_starting_replica_takes_its_share_as_soon_as_it_knows_the_group_not_a_heartbeat_later(
    buses: list[Bus],
) -> None:
    """A service is ready only once it has its first share: that must not wait out a heartbeat
    after the group's keys are read (a replacement replica would be ready that much later)."""
    group = f"test-{uuid.uuid4().hex[:8]}"
    heartbeat = 10.0  # far longer than reading the group's keys takes, even on a busy machine
    soon = 1.5 * PATIENCE

    first, second = (
        Replica(bus, group, member, heartbeat=heartbeat, ttl=15.0)
        for bus, member in ((buses[0], "a"), (buses[1], "b"))
    )
    loop = asyncio.get_running_loop()
    try:
        started = loop.time()
        first.start()
        await asyncio.wait_for(first.membership.first_share.wait(), timeout=heartbeat)
        alone = loop.time() - started
        # The second reads the first's key before taking its share: its half, not everything.
        started = loop.time()
        second.start()
        await asyncio.wait_for(second.membership.first_share.wait(), timeout=heartbeat)
        joined = loop.time() - started
        assert len(second.membership.owned) == PARTITIONS // 2, second.membership.owned
        assert alone < soon and joined < soon, (alone, joined)
    finally:
        for r in (first, second):
            if r.task is not None:
                await r.stop()


async def test_a_replica_follows_its_groups_keys_without_flow_control_or_heartbeats(buses: list[Bus]) -> None:
    # nats-py's own watch of a bucket is an ordered consumer with flow control, whose client wakes
    # the process four times a second; the membership's feed is a plain push consumer instead.
    group = f"test-{uuid.uuid4().hex[:8]}"
    replica = Replica(buses[0], group, "solo")
    replica.start()
    try:
        await until(
            "the replica owns everything",
            lambda: replica.membership.owned == frozenset(range(PARTITIONS)),
            within=10,
        )
        feeds = [
            info
            for info in await buses[1].js.consumers_info(MEMBERS_STREAM)
            if (info.config.filter_subject or "").startswith(f"$KV.{MEMBERS_BUCKET}.{group}.")
        ]
        assert len(feeds) == 1, feeds
        config = feeds[0].config
        assert not config.flow_control
        assert not config.idle_heartbeat
        assert config.deliver_subject and config.deliver_subject.startswith("_INBOX")
        assert config.deliver_policy == api.DeliverPolicy.LAST_PER_SUBJECT
    finally:
        await replica.stop()


async def test_a_feed_whose_state_cannot_be_read_is_let_go(
    buses: list[Bus], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server answers the feed's state with an error: the feed is made again, and the one
    # that failed must not stay subscribed beside it.
    bus = buses[0]
    membership = Membership(
        bus,
        f"test-{uuid.uuid4().hex[:8]}",
        partitions=PARTITIONS,
        heartbeat=0.2,
        ttl=1.0,
        on_change=_no_change,
        member="x",
    )
    await membership._bucket()
    subscriptions = len(bus.nc._subs)

    async def refused(self: object) -> None:
        raise nats.js.errors.NotFoundError

    monkeypatch.setattr(JetStreamContext.PushSubscription, "consumer_info", refused)
    with pytest.raises(nats.js.errors.NotFoundError):
        await membership._follow(asyncio.Event())
    assert len(bus.nc._subs) == subscriptions


async def _no_change(previous: frozenset[int], current: frozenset[int]) -> None:
    return None
