"""list_then_watch's re-list: an object deleted while no watch saw it comes out as a DELETED
event with its identity, labels and owners, recalled from what the watch remembers of it (kept
as compact JSON, not as the objects themselves). The API server is a script of answers here."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from shared import jsoncodec
from shared.kube import ResourceRef
from shared.kube.watch import WatchEvent, _remember, list_then_watch

PODS = ResourceRef(group="", version="v1", plural="pods", kind="Pod", namespaced=True)


def pod(name: str, rv: str, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "team",
            "uid": f"uid-{name}",
            "resourceVersion": rv,
            "labels": {"workload.codeflare.dev/appwrapper": "a", **labels},
            "ownerReferences": [{"kind": "Job", "name": "j", "uid": "uid-j", "controller": True}],
            "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}],
        },
        "spec": {"containers": [{"name": "main", "image": "busybox", "env": [{"name": "X", "value": "1"}]}]},
        "status": {"phase": "Running"},
    }


class ScriptedKube:
    """Answers LISTs with ``lists`` in turn and watches with ``watches`` in turn (lines)."""

    def __init__(self, lists: list[list[dict[str, Any]]], watches: list[list[dict[str, Any]]]) -> None:
        self.lists = lists
        self.watches = watches

    async def request(
        self, method: str, path: str, *, query: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        items = self.lists.pop(0)
        return {"metadata": {"resourceVersion": "100"}, "items": json.loads(json.dumps(items))}

    async def stream_lines(
        self, path: str, *, query: Mapping[str, Any], request_timeout: float | None
    ) -> AsyncIterator[bytes]:
        for event in self.watches.pop(0):
            yield json.dumps(event).encode() + b"\n"


async def events(kube: ScriptedKube, count: int) -> list[WatchEvent]:
    out: list[WatchEvent] = []
    async for event in list_then_watch(kube, PODS):  # type: ignore[arg-type]
        out.append(event)
        if len(out) == count:
            return out
    raise AssertionError("the watch ended")


async def test_a_relist_announces_what_was_deleted_unseen_with_its_identity_labels_and_owners() -> None:
    a, b = pod("a-0", "10", role="x"), pod("a-1", "11")
    changed = pod("a-1", "12", role="y")
    kube = ScriptedKube(
        lists=[[a, b], [a]],
        # b changes (its remembered form is replaced), then the watch expires: a re-list.
        watches=[[{"type": "MODIFIED", "object": changed}, {"type": "ERROR", "object": {"code": 410}}], []],
    )
    got = await events(kube, 7)
    assert [(e.type, e.obj.get("metadata", {}).get("name")) for e in got] == [
        ("ADDED", "a-0"),
        ("ADDED", "a-1"),
        ("SYNCED", None),
        ("MODIFIED", "a-1"),
        ("MODIFIED", "a-0"),  # listed again
        ("DELETED", "a-1"),  # not listed again: deleted while no watch saw it
        ("SYNCED", None),
    ]
    tombstone = got[5].obj
    assert tombstone["metadata"] == {
        "name": "a-1",
        "namespace": "team",
        "uid": "uid-a-1",
        "resourceVersion": "12",
        "labels": {"workload.codeflare.dev/appwrapper": "a", "role": "y"},
        "ownerReferences": [{"kind": "Job", "name": "j", "uid": "uid-j", "controller": True}],
    }
    assert "spec" not in tombstone and "status" not in tombstone


def test_an_object_is_remembered_as_compact_json_and_recalled_whole() -> None:
    obj = pod("a-0", "10")
    kept = _remember(obj)
    assert isinstance(kept, bytes)
    assert len(kept) < 400  # the slim form only: no spec, status or managed fields
    assert jsoncodec.kept(kept)["metadata"]["ownerReferences"] == obj["metadata"]["ownerReferences"]


def test_an_object_too_deep_to_encode_is_remembered_as_it_is() -> None:
    deep: dict[str, Any] = {}
    for _ in range(100_000):
        deep = {"x": deep}
    obj = pod("a-0", "10")
    obj["metadata"]["labels"] = deep
    kept = _remember(obj)
    assert isinstance(kept, dict)
    assert jsoncodec.kept(kept)["metadata"]["name"] == "a-0"
