"""The AppWrapper admission decisions (services/webhook/admission.py) and the webhook's HTTP layer."""

from __future__ import annotations

import base64
import copy
import json
import re
from collections.abc import Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given, settings
from hypothesis import strategies as st

from respawn.testbed import manifests
from services.webhook.admission import (
    AccessCheck,
    AccessResult,
    AdmissionRequest,
    ReviewError,
    TemplateLimits,
    access_checks,
    decode_body,
    mutate,
    parse_review,
    review_body,
    sanitize_label,
    subject_access_review,
    validate,
    validation_response,
)
from services.webhook.server import ServingCert, make_app, parse_options
from shared.appwrapper.constants import APPWRAPPER_LABEL, QUEUE_NAME_LABEL, USER_ID_LABEL, USER_LABEL
from shared.config import load_config
from shared.failures.annotation import FAILURE_PATTERNS_ANNOTATION

NS = "team-a"
ALICE = {
    "username": "system:serviceaccount:team-a:alice",
    "uid": "4f6a0c1e-8b1d-4e55-9d5f-0a1b2c3d4e5f",
    "groups": ["system:serviceaccounts", "system:serviceaccounts:team-a", "system:authenticated"],
    "extra": {"authentication.kubernetes.io/pod-name": ["p"]},
}
# A valid label value: empty, or alphanumeric at both ends with [-_.A-Za-z0-9] between, ≤ 63.
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def pod_template() -> dict[str, Any]:
    return manifests.pod_template(container="c", restart_policy=None)


def deployment(replicas: int = 2) -> dict[str, Any]:
    return manifests.deployment("web", replicas=replicas, template=pod_template())


def job() -> dict[str, Any]:
    return manifests.job("j", template=pod_template())


def appwrapper(
    *templates: dict[str, Any], labels: dict[str, str] | None = None, **component: Any
) -> dict[str, Any]:
    components = ({"template": t, **component} for t in templates)
    return manifests.appwrapper("aw", *components, namespace=NS, labels=labels)


def review(
    obj: dict[str, Any] | None,
    *,
    operation: str = "CREATE",
    old: dict[str, Any] | None = None,
    user: dict[str, Any] | None = None,
    kind: dict[str, str] | None = None,
) -> dict[str, Any]:
    request: dict[str, Any] = {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": kind or {"group": "workload.codeflare.dev", "version": "v1beta2", "kind": "AppWrapper"},
        "resource": {"group": "workload.codeflare.dev", "version": "v1beta2", "resource": "appwrappers"},
        "namespace": NS,
        "name": "aw",
        "operation": operation,
        "userInfo": ALICE if user is None else user,
        "object": obj,
        "oldObject": old,
        "dryRun": False,
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def request_for(obj: dict[str, Any] | None, **kwargs: Any) -> AdmissionRequest:
    return parse_review(review(obj, **kwargs))


def mutated(obj: dict[str, Any], user: dict[str, Any] | None = None) -> dict[str, Any]:
    """``obj`` as the mutating webhook leaves it for ``user`` (ALICE by default): what the API
    server sends to the validating webhook."""
    response = mutate(request_for(obj, user=user), default_queue_name="")
    return apply_patch(obj, list(response.patch))


def validating(obj: dict[str, Any], **kwargs: Any) -> AdmissionRequest:
    """The validating webhook's CREATE review of ``obj``, after the mutating webhook."""
    return request_for(mutated(obj, kwargs.get("user")), **kwargs)


def allow_all(request: AdmissionRequest) -> dict[AccessCheck, AccessResult]:
    return {check: AccessResult(True) for check in access_checks(request)}


def apply_patch(obj: dict[str, Any], patch: list[dict[str, Any]]) -> dict[str, Any]:
    """Just enough RFC 6902 'add' to check what a patch does to the object."""
    result = copy.deepcopy(obj)
    for op in patch:
        assert op["op"] == "add"
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target = result
        for part in parts[:-1]:
            target = target[part]
        target[parts[-1]] = op["value"]
    return result


def decoded_patch(request: AdmissionRequest, default_queue_name: str = "") -> list[dict[str, Any]]:
    body = review_body(
        {"request": {"uid": request.uid}}, mutate(request, default_queue_name=default_queue_name)
    )
    response = body["response"]
    if "patch" not in response:
        return []
    assert response["patchType"] == "JSONPatch"
    patch: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return patch


# ---------------------------------------------------------------------------------------------
# Label sanitising


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("system:serviceaccount:team-a:alice", "system_serviceaccount_team-a_alice"),
        ("Bob Smith <bob@example.com>", "Bob_Smith__bob_example.com"),
        ("kubernetes-admin", "kubernetes-admin"),
        ("4f6a0c1e-8b1d-4e55-9d5f-0a1b2c3d4e5f", "4f6a0c1e-8b1d-4e55-9d5f-0a1b2c3d4e5f"),
        ("-_.oidc:alice._-", "oidc_alice"),
        ("Zoë", "Zo"),  # non-ASCII letters are not label characters
        ("", ""),
        (":::", ""),
        ("a" * 62 + ":b", "a" * 62),  # cut to 63 first, then the trailing '_' trimmed
        ("x" * 100, "x" * 63),
    ],
)
def test_sanitize_label_as_upstream(raw: str, expected: str) -> None:
    assert sanitize_label(raw) == expected


