"""Read-your-writes: the executor's Kubernetes client, which puts what the API server answered to
each of lifecycle's writes into the watch caches the reader reads.

Without it, the pass after a write could act on the view from before it, until the write's own
watch event arrives: create a component a second time (a generated name would make a
duplicate), delete a pod twice, or compute a status from the AppWrapper as it was before our
write (the write would then lose to our own previous one: a 409 and a GET for nothing).

- an AppWrapper written (status, finalizer, annotations): the answer replaces the cached one
  and is remembered as our last write of it (:meth:`AppWrapperCache.wrote`);
- a component created: the answer goes into its kind's cache;
- a component or pod deleted: it counts as on its way out (the answer, when it is the object,
  is taken as it is; a pod is terminating, a component has a deletionTimestamp) until the watch
  says it is gone.

Every call is passed on as made; the caches only ever take an answer the server gave.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.lifecycle.awcache import AppWrapperCache
from services.lifecycle.cache import WatchedCache
from services.lifecycle.componentcache import ComponentCaches
from services.lifecycle.executor import KubeWrites
from services.lifecycle.podcache import PodCache
from shared.kube import ResourceRef

__all__ = ["WriteThrough"]


class WriteThrough:
    """A :class:`~services.lifecycle.executor.KubeWrites` in front of ``kube``."""

    def __init__(
        self,
        kube: KubeWrites,
        *,
        appwrappers: ResourceRef,
        appwrapper_cache: AppWrapperCache,
        pods: ResourceRef,
        pod_cache: PodCache,
        components: ComponentCaches,
    ) -> None:
        self.kube = kube
        self.appwrappers = appwrappers
        self.appwrapper_cache = appwrapper_cache
        self.pods = pods
        self.pod_cache = pod_cache
        self.components = components

    def _wrote(self, ref: ResourceRef, answer: Mapping[str, Any]) -> None:
        if ref == self.appwrappers:
            self.appwrapper_cache.wrote(answer)

    def _cache_of(self, ref: ResourceRef) -> WatchedCache[Any] | None:
        if ref == self.pods:
            return self.pod_cache
        return self.components.get(ref)

    async def resource(self, api_version: str, kind: str) -> ResourceRef:
        return await self.kube.resource(api_version, kind)

    async def get(self, ref: ResourceRef, name: str, namespace: str | None = None) -> dict[str, Any]:
        return await self.kube.get(ref, name, namespace)

    async def create(
        self,
        ref: ResourceRef,
        body: Mapping[str, Any],
        namespace: str | None = None,
        *,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        created = await self.kube.create(ref, body, namespace, dry_run=dry_run)
        # Only a component kind has a cache here (Events never do).
        cache = None if dry_run else self.components.get(ref)
        if cache is not None:
            cache.put(created)
        return created

    async def replace(self, ref: ResourceRef, body: Mapping[str, Any]) -> dict[str, Any]:
        answer = await self.kube.replace(ref, body)
        self._wrote(ref, answer)
        return answer

    async def replace_status(self, ref: ResourceRef, body: Mapping[str, Any]) -> dict[str, Any]:
        answer = await self.kube.replace_status(ref, body)
        self._wrote(ref, answer)
        return answer

    async def patch(
        self,
        ref: ResourceRef,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        patch_type: str = "application/merge-patch+json",
    ) -> dict[str, Any]:
        answer = await self.kube.patch(ref, name, patch, namespace, patch_type=patch_type)
        self._wrote(ref, answer)
        return answer

    async def delete(
        self,
        ref: ResourceRef,
        name: str,
        namespace: str | None = None,
        *,
        grace_period_seconds: int | None = None,
        uid: str | None = None,
    ) -> dict[str, Any] | None:
        answer = await self.kube.delete(
            ref, name, namespace, grace_period_seconds=grace_period_seconds, uid=uid
        )
        cache = self._cache_of(ref)
        if answer is not None and cache is not None and uid:
            cache.mark_deleting(namespace or "", name, uid, answer)
        return answer

    async def create_event(
        self,
        involved: Mapping[str, Any],
        *,
        type_: str,
        reason: str,
        message: str,
        component: str,
        now_iso: str,
    ) -> None:
        await self.kube.create_event(
            involved, type_=type_, reason=reason, message=message, component=component, now_iso=now_iso
        )
