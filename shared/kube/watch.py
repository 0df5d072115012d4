"""List-then-watch for any resource, as informers do it.

- LIST (paginated), then WATCH from the list's resourceVersion with bookmarks, so a
  reconnect resumes where it stopped instead of replaying everything;
- on 410 Gone (the resourceVersion was compacted away) re-LIST, and emit DELETED for
  objects that vanished while we were not watching, so no transition is lost;
- on any other disconnect or server error, reconnect with capped exponential backoff, never
  sooner than the server's ``Retry-After``.

The iterator never ends on its own; cancel the task to stop it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Literal

from tenacity import RetryCallState, Retrying, wait_exponential, wait_random_exponential

from shared import jsoncodec, metrics
from shared.kube.client import Kube, KubeApiError, ResourceRef, decode_body

log = logging.getLogger(__name__)

UNDECODABLE_EVENTS = metrics.counter(
    "respawn_kube_undecodable_events",
    "Watch events skipped because the object could not be decoded (e.g. nested too deeply)",
)

EventType = Literal["ADDED", "MODIFIED", "DELETED", "SYNCED"]


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: EventType
    obj: dict[str, Any]


def _slim(obj: dict[str, Any]) -> dict[str, Any]:
    """What is kept of each object to announce its deletion after a re-list.

    Only identity and labels (enough for a tombstone); keeping whole objects would cost
    hundreds of megabytes with thousands of pods.
    """
    meta = obj.get("metadata", {})
    return {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": {
            k: meta[k]
            for k in ("name", "namespace", "uid", "labels", "resourceVersion", "ownerReferences")
            if k in meta
        },
    }


# One object as the watch remembers it (its slim form) until a re-list may announce its deletion:
# kept as compact JSON (jsoncodec.keep). As Python objects (the labels and owner references are
# a few dozen small dicts and strings) it took 2-4 KB per object, in every service and for every
# object of every watch: some 60 MB per service at 10,000 AppWrappers; as JSON a few hundred
# bytes.
def _remember(obj: dict[str, Any]) -> jsoncodec.Kept:
    return jsoncodec.keep(_slim(obj))


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata", {})
    return meta.get("namespace", ""), meta.get("name", "")


class Backoff:
    """Capped exponential backoff for loops that retry for ever and start over once healthy.

    The delays are tenacity's: half of each is fixed and half random (between ``d/2`` and ``d``,
    ``d = min(cap, base * 2**attempt)``), so a retry is never immediate and many clients do not
    retry in step. tenacity's own retry loop does not fit here: the watch yields events between
    failures, and a healthy stretch (:meth:`reset`) starts the delays over.
    """

    def __init__(self, base: float = 0.2, cap: float = 10.0) -> None:
        self._wait = wait_exponential(multiplier=base / 2, max=cap / 2) + wait_random_exponential(
            multiplier=base / 2, max=cap / 2
        )
        self._state = RetryCallState(Retrying(), fn=None, args=(), kwargs={})

    @property
    def attempt(self) -> int:
        """How many delays have been handed out since the last reset."""
        return self._state.attempt_number - 1

    def next(self) -> float:
        delay = float(self._wait(self._state))
        self._state.attempt_number += 1
        return delay

    def reset(self) -> None:
        self._state.attempt_number = 1


async def list_then_watch(
    kube: Kube,
    ref: ResourceRef,
    *,
    namespace: str | None = None,
    label_selector: str | None = None,
    page_size: int = 500,
    watch_timeout: int = 300,
    stop_on: Callable[[KubeApiError], bool] | None = None,
) -> AsyncIterator[WatchEvent]:
    """``stop_on``: an API error (of the LIST or the WATCH) for which it answers True ends the
    iteration by raising it instead of retrying: e.g. a 403, which no retry changes (RBAC that
    grants list but not watch would otherwise leave the caller holding a list that never
    changes)."""
    known: dict[tuple[str, str], jsoncodec.Kept] = {}
    backoff = Backoff()
    resource_version = ""
    need_list = True
    while True:
        try:
            if need_list:
                # Page by page: a re-list of thousands of pods never sits in memory whole.
                current: dict[tuple[str, str], jsoncodec.Kept] = {}
                resource_version = ""
                async for page, page_version in list_pages(kube, ref, namespace, label_selector, page_size):
                    resource_version = page_version  # the list's snapshot; the watch resumes from it
                    for obj in page:
                        current[_key(obj)] = _remember(obj)
                        yield WatchEvent("MODIFIED" if _key(obj) in known else "ADDED", obj)
                for key, old in list(known.items()):
                    if key not in current:
                        yield WatchEvent("DELETED", jsoncodec.kept(old))
                known = current
                need_list = False
                yield WatchEvent("SYNCED", {"metadata": {"resourceVersion": resource_version}})
            query: dict[str, str | int | bool] = {
                "watch": True,
                "allowWatchBookmarks": True,
                "resourceVersion": resource_version,
                "timeoutSeconds": watch_timeout,
            }
            if label_selector:
                query["labelSelector"] = label_selector
            async for line in kube.stream_lines(
                ref.path(namespace), query=query, request_timeout=watch_timeout + 30
            ):
                try:
                    event = decode_body(line, f"watch {ref.plural}")
                except KubeApiError as exc:
                    # One object the client cannot read (nested too deeply) must not stop the
                    # watch of every other: it is skipped, and seen again at the next re-list.
                    log.error("skipping an event: %s", exc.message)
                    UNDECODABLE_EVENTS.inc()
                    continue
                etype = event.get("type")
                obj = event.get("object") or {}
                if etype == "ERROR":
                    if obj.get("code") == 410:
                        log.info("watch on %s expired (410 Gone); re-listing", ref.plural)
                        need_list = True
                        break
                    raise KubeApiError(int(obj.get("code") or 500), "WatchError", str(obj.get("message")))
                rv = obj.get("metadata", {}).get("resourceVersion")
                if rv:
                    resource_version = rv
                if etype == "BOOKMARK":
                    continue
                if etype == "DELETED":
                    known.pop(_key(obj), None)
                elif etype in ("ADDED", "MODIFIED"):
                    known[_key(obj)] = _remember(obj)
                else:
                    continue
                backoff.reset()
                yield WatchEvent(etype, obj)
        except asyncio.CancelledError:
            raise
        except KubeApiError as exc:
            if exc.gone:
                need_list = True
                continue
            if stop_on is not None and stop_on(exc):
                raise
            # Never sooner than the server asked (429 and Retry-After).
            delay = max(backoff.next(), exc.retry_after or 0.0)
            log.warning("watch on %s failed (%s); retrying in %.1fs", ref.plural, exc, delay)
            await asyncio.sleep(delay)
        except (OSError, TimeoutError, ValueError, Exception) as exc:  # aiohttp errors, broken JSON
            delay = backoff.next()
            log.warning("watch on %s disconnected (%r); retrying in %.1fs", ref.plural, exc, delay)
            await asyncio.sleep(delay)


async def list_pages(
    kube: Kube,
    ref: ResourceRef,
    namespace: str | None = None,
    label_selector: str | None = None,
    page_size: int = 500,
) -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
    """The pages of a paginated LIST, each with the list's resourceVersion (set on the last)."""
    cont = ""
    while True:
        query: dict[str, str | int | bool] = {"limit": page_size}
        if label_selector:
            query["labelSelector"] = label_selector
        if cont:
            query["continue"] = cont
        page = await kube.request("GET", ref.path(namespace), query=query)
        items: list[dict[str, Any]] = page.get("items", [])
        for item in items:
            # LIST responses omit each item's kind/apiVersion; put them back for consumers.
            item.setdefault("kind", ref.kind)
            item.setdefault("apiVersion", ref.api_version)
        cont = page.get("metadata", {}).get("continue", "")
        yield items, str(page.get("metadata", {}).get("resourceVersion", ""))
        if not cont:
            return
