"""Admission decisions for AppWrappers: what the mutating and validating webhooks answer.

Pure functions over the AdmissionReview JSON the API server sends (admission.k8s.io/v1). The
only outside knowledge validation needs, whether the requesting user may create each wrapped
kind, comes in as data (:func:`validation_response`) or through an injected callable
(:func:`validate`); the HTTP server and the SubjectAccessReviews live in ``webhook.py``.

What is checked here is what the CRD's own rules cannot express: that the user could create the
wrapped resources themselves (otherwise an AppWrapper would let anyone create anything the
controller may create), that declared pod sets point at pod templates and agree with what can be
inferred, that the templates are neither too deep nor too large for the services to handle (CEL
can measure neither), that they do not set the labels by which Respawn attributes pods to
AppWrappers, and that the creator labels name the creator. On UPDATE the CRD already keeps
templates, pod sets and managedBy immutable; what remains is the user labels, which no schema rule
can see.

Every function here must answer hostile input (any JSON, nested as deep as the decoder allows)
with a decision or :class:`ReviewError`, never another exception: walks over templates are
iterative, and sizes are measured only once the depth is known to be bounded.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

from pydantic import ValidationError

from shared.appwrapper.constants import (
    API_VERSION,
    APPWRAPPER_LABEL,
    COMPLETION_POLICY_ANNOTATION,
    GROUP,
    KIND,
    QUEUE_NAME_LABEL,
    RESPAWN_PREFIX,
    STOP_ANNOTATION,
    USER_ID_LABEL,
    USER_LABEL,
    VERSION,
)
from shared.appwrapper.control import parse_completion_policy, parse_stop
from shared.appwrapper.model import AppWrapperComponent
from shared.appwrapper.podsets import component_pod_sets, validate_appwrapper_pod_sets, validate_pod_sets
from shared.failures.annotation import FAILURE_PATTERNS_ANNOTATION, workload_patterns

__all__ = [
    "REVIEW_API_VERSION",
    "AccessCheck",
    "AccessResult",
    "AdmissionRequest",
    "AdmissionResponse",
    "Authorizer",
    "ReviewError",
    "TemplateLimits",
    "UserInfo",
    "access_checks",
    "decode_body",
    "mutate",
    "parse_review",
    "refusal",
    "review_body",
    "sanitize_label",
    "subject_access_review",
    "validate",
    "validation_response",
]

REVIEW_API_VERSION: Final = "admission.k8s.io/v1"
# v1beta1 has the same request and response shapes; answering in the version asked keeps an
# older registration working.
_REVIEW_API_VERSIONS: Final = (REVIEW_API_VERSION, "admission.k8s.io/v1beta1")
_MAX_LABEL_VALUE: Final = 63
# Go's \w is ASCII only; upstream's sanitiser replaces everything else, one character at a time.
_NOT_LABEL_CHAR: Final = re.compile(r"[^-_.\w]", re.ASCII)


class ReviewError(ValueError):
    """A body that is not a usable AppWrapper AdmissionReview."""


def decode_body(raw: bytes) -> Any:
    """The JSON of a request body; :class:`ReviewError` says why it cannot be read.

    Python's JSON decoder recurses once per level of nesting and raises RecursionError near the
    interpreter's recursion limit (about 1,000 levels): a few kilobytes of brackets would
    otherwise end the request with an unexplained internal error.
    """
    try:
        return json.loads(raw)
    except RecursionError:
        raise ReviewError(
            "the body is nested too deeply to be read (JSON nested more than about 1000 levels)"
        ) from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ReviewError(f"the body is not JSON: {exc}") from None


@dataclass(frozen=True, slots=True)
class TemplateLimits:
    """How deep and how large component templates may be (``admission.*`` in the configuration).

    Depth counts nested objects and arrays, the template itself being level 1. Size is the
    compact JSON encoding of all templates of one AppWrapper together, in bytes (UTF-8).
    """

    max_depth: int = 64
    max_bytes: int = 512 * 1024


@dataclass(frozen=True, slots=True)
class UserInfo:
    """The requesting user as the API server authenticated them."""

    username: str = ""
    uid: str = ""
    groups: tuple[str, ...] = ()
    # Sorted pairs rather than a dict so that checks carrying a user can be dictionary keys.
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def extra_dict(self) -> dict[str, list[str]]:
        return {key: list(values) for key, values in self.extra}


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    uid: str
    operation: str
    namespace: str
    name: str
    user: UserInfo
    object: Mapping[str, Any] | None
    old_object: Mapping[str, Any] | None
    kind: tuple[str, str, str]  # (group, version, kind) of the object under review


class ErrorType(StrEnum):
    """The field-error types used in messages, spelt as the API server spells them."""

    INVALID = "Invalid"
    FORBIDDEN = "Forbidden"
    INTERNAL = "Internal error"


@dataclass(frozen=True, slots=True)
class _FieldError:
    path: str
    type: ErrorType
    detail: str

    def __str__(self) -> str:
        return f"{self.path}: {self.type}: {self.detail}"


@dataclass(frozen=True, slots=True)
class AdmissionResponse:
    allowed: bool
    message: str = ""
    code: int = 200
    reason: str = ""
    patch: tuple[dict[str, Any], ...] = ()
    warnings: tuple[str, ...] = ()

    def to_json(self, uid: str) -> dict[str, Any]:
        body: dict[str, Any] = {"uid": uid, "allowed": self.allowed}
        if not self.allowed:
            body["status"] = {"code": self.code, "reason": self.reason, "message": self.message}
        if self.patch:
            body["patchType"] = "JSONPatch"
            body["patch"] = base64.b64encode(json.dumps(list(self.patch)).encode()).decode()
        if self.warnings:
            body["warnings"] = list(self.warnings)
        return body


def review_body(body: Any, response: AdmissionResponse) -> dict[str, Any]:
    """The AdmissionReview answering ``body`` (the review as received, however malformed).

    The answer must carry the request's uid, or the API server discards it and reports a
    protocol error instead of the message; so the uid is echoed whenever one can be found.
    """
    request = body.get("request") if isinstance(body, Mapping) else None
    uid = request.get("uid") if isinstance(request, Mapping) else None
    api_version = body.get("apiVersion") if isinstance(body, Mapping) else None
    return {
        "apiVersion": api_version if api_version in _REVIEW_API_VERSIONS else REVIEW_API_VERSION,
        "kind": "AdmissionReview",
        "response": response.to_json(uid if isinstance(uid, str) else ""),
    }


# ---------------------------------------------------------------------------------------------
# Reading the review


def _user(raw: Any) -> UserInfo:
    if not isinstance(raw, Mapping):
        raise ReviewError("request.userInfo must be an object")
    username, uid = raw.get("username", ""), raw.get("uid", "")
    groups, extra = raw.get("groups") or [], raw.get("extra") or {}
    if not isinstance(username, str) or not isinstance(uid, str):
        raise ReviewError("request.userInfo.username and .uid must be strings")
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        raise ReviewError("request.userInfo.groups must be a list of strings")
    if not isinstance(extra, Mapping) or not all(
        isinstance(k, str) and isinstance(v, list) and all(isinstance(s, str) for s in v)
        for k, v in extra.items()
    ):
        raise ReviewError("request.userInfo.extra must map strings to lists of strings")
    return UserInfo(
        username=username,
        uid=uid,
        groups=tuple(groups),
        extra=tuple(sorted((key, tuple(values)) for key, values in extra.items())),
    )


def _optional_object(raw: Mapping[str, Any], key: str) -> Mapping[str, Any] | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ReviewError(f"request.{key} must be an object")
    return value


def _string(raw: Mapping[str, Any], key: str) -> str:
    value = raw.get(key, "")
    if not isinstance(value, str):
        raise ReviewError(f"request.{key} must be a string")
    return value


def parse_review(body: Any) -> AdmissionRequest:
    """The request inside an AdmissionReview; :class:`ReviewError` names what is wrong with it."""
    if not isinstance(body, Mapping):
        raise ReviewError("the body must be an AdmissionReview JSON object")
    api_version = body.get("apiVersion")
    if api_version not in _REVIEW_API_VERSIONS or body.get("kind") != "AdmissionReview":
        raise ReviewError(
            f"expected an AdmissionReview of {REVIEW_API_VERSION}, "
            f"got kind {body.get('kind')!r} of {body.get('apiVersion')!r}"
        )
    raw = body.get("request")
    if not isinstance(raw, Mapping):
        raise ReviewError("the AdmissionReview has no request")
    uid = _string(raw, "uid")
    if not uid:
        raise ReviewError("request.uid is missing")
    kind = raw.get("kind")
    if not isinstance(kind, Mapping):
        raise ReviewError("request.kind is missing")
    return AdmissionRequest(
        uid=uid,
        operation=_string(raw, "operation"),
        namespace=_string(raw, "namespace"),
        name=_string(raw, "name"),
        user=_user(raw.get("userInfo", {})),
        object=_optional_object(raw, "object"),
        old_object=_optional_object(raw, "oldObject"),
        kind=(str(kind.get("group", "")), str(kind.get("version", "")), str(kind.get("kind", ""))),
    )


def _require_appwrapper(request: AdmissionRequest) -> None:
    group, version, kind = request.kind
    if (group, version, kind) != (GROUP, VERSION, KIND):
        shown = f"{group}/{version}" if group else version
        raise ReviewError(f"this webhook admits only {API_VERSION} {KIND}, not {shown} {kind}")


def _labels(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    metadata = obj.get("metadata") if obj is not None else None
    labels = metadata.get("labels") if isinstance(metadata, Mapping) else None
    return labels if isinstance(labels, Mapping) else {}


# ---------------------------------------------------------------------------------------------
# Mutation


def sanitize_label(value: str) -> str:
    """``value`` made a valid label value the way upstream does it.

    Every character other than ASCII letters, digits, ``-``, ``_`` and ``.`` becomes ``_``, the
    result is cut to 63 characters, and ``-``, ``_`` and ``.`` are trimmed from both ends (a
    label value must begin and end with a letter or digit). ``system:serviceaccount:ns:sa``
    becomes ``system_serviceaccount_ns_sa``.
    """
    return _NOT_LABEL_CHAR.sub("_", value)[:_MAX_LABEL_VALUE].strip("-_.")


def _pointer(key: str) -> str:
    # RFC 6901: label keys contain '/', which must be escaped (and '~' before it).
    return "/metadata/labels/" + key.replace("~", "~0").replace("/", "~1")


def mutate(request: AdmissionRequest, *, default_queue_name: str) -> AdmissionResponse:
    """The labels to set on a new AppWrapper, as a JSONPatch.

    The default queue is added only when the queue label is absent (an explicit value, even an
    empty one, is the user's choice). The user labels always reflect who created the object,
    so values supplied in the object are overwritten, with a warning.
    """
    if request.operation != "CREATE" or request.object is None:
        return AdmissionResponse(allowed=True)
    metadata = request.object.get("metadata")
    if not isinstance(metadata, Mapping):
        # The API server rejects such an object anyway; nothing sensible to patch.
        return AdmissionResponse(allowed=True)
    current = metadata.get("labels")
    labels: Mapping[str, Any] = current if isinstance(current, Mapping) else {}
    wanted: dict[str, str] = {}
    if default_queue_name and QUEUE_NAME_LABEL not in labels:
        wanted[QUEUE_NAME_LABEL] = default_queue_name
    warnings = []
    for key, value in ((USER_LABEL, request.user.username), (USER_ID_LABEL, request.user.uid)):
        sanitized = sanitize_label(value)
        if labels.get(key) == sanitized:
            continue
        if key in labels:
            warnings.append(f"label {key} is set from the requesting user; the given value was replaced")
        wanted[key] = sanitized
    if not wanted:
        return AdmissionResponse(allowed=True)
    patch: tuple[dict[str, Any], ...]
    if isinstance(current, Mapping):
        patch = tuple({"op": "add", "path": _pointer(key), "value": value} for key, value in wanted.items())
    else:
        # No labels map yet (or an explicit null): create it whole, since "add" needs the parent.
        patch = ({"op": "add", "path": "/metadata/labels", "value": wanted},)
    return AdmissionResponse(allowed=True, patch=patch, warnings=tuple(warnings))


# ---------------------------------------------------------------------------------------------
# Validation


@dataclass(frozen=True, slots=True)
class AccessCheck:
    """May ``user`` create objects of (api_version, kind) in ``namespace``?"""

    api_version: str
    kind: str
    namespace: str
    user: UserInfo = field(default_factory=UserInfo)


@dataclass(frozen=True, slots=True)
class AccessResult:
    allowed: bool
    # Set when the question could not be answered (API server unreachable, review refused).
    error: str = ""


Authorizer = Callable[[AccessCheck], Awaitable[AccessResult]]


def subject_access_review(check: AccessCheck, *, group: str, version: str, resource: str) -> dict[str, Any]:
    """The SubjectAccessReview asking ``check`` of the API server, for a resolved resource."""
    spec: dict[str, Any] = {
        "resourceAttributes": {
            "namespace": check.namespace,
            "verb": "create",
            "group": group,
            "version": version,
            "resource": resource,
        },
        "user": check.user.username,
        "groups": list(check.user.groups),
    }
    if check.user.uid:
        spec["uid"] = check.user.uid
    if check.user.extra:
        spec["extra"] = check.user.extra_dict()
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}


def _templates(obj: Mapping[str, Any]) -> list[Any]:
    spec = obj.get("spec")
    components = spec.get("components") if isinstance(spec, Mapping) else None
    if not isinstance(components, list):
        raise ReviewError("spec.components must be a list")
    return [c.get("template") if isinstance(c, Mapping) else None for c in components]


def _kind_of(template: Any) -> tuple[str, str] | None:
    if not isinstance(template, Mapping):
        return None
    api_version, kind = template.get("apiVersion"), template.get("kind")
    if isinstance(api_version, str) and api_version and isinstance(kind, str) and kind:
        return api_version, kind
    return None


def _namespace(request: AdmissionRequest) -> str:
    if request.namespace:
        return request.namespace
    metadata = request.object.get("metadata") if request.object is not None else None
    found = metadata.get("namespace") if isinstance(metadata, Mapping) else None
    return found if isinstance(found, str) else ""


def access_checks(request: AdmissionRequest) -> list[AccessCheck]:
    """The distinct access questions a CREATE raises: one per wrapped kind.

    Components of the same kind share a question (same user, same namespace, same answer).
    """
    if request.operation != "CREATE" or request.object is None:
        return []
    try:
        _require_appwrapper(request)
        templates = _templates(request.object)
    except ReviewError:
        return []
    checks: dict[AccessCheck, None] = {}
    for template in templates:
        found = _kind_of(template)
        if found is not None:
            checks[AccessCheck(found[0], found[1], _namespace(request), request.user)] = None
    return list(checks)


def _denied(errors: list[_FieldError]) -> AdmissionResponse:
    # Status as the API server would report the same errors: a failed check is a 500, any
    # malformed content 422 (Invalid), and rights alone 403 (Forbidden).
    types = {error.type for error in errors}
    if ErrorType.INTERNAL in types:
        code, reason = 500, "InternalError"
    elif ErrorType.INVALID in types:
        code, reason = 422, "Invalid"
    else:
        code, reason = 403, "Forbidden"
    return AdmissionResponse(
        allowed=False, code=code, reason=reason, message="; ".join(str(error) for error in errors)
    )


def refusal(message: str) -> AdmissionResponse:
    """A rejection for a review that could not be judged at all."""
    return AdmissionResponse(allowed=False, code=400, reason="BadRequest", message=message)


def _problems(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(part) for part in err['loc'])}: {str(err['msg']).removeprefix('Value error, ')}"
        for err in exc.errors(include_url=False)
    )


# ---------------------------------------------------------------------------------------------
# Template depth, size and reserved keys


Path = tuple[str | int, ...]
# A path kept as a chain of (parent, key) pairs while walking: each step costs one pair, where
# whole tuples would cost memory in proportion to depth at every node.
_Link = tuple["_Link", str | int] | None


def _path(link: _Link) -> Path:
    keys: list[str | int] = []
    while link is not None:
        link, key = link
        keys.append(key)
    return tuple(reversed(keys))


def _walk(root: Any) -> Iterator[tuple[Any, int, _Link]]:
    """Every object and array in ``root`` with its depth (``root`` is 1) and path, without recursion."""
    stack: list[tuple[Any, int, _Link]] = [(root, 1, None)]
    while stack:
        node, depth, link = stack.pop()
        yield node, depth, link
        items = node.items() if isinstance(node, Mapping) else enumerate(node)
        for key, child in items:
            if isinstance(child, Mapping | list):
                stack.append((child, depth + 1, (link, key)))


def _deepest(template: Any, limit: int) -> tuple[int, Path]:
    """The nesting depth of ``template`` and the path to its deepest point; counting stops at the
    first point deeper than ``limit``."""
    if not isinstance(template, Mapping | list):
        return 0, ()
    best: tuple[int, _Link] = (0, None)
    for _, depth, link in _walk(template):
        if depth > best[0]:
            best = (depth, link)
            if depth > limit:
                break
    return best[0], _path(best[1])


def _show(where: str, path: Path, *, keep: int = 12) -> str:
    """``where`` followed by ``path`` in the API server's notation, shortened in the middle."""
    parts = [f"[{k}]" if isinstance(k, int) else f".{k}" for k in path]
    if len(parts) > keep:
        parts = [*parts[: keep // 2], f".<{len(parts) - keep} more>", *parts[-keep // 2 :]]
    return where + "".join(parts)


def _size(template: Any) -> int:
    return len(json.dumps(template, separators=(",", ":"), ensure_ascii=False).encode())


def _components(obj: Mapping[str, Any] | None) -> list[Any]:
    spec = obj.get("spec") if obj is not None else None
    components = spec.get("components") if isinstance(spec, Mapping) else None
    return components if isinstance(components, list) else []


def _limit_errors(obj: Mapping[str, Any] | None, limits: TemplateLimits) -> list[_FieldError]:
    """Templates too deep or, together, too large: checked first, since nothing else about such an
    AppWrapper is worth working out (and the services could not carry it: observations of it
    would exceed NATS's message size, and a deep one takes down their decoders)."""
    errors: list[_FieldError] = []
    templates = [c.get("template") if isinstance(c, Mapping) else None for c in _components(obj)]
    for index, template in enumerate(templates):
        depth, path = _deepest(template, limits.max_depth)
        if depth > limits.max_depth:
            where = f"spec.components[{index}].template"
            errors.append(
                _FieldError(
                    where,
                    ErrorType.INVALID,
                    f"nested more than {limits.max_depth} levels deep (at {_show(where, path)}); "
                    f"the limit is admission.maxTemplateDepth={limits.max_depth}",
                )
            )
    if errors:
        return errors
    sizes = [_size(template) for template in templates]
    total = sum(sizes)
    if total > limits.max_bytes:
        largest = max(range(len(sizes)), key=sizes.__getitem__)
        errors.append(
            _FieldError(
                "spec.components",
                ErrorType.INVALID,
                f"the component templates take {total} bytes as JSON (the largest, "
                f"spec.components[{largest}].template, {sizes[largest]}); the limit is "
                f"admission.maxTemplateBytes={limits.max_bytes}",
            )
        )
    return errors


def _reserved_errors(obj: Mapping[str, Any], templates: list[Any]) -> list[_FieldError]:
    """Labels and annotations that templates may not set, wherever a ``metadata`` object sits.

    Pods are counted as an AppWrapper's by the ``workload.codeflare.dev/appwrapper`` label, which
    lifecycle sets to the AppWrapper's name on every object and pod template it creates. A
    template that set it to another name, on a pod template lifecycle does not know of, would
    have its pods judged as that other AppWrapper's: their failures would reset it. The same
    name is what lifecycle would write anyway, so it is accepted (YAML copied from a running
    object carries it). ``respawn.dev/`` keys are Respawn's own.
    """
    metadata = obj.get("metadata")
    own = metadata.get("name") if isinstance(metadata, Mapping) else None
    errors: list[_FieldError] = []
    for index, template in enumerate(templates):
        if not isinstance(template, Mapping | list):
            continue
        for node, _, link in _walk(template):
            meta = node.get("metadata") if isinstance(node, Mapping) else None
            if not isinstance(meta, Mapping):
                continue
            where = _show(f"spec.components[{index}].template", _path(link)) + ".metadata"
            for field_name in ("labels", "annotations"):
                keys = meta.get(field_name)
                if not isinstance(keys, Mapping):
                    continue
                for key, value in keys.items():
                    at = f"{where}.{field_name}[{key}]"
                    if not isinstance(key, str):
                        continue
                    if key.startswith(RESPAWN_PREFIX):
                        errors.append(
                            _FieldError(
                                at,
                                ErrorType.FORBIDDEN,
                                f"the prefix {RESPAWN_PREFIX} is reserved for Respawn",
                            )
                        )
                    elif field_name == "labels" and key == APPWRAPPER_LABEL and value != own:
                        errors.append(
                            _FieldError(
                                at,
                                ErrorType.FORBIDDEN,
                                f"Respawn sets this label to the AppWrapper's name ({own}) to count pods "
                                f"as its own; a template may not set it to {value!r}",
                            )
                        )
    return errors


def _pod_set_count(obj: Mapping[str, Any] | None) -> int | None:
    total = 0
    for component in _components(obj):
        try:
            total += len(component_pod_sets(component))
        except (ValueError, TypeError, AttributeError):
            return None
    return total


def _control_errors(obj: Mapping[str, Any] | None) -> list[_FieldError]:
    """The Respawn annotations that steer how a workload ends must mean something: a stop or a
    completion policy that lifecycle or health would ignore is refused, with the reason."""
    metadata = obj.get("metadata") if isinstance(obj, Mapping) else None
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    if not isinstance(annotations, Mapping):
        return []
    errors: list[_FieldError] = []
    if STOP_ANNOTATION in annotations:
        try:
            parse_stop(annotations[STOP_ANNOTATION])
        except ValueError as exc:
            errors.append(
                _FieldError(f"metadata.annotations[{STOP_ANNOTATION}]", ErrorType.INVALID, str(exc))
            )
    if COMPLETION_POLICY_ANNOTATION in annotations:
        try:
            parse_completion_policy(annotations[COMPLETION_POLICY_ANNOTATION], _pod_set_count(obj))
        except ValueError as exc:
            errors.append(
                _FieldError(
                    f"metadata.annotations[{COMPLETION_POLICY_ANNOTATION}]", ErrorType.INVALID, str(exc)
                )
            )
    return errors


def _creator_errors(request: AdmissionRequest, obj: Mapping[str, Any]) -> list[_FieldError]:
    """The creator labels must name the requesting user, as the mutating webhook sets them.

    This is what makes a failed mutation harmless: if the mutating webhook could not run on the
    object (no answer while registered, an internal error, a registration removed), the labels
    are missing or whatever the user wrote, and the AppWrapper is refused here.
    """
    labels = _labels(obj)
    errors = []
    for key, value in ((USER_LABEL, request.user.username), (USER_ID_LABEL, request.user.uid)):
        expected, found = sanitize_label(value), labels.get(key)
        if found != expected:
            shown = "none" if found is None else repr(found)
            errors.append(
                _FieldError(
                    f"metadata.labels[{key}]",
                    ErrorType.FORBIDDEN,
                    f"must be {expected!r}, set from the requesting user by the mutating webhook "
                    f"respawn-appwrapper (found {shown}; is that webhook registered?)",
                )
            )
    return errors


def _annotations(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    found = meta.get("annotations") if isinstance(meta, Mapping) else None
    return found if isinstance(found, Mapping) else {}


def _pattern_errors(obj: Mapping[str, Any] | None, old: Mapping[str, Any] | None = None) -> list[_FieldError]:
    """A respawn.dev/failure-patterns value that cannot be used (docs/failures.md).

    Health would refuse it as a whole and classify with the operator's table alone; refusing
    it at admission tells the author at once. On an update only a changed value is judged, so
    an AppWrapper admitted before this check existed can still be updated (or deleted).
    """
    annotations = _annotations(obj)
    if FAILURE_PATTERNS_ANNOTATION not in annotations:
        return []
    if (
        old is not None
        and _annotations(old).get(FAILURE_PATTERNS_ANNOTATION) == annotations[FAILURE_PATTERNS_ANNOTATION]
    ):
        return []
    found = workload_patterns(annotations)
    if not found.error:
        return []
    return [
        _FieldError(f"metadata.annotations[{FAILURE_PATTERNS_ANNOTATION}]", ErrorType.INVALID, found.error)
    ]


def _validate_create(
    request: AdmissionRequest,
    obj: Mapping[str, Any],
    access: Mapping[AccessCheck, AccessResult],
    limits: TemplateLimits,
) -> AdmissionResponse:
    namespace = _namespace(request)
    too_big = _limit_errors(obj, limits)
    if too_big:
        return _denied(too_big)
    errors: list[_FieldError] = _creator_errors(request, obj)
    errors += _control_errors(obj)
    errors += _pattern_errors(obj)
    errors += _reserved_errors(obj, _templates(obj))
    components: dict[int, AppWrapperComponent] = {}
    for index, template in enumerate(_templates(obj)):
        where = f"spec.components[{index}]"
        found = _kind_of(template)
        if found is None:
            errors.append(
                _FieldError(f"{where}.template", ErrorType.INVALID, "apiVersion and kind are required")
            )
            continue
        api_version, kind = found
        result = access.get(AccessCheck(api_version, kind, namespace, request.user))
        if result is None or result.error:
            detail = result.error if result is not None else "no answer"
            errors.append(
                _FieldError(
                    f"{where}.template",
                    ErrorType.INTERNAL,
                    f"cannot tell whether user {request.user.username} may create {kind} "
                    f"in {namespace}: {detail}",
                )
            )
        elif not result.allowed:
            errors.append(
                _FieldError(
                    f"{where}.template",
                    ErrorType.FORBIDDEN,
                    f"User {request.user.username} is not authorized to create {kind} in {namespace}",
                )
            )
        raw = obj["spec"]["components"][index]
        try:
            components[index] = AppWrapperComponent.model_validate(raw)
        except ValidationError as exc:
            errors.append(_FieldError(where, ErrorType.INVALID, _problems(exc)))
    if len(components) == len(obj["spec"]["components"]):
        problems = validate_appwrapper_pod_sets(list(components.values()))
    else:
        # The whole-list check would misnumber components if malformed ones were left out.
        problems = [f"spec.components[{i}].{p}" for i, c in components.items() for p in validate_pod_sets(c)]
    for problem in problems:
        path, _, detail = problem.partition(": ")
        errors.append(_FieldError(path, ErrorType.INVALID, detail))
    return _denied(errors) if errors else AdmissionResponse(allowed=True)


def _validate_update(request: AdmissionRequest) -> AdmissionResponse:
    if request.old_object is None:
        raise ReviewError("an UPDATE review must carry oldObject")
    old, new = _labels(request.old_object), _labels(request.object)
    errors = [
        _FieldError(f"metadata.labels[{key}]", ErrorType.FORBIDDEN, "attempt to change immutable field")
        for key in (USER_LABEL, USER_ID_LABEL)
        if old.get(key) != new.get(key)
    ]
    errors += _control_errors(request.object)
    errors += _pattern_errors(request.object, request.old_object)
    return _denied(errors) if errors else AdmissionResponse(allowed=True)


def validation_response(
    request: AdmissionRequest,
    access: Mapping[AccessCheck, AccessResult],
    limits: TemplateLimits = TemplateLimits(),
) -> AdmissionResponse:
    """Whether to admit the request, given the answers to :func:`access_checks`.

    A missing answer counts as a failed check, never as permission.
    """
    try:
        _require_appwrapper(request)
        if request.operation == "CREATE":
            if request.object is None:
                raise ReviewError("a CREATE review must carry the object")
            return _validate_create(request, request.object, access, limits)
        if request.operation == "UPDATE":
            return _validate_update(request)
    except ReviewError as exc:
        return refusal(str(exc))
    return AdmissionResponse(allowed=True)


async def validate(
    request: AdmissionRequest, authorize: Authorizer, limits: TemplateLimits = TemplateLimits()
) -> AdmissionResponse:
    """:func:`validation_response` with the access questions answered by ``authorize``.

    The questions are asked concurrently; an exception from ``authorize`` is a failed check.
    Templates over the limits are refused before any question is asked.
    """
    if request.operation == "CREATE" and request.kind == (GROUP, VERSION, KIND):
        too_big = _limit_errors(request.object, limits)
        if too_big:
            return _denied(too_big)
    checks = access_checks(request)
    results = await asyncio.gather(*(authorize(check) for check in checks), return_exceptions=True)
    access = {
        check: result if isinstance(result, AccessResult) else AccessResult(False, error=repr(result))
        for check, result in zip(checks, results, strict=True)
    }
    return validation_response(request, access, limits)
