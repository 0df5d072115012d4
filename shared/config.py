"""The operator configuration: one YAML file, then ``RESPAWN_*`` environment overrides.

Loaded once when a service starts and validated in full, so a mistake stops the process with
one message that names the offending key instead of surfacing hours later as odd behaviour.
Key names follow upstream AppWrapper's operator configuration where it has one (note its
``resetPause``, ``deletionGracePeriod`` and ``successTTLCeiling``, whose names differ from the
parameters they set); durations are Go duration strings ("90s", "1h30m"). Unknown keys are
rejected, because a misspelt key would otherwise silently leave a default in force.

Every leaf key can be overridden by an environment variable named from its path, e.g.
``faultTolerance.resetPause`` → ``RESPAWN_FAULT_TOLERANCE_RESET_PAUSE`` (see
:func:`env_var_names`; docs/configuration.md lists them all).
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ByteSize,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from shared.durations import format_go_duration, parse_go_duration
from shared.failures import failure_table
from shared.failures.patterns import FailurePattern
from shared.faulttolerance import FaultTolerance
from shared.messages import Encoding
from shared.stalls import MAX_STORM_RESTARTS, StallDefaults

if TYPE_CHECKING:
    from shared.bus import StreamLimits, TlsFiles

__all__ = [
    "CONFIG_ENV",
    "ENV_PREFIX",
    "AdmissionConfig",
    "AutopilotConfig",
    "ConfigError",
    "FailuresConfig",
    "FaultToleranceConfig",
    "HealthConfig",
    "NatsConfig",
    "NodeExclusionConfig",
    "NodeQuarantineConfig",
    "OperatorConfig",
    "ResourceTaint",
    "config_from_text",
    "env_var_names",
    "load_config",
]

CONFIG_ENV: Final = "RESPAWN_CONFIG"
ENV_PREFIX: Final = "RESPAWN_"


class ConfigError(ValueError):
    """The configuration cannot be used; the message names the key and what is wrong with it."""


def _duration(value: Any) -> Any:
    if isinstance(value, timedelta):
        return value
    # A bare 0 is unambiguous. Any other bare number is refused: upstream marshals durations as
    # integer nanoseconds while people tend to mean seconds, and either reading of "90" would
    # surprise someone.
    if isinstance(value, int) and not isinstance(value, bool) and value == 0:
        return timedelta(0)
    if isinstance(value, str):
        return parse_go_duration(value.strip())
    raise ValueError(f"expected a Go duration string such as '90s' or '1h30m', got {value!r}")


Duration = Annotated[
    timedelta,
    BeforeValidator(_duration),
    PlainSerializer(format_go_duration, return_type=str, when_used="json"),
]


def _empty_is_none(value: Any) -> Any:
    return None if value == "" else value


class _Section(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
        frozen=True,
    )


class FaultToleranceConfig(_Section):
    """Operator-wide defaults of the retry loop; AppWrapper annotations may override them."""

    admission_grace_period: Duration = timedelta(minutes=1)
    warmup_grace_period: Duration = timedelta(minutes=5)
    failure_grace_period: Duration = timedelta(minutes=1)
    retry_pause_period: Duration = Field(default=timedelta(seconds=90), alias="resetPause")
    retry_limit: int = 3
    # Upstream has no operator-level setting for this (only the annotation, default 0).
    deletion_on_failure_grace_period: Duration = timedelta(0)
    forceful_deletion_grace_period: Duration = Field(
        default=timedelta(minutes=10), alias="deletionGracePeriod"
    )
    grace_period_ceiling: Duration = timedelta(hours=24)
    success_ttl: Duration = Field(default=timedelta(days=7), alias="successTTLCeiling")
    # Respawn addition, no upstream equivalent: see FaultTolerance.recreate_delay.
    recreate_delay: Duration = timedelta(seconds=2)
    # Respawn additions, no upstream equivalent: exponential retry pause (off: upstream's fixed
    # pause). See FaultTolerance.retry_pause_backoff.
    retry_pause_backoff: bool = False
    retry_pause_maximum: Duration = timedelta(minutes=30)
    retry_pause_jitter: float = Field(default=0.0, ge=0.0, le=1.0)
    # Respawn addition: see FaultTolerance.consistency_mode.
    consistency_mode: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> FaultToleranceConfig:
        if self.success_ttl <= timedelta(0):
            raise ValueError(
                f"{_key('success_ttl')} must be positive, got {format_go_duration(self.success_ttl)}"
            )
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, timedelta) and value < timedelta(0):
                raise ValueError(f"{_key(name)} must not be negative, got {format_go_duration(value)}")
        if self.retry_limit < 0:
            raise ValueError(f"{_key('retry_limit')} must not be negative, got {self.retry_limit}")
        # The ceiling also caps annotation values; a default above it could never take effect.
        for name in _CAPPED:
            value = getattr(self, name)
            if value > self.grace_period_ceiling:
                raise ValueError(
                    f"{_key(name)} ({format_go_duration(value)}) exceeds "
                    f"{_key('grace_period_ceiling')} ({format_go_duration(self.grace_period_ceiling)})"
                )
        # Pods must exist before they can be running: the admission clock cannot outlast warmup.
        admission, warmup = self.admission_grace_period, self.warmup_grace_period
        if admission > warmup:
            raise ValueError(
                f"{_key('admission_grace_period')} ({format_go_duration(admission)}) exceeds "
                f"{_key('warmup_grace_period')} ({format_go_duration(warmup)})"
            )
        return self

    def to_fault_tolerance(self) -> FaultTolerance:
        return FaultTolerance(
            admission_grace=self.admission_grace_period,
            warmup_grace=self.warmup_grace_period,
            failure_grace=self.failure_grace_period,
            retry_pause=self.retry_pause_period,
            retry_limit=self.retry_limit,
            deletion_on_failure_grace=self.deletion_on_failure_grace_period,
            forceful_deletion_grace=self.forceful_deletion_grace_period,
            success_ttl=self.success_ttl,
            grace_period_maximum=self.grace_period_ceiling,
            recreate_delay=self.recreate_delay,
            retry_pause_backoff=self.retry_pause_backoff,
            retry_pause_maximum=self.retry_pause_maximum,
            retry_pause_jitter=self.retry_pause_jitter,
            consistency_mode=self.consistency_mode,
        )


_CAPPED: Final = (
    "admission_grace_period",
    "warmup_grace_period",
    "failure_grace_period",
    "retry_pause_period",
    "deletion_on_failure_grace_period",
    "forceful_deletion_grace_period",
    "recreate_delay",
)


def _key(field: str) -> str:
    info = FaultToleranceConfig.model_fields[field]
    return f"faultTolerance.{info.alias or to_camel(field)}"


class ResourceTaint(_Section):
    """A node label ``key=value`` that marks ``resource`` unhealthy, and what that means.

    NoSchedule and NoExecute keep new pods that use the resource off such nodes; NoExecute also
    moves running workloads away; PreferNoSchedule only steers new pods elsewhere when possible.
    """

    key: str = Field(min_length=1)
    value: str
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


_HEALTH_LABEL: Final = "autopilot.ibm.com/gpuhealth"


def _default_resource_taints() -> dict[str, list[ResourceTaint]]:
    # Upstream's built-in default (its website still shows an older ERR/EVICT example).
    return {
        "nvidia.com/gpu": [
            ResourceTaint(key=_HEALTH_LABEL, value="WARN", effect="PreferNoSchedule"),
            ResourceTaint(key=_HEALTH_LABEL, value="TESTING", effect="NoSchedule"),
            ResourceTaint(key=_HEALTH_LABEL, value="EVICT", effect="NoExecute"),
        ]
    }


class AutopilotConfig(_Section):
    inject_anti_affinities: bool = True
    monitor_nodes: bool = True
    # Publish the nodes that are NotReady, out of contact or deleted (the node verdict of
    # respawn.dev/node-state), which failure classification reads as a failed pod's node state.
    publish_node_state: bool = True
    resource_taints: dict[str, list[ResourceTaint]] = Field(default_factory=_default_resource_taints)
    # Weight of the preferred node-affinity term built from PreferNoSchedule taints (upstream's
    # preferNoScheduleWeight); Kubernetes allows 1..100.
    preferred_weight: int = Field(default=50, ge=1, le=100, alias="preferNoScheduleWeight")


class NodeExclusionConfig(_Section):
    """On a reset, keep the next attempt off the nodes where the failed one's pods failed."""

    enabled: bool = True
    max_nodes: int = Field(default=8, ge=0)


