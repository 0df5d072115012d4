"""Kubernetes objects → observation messages (pure).

Each function keeps only what a consumer decides on, so an update that changes nothing
relevant (a heartbeat, a managedFields shuffle) yields an identical observation, and the
watcher can skip publishing it (see :func:`fingerprint`).

Objects come from users, so translation is treated as fallible: :func:`prepare` never raises.
It gives either a :class:`Prepared` observation (subject, fingerprint and message id included)
or a :class:`Refused` one with a reason and the object's identity, for the watcher to
dead-letter while it goes on with the next object. An AppWrapper's body is slimmed to what its
readers use (:func:`appwrapper_body`), and any observation still over :data:`MAX_OBSERVATION_BYTES`
or nested deeper than :data:`MAX_BODY_DEPTH` is refused rather than sent.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from shared import jsoncodec, subjects
from shared.appwrapper.constants import (
    ANNOUNCED_ANNOTATION,
    APPWRAPPER_LABEL,
    GROUP,
    INCIDENT_TRACE_ANNOTATION,
    KIND,
    POD_SET_LABEL,
)
from shared.appwrapper.model import mapping_at, str_at
from shared.appwrapper.podsets import component_pod_sets
from shared.kubetime import parse_kube_time
from shared.messages import (
    MESSAGE_LIMIT,
    AppWrapperObservation,
    ComponentObservation,
    ContainerState,
    Message,
    NodeObservation,
    ObjectRef,
    PodConditionState,
    PodObservation,
)
from shared.ownership import controller_link
from shared.partitions import partition_of
from shared.stalls import HEARTBEAT_ANNOTATION, HEARTBEAT_LIMIT

# Kinds whose status the watcher interprets (the others are observed for existence only).
JOB = ("batch/v1", "Job")
PYTORCHJOB = ("kubeflow.org/v1", "PyTorchJob")


def _ref(obj: dict[str, Any]) -> ObjectRef:
    return ObjectRef(
        namespace=str_at(obj, "metadata", "namespace"),
        name=str_at(obj, "metadata", "name"),
        uid=str_at(obj, "metadata", "uid"),
    )


def _text(value: Any) -> str:
    """A string field of a pod's status as the observation carries it: cut at MESSAGE_LIMIT."""
    return value[:MESSAGE_LIMIT] if isinstance(value, str) else ""


def _containers(status: dict[str, Any]) -> tuple[ContainerState, ...]:
    out: list[ContainerState] = []
    for init, key in ((True, "initContainerStatuses"), (False, "containerStatuses")):
        for cs in status.get(key) or []:
            state = cs.get("state") or {}
            exit_code = None
            reason = message = ""
            finished = None
            if "terminated" in state:
                kind: Literal["waiting", "running", "terminated", "unknown"] = "terminated"
                term = state["terminated"] or {}
                exit_code = term.get("exitCode")
                reason = _text(term.get("reason"))
                message = _text(term.get("message"))
                finished = parse_kube_time(term.get("finishedAt"))
            elif "running" in state:
                kind = "running"
            elif "waiting" in state:
                kind = "waiting"
                waiting = state["waiting"] or {}
                reason = _text(waiting.get("reason"))
                message = _text(waiting.get("message"))
            else:
                kind = "unknown"
            last = (cs.get("lastState") or {}).get("terminated") or {}
            last_code = last.get("exitCode")
            out.append(
                ContainerState(
                    name=cs.get("name", ""),
                    init=init,
                    state=kind,
                    exit_code=exit_code if isinstance(exit_code, int) else None,
                    reason=reason,
                    ready=bool(cs.get("ready")),
                    restart_count=int(cs.get("restartCount") or 0),
                    finished_at=finished,
                    message=message,
                    last_exit_code=last_code if isinstance(last_code, int) else None,
                    last_reason=_text(last.get("reason")),
                )
            )
    return tuple(out)


