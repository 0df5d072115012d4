"""The watcher's translation against what users put in objects: it never raises, the slim
AppWrapper body answers its readers as the whole object would, and what cannot go out is
refused with a reason (docs/messages.md, "observation.appwrapper")."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.watcher import translate
from shared import subjects
from shared.appwrapper.constants import (
    ANNOUNCED_ANNOTATION,
    API_VERSION,
    APPWRAPPER_LABEL,
    INCIDENT_TRACE_ANNOTATION,
    KIND,
)
from shared.appwrapper.model import read_appwrapper
from shared.appwrapper.podsets import expected_pod_count
from shared.messages import (
    AppWrapperObservation,
    ComponentObservation,
    NodeObservation,
    PodObservation,
    decode,
)
from shared.ownership import controller_link

NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


def controller(api_version: str, kind: str, name: str, **extra: Any) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": "u", "controller": True, **extra}


def labelled(kind: str, *owners: dict[str, Any], aw: str = "a") -> dict[str, Any]:
    return {
        "apiVersion": "v1" if kind == "Pod" else "batch/v1",
        "kind": kind,
        "metadata": {
            "name": "x",
            "namespace": "n",
            "labels": {APPWRAPPER_LABEL: aw},
            "ownerReferences": list(owners),
        },
    }


AW = AppWrapperObservation.KIND


def nested(depth: int, leaf: Any = "x") -> Any:
    """``depth`` dicts one inside the other (built without recursion, as deep as asked)."""
    value = leaf
    for _ in range(depth):
        value = {"a": value}
    return value


def job(name: str = "j", **spec: Any) -> dict[str, Any]:
    template = {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"template": template, **spec},
    }


def appwrapper(*components: dict[str, Any], status: Any = None, **metadata: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "workload.codeflare.dev/v1beta2",
        "kind": "AppWrapper",
        "metadata": {
            "name": "aw",
            "namespace": "ns",
            "uid": "u1",
            "resourceVersion": "7",
            "generation": 1,
            "labels": {"team": "a"},
            "annotations": {"workload.codeflare.dev.appwrapper/retryLimit": "3"},
            "creationTimestamp": "2025-01-01T00:00:00Z",
            "finalizers": ["workload.codeflare.dev/finalizer"],
            "managedFields": [{"manager": "kubectl", "fieldsV1": nested(20)}],
            **metadata,
        },
        "spec": {"suspend": False, "components": [{"template": c} for c in components]},
    }
    if status is not None:
        obj["status"] = status
    return obj


def prepare(obj: dict[str, Any], *, deleted: bool = False) -> translate.Prepared | translate.Refused | None:
    return translate.prepare(
        translate.appwrapper_observation, obj, observation_kind=AW, deleted=deleted, now=NOW
    )


def outcome(body: Any) -> tuple[str, Any]:
    try:
        return "count", expected_pod_count(body)
    except Exception:
        return "error", None


def test_a_job_template_with_a_field_nested_300_deep_is_observed_without_it() -> None:
    # The object that stopped the watcher: pydantic's serializer gave up on it in fingerprint().
    obj = appwrapper(job(parallelism=3, completions=5, extra=nested(300)))
    prepared = prepare(obj)
    assert isinstance(prepared, translate.Prepared)
    body = decode(AppWrapperObservation, prepared.message.encode()).body
    [component] = body["spec"]["components"]
    assert component["template"] == {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}}
    assert [ps["replicas"] for ps in component["podSets"]] == [3]
    assert expected_pod_count(body) == expected_pod_count(obj) == 3


def test_the_slim_body_keeps_what_health_and_the_cli_read_and_drops_managed_fields() -> None:
    status = {
        "phase": "Running",
        "resettingCount": 2,
        "conditions": [
            {"type": "ResourcesDeployed", "status": "True", "lastTransitionTime": "2025-01-01T00:00:00Z"}
        ],
        "componentStatus": [
            {"kind": "Job", "name": "j", "podSets": [{"replicas": 4, "path": "template.spec.template"}]}
        ],
    }
    obj = appwrapper(job(), status=status, deletionTimestamp="2025-01-02T00:00:00Z")
    obj["spec"]["managedBy"] = "someone-else"
    prepared = prepare(obj)
    assert isinstance(prepared, translate.Prepared)
    body = prepared.message.body  # type: ignore[attr-defined]
    assert "managedFields" not in body["metadata"]
    assert body["status"] == status
    assert read_appwrapper(body) == read_appwrapper(obj)
    assert expected_pod_count(body) == expected_pod_count(obj) == 4
    meta = body["metadata"]
    assert meta["finalizers"] and meta["generation"] == 1 and meta["creationTimestamp"]


def test_lifecycles_bookkeeping_annotations_stay_out_and_recording_them_publishes_nothing() -> None:
    obj = appwrapper(job())
    before = prepare(obj)
    recorded = copy.deepcopy(obj)
    recorded["metadata"]["resourceVersion"] = "999"
    recorded["metadata"]["annotations"].update(
        {ANNOUNCED_ANNOTATION: "Running/2025-01-01T00:00:00Z", INCIDENT_TRACE_ANNOTATION: "00-ab-cd-01"}
    )
    after = prepare(recorded)
    assert isinstance(before, translate.Prepared) and isinstance(after, translate.Prepared)
    # What configures the workload stays; lifecycle's own records do not.
    assert after.message.body["metadata"]["annotations"] == {  # type: ignore[attr-defined]
        "workload.codeflare.dev.appwrapper/retryLimit": "3"
    }
    # Unchanged for every reader: the watcher publishes nothing for lifecycle's record.
    assert translate.fingerprint(after.message) == translate.fingerprint(before.message)
    assert ANNOUNCED_ANNOTATION in recorded["metadata"]["annotations"]  # the object is left as it was


def test_declared_pod_sets_are_kept_as_declared() -> None:
    declared = [
        {"replicas": 2, "path": "template.spec.template", "annotations": {"a": "b"}},
        {"path": "template"},
    ]
    obj = appwrapper(job())
    obj["spec"]["components"][0]["podSets"] = declared
    prepared = prepare(obj)
    assert isinstance(prepared, translate.Prepared)
    [component] = prepared.message.body["spec"]["components"]  # type: ignore[attr-defined]
    assert component["podSets"] == declared
    assert expected_pod_count(prepared.message.body) == expected_pod_count(obj) == 3  # type: ignore[attr-defined]


def test_a_body_nested_too_deep_outside_the_templates_is_refused_with_its_identity() -> None:
    prepared = prepare(appwrapper(job(), status={"phase": "Running", "extra": nested(100)}))
    assert isinstance(prepared, translate.Refused)
    assert prepared.reason == translate.TOO_DEEP
    assert prepared.subject == subjects.appwrapper_obs("ns", "aw", "appwrapper", "aw")
    assert prepared.identity == translate.Identity(
        "AppWrapper", "ns", "aw", "u1", "7", "workload.codeflare.dev/v1beta2"
    )
    summary = prepared.identity.summary(prepared.reason, prepared.error)
    assert summary["name"] == "aw" and summary["reason"] == "too-deep"


def test_an_observation_over_the_cap_is_refused_as_too_large() -> None:
    big = "x" * (translate.MAX_OBSERVATION_BYTES + 1)
    prepared = prepare(appwrapper(job(), note=None, annotations={"big": big}))
    assert isinstance(prepared, translate.Refused)
    assert prepared.reason == translate.TOO_LARGE
    assert str(translate.MAX_OBSERVATION_BYTES) in prepared.error


def test_a_tombstone_whose_body_cannot_go_out_goes_out_without_it() -> None:
    # A delete that is not published is a fault nobody sees; the readers keep what they knew.
    obj = appwrapper(job(), status={"extra": nested(100)})
    prepared = prepare(obj, deleted=True)
    assert isinstance(prepared, translate.Prepared)
    message = prepared.message
    assert isinstance(message, AppWrapperObservation)
    assert message.deleted and message.body == {} and message.ref.uid == "u1"


def test_an_object_the_translation_cannot_read_is_refused_as_untranslatable() -> None:
    pod = {
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns", "uid": "pu", "labels": {APPWRAPPER_LABEL: "aw"}},
        "status": {"containerStatuses": ["not a map"]},
    }
    prepared = translate.prepare(
        translate.pod_observation, pod, observation_kind=PodObservation.KIND, deleted=False, now=NOW
    )
    assert isinstance(prepared, translate.Refused)
    assert prepared.reason == translate.UNTRANSLATABLE and "AttributeError" in prepared.error
    assert prepared.subject == subjects.appwrapper_obs("ns", "aw", "pod", "p")


# ------------------------------------------------------------------ properties

json_leaf = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@st.composite
def deep(draw: st.DrawFn) -> Any:
    depth = draw(st.integers(min_value=1, max_value=1000))
    value: Any = draw(json_leaf)
    for _ in range(depth):
        value = {"a": value} if draw(st.booleans()) else [value]
    return value


huge_string = st.integers(min_value=100_000, max_value=2_000_000).map(lambda n: "y" * n)
anything = json_value | deep() | huge_string


@st.composite
def template(draw: st.DrawFn) -> Any:
    kind = draw(
        st.sampled_from(
            [
                ("batch/v1", "Job"),
                ("v1", "Pod"),
                ("apps/v1", "Deployment"),
                ("jobset.x-k8s.io/v1alpha2", "JobSet"),
                ("kubeflow.org/v1", "PyTorchJob"),
                ("ray.io/v1", "RayCluster"),
                ("example.com/v1", "Unknown"),
            ]
        )
    )
    counts = st.none() | st.integers(min_value=0, max_value=9) | anything
    pod = {"spec": {"containers": [{"name": "c"}]}, "extra": draw(anything)}
    spec = {
        "parallelism": draw(counts),
        "completions": draw(counts),
        "replicas": draw(counts),
        "template": pod,
        "replicatedJobs": [
            {"replicas": draw(counts), "template": {"spec": {"parallelism": draw(counts), "template": pod}}}
        ],
        "pytorchReplicaSpecs": {"Worker": {"replicas": draw(counts), "template": pod}},
        "headGroupSpec": {"template": pod},
        "workerGroupSpecs": [{"replicas": draw(counts), "template": pod}],
    }
    out: Any = {"apiVersion": kind[0], "kind": kind[1], "metadata": {"name": "t"}, "spec": spec}
    return draw(st.just(out) | anything)


@st.composite
def component(draw: st.DrawFn) -> Any:
    out: dict[str, Any] = {"template": draw(template())}
    if draw(st.booleans()):
        out["podSets"] = draw(
            st.lists(
                st.fixed_dictionaries({"path": st.just("template"), "replicas": st.integers(0, 5)}),
                max_size=3,
            )
            | anything
        )
    return draw(st.just(out) | anything)


@st.composite
def appwrapper_like(draw: st.DrawFn) -> dict[str, Any]:
    components = draw(st.lists(component(), max_size=3) | anything)
    obj = appwrapper()
    obj["spec"] = draw(st.just({"components": components, "extra": draw(anything)}) | anything)
    if draw(st.booleans()):
        obj["status"] = draw(anything)
    if draw(st.booleans()):
        obj["metadata"]["annotations"] = draw(anything)
    if draw(st.booleans()):
        obj["metadata"] = draw(anything)
    return obj


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(obj=appwrapper_like(), deleted=st.booleans())
def test_any_appwrapper_like_object_is_either_publishable_or_refused_with_a_reason(
    obj: dict[str, Any], deleted: bool
) -> None:
    prepared = prepare(obj, deleted=deleted)
    if isinstance(prepared, translate.Refused):
        assert prepared.reason in (translate.TOO_LARGE, translate.TOO_DEEP, translate.UNTRANSLATABLE)
        assert prepared.error
        return
    assert isinstance(prepared, translate.Prepared)
    data = prepared.message.encode()
    assert len(data) <= translate.MAX_OBSERVATION_BYTES
    body = decode(AppWrapperObservation, data).body
    assert not translate.nested_deeper_than(body, translate.MAX_BODY_DEPTH)
    assert prepared.subject == translate.subject_for(prepared.message)
    assert prepared.fingerprint == translate.fingerprint(prepared.message)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(components=st.lists(component(), max_size=3), status=st.none() | anything)
def test_the_slim_body_gives_the_expected_pod_count_of_the_whole_object(
    components: list[Any], status: Any
) -> None:
    obj = appwrapper()
    obj["spec"]["components"] = components
    if status is not None:
        obj["status"] = status
    assert outcome(translate.appwrapper_body(obj)) == outcome(obj)


names = st.text(min_size=0, max_size=12)


@given(namespace=names, aw=names, name=names, kind=st.sampled_from(["Job", "PyTorchJob"]))
def test_a_tombstone_made_from_a_subject_is_for_the_object_observed_there(
    namespace: str, aw: str, name: str, kind: str
) -> None:
    def there(message: Any) -> Any:
        return translate.tombstone_for_subject(translate.subject_for(message), now=NOW)

    pod = there(PodObservation(ref={"namespace": namespace, "name": name}, appwrapper=aw, observed_at=NOW))
    assert isinstance(pod, PodObservation) and pod.deleted
    assert (pod.ref.namespace, pod.ref.name, pod.appwrapper) == (namespace, name, aw)
    comp = there(
        ComponentObservation(
            ref={"namespace": namespace, "name": name},
            appwrapper=aw,
            api_version="v",
            kind=kind,
            observed_at=NOW,
        )
    )
    assert isinstance(comp, ComponentObservation) and comp.deleted
    assert (comp.ref.namespace, comp.ref.name, comp.appwrapper, comp.kind) == (namespace, name, aw, kind)
    wrapper = there(AppWrapperObservation(ref={"namespace": namespace, "name": aw}, observed_at=NOW))
    assert isinstance(wrapper, AppWrapperObservation) and wrapper.deleted and wrapper.ref.name == aw
    node = there(NodeObservation(name=name, observed_at=NOW))
    assert isinstance(node, NodeObservation) and node.deleted and node.name == name
    for message in (pod, comp, wrapper, node):
        subject = translate.subject_for(message)
        assert translate.subject_kind(subject) == message.KIND
        # The filter a watch reconciles with holds exactly its own kind's subjects.
        pattern = translate.observed_subject_filter(message.KIND).split(".")
        tokens = subject.split(".")
        assert len(pattern) == len(tokens)
        assert all(p in ("*", t) for p, t in zip(pattern, tokens, strict=True))


@pytest.mark.parametrize(
    ("to_message", "kind", "obj"),
    [
        (translate.appwrapper_observation, AW, appwrapper(job())),
        (
            translate.pod_observation,
            PodObservation.KIND,
            {
                "kind": "Pod",
                "metadata": {"name": "p.1", "namespace": "n", "labels": {APPWRAPPER_LABEL: "a.b"}},
            },
        ),
        (
            translate.component_observation,
            ComponentObservation.KIND,
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {
                    "name": "j",
                    "namespace": "n",
                    "labels": {APPWRAPPER_LABEL: "a"},
                    "ownerReferences": [controller(API_VERSION, KIND, "a")],
                },
            },
        ),
        (translate.node_observation, NodeObservation.KIND, {"kind": "Node", "metadata": {"name": "n.1"}}),
    ],
)
def test_the_subject_of_a_raw_object_is_that_of_its_observation(to_message: Any, kind: str, obj: Any) -> None:
    # The watcher names the subject of an object it could not translate, and tracks the live
    # subjects, from the raw object: it must be the subject its observation would go to.
    prepared = translate.prepare(to_message, obj, observation_kind=kind, deleted=False, now=NOW)
    assert isinstance(prepared, translate.Prepared)
    assert translate.object_subject(obj, kind) == prepared.subject


# ------------------------------------------------------------------ what a replica keeps of an object


def pod(**status: Any) -> dict[str, Any]:
    """A pod as the API server returns it, managedFields, environment and volumes included."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "aw-job-x7k2p",
            "namespace": "ns",
            "uid": "pu",
            "resourceVersion": "41",
            "generateName": "aw-job-",
            "labels": {APPWRAPPER_LABEL: "aw", "batch.kubernetes.io/job-name": "aw-job"},
            "annotations": {"sim.respawn.dev/fail-after": "1s"},
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": "aw-job", "uid": "ju", "controller": True}
            ],
            "creationTimestamp": "2025-01-01T00:00:00Z",
            "managedFields": [{"manager": "kube-controller-manager", "fieldsV1": nested(20)}],
        },
        "spec": {
            "nodeName": "kwok-node-1",
            "containers": [
                {
                    "name": "c",
                    "image": "busybox",
                    "env": [{"name": f"E{i}", "value": "v" * 100} for i in range(20)],
                    "resources": {"limits": {"nvidia.com/gpu": "8"}, "requests": {"cpu": "1"}},
                }
            ],
            "initContainers": [{"name": "i", "image": "busybox"}],
            "volumes": [{"name": f"v{i}", "emptyDir": {}} for i in range(10)],
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
            "containerStatuses": [
                {"name": "c", "ready": True, "restartCount": 2, "state": {"running": {"startedAt": "x"}}}
            ],
            "initContainerStatuses": [
                {
                    "name": "i",
                    "state": {"terminated": {"exitCode": 0, "finishedAt": "2025-01-01T00:00:05Z"}},
                }
            ],
            **status,
        },
    }


