from __future__ import annotations

import copy
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from shared.appwrapper.constants import ConditionStatus, ConditionType, Phase
from shared.appwrapper.model import (
    AppWrapper,
    AppWrapperComponent,
    AppWrapperError,
    AppWrapperSpec,
    Condition,
    ObjectMeta,
    dump_appwrapper,
    format_kube_time,
    parse_appwrapper,
)

MLBATCH_USAGE = Path("/work/shared/reference/mlbatch-usage.txt")

FULL: dict[str, Any] = {
    "apiVersion": "workload.codeflare.dev/v1beta2",
    "kind": "AppWrapper",
    "metadata": {
        "name": "train",
        "namespace": "team1",
        "uid": "0b6d",
        "resourceVersion": "42",
        "generation": 3,
        "creationTimestamp": "2024-05-01T10:00:00Z",
        "labels": {"kueue.x-k8s.io/queue-name": "default-queue"},
        "annotations": {"workload.codeflare.dev.appwrapper/retryLimit": "2"},
        "finalizers": ["workload.codeflare.dev/finalizer"],
        "managedFields": [{"manager": "kubectl"}],
    },
    "spec": {
        "suspend": True,
        "managedBy": "workload.codeflare.dev/appwrapper-controller",
        "components": [
            {
                "annotations": {"note": "x"},
                "podSets": [{"replicas": 2, "path": "template.spec.template", "annotations": {"a": "b"}}],
                "podSetInfos": [
                    {
                        "annotations": {"an": "v"},
                        "labels": {"l": "v"},
                        "nodeSelector": {"zone": "a"},
                        "tolerations": [
                            {
                                "key": "k",
                                "operator": "Equal",
                                "value": "v",
                                "effect": "NoExecute",
                                "tolerationSeconds": 5,
                            }
                        ],
                        "schedulingGates": [{"name": "gate"}],
                    }
                ],
                "template": {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {"name": "train"},
                    "spec": {
                        "parallelism": 2,
                        "template": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}},
                    },
                },
            }
        ],
    },
    "status": {
        "phase": "Running",
        "resettingCount": 1,
        "conditions": [
            {
                "type": "QuotaReserved",
                "status": "True",
                "reason": "Resuming",
                "message": "Suspend is false",
                "lastTransitionTime": "2024-05-01T10:00:05Z",
                "observedGeneration": 3,
            },
            {
                "type": "Unhealthy",
                "status": "True",
                "reason": "FoundFailedPods",
                "message": "",
                "lastTransitionTime": "2024-05-01T10:05:00Z",
            },
        ],
        "componentStatus": [
            {
                "name": "train",
                "kind": "Job",
                "apiVersion": "batch/v1",
                "podSets": [{"replicas": 2, "path": "template.spec.template"}],
                "conditions": [
                    {
                        "type": "ResourcesDeployed",
                        "status": "True",
                        "reason": "ComponentCreatedSuccessfully",
                        "message": "",
                        "lastTransitionTime": "2024-05-01T10:00:06Z",
                    }
                ],
            }
        ],
    },
}


def test_full_object_parses_with_upstream_json_names() -> None:
    aw = parse_appwrapper(FULL)
    assert (aw.name, aw.namespace) == ("train", "team1")
    assert aw.metadata.generation == 3
    assert aw.metadata.creation_timestamp == datetime(2024, 5, 1, 10, 0, tzinfo=UTC)
    assert aw.spec.suspend is True
    assert aw.spec.managed_by == "workload.codeflare.dev/appwrapper-controller"
    [component] = aw.spec.components
    assert component.template_kind == "Job"
    assert component.template_api_version == "batch/v1"
    assert component.pod_sets[0].replicas == 2
    assert component.pod_sets[0].annotations == {"a": "b"}
    info = component.pod_set_infos[0]
    assert info.node_selector == {"zone": "a"}
    assert info.tolerations[0].toleration_seconds == 5
    assert info.scheduling_gates[0].name == "gate"
    assert aw.status.phase is Phase.RUNNING
    assert aw.status.resetting_count == 1
    assert aw.status.component_status[0].pod_sets[0].count == 2
    deployed = aw.status.component_status[0].condition(ConditionType.RESOURCES_DEPLOYED)
    assert deployed is not None and deployed.reason == "ComponentCreatedSuccessfully"


def test_dump_reproduces_the_object_exactly() -> None:
    assert dump_appwrapper(parse_appwrapper(FULL)) == FULL


