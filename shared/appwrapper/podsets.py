"""Pod sets: which pod templates inside a wrapped resource make pods, and how many.

Pure functions over raw JSON objects. A pod-set path uses upstream's syntax: it starts with
``template`` (the wrapped resource itself) and continues with ``.field`` and ``[index]``
segments, e.g. ``template.spec.replicatedJobs[0].template.spec.template``. Error texts follow
upstream's, so users see the same messages whichever controller runs.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from shared.appwrapper.constants import (
    JOB_COMPLETION_INDEX_ANNOTATION,
    JOBSET_JOB_INDEX_LABEL,
    MAX_POD_SETS,
    TAS_POD_INDEX_LABEL_ANNOTATION,
    TAS_SUB_GROUP_COUNT_ANNOTATION,
    TAS_SUB_GROUP_INDEX_LABEL_ANNOTATION,
)
from shared.appwrapper.model import (
    AppWrapperComponent,
    AppWrapperError,
    PodSet,
    int_at,
    list_at,
    mapping_at,
)

__all__ = [
    "PodSetPathError",
    "can_infer",
    "component_pod_sets",
    "expected_pod_count",
    "get_at_path",
    "infer_pod_sets",
    "is_pod_template",
    "parse_path",
    "set_at_path",
    "total_pod_set_count",
    "validate_appwrapper_pod_sets",
    "validate_pod_sets",
]

_ROOT = "template"
# One dot-separated element: an optional field name followed by any number of [index] parts.
_ELEMENT = re.compile(r"^(?P<field>[^\[\]]*)(?P<indices>(?:\[[^\[\]]*\])*)$")
_INDEX = re.compile(r"\[([^\[\]]*)\]")

PathStep = str | int


class PodSetPathError(ValueError):
    """A pod-set path that is malformed or does not resolve inside the template."""


def _parse(path: str) -> list[tuple[PathStep, int]]:
    # Each step with the position of its dot-separated element ('template' is position 0), which
    # is what error messages report, as upstream's do.
    elements = path.split(".")
    head = _ELEMENT.match(elements[0])
    if head is None or head["field"] != _ROOT:
        raise PodSetPathError("first element of the path must be 'template'")
    steps: list[tuple[PathStep, int]] = []
    for position, element in enumerate(elements):
        match = _ELEMENT.match(element)
        if match is None or (position > 0 and not match["field"]):
            raise PodSetPathError(f"at path position '{position}' invalid path element '{element}'")
        if position > 0:
            steps.append((match["field"], position))
        for raw in _INDEX.findall(match["indices"]):
            if not raw.isdigit():
                raise PodSetPathError(f"at path position '{position}' invalid index expression '{raw}'")
            steps.append((int(raw), position))
    return steps


def parse_path(path: str) -> list[PathStep]:
    """Split a pod-set path into steps after the leading ``template``: names and list indices."""
    return [step for step, _ in _parse(path)]


def get_at_path(template: Mapping[str, Any], path: str) -> Any:
    """The value at ``path``, where the leading ``template`` is ``template`` itself."""
    value: Any = template
    for step, position in _parse(path):
        value = _step(value, step, position)
    return value


def set_at_path(template: Mapping[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A deep copy of ``template`` with the value at ``path`` replaced; ``template`` is untouched.

    Every element up to the last must already exist: a pod-set path names a pod template that is
    in the object, so a missing parent is an error rather than something to create.
    """
    steps = _parse(path)
    if not steps:
        if not isinstance(value, Mapping):
            raise PodSetPathError("the whole template can only be replaced by an object")
        return copy.deepcopy(dict(value))
    result: dict[str, Any] = copy.deepcopy(dict(template))
    parent: Any = result
    for step, position in steps[:-1]:
        parent = _step(parent, step, position)
    last, position = steps[-1]
    if isinstance(last, int):
        if not isinstance(parent, list):
            raise PodSetPathError(f"at path position '{position}' found non-array value")
        if last >= len(parent):
            raise PodSetPathError(f"at path position '{position}' out of bounds index '{last}'")
    elif not isinstance(parent, dict):
        raise PodSetPathError(f"at path position '{position}' found non-map value")
    parent[last] = copy.deepcopy(value)
    return result