@given(st.text(max_size=200))
def test_sanitized_values_are_valid_label_values(raw: str) -> None:
    value = sanitize_label(raw)
    assert len(value) <= 63
    assert LABEL_VALUE.match(value)
    assert sanitize_label(value) == value


# ---------------------------------------------------------------------------------------------
# Reading reviews


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ([], "JSON object"),
        ({"apiVersion": "v1", "kind": "Pod"}, "expected an AdmissionReview"),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}, "no request"),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"kind": {}}}, "uid"),
        (
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u"}},
            "request.kind",
        ),
    ],
)
def test_parse_review_names_what_is_wrong(body: Any, problem: str) -> None:
    with pytest.raises(ReviewError, match=re.escape(problem)):
        parse_review(body)


def test_parse_review_rejects_malformed_user_info() -> None:
    body = review(appwrapper(deployment()), user={"username": "a", "groups": "not-a-list"})
    with pytest.raises(ReviewError, match="groups"):
        parse_review(body)


def test_parse_review_reads_user_and_objects() -> None:
    request = request_for(appwrapper(deployment()))
    assert request.uid == "705ab4f5-6393-11e8-b7cc-42010a800002"
    assert request.operation == "CREATE"
    assert request.namespace == NS
    assert request.user.username == ALICE["username"]
    assert request.user.groups == tuple(ALICE["groups"])
    assert request.user.extra_dict() == ALICE["extra"]
    assert request.object is not None
    assert request.old_object is None


def test_review_body_echoes_uid_even_for_malformed_reviews() -> None:
    from services.webhook.admission import refusal

    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "abc"}}
    answer = review_body(body, refusal("nope"))
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"] == {
        "uid": "abc",
        "allowed": False,
        "status": {"code": 400, "reason": "BadRequest", "message": "nope"},
    }
    assert review_body(b"garbage", refusal("x"))["response"]["uid"] == ""
    v1beta1 = {"apiVersion": "admission.k8s.io/v1beta1", "request": {"uid": "u"}}
    assert review_body(v1beta1, refusal("x"))["apiVersion"] == "admission.k8s.io/v1beta1"


# ---------------------------------------------------------------------------------------------
# Mutation


def test_mutate_adds_labels_map_when_there_is_none() -> None:
    obj = appwrapper(deployment())
    patch = decoded_patch(request_for(obj), "default-queue")
    assert patch == [
        {
            "op": "add",
            "path": "/metadata/labels",
            "value": {
                QUEUE_NAME_LABEL: "default-queue",
                USER_LABEL: "system_serviceaccount_team-a_alice",
                USER_ID_LABEL: ALICE["uid"],
            },
        }
    ]


def test_mutate_adds_escaped_keys_to_existing_labels() -> None:
    obj = appwrapper(deployment(), labels={"app": "web"})
    patch = decoded_patch(request_for(obj), "default-queue")
    assert [op["path"] for op in patch] == [
        "/metadata/labels/kueue.x-k8s.io~1queue-name",
        "/metadata/labels/workload.codeflare.dev~1user",
        "/metadata/labels/workload.codeflare.dev~1userid",
    ]
    assert apply_patch(obj, patch)["metadata"]["labels"] == {
        "app": "web",
        QUEUE_NAME_LABEL: "default-queue",
        USER_LABEL: "system_serviceaccount_team-a_alice",
        USER_ID_LABEL: ALICE["uid"],
    }


@pytest.mark.parametrize("given_queue", ["team-queue", ""])
def test_mutate_never_overrides_a_given_queue(given_queue: str) -> None:
    obj = appwrapper(deployment(), labels={QUEUE_NAME_LABEL: given_queue})
    patched = apply_patch(obj, decoded_patch(request_for(obj), "default-queue"))
    assert patched["metadata"]["labels"][QUEUE_NAME_LABEL] == given_queue


def test_mutate_without_default_queue_sets_only_user_labels() -> None:
    obj = appwrapper(deployment())
    patched = apply_patch(obj, decoded_patch(request_for(obj), ""))
    assert set(patched["metadata"]["labels"]) == {USER_LABEL, USER_ID_LABEL}


