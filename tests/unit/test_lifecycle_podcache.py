"""The lifecycle pod cache: what it answers, what it refuses to answer, what it triggers."""

from __future__ import annotations

from typing import Any

from services.lifecycle.observed import ObservedPod, fold_safely
from services.lifecycle.podcache import PodCache
from services.lifecycle.reader import Reader
from shared.appwrapper.constants import APPWRAPPER_LABEL, GROUP, KIND, PLURAL, VERSION
from shared.kube import ResourceRef
from shared.kube.watch import WatchEvent


def pod(
    name: str, aw: str | None, phase: str = "Running", *, ns: str = "team", **meta: Any
) -> dict[str, Any]:
    labels = {APPWRAPPER_LABEL: aw} if aw is not None else {}
    return {
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "labels": labels, **meta},
        "status": {"phase": phase},
    }


def synced(triggers: list[tuple[str, str]] | None = None, *events: WatchEvent) -> PodCache:
    cache = PodCache(on_change=None if triggers is None else triggers.append)
    for event in events:
        cache.apply(event)
    cache.apply(WatchEvent("SYNCED", {}))
    return cache


def test_nothing_is_answered_before_the_initial_list_has_synced() -> None:
    cache = PodCache()
    cache.apply(WatchEvent("ADDED", pod("a-0", "a")))
    assert cache.pods("team", "a") is None
    cache.apply(WatchEvent("SYNCED", {}))
    assert cache.pods("team", "a") == (ObservedPod(name="a-0", phase="Running", uid="uid-a-0"),)


def test_pods_are_indexed_by_namespace_and_appwrapper_label() -> None:
    cache = synced(
        None,
        WatchEvent("ADDED", pod("a-1", "a", "Pending")),
        WatchEvent("ADDED", pod("a-0", "a")),
        WatchEvent("ADDED", pod("b-0", "b")),
        WatchEvent("ADDED", pod("a-0", "a", ns="other")),
        WatchEvent("ADDED", pod("loose", None)),
    )
    assert [p.name for p in cache.pods("team", "a") or ()] == ["a-0", "a-1"]
    assert [p.phase for p in cache.pods("team", "a") or ()] == ["Running", "Pending"]
    assert [p.name for p in cache.pods("team", "b") or ()] == ["b-0"]
    assert [p.name for p in cache.pods("other", "a") or ()] == ["a-0"]
    assert len(cache) == 4  # the unlabelled pod is not kept


def test_no_pods_is_never_answered_from_the_cache() -> None:
    """An empty answer would let a reset recreate or quota be released on a lagging view."""
    cache = synced(None, WatchEvent("ADDED", pod("a-0", "a")))
    assert cache.pods("team", "unknown") is None
    cache.apply(WatchEvent("DELETED", pod("a-0", "a")))
    assert cache.pods("team", "a") is None


def test_terminating_and_phase_changes_are_followed() -> None:
    cache = synced(None, WatchEvent("ADDED", pod("a-0", "a")))
    cache.apply(WatchEvent("MODIFIED", pod("a-0", "a", deletionTimestamp="2026-01-01T00:00:00Z")))
    assert cache.pods("team", "a") == (
        ObservedPod(name="a-0", phase="Running", terminating=True, uid="uid-a-0"),
    )
    cache.apply(WatchEvent("MODIFIED", pod("a-0", "a", "Failed")))
    assert [p.phase for p in cache.pods("team", "a") or ()] == ["Failed"]


def test_a_relabelled_pod_moves_and_both_appwrappers_are_triggered() -> None:
    triggers: list[tuple[str, str]] = []
    cache = synced(triggers, WatchEvent("ADDED", pod("x", "a")), WatchEvent("ADDED", pod("y", "a")))
    cache.apply(WatchEvent("MODIFIED", pod("x", "b")))
    assert [p.name for p in cache.pods("team", "a") or ()] == ["y"]
    assert [p.name for p in cache.pods("team", "b") or ()] == ["x"]
    assert sorted(triggers) == [("team", "a"), ("team", "b")]
    cache.apply(WatchEvent("MODIFIED", pod("y", None)))
    assert cache.pods("team", "a") is None
    assert triggers[-1] == ("team", "a")


