"""Rendering components: labels, owner references, podSetInfos injection, conflicts and hooks."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.lifecycle.templating import (
    MAX_TEMPLATE_DEPTH,
    PodTemplateContext,
    TemplateError,
    copy_tree,
    owner_reference,
    render_component,
)
from shared.appwrapper.constants import APPWRAPPER_LABEL

POD_SPEC = {"containers": [{"name": "main", "image": "busybox"}]}


def job(**template_meta: Any) -> dict[str, Any]:
    pod: dict[str, Any] = {"spec": copy.deepcopy(POD_SPEC)}
    if template_meta:
        pod["metadata"] = template_meta
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train"},
        "spec": {"template": pod},
    }


def pytorchjob() -> dict[str, Any]:
    role = {"replicas": 1, "template": {"spec": copy.deepcopy(POD_SPEC)}}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "pt"},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": copy.deepcopy(role),
                "Worker": {**copy.deepcopy(role), "replicas": 3},
            }
        },
    }


def aw(*components: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "workload.codeflare.dev/v1beta2",
        "kind": "AppWrapper",
        "metadata": {"name": "aw", "namespace": "team", "uid": "u-1"},
        "spec": {"components": list(components)},
    }


def test_the_object_gets_namespace_label_and_a_controller_owner_reference() -> None:
    body = render_component(aw({"template": job()}), 0)
    assert body["metadata"]["namespace"] == "team"
    assert body["metadata"]["labels"] == {APPWRAPPER_LABEL: "aw"}
    assert body["metadata"]["ownerReferences"] == [owner_reference(aw())]
    assert owner_reference(aw()) == {
        "apiVersion": "workload.codeflare.dev/v1beta2",
        "kind": "AppWrapper",
        "name": "aw",
        "uid": "u-1",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    assert body["spec"]["template"]["metadata"]["labels"] == {APPWRAPPER_LABEL: "aw"}


def test_existing_labels_and_owner_references_are_kept() -> None:
    template = job(labels={"app": "x"})
    template["metadata"]["labels"] = {"team": "a"}
    template["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "c", "uid": "c1"}
    ]
    body = render_component(aw({"template": template}), 0)
    assert body["metadata"]["labels"] == {"team": "a", APPWRAPPER_LABEL: "aw"}
    assert [o["kind"] for o in body["metadata"]["ownerReferences"]] == ["ConfigMap", "AppWrapper"]
    assert body["spec"]["template"]["metadata"]["labels"] == {"app": "x", APPWRAPPER_LABEL: "aw"}


def test_pod_set_infos_are_merged_into_each_pod_template_by_position() -> None:
    infos = [
        {"labels": {"role": "master"}, "nodeSelector": {"pool": "a"}},
        {
            "labels": {"role": "worker"},
            "annotations": {"kueue.x-k8s.io/workload": "w"},
            "tolerations": [{"key": "gpu", "operator": "Exists"}],
            "schedulingGates": [{"name": "g1"}, {"name": "g1"}],
        },
    ]
    body = render_component(aw({"template": pytorchjob(), "podSetInfos": infos}), 0)
    master = body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    worker = body["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    assert master["metadata"]["labels"] == {"role": "master", APPWRAPPER_LABEL: "aw"}
    assert master["spec"]["nodeSelector"] == {"pool": "a"}
    assert "tolerations" not in master["spec"]
    assert worker["metadata"]["labels"] == {"role": "worker", APPWRAPPER_LABEL: "aw"}
    assert worker["metadata"]["annotations"] == {"kueue.x-k8s.io/workload": "w"}
    assert worker["spec"]["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert worker["spec"]["schedulingGates"] == [{"name": "g1"}], "gates are de-duplicated by name"


def test_existing_tolerations_and_gates_are_kept_and_not_duplicated() -> None:
    template = job()
    template["spec"]["template"]["spec"]["tolerations"] = [{"key": "a", "operator": "Exists"}]
    template["spec"]["template"]["spec"]["schedulingGates"] = [{"name": "mine"}]
    info = {
        "tolerations": [{"key": "a", "operator": "Exists"}, {"key": "b", "operator": "Exists"}],
        "schedulingGates": [{"name": "mine"}, {"name": "kueue"}],
    }
    body = render_component(aw({"template": template, "podSetInfos": [info]}), 0)
    spec = body["spec"]["template"]["spec"]
    assert spec["tolerations"] == [{"key": "a", "operator": "Exists"}, {"key": "b", "operator": "Exists"}]
    assert spec["schedulingGates"] == [{"name": "mine"}, {"name": "kueue"}]


def test_the_same_value_twice_is_not_a_conflict() -> None:
    template = job(labels={"team": "a"}, annotations={"x": "1"})
    template["spec"]["template"]["spec"]["nodeSelector"] = {"pool": "a"}
    info = {"labels": {"team": "a"}, "annotations": {"x": "1"}, "nodeSelector": {"pool": "a"}}
    body = render_component(aw({"template": template, "podSetInfos": [info]}), 0)
    assert body["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "a"}


@pytest.mark.parametrize(
    ("field", "template_meta", "info", "what"),
    [
        ("labels", {"labels": {"team": "a"}}, {"labels": {"team": "b"}}, "label 'team'"),
        ("annotations", {"annotations": {"note": "a"}}, {"annotations": {"note": "b"}}, "annotation 'note'"),
        ("nodeSelector", {}, {"nodeSelector": {"pool": "b"}}, "nodeSelector 'pool'"),
        ("appwrapper label", {"labels": {APPWRAPPER_LABEL: "other"}}, {}, f"label '{APPWRAPPER_LABEL}'"),
    ],
)
def test_conflicting_values_are_terminal_errors_naming_component_path_and_key(
    field: str, template_meta: dict[str, Any], info: dict[str, Any], what: str
) -> None:
    template = job(**template_meta)
    template["spec"]["template"]["spec"]["nodeSelector"] = {"pool": "a"}
    with pytest.raises(TemplateError) as raised:
        render_component(aw({"template": template, "podSetInfos": [info]}), 0)
    message = str(raised.value)
    assert "component 0 (batch/v1 Job train)" in message, field
    assert "pod set template.spec.template" in message
    assert what in message


def test_a_pod_set_info_naming_another_appwrapper_is_rejected() -> None:
    with pytest.raises(TemplateError, match="must be the AppWrapper's name 'aw'"):
        render_component(aw({"template": job(), "podSetInfos": [{"labels": {APPWRAPPER_LABEL: "x"}}]}), 0)


def test_a_top_level_label_naming_another_appwrapper_is_rejected() -> None:
    template = job()
    template["metadata"]["labels"] = {APPWRAPPER_LABEL: "someone-else"}
    with pytest.raises(TemplateError, match=r"label 'workload\.codeflare\.dev/appwrapper' is 'someone-else'"):
        render_component(aw({"template": template}), 0)


def test_another_controller_owner_is_rejected() -> None:
    template = job()
    template["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "r", "controller": True}
    ]
    with pytest.raises(TemplateError, match="controller owner"):
        render_component(aw({"template": template}), 0)


def test_another_namespace_is_rejected_and_the_same_one_is_fine() -> None:
    template = job()
    template["metadata"]["namespace"] = "elsewhere"
    with pytest.raises(TemplateError, match="namespace 'elsewhere' differs"):
        render_component(aw({"template": template}), 0)
    template["metadata"]["namespace"] = "team"
    assert render_component(aw({"template": template}), 0)["metadata"]["namespace"] == "team"


def test_a_path_that_does_not_resolve_is_an_error() -> None:
    component = {"template": job(), "podSets": [{"path": "template.spec.nothing"}]}
    with pytest.raises(TemplateError, match="missing field 'nothing'"):
        render_component(aw(component), 0)


def test_explicit_pod_sets_override_declared_and_inferred_ones() -> None:
    component = {"template": pytorchjob()}
    body = render_component(
        aw(component), 0, pod_sets=[{"path": "template.spec.pytorchReplicaSpecs.Worker.template"}]
    )
    assert "metadata" not in body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    assert body["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"]["labels"] == {
        APPWRAPPER_LABEL: "aw"
    }


def test_declared_pod_sets_of_a_custom_kind_are_injected() -> None:
    custom = {
        "apiVersion": "example.com/v1",
        "kind": "Trainer",
        "metadata": {"name": "t"},
        "spec": {"roles": [{"template": {"spec": copy.deepcopy(POD_SPEC)}}]},
    }
    body = render_component(
        aw({"template": custom, "podSets": [{"path": "template.spec.roles[0].template"}]}), 0
    )
    assert body["spec"]["roles"][0]["template"]["metadata"]["labels"] == {APPWRAPPER_LABEL: "aw"}


def test_hooks_get_the_context_and_may_return_a_new_template() -> None:
    calls: list[PodTemplateContext] = []

    def hook(context: PodTemplateContext, template: dict[str, Any]) -> dict[str, Any]:
        calls.append(context)
        new = copy.deepcopy(template)
        new["spec"]["affinity"] = {"set-by": context.path}
        return new

    appwrapper = aw({"template": job()}, {"template": pytorchjob()})
    body = render_component(appwrapper, 1, hooks=[hook])
    assert [(c.component_index, c.pod_set_index, c.path) for c in calls] == [
        (1, 0, "template.spec.pytorchReplicaSpecs.Master.template"),
        (1, 1, "template.spec.pytorchReplicaSpecs.Worker.template"),
    ]
    assert calls[0].appwrapper is appwrapper
    worker = body["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    assert worker["spec"]["affinity"] == {"set-by": "template.spec.pytorchReplicaSpecs.Worker.template"}
    assert worker["metadata"]["labels"] == {APPWRAPPER_LABEL: "aw"}, "hooks run after injection"


def test_a_hook_value_error_becomes_a_template_error() -> None:
    def hook(context: PodTemplateContext, template: dict[str, Any]) -> dict[str, Any]:
        raise ValueError("cannot place it")

    with pytest.raises(
        TemplateError, match=r"component 0 \(batch/v1 Job train\), pod set template.spec.template: cannot"
    ):
        render_component(aw({"template": job()}), 0, hooks=[hook])


def test_a_missing_component_or_template_is_an_error() -> None:
    with pytest.raises(TemplateError, match="component 3 does not exist"):
        render_component(aw({"template": job()}), 3)
    with pytest.raises(TemplateError, match="no template"):
        render_component(aw({"podSets": []}), 0)


@given(
    labels=st.dictionaries(st.sampled_from(["a", "b", "c"]), st.sampled_from(["1", "2"]), max_size=3),
    info_labels=st.dictionaries(st.sampled_from(["a", "b", "c"]), st.sampled_from(["1", "2"]), max_size=3),
)
def test_rendering_never_touches_its_input_and_either_merges_or_reports_a_conflict(
    labels: dict[str, str], info_labels: dict[str, str]
) -> None:
    appwrapper = aw({"template": job(labels=labels), "podSetInfos": [{"labels": info_labels}]})
    frozen = copy.deepcopy(appwrapper)
    conflict = any(k in labels and labels[k] != v for k, v in info_labels.items())
    try:
        body = render_component(appwrapper, 0)
    except TemplateError:
        assert conflict
    else:
        assert not conflict
        assert body["spec"]["template"]["metadata"]["labels"] == {
            **labels,
            **info_labels,
            APPWRAPPER_LABEL: "aw",
        }
    assert appwrapper == frozen


# ------------------------------------------------------------------ deep templates


def nested(levels: int) -> dict[str, Any]:
    """``levels`` objects, each inside the one before (built without recursion)."""
    root: dict[str, Any] = {}
    node = root
    for _ in range(levels - 1):
        node["a"] = child = {}
        node = child
    return root


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=30,
)


@given(JSON)
def test_a_copied_tree_equals_its_source_keeps_key_order_and_shares_no_container(tree: Any) -> None:
    copied = copy_tree(tree)
    assert copied == tree
    if isinstance(tree, dict):
        assert list(copied) == list(tree)
        assert tree == {} or copied is not tree


def test_a_tree_as_deep_as_the_limit_is_copied_and_one_level_more_is_refused() -> None:
    assert copy_tree(nested(MAX_TEMPLATE_DEPTH)) == nested(MAX_TEMPLATE_DEPTH)
    with pytest.raises(TemplateError, match=f"more than {MAX_TEMPLATE_DEPTH} levels deep"):
        copy_tree(nested(MAX_TEMPLATE_DEPTH + 1))
    with pytest.raises(TemplateError):
        copy_tree([nested(MAX_TEMPLATE_DEPTH)])  # lists count too


def test_a_template_deeper_than_the_stack_allows_is_refused_by_name_not_by_a_recursion_error() -> None:
    template = job()
    template["spec"]["x"] = nested(20_000)
    with pytest.raises(
        TemplateError, match=r"component 0 \(batch/v1 Job .*\): the template nests .* cannot be created"
    ):
        render_component(aw({"template": template}), 0)


def test_a_template_300_levels_deep_is_rendered() -> None:
    template = job()
    template["spec"]["x"] = nested(300)
    body = render_component(aw({"template": template}), 0)
    assert body["spec"]["x"] == nested(300)
