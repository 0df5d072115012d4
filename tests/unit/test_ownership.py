"""Pod attribution by controller owner chain (shared/ownership.py): chain data in, verdict out."""

from __future__ import annotations

from typing import Any

import pytest

from shared.appwrapper.constants import API_VERSION, KIND
from shared.ownership import (
    MAX_CHAIN_DEPTH,
    ChainNode,
    NodeState,
    Outcome,
    OwnerLink,
    Reason,
    attribute,
    controller_link,
    node_of,
)

AW_UID = "uid-aw"


def link(kind: str, name: str, uid: str, api_version: str = "") -> OwnerLink:
    default = {
        "Job": "batch/v1",
        "ReplicaSet": "apps/v1",
        "Deployment": "apps/v1",
        "StatefulSet": "apps/v1",
        "Pod": "v1",
        "JobSet": "jobset.x-k8s.io/v1alpha2",
        "LeaderWorkerSet": "leaderworkerset.x-k8s.io/v1",
        "RayCluster": "ray.io/v1",
        "RayJob": "ray.io/v1",
        "PyTorchJob": "kubeflow.org/v1",
        KIND: API_VERSION,
    }
    return OwnerLink(api_version or default[kind], kind, name, uid)


AW = link(KIND, "victim", AW_UID)


def known(*nodes: tuple[str, OwnerLink | None]) -> dict[str, ChainNode]:
    return {uid: ChainNode(uid, controller) for uid, controller in nodes}


def test_a_pod_without_a_controller_is_foreign() -> None:
    found = attribute(None, {}, appwrapper_uid=AW_UID)
    assert (found.outcome, found.reason, found.chain) == (Outcome.FOREIGN, Reason.NO_OWNER, ())


def test_a_pod_that_is_itself_a_component_of_the_appwrapper_is_owned() -> None:
    found = attribute(AW, {}, appwrapper_uid=AW_UID)
    assert found.owned and found.appwrapper_uid == AW_UID and found.chain == (AW,)


def test_a_pod_of_a_wrapped_job_is_owned_from_what_the_watch_knows() -> None:
    job = link("Job", "victim-job", "uid-job")
    found = attribute(job, known(("uid-job", AW)), appwrapper_uid=AW_UID)
    assert found.owned and found.chain == (job, AW)


@pytest.mark.parametrize(
    "path",
    [
        # Deployment → ReplicaSet → pod
        [("ReplicaSet", "web-5d8"), ("Deployment", "web")],
        # JobSet → Job → pod
        [("Job", "js-workers-0"), ("JobSet", "js")],
        # RayJob → RayCluster → pod
        [("RayCluster", "rj-raycluster"), ("RayJob", "rj")],
        # LeaderWorkerSet → leader StatefulSet → leader pod → worker StatefulSet → worker pod
        [("StatefulSet", "lws-0"), ("Pod", "lws-0"), ("StatefulSet", "lws"), ("LeaderWorkerSet", "lws")],
    ],
    ids=["deployment", "jobset", "rayjob", "leaderworkerset"],
)
def test_longer_upstream_chains_lead_to_the_appwrapper(path: list[tuple[str, str]]) -> None:
    links = [link(kind, name, f"uid-{i}") for i, (kind, name) in enumerate(path)]
    chain = [*links, AW]
    nodes = known(*((links[i].uid, chain[i + 1]) for i in range(len(links))))
    found = attribute(links[0], nodes, appwrapper_uid=AW_UID)
    assert found.owned and found.chain == tuple(chain)


def test_an_owner_not_known_yet_is_asked_for_and_the_answer_resolves_the_chain() -> None:
    rs, deployment = link("ReplicaSet", "web-5d8", "uid-rs"), link("Deployment", "web", "uid-dep")
    # The component (Deployment) is known from its watch; the ReplicaSet is not.
    nodes = known(("uid-dep", AW))
    found = attribute(rs, nodes, appwrapper_uid=AW_UID)
    assert (found.outcome, found.need, found.chain) == (Outcome.PENDING, rs, (rs,))
    nodes["uid-rs"] = ChainNode("uid-rs", deployment)
    assert attribute(rs, nodes, appwrapper_uid=AW_UID).owned


def test_an_unknown_component_in_the_middle_of_a_chain_is_asked_for() -> None:
    rs, deployment = link("ReplicaSet", "web-5d8", "uid-rs"), link("Deployment", "web", "uid-dep")
    found = attribute(rs, known(("uid-rs", deployment)), appwrapper_uid=AW_UID)
    assert (found.outcome, found.need) == (Outcome.PENDING, deployment)


def test_a_chain_ending_at_an_object_without_a_controller_is_foreign() -> None:
    job = link("Job", "unrelated", "uid-unrelated")
    found = attribute(job, known(("uid-unrelated", None)), appwrapper_uid=AW_UID)
    assert (found.outcome, found.reason, found.chain) == (Outcome.FOREIGN, Reason.FOREIGN_OWNER, (job,))


