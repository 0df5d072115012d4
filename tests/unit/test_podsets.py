from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from respawn.testbed import manifests
from respawn.testbed.manifests import parse_appwrapper
from shared.appwrapper.constants import (
    JOB_COMPLETION_INDEX_ANNOTATION,
    JOBSET_JOB_INDEX_LABEL,
    TAS_POD_INDEX_LABEL_ANNOTATION,
    TAS_SUB_GROUP_COUNT_ANNOTATION,
    TAS_SUB_GROUP_INDEX_LABEL_ANNOTATION,
)
from shared.appwrapper.model import AppWrapperComponent, AppWrapperError, PodSet
from shared.appwrapper.podsets import (
    PodSetPathError,
    can_infer,
    component_pod_sets,
    expected_pod_count,
    get_at_path,
    infer_pod_sets,
    is_pod_template,
    parse_path,
    set_at_path,
    total_pod_set_count,
    validate_appwrapper_pod_sets,
    validate_pod_sets,
)
from tests import mlbatch


def pod_template(image: str = "busybox") -> dict[str, Any]:
    return manifests.pod_template(labels={"app": "x"}, container="c", image=image, restart_policy=None)


def pod() -> dict[str, Any]:
    return manifests.pod("p", labels={"app": "x"}, container="c", restart_policy=None)


def job(**spec: Any) -> dict[str, Any]:
    return manifests.job("j", template=pod_template(), **spec)


def workload(kind: str, replicas: int | None = None) -> dict[str, Any]:
    return manifests.deployment("w", replicas=replicas, template=pod_template(), kind=kind)


def pytorchjob(*roles: tuple[str, int | None]) -> dict[str, Any]:
    return manifests.pytorchjob(
        "t", replicas=dict(roles), template=pod_template(), restart_policy="OnFailure"
    )


def jobset(*replicated: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "js"},
        "spec": {"replicatedJobs": list(replicated)},
    }


def replicated_job(name: str, replicas: int | None = None, **job_spec: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "template": {"spec": {**job_spec, "template": pod_template()}}}
    if replicas is not None:
        entry["replicas"] = replicas
    return entry


def ray_cluster_spec(*worker_replicas: int | None) -> dict[str, Any]:
    workers = []
    for replicas in worker_replicas:
        group: dict[str, Any] = {"groupName": "g", "template": pod_template()}
        if replicas is not None:
            group["replicas"] = replicas
        workers.append(group)
    return {"headGroupSpec": {"template": pod_template()}, "workerGroupSpecs": workers}


# --- paths -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "steps"),
    [
        ("template", []),
        ("template.spec.template", ["spec", "template"]),
        (
            "template.spec.replicatedJobs[0].template.spec.template",
            ["spec", "replicatedJobs", 0, "template", "spec", "template"],
        ),
        (
            "template.spec.pytorchReplicaSpecs.Worker.template",
            ["spec", "pytorchReplicaSpecs", "Worker", "template"],
        ),
        ("template.a[1][2].b", ["a", 1, 2, "b"]),
    ],
)
def test_parse_path(path: str, steps: list[str | int]) -> None:
    assert parse_path(path) == steps


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("spec.template", "first element of the path must be 'template'"),
        ("", "first element of the path must be 'template'"),
        ("templates.spec", "first element of the path must be 'template'"),
        ("template..spec", "at path position '1' invalid path element ''"),
        ("template.spec[", "at path position '1' invalid path element 'spec['"),
        ("template.items[x]", "at path position '1' invalid index expression 'x'"),
        ("template.items[-1]", "at path position '1' invalid index expression '-1'"),
    ],
)
def test_malformed_paths_are_rejected(path: str, message: str) -> None:
    with pytest.raises(PodSetPathError) as info:
        parse_path(path)
    assert str(info.value) == message


