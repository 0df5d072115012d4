"""Lifecycle's view of the AppWrappers, kept by one list-then-watch (see :mod:`~services.lifecycle.cache`).

Every reconcile pass starts from the AppWrapper. A GET per pass made about 15 GETs of each
AppWrapper during one clean-up, and the periodic resync a LIST of every AppWrapper every 30 s;
both now read this cache. It holds whole AppWrappers (the machine needs the spec, templates
included, and the resourceVersion its status write carries), less the field sets of their
``managedFields`` (only each entry's time is read). Each is kept as its JSON text and decoded
when read: as Python objects an AppWrapper takes about five times the memory of its JSON (some
12 KB against 2.5 KB for one Job of 8 pods; 10,000 AppWrappers would add over 100 MB to the
process), and a decode per pass (tens of microseconds) also hands every reader an object of its
own. One too deeply nested to encode is kept as it is.

What may be answered from it, and what not:

- an AppWrapper it holds: as the watch last delivered it, or as our own last write returned it,
  whichever is newer. It may lag behind someone else's write; that is harmless, because every
  status write carries the resourceVersion it was computed from, so a stale view costs a 409,
  never a lost update, and after a 409 the reconciler reads the AppWrapper by a GET
  (:meth:`services.lifecycle.reader.Reader.refresh`);
- "it is gone": only for an AppWrapper whose deletion the watch delivered (a tombstone, with
  the uid that was deleted: a verdict about another incarnation is not answered by it). One it
  never saw is read by a GET (it may be newer than the watch);
- whether the AppWrapper in hand is exactly as this replica last wrote it (:meth:`ours`): then
  no other writer has changed it since, and the component reads may believe their own cache's
  "absent" (:mod:`~services.lifecycle.componentcache`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from services.lifecycle.cache import Entry, Keep, WatchedCache, keep_all, object_key
from services.lifecycle.workqueue import Key
from shared import jsoncodec
from shared.appwrapper.constants import API_VERSION, KIND

__all__ = ["TOMBSTONES", "AppWrapperCache", "Lookup"]

# AppWrappers seen deleted that are remembered (the oldest forgotten first): a clean-up of
# 10,000 AppWrappers fits, at about 200 bytes each.
TOMBSTONES: Final = 65_536


@dataclass(frozen=True, slots=True)
class Lookup:
    """A cache's answer: ``known`` False when it cannot say (the caller asks the API server);
    otherwise ``obj`` is the AppWrapper, or None when it is gone."""

    known: bool
    obj: Mapping[str, Any] | None = None


UNKNOWN: Final = Lookup(False)
GONE: Final = Lookup(True, None)


def slim(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The AppWrapper as kept: whole, with its kind, less ``managedFields[].fieldsV1``."""
    out = dict(obj)
    meta = out.get("metadata")
    if isinstance(meta, Mapping) and isinstance(meta.get("managedFields"), list):
        fields = [
            {k: v for k, v in field.items() if k != "fieldsV1"} if isinstance(field, Mapping) else field
            for field in meta["managedFields"]
        ]
        out["metadata"] = {**meta, "managedFields": fields}
    # Watch events and LIST items (list_pages) carry them; an Event recorder needs them.
    out.setdefault("apiVersion", API_VERSION)
    out.setdefault("kind", KIND)
    return out


class AppWrapperCache(WatchedCache[jsoncodec.Kept]):
    """AppWrappers by (namespace, name)."""

    what = "appwrapper"

    def __init__(
        self,
        *,
        on_change: Callable[[Key], None] | None = None,
        keep: Keep = keep_all,
        tombstones: int = TOMBSTONES,
    ) -> None:
        super().__init__(on_change=on_change, keep=keep)
        # (namespace, name) -> uid of the AppWrapper the watch saw deleted.
        self._tombstones: OrderedDict[Key, str] = OrderedDict()
        self._capacity = tombstones
        # (namespace, name) -> the resourceVersion our last write of it returned.
        self._written: dict[Key, str] = {}

    def appwrapper_of(self, obj: Mapping[str, Any]) -> Key:
        return object_key(obj)

    def value_of(self, obj: Mapping[str, Any]) -> jsoncodec.Kept:
        return jsoncodec.keep(slim(obj))

    def changed(self, before: Entry[jsoncodec.Kept], after: Entry[jsoncodec.Kept]) -> bool:
        # Any new version is a change (what an AppWrapper holds is compared by its version, never
        # field by field: a template may nest deeper than a recursive comparison survives).
        return before.version != after.version or before.uid != after.uid

    def _stored(self, key: Key, entry: Entry[jsoncodec.Kept]) -> None:
        self._tombstones.pop(key, None)

    def _removed(self, key: Key, entry: Entry[jsoncodec.Kept], *, deleted: bool) -> None:
        self._written.pop(key, None)
        if deleted:
            self._tombstones[key] = entry.uid
            self._tombstones.move_to_end(key)
            while len(self._tombstones) > self._capacity:
                self._tombstones.popitem(last=False)

    def drop_unkept(self) -> None:
        super().drop_unkept()
        for key in [k for k in self._tombstones if not self.keep(k)]:
            del self._tombstones[key]

    def lookup(self, key: Key, uid: str = "") -> Lookup:
        """The AppWrapper (an object of the caller's own), gone (a tombstone, of ``uid`` when
        given), or unknown."""
        entry = self._entries.get(key)
        if entry is not None:
            return Lookup(True, jsoncodec.kept(entry.value))
        if not self.answers(key):
            return UNKNOWN
        gone = self._tombstones.get(key)
        if gone is not None and (not uid or not gone or uid == gone):
            return GONE
        return UNKNOWN

    def holding(self, key: Key, text: str) -> Mapping[str, Any] | None:
        """The AppWrapper held, only if its kept form contains ``text`` (e.g. an annotation's
        key): a look that decodes nothing for the AppWrappers that cannot match."""
        entry = self._entries.get(key)
        if entry is None or (isinstance(entry.value, bytes) and text.encode() not in entry.value):
            return None
        return jsoncodec.kept(entry.value)

    def offer(self, obj: Mapping[str, Any]) -> None:
        """An AppWrapper read by a GET: taken if newer than what is held, no reconcile triggered
        (reading changes nothing)."""
        key = object_key(obj)
        if not self.keep(key) or str((obj.get("metadata") or {}).get("uid") or "") in self._gone:
            return
        on_change, self._on_change = self._on_change, None
        try:
            self._upsert(key, obj)
        finally:
            self._on_change = on_change

    def wrote(self, obj: Mapping[str, Any]) -> None:
        """What the API server answered to our write of an AppWrapper (status, finalizer,
        annotations)."""
        self.put(obj)
        key = object_key(obj)
        entry = self._entries.get(key)
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if entry is not None and version and entry.version == version:
            self._written[key] = entry.version

    def ours(self, aw: Mapping[str, Any]) -> bool:
        """Whether ``aw`` is exactly as our own last write of it returned it."""
        meta = aw.get("metadata")
        version = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
        return bool(version) and self._written.get(object_key(aw)) == version

    def appwrappers(self) -> Iterator[dict[str, Any]]:
        """Every AppWrapper held (for the resync), decoded one at a time (10,000 decoded at once
        would set the process's peak memory every resync period)."""
        for entry in self.entries():
            yield jsoncodec.kept(entry.value)