def test_changes_trigger_a_reconcile_but_the_initial_list_and_no_op_updates_do_not() -> None:
    triggers: list[tuple[str, str]] = []
    cache = synced(triggers, WatchEvent("ADDED", pod("a-0", "a")))
    assert triggers == []  # the initial list: the service's first resync covers it
    cache.apply(WatchEvent("MODIFIED", pod("a-0", "a")))  # e.g. only an annotation changed
    assert triggers == []
    cache.apply(WatchEvent("MODIFIED", pod("a-0", "a", "Failed")))
    cache.apply(WatchEvent("DELETED", pod("a-0", "a", "Failed")))
    cache.apply(WatchEvent("ADDED", pod("a-0", "a", "Pending")))
    assert triggers == [("team", "a")] * 3


def test_a_relist_after_the_watch_expired_keeps_answering_and_drops_what_vanished() -> None:
    cache = synced(None, WatchEvent("ADDED", pod("a-0", "a")), WatchEvent("ADDED", pod("a-1", "a")))
    # list_then_watch's re-list: every live object again, DELETED for the vanished, SYNCED.
    cache.apply(WatchEvent("MODIFIED", pod("a-0", "a", "Succeeded")))
    cache.apply(WatchEvent("DELETED", pod("a-1", "a")))
    cache.apply(WatchEvent("SYNCED", {}))
    assert cache.pods("team", "a") == (ObservedPod(name="a-0", phase="Succeeded", uid="uid-a-0"),)


AW_UID = "uid-aw-a"
# The pods below are components of the AppWrapper themselves: their chain is known without a read.
OWNED = {
    "ownerReferences": [
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": "a", "uid": AW_UID, "controller": True}
    ]
}


class ListingKube:
    """Stands in for the Kube client: counts pod LISTs and answers them with ``listed``."""

    def __init__(self) -> None:
        self.lists: list[str] = []
        self.listed = [pod("listed", "a", **OWNED), pod("forged", "a")]

    async def list(self, ref: ResourceRef, namespace: str | None = None, **query: Any) -> dict[str, Any]:
        self.lists.append(str(query.get("labelSelector")))
        return {"items": self.listed}

    async def get(self, ref: ResourceRef, name: str, namespace: str | None = None) -> dict[str, Any]:
        raise AssertionError("only pods are read here")

    async def resource(self, api_version: str, kind: str) -> ResourceRef:
        raise AssertionError("only pods are read here")


def reader_with(cache: PodCache, kube: ListingKube) -> Reader:
    return Reader(
        kube,
        appwrappers=ResourceRef(group=GROUP, version=VERSION, plural=PLURAL, kind=KIND, namespaced=True),
        pods=ResourceRef(group="", version="v1", plural="pods", kind="Pod", namespaced=True),
        pod_cache=cache,
    )


async def test_the_reader_answers_from_the_cache_and_lists_only_where_it_cannot() -> None:
    kube = ListingKube()
    cache = PodCache()
    reader = reader_with(cache, kube)
    # Not synced yet: a LIST (and of what it lists, only the AppWrapper's own pod counts).
    assert [p.name for p in await reader.observe_pods("team", "a", AW_UID) or ()] == ["listed"]
    assert kube.lists == [f"{APPWRAPPER_LABEL}=a"]
    cache.apply(WatchEvent("ADDED", pod("a-0", "a", **OWNED)))
    cache.apply(WatchEvent("SYNCED", {}))
    # Synced and holding pods: no request at all.
    assert [p.name for p in await reader.observe_pods("team", "a", AW_UID) or ()] == ["a-0"]
    assert len(kube.lists) == 1
    # "None left" is for the API server to say.
    cache.apply(WatchEvent("DELETED", pod("a-0", "a", **OWNED)))
    assert [p.name for p in await reader.observe_pods("team", "a", AW_UID) or ()] == ["listed"]
    assert len(kube.lists) == 2


