"""Respawn's streams (docs/messages.md, "Streams"), and creating or reconciling them at start.

Set-up is idempotent and safe to race with other replicas: a stream that exists is compared
with what it should be and updated where it differs; an update NATS refuses is logged and the
existing stream used, so a service never refuses to start over a stream setting.

Every stream is bounded (bytes, messages, and age where age does not destroy state), so
JetStream never fills up. The limits are the operator's to change (docs/configuration.md,
``nats.streams``), and a limit an operator made stricter on the server is never loosened: the
limits Respawn last applied are recorded in the stream's metadata (:data:`LIMITS_METADATA`), so
a limit that differs from that record was set by someone else and is kept when it is stricter
(:func:`reconcile_limits`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import nats.js.errors
from nats.js import api
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_delay

from shared import subjects
from shared.bus.backoff import backoff
from shared.bus.errors import BusError

log = logging.getLogger(__name__)

_DAY = 24 * 3600.0
_MIB = 1024 * 1024
_GIB = 1024 * _MIB

# Per-subject history kept for the retained, public streams: enough for an external
# subscriber to see one AppWrapper's recent story without unbounded growth.
VERDICT_HISTORY = 64
LIFECYCLE_HISTORY = 64

# Stream metadata key holding the limits Respawn applied last (JSON), so that a limit an
# operator changed on the server can be told from Respawn's own.
LIMITS_METADATA = "respawn.dev/limits"

# The limits ensure_stream manages; "unlimited" is None however the server spells it (-1, 0).
LIMIT_FIELDS = ("max_msgs", "max_bytes", "max_age", "max_msgs_per_subject")

Limits = dict[str, float | None]


@dataclass(frozen=True)
class StreamLimits:
    """An operator's limits for one stream (docs/configuration.md, ``nats.streams``).

    ``0`` means unlimited; ``max_msgs_per_subject`` None keeps the stream's own (it is part of
    what the stream means for the latest-state streams, so only the history streams take one).
    """

    max_bytes: int
    max_msgs: int
    max_age: float  # seconds
    max_msgs_per_subject: int | None = None


@dataclass(frozen=True)
class StreamSpec:
    """What a stream must look like; ``None`` limits mean "unlimited"."""

    name: str
    subjects: tuple[str, ...]
    description: str = ""
    max_msgs_per_subject: int = -1
    max_age: float | None = None  # seconds
    max_msgs: int | None = None
    max_bytes: int | None = None
    # Per-message TTL (the Nats-TTL header, nats-server 2.11+): lets a tombstone expire so the
    # subject of a deleted object goes away. Once enabled on a stream NATS cannot disable it.
    allow_msg_ttl: bool = False
    # The one service (its bus name, e.g. "respawn-health") that brings the stream's
    # configuration up to date; every other service only creates it when it is missing, so the
    # services start in any order but a stream has one writer of its configuration
    # (docs/deploy.md, "Streams have one owner each"). "" lets any client update it.
    owner: str = ""

    def config(self, *, replicas: int, duplicate_window: float) -> api.StreamConfig:
        return api.StreamConfig(
            name=self.name,
            description=self.description or None,
            subjects=list(self.subjects),
            retention=api.RetentionPolicy.LIMITS,
            storage=api.StorageType.FILE,
            discard=api.DiscardPolicy.OLD,
            num_replicas=replicas,
            # NATS refuses a duplicate window longer than the maximum age.
            duplicate_window=min(duplicate_window, self.max_age) if self.max_age else duplicate_window,
            max_msgs_per_subject=self.max_msgs_per_subject,
            max_age=self.max_age,
            max_msgs=self.max_msgs,
            max_bytes=self.max_bytes,
            allow_msg_ttl=True if self.allow_msg_ttl else None,
        )

    def limits(self) -> Limits:
        """The managed limits, "unlimited" as None."""
        return {
            "max_msgs": _limit(self.max_msgs),
            "max_bytes": _limit(self.max_bytes),
            "max_age": _limit(self.max_age),
            "max_msgs_per_subject": _limit(self.max_msgs_per_subject),
        }

    def with_limits(self, limits: Limits) -> StreamSpec:
        """This spec with the managed limits replaced (None: unlimited)."""

        def whole(value: float | None) -> int | None:
            return None if value is None else int(value)

        return replace(
            self,
            max_msgs=whole(limits["max_msgs"]),
            max_bytes=whole(limits["max_bytes"]),
            max_age=limits["max_age"],
            max_msgs_per_subject=whole(limits["max_msgs_per_subject"]) or -1,
        )

    def configured(self, limits: StreamLimits) -> StreamSpec:
        """This spec with an operator's limits (see :class:`StreamLimits`)."""
        per_subject = self.max_msgs_per_subject
        if limits.max_msgs_per_subject is not None:
            per_subject = limits.max_msgs_per_subject
        return replace(
            self,
            max_bytes=limits.max_bytes or None,
            max_msgs=limits.max_msgs or None,
            max_age=limits.max_age or None,
            max_msgs_per_subject=per_subject or -1,
        )

    def captures(self, subject: str) -> bool:
        """Whether a message published on ``subject`` lands in this stream."""
        return any(subject_matches(pattern, subject) for pattern in self.subjects)


