"""Deleting the workload at the end of a run, and waiting until nothing of it is left."""

from __future__ import annotations

import asyncio
import time

from bench.progress import Log
from bench.session import COMPONENTS, Session
from bench.tracker import Tracker
from shared.appwrapper.constants import APPWRAPPER_LABEL
from shared.kube import KubeApiError

DELETE_CONCURRENCY = 16
# The watches say when everything is gone; a LIST of every AppWrapper, pod and component each
# second would itself slow a clean-up of 10,000 AppWrappers down. The LISTs only confirm what the
# watches say (and catch anything they missed), at most this often.
CONFIRM_EVERY = 10.0
POLL = 0.5


async def delete_all(session: Session, tracker: Tracker, limit: float, log: Log) -> tuple[float, list[str]]:
    """Delete every AppWrapper; wait for them, their pods and components to be gone. Returns the
    seconds it took and, if the limit ran out first, what was left."""
    t = time.monotonic()
    sem = asyncio.Semaphore(DELETE_CONCURRENCY)

    async def delete(name: str) -> None:
        async with sem:
            await session.kube.delete(session.refs["aw"], name, session.namespace)

    # One request per AppWrapper: a collection delete of thousands can outlast any request
    # timeout on a loaded API server.
    results = await asyncio.gather(*(delete(n) for n in sorted(tracker.aws)), return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        log(f"{len(failed)} deletes failed (first: {failed[0]!r}); waiting anyway")
    return await wait_gone(session, tracker, t, limit)


async def wait_gone(session: Session, tracker: Tracker, t: float, limit: float) -> tuple[float, list[str]]:
    """Wait until the watches, then a LIST, find no AppWrapper, labelled pod or component of the
    workload, at most ``limit`` seconds after ``t`` (``time.monotonic()`` when the deletes began).
    Returns the seconds since ``t`` and, if the limit ran out first, what was left."""
    left: list[str] = []
    confirmed_at = 0.0
    while time.monotonic() - t < limit:
        tracked = tracker.leftovers()
        if any(tracked.values()) or time.monotonic() - confirmed_at < CONFIRM_EVERY:
            left = [f"{n} {what}" for what, n in tracked.items()]
            await asyncio.sleep(POLL)
            continue
        confirmed_at = time.monotonic()
        try:
            aws = await session.listing("aw")
            pods = [
                p
                for p in await session.listing("pod")
                if APPWRAPPER_LABEL in (p["metadata"].get("labels") or {})
            ]
            comps = [c for k in COMPONENTS for c in await session.listing(k)]
        except KubeApiError as exc:
            left = [f"listing failed: {exc}"]
            continue
        left = [f"{len(aws)} AppWrappers", f"{len(pods)} pods", f"{len(comps)} components"]
        if not aws and not pods and not comps:
            return time.monotonic() - t, []
    return time.monotonic() - t, [f"after {limit:.0f}s: " + ", ".join(left)]
