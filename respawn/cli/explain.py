"""`respawn explain NS/NAME`: the incident timeline of one AppWrapper, from the streams.

Everything Respawn published about the AppWrapper is merged into one timeline ordered by time:
the last observed state of its pods and wrapped components (the observation stream keeps the
latest state per object, so a pod deleted by a reset still shows how it ended), every stored
verdict and every lifecycle event. Incidents are then read off that timeline (first unhealthy
→ detected → reset → running again, or failed), with their durations and the trace ids the
messages carried. Building and rendering are pure; :func:`gather` does the reading.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final, Literal

import typer

from respawn.cli.output import (
    EXIT_NOT_FOUND,
    EXIT_UNAVAILABLE,
    CliError,
    UsageError,
    default_namespace,
    emit,
    fail,
    json_flag,
    namespace_options,
    output_option,
    resolve_output,
)
from respawn.cli.tail import (
    NatsUnavailable,
    StoredMessage,
    connect_nats,
    event_line,
    format_time,
    read_all,
    trace_id,
    verdict_line,
)
from shared import subjects
from shared.messages import (
    AnyObservation,
    AppWrapperObservation,
    ComponentObservation,
    ContainerState,
    InvalidMessage,
    LifecycleEvent,
    Message,
    PodObservation,
    Verdict,
    decode,
)

__all__ = [
    "Current",
    "Entry",
    "Incident",
    "Records",
    "build_timeline",
    "current_state",
    "explain_json",
    "find_incidents",
    "format_duration",
    "gather",
    "observation_entry",
    "parse_target",
    "register",
    "render_explain",
    "unreadable_note",
]

Source = Literal["observation", "verdict", "lifecycle"]
# At equal times, cause before effect: what was observed, then judged, then done.
_RANK: Final[dict[str, int]] = {"observation": 0, "verdict": 1, "lifecycle": 2}
_RUNNING: Final = "Running"
_FAILED: Final = "Failed"
_RESET_STARTED: Final = "ResetStarted"
_RESET_FINISHED: Final = "ResetFinished"
_PHASE_CHANGED: Final = "PhaseChanged"


# ------------------------------------------------------------------------------ timeline


@dataclass(frozen=True, slots=True)
class Entry:
    at: datetime
    source: Source
    summary: str
    seq: int = 0
    trace_id: str = ""
    message: Message | None = field(default=None, compare=False, repr=False)


def format_duration(delta: timedelta) -> str:
    """Seconds with one decimal below a minute (1.5s), else 3m12s / 2h5m."""
    total = delta.total_seconds()
    sign = "-" if total < 0 else ""
    total = abs(total)
    if total < 60:
        return f"{sign}{total:.1f}s"
    whole = int(total)
    hours, rest = divmod(whole, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{sign}{hours}h{minutes}m"
    return f"{sign}{minutes}m{seconds}s"


def _container(c: ContainerState) -> str:
    who = f"init container {c.name}" if c.init else c.name
    if c.state == "terminated" and c.exit_code not in (None, 0):
        return f"{who} exited {c.exit_code}" + (f" ({c.reason})" if c.reason else "")
    if c.state == "waiting" and c.reason and c.reason not in ("ContainerCreating", "PodInitializing"):
        return f"{who} waiting ({c.reason})"
    return ""


def _failed_at(pod: PodObservation) -> datetime | None:
    times = [c.finished_at for c in pod.containers if c.finished_at and c.exit_code not in (None, 0)]
    return max(times) if times else None


def observation_entry(obs: Message, stored: StoredMessage | None = None) -> Entry | None:
    """The timeline entry of an object's last observed state, or None for nothing to show.

    A failed pod is placed at its failure time (``finished_at``), which is when it mattered,
    rather than at its last observation (often its deletion by the reset).
    """
    seq, trace = (stored.seq, trace_id(stored.headers)) if stored else (0, "")
    if isinstance(obs, PodObservation):
        state = "deleted after " + obs.phase if obs.deleted else obs.phase
        if obs.deletion_requested and not obs.deleted:
            state += ", terminating"
        details = [d for d in (_container(c) for c in obs.containers) if d]
        where = f" on {obs.node_name}" if obs.node_name else " (not scheduled)" if not obs.scheduled else ""
        summary = f"pod {obs.ref.name}{where}: {state}" + (f"; {'; '.join(details)}" if details else "")
        return Entry(_failed_at(obs) or obs.observed_at, "observation", summary, seq, trace, obs)
    if isinstance(obs, ComponentObservation):
        states = [s for s, on in (("failed", obs.failed), ("succeeded", obs.succeeded)) if on]
        if obs.deleted:
            states.append("deleted")
        elif obs.deletion_requested:
            states.append("terminating")
        if not states:
            return None  # a component that merely exists tells nothing about an incident
        summary = f"{obs.kind} {obs.ref.name}: {', '.join(states)}"
        if obs.status_message:
            summary += f": {obs.status_message}"
        return Entry(obs.observed_at, "observation", summary, seq, trace, obs)
    if isinstance(obs, AppWrapperObservation) and obs.deleted:
        return Entry(obs.observed_at, "observation", "AppWrapper deleted", seq, trace, obs)
    return None


def _strip(line: str) -> str:
    # The stream lines start with time and ns/name, which the timeline shows once already.
    parts = line.split("  ", 2)
    return parts[2] if len(parts) == 3 else line


def verdict_entry(v: Verdict, stored: StoredMessage | None = None) -> Entry:
    seq, trace = (stored.seq, trace_id(stored.headers)) if stored else (0, "")
    return Entry(v.decided_at, "verdict", _strip(verdict_line(v)), seq, trace, v)


def event_entry(e: LifecycleEvent, stored: StoredMessage | None = None) -> Entry:
    seq, trace = (stored.seq, trace_id(stored.headers)) if stored else (0, "")
    return Entry(e.at, "lifecycle", _strip(event_line(e)), seq, trace, e)


def build_timeline(entries: Iterable[Entry]) -> list[Entry]:
    """Ordered by time; at equal times observation, verdict, lifecycle; then stream order."""
    return sorted(entries, key=lambda e: (e.at, _RANK[e.source], e.seq))


# ------------------------------------------------------------------------------ incidents


@dataclass(slots=True)
class Incident:
    """One failure of the workload and what Respawn did about it."""

    reason: str = ""
    message: str = ""
    nodes: tuple[str, ...] = ()
    terminal: bool = False
    migration: bool = False
    # status.resettingCount of the attempt that failed (from the verdict).
    judged_attempt: int | None = None
    # status.resettingCount after the reset (the attempt that replaced it).
    attempt: int | None = None
    first_unhealthy_at: datetime | None = None
    detected_at: datetime | None = None
    reset_started_at: datetime | None = None
    reset_finished_at: datetime | None = None
    running_again_at: datetime | None = None
    failed_at: datetime | None = None
    trace_ids: tuple[str, ...] = ()
    # The failure's class and code (docs/failures.md) and whose fault it was; "" when the
    # verdict (or event) had none.
    failure_class: str = ""
    failure_code: str = ""
    fault_kind: str = ""

    @property
    def closed(self) -> bool:
        return self.running_again_at is not None or self.failed_at is not None

    @property
    def started_at(self) -> datetime | None:
        return self.first_unhealthy_at or self.detected_at or self.reset_started_at or self.failed_at

    @property
    def outcome(self) -> str:
        if self.failed_at is not None:
            return "failed"
        if self.running_again_at is not None:
            return "recovered"
        if self.reset_started_at is not None:
            return "resetting"
        return "detected"

    def since_start(self, at: datetime | None) -> timedelta | None:
        start = self.started_at
        return at - start if at is not None and start is not None else None

    def _classify(self, failure_class: str, code: str, fault_kind: str = "") -> None:
        if failure_class and not self.failure_class:
            self.failure_class, self.failure_code = failure_class, code
        self.fault_kind = self.fault_kind or fault_kind

    def _note(self, nodes: Sequence[str], trace: str) -> None:
        self.nodes = tuple(dict.fromkeys((*self.nodes, *nodes)))
        if trace and trace not in self.trace_ids:
            self.trace_ids = (*self.trace_ids, trace)


def _opens_new(current: Incident | None, v: Verdict) -> bool:
    if current is None or current.closed:
        return True
    if current.reset_started_at is None:
        return False  # the same failure, seen again before the reset
    # Already reset: a verdict about the replacing attempt is a new failure.
    return current.attempt is not None and v.resetting_count >= current.attempt


def find_incidents(timeline: Sequence[Entry]) -> list[Incident]:
    """Incidents read off an ordered timeline: an Unhealthy verdict (or a reset or failure
    without one in the retained history) opens one; running again or failing closes it."""
    found: list[Incident] = []
    current: Incident | None = None

    def open_new() -> Incident:
        nonlocal current
        current = Incident()
        found.append(current)
        return current

    for entry in timeline:
        msg = entry.message
        if isinstance(msg, Verdict) and msg.state == "Unhealthy":
            inc = open_new() if _opens_new(current, msg) else current
            assert inc is not None
            if inc.detected_at is None:
                inc.detected_at = msg.decided_at
                inc.first_unhealthy_at = msg.first_unhealthy_at or msg.decided_at
                inc.reason, inc.message = msg.reason, msg.message
                inc.judged_attempt = msg.resetting_count
            inc._classify(msg.failure_class, msg.failure_code, msg.fault_kind)
            inc.terminal = inc.terminal or msg.terminal
            inc.migration = inc.migration or not msg.counts_toward_retry
            inc._note(msg.nodes, entry.trace_id)
        elif isinstance(msg, LifecycleEvent):
            if msg.event == _RESET_STARTED:
                inc = current if current is not None and not current.closed else None
                if inc is None or inc.reset_started_at is not None:
                    inc = open_new()
                inc.reset_started_at = msg.at
                inc.attempt = msg.resetting_count
                inc._classify(msg.failure_class, msg.failure_code)
                inc.reason = inc.reason or msg.reason
                inc.message = inc.message or msg.message
                inc._note(msg.nodes, entry.trace_id)
            elif msg.event == _RESET_FINISHED and current is not None and not current.closed:
                current.reset_finished_at = msg.at
                current._note((), entry.trace_id)
            elif msg.event == _PHASE_CHANGED and msg.phase == _RUNNING:
                if current is not None and not current.closed and current.reset_started_at is not None:
                    current.running_again_at = msg.at
                    current._note((), entry.trace_id)
            elif msg.event == _PHASE_CHANGED and msg.phase == _FAILED:
                inc = current if current is not None and not current.closed else open_new()
                inc.failed_at = msg.at
                inc._classify(msg.failure_class, msg.failure_code)
                inc.reason = inc.reason or msg.reason
                inc.message = inc.message or msg.message
                inc._note(msg.nodes, entry.trace_id)
    return found


# ------------------------------------------------------------------------------ rendering


@dataclass(frozen=True, slots=True)
class Current:
    """The AppWrapper's last observed state (from the observation stream)."""

    phase: str
    resetting_count: int
    deleted: bool
    uid: str


