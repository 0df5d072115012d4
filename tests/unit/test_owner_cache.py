"""The owner cache's memory (shared/kube/owners.py), without a call: what is learned from watched
or read objects attributes pods by itself; the cache is bounded, least recently used first; an
"unreadable" answer is believed for a while only. (Its lookups run against the real API server:
tests/integration/test_owner_chains.py.)"""

from __future__ import annotations

from typing import Any

from shared.appwrapper.constants import API_VERSION, KIND
from shared.kube import ResourceRef
from shared.kube.owners import UNREADABLE_TTL, OwnerCache
from shared.ownership import ChainNode, NodeState, Outcome, OwnerLink

AW = OwnerLink(API_VERSION, KIND, "aw", "uid-aw")


class NoCalls:
    async def resource(self, api_version: str, kind: str) -> ResourceRef:
        raise AssertionError("nothing is read here")

    async def get(self, ref: ResourceRef, name: str, namespace: str | None = None) -> dict[str, Any]:
        raise AssertionError("nothing is read here")


def job(name: str, owner: OwnerLink) -> dict[str, Any]:
    ref = {"apiVersion": owner.api_version, "kind": owner.kind, "name": owner.name, "uid": owner.uid}
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "ownerReferences": [{**ref, "controller": True}]}
    }


def link(name: str) -> OwnerLink:
    return OwnerLink("batch/v1", "Job", name, f"uid-{name}")


async def test_a_learned_component_attributes_its_pods_without_a_call() -> None:
    owners = OwnerCache(NoCalls())
    owners.learn(job("train", AW))
    found = await owners.resolve("ns", link("train"), appwrapper_uid="uid-aw")
    assert found.owned


def test_the_least_recently_used_is_dropped_first() -> None:
    owners = OwnerCache(NoCalls(), capacity=2)
    owners.learn(job("a", AW))
    owners.learn(job("b", AW))
    assert owners.get("uid-a") is not None  # used: b is now the oldest
    owners.learn(job("c", AW))
    assert len(owners) == 2
    assert owners.get("uid-b") is None
    assert owners.attribute(link("b"), appwrapper_uid="uid-aw").outcome is Outcome.PENDING
    assert owners.attribute(link("a"), appwrapper_uid="uid-aw").owned


def test_unreadable_is_believed_for_a_while_and_gone_for_good() -> None:
    now = [0.0]
    owners = OwnerCache(NoCalls(), clock=lambda: now[0])
    owners.remember(ChainNode("uid-x", state=NodeState.UNREADABLE))
    owners.remember(ChainNode("uid-y", state=NodeState.GONE))
    assert owners.attribute(link("x"), appwrapper_uid="uid-aw").outcome is Outcome.FOREIGN
    now[0] += UNREADABLE_TTL
    assert owners.attribute(link("x"), appwrapper_uid="uid-aw").outcome is Outcome.PENDING
    assert owners.attribute(link("y"), appwrapper_uid="uid-aw").outcome is Outcome.ORPHANED
