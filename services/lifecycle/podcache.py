"""Lifecycle's view of the pods labelled with an AppWrapper, kept by one list-then-watch.

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
- "no pod is left" must never be a guess: it releases quota and lets a reset recreate the
  components. So an empty answer is not given from the cache (:meth:`PodCache.pods` returns
  ``None``) and the reader confirms it with a LIST; that happens once per reset or deletion,
  not on every pass of a running workload.
"""

from __future__ import annotations

from collections.abc import Callable

from services.lifecycle.observed import ObservedPod, fold_safely
from services.lifecycle.workqueue import Key
from shared.appwrapper.constants import APPWRAPPER_LABEL
from shared.kube import Kube, ResourceRef
from shared.kube.watch import WatchEvent, list_then_watch

__all__ = ["PodCache"]


class PodCache:
    """Labelled pods by (namespace, AppWrapper name). Pure state plus one watch task."""

    def __init__(self, on_change: Callable[[Key], None] | None = None) -> None:
        self._by_aw: dict[Key, dict[str, ObservedPod]] = {}
        # pod (namespace, name) -> the AppWrapper it is indexed under (labels can change).
        self._owner: dict[Key, str] = {}
        self._on_change = on_change
        self.synced = False

    def __len__(self) -> int:
        return len(self._owner)

    def apply(self, event: WatchEvent) -> None:
        """Fold one watch event in; tell ``on_change`` which AppWrapper's pods changed."""
        if event.type == "SYNCED":
            self.synced = True
            return
        meta = event.obj.get("metadata") or {}
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        appwrapper = str((meta.get("labels") or {}).get(APPWRAPPER_LABEL) or "")
        pod_key = (namespace, name)
        previous = self._owner.pop(pod_key, None)
        # The AppWrapper the pod has left, if any: it was deleted, or relabelled.
        left = previous if event.type == "DELETED" or previous != appwrapper else None
        if left is not None:
            self._drop(namespace, left, name)
        if event.type != "DELETED" and appwrapper:
            self._owner[pod_key] = appwrapper
            pods = self._by_aw.setdefault((namespace, appwrapper), {})
            seen = ObservedPod.of(event.obj)
            changed = pods.get(name) != seen
            pods[name] = seen
            if changed:
                self._notify((namespace, appwrapper))
        if left is not None:
            self._notify((namespace, left))

    def _drop(self, namespace: str, appwrapper: str, name: str) -> None:
        pods = self._by_aw.get((namespace, appwrapper))
        if pods is not None:
            pods.pop(name, None)
            if not pods:
                del self._by_aw[(namespace, appwrapper)]

    def _notify(self, key: Key) -> None:
        if self._on_change is not None and self.synced:
            self._on_change(key)

    def pods(self, namespace: str, appwrapper: str) -> tuple[ObservedPod, ...] | None:
        """The AppWrapper's pods, or None when the cache cannot answer (not synced yet, or it
        holds none: "no pod left" is for a LIST to say, see the module docstring)."""
        if not self.synced:
            return None
        pods = self._by_aw.get((namespace, appwrapper))
        if not pods:
            return None
        return tuple(sorted(pods.values(), key=lambda p: p.name))

    async def run(self, kube: Kube, pods_ref: ResourceRef) -> None:
        """Keep the cache current (never returns; cancel it to stop)."""
        async for event in list_then_watch(kube, pods_ref, label_selector=APPWRAPPER_LABEL):
            fold_safely(self.apply, event, "pod")