def test_a_chain_ending_at_another_appwrapper_or_another_incarnation_is_foreign() -> None:
    job = link("Job", "other-job", "uid-job")
    other = link(KIND, "victim", "uid-of-an-earlier-victim")
    found = attribute(job, known(("uid-job", other)), appwrapper_uid=AW_UID)
    assert (found.outcome, found.reason) == (Outcome.FOREIGN, Reason.OTHER_APPWRAPPER)
    assert attribute(other, {}, appwrapper_uid=AW_UID).reason is Reason.OTHER_APPWRAPPER


def test_a_kind_named_appwrapper_in_another_group_is_not_an_appwrapper() -> None:
    fake = link(KIND, "victim", AW_UID, api_version="example.com/v1")
    assert not fake.is_appwrapper
    found = attribute(fake, {}, appwrapper_uid=AW_UID)
    assert (found.outcome, found.need) == (Outcome.PENDING, fake)
    assert attribute(fake, known((AW_UID, None)), appwrapper_uid=AW_UID).outcome is Outcome.FOREIGN


def test_while_the_labelled_appwrapper_is_not_known_a_chain_reaching_an_appwrapper_waits_for_it() -> None:
    job = link("Job", "victim-job", "uid-job")
    found = attribute(job, known(("uid-job", AW)), appwrapper_uid=None)
    assert (found.outcome, found.need) == (Outcome.PENDING, AW)
    # A chain that never reaches an AppWrapper needs no AppWrapper to be judged.
    assert attribute(None, {}, appwrapper_uid=None).reason is Reason.NO_OWNER


def test_an_owner_that_is_gone_orphans_the_pod() -> None:
    rs, deployment = link("ReplicaSet", "web-5d8", "uid-rs"), link("Deployment", "web", "uid-dep")
    nodes = {"uid-rs": ChainNode("uid-rs", deployment), "uid-dep": ChainNode("uid-dep", state=NodeState.GONE)}
    found = attribute(rs, nodes, appwrapper_uid=AW_UID)
    assert (found.outcome, found.reason, found.broken) == (Outcome.ORPHANED, Reason.OWNER_GONE, deployment)


def test_an_owner_that_may_not_be_read_is_foreign() -> None:
    job = link("Job", "j", "uid-job")
    nodes = {"uid-job": ChainNode("uid-job", state=NodeState.UNREADABLE)}
    found = attribute(job, nodes, appwrapper_uid=AW_UID)
    assert (found.outcome, found.reason) == (Outcome.FOREIGN, Reason.UNREADABLE)


def test_a_cycle_ends_as_too_deep() -> None:
    a, b = link("Job", "a", "uid-a"), link("Job", "b", "uid-b")
    found = attribute(a, known(("uid-a", b), ("uid-b", a)), appwrapper_uid=AW_UID)
    assert (found.outcome, found.reason, found.chain) == (Outcome.FOREIGN, Reason.TOO_DEEP, (a, b))


def test_a_chain_longer_than_the_limit_is_foreign_even_if_it_would_reach_the_appwrapper() -> None:
    links = [link("Job", f"j{i}", f"uid-{i}") for i in range(MAX_CHAIN_DEPTH)]
    chain = [*links, AW]
    nodes = known(*((links[i].uid, chain[i + 1]) for i in range(len(links))))
    found = attribute(links[0], nodes, appwrapper_uid=AW_UID)
    assert (found.outcome, found.reason) == (Outcome.FOREIGN, Reason.TOO_DEEP)
    assert len(found.chain) == MAX_CHAIN_DEPTH
    # One link shorter fits.
    assert attribute(links[1], nodes, appwrapper_uid=AW_UID).owned


def owner(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "uid-j", **fields}


@pytest.mark.parametrize(
    ("owners", "expected"),
    [
        ([owner(controller=True)], link("Job", "j", "uid-j")),
        # Only the controller counts, wherever it is in the list.
        ([owner(uid="uid-x", name="x"), owner(controller=True)], link("Job", "j", "uid-j")),
        ([owner()], None),
        ([owner(controller="true")], None),
        # A controller reference that cannot be followed is no controller.
        ([owner(controller=True, uid="")], None),
        ([owner(controller=True, name=None)], None),
        ("not a list", None),
        ([], None),
    ],
)
def test_the_controller_reference_is_read_defensively(owners: Any, expected: OwnerLink | None) -> None:
    assert controller_link({"metadata": {"ownerReferences": owners}}) == expected


def test_a_node_is_what_an_object_says_of_its_controller() -> None:
    obj = {"metadata": {"uid": "uid-rs", "ownerReferences": [owner(controller=True)]}}
    assert node_of(obj) == ChainNode("uid-rs", link("Job", "j", "uid-j"))
    assert node_of({"metadata": {"uid": "uid-top"}}) == ChainNode("uid-top", None)
    assert node_of({"metadata": {}}) is None
    assert node_of("not an object") is None
