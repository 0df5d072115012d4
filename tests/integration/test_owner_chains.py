"""Owner lookups (shared/kube/owners.py) against the real API server: a pod's controller chain is
resolved with one GET per object in between, never twice, and an owner that is gone, replaced by
a namesake or of a kind the cluster does not serve is told apart from one that exists.

The real client is wrapped in a pass-through that counts the GETs it hands on; every answer is
the API server's own (the objects are made by the real Deployment and ReplicaSet controllers).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from respawn.testbed import manifests
from respawn.testbed.modes import Endpoints
from shared.appwrapper.constants import API_VERSION, APPWRAPPER_LABEL, KIND
from shared.kube import Kube, KubeApiError, ResourceRef
from shared.kube.owners import OwnerCache
from shared.ownership import NodeState, Outcome, OwnerLink, Reason, controller_link
from tests.waiting import until

pytestmark = pytest.mark.testbed


@dataclass
class Counted:
    """The real client; each GET is noted (kind and name) and passed on unchanged."""

    kube: Kube
    gets: list[tuple[str, str]] = field(default_factory=list)

    async def resource(self, api_version: str, kind: str) -> ResourceRef:
        return await self.kube.resource(api_version, kind)

    async def get(self, ref: ResourceRef, name: str, namespace: str | None = None) -> dict[str, Any]:
        self.gets.append((ref.kind, name))
        return await self.kube.get(ref, name, namespace)


@dataclass
class Cluster:
    kube: Kube
    namespace: str

    async def ref(self, api_version: str, kind: str) -> ResourceRef:
        return await self.kube.resource(api_version, kind)

    async def create(self, api_version: str, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self.kube.create(await self.ref(api_version, kind), body, self.namespace)

    async def pods(self, selector: str) -> list[dict[str, Any]]:
        listing = await self.kube.list(await self.ref("v1", "Pod"), self.namespace, labelSelector=selector)
        items: list[dict[str, Any]] = listing.get("items", [])
        return items


@pytest.fixture
async def cluster(testbed: Endpoints, appwrapper_crd: Path, namespace: str) -> AsyncIterator[Cluster]:
    kube = await Kube.connect(testbed.kubeconfig)
    try:
        yield Cluster(kube, namespace)
    finally:
        await kube.close()


def controlled_by(owner: dict[str, Any]) -> list[dict[str, Any]]:
    meta = owner["metadata"]
    return [
        {
            "apiVersion": owner["apiVersion"],
            "kind": owner["kind"],
            "name": meta["name"],
            "uid": meta["uid"],
            "controller": True,
        }
    ]


async def wrapped_deployment(c: Cluster, name: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """A suspended AppWrapper, a Deployment it controls (as lifecycle would create it), and the
    Deployment's pod once its ReplicaSet has made it."""
    aw = await c.create(API_VERSION, KIND, manifests.job_appwrapper(name, suspend=True))
    labels = {APPWRAPPER_LABEL: name, "app": name}
    deployment = manifests.deployment(
        f"{name}-web", replicas=1, template=manifests.pod_template(labels=labels, restart_policy="Always")
    )
    deployment["metadata"]["ownerReferences"] = controlled_by(aw)
    created = await c.create("apps/v1", "Deployment", deployment)
    [pod] = await until(f"the pod of {name}-web", lambda: c.pods(f"app={name}"), done=lambda p: len(p) == 1)
    return aw, created, pod


async def test_a_deployment_pod_is_attributed_with_one_get_per_object_in_between_and_none_after(
    cluster: Cluster,
) -> None:
    aw, deployment, pod = await wrapped_deployment(cluster, "web")
    aw_uid = aw["metadata"]["uid"]
    counted = Counted(cluster.kube)
    owners = OwnerCache(counted)
    rs = controller_link(pod)
    assert rs is not None and rs.kind == "ReplicaSet"

    found = await owners.resolve(cluster.namespace, rs, appwrapper_uid=aw_uid)
    assert found.owned and [link.kind for link in found.chain] == ["ReplicaSet", "Deployment", KIND]
    assert counted.gets == [("ReplicaSet", rs.name), ("Deployment", "web-web")]
    # Known now, by uid: another pod of the same chain, or the same one again, costs nothing.
    again = await owners.resolve(cluster.namespace, rs, appwrapper_uid=aw_uid)
    assert again.owned and len(counted.gets) == 2
    # Known only as long as it is the AppWrapper of that uid.
    other = await owners.resolve(cluster.namespace, rs, appwrapper_uid="uid-of-another-appwrapper")
    assert (other.outcome, other.reason) == (Outcome.FOREIGN, Reason.OTHER_APPWRAPPER)

    # With the component learned from a watch or a read (as both services do), only the
    # ReplicaSet in between is read.
    fresh = Counted(cluster.kube)
    learned = OwnerCache(fresh)
    learned.learn(deployment)
    assert (await learned.resolve(cluster.namespace, rs, appwrapper_uid=aw_uid)).owned
    assert fresh.gets == [("ReplicaSet", rs.name)]


