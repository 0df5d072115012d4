"""What lifecycle's watch caches share: one list-then-watch each, read like a controller's informers.

Lifecycle reads the AppWrappers (:mod:`~services.lifecycle.awcache`), their components
(:mod:`~services.lifecycle.componentcache`) and their pods (:mod:`~services.lifecycle.podcache`)
from watches instead of a GET or a LIST per reconcile pass. Each cache:

- is kept current by one list-then-watch (``shared/kube/watch.py``); a change of what a
  decision needs triggers a reconcile of the object's AppWrapper (``on_change``), once the
  initial list has synced (the first resync covers the objects it lists);
- holds only the objects of the AppWrappers its ``keep`` predicate passes (an AppWrapper by its
  own key, components and pods by their ``workload.codeflare.dev/appwrapper`` label), so that
  replicas sharing the AppWrappers each hold only their own; :meth:`WatchedCache.reshard`,
  after the predicate changed, drops what is no longer kept and lists again to pick up what
  newly is;
- takes what the API server answered to lifecycle's own writes (:meth:`WatchedCache.put`,
  :meth:`WatchedCache.mark_deleting`), so that the pass after a write does not act on a view
  from before it (create a component twice, delete a pod twice). A watch event older than what
  the cache holds is then ignored: resourceVersions are compared as integers, as client-go's
  integer mutation cache does (the API server's are etcd revisions); a version that is not an
  integer is never taken for older;
- says when its answer of "absent" may be believed (:meth:`WatchedCache.answers`): not before
  the initial list has synced, not while a re-list for a reshard is under way, and never for an
  AppWrapper it does not keep. The readers then ask the API server instead;
- gives up a watch the API server forbids (RBAC without ``watch``): its contents are dropped, it
  answers nothing (the readers read from the API as without a cache), and it tries again after
  :data:`FORBIDDEN_RETRY`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Generic, TypeVar

from services.lifecycle.observed import fold_safely
from services.lifecycle.workqueue import Key
from shared.kube import Kube, KubeApiError, ResourceRef
from shared.kube.watch import WatchEvent, list_then_watch

__all__ = ["FORBIDDEN_RETRY", "Entry", "Keep", "WatchedCache", "keep_all", "object_key", "older"]

log = logging.getLogger(__name__)

# Which AppWrappers' objects a cache holds, by (namespace, AppWrapper name).
Keep = Callable[[Key], bool]

# How many AppWrappers turned away (not kept), and how many uids of deleted objects, a cache
# remembers.
REJECTED: Final = 65_536
GONE: Final = 65_536

# How long a cache whose watch the API server forbids waits before trying again (a role may be
# granted meanwhile); the readers read from the API server until then.
FORBIDDEN_RETRY: Final = 300.0

V = TypeVar("V")


def keep_all(key: Key) -> bool:
    """The default predicate: every AppWrapper's objects are kept (one replica does all)."""
    return True


