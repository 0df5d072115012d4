"""The ``respawn.dev/announced`` record, written a moment after the announcements it records.

The record is what spares a later pass (or another process) from re-sending announcements that
went out (see :mod:`services.lifecycle.announcements`). Written at the end of every reconcile
that announced something, it is one merge patch of the AppWrapper per transition: at a start,
the third write of the AppWrapper after its finalizer and status; at a clean-up, a write of an
object about to vanish. Each is also a watch event that every watcher of AppWrappers is sent.

Written ``delay`` later instead, the transitions of one burst (Suspended, Resuming, Running in a
few seconds) are recorded by one patch, and an AppWrapper deleted in the meantime by none. Until
then this process remembers the record (:meth:`DeferredRecords.marker`), so its own passes do
not re-send; a process killed in between leaves it unwritten, and whoever reconciles the
AppWrapper next re-sends the announcements with the ids they had, which JetStream drops (within
its duplicate window, which ``delay`` must stay well inside) and the API server refuses (the
Event's name exists). So a kill costs a re-send at most, as it did between the announcements and
an immediate record, only over ``delay`` instead of one round trip.

Only the announced record waits: the incident-trace annotation is written at once (a process
that takes over mid-reset continues the trace from it), together with the newest record if
there is one; an older one still owed is then dropped (a record of an earlier transition spares
no re-send: only the status's current transition is ever re-derived).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from shared import metrics
from shared.appwrapper.constants import ANNOUNCED_ANNOTATION

__all__ = ["DeferredRecords"]

log = logging.getLogger("respawn.lifecycle.records")

Key = tuple[str, str]
# Writes ``annotations`` on the AppWrapper ``ref`` names (name, namespace, uid): True when it did,
# False when it failed (tried again), None when that incarnation is gone (nothing to record).
Write = Callable[[Mapping[str, Any], Mapping[str, str | None]], Awaitable[bool | None]]

RECORDS = metrics.counter(
    "respawn_lifecycle_announced_records",
    "Announced records owed after a delay, by what became of them: written, superseded (the "
    "record was rewritten or went with another write first), dropped (the AppWrapper went away "
    "or the write failed; its announcements are re-sent by id if needed)",
    ["outcome"],
)

# How long a stopping process spends writing what it owes (a stop must not hang on an unreachable
# API server; what is left unwritten costs a re-send by id at most).
FLUSH_LIMIT = 5.0
# A failed write is tried again this many times (each after ``delay``) before it is dropped.
RETRIES = 3


@dataclass(slots=True)
class _Owed:
    ref: dict[str, Any]  # metadata: name, namespace, uid
    marker: str
    due: float
    tries: int = 0


class DeferredRecords:
    def __init__(
        self,
        write: Write,
        *,
        delay: float,
        clock: Callable[[], float] = time.monotonic,
        lock: Callable[[Key], asyncio.Lock] | None = None,
    ) -> None:
        """``write``: the patch; ``delay``: seconds between the first record owed and its write;
        ``lock``: the AppWrapper's reconcile lock, held for the write (a patch landing in the
        middle of a reconcile would make its status write lose to a newer version)."""
        self._write = write
        self._lock = lock
        self.delay = delay
        self._clock = clock
        self._owed: dict[Key, _Owed] = {}
        self._wake = asyncio.Event()

    def __len__(self) -> int:
        return len(self._owed)

    def owe(self, key: Key, aw: Mapping[str, Any], marker: str) -> None:
        """Record ``marker`` on ``aw`` within ``delay``: the time of the first record owed for this
        incarnation stands (a busy AppWrapper is not postponed by each new transition)."""
        meta = aw.get("metadata") or {}
        ref = {key_: meta.get(key_, "") for key_ in ("name", "namespace", "uid")}
        existing = self._owed.get(key)
        if existing is not None and existing.ref["uid"] == ref["uid"]:
            existing.marker = marker
            return
        self._owed[key] = _Owed(ref, marker, self._clock() + self.delay)
        self._wake.set()

    def marker(self, key: Key, uid: str) -> str | None:
        """The record owed for this incarnation of ``key`` (None: none)."""
        owed = self._owed.get(key)
        return owed.marker if owed is not None and owed.ref["uid"] == uid else None

    def taken(self, key: Key) -> None:
        """Another write of ``key``'s annotations goes now: what is owed is superseded by it."""
        if self._owed.pop(key, None) is not None:
            RECORDS.labels(outcome="superseded").inc()

    def forget(self, key: Key) -> None:
        """``key`` went away: nothing to record."""
        if self._owed.pop(key, None) is not None:
            RECORDS.labels(outcome="dropped").inc()

    def due(self, now: float) -> list[Key]:
        """The keys whose record is due at ``now``."""
        return [key for key, owed in self._owed.items() if owed.due <= now]

    async def write_due(self) -> int:
        """Write every record due now, side by side; how many were written."""
        keys = self.due(self._clock())
        results = await asyncio.gather(*(self._write_one(key) for key in keys))
        return sum(results)

    async def flush(self) -> int:
        """Write everything owed now (the process is stopping); how many were written."""
        results = await asyncio.gather(*(self._write_one(key) for key in list(self._owed)))
        return sum(results)

    async def _write_one(self, key: Key) -> bool:
        if self._lock is None:
            return await self._write_unlocked(key)
        async with self._lock(key):
            return await self._write_unlocked(key)

    async def _write_unlocked(self, key: Key) -> bool:
        # Looked up only now: a reconcile that held the lock may have superseded or forgotten it.
        owed = self._owed.get(key)
        if owed is None:
            return False
        marker = owed.marker
        result = await self._write(owed.ref, {ANNOUNCED_ANNOTATION: marker})
        ok = bool(result)
        current = self._owed.get(key)
        if current is not owed:
            # Forgotten or taken over while the write was in flight: theirs now.
            return ok
        if result is None:
            del self._owed[key]
            RECORDS.labels(outcome="dropped").inc()
            return False
        if ok and owed.marker == marker:
            del self._owed[key]
            RECORDS.labels(outcome="written").inc()
            return True
        if ok:
            # A newer transition was owed while this one was written: it is due at once.
            owed.due = self._clock()
            return True
        owed.tries += 1
        if owed.tries > RETRIES:
            del self._owed[key]
            RECORDS.labels(outcome="dropped").inc()
            log.warning(
                "dropped the announced record of %s/%s after %d failed writes (its announcements "
                "are re-sent by id when it is next reconciled)",
                key[0],
                key[1],
                owed.tries,
            )
            return False
        owed.due = self._clock() + self.delay
        return False

    async def run(self) -> None:
        """Write the records as they fall due, until cancelled (then what is owed is flushed)."""
        try:
            while True:
                self._wake.clear()
                if self._owed:
                    soonest = min(owed.due for owed in self._owed.values())
                    wait = max(0.0, soonest - self._clock())
                else:
                    wait = None
                if wait is None or wait > 0:
                    try:
                        await asyncio.wait_for(self._wake.wait(), timeout=wait)
                        continue
                    except TimeoutError:
                        pass
                await self.write_due()
        except asyncio.CancelledError:
            # Stopping (a rollout, a scale-in): what is owed is written now, so the next owner
            # does not re-send it. Bounded: a stop must not hang on an unreachable API server.
            if self._owed:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.flush(), timeout=FLUSH_LIMIT)
            raise
