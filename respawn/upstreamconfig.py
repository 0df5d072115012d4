"""The upstream AppWrapper operator's configuration, turned into Respawn's configuration file.

Upstream reads a ConfigMap with one data key (``config.yaml``) holding its ``OperatorConfig``:
the AppWrapper settings under ``appwrapper:`` (``pkg/config`` of project-codeflare/appwrapper),
beside its manager's own (``controllerManager``, ``certManagement``, ``webhooksEnabled``). The
CodeFlare operator embeds the same AppWrapper settings under ``appwrapper:`` too, with an
``enabled`` switch, and its own keys at the top level. Either document, or the ConfigMap around
it, converts here into the keys of docs/configuration.md.

Upstream decodes the YAML as Go's encoding/json does, and this conversion reads it the same way:
durations are integer nanoseconds (how ``time.Duration`` marshals; Go duration strings, which
upstream would refuse, are taken too), key names match case-insensitively, a key upstream does
not know is ignored, and ``resourceTaints`` is merged into upstream's default map rather than
replacing it (a Go map is decoded into the existing one), so a file that names only
``amd.com/gpu`` keeps the ``nvidia.com/gpu`` default beside it, as upstream ran it.

Every key that has no Respawn equivalent is reported with the reason it can be dropped.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

import yaml

from shared.config import ConfigError, OperatorConfig, load_config, merge_documents
from shared.durations import format_go_duration, parse_go_duration

__all__ = [
    "Conversion",
    "Ignored",
    "UpstreamConfigError",
    "convert",
    "convert_text",
    "operator_config_of",
    "upstream_default_taints",
]


class UpstreamConfigError(ValueError):
    """The document cannot be converted; the message names the key and what is wrong."""


@dataclass(frozen=True)
class Ignored:
    """A key of the upstream document that has no Respawn setting, and why it can go."""

    key: str
    why: str


@dataclass(frozen=True)
class Conversion:
    config: dict[str, Any]
    ignored: tuple[Ignored, ...]
    validated: OperatorConfig

    def yaml(self) -> str:
        """Respawn's configuration file: the converted keys, after a comment naming what was
        left out and why."""
        lines = ["# Converted from the upstream AppWrapper operator configuration."]
        if self.ignored:
            lines.append("# Upstream keys with no Respawn setting, left out:")
            lines.extend(f"#   {item.key}: {item.why}" for item in self.ignored)
        body = yaml.safe_dump(self.config, sort_keys=False, default_flow_style=False) if self.config else ""
        return "\n".join(lines) + "\n" + body


# Why a key can be left out. Kept short: each is one comment line of the converted file.
_MANAGER = (
    "the upstream manager's own setting; each Respawn service serves probes and metrics on its own port"
)
_UNKNOWN = "not a key of upstream's configuration (upstream ignores it too)"
_IGNORED_TOP: Final = {
    "certManagement": "the upstream webhook's certificates; Respawn's webhook has its own (docs/webhooks.md)",
    "controllerManager": _MANAGER,
    "webhooksEnabled": "Respawn's admission webhook is a Deployment of its own (docs/webhooks.md)",
    # The CodeFlare operator's own keys (its manager settings are inline at the top level).
    "clientConnection": "the CodeFlare operator's API client settings; Respawn's services use their own",
    "metrics": _MANAGER,
    "health": _MANAGER,
    "leaderElection": "Respawn's replicas share the work by partition, without leader election",
    "kuberay": "the CodeFlare operator's RayCluster controller, not the AppWrapper controller",
}
_IGNORED_APPWRAPPER: Final = {
    "enabled": "the CodeFlare operator's switch for its embedded AppWrapper controller",
    "userRBACAdmissionCheck": "Respawn's webhook always checks the creator's rights (docs/webhooks.md)",
    "schedulerName": (
        "Respawn does not set a scheduler on the pods it creates: put spec.schedulerName in the "
        "component templates"
    ),
}
_FAULT_TOLERANCE_DURATIONS: Final = (
    "admissionGracePeriod",
    "warmupGracePeriod",
    "failureGracePeriod",
    "resetPause",
    "deletionGracePeriod",
    "gracePeriodCeiling",
    "successTTLCeiling",
)
_AUTOPILOT_FLAGS: Final = ("injectAntiAffinities", "monitorNodes")
_TAINT_FIELDS: Final = ("key", "value", "effect")


def _fold(doc: Mapping[str, Any], known: tuple[str, ...], where: str) -> tuple[dict[str, Any], list[str]]:
    """``doc``'s keys by their canonical spelling (encoding/json: an exact match first, else a
    case-insensitive one), and the keys that match none."""
    found: dict[str, Any] = {}
    unknown: list[str] = []
    lower = {k.lower(): k for k in known}
    for key in sorted(doc, key=lambda k: (str(k) not in known, str(k))):
        name = str(key)
        canonical = name if name in known else lower.get(name.lower())
        if canonical is None:
            unknown.append(f"{where}{name}")
        elif canonical not in found:
            found[canonical] = doc[key]
    return found, unknown


def _mapping(value: Any, key: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise UpstreamConfigError(f"{key} must be a mapping, got {type(value).__name__}")
    return value


def _duration(value: Any, key: str) -> str:
    """A Go duration string for an upstream duration: integer nanoseconds (or a duration string)."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise UpstreamConfigError(
            f"{key}: expected integer nanoseconds (as Go marshals a time.Duration), got {value!r}"
        )
    if isinstance(value, str):
        try:
            return format_go_duration(parse_go_duration(value.strip()))
        except ValueError as exc:
            raise UpstreamConfigError(f"{key}: {exc}") from None
    if value % 1000:
        raise UpstreamConfigError(f"{key}: {value}ns is finer than the microsecond Respawn counts in")
    return format_go_duration(timedelta(microseconds=value // 1000))


def _integer(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UpstreamConfigError(f"{key}: expected an integer, got {value!r}")
    return value


def _flag(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise UpstreamConfigError(f"{key}: expected true or false, got {value!r}")
    return value


def upstream_default_taints() -> dict[str, list[dict[str, str]]]:
    # Upstream's built-in map, which a file's resourceTaints is merged into (equal to Respawn's
    # default; a unit test ties the two).
    return {
        "nvidia.com/gpu": [
            {"key": "autopilot.ibm.com/gpuhealth", "value": "WARN", "effect": "PreferNoSchedule"},
            {"key": "autopilot.ibm.com/gpuhealth", "value": "TESTING", "effect": "NoSchedule"},
            {"key": "autopilot.ibm.com/gpuhealth", "value": "EVICT", "effect": "NoExecute"},
        ]
    }


def _taints(value: Any, key: str, ignored: list[Ignored]) -> dict[str, list[dict[str, str]]]:
    merged = upstream_default_taints()
    for resource, taints in _mapping(value, key).items():
        where = f'{key}["{resource}"]'
        if taints is None:
            merged[str(resource)] = []
            continue
        if not isinstance(taints, list):
            raise UpstreamConfigError(f"{where} must be a list of taints, got {type(taints).__name__}")
        converted = []
        for i, taint in enumerate(taints):
            fields, unknown = _fold(_mapping(taint, f"{where}[{i}]"), (*_TAINT_FIELDS, "timeAdded"), "")
            for name in unknown:
                ignored.append(Ignored(f"{where}[{i}].{name}", "not a field of a taint"))
            if "timeAdded" in fields:
                ignored.append(Ignored(f"{where}[{i}].timeAdded", "only a taint on a node has a time"))
            converted.append({f: "" if fields.get(f) is None else str(fields[f]) for f in _TAINT_FIELDS})
        merged[str(resource)] = converted
    return merged


def _autopilot(doc: Mapping[str, Any], ignored: list[Ignored]) -> dict[str, Any]:
    where = "appwrapper.autopilot."
    fields, unknown = _fold(doc, (*_AUTOPILOT_FLAGS, "resourceTaints", "preferNoScheduleWeight"), where)
    ignored.extend(Ignored(key, _UNKNOWN) for key in unknown)
    out: dict[str, Any] = {}
    for name in _AUTOPILOT_FLAGS:
        if fields.get(name) is not None:
            out[name] = _flag(fields[name], where + name)
    if fields.get("resourceTaints") is not None:
        out["resourceTaints"] = _taints(fields["resourceTaints"], where + "resourceTaints", ignored)
    if fields.get("preferNoScheduleWeight") is not None:
        out["preferNoScheduleWeight"] = _integer(
            fields["preferNoScheduleWeight"], where + "preferNoScheduleWeight"
        )
    return out


def _fault_tolerance(doc: Mapping[str, Any], ignored: list[Ignored]) -> dict[str, Any]:
    where = "appwrapper.faultTolerance."
    fields, unknown = _fold(doc, (*_FAULT_TOLERANCE_DURATIONS, "retryLimit"), where)
    ignored.extend(Ignored(key, _UNKNOWN) for key in unknown)
    out: dict[str, Any] = {}
    # In upstream's order, which is also Respawn's.
    for name in ("admissionGracePeriod", "warmupGracePeriod", "failureGracePeriod", "resetPause"):
        if fields.get(name) is not None:
            out[name] = _duration(fields[name], where + name)
    if fields.get("retryLimit") is not None:
        out["retryLimit"] = _integer(fields["retryLimit"], where + "retryLimit")
    for name in ("deletionGracePeriod", "gracePeriodCeiling", "successTTLCeiling"):
        if fields.get(name) is not None:
            out[name] = _duration(fields[name], where + name)
    return out


def _appwrapper(doc: Mapping[str, Any], ignored: list[Ignored]) -> dict[str, Any]:
    known = ("autopilot", "faultTolerance", "defaultQueueName", *_IGNORED_APPWRAPPER)
    fields, unknown = _fold(doc, (*known, "Config"), "appwrapper.")
    # The CodeFlare operator's form: the AppWrapper settings one level down, under the Go field
    # name Config (its tag names no key); merged over any given inline.
    if fields.get("Config") is not None:
        inner, inner_unknown = _fold(
            _mapping(fields.pop("Config"), "appwrapper.Config"), known, "appwrapper.Config."
        )
        fields.update({k: v for k, v in inner.items() if v is not None})
        unknown.extend(inner_unknown)
    ignored.extend(Ignored(key, _UNKNOWN) for key in unknown)
    out: dict[str, Any] = {}
    if fields.get("faultTolerance") is not None:
        ft = _fault_tolerance(_mapping(fields["faultTolerance"], "appwrapper.faultTolerance"), ignored)
        if ft:
            out["faultTolerance"] = ft
    if fields.get("autopilot") is not None:
        ap = _autopilot(_mapping(fields["autopilot"], "appwrapper.autopilot"), ignored)
        if ap:
            out["autopilot"] = ap
    queue = fields.get("defaultQueueName")
    if queue is not None:
        if not isinstance(queue, str):
            raise UpstreamConfigError(f"appwrapper.defaultQueueName: expected a string, got {queue!r}")
        out["defaultQueueName"] = queue
    for name, why in _IGNORED_APPWRAPPER.items():
        # An empty schedulerName is upstream's default: nothing is lost by leaving it out.
        if name in fields and not (name == "schedulerName" and not fields[name]):
            ignored.append(Ignored(f"appwrapper.{name}", why))
    return out


def operator_config_of(text: str) -> Mapping[str, Any]:
    """The operator configuration in ``text``: a ConfigMap (its one data key holds it, as
    upstream requires), or the configuration document itself."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UpstreamConfigError(f"not valid YAML: {exc}") from None
    if doc is None:
        return {}
    doc = _mapping(doc, "the document")
    if doc.get("kind") == "ConfigMap":
        data = doc.get("data") or {}
        if not isinstance(data, Mapping) or len(data) != 1:
            keys = ", ".join(sorted(map(str, data))) if isinstance(data, Mapping) else ""
            raise UpstreamConfigError(
                f"the ConfigMap must hold exactly one data key (upstream's rule), it holds: {keys or 'none'}"
            )
        [inner] = data.values()
        return operator_config_of(str(inner))
    return doc


def convert(doc: Mapping[str, Any], onto: Mapping[str, Any] | None = None) -> Conversion:
    """Respawn's configuration for upstream's ``OperatorConfig`` (or the CodeFlare operator's),
    written over ``onto`` (a Respawn configuration whose other keys, such as ``nats``, stay) when
    given, and validated as a service would load it. Raises :class:`UpstreamConfigError`."""
    ignored: list[Ignored] = []
    fields, unknown = _fold(doc, ("appwrapper", *_IGNORED_TOP), "")
    config: dict[str, Any] = {}
    if fields.get("appwrapper") is not None:
        config = _appwrapper(_mapping(fields["appwrapper"], "appwrapper"), ignored)
    for name, why in _IGNORED_TOP.items():
        if name in fields:
            ignored.append(Ignored(name, why))
    ignored.extend(Ignored(key, _UNKNOWN) for key in unknown)
    if onto is not None:
        # resourceTaints as a whole: the converted map is complete already (upstream's defaults
        # merged in), as an override's is.
        config = merge_documents(onto, config)
    return Conversion(config, tuple(ignored), _validate(config))


def convert_text(text: str, onto: str | None = None) -> Conversion:
    """As :func:`convert`, from the upstream document's text (and the Respawn file's, if any)."""
    base: Mapping[str, Any] | None = None
    if onto is not None:
        try:
            loaded = yaml.safe_load(onto)
        except yaml.YAMLError as exc:
            raise UpstreamConfigError(
                f"the Respawn configuration to convert onto is not valid YAML: {exc}"
            ) from None
        base = {} if loaded is None else _mapping(loaded, "the Respawn configuration to convert onto")
    return convert(operator_config_of(text), base)


def _validate(config: dict[str, Any]) -> OperatorConfig:
    # Through the services' own loader, file and all, so that a problem reads exactly as a
    # service would report it at start-up; no environment variable takes part.
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        try:
            return load_config(path, {})
        except ConfigError as exc:
            message = str(exc).replace(f" (file {path})", "")
            raise UpstreamConfigError(f"the converted configuration is not valid: {message}") from None