def _step(value: Any, step: PathStep, position: int) -> Any:
    if isinstance(step, int):
        if not isinstance(value, list):
            raise PodSetPathError(f"at path position '{position}' found non-array value")
        if step >= len(value):
            raise PodSetPathError(f"at path position '{position}' out of bounds index '{step}'")
        return value[step]
    if not isinstance(value, Mapping):
        raise PodSetPathError(f"at path position '{position}' found non-map value")
    if step not in value:
        raise PodSetPathError(f"at path position '{position}' missing field '{step}'")
    return value[step]


def is_pod_template(value: Any) -> bool:
    """Whether ``value`` looks like a v1 PodTemplateSpec: an object with a non-empty spec.containers."""
    if not isinstance(value, Mapping):
        return False
    spec = value.get("spec")
    if not isinstance(spec, Mapping):
        return False
    containers = spec.get("containers")
    return isinstance(containers, list) and len(containers) > 0


# ---------------------------------------------------------------------------------------------
# Inference


def _job_pods(job_spec: Mapping[str, Any]) -> int:
    # Pods that run at once: parallelism (default 1), but never more than the completions asked
    # for. Without completions a Job is a work queue sized by parallelism alone.
    replicas = int_at(job_spec, "parallelism")
    replicas = 1 if replicas is None else replicas
    completions = int_at(job_spec, "completions")
    if completions is not None and completions < replicas:
        replicas = completions
    return replicas


def _replicas(obj: Mapping[str, Any], *keys: str) -> int:
    found = int_at(obj, *keys)
    return 1 if found is None else found


def _infer_pod(template: Mapping[str, Any]) -> list[PodSet]:
    return [PodSet(replicas=1, path=_ROOT)]


def _infer_workload(template: Mapping[str, Any]) -> list[PodSet]:
    return [PodSet(replicas=_replicas(template, "spec", "replicas"), path=f"{_ROOT}.spec.template")]


def _infer_job(template: Mapping[str, Any]) -> list[PodSet]:
    return [
        PodSet(
            replicas=_job_pods(mapping_at(template, "spec")),
            path=f"{_ROOT}.spec.template",
            annotations={TAS_POD_INDEX_LABEL_ANNOTATION: JOB_COMPLETION_INDEX_ANNOTATION},
        )
    ]


def _infer_jobset(template: Mapping[str, Any]) -> list[PodSet]:
    pod_sets = []
    for index, replicated in enumerate(list_at(template, "spec", "replicatedJobs")):
        if not isinstance(replicated, Mapping):
            continue
        jobs = _replicas(replicated, "replicas")
        job_spec = mapping_at(replicated, "template", "spec")
        pod_sets.append(
            PodSet(
                replicas=jobs * _job_pods(job_spec),
                path=f"{_ROOT}.spec.replicatedJobs[{index}].template.spec.template",
                annotations={
                    TAS_POD_INDEX_LABEL_ANNOTATION: JOB_COMPLETION_INDEX_ANNOTATION,
                    TAS_SUB_GROUP_INDEX_LABEL_ANNOTATION: JOBSET_JOB_INDEX_LABEL,
                    TAS_SUB_GROUP_COUNT_ANNOTATION: str(jobs),
                },
            )
        )
    return pod_sets


def _replica_spec(spec: Any, path: str, *, replicas: int | None = None) -> list[PodSet]:
    """The pod set of a replica spec (``{replicas, template}``) at ``path``; none without a template."""
    if not isinstance(spec, Mapping) or "template" not in spec:
        return []
    count = _replicas(spec, "replicas") if replicas is None else replicas
    return [PodSet(replicas=count, path=f"{path}.template")]