def test_mutate_replaces_user_labels_given_by_the_user_with_a_warning() -> None:
    obj = appwrapper(deployment(), labels={USER_LABEL: "someone-else", USER_ID_LABEL: "0"})
    request = request_for(obj)
    response = mutate(request, default_queue_name="")
    patched = apply_patch(obj, list(response.patch))
    assert patched["metadata"]["labels"] == {
        USER_LABEL: "system_serviceaccount_team-a_alice",
        USER_ID_LABEL: ALICE["uid"],
    }
    assert len(response.warnings) == 2
    assert all("replaced" in w for w in response.warnings)


def test_mutate_sets_empty_uid_label_for_users_without_uid() -> None:
    # Client-certificate users have no uid; upstream still sets the label (to "").
    obj = appwrapper(deployment())
    request = request_for(obj, user={"username": "kubernetes-admin", "groups": ["system:masters"]})
    labels = apply_patch(obj, decoded_patch(request))["metadata"]["labels"]
    assert labels == {USER_LABEL: "kubernetes-admin", USER_ID_LABEL: ""}


def test_mutate_sends_no_patch_when_nothing_changes() -> None:
    labels = {
        QUEUE_NAME_LABEL: "q",
        USER_LABEL: "system_serviceaccount_team-a_alice",
        USER_ID_LABEL: ALICE["uid"],
    }
    response = mutate(request_for(appwrapper(deployment(), labels=labels)), default_queue_name="d")
    assert response.allowed
    assert response.patch == ()
    assert "patch" not in response.to_json("u")


def test_mutate_leaves_updates_and_malformed_objects_alone() -> None:
    obj = appwrapper(deployment())
    assert mutate(request_for(obj, operation="UPDATE", old=obj), default_queue_name="d").patch == ()
    broken = {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper", "metadata": "x"}
    response = mutate(request_for(broken), default_queue_name="d")
    assert response.allowed
    assert response.patch == ()


# ---------------------------------------------------------------------------------------------
# Validation: access checks


def test_one_access_check_per_wrapped_kind_in_the_appwrapper_namespace() -> None:
    request = validating(appwrapper(deployment(), job(), deployment()))
    checks = access_checks(request)
    assert [(c.api_version, c.kind, c.namespace) for c in checks] == [
        ("apps/v1", "Deployment", NS),
        ("batch/v1", "Job", NS),
    ]
    assert all(c.user == request.user for c in checks)


def test_no_access_checks_for_updates() -> None:
    obj = appwrapper(deployment())
    assert access_checks(request_for(obj, operation="UPDATE", old=obj)) == []


def test_subject_access_review_carries_the_whole_user() -> None:
    request = validating(appwrapper(deployment()))
    (check,) = access_checks(request)
    sar = subject_access_review(check, group="apps", version="v1", resource="deployments")
    assert sar == {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "resourceAttributes": {
                "namespace": NS,
                "verb": "create",
                "group": "apps",
                "version": "v1",
                "resource": "deployments",
            },
            "user": ALICE["username"],
            "groups": ALICE["groups"],
            "uid": ALICE["uid"],
            "extra": ALICE["extra"],
        },
    }


def test_denied_kind_rejects_with_a_message_naming_it() -> None:
    request = validating(appwrapper(job(), deployment()))
    access = {c: AccessResult(c.kind != "Deployment") for c in access_checks(request)}
    response = validation_response(request, access)
    assert not response.allowed
    assert response.code == 403
    assert response.reason == "Forbidden"
    assert response.message == (
        "spec.components[1].template: Forbidden: "
        "User system:serviceaccount:team-a:alice is not authorized to create Deployment in team-a"
    )


def test_every_component_of_a_denied_kind_is_named() -> None:
    request = validating(appwrapper(deployment(), deployment()))
    response = validation_response(request, {c: AccessResult(False) for c in access_checks(request)})
    assert "spec.components[0].template" in response.message
    assert "spec.components[1].template" in response.message


def test_permitted_kinds_are_admitted() -> None:
    request = validating(appwrapper(job(), deployment()))
    response = validation_response(request, allow_all(request))
    assert response.allowed
    assert response.to_json("u") == {"uid": "u", "allowed": True}


def test_a_failed_or_missing_access_check_never_counts_as_permission() -> None:
    request = validating(appwrapper(deployment()))
    (check,) = access_checks(request)
    failed = validation_response(request, {check: AccessResult(False, error="503 ServiceUnavailable: down")})
    assert not failed.allowed
    assert failed.code == 500
    assert "Deployment" in failed.message
    assert "503 ServiceUnavailable: down" in failed.message
    missing = validation_response(request, {})
    assert not missing.allowed
    assert missing.code == 500


