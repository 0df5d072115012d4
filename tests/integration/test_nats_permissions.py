"""The NATS accounts and permissions of deploy/nats/auth.conf, on a real nats-server.

The server runs the committed users exactly (tests/unit/test_natsauth.py proves the file is the
generator's output) plus one ``observer`` user with every right in Respawn's account, used only to
look at streams and consumers from outside the users under test.

- Each service, connected as its own user through :class:`shared.bus.Bus`, can do what its code
  does: publish its messages, set the streams up in any start order, consume, ack and dead-letter
  with the consumer names and filters its code uses, update the stream it owns, and find its
  other replicas in the members bucket (heartbeats under its own group only). Two health
  processes run as the health user split the partitions and judge.
- The server refuses a service updating a stream it does not own, touching lifecycle's durables,
  or publishing another service's messages.
- An outside reader mirrors the public streams into its own account and reads them there with
  nats-py and with ``respawn tail``'s and ``respawn explain``'s own code; whatever it sends, it
  cannot create, pull from, ack, delete or rewrite a consumer of Respawn's, nor publish anything.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
import nats.errors
import nats.js.errors
import pytest
from nats.js import api

from respawn import natsauth
from respawn.cli import explain, tail
from shared import subjects
from shared.bus import Bus, Delivery, default_streams, replay_consumer_name
from shared.bus.membership import MEMBERS_BUCKET, Membership
from shared.messages import (
    AnyObservation,
    AppWrapperObservation,
    LifecycleEvent,
    Message,
    NodeObservation,
    NodeVerdict,
    ObjectRef,
    PodObservation,
    Verdict,
    decode,
)
from shared.partitions import assign
from tests.integration import natsauth_fixtures
from tests.integration.conftest import services_on
from tests.integration.healthfeed import MEMBERSHIP, fail, judged, owned, verdicts, workloads
from tests.integration.natsauth_fixtures import AuthNats, Client, start_auth_nats
from tests.waiting import until

pytestmark = pytest.mark.nats

REPO = Path(__file__).resolve().parents[2]
AUTH_CONF = REPO / "deploy" / "nats" / "auth.conf"
SERVICES = natsauth.SERVICES
STREAMS = [s.name for s in default_streams()]
READER = natsauth.SUBSCRIBER
OBSERVER = "observer"
# lifecycle's durable of partition 0, and the verdicts it takes.
_, VERDICTS_DURABLE, VERDICTS_FILTER = natsauth.lifecycle_durables()[0]
LIFECYCLE_DURABLE_NAMES = {durable for _, durable, _ in natsauth.lifecycle_durables()}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def now() -> datetime:
    return datetime.now(UTC)


# ------------------------------------------------------------------------------- the server


def _config_with_observer(directory: Path) -> Path:
    """The committed auth.conf, plus an observer with every right in Respawn's account."""
    committed = AUTH_CONF.read_text()
    observer = natsauth.User(OBSERVER, natsauth.Permissions(publish=(">",), subscribe=(">",)))
    rendered = natsauth.render_auth_config([*natsauth.default_users(), observer])
    services_only = natsauth.render_auth_config(natsauth.default_users())
    # The observer is the only difference: every other line is the committed file's.
    assert services_only == committed, "deploy/nats/auth.conf is stale (tests/unit/test_natsauth.py)"
    path = directory / "auth.conf"
    path.write_text(rendered)
    return path


def _start(directory: Path) -> AuthNats:
    users = [*(u.name for u in natsauth.default_users()), OBSERVER]
    return start_auth_nats(directory / "nats", _config_with_observer(directory), users)


@pytest.fixture(scope="module")
def auth_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthNats]:
    auth = _start(tmp_path_factory.mktemp("nats-permissions"))
    try:
        yield auth
    finally:
        auth.server.stop()


@pytest.fixture
def fresh_nats(tmp_path: Path) -> Iterator[AuthNats]:
    """A server of the test's own, without any stream yet."""
    auth = _start(tmp_path)
    try:
        yield auth
    finally:
        auth.server.stop()


@asynccontextmanager
async def client(auth: AuthNats, user: str) -> AsyncIterator[Client]:
    async with natsauth_fixtures.client(auth, user, max_reconnect_attempts=1) as c:
        yield c


@asynccontextmanager
async def service_bus(
    auth: AuthNats, service: str, *, ensure: bool = True, **options: Any
) -> AsyncIterator[Bus]:
    """The bus as the service's runtime opens it (shared/runtime.py), streams set up."""
    bus = await Bus.connect(
        auth.url,
        name=f"respawn-{service}",
        user=service,
        password=auth.passwords[service],
        connect_deadline=10,
        **options,
    )
    try:
        if ensure:
            await bus.ensure_streams()
        yield bus
    finally:
        await bus.close()


async def stored(auth: AuthNats, stream: str, subject: str) -> int:
    """How many messages ``stream`` holds on ``subject`` (asked by the observer)."""
    async with client(auth, OBSERVER) as observer:
        info = await observer.js.stream_info(stream, subjects_filter=subject)
        return int((info.state.subjects or {}).get(subject, 0))


async def respawn_consumer(auth: AuthNats, stream: str, name: str) -> Any:
    """The consumer ``name`` of Respawn's ``stream`` as it is (asked by the observer), or None."""
    async with client(auth, OBSERVER) as observer:
        try:
            return await observer.js.consumer_info(stream, name)
        except nats.js.errors.NotFoundError:
            return None


async def respawn_consumers(auth: AuthNats, stream: str) -> set[str]:
    async with client(auth, OBSERVER) as observer:
        answer = await observer.api(f"$JS.API.CONSUMER.NAMES.{stream}")
        return set(answer.get("consumers") or [])