def current_state(observations: Iterable[Message]) -> Current | None:
    """From the AppWrapper's own (latest) observation, if there is one."""
    for obs in observations:
        if isinstance(obs, AppWrapperObservation):
            status = obs.body.get("status") if isinstance(obs.body.get("status"), dict) else {}
            assert isinstance(status, dict)
            count = status.get("resettingCount")
            return Current(
                phase=str(status.get("phase") or ""),
                resetting_count=count if isinstance(count, int) else 0,
                deleted=obs.deleted,
                uid=obs.ref.uid,
            )
    return None


def _stage(label: str, inc: Incident, at: datetime | None) -> str:
    if at is None:
        return ""
    offset = inc.since_start(at)
    return f"{label} +{format_duration(offset)}" if offset is not None else f"{label} {format_time(at)}"


def _incident_lines(number: int, inc: Incident) -> list[str]:
    kind = " (Autopilot migration)" if inc.migration else " (terminal)" if inc.terminal else ""
    head = f"{number}. {inc.reason or 'unknown cause'}{kind}"
    if inc.failure_class:
        fault = f", {inc.fault_kind.lower()} fault" if inc.fault_kind else ""
        head += f" [{inc.failure_class} {inc.failure_code or '-'}{fault}]"
    if inc.nodes:
        head += f" on {', '.join(inc.nodes)}"
    if inc.message:
        head += f": {inc.message}"
    lines = [head]
    start = inc.started_at
    stages = [
        f"first unhealthy {format_time(inc.first_unhealthy_at)}" if inc.first_unhealthy_at else "",
        _stage("detected", inc, inc.detected_at),
        _stage("reset started", inc, inc.reset_started_at),
        _stage("reset finished", inc, inc.reset_finished_at),
        _stage("running again", inc, inc.running_again_at),
        _stage("failed", inc, inc.failed_at),
    ]
    if not inc.first_unhealthy_at and start is not None:
        stages[0] = f"from {format_time(start)}"
    lines.append("   " + " -> ".join(s for s in stages if s))
    outcome = inc.outcome
    if inc.attempt is not None:
        outcome += f" (reset to attempt {inc.attempt})"
    lines.append(f"   outcome: {outcome}")
    if inc.trace_ids:
        lines.append(f"   trace: {', '.join(inc.trace_ids)}")
    return lines