def _limit(value: Any) -> float | None:
    if value is None or value <= 0:
        return None
    return round(float(value), 3)


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` is one token, a final ``>`` one or more."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(want) == len(have)


def stream_for(subject: str, specs: Iterable[StreamSpec]) -> StreamSpec | None:
    """The stream among ``specs`` that captures ``subject``, if any."""
    return next((s for s in specs if s.captures(subject)), None)


# Sized for 10,000 AppWrappers of 8 pods each (docs/configuration.md, "nats.streams"). JetStream
# reserves a stream's max_bytes against the server's store (deploy/nats: 8 GB), so together they
# stay under half of it.
DEFAULT_LIMITS: Mapping[str, StreamLimits] = {
    # About 100,000 live subjects (AppWrappers, pods, components, nodes) of a few KB each, an
    # AppWrapper's with its whole body: some 250 MB. Tombstones expire by their TTL. No maximum
    # age: this stream is the state health and autopilot load at start, and an object that has
    # not changed for a long time still exists.
    subjects.OBSERVATIONS_STREAM: StreamLimits(max_bytes=2 * _GIB, max_msgs=1_000_000, max_age=0.0),
    # 64 verdicts of under 1 KB for each of 10,000 AppWrappers: 640,000 messages at most.
    subjects.VERDICTS_STREAM: StreamLimits(
        max_bytes=512 * _MIB, max_msgs=1_000_000, max_age=30 * _DAY, max_msgs_per_subject=VERDICT_HISTORY
    ),
    # One set per extended resource; autopilot loads them at start, so no maximum age either.
    subjects.NODE_VERDICTS_STREAM: StreamLimits(max_bytes=64 * _MIB, max_msgs=10_000, max_age=0.0),
    subjects.LIFECYCLE_STREAM: StreamLimits(
        max_bytes=512 * _MIB, max_msgs=1_000_000, max_age=30 * _DAY, max_msgs_per_subject=LIFECYCLE_HISTORY
    ),
    # A dead letter carries the original message, up to 1 MB.
    subjects.DEAD_LETTER_STREAM: StreamLimits(max_bytes=512 * _MIB, max_msgs=100_000, max_age=14 * _DAY),
}


def default_streams(limits: Mapping[str, StreamLimits] | None = None) -> tuple[StreamSpec, ...]:
    """Respawn's streams (docs/messages.md, "Streams"), with ``limits`` by stream name where
    given and :data:`DEFAULT_LIMITS` elsewhere."""
    specs = (
        StreamSpec(
            name=subjects.OBSERVATIONS_STREAM,
            owner="respawn-watcher",
            subjects=(f"{subjects.OBS_PREFIX}.>",),
            description="Latest observed state of each watched object (one message per subject)",
            # Observations are "latest state": a newer one replaces the older, so a
            # consumer that falls behind skips straight to the present.
            max_msgs_per_subject=1,
            # Tombstones carry a TTL, so a deleted object's subject goes away.
            allow_msg_ttl=True,
        ),
        StreamSpec(
            name=subjects.VERDICTS_STREAM,
            owner="respawn-health",
            subjects=(f"{subjects.VERDICT_PREFIX}.>",),
            description="Health verdicts per AppWrapper (public interface)",
            max_msgs_per_subject=VERDICT_HISTORY,
        ),
        StreamSpec(
            name=subjects.NODE_VERDICTS_STREAM,
            owner="respawn-autopilot",
            subjects=(f"{subjects.NODE_VERDICT_PREFIX}.>",),
            description="Latest unhealthy-node sets per resource",
            max_msgs_per_subject=1,
        ),
        StreamSpec(
            name=subjects.LIFECYCLE_STREAM,
            owner="respawn-lifecycle",
            subjects=(f"{subjects.LIFECYCLE_PREFIX}.>",),
            description="What lifecycle did to each AppWrapper (public interface)",
            max_msgs_per_subject=LIFECYCLE_HISTORY,
        ),
        StreamSpec(
            name=subjects.DEAD_LETTER_STREAM,
            # Three services dead-letter; lifecycle keeps the stream, since the dead letters that
            # matter most are verdicts it could not apply.
            owner="respawn-lifecycle",
            subjects=(f"{subjects.DEAD_LETTER_PREFIX}.>",),
            description="Messages a consumer could not process, with the reason in headers",
        ),
    )
    chosen = {**DEFAULT_LIMITS, **(limits or {})}
    return tuple(spec.configured(chosen[spec.name]) if spec.name in chosen else spec for spec in specs)


# ---------------------------------------------------------------------- limits never loosened


def reconcile_limits(desired: Limits, actual: Limits, applied: Limits | None) -> Limits:
    """The limits to set on an existing stream.

    ``desired`` are Respawn's (configured) limits, ``actual`` the stream's, ``applied`` what
    Respawn set last (None: no record, e.g. the stream was created by someone else or by an
    older Respawn). A limit still as Respawn set it follows ``desired`` either way; any other
    limit is tightened to ``desired`` but never loosened, so an operator's stricter limit stays.
    """
    result: Limits = {}
    for name in LIMIT_FIELDS:
        want, have = desired.get(name), actual.get(name)
        ours = applied is not None and name in applied and applied[name] == have
        if have is None or ours:
            result[name] = want
        elif want is None or have < want:
            result[name] = have  # the operator's, and stricter than Respawn's
        else:
            result[name] = want
    return result


def actual_limits(config: api.StreamConfig) -> Limits:
    return {name: _limit(getattr(config, name, None)) for name in LIMIT_FIELDS}


def applied_limits(config: api.StreamConfig) -> Limits | None:
    """The limits Respawn recorded on the stream, None without a (readable) record."""
    raw = (config.metadata or {}).get(LIMITS_METADATA)
    if not raw:
        return None
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    return {name: _limit(record[name]) for name in LIMIT_FIELDS if name in record}


def limits_record(limits: Limits) -> str:
    return json.dumps({name: limits.get(name) for name in LIMIT_FIELDS}, sort_keys=True)


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
        ("max_bytes", norm_limit(actual.max_bytes), norm_limit(desired.max_bytes)),
        ("max_age", norm_age(actual.max_age), norm_age(desired.max_age)),
        (
            "duplicate_window",
            round(norm_age(actual.duplicate_window), 3),
            round(norm_age(desired.duplicate_window), 3),
        ),
        ("allow_msg_ttl", bool(actual.allow_msg_ttl), bool(desired.allow_msg_ttl)),
    ]
    if desired.metadata and LIMITS_METADATA in desired.metadata:
        checks.append(
            (
                LIMITS_METADATA,
                (actual.metadata or {}).get(LIMITS_METADATA),
                desired.metadata[LIMITS_METADATA],
            )
        )
    return [f"{name}: {have!r} -> {want!r}" for name, have, want in checks if have != want]


def desired_config(
    spec: StreamSpec, actual: api.StreamConfig | None, *, replicas: int, duplicate_window: float
) -> api.StreamConfig:
    """What to create, or what to update ``actual`` to: ``spec`` with limits that never loosen an
    operator's, per-message TTL never switched off, and other metadata kept."""
    wanted = spec.limits()
    if actual is None:
        chosen = wanted
    else:
        chosen = reconcile_limits(wanted, actual_limits(actual), applied_limits(actual))
        if actual.allow_msg_ttl:
            spec = replace(spec, allow_msg_ttl=True)  # NATS cannot switch it off again
    config = spec.with_limits(chosen).config(replicas=replicas, duplicate_window=duplicate_window)
    # The server keeps its own "_nats." keys; everything else is someone's and stays.
    metadata = {
        k: v for k, v in ((actual.metadata or {}) if actual else {}).items() if not k.startswith("_nats.")
    }
    # What Respawn wants, not what it set: a limit kept because it was stricter stays the
    # operator's (it differs from this record) the next time too.
    metadata[LIMITS_METADATA] = limits_record(wanted)
    config.metadata = metadata
    return config


# What JetStream answers while it has no metadata leader: 503 "JetStream system temporarily
# unavailable", or no answer at all.
UNAVAILABLE = (nats.js.errors.ServiceUnavailableError, TimeoutError)
# Long enough for a NATS cluster to elect a leader after a rolling restart; short enough that a
# cluster which lost its quorum shows as a restarting service with a clear last line.
UNAVAILABLE_FOR = 30.0


async def wait_out_unavailable(what: str, attempt: Callable[[], Awaitable[None]], seconds: float) -> None:
    """Run ``attempt``, trying again while JetStream is unavailable, for up to ``seconds``."""

    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        log.warning(
            "%s: JetStream unavailable (%s); retrying in %.1fs",
            what,
            getattr(exc, "description", None) or type(exc).__name__,
            state.upcoming_sleep,
        )

    async for retry in AsyncRetrying(
        retry=retry_if_exception_type(UNAVAILABLE),
        wait=backoff(0.5, 5.0),
        stop=stop_after_delay(seconds),
        before_sleep=before_sleep,
        reraise=True,
    ):
        with retry:
            await attempt()


async def ensure_stream(
    js: Any, spec: StreamSpec, *, replicas: int, duplicate_window: float, may_update: bool = True
) -> None:
    """Create the stream, or (``may_update``: its owner) update it where it differs; never fails
    on a refused update."""
    try:
        info = await js.stream_info(spec.name)
    except nats.js.errors.NotFoundError:
        try:
            await js.add_stream(
                desired_config(spec, None, replicas=replicas, duplicate_window=duplicate_window)
            )
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
    desired = desired_config(spec, info.config, replicas=replicas, duplicate_window=duplicate_window)
    differences = stream_differences(desired, info.config)
    if not differences:
        return
    if not may_update:
        log.warning(
            "stream %s differs from the expected configuration (%s); left as it is for its owner, %s",
            spec.name,
            "; ".join(differences),
            spec.owner,
        )
        return
    try:
        await js.update_stream(desired)
    except (nats.js.errors.APIError, TimeoutError) as exc:
        # A service that does not own the stream may not update it (docs/deploy.md): the server
        # then drops the request, which times out. The owner brings the stream up to date.
        log.error(
            "stream %s differs from the expected configuration (%s) and NATS refused the update (%s); "
            "continuing with the existing configuration",
            spec.name,
            "; ".join(differences),
            getattr(exc, "description", None) or exc or type(exc).__name__,
        )
        return
    log.warning("updated stream %s: %s", spec.name, "; ".join(differences))


async def last_sequence(js: Any, stream: str) -> int:
    """The stream's last sequence now (0 when it never held a message)."""
    info = await js.stream_info(stream)
    return int(info.state.last_seq or 0)


async def sequences(js: Any, stream: str) -> tuple[int, int]:
    """The stream's first and last sequence now. An empty stream's first is one past its last;
    a message whose sequence is below the first was removed (discarded at a limit, expired or
    purged)."""
    info = await js.stream_info(stream)
    return int(info.state.first_seq or 0), int(info.state.last_seq or 0)


def find_spec(name: str, specs: Sequence[StreamSpec]) -> StreamSpec | None:
    return next((s for s in specs if s.name == name), None)
