"""lifecycle: verdicts and observations → AppWrapper status, component creation and deletion.

The only writer of AppWrapper status and the only creator/deleter of wrapped resources. All
decisions are made by the pure :func:`services.lifecycle.machine.reconcile`; this module wires
the parts that feed it and carry out its plans, and runs their loops:

- :mod:`~services.lifecycle.triggers`: verdicts and observations from the bus → queue keys;
- :mod:`~services.lifecycle.workqueue`: each AppWrapper queued once, resets first, timers;
- :mod:`~services.lifecycle.resync`: every AppWrapper with work or a clock pending, now and then,
  so that a replica that dies with timers pending loses nothing;
- :mod:`~services.lifecycle.reconciler`: per AppWrapper, read (:mod:`~services.lifecycle.reader`),
  decide, carry out (:mod:`~services.lifecycle.executor`);
- the pod and node caches, each one watch;
- the server clock (:mod:`~services.lifecycle.serverclock`): decisions take the API server's time.

No single AppWrapper can stop the service: a reconcile that fails is reported and retried with a
backoff of its own (:mod:`~services.lifecycle.failures`) while the workers go on with the
others, and a loop that fails (the resync, a cache) is restarted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from datetime import datetime
from typing import Any

from services.lifecycle.executor import Executor
from services.lifecycle.hooks import hooks_for
from services.lifecycle.incidents import Incidents
from services.lifecycle.nodecache import NodeCache
from services.lifecycle.podcache import PodCache
from services.lifecycle.reader import Reader
from services.lifecycle.reconciler import Reconciler
from services.lifecycle.resync import Resync
from services.lifecycle.serverclock import ServerClock
from services.lifecycle.shares import Shares
from services.lifecycle.triggers import LatestVerdicts, Triggers
from services.lifecycle.workqueue import WorkQueue
from shared import metrics, subjects
from shared.appwrapper.constants import API_VERSION, KIND
from shared.bus import DeliverPolicy
from shared.kube import Kube, KubeApiError, ResourceRef
from shared.kube.watch import list_pages
from shared.kubetime import utcnow
from shared.messages import AnyObservation
from shared.runtime import Runtime, entry

log = logging.getLogger(__name__)

LOOP_RESTARTS = metrics.counter(
    "respawn_lifecycle_loop_restarts", "Service loops restarted after they failed, by loop", ["loop"]
)


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
    ) -> None:
        """``nodes``: where the nodes are read, for node exclusion (None when it is off).
        ``clock``: this process's clock, which the server clock corrects (tests skew it)."""
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
        self.queue = WorkQueue(
            urgent=self.incidents.__contains__, clock=self.clock.now, accept=self.shares.owns
        )
        # Pod changes trigger reconciles exactly as pod observations on the bus do.
        self.pod_cache = PodCache(on_change=self.queue.debounce)
        self.node_cache = NodeCache() if nodes is not None else None
        self.latest = LatestVerdicts()
        self.executor = Executor(kube, rt.bus, appwrappers=appwrappers, pods=pods, clock=self.clock)
        self.reconciler = Reconciler(
            reader=Reader(
                kube,
                appwrappers=appwrappers,
                pods=pods,
                pod_cache=self.pod_cache,
                nodes=nodes,
                node_cache=self.node_cache,
            ),
            executor=self.executor,
            queue=self.queue,
            incidents=self.incidents,
            defaults=config.to_fault_tolerance(),
            hooks=hooks_for(config),
            node_exclusion=config.node_exclusion if nodes is not None else None,
            on_gone=self.latest.forget,
            clock=self.clock.now,
        )
        self.triggers = Triggers(
            queue=self.queue,
            latest=self.latest,
            reconcile=self.reconciler.reconcile_key,
            pods_watched=lambda: self.pod_cache.synced,
        )
        self.resync = Resync(
            self._appwrapper_pages, self.queue.enqueue, period=settings.resync_period, clock=self.clock.now
        )

    async def _appwrapper_pages(self) -> AsyncIterator[Sequence[Mapping[str, Any]]]:
        async for page, _ in list_pages(self.kube, self.appwrappers):
            yield page

    async def _share_moved(self, gained: frozenset[int], lost: frozenset[int]) -> None:
        """Partitions taken over may hold AppWrappers with work or a clock pending that their
        previous owner will not finish: look at them now rather than at the next resync."""
        if gained:
            asyncio.get_running_loop().create_task(self.resync.once(), name="lifecycle-takeover-resync")

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
        loops: dict[str, Callable[[], Coroutine[Any, Any, None]]] = {
            f"lifecycle-worker-{i}": self.work for i in range(self.workers)
        }
        loops["lifecycle-shares"] = self.shares.run
        loops["lifecycle-resync"] = self.resync.run
        loops["lifecycle-clock"] = self.sync_clock
        loops["lifecycle-pod-cache"] = lambda: self.pod_cache.run(self.kube, self.pods)
        if self.node_cache is not None and self.nodes is not None:
            node_cache, nodes = self.node_cache, self.nodes
            loops["lifecycle-node-cache"] = lambda: node_cache.run(self.kube, nodes)
        tasks = [asyncio.create_task(_supervised(name, loop), name=name) for name, loop in loops.items()]
        try:
            observations = await self.rt.bus.consume(
                subjects.OBSERVATIONS_STREAM,
                "lifecycle-observations",
                subjects.appwrapper_obs_filter(),
                AnyObservation,
                self.triggers.on_observation,
                # A durable created for the first time starts at the current end of the stream: the
                # initial resync covers existing AppWrappers, and verdicts from before this
                # controller ran are old.
                deliver_policy=DeliverPolicy.NEW,
            )
            self.rt.add_check("consumers", lambda: self.shares.ready() and observations.running)
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
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
        nodes=await resolve(kube, "v1", "Node") if rt.config.node_exclusion.enabled else None,
    )
    await lifecycle.run()


def run() -> None:
    entry("lifecycle", main)


__all__ = ["Lifecycle", "main", "run"]