def _trace_summary(timeline: Sequence[Entry]) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for entry in timeline:
        if entry.trace_id:
            counts[entry.trace_id] = counts.get(entry.trace_id, 0) + 1
    return list(counts.items())


def render_explain(
    namespace: str,
    name: str,
    timeline: Sequence[Entry],
    incidents: Sequence[Incident],
    current: Current | None,
) -> str:
    """The human-readable explanation: state, timeline, incidents, trace ids."""
    head = f"AppWrapper {namespace}/{name}"
    if current is not None:
        state = "deleted" if current.deleted else current.phase or "no phase yet"
        resets = f"{current.resetting_count} reset{'s' if current.resetting_count != 1 else ''}"
        head += f": {state}, {resets}"
    lines = [head, "", "Timeline"]
    width = max((len(e.source) for e in timeline), default=0)
    for entry in timeline:
        lines.append(f"  {format_time(entry.at)}  {entry.source:<{width}}  {entry.summary}")
    lines += ["", "Incidents" if incidents else "Incidents: none"]
    for number, inc in enumerate(incidents, 1):
        lines += ["  " + line for line in _incident_lines(number, inc)]
    traces = _trace_summary(timeline)
    lines += ["", "Traces" if traces else "Traces: none (the messages carried no traceparent)"]
    for tid, count in traces:
        lines.append(f"  {tid}  ({count} message{'s' if count != 1 else ''})")
    return "\n".join(lines)


