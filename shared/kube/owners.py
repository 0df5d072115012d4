"""The owners on a pod's controller chain, looked up once each (the I/O around
:mod:`shared.ownership`).

An :class:`OwnerCache` holds what is known of objects by uid. Most of it is learned for free:
the services already watch or read the wrapped components (:meth:`OwnerCache.learn`), so a pod
owned directly by a component (Job → pod) is attributed without a call. An object in between
(the ReplicaSet of a wrapped Deployment, the Job of a wrapped JobSet, …) is read once by a GET
of its apiVersion, kind and name (:meth:`OwnerCache.fetch`), and remembered by its uid:

- found with that uid: its controller is remembered;
- not found, or found with another uid (a newer namesake): gone, remembered for good (uids are
  never reused);
- forbidden, or its kind is not served: unreadable, remembered for :data:`UNREADABLE_TTL` (a
  role or a CRD may be added meanwhile);
- any other failure (the API server unavailable): nothing is remembered; the same uid is not
  asked again before a backoff (1 s, doubling up to 30 s) has passed.

The cache is bounded (:data:`CAPACITY` objects, the least recently used dropped first); an
object dropped is read again if a chain needs it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

from shared import metrics
from shared.kube.client import KubeApiError, ResourceRef
from shared.ownership import (
    MAX_CHAIN_DEPTH,
    Attribution,
    ChainNode,
    NodeState,
    Outcome,
    OwnerLink,
    attribute,
    node_of,
)

__all__ = ["CAPACITY", "LOOKUPS", "UNREADABLE_TTL", "OwnerCache", "OwnerReads"]

log = logging.getLogger(__name__)

LOOKUPS = metrics.counter(
    "respawn_kube_owner_lookups",
    "GETs of owners on pods' controller chains, by outcome (found, gone, unreadable, error)",
    ["outcome"],
)

# About 500 bytes each: at most some 25 MB, for the components of tens of thousands of
# AppWrappers and the objects between them and their pods.
CAPACITY: Final = 50_000
UNREADABLE_TTL: Final = 60.0
_BACKOFF_FIRST, _BACKOFF_CAP = 1.0, 30.0


class OwnerReads(Protocol):
    """The reads an owner lookup makes (a subset of :class:`shared.kube.Kube`)."""

    async def resource(self, api_version: str, kind: str) -> ResourceRef: ...

    async def get(self, ref: ResourceRef, name: str, namespace: str | None = None) -> dict[str, Any]: ...


class _Known(Mapping[str, ChainNode]):
    """The cache as :func:`shared.ownership.attribute` reads it: unreadable entries that have
    expired are not known any more."""

    def __init__(self, cache: OwnerCache) -> None:
        self._cache = cache

    def __getitem__(self, uid: str) -> ChainNode:
        node = self._cache.get(uid)
        if node is None:
            raise KeyError(uid)
        return node

    def __iter__(self) -> Any:
        return iter(list(self._cache._nodes))

    def __len__(self) -> int:
        return len(self._cache._nodes)


class OwnerCache:
    def __init__(
        self,
        kube: OwnerReads,
        *,
        capacity: int = CAPACITY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.capacity = capacity
        self.clock = clock
        self._nodes: OrderedDict[str, ChainNode] = OrderedDict()
        # uid -> when an unreadable answer stops being believed.
        self._unreadable_until: dict[str, float] = {}
        # uid -> (when it may be asked again, the delay after the next failure).
        self._retry: dict[str, tuple[float, float]] = {}
        self._inflight: dict[str, asyncio.Future[ChainNode | None]] = {}
        self.known: Mapping[str, ChainNode] = _Known(self)

    def __len__(self) -> int:
        return len(self._nodes)

    def get(self, uid: str) -> ChainNode | None:
        node = self._nodes.get(uid)
        if node is None:
            return None
        until = self._unreadable_until.get(uid)
        if until is not None and self.clock() >= until:
            self._drop(uid)
            return None
        # Least recently used goes first: the owners of running pods stay.
        self._nodes.move_to_end(uid)
        return node

    def remember(self, node: ChainNode) -> None:
        if node.state is NodeState.UNREADABLE:
            self._unreadable_until[node.uid] = self.clock() + UNREADABLE_TTL
        else:
            self._unreadable_until.pop(node.uid, None)
        self._retry.pop(node.uid, None)
        self._nodes[node.uid] = node
        self._nodes.move_to_end(node.uid)
        while len(self._nodes) > self.capacity:
            uid, _ = self._nodes.popitem(last=False)
            self._unreadable_until.pop(uid, None)

    def learn(self, obj: Any) -> None:
        """Remember what a watched or read object says of its controller (no call)."""
        node = node_of(obj)
        if node is not None:
            self.remember(node)

    def _drop(self, uid: str) -> None:
        self._nodes.pop(uid, None)
        self._unreadable_until.pop(uid, None)

    def backing_off(self, uid: str) -> bool:
        """Whether a lookup of ``uid`` failed lately and may not be made again yet."""
        retry = self._retry.get(uid)
        return retry is not None and self.clock() < retry[0]

    def attribute(self, controller: OwnerLink | None, *, appwrapper_uid: str | None) -> Attribution:
        """:func:`shared.ownership.attribute` on what is known now (no call)."""
        return attribute(controller, self.known, appwrapper_uid=appwrapper_uid)

    async def fetch(self, namespace: str, link: OwnerLink) -> ChainNode | None:
        """What a GET says of ``link`` (remembered), or None when it could not be told (the
        API server failed, or a lookup of it failed lately). Concurrent calls for the same uid
        share one GET."""
        known = self.get(link.uid)
        if known is not None:
            return known
        if self.backing_off(link.uid):
            return None
        pending = self._inflight.get(link.uid)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[ChainNode | None] = asyncio.get_running_loop().create_future()
        self._inflight[link.uid] = future
        try:
            node = await self._lookup(namespace, link)
            future.set_result(node)
            return node
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as exc:
            future.set_exception(exc)
            # Nobody else may be waiting; the exception is the caller's.
            future.exception()
            raise
        finally:
            del self._inflight[link.uid]

    async def _lookup(self, namespace: str, link: OwnerLink) -> ChainNode | None:
        try:
            ref = await self.kube.resource(link.api_version, link.kind)
        except KubeApiError as exc:
            if exc.not_found or exc.forbidden:
                # The kind (or its group/version) is not served, or discovery is not allowed.
                return self._outcome(ChainNode(link.uid, state=NodeState.UNREADABLE), "unreadable", link, exc)
            self._failed(link, exc)
            return None
        except Exception as exc:  # an answer the client cannot read, a broken connection
            self._failed(link, exc)
            return None
        try:
            obj = await self.kube.get(ref, link.name, namespace if ref.namespaced else None)
        except KubeApiError as exc:
            if exc.not_found:
                return self._outcome(ChainNode(link.uid, state=NodeState.GONE), "gone", link)
            if exc.forbidden:
                return self._outcome(ChainNode(link.uid, state=NodeState.UNREADABLE), "unreadable", link, exc)
            self._failed(link, exc)
            return None
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # an answer the client cannot read, a broken connection
            self._failed(link, exc)
            return None
        seen = node_of(obj)
        if seen is None or seen.uid != link.uid:
            # Another object under the same name: the owner itself is gone.
            return self._outcome(ChainNode(link.uid, state=NodeState.GONE), "gone", link)
        return self._outcome(seen, "found", link)

    def _outcome(
        self, node: ChainNode, outcome: str, link: OwnerLink, exc: BaseException | None = None
    ) -> ChainNode:
        LOOKUPS.labels(outcome=outcome).inc()
        if exc is not None:
            log.warning("cannot read owner %s %s (uid %s): %s", link.kind, link.name, link.uid, exc)
        self.remember(node)
        return node

    def _failed(self, link: OwnerLink, exc: BaseException) -> None:
        LOOKUPS.labels(outcome="error").inc()
        _, delay = self._retry.get(link.uid, (0.0, _BACKOFF_FIRST))
        self._retry[link.uid] = (self.clock() + delay, min(delay * 2, _BACKOFF_CAP))
        log.warning(
            "reading owner %s %s (uid %s) failed; asking again in %.0fs: %s",
            link.kind,
            link.name,
            link.uid,
            delay,
            exc,
        )

    async def resolve(
        self, namespace: str, controller: OwnerLink | None, *, appwrapper_uid: str | None
    ) -> Attribution:
        """Attribute, reading the owners on the way that are not known yet (each once). PENDING
        only when an owner could not be read now, or the AppWrapper's uid is not known."""
        for _ in range(MAX_CHAIN_DEPTH + 1):
            found = self.attribute(controller, appwrapper_uid=appwrapper_uid)
            if found.outcome is not Outcome.PENDING or found.need is None or found.need.is_appwrapper:
                return found
            if await self.fetch(namespace, found.need) is None:
                return found
        return self.attribute(controller, appwrapper_uid=appwrapper_uid)