async def test_validate_asks_the_authorizer_and_treats_its_exceptions_as_failures() -> None:
    request = validating(appwrapper(job(), deployment()))
    asked: list[AccessCheck] = []

    async def authorize(check: AccessCheck) -> AccessResult:
        asked.append(check)
        if check.kind == "Deployment":
            raise RuntimeError("boom")
        return AccessResult(True)

    response = await validate(request, authorize)
    assert sorted(c.kind for c in asked) == ["Deployment", "Job"]
    assert not response.allowed
    assert "spec.components[1].template: Internal error" in response.message
    assert "boom" in response.message
    assert "spec.components[0]" not in response.message


# ---------------------------------------------------------------------------------------------
# Validation: pod sets


def validate_allowed_access(obj: dict[str, Any]) -> Any:
    request = validating(obj)
    return validation_response(request, allow_all(request))


def test_pod_set_path_that_does_not_exist_is_rejected() -> None:
    response = validate_allowed_access(
        appwrapper(job(), podSets=[{"path": "template.spec.nosuch", "replicas": 1}])
    )
    assert not response.allowed
    assert response.code == 422
    assert response.reason == "Invalid"
    assert response.message.startswith(
        "spec.components[0].podSets[0].path: Invalid: path does not refer to a v1.PodSpecTemplate:"
    )
    assert "missing field 'nosuch'" in response.message


def test_pod_set_path_that_is_not_a_pod_template_is_rejected() -> None:
    response = validate_allowed_access(
        appwrapper(deployment(), podSets=[{"path": "template.spec", "replicas": 2}])
    )
    assert not response.allowed
    assert "spec.components[0].podSets[0].path: Invalid: path does not refer to a v1.PodSpecTemplate" in (
        response.message
    )


def test_declared_pod_sets_must_match_inference() -> None:
    too_many = validate_allowed_access(
        appwrapper(
            deployment(),
            podSets=[{"path": "template.spec.template", "replicas": 2}, {"path": "template.spec.template"}],
        )
    )
    assert "DeclaredPodSet count 2 differs from inferred count 1" in too_many.message
    wrong_replicas = validate_allowed_access(
        appwrapper(deployment(replicas=2), podSets=[{"path": "template.spec.template", "replicas": 5}])
    )
    assert not wrong_replicas.allowed
    assert "replica count 5 differs from inferred count 2" in wrong_replicas.message


def test_matching_declared_pod_sets_are_admitted() -> None:
    response = validate_allowed_access(
        appwrapper(deployment(replicas=2), podSets=[{"path": "template.spec.template", "replicas": 2}])
    )
    assert response.allowed


def test_rights_and_pod_set_problems_are_reported_together() -> None:
    request = validating(appwrapper(deployment(), podSets=[{"path": "template.spec.x"}]))
    response = validation_response(request, {c: AccessResult(False) for c in access_checks(request)})
    assert "not authorized to create Deployment" in response.message
    assert "missing field 'x'" in response.message
    assert response.code == 422  # malformed content outranks rights


def test_component_without_kind_is_invalid_and_others_still_checked() -> None:
    obj = appwrapper({"apiVersion": "v1", "metadata": {}}, job())
    obj["spec"]["components"][1]["podSets"] = [{"path": "template.spec.nope"}]
    response = validate_allowed_access(obj)
    assert not response.allowed
    assert "spec.components[0].template: Invalid: apiVersion and kind are required" in response.message
    assert "spec.components[1].podSets[0].path" in response.message


def test_components_that_are_not_a_list_are_refused() -> None:
    obj = appwrapper(job())
    obj["spec"]["components"] = {"not": "a list"}
    response = validate_allowed_access(obj)
    assert not response.allowed
    assert "spec.components must be a list" in response.message


# ---------------------------------------------------------------------------------------------
# Validation: creator labels, reserved labels, template limits


def test_creator_labels_must_name_the_requesting_user() -> None:
    # A mutating webhook that did not run (or was bypassed) leaves labels that do not name the
    # creator: validation refuses them, so a failed mutation cannot let a forged creator in.
    for labels in (None, {USER_LABEL: "someone-else", USER_ID_LABEL: ALICE["uid"]}):
        request = request_for(appwrapper(job(), labels=labels))
        response = validation_response(request, allow_all(request))
        assert not response.allowed
        assert response.code == 403
        assert (
            "metadata.labels[workload.codeflare.dev/user]: Forbidden: must be "
            "'system_serviceaccount_team-a_alice', set from the requesting user by the mutating webhook "
            "respawn-appwrapper"
        ) in response.message
    assert (
        "(found none; is that webhook registered?)"
        in validation_response(request_for(appwrapper(job())), {}).message
    )
    request = validating(appwrapper(job()))
    assert validation_response(request, allow_all(request)).allowed


