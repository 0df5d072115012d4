"""Attempt identity: which attempt a pod belongs to, stamped on every pod template lifecycle renders.

An attempt is one deployment of the AppWrapper's components; every reset (counted toward the
retry limit or not: an Autopilot migration, a transient failure) ends one and begins the next.
``status.attempt`` holds the number of the current one. It is incremented in the same status
write that enters Resetting, so a process killed at any point neither skips nor repeats a number.
An AppWrapper written before the field existed has had ``1 + resettingCount`` attempts as far as
anything can tell (resets that did not count left no trace).

Every pod of attempt ``k`` carries:

- the label ``respawn.dev/attempt: "<k>"`` and the label ``respawn.dev/pod-set: "<i>"`` (the
  index of its pod set among all the AppWrapper's pod sets, in component order);
- in every container and init container, the environment variables ``RESPAWN_ATTEMPT=<k>`` and
  ``RESPAWN_ATTEMPT_ID=<AppWrapper uid>-<k>`` (unique across AppWrappers and attempts, the same
  for every pod of one attempt: a training job can name its checkpoint directory after it). A
  variable the container already defines under either name is left as the user wrote it.

Pure; no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from services.lifecycle.templating import PodTemplateContext, PodTemplateHook
from services.lifecycle.verdicts import resetting_count
from shared.appwrapper.constants import ATTEMPT_LABEL, POD_SET_LABEL

__all__ = [
    "ATTEMPT_ENV",
    "ATTEMPT_ID_ENV",
    "attempt_hook",
    "attempt_id",
    "attempt_of",
]

ATTEMPT_ENV: Final = "RESPAWN_ATTEMPT"
ATTEMPT_ID_ENV: Final = "RESPAWN_ATTEMPT_ID"

# status.attempt is an int32.
_INT32_MAX: Final = (1 << 31) - 1


def attempt_of(status: Mapping[str, Any]) -> int:
    """The number of the current attempt (1 for the first deployment)."""
    value = status.get("attempt")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    return min(1 + resetting_count(status), _INT32_MAX)


def next_attempt(status: Mapping[str, Any]) -> int:
    """The number the next attempt gets (written on entering Resetting)."""
    return min(attempt_of(status) + 1, _INT32_MAX)


def attempt_id(appwrapper_uid: str, attempt: int) -> str:
    return f"{appwrapper_uid}-{attempt}"


def attempt_hook(appwrapper_uid: str, attempt: int, first_pod_set: Mapping[int, int]) -> PodTemplateHook:
    """A hook that stamps attempt ``attempt`` on a pod template. ``first_pod_set`` maps a
    component index to the global index of its first pod set."""
    number = str(attempt)
    identity = attempt_id(appwrapper_uid, attempt)

    def hook(context: PodTemplateContext, template: dict[str, Any]) -> dict[str, Any]:
        meta = template.get("metadata")
        if meta is None:
            meta = template["metadata"] = {}
        if not isinstance(meta, dict):
            raise ValueError("the pod template's metadata must be an object")
        labels = meta.get("labels")
        if labels is None:
            labels = meta["labels"] = {}
        if not isinstance(labels, dict):
            raise ValueError("the pod template's labels must be an object")
        # Ours: a value in the template (copied from an earlier attempt's pod, say) is replaced.
        labels[ATTEMPT_LABEL] = number
        labels[POD_SET_LABEL] = str(first_pod_set.get(context.component_index, 0) + context.pod_set_index)
        spec = template.get("spec")
        if isinstance(spec, dict):
            for key in ("initContainers", "containers"):
                containers = spec.get(key)
                if isinstance(containers, list):
                    for container in containers:
                        if isinstance(container, dict):
                            _add_env(container, ((ATTEMPT_ENV, number), (ATTEMPT_ID_ENV, identity)))
        return template

    return hook


def _add_env(container: dict[str, Any], values: tuple[tuple[str, str], ...]) -> None:
    env = container.get("env")
    if env is None:
        env = container["env"] = []
    if not isinstance(env, list):
        raise ValueError(f"container {container.get('name', '?')}: 'env' must be a list")
    # The user's own definition wins: they may have a reason to pin it.
    defined = {e.get("name") for e in env if isinstance(e, Mapping)}
    for name, value in values:
        if name not in defined:
            env.append({"name": name, "value": value})
