"""The periodic resync: which AppWrappers have work or a clock pending, and that only they are queued."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from datetime import timedelta
from typing import Any

from services.lifecycle.machine import needs_attention
from services.lifecycle.resync import Resync
from services.lifecycle.workqueue import Key
from shared.appwrapper.constants import ANNOUNCED_ANNOTATION
from shared.kube import KubeApiError


def aw(
    phase: str, *, deployed: bool = False, quota: bool = False, suspend: bool = False, name: str = "a"
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "team"},
        "spec": {"suspend": suspend},
        "status": {
            "phase": phase,
            "conditions": [
                {"type": "ResourcesDeployed", "status": "True" if deployed else "False"},
                {"type": "QuotaReserved", "status": "True" if quota else "False"},
            ],
        },
    }


def test_resync_only_picks_appwrappers_with_work_or_clocks_pending() -> None:
    assert not needs_attention(aw("Running", deployed=True, quota=True))
    assert not needs_attention(aw("Failed"))
    assert needs_attention(aw("Failed", deployed=True, quota=True))
    assert needs_attention(aw("Succeeded", deployed=True))
    assert not needs_attention(aw("Succeeded"))
    assert needs_attention(aw("Resetting", deployed=True, quota=True))
    assert needs_attention(aw(""))
    assert not needs_attention(aw("Suspended", suspend=True))
    assert needs_attention(aw("Suspended", suspend=False))
    deleting = aw("Running", deployed=True)
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert needs_attention(deleting)


async def test_one_round_queues_every_appwrapper_that_needs_attention() -> None:
    given = [
        aw("Running", deployed=True, quota=True, name="steady"),
        aw("Resetting", name="resetting"),
        aw("Succeeded", deployed=True, name="ttl"),
        aw("Succeeded", name="done"),
    ]

    async def listing() -> AsyncIterator[Mapping[str, Any]]:
        for one in given:
            yield one

    queued: list[Key] = []
    await Resync(listing, queued.append, period=timedelta(seconds=30)).once()
    assert queued == [("team", "resetting"), ("team", "ttl")]


async def test_a_failed_list_is_left_for_the_next_round() -> None:
    async def failing() -> AsyncIterator[Mapping[str, Any]]:
        yield aw("Resetting", name="first")
        raise KubeApiError(503, "ServiceUnavailable", "etcd is down")

    queued: list[Key] = []
    await Resync(failing, queued.append, period=timedelta(seconds=30)).once()
    assert queued == [("team", "first")]


async def test_a_page_the_client_cannot_read_cuts_the_round_short_but_never_the_service() -> None:
    """A LIST page holding one object nested deeper than the JSON parser's recursion limit
    raises RecursionError, not KubeApiError; the resync must not die of it (a crash loop:
    every restart meets the same page)."""

    async def too_deep() -> AsyncIterator[Mapping[str, Any]]:
        yield aw("Resetting", name="first")
        raise RecursionError("maximum recursion depth exceeded while decoding a JSON object")

    queued: list[Key] = []
    resync = Resync(too_deep, queued.append, period=timedelta(seconds=30))
    await resync.once()
    await resync.once()
    assert queued == [("team", "first"), ("team", "first")]


async def test_malformed_listed_appwrappers_do_not_keep_the_others_from_being_queued() -> None:
    odd = aw("Resetting", name="odd")
    odd["status"] = ["not", "an", "object"]

    async def listing() -> AsyncIterator[Mapping[str, Any]]:
        for one in (odd, {"metadata": "garbage"}, aw("Resetting", name="next")):
            yield one

    queued: list[Key] = []
    await Resync(listing, queued.append, period=timedelta(seconds=30)).once()
    assert queued == [("team", "odd"), ("team", "next")]


def test_announcements_owed_make_a_running_appwrapper_need_attention() -> None:
    owing = aw("Running", deployed=True, quota=True)
    owing["status"]["conditions"][0]["lastTransitionTime"] = "2026-01-01T00:00:00Z"
    owing["metadata"]["annotations"] = {ANNOUNCED_ANNOTATION: "Resuming/0/2026-01-01T00:00:00Z"}
    assert needs_attention(owing)
    owing["metadata"]["annotations"] = {ANNOUNCED_ANNOTATION: "Running/0/2026-01-01T00:00:00Z"}
    assert not needs_attention(owing)