def test_creator_label_of_a_user_without_uid_is_empty() -> None:
    admin = {"username": "kubernetes-admin", "groups": ["system:masters"]}
    request = validating(appwrapper(job()), user=admin)
    assert request.object is not None and _labels_of(request.object)[USER_ID_LABEL] == ""
    assert validation_response(request, allow_all(request)).allowed


def _labels_of(obj: Any) -> dict[str, str]:
    labels: dict[str, str] = obj["metadata"]["labels"]
    return labels


def with_pod_labels(template: dict[str, Any], **labels: str) -> dict[str, Any]:
    template = copy.deepcopy(template)
    template["spec"]["template"].setdefault("metadata", {})["labels"] = labels
    return template


def test_templates_may_not_count_their_pods_as_another_appwrappers() -> None:
    # A pod template of a kind Respawn does not know would otherwise make pods that the watcher
    # attributes to "victim": their failures would reset it.
    unknown = {
        "apiVersion": "example.com/v1",
        "kind": "Trainer",
        "metadata": {"name": "t"},
        "spec": {
            "template": pod_template(),  # the declared pod set
            "workers": [{"template": {"metadata": {"labels": {APPWRAPPER_LABEL: "victim"}}}}],
        },
    }
    obj = appwrapper(job())
    obj["spec"]["components"].append({"template": unknown, "podSets": [{"path": "template.spec.template"}]})
    response = validate_allowed_access(obj)
    assert not response.allowed
    assert response.code == 403
    assert response.message == (
        "spec.components[1].template.spec.workers[0].template.metadata"
        ".labels[workload.codeflare.dev/appwrapper]: Forbidden: Respawn sets this label to the "
        "AppWrapper's name (aw) to count pods as its own; a template may not set it to 'victim'"
    )
    top = job()
    top["metadata"]["labels"] = {APPWRAPPER_LABEL: "victim"}
    assert "spec.components[0].template.metadata.labels[workload.codeflare.dev/appwrapper]" in (
        validate_allowed_access(appwrapper(top)).message
    )
    # Its own name is what lifecycle writes anyway.
    assert validate_allowed_access(appwrapper(with_pod_labels(job(), **{APPWRAPPER_LABEL: "aw"}))).allowed


def test_respawn_prefix_is_reserved_in_template_labels_and_annotations() -> None:
    template = with_pod_labels(job(), **{"respawn.dev/excluded-nodes": "n1"})
    template["metadata"]["annotations"] = {"respawn.dev/anything": "x", "sim.respawn.dev/fail-after": "1s"}
    response = validate_allowed_access(appwrapper(template))
    assert not response.allowed
    assert (
        "spec.components[0].template.spec.template.metadata.labels[respawn.dev/excluded-nodes]: "
        "Forbidden: the prefix respawn.dev/ is reserved for Respawn"
    ) in response.message
    assert "metadata.annotations[respawn.dev/anything]" in response.message
    assert "sim.respawn.dev" not in response.message  # another domain


def nested(depth: int) -> dict[str, Any]:
    """A Job whose pod template carries an extra field nesting ``depth`` levels in all."""
    template = job()
    # The template is level 1, its spec 2, the pod template 3 and the pod spec 4; "x" adds one
    # level per object.
    extra: Any = "leaf"
    for _ in range(depth - 4):
        extra = {"x": extra}
    template["spec"]["template"]["spec"]["x"] = extra
    return template


@pytest.mark.parametrize("depth", [64, 65, 300])
def test_templates_nested_past_the_limit_are_refused_naming_component_and_limit(depth: int) -> None:
    response = validate_allowed_access(appwrapper(job(), nested(depth)))
    if depth <= TemplateLimits().max_depth:
        assert response.allowed, response.message
        return
    assert not response.allowed
    assert response.code == 422
    # The path to the first level past the limit, shortened in the middle.
    assert response.message == (
        "spec.components[1].template: Invalid: nested more than 64 levels deep "
        "(at spec.components[1].template.spec.template.spec.x.x.x.<52 more>.x.x.x.x.x.x); "
        "the limit is admission.maxTemplateDepth=64"
    )
    # Nothing else is reported (or worked out) for such an AppWrapper.
    assert response.message.count("spec.components") == 2


async def test_oversized_appwrappers_are_refused_before_any_access_check() -> None:
    asked: list[AccessCheck] = []

    async def authorize(check: AccessCheck) -> AccessResult:
        asked.append(check)
        return AccessResult(True)

    big = job()
    big["spec"]["template"]["metadata"] = {"annotations": {"blob": "x" * 300_000}}
    request = validating(appwrapper(job(), big, deployment()))
    response = await validate(request, authorize, TemplateLimits(max_bytes=256 * 1024))
    assert not response.allowed
    assert response.code == 422
    assert re.fullmatch(
        r"spec\.components: Invalid: the component templates take \d+ bytes as JSON \(the largest, "
        r"spec\.components\[1\]\.template, \d+\); the limit is admission\.maxTemplateBytes=262144",
        response.message,
    ), response.message
    assert asked == []
    assert (await validate(request, authorize)).allowed  # under the default 512 KiB
    assert asked