async def stream_configs(auth: AuthNats) -> dict[str, dict[str, Any]]:
    async with client(auth, OBSERVER) as observer:
        return {s: (await observer.api(f"$JS.API.STREAM.INFO.{s}"))["config"] for s in STREAMS}


# -------------------------------------------------------------------------- sample messages


def pod_observation(ns: str, aw: str) -> tuple[str, Message]:
    pod = f"{aw}-0"
    message = PodObservation(
        ref=ObjectRef(namespace=ns, name=pod, uid=unique("uid")), appwrapper=aw, observed_at=now()
    )
    return subjects.appwrapper_obs(ns, aw, "pod", pod), message


def appwrapper_observation(ns: str, aw: str) -> tuple[str, Message]:
    message = AppWrapperObservation(
        ref=ObjectRef(namespace=ns, name=aw, uid=unique("uid")), observed_at=now()
    )
    return subjects.appwrapper_obs(ns, aw, "appwrapper", aw), message


def node_observation(node: str) -> tuple[str, Message]:
    return subjects.node_obs(node), NodeObservation(name=node, observed_at=now(), labels={"a": "b"})


def unique_in_partition_zero(prefix: str) -> str:
    """A new AppWrapper name whose verdicts lifecycle's partition-0 durable takes."""
    while True:
        name = unique(prefix)
        if subjects.partition("ns0", name) == 0:
            return name


def verdict(ns: str, aw: str, state: str = "Healthy") -> tuple[str, Message]:
    message = Verdict(ref=ObjectRef(namespace=ns, name=aw, uid=unique("uid")), state=state, decided_at=now())
    return subjects.verdict(ns, aw), message


def node_verdict(resource: str) -> tuple[str, Message]:
    return subjects.node_verdict(resource), NodeVerdict(
        resource=resource, no_schedule=("n1",), decided_at=now()
    )


def lifecycle_event(ns: str, aw: str) -> tuple[str, Message]:
    message = LifecycleEvent(
        ref=ObjectRef(namespace=ns, name=aw, uid=unique("uid")),
        event="PhaseChanged",
        phase="Running",
        at=now(),
    )
    return subjects.lifecycle_event(ns, aw), message


# The partition health's consumers read in these tests (it reads one partition per consumer).
PARTITION = 3


def in_partition(partition: int) -> tuple[str, str]:
    """A new namespace and AppWrapper name in ``partition``."""
    while True:
        ns, aw = unique("ns"), unique("aw")
        if subjects.partition(ns, aw) == partition:
            return ns, aw


@dataclass(frozen=True)
class Feed:
    """A consumer a service keeps, as its code creates it, and who produces into its stream."""

    stream: str
    durable: Callable[[], str]
    filter_subject: str
    message_cls: type[Message]
    producer: str
    sample: Callable[[], tuple[str, Message]]


OWN_MESSAGE: dict[str, Callable[[], tuple[str, Message]]] = {
    "watcher": lambda: pod_observation(unique("ns"), unique("aw")),
    "health": lambda: verdict(unique("ns"), unique("aw")),
    "lifecycle": lambda: lifecycle_event(unique("ns"), unique("aw")),
    "autopilot": lambda: node_verdict(unique("example.com/res")),
}
# Names as services/*/service.py choose them: lifecycle's fixed durables, the others per run.
FEEDS: dict[str, list[Feed]] = {
    "watcher": [],
    "health": [
        Feed(
            subjects.OBSERVATIONS_STREAM,
            lambda: f"{replay_consumer_name('health')}-p{PARTITION}",
            subjects.appwrapper_obs_partition_filter(PARTITION),
            AnyObservation,
            "watcher",
            lambda: pod_observation(*in_partition(PARTITION)),
        ),
        Feed(
            subjects.NODE_VERDICTS_STREAM,
            lambda: f"{replay_consumer_name('health')}-nodes",
            subjects.node_verdict_filter(),
            NodeVerdict,
            "autopilot",
            lambda: node_verdict(unique("example.com/res")),
        ),
    ],
    "lifecycle": [
        Feed(
            subjects.VERDICTS_STREAM,
            lambda: VERDICTS_DURABLE,
            VERDICTS_FILTER,
            Verdict,
            "health",
            lambda: verdict("ns0", unique_in_partition_zero("aw")),
        ),
    ],
    "autopilot": [
        Feed(
            subjects.OBSERVATIONS_STREAM,
            lambda: replay_consumer_name("autopilot"),
            subjects.node_obs_filter(),
            NodeObservation,
            "watcher",
            lambda: node_observation(unique("node")),
        )
    ],
}


# --------------------------------------------------------------- services: what they may do


async def consume_and_dead_letter(auth: AuthNats, service: str, bus: Bus, feed: Feed) -> str:
    """``service`` consumes a message of ``feed`` (acked) and dead-letters an undecodable one."""
    received: list[str] = []

    async def handler(message: Message, delivery: Delivery) -> None:
        received.append(delivery.subject)

    durable = feed.durable()
    consumer = await bus.consume(
        feed.stream,
        durable,
        feed.filter_subject,
        feed.message_cls,
        handler,
        deliver_policy=api.DeliverPolicy.NEW,
        inactive_threshold=None if durable in LIFECYCLE_DURABLE_NAMES else 60.0,
    )
    await until(f"{service}'s consumer {durable} to bind", lambda: consumer.running, within=10)
    dead_letters = subjects.dead_letter(f"respawn-{service}")
    dead_before = await stored(auth, subjects.DEAD_LETTER_STREAM, dead_letters)
    subject, message = feed.sample()
    async with service_bus(auth, feed.producer) as producer:
        await producer.publish(subject, message, msg_id=None)
        await until(f"{service} to receive {subject}", lambda: subject in received, within=10)
        await producer.js.publish(subject, b"\xc1 not msgpack", timeout=5)

    async def dead_lettered() -> bool:
        return await stored(auth, subjects.DEAD_LETTER_STREAM, dead_letters) == dead_before + 1

    await until(f"{service} to dead-letter the undecodable message", dead_lettered, within=10)

    async def settled() -> bool:
        info = await bus.js.consumer_info(feed.stream, durable)
        return bool(info.num_pending == 0 and info.num_ack_pending == 0 and info.ack_floor.stream_seq > 0)

    await until(f"{service}'s acks to reach the server", settled, within=10)
    await consumer.stop()
    return durable


