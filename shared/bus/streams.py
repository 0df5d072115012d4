"""Respawn's streams (docs/messages.md, "Streams"), and creating or reconciling them at start.

Set-up is idempotent and safe to race with other replicas: a stream that exists is compared
with what it should be and updated where it differs; an update NATS refuses is logged and the
existing stream used, so a service never refuses to start over a stream setting.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import nats.js.errors
from nats.js import api

from shared import subjects
from shared.bus.errors import BusError

log = logging.getLogger(__name__)

_DAY = 24 * 3600.0

# Per-subject history kept for the retained, public streams: enough for an external
# subscriber to see one AppWrapper's recent story without unbounded growth.
VERDICT_HISTORY = 64
LIFECYCLE_HISTORY = 64


@dataclass(frozen=True)
class StreamSpec:
    """What a stream must look like; ``None`` limits mean "unlimited"."""

    name: str
    subjects: tuple[str, ...]
    description: str = ""
    max_msgs_per_subject: int = -1
    max_age: float | None = None  # seconds
    max_msgs: int | None = None

    def config(self, *, replicas: int, duplicate_window: float) -> api.StreamConfig:
        return api.StreamConfig(
            name=self.name,
            description=self.description or None,
            subjects=list(self.subjects),
            retention=api.RetentionPolicy.LIMITS,
            storage=api.StorageType.FILE,
            discard=api.DiscardPolicy.OLD,
            num_replicas=replicas,
            duplicate_window=duplicate_window,
            max_msgs_per_subject=self.max_msgs_per_subject,
            max_age=self.max_age,
            max_msgs=self.max_msgs,
        )


def default_streams() -> tuple[StreamSpec, ...]:
    """Respawn's streams (docs/messages.md, "Streams")."""
    return (
        StreamSpec(
            name=subjects.OBSERVATIONS_STREAM,
            subjects=(f"{subjects.OBS_PREFIX}.>",),
            description="Latest observed state of each watched object (one message per subject)",
            # Observations are "latest state": a newer one replaces the older, so a
            # consumer that falls behind skips straight to the present.
            max_msgs_per_subject=1,
        ),
        StreamSpec(
            name=subjects.VERDICTS_STREAM,
            subjects=(f"{subjects.VERDICT_PREFIX}.>",),
            description="Health verdicts per AppWrapper (public interface)",
            max_msgs_per_subject=VERDICT_HISTORY,
            max_age=30 * _DAY,
        ),
        StreamSpec(
            name=subjects.NODE_VERDICTS_STREAM,
            subjects=(f"{subjects.NODE_VERDICT_PREFIX}.>",),
            description="Latest unhealthy-node sets per resource",
            max_msgs_per_subject=1,
        ),
        StreamSpec(
            name=subjects.LIFECYCLE_STREAM,
            subjects=(f"{subjects.LIFECYCLE_PREFIX}.>",),
            description="What lifecycle did to each AppWrapper (public interface)",
            max_msgs_per_subject=LIFECYCLE_HISTORY,
            max_age=30 * _DAY,
        ),
        StreamSpec(
            name=subjects.DEAD_LETTER_STREAM,
            subjects=(f"{subjects.DEAD_LETTER_PREFIX}.>",),
            description="Messages a consumer could not process, with the reason in headers",
            max_age=14 * _DAY,
            max_msgs=100_000,
        ),
    )


def stream_differences(desired: api.StreamConfig, actual: api.StreamConfig) -> list[str]:
    """The settings that differ, as "field: actual -> desired" (only fields we manage)."""

    def norm_limit(value: Any) -> Any:
        return -1 if value in (None, 0) else value

    def norm_age(value: Any) -> float:
        return float(value or 0.0)

    checks: list[tuple[str, Any, Any]] = [
        ("subjects", sorted(actual.subjects or []), sorted(desired.subjects or [])),
        ("retention", actual.retention, desired.retention),
        ("storage", actual.storage, desired.storage),
        ("discard", actual.discard, desired.discard),
        ("num_replicas", actual.num_replicas or 1, desired.num_replicas or 1),
        (
            "max_msgs_per_subject",
            norm_limit(actual.max_msgs_per_subject),
            norm_limit(desired.max_msgs_per_subject),
        ),
        ("max_msgs", norm_limit(actual.max_msgs), norm_limit(desired.max_msgs)),
        ("max_age", norm_age(actual.max_age), norm_age(desired.max_age)),
        (
            "duplicate_window",
            round(norm_age(actual.duplicate_window), 3),
            round(norm_age(desired.duplicate_window), 3),
        ),
    ]
    return [f"{name}: {have!r} -> {want!r}" for name, have, want in checks if have != want]


async def ensure_stream(js: Any, spec: StreamSpec, *, replicas: int, duplicate_window: float) -> None:
    """Create the stream, or update it where it differs; never fails on a refused update."""
    desired = spec.config(replicas=replicas, duplicate_window=duplicate_window)
    try:
        info = await js.stream_info(spec.name)
    except nats.js.errors.NotFoundError:
        try:
            await js.add_stream(desired)
            log.info("created stream %s on %s", spec.name, ", ".join(spec.subjects))
            return
        except nats.js.errors.APIError as exc:
            try:
                # Another replica may have created it a moment ago.
                info = await js.stream_info(spec.name)
            except nats.js.errors.NotFoundError:
                raise BusError(
                    f"cannot create stream {spec.name}: {exc.description or exc}; "
                    f"check replicas ({replicas}) against the NATS cluster size and JetStream limits"
                ) from exc
    differences = stream_differences(desired, info.config)
    if not differences:
        return
    try:
        await js.update_stream(desired)
    except nats.js.errors.APIError as exc:
        log.error(
            "stream %s differs from the expected configuration (%s) and NATS refused the update (%s); "
            "continuing with the existing configuration",
            spec.name,
            "; ".join(differences),
            exc.description or exc,
        )
        return
    log.warning("updated stream %s: %s", spec.name, "; ".join(differences))


async def last_sequence(js: Any, stream: str) -> int:
    """The stream's last sequence now (0 when it never held a message)."""
    info = await js.stream_info(stream)
    return int(info.state.last_seq or 0)
