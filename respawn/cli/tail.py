"""`respawn tail`: follow the public verdict or lifecycle stream, decoded and readable.

Also home of what the CLI needs to read Respawn's streams as an outside subscriber would:
:func:`connect_nats` (short deadline, one clear error) and :func:`stored_messages` (an ordered
consumer, optionally stopping at the end of what is stored). Line and JSON rendering are pure.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal

import typer

from respawn.cli.output import (
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_UNAVAILABLE,
    CliError,
    Format,
    UsageError,
    default_namespace,
    emit,
    fail,
    json_flag,
    namespace_options,
    output_option,
    resolve_namespace,
    resolve_output,
)
from shared import subjects
from shared.durations import parse_go_duration
from shared.messages import InvalidMessage, LifecycleEvent, Message, Verdict, decode

__all__ = [
    "STREAMS",
    "NatsUnavailable",
    "StartAt",
    "StoredMessage",
    "StreamKind",
    "StreamMissing",
    "connect_nats",
    "event_line",
    "format_time",
    "json_record",
    "parse_since",
    "register",
    "stored_messages",
    "subject_filter",
    "trace_id",
    "verdict_line",
]

StreamKind = Literal["verdicts", "lifecycle"]
# The public streams `tail` follows: stream name, subject prefix, message schema.
STREAMS: Final[dict[str, tuple[str, str, type[Message]]]] = {
    "verdicts": (subjects.VERDICTS_STREAM, subjects.VERDICT_PREFIX, Verdict),
    "lifecycle": (subjects.LIFECYCLE_STREAM, subjects.LIFECYCLE_PREFIX, LifecycleEvent),
}
CONNECT_DEADLINE = 3.0
_PHASE_CHANGED: Final = "PhaseChanged"
# The last instant int64 Unix nanoseconds can express (NATS's clock).
_LATEST_START: Final = datetime(2262, 4, 11, tzinfo=UTC)
# With --no-follow, how long to wait for a message the server said is still pending.
_PENDING_WAIT = 10.0


class NatsUnavailable(Exception):
    """NATS is not configured or cannot be reached (one line, for ``error: ...``)."""


class StreamMissing(Exception):
    """The stream does not exist on this server (no Respawn service ever created it)."""


# ------------------------------------------------------------------------------ pure parts


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """One message as read from a stream."""

    stream: str
    seq: int
    subject: str
    headers: Mapping[str, str]
    data: bytes
    # How many matching messages the stream held after this one when it was delivered.
    pending: int = 0


@dataclass(frozen=True, slots=True)
class StartAt:
    """Where reading starts: a stream sequence, a time, or (neither) the first stored message."""

    seq: int | None = None
    time: datetime | None = None


def parse_since(text: str, now: datetime) -> datetime:
    """``--since``: a Go duration back from ``now`` ("10m", "1h30m") or an RFC 3339 time."""
    raw = text.strip()
    try:
        return now - parse_go_duration(raw)
    except ValueError:
        pass
    try:
        at = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"--since {text!r} is neither a duration (e.g. 10m, 1h30m) nor an RFC 3339 time "
            "(e.g. 2025-01-02T03:04:05Z)"
        ) from None
    at = at if at.tzinfo else at.replace(tzinfo=UTC)
    if at >= _LATEST_START:
        # NATS keeps times as int64 nanoseconds; a later time wraps around to "the beginning".
        raise ValueError(f"--since {text!r} is too far in the future")
    return at


def subject_filter(kind: str, namespace: str | None = None, name: str | None = None) -> str:
    """The subject filter of stream ``kind`` for everything, a namespace, or one AppWrapper."""
    if kind == "verdicts":
        # Verdict subjects end in the AppWrapper's partition.
        return subjects.verdict_filter(namespace, name)
    prefix = STREAMS[kind][1]
    if namespace is None:
        return f"{prefix}.>"
    ns = subjects.token(namespace)
    return f"{prefix}.{ns}.{subjects.token(name)}" if name is not None else f"{prefix}.{ns}.*"


def trace_id(headers: Mapping[str, str] | None) -> str:
    """The trace id of a message's W3C ``traceparent`` header, or "" when it carries none."""
    if not headers:
        return ""
    # Imported here: the tracing SDK is slow to import and the other commands do not need it.
    from opentelemetry import trace

    from shared.telemetry import extract_context

    ctx = trace.get_current_span(extract_context(headers)).get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else ""