def _conditions(status: dict[str, Any]) -> tuple[PodConditionState, ...]:
    return tuple(
        PodConditionState(
            type=_text(c.get("type")),
            status=_text(c.get("status")),
            reason=_text(c.get("reason")),
            message=_text(c.get("message")),
        )
        for c in status.get("conditions") or []
        if isinstance(c, Mapping) and isinstance(c.get("type"), str)
    )


def _extended_resources(spec: dict[str, Any]) -> tuple[str, ...]:
    """Resource names (beyond cpu/memory) with a non-zero request or limit in any container."""
    names: set[str] = set()
    for key in ("containers", "initContainers"):
        for c in spec.get(key) or []:
            res = c.get("resources") or {}
            for section in ("requests", "limits"):
                for name, qty in (res.get(section) or {}).items():
                    if name not in ("cpu", "memory", "ephemeral-storage") and str(qty) not in ("0", ""):
                        names.add(name)
    return tuple(sorted(names))


def _heartbeat(meta: Mapping[str, Any]) -> str:
    annotations = meta.get("annotations")
    value = annotations.get(HEARTBEAT_ANNOTATION) if isinstance(annotations, Mapping) else None
    return value[:HEARTBEAT_LIMIT] if isinstance(value, str) else ""


def pod_observation(obj: dict[str, Any], *, deleted: bool, now: datetime) -> PodObservation | None:
    meta = mapping_at(obj, "metadata")
    aw = str_at(meta, "labels", APPWRAPPER_LABEL)
    if not aw:
        return None
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    owner: dict[str, Any] = next((o for o in meta.get("ownerReferences") or [] if o.get("controller")), {})
    scheduled = bool(spec.get("nodeName")) or any(
        c.get("type") == "PodScheduled" and c.get("status") == "True" for c in status.get("conditions") or []
    )
    return PodObservation(
        ref=_ref(obj),
        appwrapper=aw,
        resource_version=meta.get("resourceVersion", ""),
        deleted=deleted,
        observed_at=now,
        created_at=parse_kube_time(meta.get("creationTimestamp")),
        deletion_requested=bool(meta.get("deletionTimestamp")),
        phase=status.get("phase") or "Pending",
        node_name=spec.get("nodeName") or "",
        scheduled=scheduled,
        containers=_containers(status),
        resources=_extended_resources(spec),
        owner_kind=owner.get("kind", ""),
        owner_name=owner.get("name", ""),
        reason=_text(status.get("reason")),
        message=_text(status.get("message")),
        conditions=_conditions(status),
        pod_set=_pod_set(str_at(meta, "labels", POD_SET_LABEL)),
        heartbeat=_heartbeat(meta),
    )


def _pod_set(label: str) -> int | None:
    # Lifecycle writes a small decimal; anything else is no pod set at all.
    return int(label) if label.isdigit() and len(label) <= 4 else None


