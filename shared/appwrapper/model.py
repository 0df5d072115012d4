"""Typed view of an AppWrapper (workload.codeflare.dev/v1beta2) as the API server serialises it.

Field names follow upstream's JSON tags, not its documentation: the retry counter is
``status.resettingCount`` (the docs call it "retryCount") and declared pod sets are
``spec.components[].podSets``. Every model keeps fields it does not know (``extra="allow"``)
so that reading an object written by a newer upstream and writing it back loses nothing.

:func:`dump_appwrapper` omits defaults and empty collections, which mirrors Go's
``omitempty`` and keeps patches minimal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel
from pydantic.functional_serializers import PlainSerializer

from shared.appwrapper.constants import API_VERSION, KIND, ConditionStatus, ConditionType, Phase
from shared.kubetime import format_kube_time

__all__ = [
    "AppWrapper",
    "AppWrapperComponent",
    "AppWrapperError",
    "AppWrapperSpec",
    "AppWrapperStatus",
    "ComponentStatus",
    "Condition",
    "ObjectMeta",
    "PodSet",
    "PodSetInfo",
    "SchedulingGate",
    "Toleration",
    "dump_appwrapper",
    "format_kube_time",
    "parse_appwrapper",
]


class AppWrapperError(ValueError):
    """An AppWrapper body that does not match the v1beta2 schema."""


# Timezone-aware on purpose: a naive datetime would silently mean "local time" and shift every
# grace-period deadline by the host's UTC offset.
KubeTime = Annotated[AwareDatetime, PlainSerializer(format_kube_time, return_type=str, when_used="json")]


class _Wire(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="allow",
    )


class ObjectMeta(_Wire):
    name: str = ""
    generate_name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    generation: int | None = None
    creation_timestamp: KubeTime | None = None
    deletion_timestamp: KubeTime | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    finalizers: list[str] = Field(default_factory=list)


class PodSet(_Wire):
    """One pod template inside a component: where it is and how many pods it makes.

    ``replicas=None`` means one pod, as upstream.
    """

    replicas: int | None = None
    path: str
    annotations: dict[str, str] = Field(default_factory=dict)

    @property
    def count(self) -> int:
        return 1 if self.replicas is None else self.replicas


class Toleration(_Wire):
    key: str | None = None
    operator: str | None = None
    value: str | None = None
    effect: str | None = None
    toleration_seconds: int | None = None


class SchedulingGate(_Wire):
    name: str


class PodSetInfo(_Wire):
    """What Kueue injects into the pod template of the matching pod set on admission."""

    annotations: dict[str, str] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    scheduling_gates: list[SchedulingGate] = Field(default_factory=list)


class AppWrapperComponent(_Wire):
    annotations: dict[str, str] = Field(default_factory=dict)
    # Upstream's Go field is DeclaredPodSets; an empty list means "infer them".
    pod_sets: list[PodSet] = Field(default_factory=list)
    pod_set_infos: list[PodSetInfo] = Field(default_factory=list)
    # The complete embedded resource, kept as raw JSON because it can be any kind.
    template: dict[str, Any]

    @field_validator("template")
    @classmethod
    def _template_is_a_resource(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in ("apiVersion", "kind"):
            field = value.get(key)
            if not isinstance(field, str) or not field:
                raise ValueError(f"the wrapped resource must have a non-empty string '{key}'")
        metadata = value.get("metadata", {})
        if not isinstance(metadata, Mapping):
            raise ValueError("the wrapped resource's 'metadata' must be an object")
        return value

    @property
    def template_kind(self) -> str:
        return str(self.template["kind"])

    @property
    def template_api_version(self) -> str:
        return str(self.template["apiVersion"])


class AppWrapperSpec(_Wire):
    components: list[AppWrapperComponent]
    suspend: bool = False
    managed_by: str | None = None


class Condition(_Wire):
    """metav1.Condition. ``last_transition_time`` changes only when ``status`` changes."""

    type: str
    status: ConditionStatus
    last_transition_time: KubeTime
    reason: str
    message: str
    observed_generation: int | None = None


class ComponentStatus(_Wire):
    name: str
    kind: str
    api_version: str
    # The validated pod sets (declared or inferred) recorded when the AppWrapper was first seen.
    pod_sets: list[PodSet]
    conditions: list[Condition] = Field(default_factory=list)

    def condition(self, ctype: ConditionType | str) -> Condition | None:
        return _find_condition(self.conditions, ctype)


class AppWrapperStatus(_Wire):
    phase: Phase = Phase.EMPTY
    # The number of times the AppWrapper entered Resetting (the docs' "retryCount").
    resetting_count: int = 0
    conditions: list[Condition] = Field(default_factory=list)
    component_status: list[ComponentStatus] = Field(default_factory=list)

    def condition(self, ctype: ConditionType | str) -> Condition | None:
        return _find_condition(self.conditions, ctype)

    def is_true(self, ctype: ConditionType | str) -> bool:
        found = self.condition(ctype)
        return found is not None and found.status == ConditionStatus.TRUE


class AppWrapper(_Wire):
    api_version: str
    kind: str
    metadata: ObjectMeta
    spec: AppWrapperSpec
    status: AppWrapperStatus = Field(default_factory=AppWrapperStatus)

    @field_validator("api_version")
    @classmethod
    def _known_api_version(cls, value: str) -> str:
        if value != API_VERSION:
            raise ValueError(f"expected '{API_VERSION}', got '{value}'")
        return value

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, value: str) -> str:
        if value != KIND:
            raise ValueError(f"expected '{KIND}', got '{value}'")
        return value

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str:
        return self.metadata.namespace


def _find_condition(conditions: list[Condition], ctype: ConditionType | str) -> Condition | None:
    for cond in conditions:
        if cond.type == ctype:
            return cond
    return None


def _location(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text or "(root)"


def _describe(body: Mapping[str, Any]) -> str:
    metadata = body.get("metadata")
    if isinstance(metadata, Mapping):
        name = metadata.get("name") or metadata.get("generateName")
        namespace = metadata.get("namespace")
        if isinstance(name, str) and name:
            prefix = f"{namespace}/" if isinstance(namespace, str) and namespace else ""
            return f"AppWrapper {prefix}{name}"
    return "AppWrapper"


def parse_appwrapper(body: Mapping[str, Any]) -> AppWrapper:
    """Validate a raw AppWrapper object (as returned by the API server or loaded from YAML).

    Raises :class:`AppWrapperError` whose message names every offending field by its JSON path,
    e.g. ``AppWrapper team1/job: spec.components[0].podSets[0].path: Field required``.
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


def dump_appwrapper(appwrapper: AppWrapper) -> dict[str, Any]:
    """The JSON body of an AppWrapper, with unset optional fields and empty collections omitted."""
    return appwrapper.model_dump(mode="json", by_alias=True, exclude_defaults=True)