def test_template_limits_default_to_the_configuration_defaults() -> None:
    config = load_config(env={})
    assert TemplateLimits() == TemplateLimits(
        config.admission.max_template_depth, config.admission.max_template_bytes
    )


# ---------------------------------------------------------------------------------------------
# Hostile input: every answer is a decision, never an exception


def test_decode_body_refuses_what_it_cannot_read_with_a_reason() -> None:
    with pytest.raises(ReviewError, match="nested too deeply to be read"):
        decode_body(b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(ReviewError, match="not JSON"):
        decode_body(b"\xff\xfe{")
    with pytest.raises(ReviewError, match="not JSON"):
        decode_body(b'{"a": ')
    assert decode_body(b'{"a": [1]}') == {"a": [1]}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=40,
)
# Keys that send a value down the webhook's code paths.
review_keys = st.sampled_from(
    [
        "apiVersion",
        "kind",
        "request",
        "uid",
        "operation",
        "object",
        "oldObject",
        "userInfo",
        "metadata",
        "labels",
        "spec",
        "components",
        "template",
        "podSets",
        "path",
        "namespace",
        "name",
        "username",
        "x",
    ]
)


def deep(depth: int, leaf: Any, kinds: list[bool]) -> Any:
    value = leaf
    for i in range(depth):
        value = {"metadata": value} if kinds[i % len(kinds)] else [value]
    return value


def answer_is_a_decision(answer: Any) -> None:
    assert isinstance(answer["allowed"], bool)
    if not answer["allowed"]:
        assert isinstance(answer["status"]["message"], str) and answer["status"]["message"]
        assert not answer["status"]["message"].startswith("admission check failed"), answer


@given(
    obj=json_values,
    template=json_values,
    operation=st.sampled_from(["CREATE", "UPDATE", "DELETE", "CONNECT", 7]),
    depth=st.integers(0, 1500),
    kinds=st.lists(st.booleans(), min_size=1, max_size=4),
)
def test_validation_never_raises_on_any_object(
    obj: Any, template: Any, operation: Any, depth: int, kinds: list[bool]
) -> None:
    valid = mutated(appwrapper(job()))
    valid["spec"]["components"].append({"template": deep(depth, template, kinds)})
    for candidate in (obj, valid):
        body = review(None)
        body["request"]["object"] = candidate
        body["request"]["oldObject"] = candidate
        body["request"]["operation"] = operation
        try:
            request = parse_review(body)
        except ReviewError:
            continue
        response = validation_response(request, allow_all(request))
        answer_is_a_decision(response.to_json("u"))
        # ``depth`` wrapping levels alone are that deep (the leaf may add more).
        if operation == "CREATE" and candidate is valid and depth > TemplateLimits().max_depth:
            assert "admission.maxTemplateDepth=64" in response.message


@settings(max_examples=60, deadline=None)
@given(
    body=st.one_of(
        json_values,
        st.dictionaries(review_keys, json_values, max_size=6),
        st.builds(lambda v: review(v), json_values),
    ),
    depth=st.integers(0, 3000),
    kinds=st.lists(st.booleans(), min_size=1, max_size=3),
)
async def test_http_answers_every_body_with_a_decision(body: Any, depth: int, kinds: list[bool]) -> None:
    valid = mutated(appwrapper(job()))
    # Decodable (the server's decoder stops near 1,000 levels), so the webhook judges it.
    valid["spec"]["components"].append({"template": deep(min(depth, 900), {"x": body}, kinds)})
    async with client() as c:
        for payload in (body, deep(depth, body, kinds), review(valid)):
            try:
                data = json.dumps(payload).encode()
            except RecursionError:  # the test's own encoder; build the text by hand instead
                data = b"[" * depth + json.dumps(body).encode() + b"]" * depth
            for path in ("/validate-appwrapper", "/mutate-appwrapper"):
                resp = await c.post(path, data=data)
                assert resp.status == 200
                answer = (await resp.json())["response"]
                answer_is_a_decision(answer)
                if path == "/mutate-appwrapper" and not isinstance(payload, dict):
                    assert answer == {"uid": "", "allowed": True}
                if path == "/validate-appwrapper" and payload is not body and min(depth, 900) > 64:
                    assert answer["allowed"] is False
                    if isinstance(payload, dict) and payload.get("kind") == "AdmissionReview":
                        assert "admission.maxTemplateDepth=64" in answer["status"]["message"]