def _condition(status: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    for c in status.get("conditions") or []:
        if c.get("type") == ctype and c.get("status") == "True":
            return dict(c)
    return None


def interpret_status(api_version: str, kind: str, status: dict[str, Any]) -> tuple[bool, bool, str]:
    """(failed, succeeded, message) for the kinds Respawn understands."""
    if (api_version, kind) == JOB:
        if c := _condition(status, "Failed"):
            return True, False, f"{c.get('reason', 'Failed')}: {c.get('message', '')}".strip(": ")
        if _condition(status, "Complete"):
            return False, True, ""
    if (api_version, kind) == PYTORCHJOB:
        if c := _condition(status, "Failed"):
            return True, False, f"{c.get('reason', 'Failed')}: {c.get('message', '')}".strip(": ")
        if _condition(status, "Succeeded"):
            return False, True, ""
    return False, False, ""


def is_component(obj: Mapping[str, Any]) -> bool:
    """Whether ``obj`` is a component of the AppWrapper its label names: an object made from one
    of its templates, so controlled by it. The watch of a wrapped kind sees every labelled object
    of that kind; when an AppWrapper wraps a Pod, that is every pod a wrapped Job or PyTorchJob
    made too, and those are observed as pods, not as components as well."""
    name = str_at(obj, "metadata", "labels", APPWRAPPER_LABEL)
    link = controller_link(obj)
    return bool(
        name
        and link is not None
        and link.api_version.split("/", 1)[0] == GROUP
        and link.kind == KIND
        and link.name == name
    )


def component_observation(
    obj: dict[str, Any], *, deleted: bool, now: datetime
) -> ComponentObservation | None:
    """The observation of a component (:func:`is_component`), or None for any other object."""
    return _component_observation(obj, deleted=deleted, now=now) if is_component(obj) else None


def former_component_observation(
    obj: dict[str, Any], *, deleted: bool, now: datetime
) -> ComponentObservation | None:
    """The tombstone of a labelled object that is no longer (or never was) a component: it
    replaces whatever state of it was published while it was one."""
    return _component_observation(obj, deleted=True, now=now)


def _component_observation(
    obj: dict[str, Any], *, deleted: bool, now: datetime
) -> ComponentObservation | None:
    meta = mapping_at(obj, "metadata")
    aw = str_at(meta, "labels", APPWRAPPER_LABEL)
    if not aw:
        return None
    api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
    failed, succeeded, message = interpret_status(api_version, kind, obj.get("status") or {})
    return ComponentObservation(
        ref=_ref(obj),
        appwrapper=aw,
        api_version=api_version,
        kind=kind,
        resource_version=meta.get("resourceVersion", ""),
        deleted=deleted,
        observed_at=now,
        deletion_requested=bool(meta.get("deletionTimestamp")),
        failed=failed,
        succeeded=succeeded,
        status_message=message,
        created_at=parse_kube_time(meta.get("creationTimestamp")),
    )


# What an AppWrapper observation keeps of the object's metadata: identity, what the annotations
# and labels configure, and the clocks. managedFields and the like are churn for no reader.
_METADATA_KEYS = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "labels",
    "annotations",
    "creationTimestamp",
    "deletionTimestamp",
    "finalizers",
)


def _template_identity(template: Any) -> Any:
    """apiVersion, kind and metadata.name of a wrapped resource; what is not an object stays as
    it is, so that what made it invalid still does."""
    if not isinstance(template, Mapping):
        return template
    out = {k: template[k] for k in ("apiVersion", "kind") if k in template}
    if "metadata" in template:
        meta = template["metadata"]
        out["metadata"] = {k: meta[k] for k in ("name",) if k in meta} if isinstance(meta, Mapping) else meta
    return out


def _slim_component(component: Any) -> Any:
    """A component with its template cut down to its identity and its pod sets resolved.

    The declared pod sets, or else the inferred ones, are written out as declared, so
    ``expected_pod_count`` on the slim body gives the answer it gives on the whole object
    without the template it inferred them from. A component whose pod sets cannot be resolved
    keeps everything but the template's body, so it fails the same way for its readers.
    """
    try:
        pod_sets = [
            ps.model_dump(mode="json", by_alias=True, exclude_defaults=True)
            for ps in component_pod_sets(component)
        ]
        return {"template": _template_identity(component["template"]), "podSets": pod_sets}
    except Exception:
        if not isinstance(component, Mapping):
            return component
        slim = {k: v for k, v in component.items() if k != "template"}
        if "template" in component:
            slim["template"] = _template_identity(component["template"])
        return slim


# Annotations lifecycle writes for its own bookkeeping (what it announced, the incident's trace)
# and reads from its own cache: no reader of the observations uses them, and an observation
# carrying them would be published again after every transition's record, for nothing.
_BOOKKEEPING_ANNOTATIONS = frozenset({ANNOUNCED_ANNOTATION, INCIDENT_TRACE_ANNOTATION})


def _metadata(meta: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: meta[k] for k in _METADATA_KEYS if k in meta}
    annotations = out.get("annotations")
    if isinstance(annotations, Mapping) and not _BOOKKEEPING_ANNOTATIONS.isdisjoint(annotations):
        out["annotations"] = {k: v for k, v in annotations.items() if k not in _BOOKKEEPING_ANNOTATIONS}
    return out


