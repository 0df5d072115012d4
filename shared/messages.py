"""Message schemas and their codec: the one place every bus message is defined and encoded.

Every message is a pydantic model with a ``schema_kind`` and ``schema_version``. Internal
messages travel as msgpack; the public ones (``PUBLIC``: verdicts and lifecycle events) in the
deployment's choice of encoding (:data:`ENCODINGS`): plain JSON, JSON with CloudEvents headers
(binary content mode), or msgpack. The payload of a message is the same map in every encoding,
and the ``content-type`` header says which one it is (none: msgpack), so :func:`decode` reads a
stream that holds a mix. A consumer rejects a message whose version is newer than it
understands (``UnsupportedSchemaVersion``) instead of guessing, and a message that does not
validate (``InvalidMessage``) is dead-lettered by the bus adapter. The schemas are documented in
docs/messages.md, and as JSON Schema in docs/schemas/.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, ClassVar, Final, Literal, TypeVar

import msgpack
from pydantic import BaseModel, ConfigDict, Field, ValidationError

SCHEMA_HEADER = "Respawn-Schema"

# How a message's payload is encoded (docs/messages.md, "Encodings"). msgpack is what every
# message was before the header existed, so a message without it is msgpack.
Encoding = Literal["json", "cloudevents", "msgpack"]
ENCODINGS: Final[tuple[Encoding, ...]] = ("json", "cloudevents", "msgpack")
CONTENT_TYPE_HEADER: Final = "content-type"
JSON_CONTENT_TYPE: Final = "application/json"
MSGPACK_CONTENT_TYPES: Final = frozenset(
    {"application/msgpack", "application/x-msgpack", "application/vnd.msgpack"}
)
# CloudEvents 1.0 in the binary content mode of its NATS binding: every attribute a header of
# its own, the payload the event's data (the same JSON as with the plain ``json`` encoding).
CE_PREFIX: Final = "ce-"
CE_SPECVERSION: Final = "1.0"
# ``ce-type`` is this prefix, the schema kind and its version: ``dev.respawn.verdict.v1``.
CE_TYPE_PREFIX: Final = "dev.respawn."


class InvalidMessage(ValueError):
    """The bytes are not a valid message of the expected kind."""


class UnsupportedSchemaVersion(InvalidMessage):
    """The message was written by a newer producer than this consumer understands."""


class Message(BaseModel):
    """Base of every message on the bus."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    KIND: ClassVar[str] = ""
    VERSION: ClassVar[int] = 1
    # A message of the public streams, for outside systems: encoded as the deployment chooses
    # (``nats.publicEncoding``); every other message is msgpack.
    PUBLIC: ClassVar[bool] = False
    # Counts additive changes within a version (new optional fields whose defaults keep the old
    # meaning): a reader of an older revision reads a newer one, ignoring what it does not know,
    # so only ``schema_version`` is ever a reason to refuse a message.
    REVISION: ClassVar[int] = 0

    schema_kind: str = ""
    schema_version: int = 1
    schema_revision: int = 0

    def model_post_init(self, __context: Any) -> None:
        # Stamp kind/version on construction so producers never forget them.
        object.__setattr__(self, "schema_kind", self.KIND)
        object.__setattr__(self, "schema_version", self.VERSION)
        object.__setattr__(self, "schema_revision", self.REVISION)

    @classmethod
    def schema_id(cls) -> str:
        return f"{cls.KIND}/v{cls.VERSION}"

    @classmethod
    def ce_type(cls) -> str:
        """The CloudEvents ``type`` of this schema: ``dev.respawn.<schema_kind>.v<version>``."""
        return f"{CE_TYPE_PREFIX}{cls.KIND}.v{cls.VERSION}"

    def ce_subject(self) -> str:
        """The CloudEvents ``subject``: what the message is about (``namespace/name``)."""
        ref = getattr(self, "ref", None)
        return f"{ref.namespace}/{ref.name}" if isinstance(ref, ObjectRef) else ""

    def ce_time(self) -> datetime | None:
        """The CloudEvents ``time``: when what the message tells happened (None: unknown)."""
        return None

    def encode(self, encoding: Encoding = "msgpack") -> bytes:
        """The payload alone; :func:`encode` also gives the headers that say how to read it."""
        if encoding == "msgpack":
            return msgpack.packb(self.model_dump(mode="json"), use_bin_type=True)  # type: ignore[no-any-return]
        return self.model_dump_json().encode()


M = TypeVar("M", bound=Message)


def _rfc3339(moment: datetime) -> str:
    """``moment`` in UTC as RFC 3339 (a time without a zone is taken as UTC, as Respawn's are)."""
    utc = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    return utc.isoformat().replace("+00:00", "Z")


