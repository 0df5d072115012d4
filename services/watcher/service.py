"""watcher: Kubernetes watches → observations on NATS. It judges nothing.

One list-then-watch per resource: AppWrappers, pods labelled with their AppWrapper,
nodes, and one per wrapped kind actually in use (discovered from AppWrapper components,
any GVK, also selected by the AppWrapper label). Every object's latest relevant state is
published to its own subject; unchanged states are skipped, and a restarted watcher
republishes everything once (consumers are idempotent and JetStream de-duplicates).

A labelled pod is published only if its controller owner chain leads to the AppWrapper its label
names (:mod:`shared.ownership`): the components and AppWrappers come from the watches, so a pod
owned by a component needs no call; an owner in between is read once (:mod:`shared.kube.owners`).
A pod whose chain is not known yet is held and looked at again (:meth:`Watcher.resolve_held`);
one whose chain ends elsewhere is counted in ``respawn_watcher_pods_unattributed_total`` and
not published.

One user's bad object never stops detection for everyone: whatever fails with one object
(translation, the size and depth caps, a publish that can never succeed, anything unexpected)
is dead-lettered with the object's identity, counted in ``respawn_watcher_objects_failed_total``
and logged, and the watch goes on; only a NATS outage is waited out. Tombstones carry the
configured TTL, and after every (re)list the stored observations of objects that are gone get
theirs (deleted while no watcher ran). docs/messages.md, "Dead letters" and "Tombstones".

Replicas split the publishing (docs/architecture.md, "Watcher replicas"): each joins the group
``watcher`` of :class:`~shared.bus.membership.Membership` and publishes only the objects of the
partitions it owns (an AppWrapper's partition for the AppWrapper, its components and its pods;
``("", <node>)``'s for a node), but every replica watches and keeps everything, so that one that
takes over a partition (its owner died or left) publishes at once the latest state of each of
its objects, and tombstones for those the stream holds that are gone (:meth:`Watcher.take`).

The stream is bounded: at its limit it discards its oldest messages, which are the latest states
of the objects that changed least recently, and a health or autopilot replica that replays the
stream after that would not know those objects. So the watcher remembers the stream sequence of
every object's latest observation and checks every ``watcher.discardCheckPeriod`` whether the
stream's first sequence has passed any of them; a watch whose objects lost their observation
lists again, and those objects are published again (docs/messages.md, "A stream at its limit").
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from services.watcher import translate
from services.watcher.teardown import TornDown
from shared import jsoncodec, metrics, subjects
from shared.appwrapper.constants import API_VERSION, APPWRAPPER_LABEL, KIND
from shared.appwrapper.model import list_at, mapping_at, str_at
from shared.bus import BusError, PermanentPublishError
from shared.bus.membership import Membership
from shared.bus.publish import TRANSIENT_PUBLISH_ERRORS
from shared.kube import Kube, KubeApiError, ResourceRef
from shared.kube.owners import OwnerCache
from shared.kube.watch import Backoff, list_then_watch
from shared.messages import (
    AppWrapperObservation,
    ComponentObservation,
    Message,
    NodeObservation,
    PodObservation,
)
from shared.ownership import Attribution, Outcome, OwnerLink, Reason, controller_link
from shared.runtime import Runtime, entry

log = logging.getLogger(__name__)

PUBLISHED = metrics.counter(
    "respawn_watcher_observations_published", "Observations published, by kind", ["kind"]
)
SKIPPED = metrics.counter(
    "respawn_watcher_observations_unchanged",
    "Watch events whose relevant state did not change",
    ["kind"],
)
FAILED = metrics.counter(
    "respawn_watcher_objects_failed",
    "Objects not published (dead-lettered instead), by observation kind and reason",
    ["kind", "reason"],
)
MISSED_DELETES = metrics.counter(
    "respawn_watcher_missed_deletes",
    "Tombstones published after a (re)list for objects deleted while no watch saw it, by kind",
    ["kind"],
)
WATCHES = metrics.gauge("respawn_watcher_watches", "Resources being watched")
RESTORED = metrics.counter(
    "respawn_watcher_observations_restored",
    "Observations published again because the stream discarded the latest one of an existing "
    "object (the stream at its limit), by kind",
    ["kind"],
)
UNATTRIBUTED = metrics.counter(
    "respawn_watcher_pods_unattributed",
    "Watch events of labelled pods not published because the pod's controller owner chain does "
    "not lead to the AppWrapper its label names, by reason",
    ["reason"],
)
TEARDOWN_SKIPPED = metrics.counter(
    "respawn_watcher_teardown_changes_skipped",
    "Changes of pods and components of AppWrappers being deleted, not published (only their "
    "tombstones are), by observation kind",
    ["kind"],
)
HELD = metrics.gauge(
    "respawn_watcher_pods_held", "Labelled pods held while the owners on their chain are looked up"
)
KEPT = metrics.gauge(
    "respawn_watcher_objects_kept",
    "Objects whose latest state this replica keeps, to publish it should it take over their partition",
)
TAKEN_OVER = metrics.counter(
    "respawn_watcher_takeover_objects",
    "Objects whose latest state (or tombstone) was published on taking over their partition, by kind",
    ["kind"],
)

# How long a pod may wait for its owner chain to be resolved once every watch has synced (before,
# the owners may simply not have been listed yet); then it is given up (reason "unresolved")
# until its next change.
HOLD_LIMIT = 30.0
# How long a pod whose owner is of a watched kind waits for that watch to bring the owner before
# it is read by a GET: the owner's watch event usually comes within milliseconds of the pod's.
WATCH_GRACE = 1.0
# Owner GETs made at the same time, at most.
LOOKUP_CONCURRENCY = 8
# How often held pods are looked at again when nothing wakes the resolver.
RESOLVE_PERIOD = 0.5
# How many pods' "not attributed" log lines are remembered, so that each pod is logged once.
_LOGGED_CAPACITY = 10_000

Translator = Callable[..., Message | None]

# Reason of the Warning Event on an object the watcher cannot observe (docs/messages.md).
OBSERVATION_REFUSED_EVENT = "ObservationRefused"

# What else a publish can fail with that clears by itself: the bus gave up retrying after its
# own 30 s (a NATS outage), or lost a stream it could not create again yet.
_TRANSIENT = (*TRANSIENT_PUBLISH_ERRORS, ConnectionError)

# The longest a watch waits between two lists made to restore discarded observations.
MAX_RELIST_GAP = 600.0

# Observations published at the same time when taking over partitions: one after another, a
# takeover of thousands of objects would wait for thousands of acknowledgements in turn.
TAKEOVER_CONCURRENCY = 32

# Observations of the watches awaiting their acknowledgement at the same time, at most. Waiting
# for each acknowledgement before the next publish makes every message a write and a read of its
# own; with many in flight the client sends them in batches, at a quarter of the CPU per
# message. Observations of one subject still go out one after another, in order.
PUBLISH_WINDOW = 64

# Why a publish that was neither transient nor refused by the bus failed: a bug, counted.
UNEXPECTED = "unexpected"

# The fingerprint of a subject whose latest observation the stream holds but this replica did not
# publish (it took the partition over): never that of an observation.
STORED = "stored"


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, _TRANSIENT) or (
        isinstance(exc, BusError) and not isinstance(exc, PermanentPublishError)
    )


class Publisher:
    """Publishes observations, skipping ones identical to the last published for the subject.

    ``may_publish(subject)``: whether this replica still publishes the subject's partition; a
    publish that waits out a NATS outage gives up once it does not (another replica took over).
    """

    def __init__(
        self,
        rt: Runtime,
        may_publish: Callable[[str], bool] = lambda subject: True,
        *,
        window: int = PUBLISH_WINDOW,
    ) -> None:
        self.rt = rt
        self.may_publish = may_publish
        # How long one publish is retried by the bus before it raises and this publisher's own
        # loop (which also stops once the partition is no longer this replica's) takes over.
        self.retry_for = 30.0
        self.window = asyncio.Semaphore(window)
        # Per subject, the latest publish submitted and not finished yet, and whether it is a
        # tombstone: the next one of the subject waits for it.
        self.inflight: dict[str, tuple[asyncio.Task[None], bool]] = {}
        self.last: dict[str, str] = {}
        # Subjects whose latest message is a tombstone this watcher published: a (re)list does
        # not find their objects, and must not publish their tombstones again (each would
        # start the TTL over, and the subject would never go away).
        self.tombstoned: set[str] = set()
        # A tombstone leaves RESPAWN_OBSERVATIONS after this long, and its subject with it.
        self.tombstone_ttl = rt.config.nats.tombstone_ttl.total_seconds()
        # The stream sequence of the latest observation of each existing object: while it is
        # not below the stream's first sequence, the stream still holds it.
        self.seqs: dict[str, int] = {}
        # Subjects whose latest observation the stream discarded, each with that observation's
        # sequence: published again at the next event of their object, unchanged or not.
        self.restore: dict[str, int] = {}

    def forget(self, subject: str) -> None:
        """The object is gone, and so is its observation: nothing to skip or restore for it."""
        self.last.pop(subject, None)
        self.seqs.pop(subject, None)
        self.restore.pop(subject, None)

    def forget_partitions(self, partitions: Collection[int]) -> None:
        """Forget every subject of ``partitions``: what this replica published of them says
        nothing of what the stream holds once another replica has published them (the partition
        was lost), or may have (it is taken over)."""
        if not partitions:
            return

        def theirs(subject: str) -> bool:
            return translate.subject_partition(subject) in partitions

        for table in (self.last, self.seqs, self.restore):
            for subject in [s for s in table if theirs(s)]:
                del table[subject]
        self.tombstoned.difference_update([s for s in self.tombstoned if theirs(s)])

    async def submit(
        self,
        prepared: translate.Prepared,
        *,
        deleted: bool,
        on_error: Callable[[Exception], Awaitable[None]],
    ) -> None:
        """Start publishing ``prepared`` (:meth:`observe`) and return once the window has room
        for it, without waiting for its acknowledgement: it follows whatever of its subject is
        still in flight. What :meth:`observe` raises goes to ``on_error``."""
        subject = prepared.subject
        await self.window.acquire()
        before = self.inflight.get(subject)
        task = asyncio.create_task(self._publish(prepared, deleted, before[0] if before else None, on_error))
        self.inflight[subject] = (task, deleted)

        def done(finished: asyncio.Task[None]) -> None:
            if self.inflight.get(subject, (None, False))[0] is finished:
                del self.inflight[subject]
            self.window.release()

        task.add_done_callback(done)

    async def _publish(
        self,
        prepared: translate.Prepared,
        deleted: bool,
        before: asyncio.Task[None] | None,
        on_error: Callable[[Exception], Awaitable[None]],
    ) -> None:
        if before is not None:
            await asyncio.wait([before])  # its outcome is its own
        try:
            await self.observe(prepared, deleted=deleted)
        except Exception as exc:
            try:
                await on_error(exc)
            except Exception:  # nobody awaits this task: its errors end here, logged
                log.exception("handling the failed publish of %s failed", prepared.subject)

    def pending(self, subject: str) -> bool:
        """Whether an observation (not a tombstone) of ``subject`` is on its way."""
        entry = self.inflight.get(subject)
        return entry is not None and not entry[1]

    def holds(self, subject: str) -> bool:
        """Whether the latest state of ``subject`` this publisher sent, or is sending, is an
        observation (not a tombstone)."""
        return subject in self.last or self.pending(subject)

    async def drain(self) -> None:
        """Wait until every publish submitted so far has finished."""
        while self.inflight:
            await asyncio.wait([task for task, _ in self.inflight.values()])

    async def close(self) -> None:
        """Cancel what is in flight: a watcher that starts again lists and publishes again."""
        tasks = [task for task, _ in self.inflight.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def observe(self, prepared: translate.Prepared, *, deleted: bool) -> None:
        """Publish, retrying for as long as the failure is transient (NATS down).

        :class:`PermanentPublishError` and any other unexpected error are raised to the caller,
        which dead-letters the object and goes on: retrying those would hold up every object
        behind this one for ever.
        """
        message, subject, fp = prepared.message, prepared.subject, prepared.fingerprint
        discarded = self.restore.get(subject)
        if not deleted and discarded is None and self.last.get(subject) == fp:
            SKIPPED.labels(kind=message.KIND).inc()
            return
        # The same version published again within the duplicate window would be dropped as a
        # repeat of the discarded message; a restored one has an id of its own (the same for any
        # watcher that restores the same discarded message).
        msg_id = prepared.msg_id if discarded is None else f"{prepared.msg_id}:restored:{discarded}"
        backoff: Backoff | None = None  # made on the first failure: most publishes have none
        while True:
            try:
                published = await self.rt.bus.publish(
                    subject,
                    message,
                    msg_id=msg_id,
                    ttl=self.tombstone_ttl if deleted else None,
                    retry_for=self.retry_for,
                )
                break
            except Exception as exc:
                if not _transient(exc):
                    raise
                if not self.may_publish(subject):
                    log.info("not publishing %s any more: another replica took its partition over", subject)
                    return
                backoff = backoff or Backoff(cap=5.0)
                delay = backoff.next()
                log.warning("publishing %s failed (%s); retrying in %.1fs", subject, exc, delay)
                await asyncio.sleep(delay)
        PUBLISHED.labels(kind=message.KIND).inc()
        if discarded is not None and not deleted:
            RESTORED.labels(kind=message.KIND).inc()
        self.restore.pop(subject, None)
        if deleted:
            self.last.pop(subject, None)
            self.seqs.pop(subject, None)
            self.tombstoned.add(subject)
        else:
            self.last[subject] = fp
            self.seqs[subject] = published.seq
            self.tombstoned.discard(subject)


def discarded(live: Iterable[str], seqs: Mapping[str, int], first: int, last: int) -> dict[str, int]:
    """The subjects of ``live`` whose latest observation (its sequence in ``seqs``) the stream no
    longer holds, given the stream's ``first`` and ``last`` sequence: below the first it was
    removed; above the last the stream is not the one it was published to (created again
    empty). Pure."""
    return {s: seq for s in live if (seq := seqs.get(s)) is not None and (seq < first or seq > last)}


def now() -> datetime:
    return datetime.now(UTC)


@dataclass(slots=True)
class Held:
    """A pod whose owner chain is not resolved yet: its latest state, and since when it waits.

    ``deleted``: the pod failed and was deleted while held (its controller replaces a failed pod
    at once). Its failure is still published, followed by its tombstone, once its chain is
    resolved as the AppWrapper's: publishing only the tombstone would let the failure go unseen.
    """

    obj: dict[str, Any]
    since: float
    deleted: bool = False


@dataclass(slots=True)
class Kept:
    """The latest state of one object as its watch gave it (cut down: :func:`translate.kept`),
    whatever its partition: what this replica publishes if it takes the partition over.

    Kept as compact JSON: a replica keeps every pod of the cluster, and a pod cut down to what
    its observation reads is still some 30 small dicts (6 KB), its JSON under 1 KB; the
    takeover decodes it again. ``version`` grows with every event of any object, so a takeover
    can tell what changed while it published; ``deleted``: the object was deleted while its
    partition was being taken over, and its tombstone is the takeover's to publish."""

    subject: str
    partition: int
    data: jsoncodec.Kept
    version: int
    deleted: bool = False

    @staticmethod
    def pack(obj: dict[str, Any]) -> jsoncodec.Kept:
        return jsoncodec.keep(obj)

    def obj(self) -> dict[str, Any]:
        return jsoncodec.kept(self.data)


