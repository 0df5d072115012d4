"""lifecycle: verdicts and watched changes → AppWrapper status, component creation and deletion.

The only writer of AppWrapper status and the only creator/deleter of wrapped resources. All
decisions are made by the pure :func:`services.lifecycle.machine.reconcile`; this module wires
the parts that feed it and carry out its plans, and runs their loops:

- :mod:`~services.lifecycle.triggers`: verdicts from the bus → queue keys;
- the watch caches, each one list-then-watch: AppWrappers (:mod:`~services.lifecycle.awcache`),
  the components of each wrapped kind in use (:mod:`~services.lifecycle.componentcache`, started
  the first time a kind is read), pods (:mod:`~services.lifecycle.podcache`) and nodes. They are
  what the reader reads, and a change in them queues its AppWrapper (debounced);
- :mod:`~services.lifecycle.workqueue`: each AppWrapper queued once, resets first, timers;
- :mod:`~services.lifecycle.resync`: every AppWrapper with work or a clock pending, now and then,
  so that a replica that dies with timers pending loses nothing;
- :mod:`~services.lifecycle.reconciler`: per AppWrapper, read (:mod:`~services.lifecycle.reader`),
  decide, carry out (:mod:`~services.lifecycle.executor`, through
  :mod:`~services.lifecycle.writethrough`, which puts what each write returned into the caches);
- the server clock (:mod:`~services.lifecycle.serverclock`): decisions take the API server's time.

Which AppWrappers the caches hold is ``keep``'s to say (default: all); after it changes,
:meth:`Lifecycle.reshard` has them drop and pick up objects accordingly.

No single AppWrapper can stop the service: a reconcile that fails is reported and retried with a
backoff of its own (:mod:`~services.lifecycle.failures`) while the workers go on with the
others, and a loop that fails (the resync, a cache) is restarted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from datetime import datetime
from typing import Any, Final

from services.lifecycle.awcache import AppWrapperCache
from services.lifecycle.cache import Keep
from services.lifecycle.componentcache import ComponentCaches
from services.lifecycle.executor import Executor
from services.lifecycle.hooks import hooks_for
from services.lifecycle.incidents import Incidents
from services.lifecycle.nodecache import NodeCache
from services.lifecycle.podcache import PodCache
from services.lifecycle.quarantined import QuarantinedNodes
from services.lifecycle.reader import Reader
from services.lifecycle.reconciler import Reconciler
from services.lifecycle.records import DeferredRecords
from services.lifecycle.resync import Resync
from services.lifecycle.serverclock import ServerClock
from services.lifecycle.shares import Shares
from services.lifecycle.triggers import LatestVerdicts, Triggers
from services.lifecycle.workqueue import WorkQueue
from services.lifecycle.writethrough import WriteThrough
from shared import metrics
from shared.appwrapper.constants import API_VERSION, KIND
from shared.kube import Kube, KubeApiError, ResourceRef
from shared.kube.watch import list_pages
from shared.kubetime import utcnow
from shared.runtime import Runtime, entry

log = logging.getLogger(__name__)

LOOP_RESTARTS = metrics.counter(
    "respawn_lifecycle_loop_restarts", "Service loops restarted after they failed, by loop", ["loop"]
)

# How long the first resync waits for the AppWrapper cache to sync before it LISTs instead.
RESYNC_SYNC_WAIT: Final = 30.0
# How long a move of the share waits for the caches' lists before it resyncs the AppWrappers.
RESHARD_WAIT: Final = 10.0


class Lifecycle:
    """The service's parts, wired. No I/O until :meth:`run`."""

    def __init__(
        self,
        rt: Runtime,
        *,
        appwrappers: ResourceRef,
        pods: ResourceRef,
        nodes: ResourceRef | None = None,
        clock: Callable[[], datetime] = utcnow,
        keep: Keep | None = None,
    ) -> None:
        """``nodes``: where the nodes are read, for node exclusion (None when it is off).
        ``clock``: this process's clock, which the server clock corrects (tests skew it).
        ``keep``: which AppWrappers this replica looks after, by (namespace, name); the caches
        hold only their objects (see :meth:`reshard`). None: its share of the partitions
        (docs/scaling.md)."""
        self.rt = rt
        self.kube = kube = rt.require_kube()
        config = rt.config
        self.appwrappers = appwrappers
        self.pods = pods
        self.nodes = nodes
        settings = config.lifecycle
        self.workers = settings.workers
        self.verdict_concurrency = settings.verdict_concurrency
        self.incidents = Incidents()
        # Every time a decision writes is compared with times the API server writes (health tells
        # an attempt's pods by their creationTimestamp): decide on the server's clock.
        self.clock = ServerClock(clock)
        self.resync_period = settings.resync_period
        # Which AppWrappers are this replica's (docs/scaling.md); only those are ever queued.
        self.shares = Shares(
            rt.bus,
            config.scaling,
            on_verdict=lambda verdict, delivery: self.triggers.on_verdict(verdict, delivery),
            consumer_options={
                "max_deliver": 100_000,  # held verdicts are redelivered until they apply
                # A held verdict is a TransientError, which never counts here: only a verdict whose
                # handling raises unexpectedly, again and again, is dead-lettered (poison).
                "max_errors": 10,
                "ack_wait": 60.0,
                # One AppWrapper's verdicts in order, different AppWrappers' at once: a verdict
                # takes a few API round trips, and a burst of them must not queue behind each other.
                "concurrency": settings.verdict_concurrency,
            },
            moved=self._share_moved,
        )
        self.keep = keep = keep if keep is not None else self.shares.owns
        self.queue = WorkQueue(urgent=self.incidents.__contains__, clock=self.clock.now, accept=keep)
        # A change in any cache queues a reconcile of its AppWrapper, debounced: a Job's pods
        # start or go away together, one reconcile a moment after the first is enough.
        self.appwrapper_cache = AppWrapperCache(on_change=self.queue.debounce, keep=keep)
        self.pod_cache = PodCache(on_change=self.queue.debounce, keep=keep)
        self.components = ComponentCaches(kube, on_change=self.queue.debounce, keep=keep, spawn=self._spawn)
        self.node_cache = NodeCache() if nodes is not None else None
        # Loops started while the service runs (a component kind's watch); cancelled with it.
        self._spawned: set[asyncio.Task[None]] = set()
        self.latest = LatestVerdicts()
        # Nodes Autopilot quarantined: every pod created is kept off them (hooks.py).
        self.quarantined = QuarantinedNodes()
        writes = WriteThrough(
            kube,
            appwrappers=appwrappers,
            appwrapper_cache=self.appwrapper_cache,
            pods=pods,
            pod_cache=self.pod_cache,
            components=self.components,
        )
        self.executor = Executor(writes, rt.bus, appwrappers=appwrappers, pods=pods, clock=self.clock)
        delay = settings.record_delay.total_seconds()
        # Each record is written under its AppWrapper's reconcile lock (the lambda: the
        # reconciler is made next, with the records).
        self.records = (
            DeferredRecords(
                self.executor.record_incarnation, delay=delay, lock=lambda key: self.reconciler.lock(key)
            )
            if delay > 0
            else None
        )
        self.reconciler = Reconciler(
            reader=Reader(
                kube,
                appwrappers=appwrappers,
                pods=pods,
                pod_cache=self.pod_cache,
                nodes=nodes,
                node_cache=self.node_cache,
                appwrapper_cache=self.appwrapper_cache,
                components=self.components,
            ),
            executor=self.executor,
            queue=self.queue,
            incidents=self.incidents,
            defaults=config.to_fault_tolerance(),
            hooks=hooks_for(config, self.quarantined),
            node_exclusion=config.node_exclusion if nodes is not None else None,
            transient_limit=config.failures.transient_retry_limit,
            on_gone=self.latest.forget,
            clock=self.clock.now,
            records=self.records,
        )
        self.triggers = Triggers(
            queue=self.queue, latest=self.latest, reconcile=self.reconciler.reconcile_key
        )
        self.resync = Resync(
            self.resync_source, self.queue.enqueue, period=settings.resync_period, clock=self.clock.now
        )

    async def resync_source(self) -> AsyncIterator[Mapping[str, Any]]:
        """What the resync goes through: the AppWrapper cache; a LIST (page by page) only when it
        has not synced within :data:`RESYNC_SYNC_WAIT` (or cannot: watching AppWrappers is
        forbidden), of the AppWrappers ``keep`` passes."""
        cache = self.appwrapper_cache
        if await cache.until_synced(RESYNC_SYNC_WAIT):
            for aw in cache.appwrappers():
                yield aw
            return
        async for page, _ in list_pages(self.kube, self.appwrappers):
            for aw in page:
                meta = aw.get("metadata")
                if not isinstance(meta, Mapping) or self.keep(
                    (str(meta.get("namespace", "")), str(meta.get("name", "")))
                ):
                    yield aw

    def _spawn(self, name: str, loop: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``loop`` supervised beside the service's own loops, until the service stops."""
        task = asyncio.create_task(_supervised(name, loop), name=name)
        self._spawned.add(task)
        task.add_done_callback(self._spawned.discard)

    async def reshard(self) -> None:
        """After ``keep`` changed: every cache drops the objects of the AppWrappers no longer
        kept and lists again to pick up those newly kept; then a resync round queues the newly
        kept ones that have work or a clock pending (their timers were another replica's)."""
        # Bounded: a cache that cannot list now (the API server is down) catches up by itself,
        # and the AppWrappers taken over must not wait for it (the reader asks the API server for
        # what a cache cannot answer).
        await asyncio.wait(
            [
                asyncio.ensure_future(c)
                for c in (
                    self.appwrapper_cache.reshard(),
                    self.pod_cache.reshard(),
                    self.components.reshard(),
                )
            ],
            timeout=RESHARD_WAIT,
        )
        await self.resync.once()

    async def _share_moved(self, gained: frozenset[int], lost: frozenset[int]) -> None:
        """The caches follow the share: what was lost is dropped, what was gained is listed, and
        the AppWrappers taken over with work or a clock pending (their previous owner will not
        finish it) are reconciled now rather than at the next resync."""
        if not self.shares.membership.settled:
            # The first share: the caches start after it (run) and their first lists keep it.
            return
        if gained or lost:
            # Not awaited: the share must count as moved at once (the queue accepts by it), and
            # the caches' lists may take a while.
            self._spawn("lifecycle-reshard", self.reshard)

    async def work(self) -> None:
        """One reconcile worker: the queue's keys, one after another. A key whose reconcile
        fails (reported by the reconciler) is queued again after its own backoff; the worker goes
        on with the next key at once."""
        while True:
            key = await self.queue.next_key()
            try:
                await self.reconciler.reconcile_key(key, self.latest.get(key))
            except Exception:
                self.queue.requeue_at(self.clock.now() + self.reconciler.failures.backoff(key), key)

    async def sync_clock(self) -> None:
        """Sample the API server's clock now and every resync period."""
        while True:
            await self.executor.sync_clock()
            await asyncio.sleep(self.resync_period.total_seconds())

    async def run(self) -> None:
        """Run the loops and the bus consumers until cancelled."""
        # The first decisions already take the server's time.
        await self.executor.sync_clock()
        # The share first: the caches' first lists keep only this replica's AppWrappers.
        shares = asyncio.create_task(
            _supervised("lifecycle-shares", self.shares.run), name="lifecycle-shares"
        )
        await self.shares.membership.first_share.wait()
        loops: dict[str, Callable[[], Coroutine[Any, Any, None]]] = {
            f"lifecycle-worker-{i}": self.work for i in range(self.workers)
        }
        loops["lifecycle-resync"] = self.resync.run
        loops["lifecycle-clock"] = self.sync_clock
        loops["lifecycle-appwrapper-cache"] = lambda: self.appwrapper_cache.run(self.kube, self.appwrappers)
        loops["lifecycle-pod-cache"] = lambda: self.pod_cache.run(self.kube, self.pods)
        loops["lifecycle-quarantine"] = lambda: self.quarantined.run(self.rt.bus)
        if self.records is not None:
            loops["lifecycle-records"] = self.records.run
        if self.node_cache is not None and self.nodes is not None:
            node_cache, nodes = self.node_cache, self.nodes
            loops["lifecycle-node-cache"] = lambda: node_cache.run(self.kube, nodes)
        tasks = [shares] + [
            asyncio.create_task(_supervised(name, loop), name=name) for name, loop in loops.items()
        ]
        try:
            self.rt.add_check("consumers", self.shares.ready)
            await asyncio.gather(*tasks)
        finally:
            for task in [*tasks, *self._spawned]:
                task.cancel()
            self.queue.close()


async def _supervised(name: str, loop: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``loop`` forever: one that fails (a bug, an answer nobody foresaw) is logged, counted
    and started again after a pause, instead of taking the whole service down with it (and
    restarting into the same failure)."""
    delay = 1.0
    while True:
        try:
            await loop()
            return
        except asyncio.CancelledError:
            raise
        except Exception:
            LOOP_RESTARTS.labels(loop=name).inc()
            log.exception("%s failed; restarting it in %.0fs", name, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 60.0)


async def resolve(kube: Kube, api_version: str, kind: str) -> ResourceRef:
    """Wait for a kind to be served (e.g. the CRD installed after the controller)."""
    delay = 0.5
    while True:
        try:
            return await kube.resource(api_version, kind)
        except KubeApiError as exc:
            log.warning("%s %s not available yet (%s); retrying in %.0fs", api_version, kind, exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)


async def main(rt: Runtime) -> None:
    kube = rt.require_kube()
    lifecycle = Lifecycle(
        rt,
        appwrappers=await resolve(kube, API_VERSION, KIND),
        pods=await resolve(kube, "v1", "Pod"),
        # Read for node exclusion, and for the consistency mode of deletion (which pods' nodes answer).
        nodes=(
            await resolve(kube, "v1", "Node")
            if rt.config.node_exclusion.enabled or rt.config.fault_tolerance.consistency_mode
            else None
        ),
    )
    await lifecycle.run()


def run() -> None:
    entry("lifecycle", main)


__all__ = ["Lifecycle", "main", "run"]
