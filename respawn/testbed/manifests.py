"""Manifests of the objects Respawn runs, for the demo, the benchmarks and the tests: one factory.

Every builder returns a fresh, JSON-ready dict holding what it is asked for and what the API
server requires, nothing more (an optional field left as None is not written), so a test that
looks at a field sees exactly what it set. They compose::

    appwrapper("train", component(job("train-job", pods=2, template=pod_template(gpus=1))))

The testbed's pods follow the pod simulation contract (``respawn.testbed.sim``): a pod runs until
an annotation on its template tells it to finish, fail or get stuck.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import ValidationError, ValidationInfo, field_validator

from shared.appwrapper import params
from shared.appwrapper.constants import API_VERSION, KIND
from shared.appwrapper.model import AppWrapperComponent, AppWrapperError, Wire, str_at
from shared.kubetime import format_kube_time

__all__ = [
    "GPU",
    "AppWrapper",
    "AppWrapperSpec",
    "appwrapper",
    "component",
    "condition",
    "deployment",
    "fault_tolerance",
    "job",
    "job_appwrapper",
    "parse_appwrapper",
    "pod",
    "pod_template",
    "pytorchjob",
]

GPU = "nvidia.com/gpu"
IMAGE = "busybox"


def _fields(**fields: Any) -> dict[str, Any]:
    # What is not given (None) is left out; what is given is written, even if empty.
    return {k: dict(v) if isinstance(v, Mapping) else v for k, v in fields.items() if v is not None}


def _metadata(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, **_fields(**fields)}


def pod_template(
    *,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    gpus: int = 0,
    init_container: bool = False,
    container: str = "main",
    image: str = IMAGE,
    restart_policy: str | None = "Never",
) -> dict[str, Any]:
    """A v1 PodTemplateSpec of one container (``gpus``: its nvidia.com/gpu limit).

    ``annotations`` carry the simulation contract (``sim.respawn.dev/*``); ``init_container``
    adds one init container (which ``sim.STUCK_INIT`` keeps running); ``restart_policy=None``
    leaves it to the owner (a PyTorchJob sets it per replica type).
    """
    main: dict[str, Any] = {"name": container, "image": image}
    if gpus:
        main["resources"] = {"limits": {GPU: str(gpus)}}
    spec: dict[str, Any] = {"containers": [main]}
    if restart_policy:
        spec["restartPolicy"] = restart_policy
    if init_container:
        spec["initContainers"] = [{"name": "setup", "image": image}]
    metadata = _fields(labels=labels, annotations=annotations)
    return {"metadata": metadata, "spec": spec} if metadata else {"spec": spec}


def pod(name: str, *, namespace: str | None = None, **template: Any) -> dict[str, Any]:
    """A bare v1 Pod; ``template`` as for :func:`pod_template`."""
    built = pod_template(**template)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**_metadata(name, namespace=namespace), **built.get("metadata", {})},
        "spec": built["spec"],
    }


def job(
    name: str,
    *,
    pods: int | None = None,
    template: dict[str, Any] | None = None,
    labels: Mapping[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A batch/v1 Job; ``pods`` sets parallelism and completions (left out: the Job's defaults).

    Further ``spec`` fields by their JSON names, e.g. ``backoffLimit=0``.
    """
    body: dict[str, Any] = {} if pods is None else {"parallelism": pods, "completions": pods}
    body.update(spec)
    body["template"] = pod_template() if template is None else template
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": _metadata(name, labels=labels), "spec": body}


def deployment(
    name: str,
    *,
    replicas: int | None = None,
    template: dict[str, Any] | None = None,
    kind: str = "Deployment",
) -> dict[str, Any]:
    """An apps/v1 Deployment (or, by ``kind``, a StatefulSet or ReplicaSet).

    Its selector matches the template's labels, when the template has any.
    """
    template = pod_template(restart_policy="Always") if template is None else template
    spec: dict[str, Any] = {} if replicas is None else {"replicas": replicas}
    labels = template.get("metadata", {}).get("labels")
    if labels:
        spec["selector"] = {"matchLabels": dict(labels)}
    spec["template"] = template
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": _metadata(name), "spec": spec}


def pytorchjob(
    name: str,
    *,
    replicas: Mapping[str, int | None] | None = None,
    template: dict[str, Any] | None = None,
    restart_policy: str = "Never",
) -> dict[str, Any]:
    """A kubeflow.org/v1 PyTorchJob; ``replicas`` per replica type, in order (default: one
    Master and one Worker; None leaves a type's count out). Every type runs ``template``.
    """
    # The training operator finds the framework's container by this name.
    template = pod_template(container="pytorch", restart_policy=None) if template is None else template
    specs: dict[str, Any] = {}
    for role, count in (replicas if replicas is not None else {"Master": 1, "Worker": 1}).items():
        specs[role] = {"restartPolicy": restart_policy, "template": template}
        if count is not None:
            specs[role]["replicas"] = count
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": _metadata(name),
        "spec": {"pytorchReplicaSpecs": specs},
    }


def component(template: dict[str, Any], *, pod_sets: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One entry of an AppWrapper's ``spec.components``: the wrapped resource and its declared pod sets."""
    entry: dict[str, Any] = {"template": template}
    if pod_sets is not None:
        entry["podSets"] = pod_sets
    return entry


def appwrapper(
    name: str,
    *components: dict[str, Any],
    namespace: str | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    suspend: bool | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """An AppWrapper of ``components`` (see :func:`component`); further ``spec`` fields by their
    JSON names, e.g. ``managedBy=...``. ``suspend`` left unset is the API server's default (false).
    """
    body = _fields(suspend=suspend, components=list(components), **spec)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": _metadata(name, namespace=namespace, labels=labels, annotations=annotations),
        "spec": body,
    }


def job_appwrapper(
    name: str,
    *,
    pods: int = 1,
    gpus: int = 0,
    pod_annotations: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    namespace: str | None = None,
    job_name: str | None = None,
    suspend: bool = False,
    init_container: bool = False,
) -> dict[str, Any]:
    """An AppWrapper around one batch/v1 Job of ``pods`` pods (``backoffLimit: 0``, so the Job
    itself never replaces a failed pod and every failure is Respawn's to handle).

    ``gpus`` is the nvidia.com/gpu limit of each pod; ``pod_annotations`` go on the pod template
    (the testbed's simulation contract: ``sim.respawn.dev/*``); ``annotations`` on the AppWrapper.
    """
    template = pod_template(annotations=pod_annotations, gpus=gpus, init_container=init_container)
    return appwrapper(
        name,
        component(job(job_name or f"{name}-job", pods=pods, backoffLimit=0, template=template)),
        namespace=namespace,
        annotations=annotations,
        suspend=suspend,
    )


def fault_tolerance(
    *,
    admission_grace: str | None = None,
    warmup_grace: str | None = None,
    failure_grace: str | None = None,
    retry_pause: str | None = None,
    retry_limit: int | None = None,
    forceful_deletion_grace: str | None = None,
    terminal_exit_codes: str | None = None,
) -> dict[str, str]:
    """The AppWrapper annotations (upstream's) that set the fault-tolerance parameters given;
    durations as Go writes them ("90s", "5m")."""
    given = {
        params.ADMISSION_GRACE_PERIOD_ANNOTATION: admission_grace,
        params.WARMUP_GRACE_PERIOD_ANNOTATION: warmup_grace,
        params.FAILURE_GRACE_PERIOD_ANNOTATION: failure_grace,
        params.RETRY_PAUSE_PERIOD_ANNOTATION: retry_pause,
        params.RETRY_LIMIT_ANNOTATION: None if retry_limit is None else str(retry_limit),
        params.FORCEFUL_DELETION_GRACE_PERIOD_ANNOTATION: forceful_deletion_grace,
        params.TERMINAL_EXIT_CODES_ANNOTATION: terminal_exit_codes,
    }
    return {key: value for key, value in given.items() if value is not None}


def condition(
    ctype: str, status: str = "True", *, reason: str, at: datetime, message: str = ""
) -> dict[str, Any]:
    """A metav1.Condition as it stands in an AppWrapper's status."""
    return {
        "type": ctype,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": format_kube_time(at),
    }


# ---------------------------------------------------------------------------------------------
# Checking a built manifest strictly (the services read received objects defensively instead:
# shared.appwrapper.model.read_appwrapper)


class AppWrapperSpec(Wire):
    components: list[AppWrapperComponent]
    suspend: bool = False
    managed_by: str | None = None


class AppWrapper(Wire):
    """A whole manifest, as :func:`parse_appwrapper` checks it: kind, apiVersion and spec.
    Metadata and status are kept as they came (unchecked extra fields)."""

    api_version: str
    kind: str
    spec: AppWrapperSpec

    @field_validator("api_version", "kind")
    @classmethod
    def _known(cls, value: str, info: ValidationInfo) -> str:
        expected = {"api_version": API_VERSION, "kind": KIND}[info.field_name or ""]
        if value != expected:
            raise ValueError(f"expected '{expected}', got '{value}'")
        return value


def _location(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text or "(root)"


def _describe(body: Mapping[str, Any]) -> str:
    name = str_at(body, "metadata", "name") or str_at(body, "metadata", "generateName")
    if not name:
        return "AppWrapper"
    namespace = str_at(body, "metadata", "namespace")
    return f"AppWrapper {namespace}/{name}" if namespace else f"AppWrapper {name}"


def parse_appwrapper(body: Mapping[str, Any]) -> AppWrapper:
    """Check a whole AppWrapper manifest (as built, or loaded from YAML): kind, apiVersion and
    every component.

    Raises :class:`AppWrapperError` whose message names every offending field by its JSON path,
    e.g. ``AppWrapper team1/job is malformed: spec.components[0].podSets[0].path: Field required``.
    """
    if not isinstance(body, Mapping):
        raise AppWrapperError(f"an AppWrapper must be a JSON object, got {type(body).__name__}")
    try:
        return AppWrapper.model_validate(body)
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_url=False):
            message = str(err["msg"]).removeprefix("Value error, ")
            problems.append(f"{_location(tuple(err['loc']))}: {message}")
        raise AppWrapperError(f"{_describe(body)} is malformed: " + "; ".join(problems)) from None
