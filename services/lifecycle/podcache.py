"""Lifecycle's view of the pods labelled with an AppWrapper, kept by one list-then-watch (see
:mod:`~services.lifecycle.cache`).

Every reconcile pass needs the AppWrapper's pods. A LIST by label selector per pass makes the
API server filter every pod of the namespace each time: with 10,000 AppWrappers that is the
bulk of its CPU and of a pass's time. This cache answers from one watch instead, keeping only
what a decision needs (name, phase, terminating, uid, controller owner reference), a few
hundred bytes per pod. It indexes by the label only: which of those pods are the AppWrapper's
(their owner chain leads to it) the reader decides (``Reader.ours``).

What a watch cache may say and what it may not:

- "these pods exist" may lag (a pod already gone still listed, a new one not yet listed). Both
  are harmless: every change the watch delivers triggers another reconcile of its AppWrapper
  (``on_change``), so a decision made on a lagging view is revisited as soon as it catches up.
  A pod lifecycle deleted counts as terminating from the delete's answer on
  (:meth:`~services.lifecycle.cache.WatchedCache.mark_deleting`), so a pass before the watch
  tells it does not delete it again.
- "no pod is left" must never be a guess: it releases quota and lets a reset recreate the
  components. So an empty answer is not given from the cache (:meth:`PodCache.pods` returns
  ``None``) and the reader confirms it with a LIST; that happens once per reset or deletion,
  not on every pass of a running workload.
- A workload that is starting or running draws no such conclusion from "none": its pods are
  counted for ``PodsReady`` only, and "none yet" is what a workload whose pods have not been
  created or not yet reached the watch looks like. For those passes the reader takes the
  cache's "none" (:meth:`PodCache.holds_none`) without a LIST, marked as not confirmed
  (``Observed.pods_confirmed``), so that a deletion that begins in the same pass still waits
  for a LIST before it completes. At a mass start that is two LISTs per AppWrapper spared,
  each of which makes the API server filter every pod of the namespace.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from services.lifecycle.cache import WatchedCache
from services.lifecycle.observed import ObservedPod
from services.lifecycle.workqueue import Key
from shared.appwrapper.constants import APPWRAPPER_LABEL
from shared.kube import Kube, ResourceRef

__all__ = ["PodCache", "appwrapper_label"]


def appwrapper_label(obj: Mapping[str, Any]) -> Key | None:
    """(namespace, AppWrapper) an object's ``workload.codeflare.dev/appwrapper`` label names."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    labels = meta.get("labels")
    if labels is not None and not isinstance(labels, Mapping):
        raise TypeError(f"labels is a {type(labels).__name__}, not a map")
    name = (labels or {}).get(APPWRAPPER_LABEL)
    return (str(meta.get("namespace") or ""), name) if isinstance(name, str) and name else None


class PodCache(WatchedCache[ObservedPod]):
    """Labelled pods by (namespace, AppWrapper name). Pure state plus one watch task."""

    what = "pod"

    def appwrapper_of(self, obj: Mapping[str, Any]) -> Key | None:
        return appwrapper_label(obj)

    def value_of(self, obj: Mapping[str, Any]) -> ObservedPod:
        return ObservedPod.of(obj)

    def deleting(self, value: ObservedPod) -> ObservedPod:
        return dataclasses.replace(value, terminating=True)

    def pods(self, namespace: str, appwrapper: str) -> tuple[ObservedPod, ...] | None:
        """The AppWrapper's pods, or None when the cache cannot answer (not synced yet, an
        AppWrapper it does not keep, or it holds none: "no pod left" is for a LIST to say, see
        the module docstring)."""
        key = (namespace, appwrapper)
        if not self.synced or not self.keep(key):
            return None
        pods = self.of(key)
        if not pods:
            return None
        return tuple(sorted((entry.value for entry in pods.values()), key=lambda p: p.name))

    def holds_none(self, namespace: str, appwrapper: str) -> bool:
        """Whether the cache, able to answer for the AppWrapper, holds none of its pods: "none
        that the watch has brought so far", never a confirmation that none is left."""
        key = (namespace, appwrapper)
        return self.answers(key) and not self.of(key)

    async def run(
        self, kube: Kube, ref: ResourceRef, *, label_selector: str | None = APPWRAPPER_LABEL
    ) -> None:
        """Keep the cache current (never returns; cancel it to stop)."""
        await super().run(kube, ref, label_selector=label_selector)
