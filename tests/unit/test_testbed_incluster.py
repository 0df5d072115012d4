"""The pure parts of `respawn local deploy`: build.sh's output, what the real node provides,
and when a Deployment or StatefulSet counts as rolled out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from respawn.testbed import incluster, realnode

REPO = Path(__file__).resolve().parents[2]

BUILD_OUTPUT = """\
docker.io/library/respawn-python:3.11  sha256:aaa  102 MB  cached  /c/images/respawn-python-3.11-x/image.tar
docker.io/library/respawn:0.1.0  sha256:bbb  217 MB  built  /c/images/respawn-0.1.0-y/image.tar
docker.io/library/respawn-nats:2.15.1  sha256:ccc  18 MB  cached  /c/images/respawn-nats-2.15.1-z/image.tar
registry.k8s.io/pause:3.10  sha256:ddd  1.4 MB  cached  /c/images/pause-3.10-w/image.tar
"""


def test_build_output_gives_each_image_by_its_short_name() -> None:
    images = realnode.parse_build_output(BUILD_OUTPUT)
    assert images["respawn"] == realnode.BuiltImage(
        "docker.io/library/respawn:0.1.0", "sha256:bbb", Path("/c/images/respawn-0.1.0-y/image.tar")
    )
    assert images["respawn-nats"].digest == "sha256:ccc"
    assert images["pause"].name == "registry.k8s.io/pause:3.10"


def test_build_output_ignores_lines_that_are_not_images() -> None:
    assert realnode.parse_build_output("building...\nall done\n\n") == {}


def test_the_real_node_provides_respawns_namespace_placement_and_a_volume_per_nats_server() -> None:
    layout = realnode.Layout(Path("/s"))
    docs = realnode.cluster_manifests(layout)
    (namespace,) = [d for d in docs if d["kind"] == "Namespace"]
    annotations = namespace["metadata"]["annotations"]  # type: ignore[index]
    assert annotations["scheduler.alpha.kubernetes.io/node-selector"] == "respawn.dev/real-node=true"
    assert json.loads(annotations["scheduler.alpha.kubernetes.io/defaultTolerations"]) == [
        {"key": "respawn.dev/real-node", "operator": "Exists", "effect": "NoSchedule"}
    ]
    volumes = [d for d in docs if d["kind"] == "PersistentVolume"]
    claims = [v["spec"]["claimRef"] for v in volumes]  # type: ignore[index]
    assert claims == [{"namespace": "respawn-system", "name": f"data-respawn-nats-{i}"} for i in range(3)]
    for i, volume in enumerate(volumes):
        spec: Any = volume["spec"]
        assert spec["local"] == {"path": f"/s/node/volumes/nats-{i}"}
        # No class: a claim without one binds to it on a cluster without a default StorageClass.
        assert spec["storageClassName"] == ""
        (term,) = spec["nodeAffinity"]["required"]["nodeSelectorTerms"]
        assert term["matchExpressions"][0]["values"] == [realnode.NODE_NAME]


def test_each_nats_claim_is_made_bound_to_its_volume_before_any_nats_pod_exists() -> None:
    docs = realnode.cluster_manifests(realnode.Layout(Path("/s")))
    volumes = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PersistentVolume"}  # type: ignore[index]
    claims = [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    assert [c["metadata"]["name"] for c in claims] == [f"data-respawn-nats-{i}" for i in range(3)]  # type: ignore[index]
    # Applied in order: the namespace before the claims in it.
    assert [d["kind"] for d in docs].index("Namespace") < [d["kind"] for d in docs].index(
        "PersistentVolumeClaim"
    )
    for claim in claims:
        meta: Any = claim["metadata"]
        spec: Any = claim["spec"]
        assert meta["namespace"] == "respawn-system"
        volume: Any = volumes[spec["volumeName"]]
        # Each side names the other, so the binding needs no search.
        assert volume["spec"]["claimRef"] == {"namespace": "respawn-system", "name": meta["name"]}
        assert spec["storageClassName"] == volume["spec"]["storageClassName"] == ""
        assert spec["accessModes"] == volume["spec"]["accessModes"]
        assert spec["resources"]["requests"]["storage"] == volume["spec"]["capacity"]["storage"]


def test_the_claims_made_in_advance_match_what_the_nats_statefulset_asks_for() -> None:
    statefulset = next(
        d
        for d in yaml.safe_load_all((REPO / "deploy" / "nats" / "statefulset.yaml").read_text())
        if d and d["kind"] == "StatefulSet"
    )
    (template,) = statefulset["spec"]["volumeClaimTemplates"]
    claims = [
        d
        for d in realnode.cluster_manifests(realnode.Layout(Path("/s")))
        if d["kind"] == "PersistentVolumeClaim"
    ]
    for claim in claims:
        meta: Any = claim["metadata"]
        spec: Any = claim["spec"]
        assert meta["name"].startswith(f"{template['metadata']['name']}-{statefulset['metadata']['name']}-")
        assert meta["labels"] == template["metadata"]["labels"]
        assert spec["accessModes"] == template["spec"]["accessModes"]
        assert spec["resources"] == template["spec"]["resources"]


def test_the_nats_servers_are_the_replicas_of_the_nats_statefulset_and_none_without_it() -> None:
    def statefulset(name: str, replicas: int | None) -> dict[str, Any]:
        spec = {} if replicas is None else {"replicas": replicas}
        return {"kind": "StatefulSet", "metadata": {"name": name}, "spec": spec}

    other = {"kind": "Deployment", "metadata": {"name": "respawn-nats"}, "spec": {"replicas": 5}}
    assert incluster.nats_servers([other, statefulset("respawn-nats", 3)]) == 3
    assert incluster.nats_servers([statefulset("respawn-nats", None)]) == 1  # the API's default
    assert incluster.nats_servers([other, statefulset("something-else", 2)]) == 0


def test_a_pod_the_scheduler_cannot_place_is_reported_with_the_schedulers_reason() -> None:
    pods = [
        {
            "metadata": {"name": "respawn-nats-0"},
            "status": {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/3 nodes are available: pod has unbound immediate "
                        "PersistentVolumeClaims.",
                    }
                ],
            },
        },
        {
            "metadata": {"name": "respawn-health-1"},
            "status": {
                "phase": "Running",
                "conditions": [
                    {"type": "PodScheduled", "status": "True"},
                    {"type": "Ready", "status": "False"},
                ],
                "containerStatuses": [
                    {
                        "name": "health",
                        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}},
                    }
                ],
            },
        },
    ]
    assert incluster.describe_pods(pods) == (
        "respawn-nats-0 Pending Ready=? not scheduled: Unschedulable 0/3 nodes are available: "
        "pod has unbound immediate PersistentVolumeClaims."
        " | respawn-health-1 Running Ready=False health waiting: CrashLoopBackOff back-off"
    )
    assert incluster.describe_pods([]) == "no pods"


def deployment(*, generation: int = 2, observed: int = 2, **status: int) -> dict[str, Any]:
    return {
        "kind": "Deployment",
        "metadata": {"generation": generation},
        "spec": {"replicas": 1},
        "status": {"observedGeneration": observed, **status},
    }


def test_a_deployment_is_rolled_out_when_every_replica_runs_the_current_spec_ready() -> None:
    assert incluster.rolled_out(deployment(updatedReplicas=1, replicas=1, readyReplicas=1))


@pytest.mark.parametrize(
    "obj",
    [
        None,
        # Its controller has not seen the latest spec yet.
        deployment(observed=1, updatedReplicas=1, replicas=1, readyReplicas=1),
        # The old pod still runs beside the new one.
        deployment(updatedReplicas=1, replicas=2, readyReplicas=1),
        # Running the new spec, not Ready yet.
        deployment(updatedReplicas=1, replicas=1, readyReplicas=0),
        # Ready, but the old spec.
        deployment(updatedReplicas=0, replicas=1, readyReplicas=1),
    ],
)
def test_a_deployment_is_not_rolled_out_before_that(obj: dict[str, Any] | None) -> None:
    assert not incluster.rolled_out(obj)


def statefulset(current: str, update: str, ready: int) -> dict[str, Any]:
    return {
        "kind": "StatefulSet",
        "metadata": {"generation": 1},
        "spec": {"replicas": 1},
        "status": {
            "observedGeneration": 1,
            "updatedReplicas": 1,
            "readyReplicas": ready,
            "currentRevision": current,
            "updateRevision": update,
        },
    }


def test_a_statefulset_is_rolled_out_once_its_current_revision_is_the_update_revision() -> None:
    assert incluster.rolled_out(statefulset("r2", "r2", 1))
    assert not incluster.rolled_out(statefulset("r1", "r2", 1))
    assert not incluster.rolled_out(statefulset("r2", "r2", 0))