def test_unknown_fields_survive_at_every_level() -> None:
    body = copy.deepcopy(FULL)
    body["futureTopLevel"] = 1
    body["spec"]["futureSpecField"] = {"x": [1, 2]}
    body["spec"]["components"][0]["futureComponentField"] = "y"
    body["spec"]["components"][0]["podSets"][0]["futurePodSetField"] = True
    body["status"]["futureStatusField"] = "z"
    body["status"]["conditions"][0]["futureConditionField"] = 0
    assert dump_appwrapper(parse_appwrapper(body)) == body


def test_minimal_object_gets_upstream_defaults() -> None:
    aw = parse_appwrapper(
        {
            "apiVersion": "workload.codeflare.dev/v1beta2",
            "kind": "AppWrapper",
            "metadata": {"name": "m"},
            "spec": {"components": [{"template": {"apiVersion": "v1", "kind": "Pod"}}]},
        }
    )
    assert aw.spec.suspend is False
    assert aw.spec.managed_by is None
    assert aw.spec.components[0].pod_sets == []
    assert aw.status.phase is Phase.EMPTY
    assert aw.status.resetting_count == 0
    assert aw.status.conditions == []


def test_omitempty_fields_are_left_out_of_the_dump() -> None:
    body = {
        "apiVersion": "workload.codeflare.dev/v1beta2",
        "kind": "AppWrapper",
        "metadata": {"name": "m"},
        "spec": {"components": [{"template": {"apiVersion": "v1", "kind": "Pod"}}]},
    }
    assert dump_appwrapper(parse_appwrapper(body)) == body


def test_condition_lookup_and_truth() -> None:
    aw = parse_appwrapper(FULL)
    assert aw.status.is_true(ConditionType.QUOTA_RESERVED)
    assert aw.status.is_true(ConditionType.UNHEALTHY)
    assert not aw.status.is_true(ConditionType.PODS_READY)
    assert aw.status.condition(ConditionType.PODS_READY) is None
    unhealthy = aw.status.condition("Unhealthy")
    assert unhealthy is not None and unhealthy.status is ConditionStatus.TRUE


def test_condition_times_are_written_in_kubernetes_format() -> None:
    moment = datetime(2024, 5, 1, 12, 30, 15, 999_999, tzinfo=UTC)
    cond = Condition(
        type="PodsReady", status=ConditionStatus.TRUE, last_transition_time=moment, reason="R", message=""
    )
    assert cond.model_dump(mode="json", by_alias=True)["lastTransitionTime"] == "2024-05-01T12:30:15Z"
    assert format_kube_time(moment) == "2024-05-01T12:30:15Z"


def test_models_can_be_built_in_code_by_field_name() -> None:
    aw = AppWrapper(
        api_version="workload.codeflare.dev/v1beta2",
        kind="AppWrapper",
        metadata=ObjectMeta(name="code"),
        spec=AppWrapperSpec(components=[AppWrapperComponent(template={"apiVersion": "v1", "kind": "Pod"})]),
    )
    aw.status.phase = Phase.SUSPENDED
    assert dump_appwrapper(aw)["status"] == {"phase": "Suspended"}


# --- malformed input -------------------------------------------------------------------------


def malformed(mutate: Any) -> str:
    body = copy.deepcopy(FULL)
    mutate(body)
    with pytest.raises(AppWrapperError) as info:
        parse_appwrapper(body)
    return str(info.value)