def encode(message: Message, encoding: Encoding, *, msg_id: str, source: str) -> tuple[bytes, dict[str, str]]:
    """``message``'s payload in ``encoding`` and the headers that say how it is encoded.

    ``msg_id`` (the message's ``Nats-Msg-Id``) becomes the CloudEvents ``id`` and ``source``
    (the publishing service) its ``source``: a repeat of one event carries the same pair, as
    CloudEvents would have it.
    """
    payload = message.encode(encoding)
    if encoding == "msgpack":
        return payload, {}
    headers = {CONTENT_TYPE_HEADER: JSON_CONTENT_TYPE}
    if encoding == "cloudevents":
        headers.update(
            {
                CE_PREFIX + "specversion": CE_SPECVERSION,
                CE_PREFIX + "id": msg_id,
                CE_PREFIX + "type": message.ce_type(),
                CE_PREFIX + "source": source,
            }
        )
        subject = message.ce_subject()
        if subject:
            headers[CE_PREFIX + "subject"] = subject
        moment = message.ce_time()
        if moment is not None:
            headers[CE_PREFIX + "time"] = _rfc3339(moment)
    return payload, headers


def content_type(headers: Mapping[str, str] | None) -> str:
    """The media type the ``content-type`` header names (any case; parameters dropped), or ""."""
    for key, value in (headers or {}).items():
        if key.lower() == CONTENT_TYPE_HEADER:
            return value.split(";", 1)[0].strip().lower()
    return ""


def _load(data: bytes, headers: Mapping[str, str] | None) -> Any:
    media = content_type(headers)
    if media == JSON_CONTENT_TYPE:
        try:
            return json.loads(data)
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            raise InvalidMessage(f"not JSON: {exc}") from exc
    if media and media not in MSGPACK_CONTENT_TYPES:
        raise InvalidMessage(f"unsupported content-type {media!r}: expected {JSON_CONTENT_TYPE} or msgpack")
    try:
        return msgpack.unpackb(data, raw=False)
    except Exception as exc:  # msgpack raises several unrelated exception types
        raise InvalidMessage(f"not msgpack: {exc}") from exc


def decode(cls: type[M], data: bytes, headers: Mapping[str, str] | None = None) -> M:
    """Decode a payload into ``cls``; raise InvalidMessage with a specific reason.

    The ``content-type`` among ``headers`` says how it is encoded: ``application/json`` (also
    under CloudEvents headers) or msgpack, which a message without one is.
    """
    return _decode(cls, _load(data, headers))


def _decode(cls: type[M], raw: Any) -> M:
    if not isinstance(raw, dict):
        raise InvalidMessage(f"expected a map, got {type(raw).__name__}")
    kind = raw.get("schema_kind")
    variants: dict[str, type[Message]] = getattr(cls, "VARIANTS", {})
    if variants:
        # A union stand-in (e.g. AnyObservation): dispatch on the kind the message names.
        if kind not in variants:
            raise InvalidMessage(f"expected one of {sorted(variants)}, got schema_kind {kind!r}")
        return _decode(variants[kind], raw)  # type: ignore[return-value]
    if kind != cls.KIND:
        raise InvalidMessage(f"expected schema_kind {cls.KIND!r}, got {kind!r}")
    version = raw.get("schema_version")
    if not isinstance(version, int):
        raise InvalidMessage("schema_version missing or not an integer")
    if version > cls.VERSION:
        raise UnsupportedSchemaVersion(
            f"{kind} schema version {version} is newer than supported {cls.VERSION}; upgrade this service"
        )
    try:
        return cls.model_validate(raw)
    except ValidationError as exc:
        raise InvalidMessage(f"invalid {kind}: {exc.errors(include_url=False)}") from exc


class ObjectRef(BaseModel):
    model_config = ConfigDict(frozen=True)

    namespace: str = ""
    name: str
    uid: str = ""


# ---------------------------------------------------------------- observations


class AppWrapperObservation(Message):
    """Latest state of an AppWrapper: its metadata, spec without component templates (pod sets kept)
    and status (docs/messages.md); ``deleted`` marks a tombstone."""

    KIND: ClassVar[str] = "observation.appwrapper"

    ref: ObjectRef
    resource_version: str = ""
    deleted: bool = False
    observed_at: datetime
    body: dict[str, Any] = Field(default_factory=dict)