async def test_pods_whose_chain_does_not_lead_to_the_appwrapper_are_never_counted() -> None:
    kube = ListingKube()
    cache = PodCache()
    reader = reader_with(cache, kube)
    cache.apply(WatchEvent("ADDED", pod("forged", "a")))
    cache.apply(WatchEvent("SYNCED", {}))
    # The cache holds only a pod with the label and no owner: that is not "a pod is left" (it
    # would hold up every deletion), nor is it "none left": the LIST says, and only its own
    # pod counts.
    assert [p.name for p in await reader.observe_pods("team", "a", AW_UID) or ()] == ["listed"]
    assert len(kube.lists) == 1
    # A pod of another incarnation of the AppWrapper (same name, another uid) does not count either.
    assert await reader.observe_pods("team", "a", "uid-of-a-newer-a") == ()


def test_a_malformed_pod_is_skipped_and_the_cache_goes_on() -> None:
    cache = synced()
    bad = pod("a-0", "a")
    bad["metadata"]["labels"] = ["not", "a", "map"]
    fold_safely(cache.apply, WatchEvent("ADDED", bad), "pod")
    weird_status = pod("a-1", "a")
    weird_status["status"] = "Running"  # read as no phase: Pending
    fold_safely(cache.apply, WatchEvent("ADDED", weird_status), "pod")
    fold_safely(cache.apply, WatchEvent("ADDED", pod("a-2", "a")), "pod")
    assert [(p.name, p.phase) for p in cache.pods("team", "a") or ()] == [
        ("a-1", "Pending"),
        ("a-2", "Running"),
    ]


def test_holds_none_only_where_the_cache_can_answer() -> None:
    cache = PodCache(keep=lambda key: key[1] != "elsewhere")
    cache.apply(WatchEvent("ADDED", pod("a-0", "a")))
    assert not cache.holds_none("team", "b"), "not synced: it knows nothing"
    cache.apply(WatchEvent("SYNCED", {}))
    assert cache.holds_none("team", "b")
    assert not cache.holds_none("team", "a")
    assert not cache.holds_none("team", "elsewhere"), "another replica's AppWrapper"
    cache.apply(WatchEvent("DELETED", pod("a-0", "a")))
    assert cache.holds_none("team", "a")


async def test_a_starting_or_running_workload_takes_the_caches_none_without_a_list() -> None:
    kube = ListingKube()
    cache = synced(None)
    reader = reader_with(cache, kube)
    aw = {"metadata": {"namespace": "team", "name": "a", "uid": AW_UID}, "spec": {"components": []}}
    seen = await reader.observe(aw, {}, components=False, nodes=False, none_from_cache=True)
    assert (seen.pods, seen.pods_confirmed, seen.pods_gone_known) == ((), False, None)
    assert kube.lists == []
    # Without it (a deletion under way), "none" is the API server's to say.
    seen = await reader.observe(aw, {}, components=False, nodes=False)
    assert [p.name for p in seen.pods or ()] == ["listed"]
    assert seen.pods_confirmed
    assert kube.lists == [f"{APPWRAPPER_LABEL}=a"]
    # Pods in the cache are taken from it either way; an unsynced cache is listed either way.
    cache.apply(WatchEvent("ADDED", pod("a-0", "a", **OWNED)))
    seen = await reader.observe(aw, {}, components=False, nodes=False, none_from_cache=True)
    assert [p.name for p in seen.pods or ()] == ["a-0"]
    fresh = reader_with(PodCache(), kube)
    seen = await fresh.observe(aw, {}, components=False, nodes=False, none_from_cache=True)
    assert [p.name for p in seen.pods or ()] == ["listed"]
    assert len(kube.lists) == 2
