"""Autopilot anti-affinity injection and node exclusion on pod specs."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.lifecycle.placement.affinity import (
    PREFERRED,
    REQUIRED,
    exclude_nodes,
    inject_anti_affinity,
    quantity_is_nonzero,
    uses_resource,
)
from shared.config import ResourceTaint

GPU = "nvidia.com/gpu"
RDMA = "rdma/ib"
HEALTH = "autopilot.ibm.com/gpuhealth"
WEIGHT = 50

TAINTS: dict[str, list[ResourceTaint]] = {
    GPU: [
        ResourceTaint(key=HEALTH, value="WARN", effect="PreferNoSchedule"),
        ResourceTaint(key=HEALTH, value="TESTING", effect="NoSchedule"),
        ResourceTaint(key=HEALTH, value="EVICT", effect="NoExecute"),
    ]
}
GPU_REQUIRED = {"key": HEALTH, "operator": "NotIn", "values": ["TESTING", "EVICT"]}
GPU_PREFERRED = {
    "weight": WEIGHT,
    "preference": {"matchExpressions": [{"key": HEALTH, "operator": "NotIn", "values": ["WARN"]}]},
}


def container(
    name: str = "main", requests: dict[str, Any] | None = None, limits: dict[str, Any] | None = None
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    return {"name": name, "image": "busybox", "resources": resources}


def gpu_pod(**extra: Any) -> dict[str, Any]:
    return {"containers": [container(requests={GPU: "1", "cpu": "2"}, limits={GPU: "1"})], **extra}


def terms(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return spec["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]  # type: ignore[no-any-return]


def preferred(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return spec["affinity"]["nodeAffinity"][PREFERRED]  # type: ignore[no-any-return]


def test_pod_without_affinity_gets_one_required_term_and_a_preferred_term() -> None:
    out = inject_anti_affinity(gpu_pod(), TAINTS, WEIGHT)
    assert terms(out) == [{"matchExpressions": [GPU_REQUIRED]}]
    assert preferred(out) == [GPU_PREFERRED]
    assert out["containers"] == gpu_pod()["containers"]


def test_expression_is_merged_into_every_existing_term_after_the_user_expressions() -> None:
    zone_a = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
    by_name = {"key": "metadata.name", "operator": "In", "values": ["n7"]}
    affinity = {
        "nodeAffinity": {
            REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [zone_a]}, {"matchFields": [by_name]}]}
        }
    }
    out = inject_anti_affinity(gpu_pod(affinity=affinity), TAINTS, WEIGHT)
    assert terms(out) == [
        {"matchExpressions": [zone_a, GPU_REQUIRED]},
        {"matchFields": [by_name], "matchExpressions": [GPU_REQUIRED]},
    ]


def test_required_without_terms_gets_one_term() -> None:
    affinity: dict[str, Any] = {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": []}}}
    out = inject_anti_affinity(gpu_pod(affinity=affinity), TAINTS, WEIGHT)
    assert terms(out) == [{"matchExpressions": [GPU_REQUIRED]}]


def test_null_affinity_fields_are_treated_as_absent() -> None:
    out = inject_anti_affinity(gpu_pod(affinity={"nodeAffinity": None}), TAINTS, WEIGHT)
    assert terms(out) == [{"matchExpressions": [GPU_REQUIRED]}]


def test_empty_user_term_which_matches_no_node_is_left_empty() -> None:
    zone_a = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
    affinity = {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{}, {"matchExpressions": [zone_a]}]}}}
    out = inject_anti_affinity(gpu_pod(affinity=affinity), TAINTS, WEIGHT)
    assert terms(out) == [{}, {"matchExpressions": [zone_a, GPU_REQUIRED]}]


def test_existing_preferred_terms_and_other_affinities_are_kept() -> None:
    user_pref = {
        "weight": 10,
        "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]},
    }
    pod_anti = {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "kubernetes.io/hostname"}]}
    affinity = {"nodeAffinity": {PREFERRED: [user_pref]}, "podAntiAffinity": pod_anti}
    out = inject_anti_affinity(gpu_pod(affinity=affinity), TAINTS, WEIGHT)
    assert preferred(out) == [user_pref, GPU_PREFERRED]
    assert out["affinity"]["podAntiAffinity"] == pod_anti
    assert terms(out) == [{"matchExpressions": [GPU_REQUIRED]}]


def test_configured_weight_is_used() -> None:
    out = inject_anti_affinity(gpu_pod(), TAINTS, 7)
    assert [t["weight"] for t in preferred(out)] == [7]


@pytest.mark.parametrize("weight", [0, 101, -1])
def test_weight_outside_kubernetes_range_is_rejected(weight: int) -> None:
    with pytest.raises(ValueError, match="weight"):
        inject_anti_affinity(gpu_pod(), TAINTS, weight)


def test_multiple_resources_add_one_expression_per_key_for_the_resources_used() -> None:
    taints = {
        **TAINTS,
        RDMA: [
            ResourceTaint(key="rdma.io/health", value="DOWN", effect="NoSchedule"),
            ResourceTaint(key=HEALTH, value="ERR", effect="NoSchedule"),
        ],
    }
    both = {"containers": [container(requests={GPU: 1}), container("side", requests={RDMA: 1})]}
    out = inject_anti_affinity(both, taints, WEIGHT)
    assert terms(out) == [
        {
            "matchExpressions": [
                {"key": HEALTH, "operator": "NotIn", "values": ["TESTING", "EVICT", "ERR"]},
                {"key": "rdma.io/health", "operator": "NotIn", "values": ["DOWN"]},
            ]
        }
    ]
    rdma_only = inject_anti_affinity({"containers": [container(requests={RDMA: 1})]}, taints, WEIGHT)
    assert terms(rdma_only) == [
        {
            "matchExpressions": [
                {"key": "rdma.io/health", "operator": "NotIn", "values": ["DOWN"]},
                {"key": HEALTH, "operator": "NotIn", "values": ["ERR"]},
            ]
        }
    ]
    assert PREFERRED not in rdma_only["affinity"]["nodeAffinity"]


def test_value_required_by_one_resource_is_not_also_preferred() -> None:
    taints = {
        GPU: [ResourceTaint(key=HEALTH, value="WARN", effect="PreferNoSchedule")],
        RDMA: [ResourceTaint(key=HEALTH, value="WARN", effect="NoSchedule")],
    }
    pod = {"containers": [container(requests={GPU: 1, RDMA: 1})]}
    out = inject_anti_affinity(pod, taints, WEIGHT)
    assert terms(out) == [{"matchExpressions": [{"key": HEALTH, "operator": "NotIn", "values": ["WARN"]}]}]
    assert PREFERRED not in out["affinity"]["nodeAffinity"]


def test_init_container_use_counts() -> None:
    pod = {"initContainers": [container("init", requests={GPU: "1"})], "containers": [container()]}
    out = inject_anti_affinity(pod, TAINTS, WEIGHT)
    assert terms(out) == [{"matchExpressions": [GPU_REQUIRED]}]


def test_limits_only_counts() -> None:
    pod = {"containers": [container(limits={GPU: 2})]}
    out = inject_anti_affinity(pod, TAINTS, WEIGHT)
    assert terms(out) == [{"matchExpressions": [GPU_REQUIRED]}]


@pytest.mark.parametrize("zero", ["0", 0, "0m", "0.0", "0Gi", 0.0])
def test_zero_request_and_limit_do_not_count(zero: object) -> None:
    pod = {"containers": [container(requests={GPU: zero, "cpu": "1"}, limits={GPU: zero})]}
    out = inject_anti_affinity(pod, TAINTS, WEIGHT)
    assert out == pod
    assert "affinity" not in out


def test_pod_not_using_the_resource_is_returned_unchanged() -> None:
    zone_a = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
    pod = {
        "containers": [container(requests={"cpu": "1"})],
        "affinity": {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [zone_a]}]}}},
    }
    assert inject_anti_affinity(pod, TAINTS, WEIGHT) == pod
    assert inject_anti_affinity({"containers": [{"name": "c"}]}, TAINTS, WEIGHT) == {
        "containers": [{"name": "c"}]
    }


def test_injection_is_idempotent() -> None:
    zone_a = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
    affinity = {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [zone_a]}, {}]}}}
    once = inject_anti_affinity(gpu_pod(affinity=affinity), TAINTS, WEIGHT)
    assert inject_anti_affinity(once, TAINTS, WEIGHT) == once


def test_user_expression_that_already_excludes_the_values_is_not_duplicated() -> None:
    user = {"key": HEALTH, "operator": "NotIn", "values": ["EVICT", "TESTING", "ERR"]}
    affinity = {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [user]}]}}}
    out = inject_anti_affinity(gpu_pod(affinity=affinity), TAINTS, WEIGHT)
    assert terms(out) == [{"matchExpressions": [user]}]


def test_user_expression_that_excludes_fewer_values_gets_ours_beside_it() -> None:
    user = {"key": HEALTH, "operator": "NotIn", "values": ["EVICT"]}
    affinity = {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [user]}]}}}
    out = inject_anti_affinity(gpu_pod(affinity=affinity), TAINTS, WEIGHT)
    assert terms(out) == [{"matchExpressions": [user, GPU_REQUIRED]}]


def test_input_is_not_modified() -> None:
    pod = gpu_pod(affinity={"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": []}]}}})
    before = copy.deepcopy(pod)
    inject_anti_affinity(pod, TAINTS, WEIGHT)
    exclude_nodes(pod, ["n1"])
    assert pod == before


@pytest.mark.parametrize(
    ("quantity", "nonzero"),
    [
        *[("1", True), ("500m", True), ("1e3", True), ("2Gi", True), (".5", True), ("+1", True), (3, True)],
        *[("0", False), ("0k", False), ("00", False), (" 0 ", False), (0, False), ("garbage", True)],
    ],
)
def test_quantity_is_nonzero(quantity: object, nonzero: bool) -> None:
    assert quantity_is_nonzero(quantity) is nonzero


def test_uses_resource_ignores_malformed_container_entries() -> None:
    pod = {
        "containers": [None, {"name": "c", "resources": None}, {"name": "d", "resources": {"requests": []}}]
    }
    assert not uses_resource(pod, GPU)


# ---------------------------------------------------------------------------- exclude_nodes


def by_name(node: str) -> dict[str, Any]:
    return {"key": "metadata.name", "operator": "NotIn", "values": [node]}


def test_exclude_nodes_without_affinity_creates_a_term() -> None:
    out = exclude_nodes({"containers": [container()]}, ["n1", "n2"])
    assert terms(out) == [{"matchFields": [by_name("n1"), by_name("n2")]}]


def test_exclude_nodes_goes_into_every_term_and_keeps_injected_expressions() -> None:
    zone_a = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
    affinity = {
        "nodeAffinity": {
            REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [zone_a]}, {"matchExpressions": []}]}
        }
    }
    out = exclude_nodes(inject_anti_affinity(gpu_pod(affinity=affinity), TAINTS, WEIGHT), ["n1"])
    assert terms(out) == [
        {"matchExpressions": [zone_a, GPU_REQUIRED], "matchFields": [by_name("n1")]},
        {"matchExpressions": []},
    ]


def test_exclude_nodes_is_idempotent_and_deduplicates() -> None:
    once = exclude_nodes({"containers": []}, ["n1", "n1", ""])
    assert terms(once) == [{"matchFields": [by_name("n1")]}]
    assert exclude_nodes(once, ["n1"]) == once


def test_exclude_no_nodes_changes_nothing() -> None:
    pod = {"containers": [container()]}
    assert exclude_nodes(pod, []) == pod


def test_exclude_nodes_rejects_a_bare_string() -> None:
    with pytest.raises(TypeError):
        exclude_nodes({"containers": []}, "n1")


# ------------------------------------------------------------------------------- properties

_keys = st.sampled_from([HEALTH, "topology.kubernetes.io/zone", "disk", "rdma.io/health"])
_expressions = st.fixed_dictionaries(
    {
        "key": _keys,
        "operator": st.sampled_from(["In", "NotIn", "Exists"]),
        "values": st.lists(st.sampled_from(["a", "TESTING", "EVICT", "WARN", "ERR"]), max_size=3),
    }
)
_terms = st.fixed_dictionaries({}, optional={"matchExpressions": st.lists(_expressions, max_size=3)})
_preferred_terms = st.builds(
    lambda weight, exprs: {"weight": weight, "preference": {"matchExpressions": exprs}},
    st.sampled_from([1, WEIGHT, 100]),
    st.lists(_expressions, max_size=2),
)
_node_affinity = st.fixed_dictionaries(
    {},
    optional={
        REQUIRED: st.fixed_dictionaries({"nodeSelectorTerms": st.lists(_terms, max_size=3)}),
        PREFERRED: st.lists(_preferred_terms, max_size=2),
    },
)
_quantities = st.sampled_from(["0", "1", "8", "500m", 0, 2])
_containers = st.builds(
    container,
    st.just("c"),
    st.none() | st.dictionaries(st.sampled_from([GPU, RDMA, "cpu"]), _quantities, max_size=2),
    st.none() | st.dictionaries(st.sampled_from([GPU, RDMA, "cpu"]), _quantities, max_size=2),
)
_pods = st.fixed_dictionaries(
    {"containers": st.lists(_containers, min_size=1, max_size=2)},
    optional={
        "initContainers": st.lists(_containers, max_size=1),
        "affinity": st.fixed_dictionaries({}, optional={"nodeAffinity": _node_affinity}),
    },
)
_taint_configs = st.dictionaries(
    st.sampled_from([GPU, RDMA]),
    st.lists(
        st.builds(
            ResourceTaint,
            key=_keys,
            value=st.sampled_from(["TESTING", "EVICT", "WARN", "ERR"]),
            effect=st.sampled_from(["NoSchedule", "PreferNoSchedule", "NoExecute"]),
        ),
        max_size=4,
    ),
    max_size=2,
)


def _user_terms(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return list(
        pod.get("affinity", {}).get("nodeAffinity", {}).get(REQUIRED, {}).get("nodeSelectorTerms", [])
    )


def _user_preferred(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return list(pod.get("affinity", {}).get("nodeAffinity", {}).get(PREFERRED, []))


@given(_pods, _taint_configs, st.lists(st.sampled_from(["n1", "n2", "n3"]), max_size=3))
def test_injection_is_idempotent_and_never_removes_a_user_term(
    pod: dict[str, Any], taints: dict[str, list[ResourceTaint]], nodes: list[str]
) -> None:
    once = exclude_nodes(inject_anti_affinity(pod, taints, WEIGHT), nodes)
    assert exclude_nodes(inject_anti_affinity(once, taints, WEIGHT), nodes) == once

    user_terms, user_preferred = _user_terms(pod), _user_preferred(pod)
    if user_terms:
        out_terms = terms(once)
        assert len(out_terms) == len(user_terms)
        for before, after in zip(user_terms, out_terms, strict=True):
            for field, exprs in before.items():
                assert after[field][: len(exprs)] == exprs
    if user_preferred:
        assert preferred(once)[: len(user_preferred)] == user_preferred
    assert once["containers"] == pod["containers"]


@given(_pods, _taint_configs)
def test_every_nonempty_term_excludes_the_required_values_of_the_resources_used(
    pod: dict[str, Any], taints: dict[str, list[ResourceTaint]]
) -> None:
    out = inject_anti_affinity(pod, taints, WEIGHT)
    wanted: dict[str, set[str]] = {}
    for resource, entries in taints.items():
        if uses_resource(pod, resource):
            for t in entries:
                if t.effect in ("NoSchedule", "NoExecute"):
                    wanted.setdefault(t.key, set()).add(t.value)
    if not any(uses_resource(pod, resource) for resource in taints):
        assert out == pod
    if not wanted:
        return
    for term in terms(out):
        if not term.get("matchExpressions") and not term.get("matchFields"):
            continue
        for key, values in wanted.items():
            excluded: set[str] = set()
            for e in term["matchExpressions"]:
                if e["key"] == key and e["operator"] == "NotIn":
                    excluded |= set(e["values"])
            assert values <= excluded
