"""Reading what a decision is made from: the AppWrapper, and its components, pods and the nodes
as an :class:`~services.lifecycle.observed.Observed`.

The AppWrapper and each component are read by a GET on every pass (they are the authoritative
state); the pods come from the pod cache and the nodes from the node cache, with a LIST where a
cache cannot answer (see :mod:`services.lifecycle.podcache`). What is not read is left unknown,
which the machine treats conservatively.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Mapping
from typing import Any, Protocol

from services.lifecycle.actions import CreateOutcome
from services.lifecycle.nodecache import NodeCache
from services.lifecycle.observed import (
    Observed,
    ObservedComponent,
    ObservedNode,
    ObservedPod,
    Presence,
    controller_uid,
)
from services.lifecycle.podcache import PodCache
from services.lifecycle.workqueue import Key
from shared.appwrapper.constants import API_VERSION, APPWRAPPER_LABEL, KIND
from shared.kube import KubeApiError, ResourceRef

__all__ = ["KubeReads", "Reader"]

log = logging.getLogger(__name__)


class KubeReads(Protocol):
    """The reads the reader makes (a subset of :class:`shared.kube.Kube`)."""

    async def resource(self, api_version: str, kind: str) -> ResourceRef: ...

    async def get(self, ref: ResourceRef, name: str, namespace: str | None = None) -> dict[str, Any]: ...

    async def list(
        self, ref: ResourceRef, namespace: str | None = None, **query: str | int | bool
    ) -> dict[str, Any]: ...


class Reader:
    def __init__(
        self,
        kube: KubeReads,
        *,
        appwrappers: ResourceRef,
        pods: ResourceRef,
        pod_cache: PodCache,
        nodes: ResourceRef | None = None,
        node_cache: NodeCache | None = None,
    ) -> None:
        """``nodes``: where to read the nodes (None: never read, node exclusion is off)."""
        self.kube = kube
        self.appwrappers = appwrappers
        self.pods = pods
        self.pod_cache = pod_cache
        self.nodes = nodes
        self.node_cache = node_cache

    async def appwrapper(self, key: Key) -> dict[str, Any] | None:
        """The AppWrapper, or None when it is gone."""
        namespace, name = key
        try:
            aw = await self.kube.get(self.appwrappers, name, namespace)
        except KubeApiError as exc:
            if exc.not_found:
                return None
            raise
        # GET answers carry them, but the Event recorder needs them whatever the source.
        aw.setdefault("apiVersion", API_VERSION)
        aw.setdefault("kind", KIND)
        return aw

    async def observe(
        self,
        aw: Mapping[str, Any],
        created: Mapping[int, CreateOutcome],
        *,
        pods: bool = True,
        components: bool = True,
        nodes: bool = True,
    ) -> Observed:
        """Authoritative reads of every component (unless ``components`` is False), the labelled
        pods (unless ``pods`` is False) and the nodes (unless ``nodes`` is False), issued
        concurrently; what is not read is unknown."""
        meta = aw.get("metadata") or {}
        namespace, name, uid = meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", "")
        spec_components = (aw.get("spec") or {}).get("components") or []
        statuses = (aw.get("status") or {}).get("componentStatus") or []
        reads: list[Awaitable[ObservedComponent]] = []
        for index, comp in enumerate(spec_components):
            template = comp.get("template") if isinstance(comp, Mapping) else None
            if not components or not isinstance(template, Mapping):
                reads.append(_unknown())
                continue
            comp_name = ""
            if index < len(statuses) and isinstance(statuses[index], Mapping):
                comp_name = str(statuses[index].get("name") or "")
            comp_name = comp_name or str((template.get("metadata") or {}).get("name") or "")
            if index in created and created[index].name:
                comp_name = created[index].name
            reads.append(self.observe_component(template, namespace, comp_name, uid))
        seen, listed, node_list = await asyncio.gather(
            asyncio.gather(*reads),
            self.observe_pods(namespace, name) if pods else _none(),
            self.observe_nodes() if nodes else _none(),
        )
        return Observed(components=tuple(seen), pods=listed, created=dict(created), nodes=node_list)

    async def observe_pods(self, namespace: str, name: str) -> tuple[ObservedPod, ...] | None:
        """The AppWrapper's pods: from the pod cache, or a LIST where the cache cannot answer
        (before it has synced, and whenever the answer would be "none": see PodCache)."""
        cached = self.pod_cache.pods(namespace, name)
        if cached is not None:
            return cached
        try:
            listing = await self.kube.list(self.pods, namespace, labelSelector=f"{APPWRAPPER_LABEL}={name}")
        except KubeApiError as exc:
            log.warning("listing pods of %s/%s failed: %s", namespace, name, exc)
            return None
        return tuple(ObservedPod.of(p) for p in listing.get("items", []))

    async def observe_component(
        self, template: Mapping[str, Any], namespace: str, name: str, aw_uid: str
    ) -> ObservedComponent:
        if not name:
            return ObservedComponent(presence=Presence.ABSENT)
        try:
            ref = await self.kube.resource(str(template.get("apiVersion", "")), str(template.get("kind", "")))
            obj = await self.kube.get(ref, name, namespace if ref.namespaced else None)
        except KubeApiError as exc:
            if exc.not_found:
                return ObservedComponent(presence=Presence.ABSENT, name=name)
            return ObservedComponent(presence=Presence.UNKNOWN, name=name)
        presence = Presence.DELETING if obj["metadata"].get("deletionTimestamp") else Presence.PRESENT
        return ObservedComponent(
            presence=presence,
            controlled_by_us=controller_uid(obj) == aw_uid,
            name=name,
            uid=str(obj["metadata"].get("uid") or ""),
        )

    async def observe_nodes(self) -> tuple[ObservedNode, ...] | None:
        """The cluster's nodes: from the node cache, or a LIST before it has synced (a reset in
        the first moments after a start, when held verdicts arrive in a burst, still excludes).
        None when nodes are not read at all, or cannot be."""
        if self.nodes is None:
            return None
        cached = self.node_cache.nodes() if self.node_cache is not None else None
        if cached is not None:
            return cached
        try:
            listing = await self.kube.list(self.nodes)
        except KubeApiError as exc:
            log.warning("listing nodes failed (no node exclusion on this pass): %s", exc)
            return None
        return tuple(ObservedNode.of(n) for n in listing.get("items", []))


async def _unknown() -> ObservedComponent:
    return ObservedComponent()


async def _none() -> None:
    return None
