"""Kubernetes objects → observation messages (pure).

Each function keeps only what a consumer decides on, so an update that changes nothing
relevant (a heartbeat, a managedFields shuffle) yields an identical observation, and the
watcher can skip publishing it (see :func:`fingerprint`).
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any, Literal

from shared import subjects
from shared.appwrapper.constants import APPWRAPPER_LABEL
from shared.appwrapper.model import mapping_at, str_at
from shared.kubetime import parse_kube_time
from shared.messages import (
    AppWrapperObservation,
    ComponentObservation,
    ContainerState,
    Message,
    NodeObservation,
    ObjectRef,
    PodObservation,
)

# Kinds whose status the watcher interprets (the others are observed for existence only).
JOB = ("batch/v1", "Job")
PYTORCHJOB = ("kubeflow.org/v1", "PyTorchJob")


def _ref(obj: dict[str, Any]) -> ObjectRef:
    return ObjectRef(
        namespace=str_at(obj, "metadata", "namespace"),
        name=str_at(obj, "metadata", "name"),
        uid=str_at(obj, "metadata", "uid"),
    )


def _containers(status: dict[str, Any]) -> tuple[ContainerState, ...]:
    out: list[ContainerState] = []
    for init, key in ((True, "initContainerStatuses"), (False, "containerStatuses")):
        for cs in status.get(key) or []:
            state = cs.get("state") or {}
            exit_code = None
            reason = ""
            finished = None
            if "terminated" in state:
                kind: Literal["waiting", "running", "terminated", "unknown"] = "terminated"
                term = state["terminated"] or {}
                exit_code = term.get("exitCode")
                reason = term.get("reason", "")
                finished = parse_kube_time(term.get("finishedAt"))
            elif "running" in state:
                kind = "running"
            elif "waiting" in state:
                kind = "waiting"
                reason = (state["waiting"] or {}).get("reason", "")
            else:
                kind = "unknown"
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
                )
            )
    return tuple(out)


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
    )


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


def component_observation(
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


def appwrapper_observation(obj: dict[str, Any], *, deleted: bool, now: datetime) -> AppWrapperObservation:
    meta = dict(mapping_at(obj, "metadata"))
    meta.pop("managedFields", None)
    body = {**obj, "metadata": meta}
    return AppWrapperObservation(
        ref=_ref(obj),
        resource_version=meta.get("resourceVersion", ""),
        deleted=deleted,
        observed_at=now,
        body=body,
    )


def node_observation(obj: dict[str, Any], *, deleted: bool, now: datetime) -> NodeObservation:
    meta = mapping_at(obj, "metadata")
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
    )
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
    raw = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
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