@pytest.mark.parametrize("service", SERVICES)
async def test_each_service_user_can_do_its_job_on_the_bus(auth_nats: AuthNats, service: str) -> None:
    async with service_bus(auth_nats, service) as bus:  # sets up every stream
        subject, message = OWN_MESSAGE[service]()
        published = await bus.publish(subject, message, msg_id=None)
        assert not published.duplicate and published.seq > 0
        for feed in FEEDS[service]:
            durable = await consume_and_dead_letter(auth_nats, service, bus, feed)
            if service == "autopilot":
                # It removes its own per-run consumer on shutdown.
                assert await bus.js.delete_consumer(feed.stream, durable)
                assert await respawn_consumer(auth_nats, feed.stream, durable) is None
        if service in ("health", "autopilot"):
            # The start-up reads (Bus.replay of the last message per subject): health's of the
            # verdicts, autopilot's of the node verdicts; each deletes its consumer when done.
            stream = subjects.VERDICTS_STREAM if service == "health" else subjects.NODE_VERDICTS_STREAM
            read: list[Message] = []

            async def keep(message: Message, delivery: Delivery) -> None:
                if delivery.subject == subject:
                    read.append(message)

            await bus.replay(
                stream,
                replay_consumer_name(service),
                subject,
                type(message),
                keep,
                last_per_subject=True,
                follow=False,
            )
            assert read == [message]
            # The replay it follows from then on (health: one per partition it owns), stopped and
            # deleted at shutdown.
            durable = replay_consumer_name(service)
            observations = await bus.replay(
                subjects.OBSERVATIONS_STREAM,
                durable,
                subjects.node_obs_filter()
                if service == "autopilot"
                else subjects.appwrapper_obs_partition_filter(PARTITION),
                NodeObservation if service == "autopilot" else AnyObservation,
                _ignore,
                fetch_timeout=0.2,
            )
            await until(f"{service}'s replay to catch up", lambda: observations.caught_up, within=10)
            await observations.stop()
            assert await respawn_consumer(auth_nats, subjects.OBSERVATIONS_STREAM, durable) is None


async def _ignore(message: Message, delivery: Delivery) -> None:
    return None


async def _no_change(previous: frozenset[int], current: frozenset[int]) -> None:
    return None


@pytest.mark.parametrize("service", SERVICES)
async def test_each_services_replicas_find_each_other_in_the_members_bucket(
    auth_nats: AuthNats, service: str
) -> None:
    # Two replicas as Membership runs them (shared/bus/membership.py), each on its own connection
    # as the service's user: bucket looked up or created, heartbeats, the watch of the group.
    partitions = 6
    async with client(auth_nats, service) as one, client(auth_nats, service) as two:
        members = [
            Membership(
                c,
                service,
                partitions=partitions,
                heartbeat=0.2,
                ttl=1.0,
                on_change=_no_change,
                member=unique("r"),
            )
            for c in (one, two)
        ]
        tasks = [asyncio.create_task(m.run()) for m in members]
        try:
            await until(
                f"{service}'s two replicas to split the partitions",
                lambda: (
                    sorted(p for m in members for p in m.owned) == list(range(partitions))
                    and all(m.members == {members[0].member, members[1].member} for m in members)
                ),
                within=10,
            )
            # Its own group's keys only: a heartbeat for another service's replica is refused.
            for other in SERVICES:
                if other != service:
                    await one.publish_refused(f"$KV.{MEMBERS_BUCKET}.{other}.{unique('forged')}")
            # A clean stop deletes the key (a publish too), and the other takes the share.
            tasks[1].cancel()
            await asyncio.gather(tasks[1], return_exceptions=True)
            async with client(auth_nats, OBSERVER) as observer:
                kv = await observer.js.key_value(MEMBERS_BUCKET)
                with pytest.raises(nats.js.errors.KeyNotFoundError):  # KeyDeletedError: it was there
                    await kv.get(f"{service}.{members[1].member}")
                assert (await kv.get(f"{service}.{members[0].member}")).value
            await until(
                f"the remaining {service} replica to own every partition",
                lambda: members[0].owned == frozenset(range(partitions)),
                within=10,
            )
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        # Nothing refused but the forged heartbeats.
        assert "$kv.respawn_members." + service not in one.refusals().lower()
        assert [line for line in one.refusals().splitlines() if "$kv." not in line.lower()] == []
        assert two.refusals() == ""


