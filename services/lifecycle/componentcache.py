"""Lifecycle's view of the wrapped resources (components): one list-then-watch per kind in use
(see :mod:`~services.lifecycle.cache`).

A reconcile pass needs each component's presence, uid and controller owner reference. A GET of
each component per pass made about 19 component GETs per AppWrapper during one clean-up; these
caches answer instead. A kind's watch starts the first time an AppWrapper wraps that kind
(:meth:`ComponentCaches.cache`), restricted to the objects labelled
``workload.codeflare.dev/appwrapper`` (lifecycle puts the label on every component it creates),
and keeps of each what a read of it is used for: identity, uid, controller owner reference,
deletion, and the ``respawn.dev/component`` annotation. A change of that (not of the object's
status, which health judges) triggers a reconcile of the AppWrapper its label names.

What may be answered from it, and what not (the reader decides, :class:`ComponentCache` only
says what it holds and whether its "absent" may be believed):

- a component it holds: as the watch last delivered it, or as our create returned it;
- a component it does not hold is absent when the AppWrapper's status does not record it as
  created (it never was, or its deletion was recorded), or when the status records its create
  as answered with success and the AppWrapper in hand is exactly as this replica last wrote it:
  then no other writer created a component since, and ours are in the cache from our creates'
  answers. Otherwise (another replica's write, a restart, a create that failed or timed out and
  may have left an object, ours or someone else's, unlabelled), the reader confirms "absent" by
  a GET before the machine can conclude anything from it (a component missing from a running
  workload fails it);
- a component created under a generated name whose name never reached the status is found here
  by its annotation; when no answer was recorded for its create, its absence is confirmed by a
  LIST, as before, because a create that timed out may still have taken effect.

Only namespaced kinds are cached; a cluster-scoped wrapped kind is read from the API server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from services.lifecycle.cache import Keep, WatchedCache, keep_all
from services.lifecycle.podcache import appwrapper_label
from services.lifecycle.workqueue import Key
from shared.appwrapper.constants import APPWRAPPER_LABEL, COMPONENT_ANNOTATION
from shared.kube import Kube, ResourceRef

__all__ = ["ComponentCache", "ComponentCaches", "Spawn"]

# Starts a named, supervised loop (the service's; a loop that fails is started again).
Spawn = Callable[[str, Callable[[], Coroutine[Any, Any, None]]], None]

# What a deleted object is marked with until its watch tells (only its truth value is read).
DELETING = "deleting"


def slim(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the reader uses of a component: its kind, identity, owner references, deletion and
    component annotation (not its resourceVersion: a status update is no change here)."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    kept = {
        k: meta[k]
        for k in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp", "ownerReferences")
        if k in meta
    }
    annotations = meta.get("annotations")
    if isinstance(annotations, Mapping) and COMPONENT_ANNOTATION in annotations:
        kept["annotations"] = {COMPONENT_ANNOTATION: annotations[COMPONENT_ANNOTATION]}
    labels = meta.get("labels")
    if isinstance(labels, Mapping) and APPWRAPPER_LABEL in labels:
        kept["labels"] = {APPWRAPPER_LABEL: labels[APPWRAPPER_LABEL]}
    return {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "metadata": kept}


class ComponentCache(WatchedCache[dict[str, Any]]):
    """The labelled objects of one wrapped kind, by (namespace, name) and by AppWrapper."""

    what = "component"

    def __init__(
        self, ref: ResourceRef, *, on_change: Callable[[Key], None] | None = None, keep: Keep = keep_all
    ) -> None:
        super().__init__(on_change=on_change, keep=keep)
        self.ref = ref

    def appwrapper_of(self, obj: Mapping[str, Any]) -> Key | None:
        return appwrapper_label(obj)

    def value_of(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        out = slim(obj)
        # LIST items and some answers lack them.
        out["apiVersion"] = out.get("apiVersion") or self.ref.api_version
        out["kind"] = out.get("kind") or self.ref.kind
        return out

    def deleting(self, value: dict[str, Any]) -> dict[str, Any]:
        meta = value.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            return value
        return {**value, "metadata": {**meta, "deletionTimestamp": DELETING}}

    def objects(self, appwrapper: Key) -> list[Mapping[str, Any]]:
        """The objects labelled with ``appwrapper``."""
        return [entry.value for entry in self.of(appwrapper).values()]

    async def run(
        self, kube: Kube, ref: ResourceRef, *, label_selector: str | None = APPWRAPPER_LABEL
    ) -> None:
        """Keep the cache current (never returns; cancel it to stop)."""
        await super().run(kube, ref, label_selector=label_selector)


class ComponentCaches:
    """One :class:`ComponentCache` per wrapped kind (by API group and resource), each watching
    from the first time it is asked for (when ``kube`` and ``spawn`` are given; without, the
    caches never sync and every read goes to the API server)."""

    def __init__(
        self,
        kube: Kube | None = None,
        *,
        on_change: Callable[[Key], None] | None = None,
        keep: Keep = keep_all,
        spawn: Spawn | None = None,
    ) -> None:
        self.kube = kube
        self.on_change = on_change
        self.keep = keep
        self.spawn = spawn
        self._caches: dict[tuple[str, str], ComponentCache] = {}

    def __len__(self) -> int:
        return len(self._caches)

    def get(self, ref: ResourceRef) -> ComponentCache | None:
        """The kind's cache, if one was asked for."""
        return self._caches.get((ref.group, ref.plural))

    def cache(self, ref: ResourceRef) -> ComponentCache | None:
        """The kind's cache, its watch started now if this is the first time it is asked for;
        None for a cluster-scoped kind (not cached)."""
        if not ref.namespaced:
            return None
        key = (ref.group, ref.plural)
        cache = self._caches.get(key)
        if cache is None:
            cache = self._caches[key] = ComponentCache(ref, on_change=self.on_change, keep=self.keep)
            kube, spawn = self.kube, self.spawn
            if kube is not None and spawn is not None:
                watched = cache
                spawn(f"lifecycle-{ref.plural}-cache", lambda: watched.run(kube, ref))
        return cache

    async def reshard(self) -> None:
        """Reshard every kind's cache (see :meth:`WatchedCache.reshard`)."""
        await asyncio.gather(*(cache.reshard() for cache in list(self._caches.values())))