async def test_http_refuses_bodies_too_deep_or_too_large_to_read() -> None:
    async with client() as c:
        deep_body = b"[" * 50_000 + b"]" * 50_000
        answer = (await (await c.post("/validate-appwrapper", data=deep_body)).json())["response"]
        assert answer["allowed"] is False
        assert answer["status"]["message"] == (
            "malformed admission review: the body is nested too deeply to be read "
            "(JSON nested more than about 1000 levels)"
        )
        assert (await (await c.post("/mutate-appwrapper", data=deep_body)).json())["response"]["allowed"]
        huge = b'{"apiVersion": "' + b"x" * (9 * 1024 * 1024) + b'"}'
        resp = await c.post("/validate-appwrapper", data=huge)
        assert resp.status == 200
        answer = (await resp.json())["response"]
        assert answer["allowed"] is False
        assert answer["status"]["message"] == (
            f"malformed admission review: the body is larger than {8 * 1024 * 1024} bytes"
        )
        # The server is still there for the next request.
        ok = await c.post("/validate-appwrapper", json=review(mutated(appwrapper(job()))))
        assert (await ok.json())["response"]["allowed"] is True


# ---------------------------------------------------------------------------------------------
# Validation: updates and other operations


def labelled(**labels: str) -> dict[str, Any]:
    return appwrapper(deployment(), labels=labels)


@pytest.mark.parametrize("key", [USER_LABEL, USER_ID_LABEL])
def test_user_labels_are_immutable(key: str) -> None:
    old = labelled(**{USER_LABEL: "alice", USER_ID_LABEL: "1"})
    for new_labels in (
        {**old["metadata"]["labels"], key: "mallory"},
        {k: v for k, v in old["metadata"]["labels"].items() if k != key},
    ):
        new = copy.deepcopy(old)
        new["metadata"]["labels"] = new_labels
        response = validation_response(request_for(new, operation="UPDATE", old=old), {})
        assert not response.allowed
        assert response.code == 403
        assert response.message == f"metadata.labels[{key}]: Forbidden: attempt to change immutable field"


def test_user_labels_cannot_be_added_after_creation() -> None:
    old = labelled()
    new = labelled(**{USER_LABEL: "alice"})
    assert not validation_response(request_for(new, operation="UPDATE", old=old), {}).allowed


def test_other_updates_are_allowed() -> None:
    old = labelled(**{USER_LABEL: "alice", USER_ID_LABEL: "1"})
    new = copy.deepcopy(old)
    new["metadata"]["labels"]["team"] = "x"
    new["metadata"]["finalizers"] = []
    new["spec"]["suspend"] = True
    assert validation_response(request_for(new, operation="UPDATE", old=old), {}).allowed


def test_update_without_old_object_is_refused() -> None:
    response = validation_response(request_for(labelled(), operation="UPDATE"), {})
    assert not response.allowed
    assert "oldObject" in response.message


def test_other_kinds_are_refused_and_deletes_allowed() -> None:
    pod = request_for({"apiVersion": "v1", "kind": "Pod"}, kind={"group": "", "version": "v1", "kind": "Pod"})
    response = validation_response(pod, {})
    assert not response.allowed
    assert (
        response.message == "this webhook admits only workload.codeflare.dev/v1beta2 AppWrapper, not v1 Pod"
    )
    assert validation_response(request_for(None, operation="DELETE", old=labelled()), {}).allowed


# ---------------------------------------------------------------------------------------------
# The HTTP layer


@asynccontextmanager
async def client(authorize: Any = None, default_queue_name: str = "q") -> Any:
    async def allow(_: AccessCheck) -> AccessResult:
        return AccessResult(True)

    app = make_app(authorize or allow, default_queue_name=default_queue_name)
    async with TestClient(TestServer(app)) as c:
        yield c


async def test_http_validate_and_mutate_answer_reviews() -> None:
    async with client() as c:
        resp = await c.post("/validate-appwrapper", json=review(mutated(appwrapper(deployment()))))
        assert resp.status == 200
        assert (await resp.json())["response"] == {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "allowed": True,
        }
        resp = await c.post("/mutate-appwrapper", json=review(appwrapper(deployment())))
        answer = (await resp.json())["response"]
        assert answer["allowed"] is True
        patch = json.loads(base64.b64decode(answer["patch"]))
        assert patch[0]["value"][QUEUE_NAME_LABEL] == "q"
        assert (await (await c.get("/healthz")).text()) == "ok\n"