def test_get_at_path_follows_fields_and_indices() -> None:
    js = jobset(replicated_job("a"), replicated_job("b"))
    assert get_at_path(js, "template") is js
    assert get_at_path(js, "template.spec.replicatedJobs[1].template.spec.template") == pod_template()
    assert get_at_path(js, "template.spec.replicatedJobs[1].name") == "b"


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("template.spec.nothing", "at path position '2' missing field 'nothing'"),
        ("template.spec.replicatedJobs[2]", "at path position '2' out of bounds index '2'"),
        ("template.spec[0]", "at path position '1' found non-array value"),
        ("template.spec.replicatedJobs.name", "at path position '3' found non-map value"),
        ("template.kind.x", "at path position '2' found non-map value"),
    ],
)
def test_get_at_path_reports_where_resolution_fails(path: str, message: str) -> None:
    with pytest.raises(PodSetPathError) as info:
        get_at_path(jobset(replicated_job("a"), replicated_job("b")), path)
    assert str(info.value) == message


def test_set_at_path_returns_a_modified_copy() -> None:
    original = jobset(replicated_job("a"), replicated_job("b"))
    snapshot = copy.deepcopy(original)
    replacement = pod_template(image="other")
    updated = set_at_path(original, "template.spec.replicatedJobs[1].template.spec.template", replacement)
    assert original == snapshot
    assert get_at_path(updated, "template.spec.replicatedJobs[1].template.spec.template") == replacement
    assert get_at_path(updated, "template.spec.replicatedJobs[0]") == snapshot["spec"]["replicatedJobs"][0]
    # The new value is copied too: later changes to it do not leak into the result.
    replacement["spec"]["containers"][0]["image"] = "changed"
    assert (
        get_at_path(
            updated, "template.spec.replicatedJobs[1].template.spec.template.spec.containers[0].image"
        )
        == "other"
    )


def test_set_at_path_can_replace_a_list_element_and_the_whole_template() -> None:
    js = jobset(replicated_job("a"))
    assert set_at_path(js, "template.spec.replicatedJobs[0]", {"name": "z"})["spec"]["replicatedJobs"] == [
        {"name": "z"}
    ]
    assert set_at_path(js, "template", pod()) == pod()
    with pytest.raises(PodSetPathError, match="only be replaced by an object"):
        set_at_path(js, "template", [])


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("template.spec.missing.template", "at path position '2' missing field 'missing'"),
        ("template.spec.replicatedJobs[3]", "at path position '2' out of bounds index '3'"),
        ("template.spec.replicatedJobs.x", "at path position '3' found non-map value"),
        ("template.spec.replicatedJobs[0].name[0]", "at path position '3' found non-array value"),
    ],
)
def test_set_at_path_never_creates_missing_parents(path: str, message: str) -> None:
    with pytest.raises(PodSetPathError) as info:
        set_at_path(jobset(replicated_job("a")), path, {})
    assert str(info.value) == message


@given(st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=5), st.integers())
def test_set_then_get_returns_the_value(keys: list[str], value: int) -> None:
    obj: dict[str, Any] = {}
    cursor = obj
    for key in keys[:-1]:
        cursor = cursor.setdefault(key, {})
    cursor[keys[-1]] = None
    path = "template." + ".".join(keys)
    assert get_at_path(set_at_path(obj, path, value), path) == value


def test_is_pod_template() -> None:
    assert is_pod_template(pod_template())
    assert not is_pod_template({"spec": {"containers": []}})
    assert not is_pod_template({"spec": {}})
    assert not is_pod_template({"metadata": {}})
    assert not is_pod_template("template")


# --- inference -------------------------------------------------------------------------------


def test_pod() -> None:
    assert infer_pod_sets(pod()) == [PodSet(replicas=1, path="template")]


@pytest.mark.parametrize(
    ("spec", "replicas"),
    [
        ({}, 1),
        ({"parallelism": 4}, 4),
        ({"parallelism": 4, "completions": 2}, 2),
        ({"parallelism": 3, "completions": 5}, 3),
        ({"completions": 3}, 1),
        ({"parallelism": 0}, 0),
    ],
)
def test_job_runs_min_of_parallelism_and_completions(spec: dict[str, Any], replicas: int) -> None:
    assert infer_pod_sets(job(**spec)) == [
        PodSet(
            replicas=replicas,
            path="template.spec.template",
            annotations={TAS_POD_INDEX_LABEL_ANNOTATION: JOB_COMPLETION_INDEX_ANNOTATION},
        )
    ]