def node() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "kwok-node-1",
            "resourceVersion": "9",
            "labels": {"type": "kwok", "autopilot.ibm.com/gpuhealth": "EVICT"},
            "managedFields": [{"manager": "kwok", "fieldsV1": nested(20)}],
        },
        "spec": {"taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}], "unschedulable": True},
        "status": {
            "conditions": [
                {"type": "MemoryPressure", "status": "False"},
                {"type": "Ready", "status": "True"},
            ],
            "images": [{"names": [f"image-{i}"], "sizeBytes": i} for i in range(50)],
        },
    }


def component_job(**status: Any) -> dict[str, Any]:
    obj = job("aw-job", parallelism=2)
    obj["spec"]["template"]["spec"]["containers"][0]["env"] = [{"name": "E", "value": "v" * 1000}]
    obj["metadata"].update(
        namespace="ns",
        uid="ju",
        resourceVersion="5",
        labels={APPWRAPPER_LABEL: "aw"},
        ownerReferences=[
            {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper", "name": "aw", "uid": "u1"}
        ],
        managedFields=[{"manager": "kube-controller-manager", "fieldsV1": nested(20)}],
    )
    obj["status"] = {
        "conditions": [
            {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "m"}
        ],
        "failed": 1,
        **status,
    }
    return obj


TRANSLATORS = {
    AW: translate.appwrapper_observation,
    PodObservation.KIND: translate.pod_observation,
    ComponentObservation.KIND: translate.component_observation,
    NodeObservation.KIND: translate.node_observation,
}


def same_outcome(obj: Any, kind: str) -> None:
    """What the watcher would publish (or refuse) from what it keeps of ``obj`` is what it would
    from ``obj``: same subject, same content (fingerprint), same message id, same reason."""
    for deleted in (False, True):
        whole, kept = (
            translate.prepare(TRANSLATORS[kind], o, observation_kind=kind, deleted=deleted, now=NOW)
            for o in (obj, translate.kept(obj, kind))
        )
        if isinstance(whole, translate.Prepared):
            assert isinstance(kept, translate.Prepared)
            assert (kept.subject, kept.fingerprint, kept.msg_id) == (
                whole.subject,
                whole.fingerprint,
                whole.msg_id,
            )
        elif isinstance(whole, translate.Refused):
            assert isinstance(kept, translate.Refused)
            assert (kept.reason, kept.subject, kept.identity) == (whole.reason, whole.subject, whole.identity)
        else:
            assert kept is None


@pytest.mark.parametrize(
    ("kind", "obj"),
    [
        (PodObservation.KIND, pod()),
        (
            PodObservation.KIND,
            pod(phase="Failed", containerStatuses=[{"name": "c", "state": {"terminated": {}}}]),
        ),
        (NodeObservation.KIND, node()),
        (ComponentObservation.KIND, component_job()),
        (AW, appwrapper(job(), status={"phase": "Running", "conditions": [{"type": "Unhealthy"}]})),
        (AW, appwrapper(job(x=nested(300)))),
    ],
)
def test_what_a_replica_keeps_of_an_object_publishes_as_the_object_does_at_a_fraction_of_its_size(
    kind: str, obj: dict[str, Any]
) -> None:
    same_outcome(obj, kind)
    kept = translate.kept(obj, kind)
    assert "managedFields" not in kept["metadata"]
    if kind == AW:
        # An AppWrapper's observation carries its slim body: that is what is kept.
        assert kept == translate.appwrapper_body(obj)
    else:
        assert len(repr(kept)) < len(repr(obj)) / 2
    # Attribution and refusals read the same of it.
    assert translate.identity(kept) == translate.identity(obj)
    assert controller_link(kept) == controller_link(obj)
    assert translate.object_subject(kept, kind) == translate.object_subject(obj, kind)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(obj=appwrapper_like())
def test_what_is_kept_of_any_appwrapper_like_object_publishes_or_is_refused_as_the_object(
    obj: dict[str, Any],
) -> None:
    same_outcome(obj, AW)


@st.composite
def odd(draw: st.DrawFn, base: dict[str, Any]) -> dict[str, Any]:
    """``base`` with one of its fields at any depth replaced by anything at all."""
    obj: Any = copy.deepcopy(base)
    paths = [("metadata",), ("spec",), ("status",)]
    for top in ("metadata", "spec", "status"):
        paths += [(top, key) for key in obj.get(top, {})]
    path = draw(st.sampled_from(paths))
    parent = obj
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = draw(anything)
    return dict(obj)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(
    case=st.sampled_from([(PodObservation.KIND, pod()), (NodeObservation.KIND, node())])
    | st.just((ComponentObservation.KIND, component_job())),
    data=st.data(),
)
def test_what_is_kept_of_any_odd_pod_node_or_component_publishes_or_is_refused_as_the_object(
    case: tuple[str, dict[str, Any]], data: st.DataObject
) -> None:
    kind, base = case
    same_outcome(data.draw(odd(base)), kind)


@given(namespace=names, aw=names, name=names)
def test_the_partition_of_an_object_is_that_of_its_subject_and_its_appwrapper(
    namespace: str, aw: str, name: str
) -> None:
    labels = {APPWRAPPER_LABEL: aw}
    objects = {
        AW: {"metadata": {"namespace": namespace, "name": aw}},
        PodObservation.KIND: {
            "kind": "Pod",
            "metadata": {"namespace": namespace, "name": name, "labels": labels},
        },
        ComponentObservation.KIND: {
            "kind": "Job",
            "metadata": {"namespace": namespace, "name": name, "labels": labels},
        },
    }
    for kind, obj in objects.items():
        partition = translate.object_partition(obj, kind)
        assert partition == subjects.partition(namespace, aw)
        subject = translate.object_subject(obj, kind)
        if subject:
            assert translate.subject_partition(subject) == partition == int(subject.rsplit(".", 1)[1])
    # Nodes are split over the same partitions, by their name alone.
    node_partition = translate.object_partition({"metadata": {"name": name}}, NodeObservation.KIND)
    assert node_partition == subjects.partition("", name)
    if name:
        assert translate.subject_partition(subjects.node_obs(name)) == node_partition
    assert translate.subject_partition("respawn.obs.v1.filler.f1") is None


def test_a_subject_stored_under_another_partition_count_belongs_to_its_appwrappers_partition_now() -> None:
    subject = subjects.appwrapper_obs("ns", "aw", "pod", "p")
    stale = subject.rsplit(".", 1)[0] + f".{subjects.partitions() + 3}"
    assert translate.subject_partition(stale) == subjects.partition("ns", "aw")


def test_a_pods_heartbeat_is_carried_and_kept() -> None:
    obj = pod()
    obj["metadata"]["annotations"]["respawn.dev/heartbeat"] = "2025-01-02T03:04:05Z"
    obs = translate.pod_observation(obj, deleted=False, now=NOW)
    assert obs is not None and obs.heartbeat == "2025-01-02T03:04:05Z"
    kept = translate.kept(obj, PodObservation.KIND)
    # Of the annotations only the heartbeat: the observation made from what is kept is the same.
    assert kept["metadata"]["annotations"] == {"respawn.dev/heartbeat": "2025-01-02T03:04:05Z"}
    same_outcome(obj, PodObservation.KIND)


@pytest.mark.parametrize("value", [None, 42, "x" * 100])
def test_a_heartbeat_that_is_no_string_is_empty_and_a_long_one_is_cut(value: Any) -> None:
    obj = pod()
    obj["metadata"]["annotations"]["respawn.dev/heartbeat"] = value
    obs = translate.pod_observation(obj, deleted=False, now=NOW)
    assert obs is not None
    assert obs.heartbeat == ("x" * 64 if isinstance(value, str) else "")
    same_outcome(obj, PodObservation.KIND)


@pytest.mark.parametrize(
    ("obj", "component"),
    [
        (labelled("Pod", controller(API_VERSION, KIND, "a")), True),
        (labelled("Job", controller("workload.codeflare.dev/v1beta1", KIND, "a")), True),
        # A pod a wrapped Job made: labelled as its AppWrapper's, controlled by the Job.
        (labelled("Pod", controller("batch/v1", "Job", "a-job")), False),
        (labelled("Pod", controller(API_VERSION, KIND, "b")), False),  # another AppWrapper's
        (labelled("Pod", {**controller(API_VERSION, KIND, "a"), "controller": False}), False),
        (labelled("Pod", controller("example.com/v1", KIND, "a")), False),
        (labelled("Pod"), False),
        (labelled("Pod", controller(API_VERSION, KIND, ""), aw=""), False),
    ],
)
def test_only_what_its_appwrapper_controls_is_observed_as_a_component(
    obj: dict[str, Any], component: bool
) -> None:
    assert translate.is_component(obj) is component
    observation = translate.component_observation(obj, deleted=False, now=NOW)
    assert (observation is not None) is component
    # Whatever it is, a labelled object's tombstone can be made: it replaces a state published
    # while it was a component.
    tombstone = translate.former_component_observation(obj, deleted=False, now=NOW)
    assert (tombstone is not None and tombstone.deleted) is bool(obj["metadata"]["labels"][APPWRAPPER_LABEL])
