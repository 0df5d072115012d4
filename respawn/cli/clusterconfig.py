"""The operator configuration as deployed: what Respawn's lifecycle service runs with in the cluster.

The retry limit `respawn status` shows must be the one lifecycle applies, so it is read the way
lifecycle gets it (deploy/base): the file its ``RESPAWN_CONFIG`` names, mounted from a ConfigMap
(whose generated name has a hash suffix, so the Deployment is what says which), and the
environment of its container (``envFrom`` ConfigMaps, then ``env`` values). Reading is pure
(:func:`configmaps_of`, :func:`deployed_config` on the Deployment and ConfigMap objects); the
Kubernetes I/O is :func:`fetch_deployed_config`.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shared.config import CONFIG_ENV, ConfigError, OperatorConfig, config_from_text, load_config

if TYPE_CHECKING:
    from shared.kube.client import Kube

__all__ = [
    "DEFAULT_RESPAWN_NAMESPACE",
    "LIFECYCLE_SELECTOR",
    "ConfigSource",
    "configmaps_of",
    "deployed_config",
    "fetch_deployed_config",
    "local_config",
]

# Where deploy/ installs Respawn.
DEFAULT_RESPAWN_NAMESPACE = "respawn-system"
# The labels of lifecycle's Deployment (deploy/base/services/lifecycle.yaml).
LIFECYCLE_SELECTOR = "app.kubernetes.io/name=respawn,app.kubernetes.io/component=lifecycle"
LIFECYCLE_CONTAINER = "lifecycle"
# Short: an unreadable configuration falls back, it does not hold the command up.
REQUEST_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class ConfigSource:
    """The operator configuration and where it came from.

    ``kind``: ``cluster`` (the deployed one), ``file`` (``--config`` or ``RESPAWN_CONFIG``) or
    ``builtin`` (the defaults, with any ``RESPAWN_*`` variables of this shell). ``origin`` names
    the ConfigMap or file; ``problem`` says why the cluster's could not be used ("" if it was,
    or was not asked for)."""

    config: OperatorConfig
    kind: str
    origin: str
    problem: str = ""


def _container(deployment: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = deployment.get("spec", {}).get("template", {}).get("spec", {})
    containers = [c for c in spec.get("containers") or [] if isinstance(c, Mapping)]
    if not containers:
        raise ConfigError("its Deployment has no container")
    named = [c for c in containers if c.get("name") == LIFECYCLE_CONTAINER]
    return named[0] if named else containers[0]


def _volumes(deployment: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    spec = deployment.get("spec", {}).get("template", {}).get("spec", {})
    return {str(v.get("name")): v for v in spec.get("volumes") or [] if isinstance(v, Mapping)}


def _config_file(deployment: Mapping[str, Any]) -> tuple[str, str] | None:
    """(ConfigMap name, key) of the file ``RESPAWN_CONFIG`` names; None: no such file."""
    container = _container(deployment)
    path = next(
        (
            str(e.get("value"))
            for e in container.get("env") or []
            if e.get("name") == CONFIG_ENV and "value" in e
        ),
        None,
    )
    if not path:
        return None
    volumes = _volumes(deployment)
    for mount in container.get("volumeMounts") or []:
        mount_path = str(mount.get("mountPath", "")).rstrip("/")
        if not path.startswith(mount_path + "/"):
            continue
        relative = posixpath.relpath(path, mount_path)
        if mount.get("subPath"):
            relative = (
                posixpath.join(str(mount["subPath"]), relative) if relative != "." else mount["subPath"]
            )
        source = volumes.get(str(mount.get("name")), {}).get("configMap")
        if not isinstance(source, Mapping):
            raise ConfigError(f"{CONFIG_ENV}={path} is not on a ConfigMap volume")
        # A volume that projects keys to other paths (items) maps the path back to its key.
        for item in source.get("items") or []:
            if item.get("path") == relative:
                return str(source.get("name")), str(item.get("key"))
        return str(source.get("name")), relative
    raise ConfigError(f"{CONFIG_ENV}={path} is on no volume of the Deployment")


def configmaps_of(deployment: Mapping[str, Any]) -> list[str]:
    """The ConfigMaps lifecycle's configuration comes from: the file's, then ``envFrom``'s."""
    names: list[str] = []
    if (file := _config_file(deployment)) is not None:
        names.append(file[0])
    for source in _container(deployment).get("envFrom") or []:
        ref = source.get("configMapRef")
        if isinstance(ref, Mapping) and ref.get("name") and ref["name"] not in names:
            names.append(str(ref["name"]))
    return names