def _iso(at: datetime | None) -> str | None:
    return format_time(at) if at is not None else None


def _seconds(delta: timedelta | None) -> float | None:
    return round(delta.total_seconds(), 3) if delta is not None else None


def explain_json(
    namespace: str,
    name: str,
    timeline: Sequence[Entry],
    incidents: Sequence[Incident],
    current: Current | None,
    version: str,
) -> dict[str, Any]:
    """The ``--json`` document (docs/cli.md)."""
    return {
        "version": version,
        "appwrapper": {"namespace": namespace, "name": name},
        "current": (
            {
                "phase": current.phase,
                "resettingCount": current.resetting_count,
                "deleted": current.deleted,
                "uid": current.uid,
            }
            if current is not None
            else None
        ),
        "timeline": [
            {
                "at": format_time(e.at),
                "source": e.source,
                "seq": e.seq,
                "summary": e.summary,
                "traceId": e.trace_id,
            }
            for e in timeline
        ],
        "incidents": [
            {
                "reason": inc.reason,
                "message": inc.message,
                "nodes": list(inc.nodes),
                "terminal": inc.terminal,
                "migration": inc.migration,
                "failureClass": inc.failure_class,
                "failureCode": inc.failure_code,
                "faultKind": inc.fault_kind,
                "outcome": inc.outcome,
                "judgedAttempt": inc.judged_attempt,
                "attempt": inc.attempt,
                "firstUnhealthyAt": _iso(inc.first_unhealthy_at),
                "detectedAt": _iso(inc.detected_at),
                "resetStartedAt": _iso(inc.reset_started_at),
                "resetFinishedAt": _iso(inc.reset_finished_at),
                "runningAgainAt": _iso(inc.running_again_at),
                "failedAt": _iso(inc.failed_at),
                "detectionSeconds": _seconds(inc.since_start(inc.detected_at)),
                "timeToResetSeconds": _seconds(inc.since_start(inc.reset_started_at)),
                "recoverySeconds": _seconds(inc.since_start(inc.running_again_at)),
                "traceIds": list(inc.trace_ids),
            }
            for inc in incidents
        ],
        "traceIds": [tid for tid, _ in _trace_summary(timeline)],
    }


