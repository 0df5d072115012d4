"""Whether a health verdict is about the AppWrapper state in hand, and what to do with the message.

A verdict can arrive twice (JetStream redelivery, two lifecycle instances), late (decided about
an attempt that has since been reset), or early (health read a newer AppWrapper than the one in
hand). Applying it must be idempotent in effect, so it is matched against the status, which is
the only durable record, by the verdict's identity:

- ``ref.uid``: the AppWrapper incarnation it was decided about;
- ``resetting_count``: the ``status.resettingCount`` health saw. A reset that counts increments
  the status, so the same verdict can never cause a second counted reset;
- ``attempt_started_at``, the ``ResourcesDeployed`` transition time of the attempt health
  judged (or, from producers that do not set it, ``decided_at``), against the start of the
  current attempt: a reset that does not count (Autopilot migration) leaves ``resettingCount``
  alone, and this is what keeps its verdict from being applied again to the recreated workload.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from services.lifecycle.conditions import is_true, transition_time
from shared.appwrapper.constants import ConditionType
from shared.kubetime import as_utc
from shared.messages import Verdict

__all__ = ["VerdictRelation", "VerdictUse", "attempt_start", "resetting_count", "verdict_relation"]


class VerdictUse(StrEnum):
    """What the service should do with the verdict message after carrying out the plan."""

    # No verdict was given.
    NONE = "None"
    # The plan's status write carries the verdict's effect: ack once that write has succeeded.
    APPLIED = "Applied"
    # The verdict has no effect on this AppWrapper now or later (already applied, superseded,
    # for another incarnation or attempt, or nothing to do in this phase): ack it.
    SETTLED = "Settled"
    # Not applicable yet (the workload is still being created, or the status in hand is older
    # than the one health judged): keep it, do not ack, and pass it to the next reconcile.
    HELD = "Held"


class VerdictRelation(StrEnum):
    CURRENT = "Current"
    STALE = "Stale"
    AHEAD = "Ahead"


def resetting_count(status: Mapping[str, Any]) -> int:
    value = status.get("resettingCount", 0)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def attempt_start(status: Mapping[str, Any]) -> datetime | None:
    """When the resources of the current attempt began to be deployed, if they are deployed."""
    conditions = status.get("conditions")
    if not isinstance(conditions, list) or not is_true(conditions, ConditionType.RESOURCES_DEPLOYED):
        return None
    return transition_time(conditions, ConditionType.RESOURCES_DEPLOYED)


def verdict_relation(
    metadata: Mapping[str, Any], status: Mapping[str, Any], verdict: Verdict
) -> VerdictRelation:
    """How ``verdict`` relates to the AppWrapper with this ``metadata`` and ``status``."""
    uid = metadata.get("uid")
    if verdict.ref.uid and isinstance(uid, str) and uid and verdict.ref.uid != uid:
        return VerdictRelation.STALE
    for key, value in (("name", verdict.ref.name), ("namespace", verdict.ref.namespace)):
        if value and metadata.get(key) not in (None, "", value):
            return VerdictRelation.STALE
    count = resetting_count(status)
    if verdict.resetting_count < count:
        return VerdictRelation.STALE
    if verdict.resetting_count > count:
        return VerdictRelation.AHEAD
    start = attempt_start(status)
    if verdict.attempt_started_at is not None:
        # Health read the same timestamp from the status it judged: an exact identity.
        judged = as_utc(verdict.attempt_started_at)
        if start is None or judged < start:
            return VerdictRelation.STALE
        if judged > start:
            return VerdictRelation.AHEAD
        return VerdictRelation.CURRENT
    # Without it, fall back to time. The attempt start is stored at whole seconds (metav1.Time),
    # rounded down, so a verdict decided within that second may be about either attempt; it is
    # taken as the old one, because applying an old verdict again would reset twice.
    if start is not None and as_utc(verdict.decided_at) < start + timedelta(seconds=1):
        return VerdictRelation.STALE
    return VerdictRelation.CURRENT