def appwrapper_body(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What an AppWrapper observation carries of the object (docs/messages.md): its readers (the
    health view, the lifecycle's triggers, ``respawn explain``) use metadata, status and the spec
    but never the wrapped resources' bodies, which are the user's and can be of any size or
    depth; the components keep only their template's identity and their pod sets."""
    body: dict[str, Any] = {k: obj[k] for k in ("apiVersion", "kind") if k in obj}
    meta = mapping_at(obj, "metadata")
    body["metadata"] = _metadata(meta)
    spec = obj.get("spec")
    if isinstance(spec, Mapping):
        slim_spec = {k: v for k, v in spec.items() if k != "components"}
        if "components" in spec:
            components = spec["components"]
            # Not a list: left as it is for expected_pod_count to report.
            slim_spec["components"] = (
                [_slim_component(c) for c in components] if isinstance(components, list) else components
            )
        body["spec"] = slim_spec
    elif "spec" in obj:
        body["spec"] = spec
    if "status" in obj:
        body["status"] = obj["status"]
    return body


def appwrapper_observation(obj: dict[str, Any], *, deleted: bool, now: datetime) -> AppWrapperObservation:
    meta = mapping_at(obj, "metadata")
    return AppWrapperObservation(
        ref=_ref(obj),
        resource_version=meta.get("resourceVersion", ""),
        deleted=deleted,
        observed_at=now,
        body=appwrapper_body(obj),
    )


def node_observation(obj: dict[str, Any], *, deleted: bool, now: datetime) -> NodeObservation:
    meta = mapping_at(obj, "metadata")
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, Mapping)]
    ready_condition = next((c for c in conditions if c.get("type") == "Ready"), None)
    ready_status = str(ready_condition.get("status") or "") if ready_condition is not None else ""
    ready = ready_status == "True"
    taints = tuple(
        {k: str(t.get(k, "")) for k in ("key", "value", "effect")} for t in spec.get("taints") or []
    )
    return NodeObservation(
        name=meta.get("name", ""),
        resource_version=meta.get("resourceVersion", ""),
        deleted=deleted,
        observed_at=now,
        labels=dict(meta.get("labels") or {}),
        taints=taints,
        unschedulable=bool(spec.get("unschedulable")),
        ready=ready,
        ready_status=ready_status,
        ready_since=(
            parse_kube_time(ready_condition.get("lastTransitionTime"))
            if ready_condition is not None
            else None
        ),
    )


def subject_for(message: Message) -> str:
    if isinstance(message, PodObservation):
        return subjects.appwrapper_obs(message.ref.namespace, message.appwrapper, "pod", message.ref.name)
    if isinstance(message, ComponentObservation):
        name = f"{message.kind}.{message.ref.name}"
        return subjects.appwrapper_obs(message.ref.namespace, message.appwrapper, "component", name)
    if isinstance(message, AppWrapperObservation):
        return subjects.appwrapper_obs(
            message.ref.namespace, message.ref.name, "appwrapper", message.ref.name
        )
    if isinstance(message, NodeObservation):
        return subjects.node_obs(message.name)
    raise TypeError(f"not an observation: {type(message).__name__}")


_VOLATILE = {"observed_at", "resource_version"}


def fingerprint(message: Message) -> str:
    """Digest of what matters in an observation (not when it was seen or its resourceVersion).

    Heartbeat-only changes (node lease renewals, kwok status refreshes) produce the same
    fingerprint and are not republished.
    """
    data = message.model_dump(mode="json", exclude=_VOLATILE)
    if isinstance(message, AppWrapperObservation):
        meta = dict(data["body"].get("metadata", {}))
        meta.pop("resourceVersion", None)
        data["body"] = {**data["body"], "metadata": meta}
    raw = jsoncodec.dumps(data, sort_keys=True)
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