class ContainerState(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    init: bool = False
    state: Literal["waiting", "running", "terminated", "unknown"] = "unknown"
    exit_code: int | None = None
    reason: str = ""
    ready: bool = False
    restart_count: int = 0
    # state.terminated.finishedAt: when a failed pod failed, taken from the pod itself so that
    # every health instance (and a restarted one) computes the same failure deadline.
    finished_at: datetime | None = None
    # Revision 1: the terminated state's message (the container's termination message, at most
    # MESSAGE_LIMIT characters) or the waiting state's message; and for a container that
    # restarted, the exit code and reason of its last termination (a crash loop shows there).
    message: str = ""
    last_exit_code: int | None = None
    last_reason: str = ""


# Long enough for the kubelet's own termination message limit (4 KiB); the failure patterns
# match on it. Longer values are cut, so a pod cannot make its observations arbitrarily large.
MESSAGE_LIMIT = 4096


class PodConditionState(BaseModel):
    """One condition of a pod (revision 1 of ``observation.pod``): e.g. ``DisruptionTarget``,
    whose reason tells a preemption, an eviction or the taint manager from an application fault."""

    model_config = ConfigDict(frozen=True)

    type: str
    status: str = ""
    reason: str = ""
    message: str = ""


class PodObservation(Message):
    """Latest state of a pod labelled ``workload.codeflare.dev/appwrapper``."""

    KIND: ClassVar[str] = "observation.pod"
    REVISION: ClassVar[int] = 3

    ref: ObjectRef
    appwrapper: str
    resource_version: str = ""
    deleted: bool = False
    observed_at: datetime
    created_at: datetime | None = None
    deletion_requested: bool = False
    phase: str = "Pending"
    node_name: str = ""
    scheduled: bool = False
    containers: tuple[ContainerState, ...] = ()
    # Extended resources (e.g. nvidia.com/gpu) the pod requests or limits, for Autopilot.
    resources: tuple[str, ...] = ()
    owner_kind: str = ""
    owner_name: str = ""
    # Revision 1: what a failure is classified on (docs/failures.md): ``status.reason`` and
    # ``status.message`` (Evicted, Preempting, NodeLost, ...) and the pod's conditions.
    reason: str = ""
    message: str = ""
    conditions: tuple[PodConditionState, ...] = ()
    # Revision 2: the pod's pod set (its respawn.dev/pod-set label, which lifecycle stamps on
    # every pod template: the index among all the AppWrapper's pod sets), None when unlabelled.
    pod_set: int | None = None
    # Revision 3: the pod's ``respawn.dev/heartbeat`` annotation as written (at most 64
    # characters; "" when absent), the progress heartbeat of docs/failures.md.
    heartbeat: str = ""


class ComponentObservation(Message):
    """Latest state of a top-level resource wrapped by an AppWrapper."""

    KIND: ClassVar[str] = "observation.component"

    ref: ObjectRef
    appwrapper: str
    api_version: str
    kind: str
    resource_version: str = ""
    deleted: bool = False
    observed_at: datetime
    deletion_requested: bool = False
    # Interpreted status for kinds Respawn understands (batch/v1 Job, kubeflow.org/v1 PyTorchJob).
    failed: bool = False
    succeeded: bool = False
    status_message: str = ""
    # metadata.creationTimestamp: tells a component of the current attempt from one deleted by
    # the previous reset (same name) whose observation arrives late.
    created_at: datetime | None = None


class NodeObservation(Message):
    KIND: ClassVar[str] = "observation.node"
    REVISION: ClassVar[int] = 1

    name: str
    resource_version: str = ""
    deleted: bool = False
    observed_at: datetime
    labels: dict[str, str] = Field(default_factory=dict)
    taints: tuple[dict[str, str], ...] = ()
    unschedulable: bool = False
    ready: bool = True
    # Revision 1: the Ready condition's status as written (True, False or Unknown; "" when the
    # node has none) and its lastTransitionTime, so that a node out of contact (Unknown) is told
    # from one that reports itself NotReady, and every reader dates the change alike.
    ready_status: str = ""
    ready_since: datetime | None = None


# --------------------------------------------------------------------- verdicts

VerdictState = Literal["Healthy", "Unhealthy", "Succeeded", "Deleted"]


class Verdict(Message):
    """Health's decision about one AppWrapper. Public interface: ``respawn.verdict.<ns>.<name>``.

    ``state`` Unhealthy means the grace period (if any) has run out and lifecycle should
    reset (or fail, when ``terminal``) the workload. ``seq`` increases with every verdict
    published for one AppWrapper incarnation (uid) so a consumer can drop stale ones.
    """

    KIND: ClassVar[str] = "verdict"
    REVISION: ClassVar[int] = 1
    PUBLIC: ClassVar[bool] = True

    ref: ObjectRef
    state: VerdictState
    reason: str = ""
    message: str = ""
    terminal: bool = False
    # Autopilot migrations reset without counting against the retry limit.
    counts_toward_retry: bool = True
    nodes: tuple[str, ...] = ()
    resetting_count: int = 0
    first_unhealthy_at: datetime | None = None
    decided_at: datetime
    seq: int = 0
    warnings: tuple[str, ...] = ()
    # When a condition still inside its grace period becomes Unhealthy unless it clears
    # (set on Healthy verdicts that carry a reason), or when it did (on Unhealthy verdicts).
    deadline: datetime | None = None
    # The attempt judged: the ResourcesDeployed transition time of the AppWrapper's current
    # deployment. With ``resetting_count`` it tells verdicts about an earlier attempt (including
    # one ended by an Autopilot reset, which does not increment the count) from current ones.
    attempt_started_at: datetime | None = None
    # Revision 1 (docs/failures.md): the failure's class (Transient, Permanent or Unknown; ""
    # when the verdict is not about a failure) and code (e.g. ExitCode:1, Signal:SIGKILL,
    # OOMKilled, Evicted); whether it is an Application or an Infrastructure fault (``nodes``
    # then names the nodes blamed: none for an application fault).
    failure_class: str = ""
    failure_code: str = ""
    fault_kind: str = ""

    def ce_time(self) -> datetime | None:
        return self.decided_at


QuarantineState = Literal["Quarantined", "DryRun", "Held", "Released"]

# The pseudo-resource of the node verdict that carries node quarantine (docs/autopilot.md): its
# ``no_schedule`` set is kept off by every workload, whatever resources it uses.
QUARANTINE_RESOURCE = "respawn.dev/quarantine"


class QuarantinedNode(BaseModel):
    """One node of the quarantine verdict, and why (docs/autopilot.md, "Node quarantine")."""

    model_config = ConfigDict(frozen=True)

    node: str
    # Quarantined: kept off; DryRun: would be, with dryRun on; Held: due, but past the cap;
    # Released: its quarantine ended, its earlier failures no longer count.
    state: QuarantineState
    # Infrastructure faults blamed on the node that led to this (each AppWrapper attempt once).
    failures: int = 0
    # The AppWrappers (namespace/name) those faults were in, sorted.
    workloads: tuple[str, ...] = ()
    # When it became due (Held: since when it waits), and when the quarantine ends (None: Held).
    since: datetime
    until: datetime | None = None


LostNodeState = Literal["NotReady", "Unknown", "Deleted"]

# The pseudo-resource of the node verdict that carries the nodes that are not Ready, out of
# contact or gone (docs/autopilot.md, "Node state"): what failure classification reads as a
# pod's node state. Its three sets are always empty.
NODE_STATE_RESOURCE = "respawn.dev/node-state"


class LostNode(BaseModel):
    """One node of the node-state verdict (docs/messages.md)."""

    model_config = ConfigDict(frozen=True)

    node: str
    # NotReady: its Ready condition is False (or it has none); Unknown: the node controller
    # lost contact with it; Deleted: the Node object is gone.
    state: LostNodeState
    # When it entered this state: the Ready condition's lastTransitionTime (else when it was
    # first observed so), or when its deletion was observed.
    since: datetime


class NodeVerdict(Message):
    """Autopilot's view of unhealthy nodes for one resource (e.g. nvidia.com/gpu)."""

    KIND: ClassVar[str] = "verdict.node"
    REVISION: ClassVar[int] = 2

    resource: str
    no_schedule: tuple[str, ...] = ()
    prefer_no_schedule: tuple[str, ...] = ()
    no_execute: tuple[str, ...] = ()
    decided_at: datetime
    # Revision 1: on the resource QUARANTINE_RESOURCE only, every node of the quarantine with
    # why; the Quarantined ones are also the ``no_schedule`` set.
    quarantine: tuple[QuarantinedNode, ...] = ()
    # Revision 2: on the resource NODE_STATE_RESOURCE only, every node that is not Ready, out
    # of contact, or deleted within the last hour, sorted by name.
    lost_nodes: tuple[LostNode, ...] = ()


class LifecycleEvent(Message):
    """Something lifecycle did to an AppWrapper. Public interface: ``respawn.lifecycle.<ns>.<name>``."""

    KIND: ClassVar[str] = "lifecycle.event"
    REVISION: ClassVar[int] = 1
    PUBLIC: ClassVar[bool] = True

    ref: ObjectRef
    event: str
    phase: str = ""
    previous_phase: str = ""
    reason: str = ""
    message: str = ""
    resetting_count: int = 0
    nodes: tuple[str, ...] = ()
    at: datetime
    # Revision 1: the class and code of the failure the event is about ("" when none), as in
    # the verdict it applied.
    failure_class: str = ""
    failure_code: str = ""

    def ce_time(self) -> datetime | None:
        return self.at


class AnyObservation(Message):
    """Stand-in for "any observation" when one consumer reads the whole observation stream.

    ``decode(AnyObservation, data)`` returns the concrete observation the message names.
    """

    KIND: ClassVar[str] = "observation.*"
    VARIANTS: ClassVar[dict[str, type[Message]]] = {
        AppWrapperObservation.KIND: AppWrapperObservation,
        PodObservation.KIND: PodObservation,
        ComponentObservation.KIND: ComponentObservation,
        NodeObservation.KIND: NodeObservation,
    }
