"""The Python view of an AppWrapper (workload.codeflare.dev/v1beta2): one defensive reader of
the whole object, and strict models of the parts that are validated.

Why no typed model of the whole object (metadata, status, conditions): the services read
AppWrappers the API server has already checked against the CRD, and must go on judging one
whose field is odd anyway; a whole-object model would reject it for that one field. So they read
field by field, and a problem that matters becomes a warning, never an exception. That reading
is done here, once, by :func:`read_appwrapper`, which never raises (a missing or mistyped field
reads as empty). The lifecycle writes status back as the dict it read, keeping fields it does
not know.

What is validated strictly is what admission and pod-set inference must reject with a message:
the components (:class:`AppWrapperComponent`, its pod sets and podSetInfos), for the webhook and
``podsets``. (The tools check whole manifests they build with
``respawn.testbed.manifests.parse_appwrapper``; no service needs that.)

Field names follow upstream's JSON tags, not its documentation: the retry counter is
``status.resettingCount`` (the docs call it "retryCount") and declared pod sets are
``spec.components[].podSets``. The models keep fields they do not know (``extra="allow"``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from shared.appwrapper.constants import ConditionStatus, ConditionType

__all__ = [
    "AppWrapperComponent",
    "AppWrapperError",
    "AppWrapperFields",
    "PodSet",
    "PodSetInfo",
    "SchedulingGate",
    "Toleration",
    "as_mapping",
    "int_at",
    "list_at",
    "mapping_at",
    "read_appwrapper",
    "str_at",
]


# ---------------------------------------------------------------------------------------------
# Reading defensively


# These run a dozen times for every watch event and every reconcile: a plain dict (what JSON
# decodes to, by far the common case) is recognised by its type before the slower ABC check,
# and each accessor walks the path itself rather than through the others.


def as_mapping(value: Any) -> Mapping[str, Any]:
    """``value`` if it is a mapping, else an empty one."""
    return value if type(value) is dict or isinstance(value, Mapping) else {}


def _walk(obj: Any, keys: tuple[str, ...]) -> Any:
    """The value at ``keys`` below ``obj`` (``obj`` itself without keys); None if there is none."""
    value = obj
    for key in keys:
        if type(value) is not dict and not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def mapping_at(obj: Any, *keys: str) -> Mapping[str, Any]:
    """The object at ``keys`` below ``obj`` (``obj`` itself without keys); empty if there is none."""
    return as_mapping(_walk(obj, keys))


def list_at(obj: Any, *keys: str) -> list[Any]:
    """The list at ``keys`` below ``obj``; empty if there is none."""
    value = _walk(obj, keys)
    return value if isinstance(value, list) else []


def int_at(obj: Any, *keys: str) -> int | None:
    """The integer at ``keys`` below ``obj``; None if there is none."""
    value = _walk(obj, keys)
    # bool is an int in Python, but never a count.
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def str_at(obj: Any, *keys: str) -> str:
    """The string at ``keys`` below ``obj``; empty if there is none."""
    value = _walk(obj, keys)
    return value if isinstance(value, str) else ""


@dataclass(frozen=True, slots=True)
class AppWrapperFields:
    """What the services read off an AppWrapper, each field on its own (see :func:`read_appwrapper`)."""

    namespace: str = ""
    name: str = ""
    uid: str = ""
    # Keys as strings, values as found: the annotation parsers report a value that is not a
    # string rather than have it dropped here without a word.
    annotations: Mapping[str, Any] = field(default_factory=dict)
    # metadata.deletionTimestamp is set: the object is being torn down.
    deleting: bool = False
    suspend: bool = False
    # spec.managedBy; None when absent (or not a string).
    managed_by: str | None = None
    phase: str = ""
    resetting_count: int = 0
    conditions: tuple[Mapping[str, Any], ...] = ()
    component_status: tuple[Mapping[str, Any], ...] = ()

    def condition(self, ctype: ConditionType | str) -> Mapping[str, Any]:
        """The condition of type ``ctype``; empty if there is none."""
        return next((c for c in self.conditions if c.get("type") == ctype), {})

    def is_true(self, ctype: ConditionType | str) -> bool:
        return self.condition(ctype).get("status") == ConditionStatus.TRUE


def _mappings(values: list[Any]) -> tuple[Mapping[str, Any], ...]:
    return tuple(v for v in values if isinstance(v, Mapping))


def read_appwrapper(body: Any) -> AppWrapperFields:
    """The fields of a raw AppWrapper body. Never raises: whatever is missing or mistyped reads as
    empty (a body that is not an object reads as all empty)."""
    managed_by = mapping_at(body, "spec").get("managedBy")
    return AppWrapperFields(
        namespace=str_at(body, "metadata", "namespace"),
        name=str_at(body, "metadata", "name"),
        uid=str_at(body, "metadata", "uid"),
        annotations={str(k): v for k, v in mapping_at(body, "metadata", "annotations").items()},
        deleting=mapping_at(body, "metadata").get("deletionTimestamp") is not None,
        suspend=mapping_at(body, "spec").get("suspend") is True,
        managed_by=managed_by if isinstance(managed_by, str) else None,
        phase=str_at(body, "status", "phase"),
        resetting_count=int_at(body, "status", "resettingCount") or 0,
        conditions=_mappings(list_at(body, "status", "conditions")),
        component_status=_mappings(list_at(body, "status", "componentStatus")),
    )


# ---------------------------------------------------------------------------------------------
# Validating strictly


class AppWrapperError(ValueError):
    """An AppWrapper body that does not match the v1beta2 schema."""


class Wire(BaseModel):
    # JSON names in camelCase, as shared.config's sections: a deliberate mirror of that base, not
    # one base for both, because these keep the fields they do not know (an object written by a
    # newer upstream passes through whole) where the configuration rejects them.
    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="allow",
    )


class PodSet(Wire):
    """One pod template inside a component: where it is and how many pods it makes.

    ``replicas=None`` means one pod, as upstream.
    """

    replicas: int | None = None
    path: str
    annotations: dict[str, str] = Field(default_factory=dict)

    @property
    def count(self) -> int:
        return 1 if self.replicas is None else self.replicas


class Toleration(Wire):
    key: str | None = None
    operator: str | None = None
    value: str | None = None
    effect: str | None = None
    toleration_seconds: int | None = None


class SchedulingGate(Wire):
    name: str


class PodSetInfo(Wire):
    """What Kueue injects into the pod template of the matching pod set on admission."""

    annotations: dict[str, str] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    scheduling_gates: list[SchedulingGate] = Field(default_factory=list)


class AppWrapperComponent(Wire):
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
            found = value.get(key)
            if not isinstance(found, str) or not found:
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
