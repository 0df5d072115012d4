"""The node cache and the reader's node reads: what node exclusion decides from."""

from __future__ import annotations

from typing import Any

from services.lifecycle.nodecache import NodeCache
from services.lifecycle.observed import ObservedNode
from services.lifecycle.podcache import PodCache
from services.lifecycle.reader import Reader
from shared.appwrapper.constants import GROUP, KIND, PLURAL, VERSION
from shared.kube import KubeApiError, ResourceRef
from shared.kube.watch import WatchEvent

NODES = ResourceRef(group="", version="v1", plural="nodes", kind="Node", namespaced=False)
PODS = ResourceRef(group="", version="v1", plural="pods", kind="Pod", namespaced=True)
AWS = ResourceRef(group=GROUP, version=VERSION, plural=PLURAL, kind=KIND, namespaced=True)


def node(name: str, *, ready: str = "True", unschedulable: bool = False, gpus: int = 8) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"unschedulable": True} if unschedulable else {},
        "status": {
            "conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": ready}],
            "allocatable": {"cpu": "32", "nvidia.com/gpu": str(gpus)},
        },
    }


def test_a_node_is_kept_as_what_a_decision_needs() -> None:
    seen = ObservedNode.of(node("n1"))
    assert seen == ObservedNode("n1", ready=True, allocatable={"cpu": "32", "nvidia.com/gpu": "8"})
    assert seen.schedulable
    assert not ObservedNode.of(node("n2", ready="Unknown")).schedulable
    assert not ObservedNode.of(node("n3", unschedulable=True)).schedulable
    assert not ObservedNode.of({"metadata": {"name": "bare"}}).schedulable, "no Ready condition: not ready"


def test_nothing_is_answered_before_the_initial_list_has_synced() -> None:
    cache = NodeCache()
    cache.apply(WatchEvent("ADDED", node("n2")))
    assert cache.nodes() is None
    cache.apply(WatchEvent("ADDED", node("n1")))
    cache.apply(WatchEvent("SYNCED", {}))
    assert [n.name for n in cache.nodes() or ()] == ["n1", "n2"]


def test_changes_and_deletions_are_followed() -> None:
    cache = NodeCache()
    for event in (WatchEvent("ADDED", node("n1")), WatchEvent("ADDED", node("n2")), WatchEvent("SYNCED", {})):
        cache.apply(event)
    cache.apply(WatchEvent("MODIFIED", node("n1", unschedulable=True)))
    cache.apply(WatchEvent("DELETED", node("n2")))
    assert cache.nodes() == (ObservedNode.of(node("n1", unschedulable=True)),)


class NodeListingKube:
    """Stands in for the Kube client: counts node LISTs (failing them with ``error`` if set)."""

    def __init__(self, error: KubeApiError | None = None) -> None:
        self.lists = 0
        self.error = error

    async def list(self, ref: ResourceRef, namespace: str | None = None, **query: Any) -> dict[str, Any]:
        assert ref == NODES
        self.lists += 1
        if self.error is not None:
            raise self.error
        return {"items": [node("listed")]}

    async def get(self, ref: ResourceRef, name: str, namespace: str | None = None) -> dict[str, Any]:
        raise AssertionError("only nodes are read here")

    async def resource(self, api_version: str, kind: str) -> ResourceRef:
        raise AssertionError("only nodes are read here")


def reader(kube: NodeListingKube, cache: NodeCache | None, *, nodes: ResourceRef | None = NODES) -> Reader:
    return Reader(kube, appwrappers=AWS, pods=PODS, pod_cache=PodCache(), nodes=nodes, node_cache=cache)


async def test_the_reader_answers_from_the_cache_and_lists_only_before_it_has_synced() -> None:
    kube = NodeListingKube()
    cache = NodeCache()
    r = reader(kube, cache)
    assert [n.name for n in await r.observe_nodes() or ()] == ["listed"]
    assert kube.lists == 1
    cache.apply(WatchEvent("ADDED", node("n1")))
    cache.apply(WatchEvent("SYNCED", {}))
    assert [n.name for n in await r.observe_nodes() or ()] == ["n1"]
    assert kube.lists == 1, "no request once the cache has synced"


async def test_nodes_are_unknown_when_not_read_or_not_readable() -> None:
    assert await reader(NodeListingKube(), NodeCache(), nodes=None).observe_nodes() is None
    failing = NodeListingKube(error=KubeApiError(403, "Forbidden", "nodes is forbidden"))
    assert await reader(failing, NodeCache()).observe_nodes() is None
    aw = {"metadata": {"name": "a", "namespace": "team", "uid": "u"}, "spec": {"components": []}}
    observed = await reader(NodeListingKube(), NodeCache()).observe(aw, {}, pods=False, nodes=False)
    assert observed.nodes is None