async def test_health_processes_as_the_health_user_share_the_partitions_and_judge(
    fresh_nats: AuthNats, tmp_path: Path
) -> None:
    # Two health processes as the deployment runs them: the health user, each its own instance.
    credentials = {"NATS_USER": "health", "NATS_PASSWORD": fresh_nats.passwords["health"], **MEMBERSHIP}
    log_dir = tmp_path / "logs"
    with services_on(tmp_path / "no-kubeconfig", fresh_nats.url, log_dir) as start:
        a = start("health", instance="a", env={**credentials, "RESPAWN_INSTANCE": "a"})
        b = start("health", instance="b", env={**credentials, "RESPAWN_INSTANCE": "b"})
        share = assign(subjects.partitions(), ["a", "b"])
        await until(
            "a and b to own their shares",
            lambda: (owned(a), owned(b)),
            done=lambda got: got == (len(share["a"]), len(share["b"])),
            within=10,
        )
        batch = workloads(unique("ns"), 12)
        async with service_bus(fresh_nats, "watcher") as watcher:
            await fail(watcher, batch)
        async with service_bus(fresh_nats, "health") as reader:
            await until(
                "every AppWrapper judged",
                lambda: verdicts(reader, batch[0].namespace),
                done=lambda found: judged(found) == len(batch),
            )
        assert {w.partition in share["a"] for w in batch} == {True, False}  # both judged some
        b.stop()  # a clean stop: its key is deleted and a takes everything
        await until("a to own every partition", lambda: owned(a), done=lambda n: n == subjects.partitions())
    refused = [
        f"{log.name}: {line}"
        for log in sorted(log_dir.glob("*.log"))
        for line in log.read_text(errors="replace").splitlines()
        if "permissions violation" in line.lower() or "authorization violation" in line.lower()
    ]
    assert refused == []


async def test_services_start_in_any_order_and_the_first_creates_every_stream(fresh_nats: AuthNats) -> None:
    # lifecycle owns neither stream it reads; started first, it still creates all of them, as
    # every service does (Bus.ensure_streams), and consumes at once.
    async with service_bus(fresh_nats, "lifecycle") as lifecycle:
        assert await stream_configs(fresh_nats)  # all five exist
        received: list[str] = []

        async def handler(message: Message, delivery: Delivery) -> None:
            received.append(delivery.subject)

        consumer = await lifecycle.consume(
            subjects.VERDICTS_STREAM, VERDICTS_DURABLE, VERDICTS_FILTER, Verdict, handler
        )
        for service in ("autopilot", "watcher", "health"):
            async with service_bus(fresh_nats, service):  # finds the streams as lifecycle made them
                pass
        subject, message = verdict("ns0", unique_in_partition_zero("aw"))
        async with service_bus(fresh_nats, "health") as health:
            await health.publish(subject, message, msg_id=None)
        await until("lifecycle to receive the verdict", lambda: subject in received, within=10)
        await consumer.stop()


@pytest.mark.parametrize("service", SERVICES)
async def test_only_the_owner_may_update_a_stream(auth_nats: AuthNats, service: str) -> None:
    async with service_bus(auth_nats, "watcher"):
        pass  # the streams exist
    before = await stream_configs(auth_nats)
    async with client(auth_nats, service) as c:
        for stream in STREAMS:
            changed = {**before[stream], "description": f"changed by {service}"}
            subject = f"$JS.API.STREAM.UPDATE.{stream}"
            if natsauth.STREAM_OWNERS[stream] == service:
                answer = await c.api(subject, changed)
                assert answer["config"]["description"] == f"changed by {service}", answer
                restored = await c.api(subject, before[stream])
                assert restored["config"]["description"] == before[stream].get("description"), restored
            else:
                await c.publish_refused(subject, json.dumps(changed).encode())
            for op in ("DELETE", "PURGE"):
                await c.publish_refused(f"$JS.API.STREAM.{op}.{stream}")
    assert await stream_configs(auth_nats) == before


async def test_the_owner_reconciles_a_stream_that_drifted(fresh_nats: AuthNats) -> None:
    async with service_bus(fresh_nats, "health", duplicate_window=60.0):
        pass  # health created every stream, with its own duplicate window
    window = (await stream_configs(fresh_nats))[subjects.OBSERVATIONS_STREAM]["duplicate_window"]
    assert window == 60 * 10**9
    # The owner, with the default window, sets its stream up (only that one: Bus.ensure_streams
    # would also try the streams it does not own, see the next test).
    async with service_bus(fresh_nats, "watcher", ensure=False) as watcher:
        spec = next(s for s in default_streams() if s.name == subjects.OBSERVATIONS_STREAM)
        await watcher.ensure_stream(spec)
    window = (await stream_configs(fresh_nats))[subjects.OBSERVATIONS_STREAM]["duplicate_window"]
    assert window == 120 * 10**9


async def test_a_service_that_does_not_own_a_drifted_stream_keeps_it_and_starts(fresh_nats: AuthNats) -> None:
    async with service_bus(fresh_nats, "watcher"):
        pass
    before = await stream_configs(fresh_nats)
    async with service_bus(fresh_nats, "health", duplicate_window=60.0):
        pass  # must start: the drift of the streams it does not own is their owners' to fix
    after = await stream_configs(fresh_nats)
    for stream in STREAMS:
        if natsauth.STREAM_OWNERS[stream] == "health":
            assert after[stream]["duplicate_window"] == 60 * 10**9, stream
        else:
            assert after[stream] == before[stream], stream


@pytest.mark.parametrize("service", ("watcher", "health", "autopilot"))
async def test_no_other_service_may_touch_lifecycles_durables(auth_nats: AuthNats, service: str) -> None:
    # The first and the last partition's durables stand for all of them.
    durables = [natsauth.lifecycle_durables()[i] for i in (0, -1)]
    async with service_bus(auth_nats, "lifecycle") as lifecycle:
        for stream, durable, filter_ in durables:
            await lifecycle.ensure_consumer(
                stream,
                api.ConsumerConfig(
                    name=durable,
                    durable_name=durable,
                    ack_policy=api.AckPolicy.EXPLICIT,
                    filter_subject=filter_,
                ),
            )
    before = {d: (await respawn_consumer(auth_nats, s, d)).config for s, d, _ in durables}
    async with client(auth_nats, service) as c:
        for stream, durable, _ in durables:
            hijack = {"stream_name": stream, "config": {"name": durable, "filter_subject": "respawn.none.>"}}
            for subject in (
                f"$JS.API.CONSUMER.CREATE.{stream}.{durable}.respawn.none.>",
                f"$JS.API.CONSUMER.CREATE.{stream}.{durable}",
                f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.{durable}",
                f"$JS.API.CONSUMER.INFO.{stream}.{durable}",
                f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}",
                f"$JS.API.CONSUMER.DELETE.{stream}.{durable}",
                f"$JS.ACK.{stream}.{durable}.1.1.1.1.0",
            ):
                await c.publish_refused(subject, json.dumps(hijack).encode())
    after = {d: (await respawn_consumer(auth_nats, s, d)).config for s, d, _ in durables}
    assert after == before