@pytest.mark.parametrize("kind", ["Deployment", "StatefulSet", "ReplicaSet"])
@pytest.mark.parametrize(("replicas", "expected"), [(None, 1), (3, 3), (0, 0)])
def test_apps_workloads(kind: str, replicas: int | None, expected: int) -> None:
    assert infer_pod_sets(workload(kind, replicas)) == [
        PodSet(replicas=expected, path="template.spec.template")
    ]


def test_pytorchjob_master_then_worker() -> None:
    # Worker listed first in the object: Master still comes first, as Kueue pairs by position.
    inferred = infer_pod_sets(pytorchjob(("Worker", 4), ("Master", None)))
    assert inferred == [
        PodSet(replicas=1, path="template.spec.pytorchReplicaSpecs.Master.template"),
        PodSet(replicas=4, path="template.spec.pytorchReplicaSpecs.Worker.template"),
    ]


def test_pytorchjob_with_only_workers() -> None:
    assert infer_pod_sets(pytorchjob(("Worker", 2))) == [
        PodSet(replicas=2, path="template.spec.pytorchReplicaSpecs.Worker.template")
    ]


def test_jobset_multiplies_job_replicas_by_pods_per_job() -> None:
    inferred = infer_pod_sets(
        jobset(
            replicated_job("driver"),
            replicated_job("workers", replicas=3, parallelism=4, completions=4),
        )
    )
    assert [(p.path, p.replicas) for p in inferred] == [
        ("template.spec.replicatedJobs[0].template.spec.template", 1),
        ("template.spec.replicatedJobs[1].template.spec.template", 12),
    ]
    assert inferred[1].annotations == {
        TAS_POD_INDEX_LABEL_ANNOTATION: JOB_COMPLETION_INDEX_ANNOTATION,
        TAS_SUB_GROUP_INDEX_LABEL_ANNOTATION: JOBSET_JOB_INDEX_LABEL,
        TAS_SUB_GROUP_COUNT_ANNOTATION: "3",
    }


def test_raycluster_head_and_worker_groups() -> None:
    cluster = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": "r"},
        "spec": ray_cluster_spec(2, None),
    }
    assert infer_pod_sets(cluster) == [
        PodSet(replicas=1, path="template.spec.headGroupSpec.template"),
        PodSet(replicas=2, path="template.spec.workerGroupSpecs[0].template"),
        PodSet(replicas=1, path="template.spec.workerGroupSpecs[1].template"),
    ]


def test_rayjob_uses_its_cluster_spec() -> None:
    rayjob = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "r"},
        "spec": {"entrypoint": "python x.py", "rayClusterSpec": ray_cluster_spec(5)},
    }
    assert infer_pod_sets(rayjob) == [
        PodSet(replicas=1, path="template.spec.rayClusterSpec.headGroupSpec.template"),
        PodSet(replicas=5, path="template.spec.rayClusterSpec.workerGroupSpecs[0].template"),
    ]


@pytest.mark.parametrize(
    "template",
    [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}},
        {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "spec": {"minMember": 2}},
        # Known kind, unknown version: its layout is not known, so nothing is guessed.
        {"apiVersion": "apps/v1beta1", "kind": "Deployment", "spec": {"template": pod_template()}},
        {"apiVersion": "kubeflow.org/v2", "kind": "PyTorchJob", "spec": {}},
    ],
)
def test_unknown_kinds_infer_nothing(template: dict[str, Any]) -> None:
    assert infer_pod_sets(template) == []
    assert not can_infer(template)


