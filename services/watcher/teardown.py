"""Which AppWrappers are being torn down: their pods' and components' changes are not published.

Once an AppWrapper is being deleted (``metadata.deletionTimestamp`` set) health no longer judges
it, and nothing else reads its objects' observations: every pod that terminates on the way out
would still cost an observation of its deletion being requested, one of its containers
stopping, and its tombstone, each published, stored, delivered and folded. So while an
AppWrapper is torn down the watcher publishes only its objects' tombstones (what removes their
observations from the stream), and nothing of their other changes (docs/messages.md,
"Observations of an AppWrapper being deleted").

An AppWrapper that is gone stays known here for :data:`REMEMBER_GONE` seconds, for its pods and
components still terminating after it (the garbage collector deletes them after their owner);
one created again under the same name (a new AppWrapper) is not torn down. Pure: the clock is
passed in.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["REMEMBER_GONE", "TornDown"]

# How long (seconds) the objects of an AppWrapper that is gone are taken for torn down. Longer
# than a pod's default termination grace period (30 s) many times over; an object still changing
# after that is published again, as any other.
REMEMBER_GONE = 600.0

Key = tuple[str, str]


class TornDown:
    """AppWrappers being deleted, by (namespace, name), as the AppWrapper watch tells them."""

    def __init__(self, remember_gone: float = REMEMBER_GONE) -> None:
        self.remember_gone = remember_gone
        # Still there, with a deletionTimestamp.
        self._deleting: set[Key] = set()
        # Gone, with when that was seen, oldest first.
        self._gone: OrderedDict[Key, float] = OrderedDict()

    def learn(self, key: Key, *, deleting: bool, deleted: bool, now: float) -> None:
        """What one event of the AppWrapper watch says of the AppWrapper ``key``."""
        self._forget_old(now)
        if deleted:
            self._deleting.discard(key)
            self._gone[key] = now
            self._gone.move_to_end(key)
        elif deleting:
            self._deleting.add(key)
            self._gone.pop(key, None)
        else:
            # There and not being deleted: a new AppWrapper of that name, if one was torn down.
            self._deleting.discard(key)
            self._gone.pop(key, None)

    def holds(self, key: Key, now: float) -> bool:
        """Whether the AppWrapper ``key`` is being torn down (or went within ``remember_gone``)."""
        if key in self._deleting:
            return True
        gone_at = self._gone.get(key)
        return gone_at is not None and now - gone_at <= self.remember_gone

    def __len__(self) -> int:
        return len(self._deleting) + len(self._gone)

    def _forget_old(self, now: float) -> None:
        while self._gone:
            key, gone_at = next(iter(self._gone.items()))
            if now - gone_at <= self.remember_gone:
                return
            del self._gone[key]
