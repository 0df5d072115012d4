"""AppWrapper annotations by which a user steers how a workload ends (Respawn additions).

- ``respawn.dev/stop``: ``"true"`` stops the workload (everything deleted, the AppWrapper Failed
  with reason ``Stopped``, nothing retried); ``"false"`` or no annotation: nothing happens. Any
  other value is refused at admission (and ignored should one get past it).
- ``respawn.dev/completion-policy``: per pod set, how many pods must succeed for the workload to
  succeed (``minSucceeded``) and how many must fail for it to fail (``minFailed``), as
  FrameworkController's ``minSucceededTaskCount`` / ``minFailedTaskCount`` per task role. A JSON
  (or YAML) object keyed by pod set index (the index of a pod set among all the AppWrapper's pod
  sets, in component order)::

      {"0": {"minSucceeded": 1}, "1": {"minFailed": 2}}

  Without an entry (or without the annotation) a pod set keeps the default: every pod must
  succeed, and one failed pod fails the workload.

Pure; parsing never reads a clock or does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import yaml

from shared.appwrapper.constants import COMPLETION_POLICY_ANNOTATION, MAX_POD_SETS, STOP_ANNOTATION

__all__ = [
    "CompletionPolicy",
    "completion_policy",
    "parse_completion_policy",
    "parse_stop",
    "stop_requested",
]

_STOP_VALUES: Final = {"true": True, "false": False}
_POLICY_KEYS: Final = {"minSucceeded", "minFailed"}
# Longer than any sensible policy: a bigger value is refused before it is parsed.
_MAX_POLICY_TEXT: Final = 4096


def parse_stop(value: object) -> bool:
    """What a ``respawn.dev/stop`` value asks for; ValueError for anything but "true"/"false"."""
    if isinstance(value, str) and value in _STOP_VALUES:
        return _STOP_VALUES[value]
    raise ValueError(f'{STOP_ANNOTATION} must be "true" or "false", got {value!r}')


def stop_requested(metadata: Mapping[str, Any]) -> bool:
    """Whether the AppWrapper with this ``metadata`` asks to be stopped."""
    annotations = metadata.get("annotations")
    if not isinstance(annotations, Mapping) or STOP_ANNOTATION not in annotations:
        return False
    try:
        return parse_stop(annotations[STOP_ANNOTATION])
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class CompletionPolicy:
    """Pod set index -> threshold; a pod set without an entry keeps the default."""

    min_succeeded: Mapping[int, int] = field(default_factory=dict)
    min_failed: Mapping[int, int] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.min_succeeded and not self.min_failed

    def failed_enough(self, pod_set: int | None, failed: int) -> bool:
        """Whether ``failed`` failed pods of ``pod_set`` fail the workload (None: a pod whose
        pod set is not known, judged by the default of one)."""
        threshold = self.min_failed.get(pod_set, 1) if pod_set is not None else 1
        return failed >= threshold

    def succeeded_by(self, succeeded: Mapping[int, int]) -> int | None:
        """The first pod set whose ``minSucceeded`` the counts of succeeded pods per pod set
        meet, or None."""
        for pod_set in sorted(self.min_succeeded):
            if succeeded.get(pod_set, 0) >= self.min_succeeded[pod_set]:
                return pod_set
        return None

    def tolerated(self, pod_set: int | None) -> bool:
        """Whether a failure of a pod of ``pod_set`` may be tolerated at all (minFailed > 1)."""
        return pod_set is not None and self.min_failed.get(pod_set, 1) > 1


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where} must be a whole number of at least 1, got {value!r}")
    return value


def parse_completion_policy(text: object, pod_sets: int | None = None) -> CompletionPolicy:
    """The policy a ``respawn.dev/completion-policy`` value states; ValueError with a message
    that names what is wrong. ``pod_sets``, when known, is how many pod sets the AppWrapper has
    (an entry for a pod set that does not exist is an error)."""
    what = COMPLETION_POLICY_ANNOTATION
    if not isinstance(text, str):
        raise ValueError(f"{what} must be a string")
    if len(text) > _MAX_POLICY_TEXT:
        raise ValueError(f"{what} is longer than {_MAX_POLICY_TEXT} characters")
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"{what} is not valid JSON or YAML: {first}") from None
    if not isinstance(loaded, Mapping):
        raise ValueError(
            f'{what} must be an object keyed by pod set index, e.g. {{"0": {{"minSucceeded": 1}}}}'
        )
    limit = MAX_POD_SETS if pod_sets is None else pod_sets
    min_succeeded: dict[int, int] = {}
    min_failed: dict[int, int] = {}
    for key, entry in loaded.items():
        index_text = str(key)
        if isinstance(key, bool) or not index_text.isdigit():
            raise ValueError(f"{what}: {key!r} is not a pod set index (0, 1, ...)")
        index = int(index_text)
        if index >= limit:
            raise ValueError(f"{what}: pod set {index} does not exist (the AppWrapper has {limit} pod sets)")
        where = f"{what}: pod set {index}"
        if not isinstance(entry, Mapping) or not entry:
            raise ValueError(f"{where} must be an object with minSucceeded and/or minFailed")
        unknown = sorted(str(k) for k in entry if k not in _POLICY_KEYS)
        if unknown:
            raise ValueError(
                f"{where}: unknown key(s) {', '.join(unknown)} (allowed: minSucceeded, minFailed)"
            )
        if "minSucceeded" in entry:
            min_succeeded[index] = _count(entry["minSucceeded"], f"{where} minSucceeded")
        if "minFailed" in entry:
            min_failed[index] = _count(entry["minFailed"], f"{where} minFailed")
    return CompletionPolicy(min_succeeded=min_succeeded, min_failed=min_failed)


def completion_policy(annotations: Mapping[str, Any]) -> tuple[CompletionPolicy | None, str]:
    """The AppWrapper's policy (None when it has none) and a warning when its value cannot be
    used (then the default applies)."""
    if COMPLETION_POLICY_ANNOTATION not in annotations:
        return None, ""
    try:
        policy = parse_completion_policy(annotations[COMPLETION_POLICY_ANNOTATION])
    except ValueError as exc:
        return None, f"{exc}; using the default completion policy"
    return (None if policy.empty else policy), ""