@pytest.mark.parametrize(
    "template",
    [
        pod(),
        job(parallelism=2),
        workload("Deployment", 2),
        workload("StatefulSet"),
        workload("ReplicaSet", 1),
        pytorchjob(("Master", 1), ("Worker", 3)),
        jobset(replicated_job("a"), replicated_job("b", replicas=2)),
        {"apiVersion": "ray.io/v1", "kind": "RayCluster", "spec": ray_cluster_spec(1, 2)},
        {"apiVersion": "ray.io/v1", "kind": "RayJob", "spec": {"rayClusterSpec": ray_cluster_spec(1)}},
    ],
)
def test_every_inferred_path_leads_to_a_pod_template(template: dict[str, Any]) -> None:
    inferred = infer_pod_sets(template)
    assert inferred
    for pod_set in inferred:
        assert is_pod_template(get_at_path(template, pod_set.path))
    component = {"template": template, "podSets": [p.model_dump(exclude_defaults=True) for p in inferred]}
    # Declaring exactly what inference finds is always valid.
    assert validate_pod_sets(component) == []


# --- components and counts -------------------------------------------------------------------


def test_declared_pod_sets_win_over_inference() -> None:
    declared = [{"path": "template.spec.template", "replicas": 7}]
    assert component_pod_sets({"template": job(), "podSets": declared}) == [
        PodSet(replicas=7, path="template.spec.template")
    ]


def test_empty_declaration_means_infer() -> None:
    assert component_pod_sets(AppWrapperComponent(template=job(parallelism=2), pod_sets=[]))[0].replicas == 2


def test_expected_pod_count_sums_replicas_over_components() -> None:
    body = {
        "apiVersion": "workload.codeflare.dev/v1beta2",
        "kind": "AppWrapper",
        "metadata": {"name": "x"},
        "spec": {
            "components": [
                {"template": job(parallelism=3)},
                {"template": pytorchjob(("Master", None), ("Worker", 4))},
                {"template": {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}},
                {
                    "template": {"apiVersion": "example.com/v1", "kind": "Thing"},
                    "podSets": [{"path": "template.a"}],
                },
            ]
        },
    }
    assert expected_pod_count(body) == 3 + 1 + 4 + 0 + 1


def test_expected_pod_count_prefers_the_recorded_component_status() -> None:
    body = {
        "spec": {"components": [{"template": job(parallelism=3)}]},
        "status": {
            "componentStatus": [
                {
                    "name": "j",
                    "kind": "Job",
                    "apiVersion": "batch/v1",
                    "podSets": [{"path": "p", "replicas": 5}, {"path": "q"}],
                }
            ]
        },
    }
    assert expected_pod_count(body) == 6


def test_expected_pod_count_of_nothing_is_zero() -> None:
    assert expected_pod_count({"spec": {"components": []}}) == 0
    assert expected_pod_count({}) == 0


def test_total_counts_the_larger_of_declared_and_inferred() -> None:
    partial = AppWrapperComponent(
        template=pytorchjob(("Master", 1), ("Worker", 1)),
        pod_sets=[PodSet(path="template.spec.pytorchReplicaSpecs.Master.template")],
    )
    assert total_pod_set_count([partial]) == 2


# --- validation ------------------------------------------------------------------------------


def test_valid_declaration_for_an_unknown_kind() -> None:
    component = {
        "template": {"apiVersion": "example.com/v1", "kind": "Trainer", "spec": {"launcher": pod_template()}},
        "podSets": [{"path": "template.spec.launcher", "replicas": 2}],
    }
    assert validate_pod_sets(component) == []