async def test_lifecycle_may_use_no_consumer_name_but_its_own(auth_nats: AuthNats) -> None:
    async with client(auth_nats, "lifecycle") as c:
        stream = subjects.VERDICTS_STREAM
        other = unique("lifecycle")
        config = {"name": other, "durable_name": other, "filter_subject": subjects.verdict_filter()}
        await c.publish_refused(
            f"$JS.API.CONSUMER.CREATE.{stream}.{other}.{subjects.verdict_filter()}",
            json.dumps({"stream_name": stream, "config": config}).encode(),
        )
        await c.publish_refused(f"$JS.API.CONSUMER.CREATE.{stream}")  # the name would be in the body
    assert await respawn_consumer(auth_nats, subjects.VERDICTS_STREAM, other) is None


MESSAGE_SUBJECTS = {
    "watcher": (subjects.appwrapper_obs("ns", "aw", "pod", "p"), subjects.node_obs("node-1")),
    "health": (subjects.verdict("ns", "aw"),),
    "lifecycle": (subjects.lifecycle_event("ns", "aw"),),
    "autopilot": (subjects.node_verdict("nvidia.com/gpu"),),
}


def stream_of(subject: str) -> str:
    for prefix, stream in (
        (subjects.OBS_PREFIX, subjects.OBSERVATIONS_STREAM),
        (subjects.NODE_VERDICT_PREFIX, subjects.NODE_VERDICTS_STREAM),
        (subjects.VERDICT_PREFIX, subjects.VERDICTS_STREAM),
        (subjects.LIFECYCLE_PREFIX, subjects.LIFECYCLE_STREAM),
        (subjects.DEAD_LETTER_PREFIX, subjects.DEAD_LETTER_STREAM),
    ):
        if subject.startswith(prefix + "."):
            return stream
    raise ValueError(subject)


@pytest.mark.parametrize("service", SERVICES)
async def test_a_service_may_not_publish_another_services_messages(auth_nats: AuthNats, service: str) -> None:
    async with service_bus(auth_nats, "watcher"):
        pass
    foreign = [s for owner, subs in MESSAGE_SUBJECTS.items() if owner != service for s in subs]
    foreign += [subjects.dead_letter(f"respawn-{s}") for s in SERVICES if s != service]
    before = {s: await stored(auth_nats, stream_of(s), s) for s in foreign}
    async with client(auth_nats, service) as c:
        for subject in foreign:
            await c.publish_refused(subject, b"forged")
    for subject in foreign:
        assert await stored(auth_nats, stream_of(subject), subject) == before[subject], subject


async def test_a_watchers_verdict_is_refused_and_not_stored(auth_nats: AuthNats) -> None:
    subject, message = verdict(unique("ns"), unique("aw"))
    async with client(auth_nats, "watcher") as watcher, service_bus(auth_nats, "health") as health:
        with pytest.raises((TimeoutError, nats.errors.NoRespondersError)):
            await watcher.js.publish(subject, message.encode(), timeout=1)
        await watcher.wait_refused("publish", subject)
        assert await stored(auth_nats, subjects.VERDICTS_STREAM, subject) == 0
        # The same verdict from health is stored: the subject, not the stream, was refused.
        await health.publish(subject, message, msg_id=None)
        assert await stored(auth_nats, subjects.VERDICTS_STREAM, subject) == 1


# ------------------------------------------------------------------------- outside readers


@pytest.fixture(scope="module")
async def mirrored(auth_nats: AuthNats) -> AuthNats:
    """The reader's mirrors, made by ``python -m respawn.natsauth mirrors``, and something in them."""
    async with service_bus(auth_nats, "watcher"):
        pass  # Respawn's streams exist before the mirrors look for them
    env = {**os.environ, "NATS_URL": auth_nats.url, "NATS_PASSWORD": auth_nats.passwords[READER]}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "respawn.natsauth",
        "mirrors",
        "--user",
        READER,
        env=env,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    assert [line.split(":")[0] for line in lines] == list(natsauth.PUBLIC_STREAMS), lines
    return auth_nats


async def mirrored_count(auth: AuthNats, stream: str, subject: str) -> int:
    async with client(auth, READER) as reader:
        try:
            info = await reader.js.stream_info(stream, subjects_filter=subject)
        except nats.js.errors.NotFoundError:
            return 0
        return int((info.state.subjects or {}).get(subject, 0))


async def publish_public(auth: AuthNats) -> tuple[tuple[str, Message], tuple[str, Message]]:
    """A verdict and a lifecycle event of a new AppWrapper, once the reader's mirrors hold them."""
    ns, aw = "ns0", unique_in_partition_zero("aw")
    v, e = verdict(ns, aw), lifecycle_event(ns, aw)
    async with service_bus(auth, "health") as health, service_bus(auth, "lifecycle") as lifecycle:
        await health.publish(v[0], v[1], msg_id=None)
        await lifecycle.publish(e[0], e[1], msg_id=None)
    for stream, subject in ((subjects.VERDICTS_STREAM, v[0]), (subjects.LIFECYCLE_STREAM, e[0])):

        async def copied(stream: str = stream, subject: str = subject) -> bool:
            return await mirrored_count(auth, stream, subject) == 1

        await until(f"the reader's mirror of {stream} to hold {subject}", copied, within=10)
    return v, e


