"""Which replicas of a service are alive, and which partitions each one owns.

Each replica puts its own key ``<group>.<member>`` into the NATS KV bucket ``RESPAWN_MEMBERS``
every ``heartbeat`` and watches the group's keys. A member counts as alive while it has been
heard from within ``ttl`` (on this replica's own monotonic clock, so clocks need not agree); a
replica that stops cleanly deletes its key, which the others see at once. Every replica computes
the same :func:`shared.partitions.assign` from the same members and keeps its own share: there is
no leader and no vote, and a partition moves only when the set of live members changes.

Failure modes (docs/scaling.md): a replica that dies without deleting its key keeps its partitions
for up to ``ttl``; one cut off from NATS while still running counts itself alone and keeps working
on everything it can reach (the others take its share after ``ttl``), so for a while a partition
can have two owners. The services are built for that: verdicts carry deterministic message ids
(JetStream keeps one), and lifecycle's status writes carry the resourceVersion they read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import socket
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import nats.js.errors
from nats.js import api
from nats.js.kv import KV_DEL, KV_MARKER_REASON, KV_OP, KV_PURGE

from shared import metrics
from shared.partitions import assign, live, partition_of, partitions_of
from shared.tasks import cancel_and_wait

__all__ = ["MEMBERS_BUCKET", "Membership", "OnChange", "member_id"]

log = logging.getLogger(__name__)

MEMBERS_BUCKET = "RESPAWN_MEMBERS"
# The stream behind the bucket.
MEMBERS_STREAM = f"KV_{MEMBERS_BUCKET}"
# Keys of members that stopped heartbeating disappear from the bucket after this long (a
# restarted replica must not find the whole history of earlier ones).
BUCKET_MAX_AGE = 120.0

OWNED = metrics.gauge("respawn_partitions_owned", "Partitions this replica owns (docs/scaling.md)", ["group"])
MEMBERS = metrics.gauge(
    "respawn_members_alive", "Replicas of this service alive, as this one sees them", ["group"]
)
HANDOFFS = metrics.counter(
    "respawn_partitions_moved",
    "Partitions this replica took over (gained) or gave away (lost)",
    ["group", "direction"],
)

# (previous share, new share): called, one call at a time, whenever this replica's share changes.
OnChange = Callable[[frozenset[int], frozenset[int]], Awaitable[None]]


def member_id() -> str:
    """This replica's name among its peers: ``$RESPAWN_INSTANCE`` (the pod name in Kubernetes),
    else ``<hostname>-<pid>``; only characters valid in a NATS KV key."""
    raw = os.environ.get("RESPAWN_INSTANCE") or f"{socket.gethostname()}-{os.getpid()}"
    return re.sub(r"[^A-Za-z0-9_-]+", "-", raw).strip("-")[:64] or "replica"


def _operation(headers: dict[str, str] | None) -> str:
    """What a message of the bucket's stream does to its key: ``PUT``, ``DEL`` or ``PURGE``.

    A client's delete or purge says so in ``KV-Operation``; a marker the server itself places
    (nats-server 2.11 and later, when a key ages out with subject delete markers enabled) says
    why in ``Nats-Marker-Reason`` instead. A marker only ever stands for a key that is gone, so
    a reason this code does not know yet is read as a removal too."""
    headers = headers or {}
    if KV_OP in headers:
        return headers[KV_OP]
    if KV_MARKER_REASON in headers:
        return KV_DEL if headers[KV_MARKER_REASON] == "Remove" else KV_PURGE
    return "PUT"


class Membership:
    def __init__(
        self,
        bus: Any,
        group: str,
        *,
        partitions: int,
        heartbeat: float,
        ttl: float,
        on_change: OnChange,
        member: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bus = bus
        self.group = group
        self.partitions = partitions
        self.heartbeat = heartbeat
        self.ttl = ttl
        self.on_change = on_change
        self.member = member or member_id()
        self.clock = clock
        self.owned: frozenset[int] = frozenset()
        self.members: frozenset[str] = frozenset()
        self.first_share = asyncio.Event()  # set once the first share has been taken
        self._last_seen: dict[str, float] = {}
        self._own_echo = clock()  # when our own heartbeat last came back through the watch
        self._changed = asyncio.Event()
        self._watch_synced = False  # the initial values of the group's keys have been read
        self._kv: Any = None

    # ------------------------------------------------------------------ queries

    @property
    def settled(self) -> bool:
        """Whether the first share has been taken."""
        return self.first_share.is_set()

    def owns(self, namespace: str, name: str) -> bool:
        """Whether the AppWrapper ``namespace/name`` is in this replica's share."""
        return partition_of(namespace, name, self.partitions) in self.owned

    def owns_partition(self, partition: int) -> bool:
        return partition in self.owned

    # ------------------------------------------------------------------ loop

    async def run(self) -> None:
        """Heartbeat, watch the peers and keep :attr:`owned` up to date until cancelled; on the
        way out, delete this replica's key so the others take its share at once."""
        tasks = [
            asyncio.create_task(self._beat(), name=f"{self.group}-heartbeat"),
            asyncio.create_task(self._watch(), name=f"{self.group}-members"),
            asyncio.create_task(self._rebalance(), name=f"{self.group}-rebalance"),
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            await cancel_and_wait(tasks)
            await self.leave()

    async def leave(self) -> None:
        if self._kv is None:
            return
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._kv.delete(self._key(self.member)), timeout=2.0)

    def _key(self, member: str) -> str:
        return f"{self.group}.{member}"

    async def _bucket(self) -> Any:
        if self._kv is None:
            js = self.bus.js
            try:
                self._kv = await js.key_value(MEMBERS_BUCKET)
            except nats.js.errors.BucketNotFoundError:
                # Replicas of every service race here at first start; creating a bucket that
                # exists with the same configuration succeeds.
                self._kv = await js.create_key_value(
                    api.KeyValueConfig(
                        bucket=MEMBERS_BUCKET,
                        history=1,
                        ttl=BUCKET_MAX_AGE,
                        storage=api.StorageType.MEMORY,
                        replicas=getattr(self.bus, "replicas", 1),
                    )
                )
        return self._kv

    async def _beat(self) -> None:
        body = json.dumps({"member": self.member, "pid": os.getpid(), "host": socket.gethostname()}).encode()
        while True:
            try:
                kv = await self._bucket()
                await kv.put(self._key(self.member), body)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # NATS down or the bucket lost with the server's store
                log.warning("%s heartbeat failed (%s); trying again", self.group, exc)
                self._kv = None
            await asyncio.sleep(self.heartbeat)
            self._changed.set()  # a peer may have gone quiet: look again

    async def _watch(self) -> None:
        """Follow the group's keys. The feed also carries our own heartbeat back: when it has
        not for a few heartbeats, it is broken (a server restart can lose its consumer) and is
        made again."""
        while True:
            feed = None
            try:
                await self._bucket()
                synced = asyncio.Event()
                feed = await self._follow(synced)
                self._own_echo = self.clock()
                while True:
                    # Before any wait too: the feed is often synced as it is made (no key yet, or
                    # every one in by then), and a replica is ready only once it has a share.
                    self._note_synced(synced)
                    if synced.is_set():
                        await asyncio.sleep(self.heartbeat)
                    else:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(synced.wait(), self.heartbeat)
                    self._note_synced(synced)
                    if self.clock() - self._own_echo > 3 * self.heartbeat + self.ttl:
                        raise ConnectionError("own heartbeats no longer come back through the watch")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("%s membership watch failed (%s); watching again", self.group, exc)
                self._kv = None
                await asyncio.sleep(self.heartbeat)
            finally:
                if feed is not None:
                    with contextlib.suppress(Exception):
                        await feed.unsubscribe()

    def _note_synced(self, synced: asyncio.Event) -> None:
        if synced.is_set() and not self._watch_synced:
            self._watch_synced = True  # the peers are known: shares may be taken
            self._changed.set()

    async def _follow(self, synced: asyncio.Event) -> Any:
        """A push consumer of the group's keys, the last value of each first, delivered to an
        inbox of this connection; ``synced`` is set once those first values are in.

        Not nats-py's ``KeyValue.watch``: that is an ordered consumer with flow control, whose
        client wakes the process four times a second to check for a flow-control request and
        which the server heartbeats every five seconds, for a bucket that changes once per
        replica per heartbeat. A lost message costs nothing here (the next heartbeat of its
        member comes within ``heartbeat``), and a lost consumer is noticed by our own heartbeats
        no longer coming back."""

        # The consumer sequence of the last message handled: the server may have sent every
        # key already (its info says nothing pending) while some still wait to be handled here.
        handled = 0

        async def arrived(msg: Any) -> None:
            nonlocal handled
            try:
                meta = msg.metadata
                self._seen(msg.subject.removeprefix(self._prefix), _operation(msg.headers), meta.timestamp)
                handled = max(handled, meta.sequence.consumer)
                if meta.num_pending == 0:
                    synced.set()
            except Exception:  # one odd message must not end the feed
                log.exception("%s membership: cannot read %s", self.group, getattr(msg, "subject", "?"))

        feed = await self.bus.js.subscribe(
            f"{self._prefix}*",
            stream=MEMBERS_STREAM,
            cb=arrived,
            flow_control=False,
            config=api.ConsumerConfig(
                deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT,
                ack_policy=api.AckPolicy.NONE,
                max_deliver=1,
                mem_storage=True,
                num_replicas=1,
            ),
        )
        try:
            info = await feed.consumer_info()
            delivered = info.delivered.consumer_seq if info.delivered is not None else 0
            if info.num_pending == 0 and handled >= delivered:
                # Nothing (more) to deliver and everything delivered handled: the group has no
                # key, or all are in. Otherwise the last of them sets it (``arrived``).
                synced.set()
        except BaseException:
            # The caller makes a new feed: this one must not go on delivering beside it.
            with contextlib.suppress(Exception):
                await feed.unsubscribe()
            raise
        return feed

    @property
    def _prefix(self) -> str:
        return f"$KV.{MEMBERS_BUCKET}.{self.group}."

    def _seen(self, member: str, operation: str, created: datetime | None) -> None:
        now = self.clock()
        if operation in (KV_DEL, KV_PURGE):
            self._last_seen.pop(member, None)
        else:
            # A value from before the feed began may be old: count it from when it was written.
            age = 0.0
            if created is not None:
                with contextlib.suppress(Exception):
                    age = max(0.0, time.time() - created.timestamp())
            self._last_seen[member] = now - age
            if member == self.member:
                self._own_echo = now
        self._changed.set()

    def alive(self) -> frozenset[str]:
        # This replica is alive by definition, even while NATS is unreachable.
        return frozenset(live(self._last_seen, self.clock(), self.ttl) | {self.member})

    async def _rebalance(self) -> None:
        while True:
            await self._changed.wait()
            self._changed.clear()
            if not self._watch_synced:
                continue  # a share taken before the peers are known would be taken from them
            members = self.alive()
            if members != self.members:
                log.info("%s replicas alive: %s", self.group, ", ".join(sorted(members)))
                self.members = members
                MEMBERS.labels(group=self.group).set(len(members))
            share = assign(self.partitions, members).get(self.member, frozenset())
            if share == self.owned and self.settled:
                continue
            previous = self.owned
            gained, lost = share - previous, previous - share
            log.info(
                "%s %s owns partitions %s (gained %s, lost %s)",
                self.group,
                self.member,
                partitions_of(share),
                partitions_of(gained),
                partitions_of(lost),
            )
            # What is lost stops counting as ours before the service lets go of it, and what is
            # gained counts once the service has taken it: in between, this replica owns less.
            self.owned = previous & share
            await self.on_change(previous, share)
            self.owned = share
            self.first_share.set()
            OWNED.labels(group=self.group).set(len(share))
            HANDOFFS.labels(group=self.group, direction="gained").inc(len(gained))
            HANDOFFS.labels(group=self.group, direction="lost").inc(len(lost))