# A Kubernetes qualified name with an optional DNS-subdomain prefix (label and taint keys).
_LABEL_KEY = re.compile(
    r"(?:[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)


class NodeQuarantineConfig(_Section):
    """Keep every workload off a node blamed for too many infrastructure faults (docs/autopilot.md)."""

    enabled: bool = True
    # A node blamed for this many infrastructure faults (each AppWrapper attempt counts once)
    # within ``window`` is quarantined.
    threshold: int = Field(default=3, ge=1)
    window: Duration = timedelta(hours=1)
    # How long a quarantine lasts; the node's count starts again from zero after it.
    duration: Duration = timedelta(hours=1)
    # At most this share of the known nodes is quarantined at once (rounded down, but at least one
    # of two or more nodes while above 0, never the only one): past it, the
    # worst nodes are quarantined and the rest only reported, so a cluster-wide problem blamed on
    # nodes cannot empty the cluster.
    max_share: float = Field(default=0.1, ge=0.0, le=1.0)
    # Report what would be quarantined (log, metrics, the published details) without keeping
    # any workload off any node.
    dry_run: bool = False
    # Also mark quarantined nodes on the Node object, for other schedulers: a label and/or a
    # NoSchedule taint with this key and the value "true", removed when the quarantine ends.
    # Empty: none. Either needs autopilot to have a Kubernetes token (docs/autopilot.md).
    node_label: str = ""
    node_taint: str = ""

    @field_validator("node_label", "node_taint")
    @classmethod
    def _label_key(cls, value: str) -> str:
        if value and not _LABEL_KEY.fullmatch(value):
            raise ValueError(f"{value!r} is not a valid label or taint key")
        return value

    @property
    def marks_nodes(self) -> bool:
        return bool(self.node_label or self.node_taint)

    @field_validator("window", "duration")
    @classmethod
    def _positive(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError("must be positive")
        return value


# The longest lifecycle.record_delay: well inside the duplicate window of the lifecycle stream
# (120 s), within which a re-sent announcement is dropped by its id.
RECORD_DELAY_LIMIT = timedelta(seconds=60)


class LifecycleConfig(_Section):
    """How the lifecycle service spreads its work (per replica)."""

    # Reconcile workers fed by observations, timers and the resync. 32 were tried: on a loaded
    # API server they did not raise the rate of passes (the server is the limit) and made the
    # verdicts' own requests slower (bench/results/HISTORY.md, N=1,000 and N=10,000).
    workers: int = Field(default=8, ge=1, le=256)
    # Verdicts of different AppWrappers applied at once; one AppWrapper's stay in order. Too low
    # and a burst of verdicts queues (each takes a few API round trips); the API server is the
    # limit beyond a few dozen.
    verdict_concurrency: int = Field(default=32, ge=1, le=1024)
    # How often every AppWrapper with work or a clock pending is reconciled anyway (covers
    # timers lost with a replica that died).
    resync_period: Duration = timedelta(seconds=30)
    # How long the record of delivered announcements (the respawn.dev/announced annotation) may
    # wait before it is written, so that one patch records a burst of transitions and none is
    # written for an AppWrapper that goes away first (services/lifecycle/records.py). A process
    # killed meanwhile leaves its announcements to be re-sent by id, which JetStream drops only
    # within its duplicate window (120 s): hence the bound. 0 writes each at once.
    record_delay: Duration = timedelta(seconds=5)

    @field_validator("resync_period")
    @classmethod
    def _positive_resync(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError("must be positive")
        return value

    @field_validator("record_delay")
    @classmethod
    def _bounded_record_delay(cls, value: timedelta) -> timedelta:
        if value < timedelta(0) or value > RECORD_DELAY_LIMIT:
            raise ValueError(f"must be between 0s and {RECORD_DELAY_LIMIT.total_seconds():.0f}s")
        return value


class WatcherConfig(_Section):
    """What the watcher does besides translating watch events."""

    # How often the watcher checks that RESPAWN_OBSERVATIONS still holds the latest observation
    # of every object that exists: a stream at its limit discards its oldest messages, which are
    # the states of the objects that changed least recently, and a replica that replays the
    # stream later would not know them. Those it publishes again.
    discard_check_period: Duration = timedelta(seconds=10)

    @field_validator("discard_check_period")
    @classmethod
    def _positive_check(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError("must be positive")
        return value


class AdmissionConfig(_Section):
    """Limits the admission webhook puts on AppWrappers (docs/webhooks.md)."""

    # Nesting of objects and arrays in one component template. Real templates stay under about
    # 30 levels (a JobSet's pod template with affinity terms); past several hundred, decoders
    # that recurse (Python's json and msgpack among them) fail.
    max_template_depth: int = Field(default=64, ge=8, le=512)
    # Compact JSON of all component templates together: every reader of the AppWrapper pays for
    # them (lifecycle reads it on every pass and copies each template into what it creates).
    max_template_bytes: int = Field(default=512 * 1024, ge=1024, le=8 * 1024 * 1024)


_MIB: Final = 1024 * 1024
_GIB: Final = 1024 * _MIB

# A stream limit: 0 is "no limit".
Count = Annotated[int, Field(ge=0)]
History = Annotated[int, Field(ge=1)]


def _not_negative(value: timedelta) -> timedelta:
    if value < timedelta(0):
        raise ValueError("must not be negative")
    return value


class _StreamLimitsConfig(_Section):
    """One stream's limits (the defaults are shared.bus.DEFAULT_LIMITS; a unit test ties them)."""

    max_bytes: ByteSize
    max_msgs: Count
    max_age: Duration

    @field_validator("max_age")
    @classmethod
    def _age(cls, value: timedelta) -> timedelta:
        return _not_negative(value)

    def to_limits(self) -> StreamLimits:
        from shared.bus import StreamLimits

        return StreamLimits(
            max_bytes=int(self.max_bytes),
            max_msgs=self.max_msgs,
            max_age=self.max_age.total_seconds(),
            max_msgs_per_subject=getattr(self, "max_msgs_per_subject", None),
        )


class ObservationsLimitsConfig(_StreamLimitsConfig):
    # No maximum age by default: the stream is the state health and autopilot load at start.
    max_bytes: ByteSize = ByteSize(2 * _GIB)
    max_msgs: Count = 1_000_000
    max_age: Duration = timedelta(0)


class _HistoryLimitsConfig(_StreamLimitsConfig):
    """A stream keeping a history of messages per AppWrapper (verdicts, lifecycle's events): the
    two have the same defaults."""

    max_bytes: ByteSize = ByteSize(512 * _MIB)
    max_msgs: Count = 1_000_000
    max_age: Duration = timedelta(days=30)
    max_msgs_per_subject: History = 64


class VerdictsLimitsConfig(_HistoryLimitsConfig):
    """``nats.streams.verdicts``."""


class NodeVerdictsLimitsConfig(_StreamLimitsConfig):
    max_bytes: ByteSize = ByteSize(64 * _MIB)
    max_msgs: Count = 10_000
    max_age: Duration = timedelta(0)


class LifecycleLimitsConfig(_HistoryLimitsConfig):
    """``nats.streams.lifecycle``."""


class DeadLetterLimitsConfig(_StreamLimitsConfig):
    max_bytes: ByteSize = ByteSize(512 * _MIB)
    max_msgs: Count = 100_000
    max_age: Duration = timedelta(days=14)


class NatsStreamsConfig(_Section):
    """The limits of each of Respawn's streams (docs/configuration.md, ``nats.streams``)."""

    observations: ObservationsLimitsConfig = Field(default_factory=ObservationsLimitsConfig)
    verdicts: VerdictsLimitsConfig = Field(default_factory=VerdictsLimitsConfig)
    node_verdicts: NodeVerdictsLimitsConfig = Field(default_factory=NodeVerdictsLimitsConfig)
    lifecycle: LifecycleLimitsConfig = Field(default_factory=LifecycleLimitsConfig)
    dead_letter: DeadLetterLimitsConfig = Field(default_factory=DeadLetterLimitsConfig)

    def by_stream(self) -> dict[str, StreamLimits]:
        """The limits by stream name, for ``Bus.connect(stream_limits=...)``."""
        from shared import subjects

        return {
            subjects.OBSERVATIONS_STREAM: self.observations.to_limits(),
            subjects.VERDICTS_STREAM: self.verdicts.to_limits(),
            subjects.NODE_VERDICTS_STREAM: self.node_verdicts.to_limits(),
            subjects.LIFECYCLE_STREAM: self.lifecycle.to_limits(),
            subjects.DEAD_LETTER_STREAM: self.dead_letter.to_limits(),
        }


OptionalPath = Annotated[Path | None, BeforeValidator(_empty_is_none)]
Port = Annotated[int, Field(ge=0, le=65535)]


class NatsTlsConfig(_Section):
    """TLS to the NATS server; off while no key is set."""

    ca_file: OptionalPath = None
    cert_file: OptionalPath = None
    key_file: OptionalPath = None
    server_name: str = ""
    handshake_first: bool = False

    @model_validator(mode="after")
    def _pair(self) -> NatsTlsConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("certFile and keyFile go together: set both or neither")
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.ca_file or self.cert_file or self.server_name or self.handshake_first)

    def to_files(self) -> TlsFiles | None:
        """What ``Bus.connect(tls=...)`` takes; None while TLS is not configured."""
        from shared.bus import TlsFiles

        if not self.enabled:
            return None
        return TlsFiles(
            ca_file=self.ca_file,
            cert_file=self.cert_file,
            key_file=self.key_file,
            server_name=self.server_name or None,
            handshake_first=self.handshake_first,
        )


class NatsConfig(_Section):
    url: str = Field(default="nats://localhost:4222", min_length=1)
    # JetStream allows 1 to 5 replicas per stream.
    stream_replicas: int = Field(default=1, ge=1, le=5)
    # JWT + nkey credentials (a .creds file), or a bare nkey seed; user/password come from the
    # environment (NATS_USER, NATS_PASSWORD) as before.
    creds_file: OptionalPath = None
    nkey_seed_file: OptionalPath = None
    tls: NatsTlsConfig = Field(default_factory=NatsTlsConfig)
    # How long a tombstone (the observation of a deleted object) stays in RESPAWN_OBSERVATIONS:
    # long enough for every consumer to see it, after which the object's subject goes away.
    tombstone_ttl: Duration = Field(default=timedelta(hours=24), alias="tombstoneTTL")
    # How the public streams (verdicts, lifecycle events) are encoded for outside systems: JSON
    # by default, so any tool prints them as they are (docs/messages.md, "Encodings").
    public_encoding: Encoding = "json"
    streams: NatsStreamsConfig = Field(default_factory=NatsStreamsConfig)

    @model_validator(mode="after")
    def _one_credential(self) -> NatsConfig:
        if self.creds_file is not None and self.nkey_seed_file is not None:
            raise ValueError("set credsFile or nkeySeedFile, not both")
        return self

    @field_validator("tombstone_ttl")
    @classmethod
    def _ttl(cls, value: timedelta) -> timedelta:
        if value < timedelta(seconds=1):
            raise ValueError("must be at least 1s (NATS counts message TTLs in whole seconds)")
        return value


class FailuresConfig(_Section):
    """How failures are classified and how many transient ones are retried (docs/failures.md)."""

    # The operator's own failure patterns (syntax v1), tried before the default table.
    patterns: list[FailurePattern] = Field(default_factory=list)
    # True: the operator's patterns replace the default table instead of going ahead of it.
    replace_default_patterns: bool = False
    # Retries of Transient failures that do not count toward retryLimit; past them, a Transient
    # failure counts like any other, so an endlessly evicted workload still ends.
    transient_retry_limit: int = Field(default=10, ge=0, le=(1 << 31) - 1)
    # Pods of one attempt that all fail within this long of each other, with the same code, fail
    # the application's way: no node is blamed.
    application_fault_window: Duration = timedelta(seconds=5)
    # A failed pod's node counts as lost (NotReady, Unknown, Deleted) only if it became so no
    # later than this after the pod failed: the node controller notices a silent kubelet only
    # after its grace period, while a pod that failed well before its node went bad failed by
    # itself.
    node_lost_leeway: Duration = timedelta(minutes=1)

    @field_validator("application_fault_window", "node_lost_leeway")
    @classmethod
    def _window(cls, value: timedelta) -> timedelta:
        return _not_negative(value)

    def table(self) -> tuple[FailurePattern, ...]:
        """The operator's failure table (its patterns, then the defaults unless replaced)."""
        return failure_table(self.patterns, replace_defaults=self.replace_default_patterns)


class HealthConfig(_Section):
    """Restart storms (docs/failures.md#restart-storms); AppWrappers override them by annotation."""

    # A container whose restart count rises by at least this many within restartStormWindow
    # makes its workload Unhealthy (RestartStorm); 0 turns the count off.
    restart_storm_restarts: int = Field(default=5, ge=0, le=MAX_STORM_RESTARTS)
    restart_storm_window: Duration = timedelta(minutes=10)
    # A container waiting in CrashLoopBackOff for longer than the failure grace period does too.
    crash_loop_back_off: bool = Field(default=True, alias="crashLoopBackOff")

    @field_validator("restart_storm_window")
    @classmethod
    def _positive_window(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError("must be positive")
        return value

    def stall_defaults(self) -> StallDefaults:
        return StallDefaults(
            storm_restarts=self.restart_storm_restarts,
            storm_window=self.restart_storm_window,
            crash_loop_backoff=self.crash_loop_back_off,
        )


class ScalingConfig(_Section):
    """How the replicas of a service split the work (docs/scaling.md)."""

    # How many partitions the AppWrappers are split into, by a hash of namespace/name. The most
    # replicas of one service that can share work; the same in every process of an installation
    # (it is in the subjects), so change it only with every service stopped.
    partitions: int = Field(default=16, ge=1, le=1024)
    # How often a replica says it is alive (a NATS KV put).
    heartbeat: Duration = timedelta(seconds=1)
    # A replica not heard from for this long is taken for dead and its partitions move to the
    # others: the longest a dead replica's AppWrappers go unwatched.
    member_ttl: Duration = timedelta(seconds=5)

    @model_validator(mode="after")
    def _ttl_outlasts_heartbeats(self) -> ScalingConfig:
        if self.heartbeat <= timedelta(0):
            raise ValueError("heartbeat must be positive")
        if self.member_ttl < 2 * self.heartbeat:
            raise ValueError("memberTtl must be at least two heartbeats, or a live replica looks dead")
        return self


class OperatorConfig(_Section):
    fault_tolerance: FaultToleranceConfig = Field(default_factory=FaultToleranceConfig)
    autopilot: AutopilotConfig = Field(default_factory=AutopilotConfig)
    node_exclusion: NodeExclusionConfig = Field(default_factory=NodeExclusionConfig)
    node_quarantine: NodeQuarantineConfig = Field(default_factory=NodeQuarantineConfig)
    lifecycle: LifecycleConfig = Field(default_factory=LifecycleConfig)
    watcher: WatcherConfig = Field(default_factory=WatcherConfig)
    scaling: ScalingConfig = Field(default_factory=ScalingConfig)
    failures: FailuresConfig = Field(default_factory=FailuresConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)
    # Kueue local queue put on AppWrappers that name none; empty leaves them alone.
    default_queue_name: str = ""
    nats: NatsConfig = Field(default_factory=NatsConfig)
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)
    # None: in-cluster service account, else $KUBECONFIG / ~/.kube/config.
    kubeconfig: Annotated[Path | None, BeforeValidator(_empty_is_none)] = None
    # Where /metrics is served (docs/metrics.md): unset, on the probe port (RESPAWN_PROBE_PORT)
    # beside /healthz and /readyz; another port, there alone; 0, nowhere.
    metrics_port: Annotated[Port | None, BeforeValidator(_empty_is_none)] = None

    def to_fault_tolerance(self) -> FaultTolerance:
        return self.fault_tolerance.to_fault_tolerance()


# ---------------------------------------------------------------------------------------------
# Environment overrides


def _env_token(key: str) -> str:
    # camelCase (with acronyms) → SCREAMING_SNAKE: successTTLCeiling → SUCCESS_TTL_CEILING.
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", key).upper()


def _leaves(model: type[BaseModel], prefix: tuple[str, ...]) -> dict[tuple[str, ...], bool]:
    """Key paths of every leaf setting, mapped to whether its env value is structured (YAML)."""
    leaves: dict[tuple[str, ...], bool] = {}
    for name, info in model.model_fields.items():
        key = info.alias or to_camel(name)
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            leaves.update(_leaves(annotation, (*prefix, key)))
        else:
            structured = get_origin(annotation) in (dict, list) or any(
                get_origin(arg) in (dict, list) for arg in get_args(annotation)
            )
            leaves[(*prefix, key)] = structured
    return leaves


_LEAVES: Final = _leaves(OperatorConfig, ())
_ENV_TO_PATH: Final = {ENV_PREFIX + "_".join(_env_token(k) for k in path): path for path in _LEAVES}
# Variables under a section's prefix must name a real key: a typo there is an error, whereas
# other RESPAWN_* variables (RESPAWN_CONFIG, RESPAWN_LOG_LEVEL, ...) belong to other parts.
_SECTION_PREFIXES: Final = tuple(
    sorted({ENV_PREFIX + _env_token(path[0]) + "_" for path in _LEAVES if len(path) > 1})
)


def env_var_names() -> dict[str, str]:
    """Every override variable and the dotted key it sets."""
    return {env: ".".join(path) for env, path in _ENV_TO_PATH.items()}


def _env_overrides(env: Mapping[str, str]) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    for name in sorted(env):
        path = _ENV_TO_PATH.get(name)
        if path is None:
            if name.startswith(_SECTION_PREFIXES):
                raise ConfigError(f"unknown environment variable {name}{_suggest(name, list(_ENV_TO_PATH))}")
            continue
        raw = env[name]
        value: Any = raw
        if _LEAVES[path]:
            try:
                value = yaml.safe_load(raw)
            except yaml.YAMLError as exc:
                raise ConfigError(f"{name} (key {'.'.join(path)}) is not valid YAML/JSON: {exc}") from None
        target = overrides
        for key in path[:-1]:
            target = target.setdefault(key, {})
        target[path[-1]] = value
    return overrides


def merge_documents(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``overrides`` laid over ``base``, section by section, as the config's layers are."""
    merged = dict(base)
    for key, value in overrides.items():
        current = merged.get(key)
        if isinstance(current, Mapping) and isinstance(value, Mapping) and key != "resourceTaints":
            merged[key] = merge_documents(current, value)
        else:
            # resourceTaints is replaced as a whole, so an override can also remove resources.
            merged[key] = value
    return merged


# ---------------------------------------------------------------------------------------------
# Loading


def _suggest(word: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(word, candidates, n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _location(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif "." in part or "/" in part:
            text += f'["{part}"]'
        else:
            text += f".{part}" if text else part
    return text


def _model_at(loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    model: type[BaseModel] = OperatorConfig
    for part in loc:
        field = next(
            (
                info
                for name, info in model.model_fields.items()
                if part in (name, info.alias or to_camel(name))
            ),
            None,
        )
        if field is None or not (
            isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
        ):
            return None
        model = field.annotation
    return model


def _describe(exc: ValidationError, from_env: Mapping[tuple[str, ...], str]) -> str:
    problems = []
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        source = next((f" (set by {var})" for path, var in from_env.items() if loc[: len(path)] == path), "")
        if err["type"] == "extra_forbidden":
            parent = _model_at(loc[:-1])
            known = (
                [info.alias or to_camel(name) for name, info in parent.model_fields.items()] if parent else []
            )
            problems.append(f"unknown key '{_location(loc)}'{_suggest(str(loc[-1]), known)}")
            continue
        message = str(err["msg"]).removeprefix("Value error, ")
        # Cross-field checks already name their keys in full.
        if err["type"] == "value_error" and message.startswith("faultTolerance."):
            problems.append(message)
        else:
            problems.append(f"{_location(loc)}: {message}{source}")
    return "; ".join(problems)


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"configuration file {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"cannot read configuration file {path}: {exc.strerror}") from None
    return _parse(text, f"configuration file {path}")


def _parse(text: str, what: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{what} must hold a mapping of keys, not {type(data).__name__}")
    return data


def load_config(path: Path | None = None, env: Mapping[str, str] | None = None) -> OperatorConfig:
    """The validated configuration: defaults, then the YAML file, then ``RESPAWN_*`` variables.

    ``path`` defaults to ``$RESPAWN_CONFIG``; with neither, only defaults and the environment
    apply. ``env`` defaults to ``os.environ``. Raises :class:`ConfigError`.
    """
    environ = os.environ if env is None else env
    if path is None and environ.get(CONFIG_ENV):
        path = Path(environ[CONFIG_ENV])
    data = _read_file(path) if path is not None else {}
    return _validate(data, environ, f" (file {path})" if path is not None else "")


def config_from_text(text: str | None, env: Mapping[str, str], source: str) -> OperatorConfig:
    """The configuration a service loads from a file holding ``text`` (None: no file) with the
    environment ``env``: what a Deployment gives it from its ConfigMaps. ``source`` names where
    the text came from, in errors. Raises :class:`ConfigError`."""
    data = _parse(text, source) if text is not None else {}
    return _validate(data, env, f" ({source})")


def _validate(data: dict[str, Any], environ: Mapping[str, str], source: str) -> OperatorConfig:
    overrides = _env_overrides(environ)
    data = merge_documents(data, overrides)
    from_env = {path: env for env, path in _ENV_TO_PATH.items() if env in environ}
    try:
        return OperatorConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"invalid configuration{source}: {_describe(exc, from_env)}") from None