@pytest.mark.parametrize(
    ("pod_sets", "error"),
    [
        ([{"path": ""}], "podSets[0].path: podspec must specify path"),
        (
            [{"path": "template.spec.template"}, {"path": "template.spec.template"}],
            "podSets[1].path: multiple DeclaredPodSets with path 'template.spec.template'",
        ),
        (
            [{"path": "template.spec.nothing"}],
            "podSets[0].path: path does not refer to a v1.PodSpecTemplate: "
            "at path position '2' missing field 'nothing'",
        ),
        (
            [{"path": "spec.template"}],
            "podSets[0].path: path does not refer to a v1.PodSpecTemplate: "
            "first element of the path must be 'template'",
        ),
        (
            [{"path": "template.spec"}],
            "podSets[0].path: path does not refer to a v1.PodSpecTemplate: "
            "'template.spec' has no spec.containers",
        ),
        (
            [{"path": "template.spec.template", "replicas": -1}],
            "podSets[0].replicas: must not be negative, got -1",
        ),
    ],
)
def test_declared_pod_set_errors(pod_sets: list[dict[str, Any]], error: str) -> None:
    template = {"apiVersion": "example.com/v1", "kind": "Thing", "spec": {"template": pod_template()}}
    assert error in validate_pod_sets({"template": template, "podSets": pod_sets})


def test_declaration_must_match_inferred_count() -> None:
    component = {
        "template": pytorchjob(("Master", 1), ("Worker", 2)),
        "podSets": [{"path": "template.spec.pytorchReplicaSpecs.Master.template"}],
    }
    assert validate_pod_sets(component) == ["podSets: DeclaredPodSet count 1 differs from inferred count 2"]


def test_declaration_must_match_inferred_paths() -> None:
    template = {
        **workload("Deployment", 1),
        "spec": {"replicas": 1, "template": pod_template(), "other": pod_template()},
    }
    component = {"template": template, "podSets": [{"path": "template.spec.other"}]}
    assert validate_pod_sets(component) == ["podSets: PodSet with path 'template.spec.template' is missing"]


def test_declaration_must_match_inferred_replicas() -> None:
    component = {
        "template": job(parallelism=3),
        "podSets": [{"path": "template.spec.template", "replicas": 2}],
    }
    assert validate_pod_sets(component) == [
        "podSets: replica count 2 differs from inferred count 3 "
        "for PodSet at path position 'template.spec.template'"
    ]


def test_missing_replicas_means_one_when_matching_inference() -> None:
    assert validate_pod_sets({"template": job(), "podSets": [{"path": "template.spec.template"}]}) == []


def test_inference_only_component_is_valid() -> None:
    assert validate_pod_sets({"template": workload("StatefulSet", 3)}) == []


def test_whole_appwrapper_needs_one_to_eight_pod_sets() -> None:
    service = AppWrapperComponent(template={"apiVersion": "v1", "kind": "Service"})
    assert validate_appwrapper_pod_sets([service]) == ["spec.components: components contains no podspecs"]
    nine = [AppWrapperComponent(template=pod()) for _ in range(9)]
    assert validate_appwrapper_pod_sets(nine) == [
        "spec.components: components contains 9 podspecs; at most 8 are allowed"
    ]
    assert validate_appwrapper_pod_sets(nine[:8]) == []


def test_whole_appwrapper_errors_name_the_component() -> None:
    bad = AppWrapperComponent(
        template=job(parallelism=2), pod_sets=[PodSet(path="template.spec.template", replicas=1)]
    )
    assert validate_appwrapper_pod_sets([AppWrapperComponent(template=pod()), bad]) == [
        "spec.components[1].podSets: replica count 1 differs from inferred count 2 "
        "for PodSet at path position 'template.spec.template'"
    ]


def test_mlbatch_samples_are_valid_and_count_their_pods() -> None:
    samples = [mlbatch.load(name) for name in mlbatch.APPWRAPPERS]
    assert len(samples) >= 3
    for sample in samples:
        assert validate_appwrapper_pod_sets(parse_appwrapper(sample).spec.components) == []
    # The Job with parallelism 2 next to a PodGroup (which makes no pods itself).
    assert sorted(expected_pod_count(sample) for sample in samples) == [1, 1, 2]


def test_malformed_component_mapping_is_an_appwrapper_error() -> None:
    with pytest.raises(AppWrapperError, match=r"malformed component: template: Field required"):
        component_pod_sets({"podSets": []})
    with pytest.raises(AppWrapperError, match=r"malformed pod set in status\.componentStatus"):
        expected_pod_count({"status": {"componentStatus": [{"podSets": [{"replicas": 1}]}]}})