async def test_http_malformed_input_is_answered_not_crashed_on() -> None:
    async with client() as c:
        for body in (b"{not json", b"[]", json.dumps({"apiVersion": "admission.k8s.io/v1"}).encode()):
            resp = await c.post("/validate-appwrapper", data=body)
            assert resp.status == 200
            answer = (await resp.json())["response"]
            assert answer["allowed"] is False
            assert answer["status"]["message"].startswith("malformed admission review: ")
            resp = await c.post("/mutate-appwrapper", data=body)
            assert resp.status == 200
            assert (await resp.json())["response"] == {"uid": "", "allowed": True}
        # The uid is echoed when there is one, so the API server shows the message.
        partial = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "x1"}}
        answer = (await (await c.post("/validate-appwrapper", json=partial)).json())["response"]
        assert answer["uid"] == "x1"
        assert "request.kind" in answer["status"]["message"]


async def test_http_authorizer_crash_is_a_refusal() -> None:
    async def broken(_: AccessCheck) -> AccessResult:
        raise KeyError("x")

    async with client(broken) as c:
        answer = (await (await c.post("/validate-appwrapper", json=review(appwrapper(job())))).json())[
            "response"
        ]
        assert answer["allowed"] is False
        assert answer["status"]["code"] == 500


# ---------------------------------------------------------------------------------------------
# Options and certificates


def test_options_from_flags_and_environment() -> None:
    env = {"RESPAWN_WEBHOOK_LISTEN_PORT": "8443", "RESPAWN_WEBHOOK_CERT_FILE": "/c/tls.crt"}
    options = parse_options(["--key-file", "/k/tls.key"], env)
    assert options.port == 8443
    assert str(options.cert_file) == "/c/tls.crt"
    assert str(options.key_file) == "/k/tls.key"
    assert parse_options(["--port", "1"], env).port == 1
    assert parse_options([], {}).port == 9443
    with pytest.raises(SystemExit):
        parse_options([], {"RESPAWN_WEBHOOK_LISTEN_PORT": "tcp://10.0.0.7:443"})


@pytest.fixture
def cert_files(tmp_path: Any) -> Iterator[tuple[Any, Any]]:
    from respawn.testbed.pki import serving_bundle

    bundle = serving_bundle("webhook.test")
    crt, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    crt.write_bytes(bundle["tls.crt"])
    key.write_bytes(bundle["tls.key"])
    yield crt, key


def test_serving_cert_reloads_only_when_files_change(cert_files: tuple[Any, Any]) -> None:
    import os

    from respawn.testbed.pki import serving_bundle

    crt, key = cert_files
    cert = ServingCert(crt, key)
    assert not cert.reload_if_changed()
    bundle = serving_bundle("webhook.test")
    crt.write_bytes(bundle["tls.crt"])
    key.write_bytes(bundle["tls.key"])
    later = crt.stat().st_mtime_ns + 1_000_000_000
    os.utime(crt, ns=(later, later))
    assert cert.reload_if_changed()
    # A mismatched pair (key rotated, cert not yet) keeps the current certificate.
    key.write_bytes(serving_bundle("other.test")["tls.key"])
    later += 1_000_000_000
    os.utime(key, ns=(later, later))
    assert not cert.reload_if_changed()


# ---------------------------------------------------------------- failure patterns

GOOD_PATTERNS = '[{"exitCodes": [3], "class": "Permanent", "code": "BadInput"}]'
BAD_PATTERNS = '[{"exitCodes": [3], "class": "Fatal"}]'


def with_patterns(value: str | None) -> dict[str, Any]:
    obj = appwrapper(job())
    if value is not None:
        obj["metadata"].setdefault("annotations", {})[FAILURE_PATTERNS_ANNOTATION] = value
    return obj


def test_valid_failure_patterns_are_admitted() -> None:
    request = validating(with_patterns(GOOD_PATTERNS))
    assert validation_response(request, allow_all(request)).allowed


def test_invalid_failure_patterns_are_refused_with_the_reason() -> None:
    request = validating(with_patterns(BAD_PATTERNS))
    response = validation_response(request, allow_all(request))
    assert not response.allowed
    assert response.code == 422
    assert response.message.startswith(
        f"metadata.annotations[{FAILURE_PATTERNS_ANNOTATION}]: Invalid: "
        f"{FAILURE_PATTERNS_ANNOTATION} refused: [0].class: Input should be"
    )


def test_an_update_is_refused_only_for_a_changed_invalid_value() -> None:
    old = mutated(with_patterns(BAD_PATTERNS))
    unchanged = copy.deepcopy(old)
    unchanged["metadata"]["labels"]["team"] = "x"
    assert validation_response(request_for(unchanged, operation="UPDATE", old=old), {}).allowed
    good = mutated(with_patterns(GOOD_PATTERNS))
    broken = copy.deepcopy(good)
    broken["metadata"]["annotations"][FAILURE_PATTERNS_ANNOTATION] = "version: 2\npatterns: []"
    response = validation_response(request_for(broken, operation="UPDATE", old=good), {})
    assert not response.allowed
    assert "version 2 is not supported" in response.message
