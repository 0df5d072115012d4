"""The Python view of an AppWrapper: the strict check of manifests and components, and the
defensive reader the services use (which never raises)."""

from __future__ import annotations

import copy
import dataclasses
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from respawn.testbed.manifests import parse_appwrapper
from shared.appwrapper.constants import CONTROLLER_NAME, ConditionType
from shared.appwrapper.model import (
    AppWrapperError,
    AppWrapperFields,
    as_mapping,
    int_at,
    list_at,
    mapping_at,
    read_appwrapper,
    str_at,
)

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


# --- the strict check of a manifest ----------------------------------------------------------


def test_full_object_parses_with_upstream_json_names() -> None:
    aw = parse_appwrapper(FULL)
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


# --- the defensive reader --------------------------------------------------------------------


def test_reader_reads_every_field_by_its_json_name() -> None:
    fields = read_appwrapper(FULL)
    assert (fields.namespace, fields.name, fields.uid) == ("team1", "train", "0b6d")
    assert fields.annotations == {"workload.codeflare.dev.appwrapper/retryLimit": "2"}
    assert fields.deleting is False
    assert fields.suspend is True
    assert fields.managed_by == CONTROLLER_NAME
    assert fields.phase == "Running"
    assert fields.resetting_count == 1
    assert [c["type"] for c in fields.conditions] == ["QuotaReserved", "Unhealthy"]
    assert [e["name"] for e in fields.component_status] == ["train"]


def test_condition_lookup_and_truth() -> None:
    fields = read_appwrapper(FULL)
    assert fields.is_true(ConditionType.QUOTA_RESERVED)
    assert fields.is_true(ConditionType.UNHEALTHY)
    assert not fields.is_true(ConditionType.PODS_READY)
    assert fields.condition(ConditionType.PODS_READY) == {}
    assert fields.condition("Unhealthy")["reason"] == "FoundFailedPods"


def test_a_fresh_object_reads_as_empty_status() -> None:
    fields = read_appwrapper({"metadata": {"name": "m", "deletionTimestamp": "2024-05-01T10:00:00Z"}})
    assert fields == AppWrapperFields(name="m", deleting=True)


EMPTY_STATUS = {"phase": "", "resetting_count": 0, "conditions": (), "component_status": ()}


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda b: b.update(metadata="x"), {"namespace": "", "name": "", "uid": "", "annotations": {}}),
        (lambda b: b["metadata"].update(annotations=["a"]), {"annotations": {}}),
        # Values are passed on as found, for the annotation parsers to report.
        (lambda b: b["metadata"].update(annotations={1: 2}), {"annotations": {"1": 2}}),
        (lambda b: b["spec"].update(suspend="yes"), {"suspend": False}),
        (lambda b: b["spec"].update(managedBy=7), {"managed_by": None}),
        (lambda b: b.update(status=[]), EMPTY_STATUS),
        (lambda b: b["status"].update(resettingCount="1"), {"resetting_count": 0}),
        (lambda b: b["status"].update(resettingCount=True), {"resetting_count": 0}),
        (lambda b: b["status"].update(conditions={"type": "Unhealthy"}), {"conditions": ()}),
        (lambda b: b["status"]["conditions"].insert(0, "Unhealthy"), {}),
        (lambda b: b["status"].update(componentStatus=None), {"component_status": ()}),
    ],
)
def test_a_mistyped_field_reads_as_empty_and_the_others_still_read(
    mutate: Any, expected: dict[str, Any]
) -> None:
    body = copy.deepcopy(FULL)
    mutate(body)
    assert read_appwrapper(body) == dataclasses.replace(read_appwrapper(FULL), **expected)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=10,
)
# Bodies whose keys are mostly the ones the reader looks for, holding anything at all.
_READ = ("metadata", "spec", "status", "name", "uid", "annotations", "deletionTimestamp", "suspend")
_keys = st.sampled_from(
    [*_READ, "managedBy", "phase", "resettingCount", "conditions", "componentStatus", "type"]
)
_bodies = st.recursive(_json, lambda children: st.dictionaries(_keys, children, max_size=4), max_leaves=20)


@given(body=_bodies)
def test_the_reader_never_raises(body: Any) -> None:
    fields = read_appwrapper(body)
    fields.is_true(ConditionType.UNHEALTHY)
    assert isinstance(fields.resetting_count, int) and isinstance(fields.phase, str)


def test_field_accessors_read_only_what_has_the_type_asked_for() -> None:
    obj = {"a": {"b": {"n": 3, "t": True, "s": "x", "l": [1]}}}
    assert mapping_at(obj, "a", "b", "n") == {}
    assert mapping_at(obj, "a")["b"]["s"] == "x"
    assert mapping_at([1]) == {}
    assert int_at(obj, "a", "b", "n") == 3
    assert int_at(obj, "a", "b", "t") is None
    assert int_at(obj, "a", "missing", "n") is None
    assert str_at(obj, "a", "b", "s") == "x"
    assert str_at(obj, "a", "b", "n") == ""
    assert list_at(obj, "a", "b", "l") == [1]
    assert list_at(obj, "a", "b", "s") == []


def test_field_accessors_read_through_any_mapping_and_stop_at_anything_else() -> None:
    # A mapping that is not a dict (a read-only view) is read like one.
    obj = MappingProxyType({"a": MappingProxyType({"s": "x", "n": 2, "l": [3]})})
    assert str_at(obj, "a", "s") == "x"
    assert int_at(obj, "a", "n") == 2
    assert list_at(obj, "a", "l") == [3]
    assert mapping_at(obj, "a")["s"] == "x"
    assert as_mapping(obj) is obj and as_mapping(obj["a"]) is obj["a"]
    # A string, a list or None on the way ends the path: nothing is read from it.
    for odd in ("text", ["s"], None, 7):
        assert str_at({"a": odd}, "a", "s") == ""
        assert int_at({"a": odd}, "a", "n") is None
        assert list_at({"a": odd}, "a", "l") == []
        assert mapping_at({"a": odd}, "a", "b") == {}
        assert as_mapping(odd) == {}
    # Without keys: the object itself, if it has the type asked for.
    assert str_at("x") == "x" and int_at(4) == 4 and list_at([1]) == [1] and mapping_at({"k": 1}) == {"k": 1}