async def test_concurrent_lookups_of_one_owner_share_one_get(cluster: Cluster) -> None:
    aw, _, pod = await wrapped_deployment(cluster, "twins")
    counted = Counted(cluster.kube)
    owners = OwnerCache(counted)
    rs = controller_link(pod)
    assert rs is not None
    found = await asyncio.gather(
        *(owners.resolve(cluster.namespace, rs, appwrapper_uid=aw["metadata"]["uid"]) for _ in range(5))
    )
    assert all(f.owned for f in found)
    assert sorted(counted.gets) == [("Deployment", "twins-web"), ("ReplicaSet", rs.name)]


async def test_an_owner_that_is_gone_or_replaced_by_a_namesake_orphans_its_pods_for_good(
    cluster: Cluster,
) -> None:
    counted = Counted(cluster.kube)
    owners = OwnerCache(counted)
    missing = OwnerLink("batch/v1", "Job", "never-was", "uid-never-was")
    found = await owners.resolve(cluster.namespace, missing, appwrapper_uid="uid-aw")
    assert (found.outcome, found.broken) == (Outcome.ORPHANED, missing)
    # A Job of that name now exists, but not with that uid: still gone, and not asked again.
    job = await cluster.create("batch/v1", "Job", manifests.job("never-was"))
    assert job["metadata"]["uid"] != missing.uid
    assert (
        await owners.resolve(cluster.namespace, missing, appwrapper_uid="uid-aw")
    ).outcome is Outcome.ORPHANED
    assert counted.gets == [("Job", "never-was")]
    namesake = OwnerLink("batch/v1", "Job", "never-was", "uid-an-earlier-never-was")
    node = await owners.fetch(cluster.namespace, namesake)
    assert node is not None and node.state is NodeState.GONE


async def test_an_owner_of_a_kind_the_cluster_does_not_serve_is_unreadable(cluster: Cluster) -> None:
    counted = Counted(cluster.kube)
    owners = OwnerCache(counted)
    forged = OwnerLink("nowhere.example.com/v1", "Thing", "t", "uid-t")
    found = await owners.resolve(cluster.namespace, forged, appwrapper_uid="uid-aw")
    assert (found.outcome, found.reason) == (Outcome.FOREIGN, Reason.UNREADABLE)
    # Discovery said so: no GET was made.
    assert counted.gets == []


@dataclass
class FailingFirst(Counted):
    """As Counted, but the first GET fails as an unavailable API server would (a fault injected
    in front of the real client); later ones are the server's own."""

    failed: int = 0

    async def get(self, ref: ResourceRef, name: str, namespace: str | None = None) -> dict[str, Any]:
        if not self.failed:
            self.failed += 1
            self.gets.append((ref.kind, name))
            raise KubeApiError(503, "Service Unavailable", "injected")
        return await super().get(ref, name, namespace)


async def test_a_failed_lookup_is_not_remembered_and_not_repeated_before_its_backoff(
    cluster: Cluster,
) -> None:
    aw, _, pod = await wrapped_deployment(cluster, "flaky")
    rs = controller_link(pod)
    assert rs is not None
    now = [0.0]
    failing = FailingFirst(cluster.kube)
    owners = OwnerCache(failing, clock=lambda: now[0])
    aw_uid = aw["metadata"]["uid"]

    found = await owners.resolve(cluster.namespace, rs, appwrapper_uid=aw_uid)
    assert (found.outcome, found.need) == (Outcome.PENDING, rs)
    # Within the backoff the owner is not asked again...
    assert (await owners.resolve(cluster.namespace, rs, appwrapper_uid=aw_uid)).outcome is Outcome.PENDING
    assert owners.backing_off(rs.uid) and len(failing.gets) == 1
    # ...and after it, it is, and the chain resolves.
    now[0] += 1.0
    assert (await owners.resolve(cluster.namespace, rs, appwrapper_uid=aw_uid)).owned
    assert failing.gets == [("ReplicaSet", rs.name), ("ReplicaSet", rs.name), ("Deployment", "flaky-web")]
