"""When reconciling one AppWrapper fails: counted, logged with its identity, told to its owner,
retried later, and never in the way of the other AppWrappers.

A failure here is anything a reconcile of one key raises: the API server refusing a write
(e.g. a status the schema rejects), an object the client cannot read (nested too deeply for the
JSON parser), a bug. The worker that ran it goes on with the next key at once; the failed key is
queued again after a backoff that doubles with each consecutive failure (1 s up to 5 min) and
is forgotten on the first success. Failures of the API itself (unavailable, throttling) are
retried the same way, with the backoff capped at 10 s (the key is fine; the API will be back),
and told to nobody: they are not about the object.

The owner is told with a Warning Event on the AppWrapper (reason ``ReconcileError``), recorded
under a name derived from the error, so a failure repeating every few seconds is one Event, not
thousands (and so are the ``InvalidValue`` Events of :mod:`services.lifecycle.validation`).
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from datetime import timedelta
from typing import Any, Final

from services.lifecycle.actions import EmitEvent
from services.lifecycle.workqueue import Key
from shared import metrics
from shared.appwrapper.constants import API_VERSION, KIND
from shared.kube import KubeApiError

__all__ = ["RECONCILE_ERROR_EVENT", "Failures", "Reported", "stub"]

log = logging.getLogger(__name__)

RECONCILE_ERROR_EVENT: Final = "ReconcileError"
FIRST_RETRY: Final = timedelta(seconds=1)
LAST_RETRY: Final = timedelta(minutes=5)
# The cap while the API itself is what fails.
LAST_RETRY_UNAVAILABLE: Final = timedelta(seconds=10)
# How many reported ids are remembered (to skip re-sending what the API server would refuse).
_REMEMBERED: Final = 10_000

FAILURES = metrics.counter(
    "respawn_lifecycle_object_failures",
    "Reconciles of one AppWrapper that failed, by error type (the loop went on with the next)",
    ["error"],
)

# Sends one Event on an AppWrapper (or its stand-in); whether it was delivered.
SendEvent = Callable[[Mapping[str, Any], EmitEvent], Awaitable[bool]]


def stub(key: Key) -> dict[str, Any]:
    """An AppWrapper as far as an Event on it needs one, when the object itself cannot be read."""
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"namespace": key[0], "name": key[1]}}


def _about_the_object(exc: BaseException) -> bool:
    """Whether the failure is this AppWrapper's (to tell its owner), not the API's availability."""
    cause = exc if isinstance(exc, KubeApiError) else exc.__cause__
    if isinstance(cause, KubeApiError):
        return not cause.transient and not cause.conflict
    return True


def describe(exc: BaseException) -> str:
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    return f"{type(cause).__name__}: {cause}"[:900]


class Reported:
    """Event ids already delivered by this process (the API server would refuse them anyway)."""

    def __init__(self, limit: int = _REMEMBERED) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._limit = limit

    def __contains__(self, event_id: str) -> bool:
        return event_id in self._ids

    def add(self, event_id: str) -> None:
        self._ids[event_id] = None
        self._ids.move_to_end(event_id)
        while len(self._ids) > self._limit:
            self._ids.popitem(last=False)

    async def send(self, aw: Mapping[str, Any], event: EmitEvent, send: SendEvent) -> None:
        if event.id in self:
            return
        if await send(aw, event):
            self.add(event.id)


class Failures:
    def __init__(self, send: SendEvent) -> None:
        self._send = send
        # Consecutive failures of each key, and whether the latest was about the object.
        self._attempts: dict[Key, tuple[int, bool]] = {}
        self.reported = Reported()

    def backoff(self, key: Key) -> timedelta:
        """How long to wait before ``key`` is reconciled again, after its latest failure."""
        attempts, about = self._attempts.get(key, (1, True))
        cap = LAST_RETRY if about else LAST_RETRY_UNAVAILABLE
        return min(cap, FIRST_RETRY * (1 << min(attempts - 1, 16)))

    def succeeded(self, key: Key) -> None:
        self._attempts.pop(key, None)

    def forget(self, key: Key) -> None:
        """The AppWrapper is gone."""
        self._attempts.pop(key, None)

    async def failed(self, key: Key, aw: Mapping[str, Any] | None, exc: BaseException) -> None:
        """Count, log with the object's identity, and tell the object's owner (once per error)."""
        attempts = self._attempts.get(key, (0, True))[0] + 1
        about = _about_the_object(exc)
        self._attempts[key] = (attempts, about)
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        FAILURES.labels(error=type(cause).__name__).inc()
        meta = (aw or {}).get("metadata") if isinstance(aw, Mapping) else None
        uid = str(meta.get("uid", "")) if isinstance(meta, Mapping) else ""
        text = describe(exc)
        log.log(
            logging.ERROR if about else logging.WARNING,
            "reconciling AppWrapper %s/%s (uid %s) failed (%d in a row; next try in %s): %s",
            key[0],
            key[1],
            uid or "?",
            attempts,
            self.backoff(key),
            text,
            exc_info=about and not isinstance(cause, KubeApiError),
        )
        if not about:
            return
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        event = EmitEvent(
            type="Warning",
            reason=RECONCILE_ERROR_EVENT,
            message=f"lifecycle cannot reconcile this AppWrapper and will retry: {text}",
            id=f"{uid or key[0] + '/' + key[1]}/{RECONCILE_ERROR_EVENT}/{digest}",
        )
        try:
            await self.reported.send(aw if isinstance(aw, Mapping) and meta else stub(key), event, self._send)
        except Exception as report_exc:  # reporting must never be a second failure
            log.warning("telling %s/%s about the failure failed: %s", key[0], key[1], report_exc)