def msg_id(message: Message, fp: str) -> str:
    """Nats-Msg-Id: the same version of the same object is stored once, whoever publishes it.

    Keyed on the resourceVersion (plus the content digest), not on the content alone: a state
    that comes back (a label set and removed again) is a new event and must not be dropped as a
    duplicate of the first time, while two watchers (or a restarted one) publishing the same
    version of an object are de-duplicated.
    """
    version = getattr(message, "resource_version", "") or ""
    tombstone = ":deleted" if getattr(message, "deleted", False) else ""
    if isinstance(message, NodeObservation):
        return f"node:{message.name}:{version}:{fp}{tombstone}"
    ref = getattr(message, "ref", None)
    uid = ref.uid if isinstance(ref, ObjectRef) else ""
    return f"{message.KIND}:{uid}:{version}:{fp}{tombstone}"


# ------------------------------------------------------------------ refusing what cannot go out

# An observation larger than this is not published. Far below NATS's 1 MB max_payload: an
# AppWrapper's slim body is a few KiB, so one this size is a mistake, and the stream of latest
# states is replayed whole by health at every start.
MAX_OBSERVATION_BYTES = 256 * 1024
# A body nested deeper than this is not published: nothing a reader uses is deeper than a few
# levels, and the serializers (pydantic, msgpack, json) fail on deep nesting, some with recursion.
MAX_BODY_DEPTH = 64

# Why an object was not published (the dead letter's reason, the failure metric's label). The
# bus's own reasons (PermanentPublishError.reason) are used as they are.
TOO_LARGE = "too-large"
TOO_DEEP = "too-deep"
UNTRANSLATABLE = "untranslatable"


@dataclass(frozen=True, slots=True)
class Identity:
    """Which object a failure was about, read off the raw object without trusting it."""

    kind: str
    namespace: str
    name: str
    uid: str
    resource_version: str
    api_version: str = ""

    def summary(self, reason: str, error: str) -> dict[str, str]:
        """What a dead letter keeps of the object: who it is and what went wrong, never the object
        itself (it is what could not be handled)."""
        return {
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "uid": self.uid,
            "resourceVersion": self.resource_version,
            "reason": reason,
            "error": error,
        }


def identity(obj: Any) -> Identity:
    kind = obj.get("kind") if isinstance(obj, Mapping) else None
    api_version = obj.get("apiVersion") if isinstance(obj, Mapping) else None
    return Identity(
        kind=kind if isinstance(kind, str) else "",
        namespace=str_at(obj, "metadata", "namespace"),
        name=str_at(obj, "metadata", "name"),
        uid=str_at(obj, "metadata", "uid"),
        resource_version=str_at(obj, "metadata", "resourceVersion"),
        api_version=api_version if isinstance(api_version, str) else "",
    )


@dataclass(frozen=True, slots=True)
class Prepared:
    message: Message
    subject: str
    fingerprint: str
    msg_id: str


@dataclass(frozen=True, slots=True)
class Refused:
    reason: str
    error: str
    # The subject the observation was meant for; "" when not even that could be made.
    subject: str
    identity: Identity


def nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` has containers nested more than ``limit`` deep (the value itself is
    level 1). Iterative: the objects this looks at are the ones too deep to recurse over."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def object_subject(obj: Any, observation_kind: str) -> str:
    """The subject the observation of raw ``obj`` goes to, as :func:`subject_for` makes it, or
    "" if the object has no name (or no AppWrapper label, for pods and components). Never
    raises: it names the subject of an object that could not be translated."""
    namespace, name = str_at(obj, "metadata", "namespace"), str_at(obj, "metadata", "name")
    if not name:
        return ""
    if observation_kind == NodeObservation.KIND:
        return subjects.node_obs(name)
    if observation_kind == AppWrapperObservation.KIND:
        return subjects.appwrapper_obs(namespace, name, "appwrapper", name)
    aw = str_at(obj, "metadata", "labels", APPWRAPPER_LABEL)
    if not aw:
        return ""
    if observation_kind == PodObservation.KIND:
        return subjects.appwrapper_obs(namespace, aw, "pod", name)
    kind = obj.get("kind") if isinstance(obj, Mapping) else ""
    return subjects.appwrapper_obs(namespace, aw, "component", f"{kind}.{name}")


def _one_line(exc: BaseException) -> str:
    text = (str(exc).splitlines() or [""])[0][:512]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _problem(message: Message) -> tuple[str, str] | None:
    """Why ``message`` must not be published (reason, error), or None."""
    body = getattr(message, "body", None)
    if body is None:
        # Pod, component and node observations are built field by field from bounded parts of
        # their objects; only a body copied from a user's object can grow without bound. Not
        # encoding them here keeps the hot path to one encoding (the publish), whose own check
        # against the server's max_payload stays the backstop.
        return None
    if nested_deeper_than(body, MAX_BODY_DEPTH):
        return TOO_DEEP, f"the body is nested more than {MAX_BODY_DEPTH} levels deep"
    size = len(message.encode())
    if size > MAX_OBSERVATION_BYTES:
        return TOO_LARGE, f"the observation is {size} bytes; at most {MAX_OBSERVATION_BYTES} are published"
    return None


def prepare(
    to_message: Callable[..., Message | None],
    obj: dict[str, Any],
    *,
    observation_kind: str,
    deleted: bool,
    now: datetime,
) -> Prepared | Refused | None:
    """The observation of ``obj`` ready to publish, the reason it cannot be, or None when the
    object is not observed (a pod without the AppWrapper label). Never raises.

    A tombstone whose body is what stands in the way goes out without its body: consumers keep
    what they last knew of a deleted object, and a delete that is not published is a fault that
    goes unseen.
    """
    try:
        message = to_message(obj, deleted=deleted, now=now)
        if message is None:
            return None
        problem = _problem(message)
        if problem is not None and deleted and isinstance(message, AppWrapperObservation):
            message = message.model_copy(update={"body": {}})
            problem = _problem(message)
        if problem is not None:
            return Refused(problem[0], problem[1], subject_for(message), identity(obj))
        fp = fingerprint(message)
        return Prepared(message, subject_for(message), fp, msg_id(message, fp))
    except Exception as exc:  # whatever a user's object makes the translation do
        return Refused(UNTRANSLATABLE, _one_line(exc), object_subject(obj, observation_kind), identity(obj))


# ------------------------------------------------------------------ tombstones from subjects


def observed_subject_filter(observation_kind: str) -> str:
    """The subjects in RESPAWN_OBSERVATIONS that hold observations of ``observation_kind``."""
    if observation_kind == NodeObservation.KIND:
        return subjects.node_obs_filter()
    token = next(t for t, kind in _KIND_TOKENS.items() if kind == observation_kind)
    # appwrapper_obs_filter() ends in ">"; the object kind is the token before the name.
    return subjects.appwrapper_obs_filter().removesuffix(">") + f"{token}.*.*"


def subject_kind(subject: str) -> str:
    """The observation kind stored on ``subject`` ("" for a subject that is not an observation's)."""
    tokens = subject.removeprefix(subjects.OBS_PREFIX + ".").split(".")
    if len(tokens) == 2 and tokens[0] == "node":
        return NodeObservation.KIND
    if len(tokens) == 6 and tokens[0] == "aw":
        return _KIND_TOKENS.get(tokens[3], "")
    return ""


_KIND_TOKENS = {
    "appwrapper": AppWrapperObservation.KIND,
    "pod": PodObservation.KIND,
    "component": ComponentObservation.KIND,
}


def tombstone_for_subject(subject: str, *, now: datetime) -> Message | None:
    """A tombstone for the object whose observations are on ``subject``, made from the subject
    alone (for an object deleted while no watcher was watching); None for a subject that is
    not an observation's.

    The uid is left empty: it means "whatever incarnation was last observed" to the consumers,
    which keep what they knew of the object and only mark it gone.
    """
    prefix = subjects.OBS_PREFIX + "."
    if not subject.startswith(prefix):
        return None
    tokens = subject.removeprefix(prefix).split(".")
    if len(tokens) == 2 and tokens[0] == "node":
        return NodeObservation(name=subjects.untoken(tokens[1]), deleted=True, observed_at=now)
    # aw.<ns>.<aw>.<kind>.<name>.<partition>
    if len(tokens) != 6 or tokens[0] != "aw":
        return None
    namespace, aw, kind, name = (
        subjects.untoken(tokens[1]),
        subjects.untoken(tokens[2]),
        tokens[3],
        subjects.untoken(tokens[4]),
    )
    if kind == "appwrapper":
        return AppWrapperObservation(
            ref=ObjectRef(namespace=namespace, name=name), deleted=True, observed_at=now
        )
    if kind == "pod":
        return PodObservation(
            ref=ObjectRef(namespace=namespace, name=name), appwrapper=aw, deleted=True, observed_at=now
        )
    component_kind, dot, component_name = name.partition(".")
    if kind != "component" or not dot:
        return None
    return ComponentObservation(
        ref=ObjectRef(namespace=namespace, name=component_name),
        appwrapper=aw,
        api_version="",
        kind=component_kind,
        deleted=True,
        observed_at=now,
    )


# ------------------------------------------------------------------ partitions, and what is kept


@functools.lru_cache(maxsize=65536)
def _partition(namespace: str, name: str, count: int) -> int:
    # Every event of every pod asks: an AppWrapper's pods and components share one answer.
    return partition_of(namespace, name, count)


def object_partition(obj: Any, observation_kind: str) -> int:
    """The partition (:mod:`shared.partitions`) the observation of raw ``obj`` belongs to: its
    AppWrapper's for an AppWrapper, a component or a pod (the one its label names); for a node,
    the partition of ``("", <node name>)``, so that nodes are split between the watcher replicas
    over the same partitions as the AppWrappers and move with them. Never raises."""
    namespace, name = str_at(obj, "metadata", "namespace"), str_at(obj, "metadata", "name")
    if observation_kind == NodeObservation.KIND:
        return _partition("", name, subjects.partitions())
    if observation_kind == AppWrapperObservation.KIND:
        return _partition(namespace, name, subjects.partitions())
    label = str_at(obj, "metadata", "labels", APPWRAPPER_LABEL)
    return _partition(namespace, label, subjects.partitions())


def subject_partition(subject: str) -> int | None:
    """The partition of the object whose observations are on ``subject``, as
    :func:`object_partition` gives it; None for a subject that is not an observation's.

    Worked out from the AppWrapper's name, not read from the subject's last token: a subject
    stored under another partition count (``scaling.partitions`` changed) still has exactly one
    replica that answers for it, and gets its tombstone once its object is gone."""
    tokens = subject.removeprefix(subjects.OBS_PREFIX + ".").split(".")
    if len(tokens) == 2 and tokens[0] == "node":
        return _partition("", subjects.untoken(tokens[1]), subjects.partitions())
    if len(tokens) == 6 and tokens[0] == "aw":
        return _partition(subjects.untoken(tokens[1]), subjects.untoken(tokens[2]), subjects.partitions())
    return None


_KEPT_METADATA = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "ownerReferences",
    "creationTimestamp",
    "deletionTimestamp",
)


def _kept_metadata(meta: Mapping[str, Any], *, labels: tuple[str, ...] | None) -> dict[str, Any]:
    """``meta`` cut down to what translation, attribution and a refusal read; of the labels only
    ``labels`` (None: all of them)."""
    out = {k: meta[k] for k in _KEPT_METADATA if k in meta}
    if "labels" in meta:
        found = meta["labels"]
        out["labels"] = (
            {k: found[k] for k in labels if k in found}
            if labels is not None and isinstance(found, Mapping)
            else found
        )
    return out


def _kept_pod(obj: dict[str, Any]) -> dict[str, Any]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    if not isinstance(spec, Mapping) or not isinstance(status, Mapping):
        raise TypeError("not a pod")
    kept_spec: dict[str, Any] = {k: spec[k] for k in ("nodeName",) if k in spec}
    for key in ("containers", "initContainers"):
        if key in spec:
            containers = spec[key] or []
            if not isinstance(containers, list) or not all(isinstance(c, Mapping) for c in containers):
                raise TypeError("not a pod")
            # Of a container only what it asks for: the observation names its extended resources.
            kept_spec[key] = [{k: c[k] for k in ("resources",) if k in c} for c in containers]
    read = ("phase", "reason", "message", "conditions", "containerStatuses", "initContainerStatuses")
    kept_status = {k: status[k] for k in read if k in status}
    return {"spec": kept_spec, "status": kept_status}


def _kept_component(obj: dict[str, Any]) -> dict[str, Any]:
    status = obj.get("status")
    if not isinstance(status, Mapping):
        return {"status": status} if "status" in obj else {}
    # Only the kinds whose status is interpreted, and of it only the conditions.
    interpreted = (obj.get("apiVersion"), obj.get("kind")) in (JOB, PYTORCHJOB)
    return {"status": {k: status[k] for k in ("conditions",) if k in status} if interpreted else {}}


def _kept_node(obj: dict[str, Any]) -> dict[str, Any]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    if not isinstance(spec, Mapping) or not isinstance(status, Mapping):
        raise TypeError("not a node")
    conditions = status.get("conditions") or []
    if not isinstance(conditions, list) or not all(isinstance(c, Mapping) for c in conditions):
        raise TypeError("not a node")
    return {
        "spec": {k: spec[k] for k in ("taints", "unschedulable") if k in spec},
        "status": {"conditions": [c for c in conditions if c.get("type") == "Ready"]},
    }


def kept(obj: dict[str, Any], observation_kind: str) -> dict[str, Any]:
    """What the watcher keeps of the latest state of an object, to publish its observation when
    it takes over the object's partition: the object cut down to what :func:`prepare`, pod
    attribution (:func:`shared.ownership.controller_link`) and a refusal (:func:`identity`) read
    of it, so that each gives the same answer for what is kept as for the whole object (a pod's
    ``managedFields``, environment and volumes would cost a replica that keeps every pod in the
    cluster hundreds of megabytes). Pure, never raises: an object too odd to cut down (a field of
    an unexpected type) is kept whole, and fails or not as it does."""
    try:
        meta = obj.get("metadata") or {}
        if not isinstance(meta, Mapping):
            return obj
        if observation_kind == AppWrapperObservation.KIND:
            # The observation's own body is what its readers use; translating it again gives
            # the same body.
            return appwrapper_body(obj)
        out: dict[str, Any] = {k: obj[k] for k in ("apiVersion", "kind") if k in obj}
        if observation_kind == PodObservation.KIND:
            out["metadata"] = _kept_metadata(meta, labels=(APPWRAPPER_LABEL, POD_SET_LABEL))
            annotations = meta.get("annotations")
            if isinstance(annotations, Mapping) and HEARTBEAT_ANNOTATION in annotations:
                # The progress heartbeat, the only annotation a pod observation carries.
                out["metadata"]["annotations"] = {HEARTBEAT_ANNOTATION: annotations[HEARTBEAT_ANNOTATION]}
            out.update(_kept_pod(obj))
        elif observation_kind == ComponentObservation.KIND:
            out["metadata"] = _kept_metadata(meta, labels=(APPWRAPPER_LABEL,))
            out.update(_kept_component(obj))
        elif observation_kind == NodeObservation.KIND:
            out["metadata"] = _kept_metadata(meta, labels=None)
            out.update(_kept_node(obj))
        else:
            return obj
        return out
    except Exception:  # whatever a user's object makes the cutting do: keep it as it is
        return obj