def test_non_mapping_is_rejected() -> None:
    with pytest.raises(AppWrapperError, match="must be a JSON object, got list"):
        parse_appwrapper([])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda b: b.update(kind="Job"), "kind: expected 'AppWrapper', got 'Job'"),
        (
            lambda b: b.update(apiVersion="workload.codeflare.dev/v1beta1"),
            "apiVersion: expected 'workload.codeflare.dev/v1beta2', got 'workload.codeflare.dev/v1beta1'",
        ),
        (lambda b: b.pop("spec"), "spec: Field required"),
        (lambda b: b["spec"].update(components={}), "spec.components: Input should be a valid list"),
        (lambda b: b["spec"]["components"][0].pop("template"), "spec.components[0].template: Field required"),
        (
            lambda b: b["spec"]["components"][0]["template"].pop("kind"),
            "spec.components[0].template: the wrapped resource must have a non-empty string 'kind'",
        ),
        (
            lambda b: b["spec"]["components"][0]["template"].update(metadata="x"),
            "spec.components[0].template: the wrapped resource's 'metadata' must be an object",
        ),
        (
            lambda b: b["spec"]["components"][0]["podSets"][0].pop("path"),
            "spec.components[0].podSets[0].path: Field required",
        ),
        (
            lambda b: b["spec"]["components"][0]["podSets"][0].update(replicas="two"),
            "spec.components[0].podSets[0].replicas: Input should be a valid integer",
        ),
        (
            lambda b: b["spec"]["components"][0]["podSetInfos"][0]["schedulingGates"][0].pop("name"),
            "spec.components[0].podSetInfos[0].schedulingGates[0].name: Field required",
        ),
        (lambda b: b["status"].update(phase="Exploded"), "status.phase: Input should be"),
        (
            lambda b: b["status"]["conditions"][0].update(status="Maybe"),
            "status.conditions[0].status: Input should be 'True', 'False' or 'Unknown'",
        ),
        (
            lambda b: b["status"]["conditions"][1].update(lastTransitionTime="2024-05-01T10:05:00"),
            "status.conditions[1].lastTransitionTime: Input should have timezone info",
        ),
        (
            lambda b: b["status"]["componentStatus"][0].pop("podSets"),
            "status.componentStatus[0].podSets: Field required",
        ),
    ],
)
def test_malformed_field_is_named_by_its_json_path(mutate: Any, expected: str) -> None:
    message = malformed(mutate)
    assert message.startswith("AppWrapper team1/train is malformed: ")
    assert expected in message


def test_every_problem_is_reported_at_once() -> None:
    def mutate(body: dict[str, Any]) -> None:
        body["kind"] = "Job"
        body["spec"]["components"][0].pop("template")

    message = malformed(mutate)
    assert "kind: expected 'AppWrapper'" in message
    assert "spec.components[0].template: Field required" in message


# --- the MLBatch samples -------------------------------------------------------------------


def mlbatch_samples() -> list[dict[str, Any]]:
    """AppWrapper YAML blocks of the MLBatch usage guide (a block ends at a blank line)."""
    samples: list[dict[str, Any]] = []
    block: list[str] | None = None
    for line in [*MLBATCH_USAGE.read_text().splitlines(), ""]:
        if block is None:
            block = [line] if line.startswith("apiVersion:") else None
        elif line.strip():
            block.append(line)
        else:
            doc = yaml.safe_load("\n".join(block))
            block = None
            if isinstance(doc, dict) and doc.get("kind") == "AppWrapper":
                samples.append(doc)
    return samples


@pytest.mark.skipif(not MLBATCH_USAGE.exists(), reason="reference document not present")
def test_mlbatch_samples_parse_and_round_trip() -> None:
    samples = mlbatch_samples()
    assert len(samples) >= 3
    for sample in samples:
        assert dump_appwrapper(parse_appwrapper(sample)) == sample


# --- property: anything well-formed round-trips ----------------------------------------------

_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=12)
_string_maps = st.dictionaries(_names, _names, max_size=3)


@st.composite
def _pod_sets(draw: st.DrawFn) -> dict[str, Any]:
    pod_set: dict[str, Any] = {"path": "template." + ".".join(draw(st.lists(_names, min_size=1, max_size=4)))}
    replicas = draw(st.none() | st.integers(0, 1000))
    if replicas is not None:
        pod_set["replicas"] = replicas
    annotations = draw(_string_maps)
    if annotations:
        pod_set["annotations"] = annotations
    return pod_set


@given(
    pod_sets=st.lists(_pod_sets(), max_size=4),
    suspend=st.booleans(),
    count=st.integers(0, 50),
    labels=_string_maps,
)
def test_well_formed_objects_round_trip(
    pod_sets: list[dict[str, Any]], suspend: bool, count: int, labels: dict[str, str]
) -> None:
    component: dict[str, Any] = {
        "template": {"apiVersion": "example.com/v1", "kind": "Thing", "spec": {"n": 1}}
    }
    if pod_sets:
        component["podSets"] = pod_sets
    spec: dict[str, Any] = {"components": [component]}
    if suspend:
        spec["suspend"] = True
    metadata: dict[str, Any] = {"name": "p"}
    if labels:
        metadata["labels"] = labels
    body: dict[str, Any] = {
        "apiVersion": "workload.codeflare.dev/v1beta2",
        "kind": "AppWrapper",
        "metadata": metadata,
        "spec": spec,
    }
    if count:
        body["status"] = {"resettingCount": count}
    assert dump_appwrapper(parse_appwrapper(body)) == body