async def test_a_reader_reads_its_mirrors_with_any_consumer_of_its_own(mirrored: AuthNats) -> None:
    (v_subject, v_message), (l_subject, l_message) = await publish_public(mirrored)
    async with client(mirrored, READER) as reader:
        js = reader.js
        # An ordered replay, as `respawn tail` does it (its own code).
        [got] = await tail.read_all(reader.nc, subjects.LIFECYCLE_STREAM, l_subject)
        assert decode(LifecycleEvent, got.data, got.headers) == l_message
        # The mirror keeps the headers: the payload is JSON, as published, and says so.
        assert got.headers["content-type"] == "application/json"
        assert json.loads(got.data)["event"] == l_message.event
        # A durable pull consumer with explicit acks, in its own account.
        durable = unique("dashboard")
        psub = await js.pull_subscribe(v_subject, durable=durable, stream=subjects.VERDICTS_STREAM)
        (msg,) = await psub.fetch(1, timeout=5)
        assert decode(Verdict, msg.data, msg.headers) == v_message
        await msg.ack_sync(timeout=5)
        info = await js.consumer_info(subjects.VERDICTS_STREAM, durable)
        assert info.ack_floor.stream_seq == msg.metadata.sequence.stream
        await js.delete_consumer(subjects.VERDICTS_STREAM, durable)
        # A direct read of the last verdict.
        last = await js.get_last_msg(subjects.VERDICTS_STREAM, v_subject)
        assert decode(Verdict, last.data, last.headers) == v_message
        # Its account holds its mirrors and nothing else; Respawn's consumers are not there.
        names = await reader.api("$JS.API.STREAM.NAMES")
        assert sorted(names["streams"]) == sorted(natsauth.PUBLIC_STREAMS)
        assert reader.refusals() == ""
    assert durable not in await respawn_consumers(mirrored, subjects.VERDICTS_STREAM)


async def test_a_reader_can_neither_rewrite_nor_drain_lifecycles_durable(mirrored: AuthNats) -> None:
    # A verdict waits, delivered but not acked, on lifecycle's durable.
    await publish_public(mirrored)
    async with service_bus(mirrored, "lifecycle") as lifecycle:
        # As Bus.consume makes it (an existing durable is kept as it is).
        await lifecycle.ensure_consumer(
            subjects.VERDICTS_STREAM,
            api.ConsumerConfig(
                name=VERDICTS_DURABLE,
                durable_name=VERDICTS_DURABLE,
                ack_policy=api.AckPolicy.EXPLICIT,
                filter_subject=VERDICTS_FILTER,
            ),
        )
        psub = await lifecycle.js.pull_subscribe_bind(
            durable=VERDICTS_DURABLE, stream=subjects.VERDICTS_STREAM
        )
        (pending,) = await psub.fetch(1, timeout=5)
        before = await respawn_consumer(mirrored, subjects.VERDICTS_STREAM, VERDICTS_DURABLE)
        assert before.num_ack_pending >= 1
        async with client(mirrored, READER) as reader:
            stream = subjects.VERDICTS_STREAM
            # Within one account this request rewrites the durable (the name travels in the
            # body, past subject permissions): a filter that matches nothing would silence every
            # reset. Here the reader's own account answers it, on its own mirror.
            hijack = {
                "stream_name": stream,
                "config": {
                    **before.config.as_dict(),
                    "durable_name": None,
                    "name": VERDICTS_DURABLE,
                    "filter_subject": "respawn.verdict.none.>",
                },
            }
            hijack["config"] = {k: v for k, v in hijack["config"].items() if v is not None}
            answer = await reader.api(f"$JS.API.CONSUMER.CREATE.{stream}", hijack)
            assert answer.get("config", {}).get("filter_subject") == "respawn.verdict.none.>", answer
            deleted = await reader.api(f"$JS.API.CONSUMER.DELETE.{stream}.{VERDICTS_DURABLE}")
            assert deleted.get("success") is True  # its own copy, on its mirror
            # The ack of the waiting verdict, on its exact subject, as a request: an ack that
            # reached the consumer would be answered once applied. Nothing in its account listens.
            with pytest.raises(nats.errors.NoRespondersError):
                await reader.nc.request(pending.reply, b"+ACK", timeout=5)
            # And a forged create through the import of the mirrors' API: refused.
            await reader.publish_refused(
                f"{natsauth.MIRROR_API_PREFIX}.CONSUMER.CREATE.{stream}", json.dumps(hijack).encode()
            )
            assert f'"{pending.reply}"'.lower() not in reader.refusals().lower()
        after = await respawn_consumer(mirrored, subjects.VERDICTS_STREAM, VERDICTS_DURABLE)
        assert after is not None
        assert after.config.filter_subject == VERDICTS_FILTER
        assert after.config.durable_name == VERDICTS_DURABLE
        assert after.num_ack_pending == before.num_ack_pending
        # Control: the same ack from lifecycle itself does ack.
        await pending.ack_sync(timeout=5)
        acked = await respawn_consumer(mirrored, subjects.VERDICTS_STREAM, VERDICTS_DURABLE)
        assert acked.num_ack_pending == before.num_ack_pending - 1


async def test_a_reader_creates_no_consumer_in_respawns_account(mirrored: AuthNats) -> None:
    before = {s: await respawn_consumers(mirrored, s) for s in natsauth.PUBLIC_STREAMS}
    async with client(mirrored, READER) as reader:
        for stream in natsauth.PUBLIC_STREAMS:
            spy = unique("spy")
            config = {"name": spy, "durable_name": spy, "ack_policy": "explicit"}
            await reader.api(
                f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.{spy}", {"stream_name": stream, "config": config}
            )
            assert (await reader.api(f"$JS.API.CONSUMER.INFO.{stream}.{spy}"))["name"] == spy
            await reader.api(f"$JS.API.CONSUMER.DELETE.{stream}.{spy}")
    assert {s: await respawn_consumers(mirrored, s) for s in natsauth.PUBLIC_STREAMS} == before