def _infer_pytorchjob(template: Mapping[str, Any]) -> list[PodSet]:
    specs = mapping_at(template, "spec", "pytorchReplicaSpecs")
    # Master before Worker, whatever the order in the object: Kueue pairs pod sets by position.
    return [
        pod_set
        for role in ("Master", "Worker")
        for pod_set in _replica_spec(specs.get(role), f"{_ROOT}.spec.pytorchReplicaSpecs.{role}")
    ]


def _ray_cluster_pod_sets(cluster_spec: Mapping[str, Any], prefix: str) -> list[PodSet]:
    head = _replica_spec(cluster_spec.get("headGroupSpec"), f"{prefix}.headGroupSpec", replicas=1)
    workers = list_at(cluster_spec, "workerGroupSpecs")
    return head + [
        pod_set
        for index, group in enumerate(workers)
        for pod_set in _replica_spec(group, f"{prefix}.workerGroupSpecs[{index}]")
    ]


def _infer_raycluster(template: Mapping[str, Any]) -> list[PodSet]:
    return _ray_cluster_pod_sets(mapping_at(template, "spec"), f"{_ROOT}.spec")


def _infer_rayjob(template: Mapping[str, Any]) -> list[PodSet]:
    return _ray_cluster_pod_sets(
        mapping_at(template, "spec", "rayClusterSpec"), f"{_ROOT}.spec.rayClusterSpec"
    )


_Inferrer = Callable[[Mapping[str, Any]], list[PodSet]]

# Keyed by (apiVersion, kind): a different version of a kind may lay its pod templates out
# differently, so only the versions whose layout is known are inferred.
_INFERRERS: dict[tuple[str, str], _Inferrer] = {
    ("v1", "Pod"): _infer_pod,
    ("apps/v1", "Deployment"): _infer_workload,
    ("apps/v1", "StatefulSet"): _infer_workload,
    ("apps/v1", "ReplicaSet"): _infer_workload,
    ("batch/v1", "Job"): _infer_job,
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): _infer_jobset,
    ("kubeflow.org/v1", "PyTorchJob"): _infer_pytorchjob,
    ("ray.io/v1", "RayCluster"): _infer_raycluster,
    ("ray.io/v1", "RayJob"): _infer_rayjob,
}


def can_infer(template: Mapping[str, Any]) -> bool:
    """Whether the kind of ``template`` is one whose pod sets :func:`infer_pod_sets` knows."""
    return (str(template.get("apiVersion", "")), str(template.get("kind", ""))) in _INFERRERS


def infer_pod_sets(template: Mapping[str, Any]) -> list[PodSet]:
    """The pod sets of a wrapped resource of a known kind; none for any other kind."""
    inferrer = _INFERRERS.get((str(template.get("apiVersion", "")), str(template.get("kind", ""))))
    return [] if inferrer is None else inferrer(template)


# ---------------------------------------------------------------------------------------------
# Components


def _as_component(component: AppWrapperComponent | Mapping[str, Any]) -> AppWrapperComponent:
    if isinstance(component, AppWrapperComponent):
        return component
    try:
        return AppWrapperComponent.model_validate(component)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in err['loc']) or '(component)'}: {err['msg']}"
            for err in exc.errors(include_url=False)
        )
        raise AppWrapperError(f"malformed component: {problems}") from None


def component_pod_sets(component: AppWrapperComponent | Mapping[str, Any]) -> list[PodSet]:
    """The declared pod sets of a component if it has any, else those inferred from its template."""
    parsed = _as_component(component)
    return list(parsed.pod_sets) if parsed.pod_sets else infer_pod_sets(parsed.template)


def total_pod_set_count(components: list[AppWrapperComponent]) -> int:
    # Per component the larger of declared and inferred, as upstream: a declaration that omits
    # an inferable pod set still counts it (and is rejected separately for disagreeing).
    return sum(max(len(c.pod_sets), len(infer_pod_sets(c.template))) for c in components)