def parse_target(target: str) -> tuple[str, str]:
    """``NS/NAME`` → (namespace, name); ValueError otherwise."""
    namespace, sep, name = target.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise ValueError(f"expected NS/NAME, got {target!r}")
    return namespace, name


# ------------------------------------------------------------------------------ reading


@dataclass(frozen=True, slots=True)
class Records:
    """What the streams hold about one AppWrapper, decoded (undecodable messages are counted)."""

    verdicts: tuple[tuple[Verdict, StoredMessage], ...] = ()
    events: tuple[tuple[LifecycleEvent, StoredMessage], ...] = ()
    observations: tuple[tuple[Message, StoredMessage], ...] = ()
    skipped: int = 0
    # Streams this NATS account does not have, so their part of the story is left out (an
    # outside reader's account holds mirrors of the verdicts and lifecycle events only).
    unreadable: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.verdicts or self.events or self.observations)

    def timeline(self) -> list[Entry]:
        entries: list[Entry] = [verdict_entry(v, s) for v, s in self.verdicts]
        entries += [event_entry(e, s) for e, s in self.events]
        entries += [e for e in (observation_entry(o, s) for o, s in self.observations) if e is not None]
        return build_timeline(entries)


# How long a JetStream API answer may take before explain names the request NATS did not answer
# (with NATS auth, a request the user may not make gets no answer at all, only a timeout).
_API_WAIT: Final = 5.0
_PUBLIC: Final = (subjects.VERDICTS_STREAM, subjects.LIFECYCLE_STREAM)


def _who() -> str:
    user = os.environ.get("NATS_USER")
    return f"NATS user {user}" if user else "this NATS connection"


def _refused(nc: Any, what: str) -> NatsUnavailable:
    """The error for a JetStream request that got no answer, naming a permission refusal if any."""
    last = str(getattr(nc, "last_error", None) or "")
    if "permissions violation" in last.lower():
        return NatsUnavailable(
            f"{_who()} may not {what} ({' '.join(last.split())}); explain needs read access to "
            f"{', '.join(_PUBLIC)} (an outside reader's user, docs/deploy.md)"
        )
    return NatsUnavailable(f"NATS did not answer in {_API_WAIT:g}s when asked to {what}")


async def account_streams(nc: Any) -> set[str]:
    """The names of the streams in this connection's NATS account."""
    names: set[str] = set()
    while True:
        request = json.dumps({"offset": len(names)}).encode()
        try:
            reply = await nc.request("$JS.API.STREAM.NAMES", request, timeout=_API_WAIT)
        except Exception as exc:  # a timeout, or no JetStream at all (no responders)
            raise _refused(nc, "list the streams of its account") from exc
        page = json.loads(reply.data)
        if "error" in page:
            raise NatsUnavailable(f"NATS refused to list the streams: {page['error'].get('description')}")
        found = page.get("streams") or []
        names.update(found)
        if not found or len(names) >= int(page.get("total") or 0):
            return names


async def _read(nc: Any, stream: str, subject: str, present: set[str]) -> list[StoredMessage]:
    if stream not in present:
        return []
    try:
        return await read_all(nc, stream, subject)
    except TimeoutError as exc:  # the ordered consumer's create request went unanswered
        raise _refused(nc, f"read {stream}") from exc


_WHAT: Final = {
    subjects.OBSERVATIONS_STREAM: "pod and component states",
    subjects.VERDICTS_STREAM: "verdicts",
    subjects.LIFECYCLE_STREAM: "lifecycle events",
}


def unreadable_note(streams: Sequence[str]) -> str:
    """What the timeline leaves out because these streams are not in the user's account."""
    if not streams:
        return ""
    return (
        f"{', '.join(streams)} not in the account of {_who()}: {', '.join(_WHAT[s] for s in streams)} "
        "left out of the timeline"
    )