async def test_a_reader_publishes_nowhere(mirrored: AuthNats) -> None:
    counts = {s: (await stream_configs(mirrored))[s] for s in STREAMS}
    forbidden = [s for subs in MESSAGE_SUBJECTS.values() for s in subs]
    forbidden += [subjects.dead_letter("respawn-health"), "anything.at.all"]
    forbidden += [
        f"$JS.API.STREAM.{op}.{s}" for op in ("PURGE", "MSG.DELETE") for s in natsauth.PUBLIC_STREAMS
    ]
    forbidden += [
        f"$JS.API.STREAM.CREATE.{subjects.OBSERVATIONS_STREAM}",
        "$JS.API.STREAM.CREATE.MINE",
        f"$JS.API.CONSUMER.CREATE.{subjects.OBSERVATIONS_STREAM}",
        f"{natsauth.mirror_deliver_prefix(READER)}.M.forged",
    ]
    async with client(mirrored, READER) as reader:
        for subject in forbidden:
            await reader.publish_refused(subject, b"forged")
    assert {s: (await stream_configs(mirrored))[s] for s in STREAMS} == counts


async def test_a_readers_push_consumer_cannot_write_into_respawns_streams(mirrored: AuthNats) -> None:
    # A push consumer delivers to any subject that has interest. Within Respawn's account, a
    # reader allowed to subscribe to a verdict subject could have a consumer on the lifecycle
    # stream deliver there and so copy lifecycle events into the verdict stream.
    ns, aw = unique("ns"), unique("aw")
    target = subjects.verdict(ns, aw)
    async with client(mirrored, READER) as reader:
        await reader.nc.subscribe(target)
        await reader.wait_refused("subscription", target)
        name = unique("relay")
        await reader.js.add_consumer(
            subjects.LIFECYCLE_STREAM,
            api.ConsumerConfig(name=name, deliver_subject=target, ack_policy=api.AckPolicy.NONE),
        )
        await publish_public(mirrored)  # the mirror holds a new event
        info = await reader.js.consumer_info(subjects.LIFECYCLE_STREAM, name)
        assert info.num_pending >= 1 and info.delivered.stream_seq == 0  # no interest, no delivery
        await reader.js.delete_consumer(subjects.LIFECYCLE_STREAM, name)
    assert await stored(mirrored, subjects.VERDICTS_STREAM, target) == 0


async def test_a_wrong_password_is_refused(auth_nats: AuthNats) -> None:
    for user in (*SERVICES, READER):
        with pytest.raises(nats.errors.Error) as refused:
            await nats.connect(
                auth_nats.url,
                user=user,
                password="Wrong" + "x" * 30,
                allow_reconnect=False,
                max_reconnect_attempts=1,
            )
        assert "authorization" in str(refused.value).lower()


def test_a_readers_account_imports_only_what_its_mirrors_need(auth_nats: AuthNats) -> None:
    # What the server itself reports, so no request of any user could find another way in: the
    # legacy create of the two public streams (under a prefix the reader may not publish to),
    # their flow control, and the reader's own delivery subject. Nothing reaches the internal
    # streams, whose mirrors therefore never receive anything.
    url = f"{auth_nats.server.monitor_url}/accountz?acc={natsauth.reader_account(READER)}"
    with urllib.request.urlopen(url, timeout=10) as answer:
        detail = json.loads(answer.read())["account_detail"]
    imports = {
        (i["type"], i["subject"], i["local_subject"])
        for i in detail["imports"]
        if i["account"] == natsauth.ACCOUNT and not i["invalid"]
    }
    prefix = natsauth.MIRROR_API_PREFIX
    assert imports == {
        *(
            ("service", f"$JS.API.CONSUMER.CREATE.{s}", f"{prefix}.CONSUMER.CREATE.{s}")
            for s in natsauth.PUBLIC_STREAMS
        ),
        *(("service", f"$JS.FC.{s}.>", f"$JS.FC.{s}.>") for s in natsauth.PUBLIC_STREAMS),
        ("stream", f"respawn.mirror.{READER}.>", f"respawn.mirror.{READER}.>"),
    }
    assert all(i["account"] in (natsauth.ACCOUNT, "$SYS") for i in detail["imports"])


async def test_a_reader_may_rebuild_its_mirror_with_the_whole_history(mirrored: AuthNats) -> None:
    _, (l_subject, l_message) = await publish_public(mirrored)
    async with client(mirrored, READER) as reader:
        await reader.js.delete_stream(subjects.LIFECYCLE_STREAM)
        lines = await natsauth.ensure_mirrors(reader.nc, READER)
        assert lines[0].startswith(f"{subjects.VERDICTS_STREAM}: mirror in place"), lines
        assert lines[1].startswith(f"{subjects.LIFECYCLE_STREAM}: mirror created"), lines

    async def copied() -> bool:
        return await mirrored_count(mirrored, subjects.LIFECYCLE_STREAM, l_subject) == 1

    await until("the rebuilt mirror to hold the earlier event", copied, within=10)
    async with client(mirrored, READER) as reader:
        [got] = await tail.read_all(reader.nc, subjects.LIFECYCLE_STREAM, l_subject)
        assert decode(LifecycleEvent, got.data, got.headers) == l_message