def object_key(obj: Mapping[str, Any]) -> Key:
    """(namespace, name) of an object."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _meta_str(obj: Mapping[str, Any], field: str) -> str:
    meta = obj.get("metadata")
    value = meta.get(field) if isinstance(meta, Mapping) else None
    return value if isinstance(value, str) else ""


def older(version: str, than: str) -> bool:
    """Whether resourceVersion ``version`` is certainly older than ``than``: only when both are
    integers (an opaque version is never taken for older, so the newer event wins)."""
    try:
        return int(version) < int(than)
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class Entry(Generic[V]):
    """One object held: the AppWrapper it belongs to, its uid and resourceVersion, and what
    decisions need of it."""

    appwrapper: Key
    uid: str
    version: str
    value: V


class WatchedCache(Generic[V]):
    """Objects by (namespace, name), indexed by AppWrapper. Pure state plus one watch task
    (:meth:`run`). Subclasses say which AppWrapper an object belongs to and what of it is kept."""

    # For logs and the skipped-event metric.
    what: ClassVar[str] = "object"

    def __init__(self, *, on_change: Callable[[Key], None] | None = None, keep: Keep = keep_all) -> None:
        self._entries: dict[Key, Entry[V]] = {}
        self._by_aw: dict[Key, dict[str, Entry[V]]] = {}
        self._on_change = on_change
        self.keep = keep
        self.synced = False
        # The AppWrappers whose objects were turned away (not kept) or dropped since the last list
        # from scratch: the cache may lack some of their objects, so it does not answer for them
        # even once ``keep`` passes them, until a list (a reshard's) has brought them in. Bounded
        # (the least recently turned away forgotten first): it guards the moment between a change
        # of ``keep`` and the reshard that must follow it.
        self._rejected: OrderedDict[Key, None] = OrderedDict()
        # The objects seen, and the AppWrappers turned away, since a list that started from an
        # empty view of the server began (the first one, or a restart's): at its end, what it
        # did not list is gone.
        self._listed: set[Key] | None = None
        self._rejected_in_list: set[Key] = set()
        # The uids of objects the watch saw deleted (bounded, the oldest forgotten first). An
        # answer to our own write may arrive after the watch delivered the object's deletion
        # (a pod deleted with grace 0, an AppWrapper whose last finalizer we removed): it must not
        # bring the object back. Uids are never reused.
        self._gone: OrderedDict[str, None] = OrderedDict()
        self._restart: asyncio.Event | None = None
        # Why the API server refused the cache's list or watch, until it next syncs.
        self.forbidden: KubeApiError | None = None
        self._sync_waiters: list[asyncio.Future[None]] = []

    # --------------------------------------------------------------- what subclasses say

    def appwrapper_of(self, obj: Mapping[str, Any]) -> Key | None:
        """The AppWrapper ``obj`` belongs to, or None when it belongs to none (not kept)."""
        raise NotImplementedError

    def value_of(self, obj: Mapping[str, Any]) -> V:
        """What decisions need of ``obj``."""
        raise NotImplementedError

    def deleting(self, value: V) -> V:
        """``value`` of an object lifecycle has just deleted (on its way out)."""
        return value

    def changed(self, before: Entry[V], after: Entry[V]) -> bool:
        """Whether the change is one a reconcile must see (by default: what is kept changed)."""
        return before.value != after.value

    def _stored(self, key: Key, entry: Entry[V]) -> None:
        """Told of every object stored (a subclass's own bookkeeping)."""

    def _removed(self, key: Key, entry: Entry[V], *, deleted: bool) -> None:
        """Told of every object dropped; ``deleted``: it is gone from the server."""

    # ----------------------------------------------------------------------- reading

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, namespace: str, name: str) -> Entry[V] | None:
        """The object (namespace, name), if held."""
        return self._entries.get((namespace, name))

    def of(self, appwrapper: Key) -> Mapping[str, Entry[V]]:
        """The objects of an AppWrapper held, by name."""
        return self._by_aw.get(appwrapper, {})

    def entries(self) -> Iterator[Entry[V]]:
        return iter(list(self._entries.values()))

    def held(self) -> list[Key]:
        """(namespace, name) of every object held."""
        return list(self._entries)

    def answers(self, appwrapper: Key) -> bool:
        """Whether what the cache does not hold of ``appwrapper`` may be taken as absent."""
        return self.synced and self.keep(appwrapper) and appwrapper not in self._rejected

    # ----------------------------------------------------------------------- writing

    def apply(self, event: WatchEvent) -> None:
        """Fold one watch event in; tell ``on_change`` which AppWrapper's objects changed."""
        if event.type == "SYNCED":
            self._synced(event.obj)
            return
        key = object_key(event.obj)
        if self._listed is not None:
            self._listed.add(key)
        if event.type == "DELETED":
            self._delete(key, event.obj)
        else:
            # Back in the watch's selection (a label removed and put back): not gone after all.
            self._gone.pop(_meta_str(event.obj, "uid"), None)
            self._upsert(key, event.obj)

    def put(self, obj: Mapping[str, Any]) -> None:
        """What the API server answered to one of our writes (the object as it now is), unless
        the watch has already delivered that object's deletion."""
        if _meta_str(obj, "uid") not in self._gone:
            self._upsert(object_key(obj), obj)

    def mark_deleting(self, namespace: str, name: str, uid: str, answer: Mapping[str, Any] | None) -> None:
        """We deleted the object (namespace, name) of ``uid``; ``answer``: what the API server
        answered (the object, or a Status). Until its watch says so, it counts as on its way out,
        so a pass in between does not delete it again."""
        key = (namespace, name)
        if isinstance(answer, Mapping) and _meta_str(answer, "uid") == uid and uid and uid not in self._gone:
            self._upsert(key, answer)
        current = self._entries.get(key)
        if current is None or (uid and current.uid and current.uid != uid):
            return
        self._store(
            key, Entry(current.appwrapper, current.uid, current.version, self.deleting(current.value))
        )

    def drop_unkept(self) -> None:
        """Drop the objects whose AppWrapper ``keep`` no longer passes."""
        for key, entry in list(self._entries.items()):
            if not self.keep(entry.appwrapper):
                self._reject(entry.appwrapper)
                self._remove(key, entry, deleted=False)

    async def until_synced(self, seconds: float) -> bool:
        """Wait (at most ``seconds``) for the list to have synced; whether it has."""
        if not self.synced:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._sync_waiters.append(waiter)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter, seconds)
        return self.synced

    async def reshard(self) -> None:
        """After ``keep`` changed: drop what is no longer kept, and (while :meth:`run` runs) list
        again to pick up what newly is; returns once that list has synced (or the watch is
        forbidden). The newly kept AppWrappers are not answered for before that list has synced
        (the readers ask the API server meanwhile)."""
        self.drop_unkept()
        if self._restart is None:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sync_waiters.append(waiter)
        self._restart.set()
        await waiter

    def _upsert(self, key: Key, obj: Mapping[str, Any]) -> None:
        current = self._entries.get(key)
        version = _meta_str(obj, "resourceVersion")
        if current is not None and older(version, current.version):
            # What we hold is newer: our own write's answer, put before its event arrived.
            return
        appwrapper = self.appwrapper_of(obj)
        if appwrapper is not None and not self.keep(appwrapper):
            self._reject(appwrapper)
        if appwrapper is None or not self.keep(appwrapper):
            if current is not None:
                # It left its AppWrapper (relabelled), or that AppWrapper is not ours any more.
                self._remove(key, current, deleted=False)
                self._notify(current.appwrapper)
            return
        entry = Entry(appwrapper, _meta_str(obj, "uid"), version, self.value_of(obj))
        if current is not None and current.appwrapper != appwrapper:
            self._remove(key, current, deleted=False)
            self._notify(current.appwrapper)
            current = None
        self._store(key, entry)
        if current is None or self.changed(current, entry):
            self._notify(appwrapper)

    def _delete(self, key: Key, obj: Mapping[str, Any]) -> None:
        current = self._entries.get(key)
        if current is None:
            return
        uid = _meta_str(obj, "uid")
        if uid and current.uid and uid != current.uid:
            # The deletion of an earlier namesake, arriving after we created the new one.
            return
        self._remove(key, current, deleted=True)
        self._notify(current.appwrapper)

    def _synced(self, obj: Mapping[str, Any]) -> None:
        if self._listed is not None:
            # A list that started from an empty view: whatever it did not list is gone, unless
            # it is newer than the list (our own write's answer, put meanwhile).
            listed_at = _meta_str(obj, "resourceVersion")
            for key, entry in list(self._entries.items()):
                if key not in self._listed and not older(listed_at, entry.version):
                    self._remove(key, entry, deleted=True)
                    self._notify(entry.appwrapper)
            self._listed = None
            # A list from scratch lists every object: only what it turned away may be missing.
            self._rejected = OrderedDict((k, None) for k in self._rejected if k in self._rejected_in_list)
            self._rejected_in_list = set()
        self.synced = True
        self.forbidden = None
        self._wake_waiters()

    def _reject(self, appwrapper: Key) -> None:
        self._rejected[appwrapper] = None
        self._rejected.move_to_end(appwrapper)
        while len(self._rejected) > REJECTED:
            self._rejected.popitem(last=False)
        if self._listed is not None:
            self._rejected_in_list.add(appwrapper)

    def _store(self, key: Key, entry: Entry[V]) -> None:
        self._entries[key] = entry
        self._by_aw.setdefault(entry.appwrapper, {})[key[1]] = entry
        self._stored(key, entry)

    def _remove(self, key: Key, entry: Entry[V], *, deleted: bool) -> None:
        if deleted and entry.uid:
            self._gone[entry.uid] = None
            while len(self._gone) > GONE:
                self._gone.popitem(last=False)
        self._entries.pop(key, None)
        objects = self._by_aw.get(entry.appwrapper)
        if objects is not None:
            objects.pop(key[1], None)
            if not objects:
                del self._by_aw[entry.appwrapper]
        self._removed(key, entry, deleted=deleted)

    def _notify(self, appwrapper: Key) -> None:
        if self._on_change is not None and self.synced and self.keep(appwrapper):
            self._on_change(appwrapper)

    def _wake_waiters(self) -> None:
        waiters, self._sync_waiters = self._sync_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _forbidden(self, ref: ResourceRef, exc: KubeApiError) -> None:
        for key, entry in list(self._entries.items()):
            self._remove(key, entry, deleted=False)
        self.synced = False
        self.forbidden = exc
        self._wake_waiters()
        log.error(
            "the %s cache cannot watch %s (%s): lifecycle reads them from the API server instead, "
            "one request per read; grant its ServiceAccount list and watch on %s. Trying again in %.0fs",
            self.what,
            ref.plural,
            exc,
            ref.plural,
            FORBIDDEN_RETRY,
        )

    # ------------------------------------------------------------------------ the watch

    async def run(self, kube: Kube, ref: ResourceRef, *, label_selector: str | None = None) -> None:
        """Keep the cache current (never returns; cancel it to stop). A failure propagates (the
        service's supervisor starts it again); :meth:`reshard` restarts it from a new list."""
        restart = asyncio.Event()
        self._restart = restart
        try:
            while True:
                restart.clear()
                follow = asyncio.create_task(self._follow(kube, ref, label_selector))
                woken = asyncio.create_task(restart.wait())
                try:
                    await asyncio.wait({follow, woken}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for task in (follow, woken):
                        task.cancel()
                    await asyncio.gather(follow, woken, return_exceptions=True)
                failure = follow.exception() if follow.done() and not follow.cancelled() else None
                if failure is not None:
                    raise failure
        finally:
            self._restart = None
            self._wake_waiters()

    async def _follow(self, kube: Kube, ref: ResourceRef, label_selector: str | None) -> None:
        # A new list_then_watch lists first, from an empty view of its own.
        self._listed = set()
        self._rejected_in_list = set()
        try:
            async for event in list_then_watch(
                kube, ref, label_selector=label_selector, stop_on=lambda exc: exc.forbidden
            ):
                fold_safely(self.apply, event, self.what)
        except KubeApiError as exc:  # forbidden (stop_on): no retry would change it soon
            self._forbidden(ref, exc)
            await asyncio.sleep(FORBIDDEN_RETRY)
