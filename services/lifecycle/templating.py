"""Rendering a wrapped component into the object the lifecycle service creates.

For component ``i`` of an AppWrapper the rendered object is the component's template with:

- ``metadata.namespace`` set to the AppWrapper's (a different namespace is an error);
- the label ``workload.codeflare.dev/appwrapper=<name>`` on the object itself, which is how the
  watcher finds wrapped resources;
- a controller owner reference to the AppWrapper, so Kubernetes garbage-collects whatever is
  left should the AppWrapper disappear without its finalizer running;
- the annotations the caller passes (the machine passes ``respawn.dev/component``, see
  :func:`component_identity`, by which a create whose outcome was lost is found again);
- in every pod template at each of the component's pod-set paths: the same label (pods are
  counted through it) plus the matching ``podSetInfos[j]`` that Kueue wrote on admission
  (labels, annotations, nodeSelector, tolerations, scheduling gates);
- whatever the :class:`PodTemplateHook` callables add (Autopilot anti-affinity, node exclusion).

A value that would overwrite a different value already in the template (same label,
annotation or nodeSelector key) is a :class:`TemplateError`: silently keeping either value would
run the workload somewhere other than where Kueue or the user put it. The error is terminal
for the AppWrapper, and its message names the component, the pod-set path and the key.

Everything here is pure and deep-copies its input.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shared.appwrapper.constants import API_VERSION, APPWRAPPER_LABEL, KIND
from shared.appwrapper.model import PodSet, as_mapping
from shared.appwrapper.podsets import PodSetPathError, component_pod_sets, get_at_path, set_at_path

__all__ = [
    "PodTemplateContext",
    "PodTemplateHook",
    "TemplateError",
    "component_identity",
    "owner_reference",
    "render_component",
]


class TemplateError(ValueError):
    """A component that cannot be rendered; retrying cannot fix it."""


# How deep a template may nest for lifecycle to create it (the template itself is level 1). The
# API server stores templates far deeper than Python's recursion limit lets anything recursive
# (copy.deepcopy, the JSON encoder) handle; past this depth the AppWrapper fails with a message
# that says so, instead of every pass dying of a RecursionError. It is the highest value
# admission.maxTemplateDepth accepts, so what the webhook admits, lifecycle creates.
MAX_TEMPLATE_DEPTH = 512


def copy_tree(value: Any, *, max_depth: int = MAX_TEMPLATE_DEPTH) -> Any:
    """A copy of a JSON-like tree (mappings, lists, scalars), made without recursion so that no
    depth can exhaust the stack; a :class:`TemplateError` if objects and lists nest deeper than
    ``max_depth``. Key order is kept."""
    root: list[Any] = [None]
    # (source, container to put its copy in, key or index there, depth of the source)
    todo: list[tuple[Any, Any, Any, int]] = [(value, root, 0, 1)]
    while todo:
        source, parent, key, depth = todo.pop()
        if isinstance(source, Mapping):
            copied: dict[str, Any] | list[Any] = dict.fromkeys(source)
            children: Any = source.items()
        elif isinstance(source, list):
            copied = [None] * len(source)
            children = enumerate(source)
        else:
            parent[key] = source  # str, int, float, bool, None: immutable
            continue
        if depth > max_depth:
            raise TemplateError(f"the template nests objects and lists more than {max_depth} levels deep")
        parent[key] = copied
        todo.extend((child, copied, k, depth + 1) for k, child in children)
    return root[0]


@dataclass(frozen=True, slots=True)
class PodTemplateContext:
    """Where a pod template sits, for hooks that decide what to add to it."""

    appwrapper: Mapping[str, Any]
    component_index: int
    pod_set_index: int
    path: str
    # When the pod template is rendered (the reconcile's clock); None when the caller has none.
    now: datetime | None = None


# Adds to a pod template (e.g. node affinity) and returns the template to use. A hook receives
# a private copy and may mutate and return it, or return a new object. It raises TemplateError
# (or ValueError) for a template it cannot accept; that makes the AppWrapper Failed like any
# other rendering error.
PodTemplateHook = Callable[[PodTemplateContext, dict[str, Any]], dict[str, Any]]


def owner_reference(appwrapper: Mapping[str, Any]) -> dict[str, Any]:
    """A controller owner reference to ``appwrapper`` (as controllerutil.SetControllerReference)."""
    metadata = as_mapping(appwrapper.get("metadata"))
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": str(metadata.get("name", "")),
        "uid": str(metadata.get("uid", "")),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def component_identity(appwrapper_uid: str, attempt: datetime | None, index: int) -> str:
    """The ``respawn.dev/component`` annotation of component ``index`` created in the attempt
    that started at ``attempt`` (ResourcesDeployed's transition time) by the AppWrapper
    incarnation ``appwrapper_uid``: the same for every create of it within that attempt, and for
    no other object."""
    started = attempt.strftime("%Y%m%dT%H%M%SZ") if attempt is not None else "-"
    return f"{appwrapper_uid}/{started}/{index}"


def render_component(
    appwrapper: Mapping[str, Any],
    index: int,
    *,
    pod_sets: Sequence[PodSet | Mapping[str, Any]] | None = None,
    hooks: Sequence[PodTemplateHook] = (),
    annotations: Mapping[str, str] | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """The object to create for ``spec.components[index]`` of ``appwrapper``.

    ``pod_sets`` are the component's validated pod sets (``status.componentStatus[index].podSets``);
    when omitted they are the declared ones or, failing that, the inferred ones. ``annotations``
    are added to the object's own metadata. ``now`` is handed to the hooks.
    """
    metadata = as_mapping(appwrapper.get("metadata"))
    aw_name = str(metadata.get("name", ""))
    aw_namespace = str(metadata.get("namespace", ""))
    components = as_mapping(appwrapper.get("spec")).get("components")
    if not isinstance(components, list) or not 0 <= index < len(components):
        raise TemplateError(f"component {index} does not exist")
    component = components[index]
    if not isinstance(component, Mapping) or not isinstance(component.get("template"), Mapping):
        raise TemplateError(f"component {index} has no template object")
    where = f"component {index} ({_describe(component['template'])})"
    try:
        obj: dict[str, Any] = copy_tree(component["template"])
    except TemplateError as exc:
        raise TemplateError(f"{where}: {exc}; it cannot be created") from None

    obj_meta = _child(obj, "metadata", where)
    namespace = obj_meta.get("namespace") or ""
    if namespace and namespace != aw_namespace:
        raise TemplateError(
            f"{where}: namespace '{namespace}' differs from the AppWrapper's namespace '{aw_namespace}'"
        )
    obj_meta["namespace"] = aw_namespace
    _merge_strings(_child(obj_meta, "labels", where), {APPWRAPPER_LABEL: aw_name}, f"{where}: label")
    if annotations:
        _merge_strings(_child(obj_meta, "annotations", where), annotations, f"{where}: annotation")
    _add_owner(obj_meta, owner_reference(appwrapper), where)

    if pod_sets is None:
        try:
            pod_sets = component_pod_sets(component)
        except ValueError as exc:
            raise TemplateError(f"{where}: cannot determine pod sets: {exc}") from exc
    infos = component.get("podSetInfos")
    infos = infos if isinstance(infos, list) else []
    for j, raw_pod_set in enumerate(pod_sets):
        path = (
            raw_pod_set.path
            if isinstance(raw_pod_set, PodSet)
            else str(as_mapping(raw_pod_set).get("path", ""))
        )
        info = infos[j] if j < len(infos) else {}
        context = PodTemplateContext(
            appwrapper=appwrapper, component_index=index, pod_set_index=j, path=path, now=now
        )
        obj = _render_pod_template(obj, aw_name, context, as_mapping(info), hooks, f"{where}, pod set {path}")
    return obj


def _render_pod_template(
    obj: dict[str, Any],
    aw_name: str,
    context: PodTemplateContext,
    info: Mapping[str, Any],
    hooks: Sequence[PodTemplateHook],
    where: str,
) -> dict[str, Any]:
    try:
        found = get_at_path(obj, context.path)
    except PodSetPathError as exc:
        raise TemplateError(f"{where}: {exc}") from exc
    if not isinstance(found, dict):
        raise TemplateError(f"{where}: the path does not refer to a pod template object")
    template: dict[str, Any] = copy_tree(found)  # within the template, so never too deep
    meta = _child(template, "metadata", where)
    spec = _child(template, "spec", where)

    labels = _strings(info.get("labels"), f"{where}: podSetInfos labels")
    injected_aw = labels.get(APPWRAPPER_LABEL)
    if injected_aw is not None and injected_aw != aw_name:
        raise TemplateError(
            f"{where}: label '{APPWRAPPER_LABEL}' is '{injected_aw}' in podSetInfos "
            f"but must be the AppWrapper's name '{aw_name}'"
        )
    labels[APPWRAPPER_LABEL] = aw_name
    _merge_strings(_child(meta, "labels", where), labels, f"{where}: label")
    annotations = _strings(info.get("annotations"), f"{where}: podSetInfos annotations")
    _merge_strings(_child(meta, "annotations", where), annotations, f"{where}: annotation")
    node_selector = _strings(info.get("nodeSelector"), f"{where}: podSetInfos nodeSelector")
    _merge_strings(_child(spec, "nodeSelector", where), node_selector, f"{where}: nodeSelector")
    _append_tolerations(spec, info.get("tolerations"), where)
    _append_gates(spec, info.get("schedulingGates"), where)
    _drop_empty(meta, "labels", "annotations")
    _drop_empty(spec, "nodeSelector")

    for hook in hooks:
        try:
            template = hook(context, template)
        except TemplateError:
            raise
        except ValueError as exc:
            raise TemplateError(f"{where}: {exc}") from exc
        if not isinstance(template, dict):
            raise TemplateError(f"{where}: a pod-template hook returned {type(template).__name__}")
    try:
        return set_at_path(obj, context.path, template)
    except PodSetPathError as exc:  # pragma: no cover - the path resolved above
        raise TemplateError(f"{where}: {exc}") from exc


def _describe(obj: Mapping[str, Any]) -> str:
    meta = as_mapping(obj.get("metadata"))
    name = meta.get("name") or meta.get("generateName") or "<unnamed>"
    return f"{obj.get('apiVersion', '?')} {obj.get('kind', '?')} {name}"


def _child(parent: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    """``parent[key]`` as a dict, created when absent or null."""
    value = parent.get(key)
    if value is None:
        value = parent[key] = {}
    if not isinstance(value, dict):
        raise TemplateError(f"{where}: '{key}' must be an object, found {type(value).__name__}")
    return value


def _drop_empty(parent: dict[str, Any], *keys: str) -> None:
    # Keep the rendered object minimal: only maps we actually filled are written.
    for key in keys:
        if parent.get(key) == {}:
            del parent[key]


def _strings(value: Any, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise TemplateError(f"{what} must map strings to strings")
    return dict(value)


def _merge_strings(into: dict[str, Any], values: Mapping[str, str], what: str) -> None:
    for key, value in values.items():
        existing = into.get(key)
        if existing is not None and existing != value:
            raise TemplateError(
                f"{what} '{key}' is '{existing}' in the template but '{value}' is to be injected"
            )
        into[key] = value


def _add_owner(meta: dict[str, Any], ref: dict[str, Any], where: str) -> None:
    owners = meta.get("ownerReferences")
    if owners is None:
        owners = meta["ownerReferences"] = []
    if not isinstance(owners, list):
        raise TemplateError(f"{where}: 'ownerReferences' must be a list")
    for owner in owners:
        if isinstance(owner, Mapping) and owner.get("controller") is True:
            if owner.get("uid") == ref["uid"] and owner.get("kind") == ref["kind"]:
                return
            raise TemplateError(
                f"{where}: the template already names a controller owner "
                f"({owner.get('kind')} {owner.get('name')}); it cannot also be controlled by the AppWrapper"
            )
    owners.append(ref)


def _append_tolerations(spec: dict[str, Any], value: Any, where: str) -> None:
    if value is None:
        return
    if not isinstance(value, list) or not all(isinstance(t, Mapping) for t in value):
        raise TemplateError(f"{where}: podSetInfos tolerations must be a list of objects")
    existing = spec.get("tolerations")
    if existing is None:
        existing = []
    if not isinstance(existing, list):
        raise TemplateError(f"{where}: 'tolerations' must be a list")
    for toleration in value:
        # An identical toleration is already in effect; a second copy would change nothing.
        if dict(toleration) not in existing:
            existing.append(copy_tree(dict(toleration)))
    if existing:
        spec["tolerations"] = existing


def _append_gates(spec: dict[str, Any], value: Any, where: str) -> None:
    if value is None:
        return
    if not isinstance(value, list) or not all(
        isinstance(g, Mapping) and isinstance(g.get("name"), str) for g in value
    ):
        raise TemplateError(f"{where}: podSetInfos schedulingGates must be a list of objects with a name")
    existing = spec.get("schedulingGates")
    if existing is None:
        existing = []
    if not isinstance(existing, list):
        raise TemplateError(f"{where}: 'schedulingGates' must be a list")
    # Gates are identified by name (the API rejects duplicates), so a gate already present stays.
    names = {g.get("name") for g in existing if isinstance(g, Mapping)}
    for gate in value:
        if gate["name"] not in names:
            existing.append(copy_tree(dict(gate)))
            names.add(gate["name"])
    if existing:
        spec["schedulingGates"] = existing