class Watcher:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.kube: Kube = rt.require_kube()
        self.publisher = Publisher(rt, may_publish=self.may_publish)
        # The replicas' split of the partitions (docs/architecture.md, "Watcher replicas"): None
        # for a watcher on its own, which publishes every partition (run() joins the group).
        self.membership: Membership | None = None
        # Partitions this replica is taking over: not published by the watches yet, the takeover
        # publishes what is known of them first (:meth:`take`).
        self.taking: frozenset[int] = frozenset()
        # Per watch, the latest state of every object by (namespace, name), and how each watch
        # is made (resource, observation kind, translator): for takeovers.
        self.kept: dict[str, dict[tuple[str, str], Kept]] = {}
        self.watched: dict[str, tuple[ResourceRef, str, Translator]] = {}
        # Watches whose set of live objects is complete: listed at least once since they (re)started.
        self.listed: set[str] = set()
        self._versions = itertools.count(1)
        self.synced: dict[str, bool] = {}
        self.component_watches: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.tasks: list[asyncio.Task[None]] = []
        # Per watch: the subjects of the objects that exist, as far as it knows (after a (re)list
        # exactly the listed ones), and the event that makes it list again from scratch.
        self.live: dict[str, set[str]] = {}
        self.relists: dict[str, asyncio.Event] = {}
        self.check_period = rt.config.watcher.discard_check_period.total_seconds()
        # Watches asked to list again whose list is not done yet; when each may list again next
        # (time.monotonic()), and the gap after that.
        self.relisting: set[str] = set()
        self.relist_at: dict[str, float] = {}
        self.relist_gap: dict[str, float] = {}
        # Pod attribution (docs/architecture.md, "Which pods count for an AppWrapper"): the
        # owners on pods' chains by uid (the components are learned from their watches), and the
        # uid of every AppWrapper by (namespace, name), from the AppWrapper watch.
        self.owners = OwnerCache(self.kube)
        self.appwrapper_uids: dict[tuple[str, str], str] = {}
        # AppWrappers being deleted: their pods' and components' changes are not published.
        self.torn_down = TornDown()
        self.held: dict[str, Held] = {}
        self.wake = asyncio.Event()
        self.lookups: dict[str, asyncio.Task[None]] = {}
        self.lookup_slots = asyncio.Semaphore(LOOKUP_CONCURRENCY)
        self.synced_at: float | None = None
        self.logged: OrderedDict[str, None] = OrderedDict()

    def ready(self) -> bool:
        return bool(self.synced) and all(self.synced.values())

    # ------------------------------------------------------------------ partitions

    def owns(self, partition: int) -> bool:
        """Whether the watches publish ``partition``'s objects (every one for a watcher alone)."""
        return self.membership is None or self.membership.owns_partition(partition)

    def publishing(self) -> frozenset[int]:
        """The partitions this replica publishes, or is taking over."""
        if self.membership is None:
            return frozenset(range(subjects.partitions()))
        return self.membership.owned | self.taking

    def may_publish(self, subject: str) -> bool:
        partition = translate.subject_partition(subject)
        return partition is None or self.owns(partition) or partition in self.taking

    def keep(
        self,
        name: str,
        obj: dict[str, Any],
        observation_kind: str,
        subject: str,
        partition: int,
        *,
        deleted: bool,
    ) -> None:
        """Remember the latest state of ``obj`` (or forget it, deleted), whatever its partition."""
        objects = self.kept.setdefault(name, {})
        key = (str_at(obj, "metadata", "namespace"), str_at(obj, "metadata", "name"))
        if not subject or (deleted and partition not in self.taking):
            objects.pop(key, None)
        else:
            data = Kept.pack(translate.kept(obj, observation_kind))
            objects[key] = Kept(subject, partition, data, next(self._versions), deleted=deleted)
        KEPT.set(sum(len(o) for o in self.kept.values()))

    def kept_in(self, partitions: Collection[int]) -> list[tuple[str, tuple[str, str], Kept]]:
        """(watch, key, kept) of every object kept in ``partitions``."""
        return [
            (name, key, kept)
            for name, objects in self.kept.items()
            for key, kept in objects.items()
            if kept.partition in partitions
        ]

    async def moved(self, previous: frozenset[int], current: frozenset[int]) -> None:
        """This replica's share changed (:class:`Membership` calls this, one change at a time,
        with the lost partitions already no longer owned and the gained ones not owned yet).

        Lost: nothing more is published for them from now on, and what was held or remembered
        of them is let go. Gained: :meth:`take`; the watches publish them once that is done."""
        lost, gained = previous - current, current - previous
        # What is in flight finishes first: it would otherwise record as published, after the
        # tables below forget them, states of partitions no longer (or newly) this replica's.
        await self.publisher.drain()
        if lost:
            self.publisher.forget_partitions(lost)
            for uid, held in list(self.held.items()):
                if translate.object_partition(held.obj, PodObservation.KIND) in lost:
                    self.release(uid)
        if not gained:
            return
        self.taking = gained
        try:
            await self.take(gained)
        finally:
            self.taking = frozenset()
            for name, key, kept in self.kept_in(gained):
                if kept.deleted:
                    self.kept[name].pop(key, None)

    async def take(self, gained: frozenset[int]) -> None:
        """Take over ``gained``: publish the latest state of every object of theirs this replica
        knows (its watches saw every change, published or not), then the tombstones of the
        objects the stream holds but that no longer exist (:meth:`reconcile`, for these
        partitions only), and again whatever changed meanwhile, until nothing has. Returns
        with no pause after the last look, so the watches take over from there without a gap.

        Publishing a state the previous owner published already costs nothing within the
        stream's duplicate window (the message id is the object's version); after that, the
        same state is stored again, and readers take it as the repeat it is.
        """
        started = time.monotonic()
        self.publisher.forget_partitions(gained)
        await self.assume_stored(gained)
        done: dict[tuple[str, tuple[str, str]], int] = {}
        slots = asyncio.Semaphore(TAKEOVER_CONCURRENCY)
        published = 0
        reconciled = False

        async def publish(name: str, key: tuple[str, str], kept: Kept) -> None:
            async with slots:
                await self.publish_kept(name, kept)
            if kept.deleted and self.kept.get(name, {}).get(key) is kept:
                del self.kept[name][key]

        while True:
            due = [(n, k, kept) for n, k, kept in self.kept_in(gained) if done.get((n, k)) != kept.version]
            if not due:
                if reconciled:
                    break
                await self.reconcile_partitions(gained)
                reconciled = True
                continue
            for name, key, kept in due:
                done[(name, key)] = kept.version
            published += len(due)
            await asyncio.gather(*(publish(name, key, kept) for name, key, kept in due))
            # Published, not just on their way: the reconcile reads which tombstones exist.
            await self.publisher.drain()
        log.info(
            "took over partitions %s: %d objects in %.2fs",
            ",".join(str(p) for p in sorted(gained)),
            published,
            time.monotonic() - started,
        )

    async def assume_stored(self, partitions: frozenset[int]) -> None:
        """Take every pod subject of ``partitions`` that the stream holds as published by this
        replica, its content unknown (:data:`STORED`): a pod whose owner chain no longer leads
        to its AppWrapper (its owners changed while no replica published its partition) then
        gets the tombstone a watcher that saw the change would have published (:meth:`disown`);
        nothing else changes, as no observation's fingerprint is :data:`STORED`."""
        stream_filter = translate.observed_subject_filter(PodObservation.KIND)
        try:
            stored = await self.rt.bus.subjects(subjects.OBSERVATIONS_STREAM, stream_filter)
        except Exception as exc:  # then only what the watches see change is disowned
            log.warning("cannot read the stored pod observations of partitions taken over: %r", exc)
            return
        last = self.publisher.last
        for subject in stored:
            if translate.subject_partition(subject) in partitions:
                last.setdefault(subject, STORED)

    async def publish_kept(self, name: str, kept: Kept) -> None:
        """Publish what is kept of one object, as its watch would have (whatever fails with it is
        dead-lettered there, as always)."""
        _, observation_kind, to_message = self.watched[name]
        obj = kept.obj()
        if (
            observation_kind in (PodObservation.KIND, ComponentObservation.KIND)
            and not kept.deleted
            and self.tearing_down(obj, observation_kind)
        ):
            return  # as its watch would not have published it either
        TAKEN_OVER.labels(kind=observation_kind).inc()
        if observation_kind == PodObservation.KIND:
            await self.handle_pod(obj, deleted=kept.deleted)
        else:
            await self.handle(obj, to_message, observation_kind, deleted=kept.deleted)

    async def reconcile_partitions(self, partitions: frozenset[int]) -> None:
        """:meth:`reconcile` every watch that has listed, for ``partitions`` only: a watch still
        listing does so at the end of its list."""
        for name, (ref, observation_kind, _) in list(self.watched.items()):
            if name in self.listed:
                await self.reconcile(name, ref, observation_kind, self.live.get(name, set()), partitions)

    async def resolve(self, api_version: str, kind: str) -> ResourceRef:
        backoff = Backoff(cap=10.0)
        while True:
            try:
                return await self.kube.resource(api_version, kind)
            except KubeApiError as exc:
                delay = backoff.next()
                log.warning("cannot resolve %s %s (%s); retrying in %.1fs", api_version, kind, exc, delay)
                await asyncio.sleep(delay)

    async def watch(self, name: str, ref: ResourceRef, to_message: Translator, **kw: Any) -> None:
        """Publish every object of ``ref`` as it changes (:meth:`follow`); when asked to (some of
        its objects' observations were discarded, :meth:`restore_discarded`), start over with a
        fresh list."""
        self.synced.setdefault(name, False)
        WATCHES.inc()
        try:
            while True:
                relist = self.relists[name] = asyncio.Event()
                follow = asyncio.create_task(self.follow(name, ref, to_message, **kw), name=f"follow-{name}")
                asked = asyncio.create_task(relist.wait(), name=f"relist-{name}")
                try:
                    done, _ = await asyncio.wait((follow, asked), return_when=asyncio.FIRST_COMPLETED)
                finally:
                    follow.cancel()
                    asked.cancel()
                    await asyncio.gather(follow, asked, return_exceptions=True)
                if follow in done:
                    follow.result()  # a follow never ends by itself: raise what ended it
                log.info("listing %s again to publish the observations the stream discarded", name)
        finally:
            WATCHES.dec()

    async def follow(self, name: str, ref: ResourceRef, to_message: Translator, **kw: Any) -> None:
        """One list-then-watch of ``ref``; one object never stops the others.

        After every (re)list, the observations stored for objects this watch no longer sees are
        followed by tombstones (:meth:`reconcile`).
        """
        observation_kind = _OBSERVATION_KINDS[to_message]
        self.watched[name] = (ref, observation_kind, to_message)
        # What an earlier follow knew: objects among them that the first list does not find were
        # deleted meanwhile (their stored observations get tombstones from the reconcile).
        before = self.live.get(name, set())
        live: set[str] = set()
        self.live[name] = live
        self.listed.discard(name)
        first = True
        async for event in list_then_watch(self.kube, ref, **kw):
            if event.type == "SYNCED":
                if first:
                    # What the list did not find is gone: a takeover must not publish it.
                    kept = self.kept.get(name, {})
                    for key in [k for k, o in kept.items() if o.subject not in live and not o.deleted]:
                        del kept[key]
                    self.listed.add(name)
                # The reconcile reads what was published: what the list brought must be in it.
                await self.publisher.drain()
                await self.reconcile(name, ref, observation_kind, live, self.publishing())
                if first:
                    for subject in before - live:
                        self.publisher.forget(subject)
                    self.relisting.discard(name)
                    first = False
                if not self.synced[name]:
                    log.info("watch %s synced", name)
                self.synced[name] = True
                self.wake.set()
                continue
            await self.on_event(
                name, event.obj, to_message, observation_kind, live, deleted=event.type == "DELETED"
            )

    async def on_event(
        self,
        name: str,
        obj: dict[str, Any],
        to_message: Translator,
        observation_kind: str,
        live: set[str],
        *,
        deleted: bool,
    ) -> None:
        """One object added, changed or deleted, as the watch ``name`` reported it."""
        ref = self.watched[name][0]
        obj.setdefault("apiVersion", ref.api_version)
        obj.setdefault("kind", ref.kind)
        subject = translate.object_subject(obj, observation_kind)
        # A labelled object of a wrapped kind that no AppWrapper controls is no component: not
        # live, so that a (re)list tombstones what was published of it while it was one (its
        # controller went away while no watcher watched it, or while its partition moved).
        not_a_component = observation_kind == ComponentObservation.KIND and not translate.is_component(obj)
        if subject and not deleted and not not_a_component:
            live.add(subject)
        else:
            live.discard(subject)
        # Every replica watches everything (a watch cannot be filtered by a hash of the
        # AppWrapper's name: one watch per kind per replica is the cost), keeps the latest state
        # of every object, and publishes (and attributes, holds, refuses) only what is in its
        # partitions.
        partition = translate.object_partition(obj, observation_kind)
        self.keep(name, obj, observation_kind, subject, partition, deleted=deleted)
        owned = self.owns(partition)
        if observation_kind == PodObservation.KIND:
            if owned and not deleted and self.tearing_down(obj, observation_kind):
                self.release(str_at(obj, "metadata", "uid"))
            elif owned:
                await self.handle_pod(obj, deleted=deleted)
            return
        self.learn(obj, observation_kind, deleted=deleted)
        if owned and not (
            observation_kind == ComponentObservation.KIND
            and not deleted
            and self.tearing_down(obj, observation_kind)
        ):
            if not_a_component:
                await self.not_a_component(obj, subject)
            else:
                await self.handle(obj, to_message, observation_kind, deleted=deleted)
        if observation_kind == AppWrapperObservation.KIND and not deleted:
            # Every replica watches the wrapped kinds in use, whoever publishes the AppWrapper.
            self.discover(obj)

    async def handle(
        self, obj: dict[str, Any], to_message: Translator, observation_kind: str, *, deleted: bool
    ) -> None:
        """Translate and publish one object; whatever fails is dead-lettered, and the watch goes on."""
        prepared = translate.prepare(
            to_message, obj, observation_kind=observation_kind, deleted=deleted, now=now()
        )
        if isinstance(prepared, translate.Refused):
            await self.refuse(observation_kind, prepared)
            return
        if prepared is None:
            return

        async def failed(exc: Exception) -> None:
            if isinstance(exc, PermanentPublishError):
                await self.refuse(observation_kind, _refused(prepared, obj, exc.reason, exc.detail))
                return
            log.error("publishing %s failed unexpectedly", prepared.subject, exc_info=exc)
            await self.refuse(observation_kind, _refused(prepared, obj, UNEXPECTED, repr(exc)))

        await self.publisher.submit(prepared, deleted=deleted, on_error=failed)

    async def not_a_component(self, obj: dict[str, Any], subject: str) -> None:
        """A labelled object of a wrapped kind that its AppWrapper does not control (a pod of a
        wrapped Job, when some AppWrapper wraps a Pod) is not published; if its state as a
        component was (its controller changed since), a tombstone replaces it."""
        if subject and self.publisher.holds(subject):
            await self.handle(
                obj, translate.former_component_observation, ComponentObservation.KIND, deleted=True
            )

    def discover(self, appwrapper: dict[str, Any]) -> None:
        try:
            self.discover_components(appwrapper)
        except Exception:  # the AppWrapper was published; its odd components must not stop the watch
            log.exception("cannot read the components of %s", translate.identity(appwrapper))

    # ------------------------------------------------------------------ pod attribution

    def learn(self, obj: dict[str, Any], observation_kind: str, *, deleted: bool) -> None:
        """What the AppWrapper and component watches tell pod attribution. A deleted component
        is not forgotten: its pods still belong to its AppWrapper while they terminate."""
        if observation_kind == AppWrapperObservation.KIND:
            key = (str_at(obj, "metadata", "namespace"), str_at(obj, "metadata", "name"))
            uid = str_at(obj, "metadata", "uid")
            if not deleted:
                if uid:
                    self.appwrapper_uids[key] = uid
                deleting = mapping_at(obj, "metadata").get("deletionTimestamp") is not None
                self.torn_down.learn(key, deleting=deleting, deleted=False, now=time.monotonic())
            elif not uid or self.appwrapper_uids.get(key) == uid:
                # Not when a newer AppWrapper of the same name was seen already.
                self.appwrapper_uids.pop(key, None)
                self.torn_down.learn(key, deleting=True, deleted=True, now=time.monotonic())
        elif observation_kind == ComponentObservation.KIND:
            self.owners.learn(obj)
        else:
            return
        if self.held:
            self.wake.set()

    def tearing_down(self, obj: dict[str, Any], observation_kind: str) -> bool:
        """Whether ``obj`` (a pod or component) belongs to an AppWrapper being deleted, so that its
        change is not published (:mod:`services.watcher.teardown`); counted."""
        key = (str_at(obj, "metadata", "namespace"), str_at(obj, "metadata", "labels", APPWRAPPER_LABEL))
        if not key[1] or not self.torn_down.holds(key, time.monotonic()):
            return False
        TEARDOWN_SKIPPED.labels(kind=observation_kind).inc()
        return True

    def attribute(self, pod: dict[str, Any]) -> Attribution:
        """Where the pod's controller chain leads, from what is known now (no API call)."""
        namespace = str_at(pod, "metadata", "namespace")
        label = str_at(pod, "metadata", "labels", APPWRAPPER_LABEL)
        return self.owners.attribute(
            controller_link(pod), appwrapper_uid=self.appwrapper_uids.get((namespace, label))
        )

    def published(self, pod: dict[str, Any]) -> bool:
        """Whether this watcher published the pod's latest state (not a tombstone)."""
        subject = translate.object_subject(pod, PodObservation.KIND)
        return self.publisher.holds(subject)

    async def handle_pod(self, pod: dict[str, Any], *, deleted: bool) -> None:
        """Publish the pod only if its owner chain leads to the AppWrapper its label names; hold
        it while an owner on the way is not known yet (:meth:`resolve_held` looks again).

        A deletion is published unless the pod is certainly someone else's (and was never
        published): a tombstone only removes what health holds of that pod, and for a pod whose
        owners are gone it is the last word on what an earlier watcher may have published.
        """
        uid = str_at(pod, "metadata", "uid")
        found = self.attribute(pod)
        if deleted and found.outcome is Outcome.PENDING and str_at(pod, "status", "phase") == "Failed":
            # Held until its chain is known, then published as it ended (:meth:`retry_held`).
            self.hold(uid, pod, deleted=True)
            return
        if deleted:
            self.release(uid)
            if found.outcome is Outcome.FOREIGN and not self.published(pod):
                self.count_unattributed(pod, found.reason or Reason.FOREIGN_OWNER)
                return
            await self.publish_pod(pod, deleted=True)
            return
        if found.outcome is Outcome.PENDING:
            self.hold(uid, pod, deleted=False)
            return
        await self.settle(uid, pod, found)

    def hold(self, uid: str, pod: dict[str, Any], *, deleted: bool) -> None:
        """Hold the pod's latest state until its chain is resolved; it waits since it was first held."""
        held = self.held.get(uid)
        self.held[uid] = Held(pod, held.since if held is not None else time.monotonic(), deleted)
        HELD.set(len(self.held))
        self.wake.set()

    async def settle(self, uid: str, pod: dict[str, Any], found: Attribution) -> None:
        """A pod whose chain is resolved: no longer held; published if it is the AppWrapper's,
        disowned if not."""
        self.release(uid)
        if found.owned:
            await self.publish_pod(pod, deleted=False)
        else:
            await self.disown(pod, found.reason or Reason.FOREIGN_OWNER)

    async def publish_pod(self, pod: dict[str, Any], *, deleted: bool) -> None:
        await self.handle(pod, translate.pod_observation, PodObservation.KIND, deleted=deleted)

    def release(self, uid: str) -> None:
        if self.held.pop(uid, None) is not None:
            HELD.set(len(self.held))

    def count_unattributed(self, pod: dict[str, Any], reason: Reason) -> None:
        UNATTRIBUTED.labels(reason=reason.value).inc()
        uid = str_at(pod, "metadata", "uid")
        if uid in self.logged:
            return
        self.logged[uid] = None
        if len(self.logged) > _LOGGED_CAPACITY:
            self.logged.popitem(last=False)
        log.log(
            logging.WARNING if reason not in (Reason.OWNER_GONE, Reason.UNRESOLVED) else logging.INFO,
            "pod %s/%s (uid %s) is labelled for AppWrapper %s but not counted for it: %s",
            str_at(pod, "metadata", "namespace"),
            str_at(pod, "metadata", "name"),
            uid,
            str_at(pod, "metadata", "labels", APPWRAPPER_LABEL),
            reason.value,
        )

    async def disown(self, pod: dict[str, Any], reason: Reason) -> None:
        """Count a pod that is not published; if it was (its owners changed since), replace its
        last state with a tombstone, so that it no longer counts for the AppWrapper."""
        self.count_unattributed(pod, reason)
        if self.published(pod):
            await self.publish_pod(pod, deleted=True)

    async def resolve_held(self) -> None:
        """Look at the held pods again whenever something they may wait for arrives (an
        AppWrapper, a component, an owner read, a watch synced), and at least every
        :data:`RESOLVE_PERIOD` while any pod is held or the watcher is not ready yet; with
        neither, only when woken (a pod held wakes it), so an idle watcher does not wake for
        nothing. Never returns; cancel it to stop."""
        while True:
            period = RESOLVE_PERIOD if self.held or self.synced_at is None else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), period)
            self.wake.clear()
            if self.synced_at is None and self.ready():
                self.synced_at = time.monotonic()
            for uid, held in list(self.held.items()):
                if self.held.get(uid) is not held:
                    continue  # a newer state, or gone, meanwhile
                if not self.owns(translate.object_partition(held.obj, PodObservation.KIND)):
                    continue  # its partition is being taken over: published once that is done
                try:
                    await self.retry_held(uid, held)
                except asyncio.CancelledError:
                    raise
                except Exception:  # one pod must not stop the others' resolution
                    log.exception("resolving the owners of pod %s failed", uid)

    async def retry_held(self, uid: str, held: Held) -> None:
        pod = held.obj
        found = self.attribute(pod)
        if found.outcome is not Outcome.PENDING:
            await self.settle(uid, pod, found)
            if held.deleted and found.owned:
                await self.publish_pod(pod, deleted=True)
            return
        now_ = time.monotonic()
        if self.synced_at is not None and now_ - max(held.since, self.synced_at) >= HOLD_LIMIT:
            self.release(uid)
            if held.deleted:
                # As any deletion not known to be someone else's: its tombstone.
                await self.publish_pod(pod, deleted=True)
            else:
                await self.disown(pod, Reason.UNRESOLVED)
            return
        need = found.need
        # An AppWrapper is not read: the AppWrapper watch brings it (or it is gone).
        if need is None or need.is_appwrapper or need.uid in self.lookups:
            return
        if self.may_look_up(need, held.since, now_):
            namespace = str_at(pod, "metadata", "namespace")
            self.lookups[need.uid] = asyncio.create_task(self.look_up(namespace, need))

    def may_look_up(self, need: OwnerLink, since: float, now_: float) -> bool:
        """Whether to read ``need`` by a GET now, rather than wait for a watch to bring it."""
        if self.owners.backing_off(need.uid):
            return False
        gvk = (need.api_version, need.kind)
        if gvk in self.component_watches:
            return self.synced.get(_component_watch_name(*gvk), False) and now_ - since >= WATCH_GRACE
        # A kind no watch covers yet may be wrapped by an AppWrapper the list has not reached.
        return self.synced.get(APPWRAPPERS_WATCH, False)

    async def look_up(self, namespace: str, need: OwnerLink) -> None:
        try:
            async with self.lookup_slots:
                await self.owners.fetch(namespace, need)
        except asyncio.CancelledError:
            raise
        except Exception:  # counted and retried by the cache; the resolver goes on
            log.exception("looking up %s %s/%s failed", need.kind, namespace, need.name)
        finally:
            self.lookups.pop(need.uid, None)
            self.wake.set()

    async def refuse(self, observation_kind: str, refused: translate.Refused) -> None:
        """Dead-letter an object that is not published (with who it is and why, never the object
        itself), count it and log it once. The dead letter's id makes a repeat (the next re-list
        of the same version) a no-op."""
        who = refused.identity
        FAILED.labels(kind=observation_kind, reason=refused.reason).inc()
        log.error(
            "not publishing %s %s/%s (uid %s, resourceVersion %s): %s: %s",
            who.kind or observation_kind,
            who.namespace,
            who.name,
            who.uid,
            who.resource_version,
            refused.reason,
            refused.error,
        )
        try:
            await self.rt.bus.dead_letter(
                refused.subject,
                who.summary(refused.reason, refused.error),
                reason=refused.reason,
                error=refused.error,
                kind=who.kind or observation_kind,
                namespace=who.namespace,
                name=who.name,
                uid=who.uid,
                resource_version=who.resource_version,
                msg_id=f"{observation_kind}:{who.namespace}/{who.name}:{who.uid}:{who.resource_version}:{refused.reason}",
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # counted and logged above; the watch must go on regardless
            log.error("cannot dead-letter %s/%s either: %r", who.namespace, who.name, exc)
        await self.tell_owner(refused)

    async def tell_owner(self, refused: translate.Refused) -> None:
        """A Warning Event on the object that is not observed, so its owner learns that Respawn
        does not see it (kubectl describe), not only the operator (dead letter, metric, log).
        Named after the version and the reason: the next re-list of the same version, or another
        replica, tells nothing new (409). Best effort: the watch goes on whatever happens."""
        who = refused.identity
        if not (who.kind and who.api_version and who.namespace and who.name and who.uid):
            return  # not even who it is: the dead letter and the log are all there is
        digest = hashlib.sha256(f"{who.uid}:{who.resource_version}:{refused.reason}".encode()).hexdigest()
        involved = {
            "apiVersion": who.api_version,
            "kind": who.kind,
            "metadata": {
                "name": who.name,
                "namespace": who.namespace,
                "uid": who.uid,
                "resourceVersion": who.resource_version,
            },
        }
        message = (
            f"Respawn does not observe this {who.kind} ({refused.reason}: {refused.error}); "
            "its faults are not detected until it changes into something Respawn can read"
        )
        try:
            await self.kube.create_event(
                involved,
                type_="Warning",
                reason=OBSERVATION_REFUSED_EVENT,
                message=message,
                component="respawn-watcher",
                now_iso=now().strftime("%Y-%m-%dT%H:%M:%SZ"),
                name=f"{who.name[:200]}.respawn-refused.{digest[:12]}",
            )
        except asyncio.CancelledError:
            raise
        except KubeApiError as exc:
            if not exc.already_exists:
                log.warning("cannot tell %s/%s's owner with an Event: %s", who.namespace, who.name, exc)
        except Exception as exc:
            log.warning("cannot tell %s/%s's owner with an Event: %r", who.namespace, who.name, exc)

    async def reconcile(
        self,
        name: str,
        ref: ResourceRef,
        observation_kind: str,
        live: set[str],
        partitions: Collection[int],
    ) -> None:
        """Publish a tombstone for every object of ``partitions`` whose latest observation is
        stored but that the (re)list did not find: it was deleted while no watcher was watching
        (the known objects are in memory only), and without a tombstone its last state would
        stand for ever.

        Components are watched per kind, and their subjects name the kind only: the watch of one
        kind leaves alone the subjects of another (and of the same kind in another group, when
        two groups share a kind name, it reconciles none, as it cannot tell them apart).
        """
        if not partitions:
            return
        stream_filter = translate.observed_subject_filter(observation_kind)
        try:
            stored = await self.rt.bus.subjects(subjects.OBSERVATIONS_STREAM, stream_filter)
        except Exception as exc:  # the next (re)list tries again; the watch goes on meanwhile
            log.warning("cannot reconcile %s with the stored observations: %r", name, exc)
            return
        if observation_kind == ComponentObservation.KIND:
            same_kind = [gvk for gvk in self.component_watches if gvk[1] == ref.kind]
            if len(same_kind) > 1:
                return
        tombstoned = self.publisher.tombstoned
        # Tombstones that expired took their subjects with them: forget them.
        tombstoned -= {
            s for s in tombstoned if s not in stored and translate.subject_kind(s) == observation_kind
        }
        missing = sorted(
            s for s in set(stored) - live - tombstoned if translate.subject_partition(s) in partitions
        )
        for subject in missing:
            tombstone = translate.tombstone_for_subject(subject, now=now())
            if tombstone is None or observation_kind != tombstone.KIND:
                continue
            if isinstance(tombstone, ComponentObservation) and tombstone.kind != ref.kind:
                continue
            prepared = translate.Prepared(
                tombstone,
                subject,
                "",
                # One tombstone per subject and watcher start is enough; a repeat within the
                # duplicate window (a crash loop) is absorbed.
                f"missed-delete:{subject}",
            )
            log.info("%s is gone (deleted while not watched); publishing its tombstone", subject)
            try:
                await self.publisher.observe(prepared, deleted=True)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.error("cannot publish the tombstone of %s: %r", subject, exc)
                continue
            MISSED_DELETES.labels(kind=observation_kind).inc()

    async def keep_stored(self) -> None:
        """Every ``watcher.discardCheckPeriod``: publish again what the stream discarded."""
        while True:
            await asyncio.sleep(self.check_period)
            # What was published, and what was on its way, when the stream was asked: a publish
            # whose acknowledgement crosses the stream's answer would otherwise look discarded
            # (its sequence past the answer's last, or its subject's previous one below the
            # answer's first) and have a whole watch listed again for nothing.
            asked = dict(self.publisher.seqs)
            busy = set(self.publisher.inflight)
            try:
                first, last = await self.rt.bus.sequences(subjects.OBSERVATIONS_STREAM)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the next check tries again
                log.warning("cannot check the stored observations: %r", exc)
                continue
            busy.update(self.publisher.inflight)
            self.restore_discarded(first, last, asked=asked, busy=busy)

    def restore_discarded(
        self,
        first: int,
        last: int,
        now: float | None = None,
        *,
        asked: Mapping[str, int] | None = None,
        busy: Collection[str] = (),
    ) -> int:
        """Mark the existing objects whose latest observation is no longer stored (the stream's
        sequences are ``first`` to ``last``) to be published again at their next event, and have
        their watches list again; how many were newly marked.

        Only what was settled while the stream was asked counts: an object whose sequence is not
        the one it had then (``asked``, each subject's sequence when the question went out) or
        whose publish was on its way when it went out or when the answer came (``busy``) is
        left to the next check.

        A watch lists again at most once per gap, which starts at the check period and doubles
        while every check finds more of its objects discarded (a stream too small for what
        exists, where restoring one object discards another), up to :data:`MAX_RELIST_GAP`: the
        API server is not made to list everything over and over. A list under way is waited for.
        """
        now = time.monotonic() if now is None else now
        publisher, marked = self.publisher, 0
        for name, live in self.live.items():
            lost = {
                subject: seq
                for subject, seq in discarded(live, publisher.seqs, first, last).items()
                if subject not in busy and (asked is None or asked.get(subject) == seq)
            }
            if not lost:
                # Nothing of it lost: the next loss is listed for at once, the gaps start over.
                self.relist_gap.pop(name, None)
                self.relist_at.pop(name, None)
                continue
            new = {s: seq for s, seq in lost.items() if s not in publisher.restore}
            publisher.restore.update(new)
            marked += len(new)
            relist = self.relists.get(name)
            if name in self.relisting or relist is None or now < self.relist_at.get(name, 0.0):
                continue
            gap = self.relist_gap.get(name, self.check_period)
            self.relist_at[name] = now + gap
            self.relist_gap[name] = min(2 * gap, MAX_RELIST_GAP)
            self.relisting.add(name)
            log.warning(
                "%s: the stream discarded the latest observation of %d existing objects (%s); it is "
                "at its limit (nats.streams.observations), listing again to publish them again",
                name,
                len(lost),
                ", ".join(sorted(lost)[:3]) + (", ..." if len(lost) > 3 else ""),
            )
            relist.set()
        return marked

    def discover_components(self, appwrapper: dict[str, Any]) -> None:
        for comp in list_at(mapping_at(appwrapper, "spec"), "components"):
            template = mapping_at(comp, "template")
            api_version, kind = template.get("apiVersion"), template.get("kind")
            if not isinstance(api_version, str) or not isinstance(kind, str) or not api_version or not kind:
                continue
            gvk = (api_version, kind)
            if gvk in self.component_watches:
                continue
            log.info("watching wrapped kind %s %s", *gvk)
            self.component_watches[gvk] = asyncio.create_task(
                self.component_watch(*gvk), name=f"watch-{gvk[1]}"
            )

    async def component_watch(self, api_version: str, kind: str) -> None:
        ref = await self.resolve(api_version, kind)
        await self.watch(
            _component_watch_name(api_version, kind),
            ref,
            translate.component_observation,
            label_selector=APPWRAPPER_LABEL,
        )

    async def run(self) -> None:
        scaling = self.rt.config.scaling
        self.membership = membership = Membership(
            self.rt.bus,
            "watcher",
            partitions=subjects.partitions(),
            heartbeat=scaling.heartbeat.total_seconds(),
            ttl=scaling.member_ttl.total_seconds(),
            on_change=self.moved,
        )
        self.rt.add_check("watches-synced", self.ready)
        self.rt.add_check("partitions-settled", lambda: membership.settled)
        pods = await self.resolve("v1", "Pod")
        nodes = await self.resolve("v1", "Node")
        appwrappers = await self.resolve(API_VERSION, KIND)
        self.tasks = [
            asyncio.create_task(membership.run(), name="watcher-membership"),
            asyncio.create_task(
                self.watch("pods", pods, translate.pod_observation, label_selector=APPWRAPPER_LABEL)
            ),
            asyncio.create_task(self.watch("nodes", nodes, translate.node_observation)),
            asyncio.create_task(self.watch(APPWRAPPERS_WATCH, appwrappers, translate.appwrapper_observation)),
            asyncio.create_task(self.keep_stored(), name="keep-stored"),
            asyncio.create_task(self.resolve_held()),
        ]
        try:
            await asyncio.gather(*self.tasks)
        finally:
            tasks = [*self.tasks, *self.component_watches.values(), *self.lookups.values()]
            for task in tasks:
                task.cancel()
            await self.publisher.close()
            # Wait for them: the membership's last act is to delete this replica's key, so that
            # the others take its partitions over at once rather than after the member TTL.
            await asyncio.gather(*tasks, return_exceptions=True)


APPWRAPPERS_WATCH = "appwrappers"


def _component_watch_name(api_version: str, kind: str) -> str:
    return f"{kind}.{api_version}"


# The observation kind each translator makes (for subjects, metrics and reconciliation).
_OBSERVATION_KINDS: dict[Translator, str] = {
    translate.pod_observation: PodObservation.KIND,
    translate.component_observation: ComponentObservation.KIND,
    translate.appwrapper_observation: AppWrapperObservation.KIND,
    translate.node_observation: NodeObservation.KIND,
}


def _refused(prepared: translate.Prepared, obj: dict[str, Any], reason: str, error: str) -> translate.Refused:
    return translate.Refused(reason, error, prepared.subject, translate.identity(obj))


async def main(rt: Runtime) -> None:
    await Watcher(rt).run()


def run() -> None:
    entry("watcher", main)
