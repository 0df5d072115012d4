"""The manifest factory (respawn.testbed.manifests): what it builds is what Respawn accepts, with
the pods it was asked for, and nothing it was not asked for."""

from __future__ import annotations

from typing import Any

import pytest

from respawn import demo
from respawn.testbed import manifests, sim
from respawn.testbed.manifests import parse_appwrapper
from shared.appwrapper.podsets import component_pod_sets, expected_pod_count, validate_appwrapper_pod_sets


@pytest.mark.parametrize(
    ("workload", "pods"),
    [
        (manifests.pod("p"), 1),
        (manifests.job("j"), 1),
        (manifests.job("j", pods=3), 3),
        (manifests.deployment("d", replicas=2), 2),
        (manifests.deployment("s", replicas=4, kind="StatefulSet"), 4),
        (manifests.pytorchjob("t"), 2),
        (manifests.pytorchjob("t", replicas={"Master": 1, "Worker": 3}), 4),
    ],
)
def test_every_workload_wraps_into_a_valid_appwrapper_with_its_pods(
    workload: dict[str, Any], pods: int
) -> None:
    aw = manifests.appwrapper("aw", manifests.component(workload))
    assert validate_appwrapper_pod_sets(parse_appwrapper(aw).spec.components) == []
    assert expected_pod_count(aw) == pods


def test_job_appwrapper_runs_every_pod_at_once_without_retries_and_carries_what_it_was_given() -> None:
    aw = manifests.job_appwrapper(
        "train",
        pods=2,
        gpus=8,
        pod_annotations={sim.FAIL_AFTER: "1s"},
        annotations={"a": "b"},
        namespace="ns",
        init_container=True,
    )
    assert aw["metadata"] == {"name": "train", "namespace": "ns", "annotations": {"a": "b"}}
    assert aw["spec"]["suspend"] is False
    [component] = aw["spec"]["components"]
    job = component["template"]
    assert job["metadata"]["name"] == "train-job"
    assert (job["spec"]["parallelism"], job["spec"]["completions"], job["spec"]["backoffLimit"]) == (2, 2, 0)
    pod = job["spec"]["template"]
    assert pod["metadata"] == {"annotations": {sim.FAIL_AFTER: "1s"}}
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["containers"][0]["resources"] == {"limits": {manifests.GPU: "8"}}
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["setup"]
    assert expected_pod_count(aw) == 2


def test_what_is_not_given_is_not_written() -> None:
    aw = manifests.appwrapper("aw", manifests.component(manifests.job("j")))
    assert aw["metadata"] == {"name": "aw"}
    assert aw["spec"] == {"components": [{"template": manifests.job("j")}]}
    assert manifests.job("j")["spec"] == {"template": {"spec": manifests.pod_template()["spec"]}}
    assert "metadata" not in manifests.pod_template()
    # ...while what is given is written, even when empty.
    assert manifests.appwrapper("aw", labels={})["metadata"] == {"name": "aw", "labels": {}}


def test_a_deployment_selects_its_template_by_its_labels() -> None:
    template = manifests.pod_template(labels={"app": "web"}, restart_policy="Always")
    deployment = manifests.deployment("web", template=template)
    assert deployment["spec"]["selector"] == {"matchLabels": {"app": "web"}}
    assert manifests.deployment("bare")["spec"]["template"]["spec"]["restartPolicy"] == "Always"


def test_a_pytorchjob_names_its_container_pytorch_and_keeps_the_order_of_its_replica_types() -> None:
    job = manifests.pytorchjob("t", replicas={"Worker": None, "Master": 1})
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert list(specs) == ["Worker", "Master"]
    assert "replicas" not in specs["Worker"] and specs["Master"]["replicas"] == 1
    assert {c["name"] for s in specs.values() for c in s["template"]["spec"]["containers"]} == {"pytorch"}
    # Master first whatever the order in the object, as Kueue pairs pod sets by position.
    paths = [ps.path for ps in component_pod_sets(manifests.component(job))]
    assert paths == [f"template.spec.pytorchReplicaSpecs.{role}.template" for role in ("Master", "Worker")]


def test_the_demo_workloads_are_valid_appwrappers() -> None:
    for name, aw, _ in demo.WORKLOADS:
        assert aw["metadata"]["name"] == name
        assert validate_appwrapper_pod_sets(parse_appwrapper(aw).spec.components) == []