async def test_mirrors_made_before_respawns_streams_exist_fill_once_they_do(fresh_nats: AuthNats) -> None:
    async with client(fresh_nats, READER) as reader:
        lines = await natsauth.ensure_mirrors(reader.nc, READER, settle=1.0)
        assert lines == [
            f"{s}: mirror created; RESPAWN's {s} does not exist yet, it is copied once it does"
            for s in natsauth.PUBLIC_STREAMS
        ]
        async with service_bus(fresh_nats, "health") as health:
            subject, message = verdict(unique("ns"), unique("aw"))
            await health.publish(subject, message, msg_id=None)

        async def copied() -> bool:
            return await mirrored_count(fresh_nats, subjects.VERDICTS_STREAM, subject) == 1

        # The server retries a mirror whose source is missing with a growing back-off.
        await until("the mirror to copy the stream created after it", copied, within=90, every=1.0)


async def test_a_mirror_the_server_cannot_feed_is_reported(fresh_nats: AuthNats) -> None:
    # Delivered under another reader's prefix, which this account does not import: what a
    # stale auth.conf (without this reader) looks like.
    async with service_bus(fresh_nats, "watcher"):
        pass
    async with client(fresh_nats, READER) as reader:
        with pytest.raises(natsauth.MirrorError, match="received nothing from RESPAWN within 2s"):
            await natsauth.ensure_mirrors(reader.nc, "someone-else", settle=2.0)


async def test_mirrors_are_refused_to_a_service_user_with_a_clear_message(auth_nats: AuthNats) -> None:
    async with client(auth_nats, "health") as health:
        with pytest.raises(natsauth.MirrorError, match="is it an outside reader's user"):
            await natsauth.ensure_mirrors(health.nc, "health")
    async with client(auth_nats, OBSERVER) as observer:
        with pytest.raises(natsauth.MirrorError, match="a user of Respawn's own account"):
            await natsauth.ensure_mirrors(observer.nc, OBSERVER)


# ------------------------------------------------------------------------ respawn explain


async def test_explain_as_an_outside_reader_tells_what_its_account_leaves_out(mirrored: AuthNats) -> None:
    (_, v_message), (_, l_message) = await publish_public(mirrored)
    ns, name = v_message.ref.namespace, v_message.ref.name
    async with client(mirrored, READER) as reader:
        records = await explain.gather(reader.nc, ns, name)
    assert [v for v, _ in records.verdicts] == [v_message]
    assert [e for e, _ in records.events] == [l_message]
    assert records.observations == ()
    assert records.unreadable == (subjects.OBSERVATIONS_STREAM,)
    note = explain.unreadable_note(records.unreadable)
    assert "pod and component states left out of the timeline" in note


async def respawn_cli(auth: AuthNats, user: str, *args: str) -> tuple[int, str, str]:
    """``respawn`` as a user runs it, with the credentials in the environment."""
    env = {**os.environ, "NATS_URL": auth.url, "NATS_USER": user, "NATS_PASSWORD": auth.passwords[user]}
    env.pop("NATS_INBOX_PREFIX", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "respawn.cli.main",
        *args,
        env=env,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return int(proc.returncode or 0), out.decode(), err.decode()


async def test_respawn_explain_and_tail_work_for_the_documented_reader(mirrored: AuthNats) -> None:
    (_, v_message), _ = await publish_public(mirrored)
    target = f"{v_message.ref.namespace}/{v_message.ref.name}"
    code, out, err = await respawn_cli(mirrored, READER, "explain", target)
    assert code == 0, err
    assert out.startswith(f"AppWrapper {target}") and "verdict" in out and "lifecycle" in out, out
    assert err.strip() == (
        f"respawn: {subjects.OBSERVATIONS_STREAM} not in the account of NATS user {READER}: "
        "pod and component states left out of the timeline"
    )
    code, out, err = await respawn_cli(mirrored, READER, "tail", "verdicts", "--no-follow", "-A")
    assert code == 0, err
    assert v_message.ref.name in out
    # A service user may not list streams: one line naming the refused request.
    code, out, err = await respawn_cli(mirrored, "watcher", "explain", target)
    assert code == 4  # refused access (docs/cli.md, "Exit codes")
    assert err.startswith("error: NATS user watcher may not list the streams of its account (")
    assert "$js.api.stream.names" in err.lower() and len(err.strip().splitlines()) == 1, err


async def test_the_example_consumer_works_for_the_documented_reader(mirrored: AuthNats) -> None:
    (_, v_message), _ = await publish_public(mirrored)
    ns = v_message.ref.namespace
    env = {
        **os.environ,
        "NATS_USER": READER,
        "NATS_PASSWORD": mirrored.passwords[READER],
        "NATS_INBOX_PREFIX": natsauth.inbox_prefix(READER),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(REPO / "examples" / "consume.py"),
        "--url",
        mirrored.url,
        "--namespace",
        ns,
        "--appwrapper",
        v_message.ref.name,
        "--count",
        "2",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    who = f"{ns}/{v_message.ref.name}"
    assert sorted(out.decode().splitlines()) == [
        f"lifecycle {who} PhaseChanged - -> Running attempt=0",
        f"verdict {who} Healthy - seq=0",
    ]


async def test_explain_names_a_user_that_may_not_read_the_streams(auth_nats: AuthNats) -> None:
    async with client(auth_nats, "watcher") as watcher:
        with pytest.raises(tail.NatsUnavailable, match="may not list the streams of its account"):
            await explain.gather(watcher.nc, "ns", "aw")


async def test_explain_tells_a_reader_without_mirrors_how_to_make_them(tmp_path: Path) -> None:
    auth = _start(tmp_path)
    try:
        async with client(auth, READER) as reader:
            with pytest.raises(tail.NatsUnavailable, match=r"python -m respawn\.natsauth mirrors"):
                await explain.gather(reader.nc, "ns", "aw")
    finally:
        auth.server.stop()