def _as_pod_set(pod_set: Any) -> PodSet:
    try:
        return PodSet.model_validate(pod_set)
    except ValidationError as exc:
        raise AppWrapperError(f"malformed pod set in status.componentStatus: {pod_set!r}") from exc


def expected_pod_count(appwrapper_body: Mapping[str, Any]) -> int:
    """How many pods the workload should have: the sum of replicas over its pod sets.

    Uses the pod sets recorded in ``status.componentStatus`` once they exist (they were
    validated when the AppWrapper was first seen, and the spec cannot change afterwards), and
    otherwise those of ``spec.components``. A pod set without replicas counts as one pod.
    """
    recorded = list_at(appwrapper_body, "status", "componentStatus")
    if recorded:
        return sum(
            _as_pod_set(pod_set).count
            for entry in recorded
            if isinstance(entry, Mapping)
            for pod_set in (entry.get("podSets") or [])
        )
    # Not list_at: components that are not a list are an error to report, not zero pods.
    components = mapping_at(appwrapper_body, "spec").get("components")
    return sum(pod_set.count for component in (components or []) for pod_set in component_pod_sets(component))


# ---------------------------------------------------------------------------------------------
# Validation


def validate_pod_sets(component: AppWrapperComponent | Mapping[str, Any]) -> list[str]:
    """Problems with one component's pod sets; an empty list means they are acceptable.

    Declared paths must resolve to a pod template, may not repeat, and, for kinds whose pod sets
    can be inferred, must agree with inference in count, paths and replicas.
    """
    parsed = _as_component(component)
    errors: list[str] = []
    seen: set[str] = set()
    for index, pod_set in enumerate(parsed.pod_sets):
        where = f"podSets[{index}]"
        if not pod_set.path:
            errors.append(f"{where}.path: podspec must specify path")
            continue
        if pod_set.path in seen:
            errors.append(f"{where}.path: multiple DeclaredPodSets with path '{pod_set.path}'")
        seen.add(pod_set.path)
        if pod_set.replicas is not None and pod_set.replicas < 0:
            errors.append(f"{where}.replicas: must not be negative, got {pod_set.replicas}")
        try:
            target = get_at_path(parsed.template, pod_set.path)
        except PodSetPathError as exc:
            errors.append(f"{where}.path: path does not refer to a v1.PodSpecTemplate: {exc}")
            continue
        if not is_pod_template(target):
            errors.append(
                f"{where}.path: path does not refer to a v1.PodSpecTemplate: "
                f"'{pod_set.path}' has no spec.containers"
            )
    if not parsed.pod_sets or not can_infer(parsed.template):
        return errors
    inferred = infer_pod_sets(parsed.template)
    if len(parsed.pod_sets) != len(inferred):
        errors.append(
            f"podSets: DeclaredPodSet count {len(parsed.pod_sets)} "
            f"differs from inferred count {len(inferred)}"
        )
        return errors
    declared = {pod_set.path: pod_set for pod_set in parsed.pod_sets}
    for pod_set in inferred:
        match = declared.get(pod_set.path)
        if match is None:
            errors.append(f"podSets: PodSet with path '{pod_set.path}' is missing")
        elif match.count != pod_set.count:
            errors.append(
                f"podSets: replica count {match.count} differs from inferred count {pod_set.count} "
                f"for PodSet at path position '{pod_set.path}'"
            )
    return errors


def validate_appwrapper_pod_sets(components: list[AppWrapperComponent]) -> list[str]:
    """Problems with the pod sets of a whole AppWrapper: each component's, then the total.

    Messages are prefixed with the JSON path of the offending component.
    """
    errors = [
        f"spec.components[{index}].{problem}"
        for index, component in enumerate(components)
        for problem in validate_pod_sets(component)
    ]
    total = total_pod_set_count(components)
    if total == 0:
        errors.append("spec.components: components contains no podspecs")
    elif total > MAX_POD_SETS:
        errors.append(
            f"spec.components: components contains {total} podspecs; at most {MAX_POD_SETS} are allowed"
        )
    return errors