async def gather(nc: Any, namespace: str, name: str) -> Records:
    present = await account_streams(nc)
    if not present.intersection(_PUBLIC):
        raise NatsUnavailable(
            f"this NATS account has none of Respawn's streams ({', '.join(_PUBLIC)}); an outside "
            "reader's account gets them once its mirrors exist: python -m respawn.natsauth mirrors "
            "(docs/deploy.md)"
        )
    verdicts_raw, events_raw, obs_raw = await asyncio.gather(
        _read(nc, subjects.VERDICTS_STREAM, subjects.verdict_filter(namespace, name), present),
        _read(nc, subjects.LIFECYCLE_STREAM, subjects.lifecycle_event(namespace, name), present),
        _read(nc, subjects.OBSERVATIONS_STREAM, subjects.appwrapper_obs_filter(namespace, name), present),
    )
    skipped = 0
    verdicts: list[tuple[Verdict, StoredMessage]] = []
    events: list[tuple[LifecycleEvent, StoredMessage]] = []
    observations: list[tuple[Message, StoredMessage]] = []
    for stored in verdicts_raw:
        try:
            verdicts.append((decode(Verdict, stored.data, stored.headers), stored))
        except InvalidMessage:
            skipped += 1
    for stored in events_raw:
        try:
            events.append((decode(LifecycleEvent, stored.data, stored.headers), stored))
        except InvalidMessage:
            skipped += 1
    for stored in obs_raw:
        try:
            observations.append((decode(AnyObservation, stored.data, stored.headers), stored))
        except InvalidMessage:
            skipped += 1
    unreadable = tuple(s for s in (*_PUBLIC, subjects.OBSERVATIONS_STREAM) if s not in present)
    return Records(tuple(verdicts), tuple(events), tuple(observations), skipped, unreadable)


async def _explain(url: str | None, namespace: str, name: str) -> Records:
    nc = await connect_nats(url)
    try:
        return await gather(nc, namespace, name)
    finally:
        with contextlib.suppress(Exception):
            await nc.close()


def resolve_target(target: str, namespace: str | None, default: str) -> tuple[str, str]:
    """``NS/NAME``, or ``NAME`` in ``-n``'s namespace (else ``default``, the context's), as kubectl
    names an object; :class:`UsageError` if neither, or if the two namespaces disagree."""
    if "/" not in target:
        if not target:
            raise UsageError("expected NAME or NS/NAME, got ''")
        return namespace or default, target
    try:
        ns, name = parse_target(target)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if namespace and namespace != ns:
        raise UsageError(f"{target} is in namespace {ns}, not {namespace} (-n)")
    return ns, name


def register(app: typer.Typer, *, output_version: str) -> None:
    namespace_option, _ = namespace_options()

    @app.command("explain")
    def explain(
        target: str = typer.Argument(
            ..., metavar="NAME|NS/NAME", help="The AppWrapper: NS/NAME, or NAME with -n (else the context's)."
        ),
        namespace: str | None = namespace_option,
        output: str | None = output_option(),
        as_json: bool = json_flag(),
        nats_url: str | None = typer.Option(None, "--nats-url", envvar="NATS_URL", show_envvar=True),
        kubeconfig: str | None = typer.Option(
            None,
            "--kubeconfig",
            envvar="KUBECONFIG",
            show_envvar=True,
            help="Only for the default namespace of NAME: its current context's.",
        ),
    ) -> None:
        """The incident timeline of one AppWrapper: observations, verdicts, resets, durations, traces."""
        try:
            fmt = resolve_output(output, as_json)
            default = "" if "/" in target or namespace else default_namespace(kubeconfig)
            namespace, name = resolve_target(target, namespace, default)
        except CliError as exc:
            fail(exc)
        try:
            records = asyncio.run(_explain(nats_url, namespace, name))
        except NatsUnavailable as exc:
            fail(str(exc), EXIT_UNAVAILABLE)
        left_out = unreadable_note(records.unreadable)
        if records.empty:
            fail(
                f"unknown AppWrapper {namespace}/{name}: Respawn has no observations, verdicts "
                "or lifecycle events for it" + (f" ({left_out})" if left_out else ""),
                EXIT_NOT_FOUND,
            )
        if left_out:
            # Not an error: an outside reader sees verdicts and lifecycle events, not the internal
            # observations, and the incidents are read off what it does see.
            typer.echo(f"respawn: {left_out}", err=True)
        if records.skipped:
            typer.echo(f"respawn: skipped {records.skipped} message(s) this version cannot decode", err=True)
        timeline = records.timeline()
        incidents = find_incidents(timeline)
        current = current_state(o for o, _ in records.observations)
        if fmt.document:
            emit(explain_json(namespace, name, timeline, incidents, current, output_version), fmt)
        else:
            typer.echo(render_explain(namespace, name, timeline, incidents, current))