def format_time(at: datetime) -> str:
    """UTC with milliseconds, e.g. 2025-01-02T03:04:05.123Z."""
    utc = at.astimezone(UTC) if at.tzinfo else at.replace(tzinfo=UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


def _fields(*parts: str) -> str:
    return "  ".join(p for p in parts if p)


def _quoted(message: str) -> str:
    # JSON quoting keeps a multi-line message on its one line.
    return json.dumps(message, ensure_ascii=False) if message else ""


def _nodes(nodes: tuple[str, ...]) -> str:
    return f"nodes={','.join(nodes)}" if nodes else ""


def _failure(failure_class: str, code: str, fault_kind: str = "") -> str:
    """The failure's class and code (docs/failures.md), '' for a message without one."""
    if not failure_class:
        return ""
    text = f"class={failure_class} code={code or '-'}"
    return f"{text} fault={fault_kind}" if fault_kind else text


def verdict_line(v: Verdict, seq: int = 0) -> str:
    """One readable line: time, ns/name, state, reason, message, nodes, attempt, stream sequence."""
    flags = [f for f, on in (("terminal", v.terminal), ("migration", not v.counts_toward_retry)) if on]
    state = v.state + (f"({','.join(flags)})" if flags else "")
    return _fields(
        format_time(v.decided_at),
        f"{v.ref.namespace}/{v.ref.name}",
        state,
        v.reason,
        _quoted(v.message),
        _nodes(v.nodes),
        _failure(v.failure_class, v.failure_code, v.fault_kind),
        f"attempt={v.resetting_count}",
        f"#{seq}" if seq else "",
    )


def event_line(e: LifecycleEvent, seq: int = 0) -> str:
    """One readable line: time, ns/name, event (with the phase change), reason, message, nodes."""
    what = e.event
    if e.event == _PHASE_CHANGED or (e.previous_phase and e.previous_phase != e.phase):
        what += f" {e.previous_phase or '(none)'}->{e.phase or '(none)'}"
    elif e.phase:
        what += f" ({e.phase})"  # the phase the AppWrapper is in when this happened
    return _fields(
        format_time(e.at),
        f"{e.ref.namespace}/{e.ref.name}",
        what,
        e.reason,
        _quoted(e.message),
        _nodes(e.nodes),
        _failure(e.failure_class, e.failure_code),
        f"attempt={e.resetting_count}",
        f"#{seq}" if seq else "",
    )


def message_line(message: Message, seq: int = 0) -> str:
    if isinstance(message, Verdict):
        return verdict_line(message, seq)
    if isinstance(message, LifecycleEvent):
        return event_line(message, seq)
    raise TypeError(f"no line format for {type(message).__name__}")


def json_record(message: Message, stored: StoredMessage, version: str) -> dict[str, Any]:
    """``--json``: one object per message (docs/cli.md)."""
    return {
        "version": version,
        "stream": stored.stream,
        "seq": stored.seq,
        "subject": stored.subject,
        "traceId": trace_id(stored.headers),
        "kind": message.schema_kind,
        "payload": message.model_dump(mode="json"),
    }


# ------------------------------------------------------------------------------ NATS I/O


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def nats_tls_options(env: Mapping[str, str]) -> dict[str, Any]:
    """nats-py's TLS options from the ``RESPAWN_NATS_TLS_*`` variables of ``env`` (the services'
    ``nats.tls`` keys, docs/configuration.md); none while no such variable is set."""
    from shared.bus import BusError
    from shared.bus.connection import tls_context
    from shared.config import ConfigError, load_config

    variables = {k: v for k, v in env.items() if k.startswith("RESPAWN_NATS_TLS_")}
    if not variables:
        return {}
    try:
        tls = load_config(env=variables).nats.tls.to_files()
        if tls is None:
            return {}
        options: dict[str, Any] = {"tls": tls_context(tls)}
    except (ConfigError, BusError) as exc:
        raise NatsUnavailable(_one_line(str(exc))) from None
    if tls.server_name:
        options["tls_hostname"] = tls.server_name
    if tls.handshake_first:
        options["tls_handshake_first"] = True
    return options


async def connect_nats(url: str | None, *, deadline: float = CONNECT_DEADLINE) -> Any:
    """A plain NATS connection that fails within ``deadline`` seconds with :class:`NatsUnavailable`.

    Credentials come from NATS_USER/NATS_PASSWORD or NATS_CREDS, and TLS from the
    ``RESPAWN_NATS_TLS_*`` variables, as for the services. No error shows a URL's credentials.
    """
    import nats  # imported here: slow to import, and only the stream commands need it

    from shared.bus.connection import servers_text

    if not url:
        raise NatsUnavailable("NATS_URL is not set; pass --nats-url or set NATS_URL")
    servers = [u.strip() for u in url.split(",") if u.strip()]
    where = servers_text(servers)
    last_error = ""

    async def on_error(exc: Exception) -> None:
        # Collected for the one error line instead of being logged by nats-py.
        nonlocal last_error
        last_error = _one_line(f"{exc}") or type(exc).__name__

    options: dict[str, Any] = {
        "servers": servers,
        "connect_timeout": max(0.5, deadline - 0.5),
        "allow_reconnect": False,
        "max_reconnect_attempts": 0,
        "error_cb": on_error,
        "name": "respawn-cli",
    }
    if os.environ.get("NATS_USER"):
        options["user"] = os.environ["NATS_USER"]
        options["password"] = os.environ.get("NATS_PASSWORD", "")
    if os.environ.get("NATS_CREDS"):
        options["user_credentials"] = os.environ["NATS_CREDS"]
    if os.environ.get("NATS_INBOX_PREFIX"):
        # A read-only subscriber user may only receive on its own inbox prefix (docs/deploy.md).
        options["inbox_prefix"] = os.environ["NATS_INBOX_PREFIX"]
    options |= nats_tls_options(os.environ)
    try:
        async with asyncio.timeout(deadline):
            return await nats.connect(**options)
    except TimeoutError:
        raise NatsUnavailable(
            f"cannot reach NATS at {where} within {deadline:g}s ({last_error or 'no answer'}); "
            "check NATS_URL and that the server is up"
        ) from None
    except Exception as exc:  # nats-py raises OSError, NoServersError, auth errors...
        detail = last_error or _one_line(str(exc)) or type(exc).__name__
        if "certificate verify failed" in detail.lower():
            detail += "; check RESPAWN_NATS_TLS_CA_FILE"
        raise NatsUnavailable(f"cannot connect to NATS at {where}: {detail}") from None


async def stored_messages(
    nc: Any,
    stream: str,
    subject: str,
    *,
    start: StartAt = StartAt(),
    follow: bool = False,
    poll: float = 5.0,
) -> AsyncIterator[StoredMessage]:
    """The messages of ``stream`` matching ``subject``, oldest first, through an ordered consumer.

    Without ``follow`` it stops after the last message stored when it got there; with it, it
    waits for new ones forever. Raises :class:`StreamMissing` if there is no such stream.
    """
    import nats.js.errors
    from nats.js import api

    if start.seq is not None:
        config = api.ConsumerConfig(
            deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start.seq
        )
    elif start.time is not None:
        config = api.ConsumerConfig(deliver_policy=api.DeliverPolicy.BY_START_TIME, opt_start_time=start.time)
    else:
        config = api.ConsumerConfig(deliver_policy=api.DeliverPolicy.ALL)
    js = nc.jetstream()
    try:
        sub = await js.subscribe(subject, stream=stream, ordered_consumer=True, config=config)
    except nats.js.errors.NotFoundError as exc:
        raise StreamMissing(
            f"stream {stream} does not exist on this NATS server (Respawn's services create it at start)"
        ) from exc
    try:
        if not follow:
            info = await sub.consumer_info()
            delivered = info.delivered.consumer_seq if info.delivered else 0
            if not info.num_pending and not delivered:
                return  # nothing stored that matches
        while True:
            try:
                msg = await sub.next_msg(timeout=poll if follow else _PENDING_WAIT)
            except TimeoutError:
                if follow:
                    continue
                raise NatsUnavailable(
                    f"stream {stream} stopped delivering stored messages for {subject}"
                ) from None
            md = msg.metadata
            pending = int(md.num_pending or 0)
            yield StoredMessage(
                stream=md.stream,
                seq=int(md.sequence.stream),
                subject=msg.subject,
                headers=dict(msg.headers or {}),
                data=bytes(msg.data),
                pending=pending,
            )
            if not follow and pending == 0:
                return
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


async def read_all(nc: Any, stream: str, subject: str) -> list[StoredMessage]:
    """Everything stored for ``subject``; an absent stream counts as empty."""
    try:
        return [m async for m in stored_messages(nc, stream, subject)]
    except StreamMissing:
        return []


# ------------------------------------------------------------------------------ command


async def _tail(
    kind: str,
    url: str | None,
    namespace: str | None,
    start: StartAt,
    follow: bool,
    fmt: Format,
    version: str,
) -> None:
    stream, _, cls = STREAMS[kind]
    nc = await connect_nats(url)
    try:
        async for stored in stored_messages(
            nc, stream, subject_filter(kind, namespace), start=start, follow=follow
        ):
            try:
                message = decode(cls, stored.data, stored.headers)
            except InvalidMessage as exc:
                typer.echo(
                    f"respawn: skipping #{stored.seq} on {stored.subject}: {_one_line(str(exc))}", err=True
                )
                continue
            if fmt.document:
                emit(json_record(message, stored, version), fmt, stream=True)
            else:
                typer.echo(message_line(message, stored.seq))
    finally:
        with contextlib.suppress(Exception):
            await nc.close()


def register(app: typer.Typer, *, output_version: str) -> None:
    namespace_option, all_namespaces_option = namespace_options()

    @app.command("tail")
    def tail(
        stream: str = typer.Argument(..., help="verdicts | lifecycle"),
        namespace: str | None = namespace_option,
        all_namespaces: bool = all_namespaces_option,
        output: str | None = output_option(),
        as_json: bool = json_flag(),
        since: str | None = typer.Option(
            None, "--since", help="Start at a time: a duration back from now (10m) or RFC 3339."
        ),
        seq: int | None = typer.Option(None, "--seq", min=1, help="Start at this stream sequence."),
        no_follow: bool = typer.Option(False, "--no-follow", help="Print what is stored, then exit."),
        nats_url: str | None = typer.Option(None, "--nats-url", envvar="NATS_URL", show_envvar=True),
        kubeconfig: str | None = typer.Option(
            None,
            "--kubeconfig",
            envvar="KUBECONFIG",
            show_envvar=True,
            help="Only for the default namespace: its current context's.",
        ),
    ) -> None:
        """Follow the public verdict or lifecycle stream (from the start, a time or a sequence)."""
        try:
            fmt = resolve_output(output, as_json)
            if stream not in STREAMS:
                raise UsageError(f"unknown stream {stream!r}; choose verdicts or lifecycle")
            if since is not None and seq is not None:
                raise UsageError("--since and --seq cannot be combined")
            try:
                start = StartAt(seq=seq, time=parse_since(since, datetime.now(UTC)) if since else None)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
            resolve_namespace(namespace, all_namespaces, "default")
            choice = resolve_namespace(
                namespace,
                all_namespaces,
                "" if namespace or all_namespaces else default_namespace(kubeconfig),
            )
        except CliError as exc:
            fail(exc)
        try:
            asyncio.run(_tail(stream, nats_url, choice.namespace, start, not no_follow, fmt, output_version))
        except NatsUnavailable as exc:
            fail(str(exc), EXIT_UNAVAILABLE)
        except StreamMissing as exc:
            fail(str(exc), EXIT_NOT_FOUND)
        except KeyboardInterrupt:
            raise typer.Exit(EXIT_INTERRUPTED) from None