def deployed_config(
    deployment: Mapping[str, Any], configmaps: Mapping[str, Mapping[str, Any]], namespace: str
) -> ConfigSource:
    """The configuration lifecycle runs with, from its Deployment and the ConfigMaps it names
    (``configmaps``: the ConfigMap objects by name; a missing one is an error unless optional).
    Raises :class:`ConfigError`."""
    container = _container(deployment)
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        ref = source.get("configMapRef")
        if not isinstance(ref, Mapping):
            continue  # a Secret's values are not read: the retry limit is never a secret
        found = configmaps.get(str(ref.get("name")))
        if found is None:
            if ref.get("optional"):
                continue
            raise ConfigError(f"ConfigMap {namespace}/{ref.get('name')} does not exist")
        prefix = str(source.get("prefix") or "")
        env.update({prefix + k: str(v) for k, v in (found.get("data") or {}).items()})
    # Later entries win, as in the container; a value from a field or a Secret is not known here.
    env.update({str(e["name"]): str(e["value"]) for e in container.get("env") or [] if "value" in e})
    text: str | None = None
    origin = f"Deployment {namespace}/{deployment.get('metadata', {}).get('name', '?')}"
    if (file := _config_file(deployment)) is not None:
        name, key = file
        configmap = configmaps.get(name)
        if configmap is None:
            raise ConfigError(f"ConfigMap {namespace}/{name} does not exist")
        data = configmap.get("data") or {}
        if key not in data:
            raise ConfigError(f"ConfigMap {namespace}/{name} has no key {key}")
        text = str(data[key])
        origin = f"ConfigMap {namespace}/{name}"
    env.pop(CONFIG_ENV, None)  # the file is read above, from the ConfigMap, not from this machine
    return ConfigSource(config_from_text(text, env, origin), "cluster", origin)


def local_config(path: Path | None) -> ConfigSource:
    """``--config`` / ``RESPAWN_CONFIG`` on this machine, else the built-in defaults (with this
    shell's ``RESPAWN_*`` variables). Raises :class:`ConfigError`."""
    import os

    named = path or (Path(os.environ[CONFIG_ENV]) if os.environ.get(CONFIG_ENV) else None)
    config = load_config(path)
    return ConfigSource(config, "file", str(named)) if named else ConfigSource(config, "builtin", "")


async def fetch_deployed_config(kube: Kube, namespace: str) -> ConfigSource:
    """The configuration of Respawn's lifecycle Deployment in ``namespace``.

    Raises :class:`ConfigError` with the reason when it cannot be read (no such Deployment, no
    permission, a ConfigMap missing, an invalid configuration)."""
    from shared.kube.client import KubeApiError, ResourceRef

    deployments = ResourceRef("apps", "v1", "deployments", "Deployment", namespaced=True)
    configmaps = ResourceRef("", "v1", "configmaps", "ConfigMap", namespaced=True)
    try:
        listing = await kube.request(
            "GET",
            deployments.path(namespace),
            query={"labelSelector": LIFECYCLE_SELECTOR},
            request_timeout=REQUEST_TIMEOUT,
            retry=None,
        )
        items = [i for i in listing.get("items") or [] if isinstance(i, Mapping)]
        if not items:
            raise ConfigError(f"no Respawn lifecycle Deployment in namespace {namespace}")
        deployment = items[0]
        found: dict[str, Mapping[str, Any]] = {}
        for name in configmaps_of(deployment):
            try:
                found[name] = await kube.request(
                    "GET", configmaps.path(namespace, name), request_timeout=REQUEST_TIMEOUT, retry=None
                )
            except KubeApiError as exc:
                if not exc.not_found:
                    raise
    except KubeApiError as exc:
        message = " ".join(str(exc.message or exc).split())
        raise ConfigError(message or f"HTTP {exc.status}") from exc
    return deployed_config(deployment, found, namespace)
