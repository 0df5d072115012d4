"""`respawn status`: the AppWrappers of a cluster at a glance, and the nodes in quarantine.

Rendering is pure (rows from AppWrapper objects and from the quarantine node verdict, table and
JSON from rows and a clock); the Kubernetes I/O is kept to :func:`fetch_appwrappers`, the NATS
I/O to :func:`fetch_quarantine`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from respawn.cli.clusterconfig import DEFAULT_RESPAWN_NAMESPACE
from respawn.cli.output import (
    CliError,
    Format,
    NotFound,
    Unavailable,
    context_namespace,
    emit,
    fail,
    namespace_options,
    output_option,
    resolve_namespace,
    resolve_output,
)
from shared.appwrapper.constants import GROUP, KIND, PLURAL, VERSION, ConditionType
from shared.appwrapper.model import read_appwrapper, str_at
from shared.appwrapper.params import RETRY_LIMIT_ANNOTATION, effective_fault_tolerance
from shared.faulttolerance import FaultTolerance
from shared.kubetime import as_utc, parse_kube_time
from shared.messages import QuarantinedNode

if TYPE_CHECKING:  # kubernetes_asyncio is slow to import; only `status` itself needs it
    from respawn.cli.clusterconfig import ConfigSource
    from shared.kube.client import Kube, KubeApiError

__all__ = [
    "CliError",
    "StatusRow",
    "context_namespace",
    "fetch_appwrappers",
    "fetch_quarantine",
    "format_age",
    "quarantine_json",
    "quarantine_rows",
    "quarantine_table",
    "register",
    "status_json",
    "status_row",
    "status_rows",
    "status_table",
]

# Short, so that an unreachable API server is reported promptly instead of after a long hang.
REQUEST_TIMEOUT = 10.0


# ------------------------------------------------------------------------------ pure rendering


@dataclass(frozen=True, slots=True)
class StatusRow:
    namespace: str
    name: str
    phase: str
    resetting_count: int
    retry_limit: int
    # The reason of the Unhealthy condition while it is True, else "".
    unhealthy_reason: str
    # The newest lastTransitionTime among the conditions (None: no conditions yet).
    last_transition: datetime | None
    # Where the retry limit comes from: "annotation", else where the operator default was read
    # ("cluster", "file", "builtin"; clusterconfig.ConfigSource.kind).
    retry_limit_source: str = "builtin"


def status_row(
    appwrapper: Mapping[str, Any], defaults: FaultTolerance, default_source: str = "builtin"
) -> StatusRow:
    """One AppWrapper's row; ``defaults`` are the operator's (read from ``default_source``),
    overridden by its annotations."""
    fields = read_appwrapper(appwrapper)
    unhealthy = fields.condition(ConditionType.UNHEALTHY)
    times = [t for t in (parse_kube_time(c.get("lastTransitionTime")) for c in fields.conditions) if t]
    effective = effective_fault_tolerance(fields.annotations, defaults)
    # The limit is the annotation's (as given, or clamped) unless it follows the default: a
    # malformed annotation is ignored. Asked with another default, the answer tells which.
    other = dataclasses.replace(defaults, retry_limit=defaults.retry_limit + 1)
    annotated = RETRY_LIMIT_ANNOTATION in fields.annotations and (
        effective_fault_tolerance(fields.annotations, other).ft.retry_limit == effective.ft.retry_limit
    )
    return StatusRow(
        namespace=fields.namespace,
        name=fields.name,
        phase=fields.phase,
        resetting_count=fields.resetting_count,
        retry_limit=effective.ft.retry_limit,
        retry_limit_source="annotation" if annotated else default_source,
        unhealthy_reason=str_at(unhealthy, "reason") if fields.is_true(ConditionType.UNHEALTHY) else "",
        last_transition=max(times) if times else None,
    )


def status_rows(
    appwrappers: Iterable[Mapping[str, Any]], defaults: FaultTolerance, default_source: str = "builtin"
) -> list[StatusRow]:
    """Rows ordered by namespace, then name."""
    return sorted(
        (status_row(aw, defaults, default_source) for aw in appwrappers), key=lambda r: (r.namespace, r.name)
    )


def format_age(delta: timedelta) -> str:
    """A compact age in the style of kubectl: 45s, 3m12s, 2h5m, 3d4h (negative clamps to 0s)."""
    total = max(0, int(delta.total_seconds()))
    days, rest = divmod(total, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h" if hours else f"{days}d"
    if hours:
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    if minutes:
        return f"{minutes}m{seconds}s" if seconds else f"{minutes}m"
    return f"{seconds}s"


STATUS_COLUMNS = ("NAMESPACE", "NAME", "PHASE", "ATTEMPTS", "UNHEALTHY", "LAST TRANSITION")
# -o wide: where each retry limit comes from, and the transition's time as well as its age.
WIDE_COLUMNS = ("LIMIT FROM", "TRANSITION TIME")


def status_table(rows: Sequence[StatusRow], now: datetime, *, wide: bool = False) -> Table:
    table = Table(*STATUS_COLUMNS, *(WIDE_COLUMNS if wide else ()), box=None, pad_edge=False)
    for row in rows:
        cells = [
            row.namespace,
            row.name,
            row.phase or "-",
            f"{row.resetting_count}/{row.retry_limit}",
            row.unhealthy_reason or "-",
            format_age(now - row.last_transition) if row.last_transition else "-",
        ]
        if wide:
            cells += [row.retry_limit_source, _rfc3339(row.last_transition) if row.last_transition else "-"]
        table.add_row(*cells)
    return table


def _rfc3339(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# Entries whose quarantine ended are kept in the verdict for the counting only; not shown.
SHOWN_STATES = ("Quarantined", "DryRun", "Held")


def quarantine_rows(entries: Iterable[QuarantinedNode]) -> list[QuarantinedNode]:
    """The nodes to show: quarantined, would be (dry run), or held by the cap; by node name."""
    return sorted((e for e in entries if e.state in SHOWN_STATES), key=lambda e: e.node)


def quarantine_table(entries: Sequence[QuarantinedNode], now: datetime) -> Table:
    table = Table("NODE", "STATE", "FAILURES", "WORKLOADS", "SINCE", "UNTIL", box=None, pad_edge=False)
    for entry in entries:
        table.add_row(
            entry.node,
            entry.state,
            str(entry.failures),
            ", ".join(entry.workloads) or "-",
            f"{format_age(now - as_utc(entry.since))} ago",
            f"in {format_age(as_utc(entry.until) - now)}" if entry.until is not None else "-",
        )
    return table


def quarantine_json(entries: Sequence[QuarantinedNode]) -> list[dict[str, Any]]:
    return [
        {
            "node": e.node,
            "state": e.state,
            "failures": e.failures,
            "workloads": list(e.workloads),
            "since": _rfc3339(as_utc(e.since)),
            "until": _rfc3339(as_utc(e.until)) if e.until is not None else None,
        }
        for e in entries
    ]


def status_json(
    rows: Sequence[StatusRow],
    now: datetime,
    version: str,
    quarantine: Sequence[QuarantinedNode] | None = None,
    limit_default: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``-o json`` document (docs/cli.md); ``quarantine`` None: not read (no NATS_URL);
    ``limit_default``: :func:`retry_limit_default_json`."""
    return {
        "version": version,
        "nodeQuarantine": quarantine_json(quarantine) if quarantine is not None else None,
        "retryLimitDefault": dict(limit_default) if limit_default is not None else None,
        "appwrappers": [
            {
                "namespace": row.namespace,
                "name": row.name,
                "phase": row.phase,
                "resettingCount": row.resetting_count,
                "retryLimit": row.retry_limit,
                "retryLimitSource": row.retry_limit_source,
                "unhealthyReason": row.unhealthy_reason,
                "lastTransitionTime": _rfc3339(row.last_transition) if row.last_transition else None,
                "lastTransitionAgeSeconds": (
                    max(0, int((now - row.last_transition).total_seconds())) if row.last_transition else None
                ),
            }
            for row in rows
        ],
    }


# ------------------------------------------------------------------------------ Kubernetes I/O


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def kubeconfig_path(explicit: str | None) -> str | None:
    """The kubeconfig to use: the option/KUBECONFIG (first entry of a path list), else
    ~/.kube/config as kubectl would; None inside a pod (service account)."""
    if explicit:
        entries = [p for p in explicit.split(os.pathsep) if p]
        existing = [p for p in entries if Path(p).expanduser().is_file()]
        if not existing:
            raise Unavailable(f"kubeconfig {explicit} does not exist; check --kubeconfig or KUBECONFIG")
        return str(Path(existing[0]).expanduser())
    home = Path("~/.kube/config").expanduser()
    if home.is_file():
        return str(home)
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return None
    raise Unavailable("no cluster configured: set KUBECONFIG or pass --kubeconfig")


async def connect_kube(kubeconfig: str | None) -> Kube:
    from shared.kube.client import Kube

    try:
        return await Kube.connect(kubeconfig)
    except Exception as exc:  # kubernetes_asyncio raises ConfigException, OSError, YAML errors...
        where = kubeconfig or "the in-cluster service account"
        raise Unavailable(f"cannot use {where}: {_one_line(str(exc)) or type(exc).__name__}") from exc


def _api_error(kube: Kube, exc: KubeApiError) -> CliError:
    host = getattr(kube.api.configuration, "host", "") or "the API server"
    if exc.status == 0:
        return Unavailable(f"cannot reach the Kubernetes API server at {host}: {_one_line(exc.message)}")
    if exc.status in (401, 403):
        return Unavailable(f"the Kubernetes API server at {host} refused access: {_one_line(exc.message)}")
    return CliError(f"Kubernetes API error from {host}: {_one_line(str(exc))}")


async def fetch_appwrappers(kube: Kube, namespace: str | None, name: str | None) -> list[dict[str, Any]]:
    """The AppWrappers in ``namespace`` (all namespaces when None), or just ``name`` in it."""
    from shared.kube.client import KubeApiError, ResourceRef

    # Known in advance: no discovery round trip before the one request.
    appwrappers = ResourceRef(GROUP, VERSION, PLURAL, KIND, namespaced=True)
    try:
        if name:
            ns = namespace or "default"
            try:
                return [
                    await kube.request("GET", appwrappers.path(ns, name), request_timeout=REQUEST_TIMEOUT)
                ]
            except KubeApiError as exc:
                if exc.not_found and exc.body.get("details", {}).get("kind") == PLURAL:
                    raise NotFound(f"AppWrapper {ns}/{name} not found") from exc
                raise
        listing = await kube.request("GET", appwrappers.path(namespace), request_timeout=REQUEST_TIMEOUT)
    except KubeApiError as exc:
        if exc.not_found:
            raise NotFound(
                f"the cluster does not serve AppWrappers ({GROUP}/{VERSION}); is the CRD installed?"
            ) from exc
        raise _api_error(kube, exc) from exc
    return [item for item in listing.get("items") or [] if isinstance(item, dict)]


@dataclass(frozen=True, slots=True)
class Loaded:
    appwrappers: list[dict[str, Any]]
    config: ConfigSource


async def _load(
    path: str | None, namespace: str | None, name: str | None, config: Path | None, respawn_namespace: str
) -> Loaded:
    """The AppWrappers, and the operator configuration their retry limits default to: ``--config``
    if given, else the cluster's, else (with the reason) this machine's."""
    from respawn.cli.clusterconfig import fetch_deployed_config, local_config
    from shared.config import ConfigError

    kube = await connect_kube(path)
    try:
        appwrappers = await fetch_appwrappers(kube, namespace, name)
        if config is not None:
            return Loaded(appwrappers, local_config(config))
        try:
            deployed = await fetch_deployed_config(kube, respawn_namespace)
        except ConfigError as exc:
            fallback = local_config(None)
            return Loaded(appwrappers, dataclasses.replace(fallback, problem=str(exc)))
        return Loaded(appwrappers, deployed)
    finally:
        await kube.close()


def retry_limit_default_json(source: ConfigSource) -> dict[str, Any]:
    """``retryLimitDefault`` of ``status -o json``: the operator default and where it was read."""
    return {
        "retryLimit": source.config.fault_tolerance.retry_limit,
        "source": source.kind,
        "from": source.origin,
        "clusterError": source.problem or None,
    }


def fallback_note(source: ConfigSource, respawn_namespace: str) -> str:
    """The stderr line saying the default retry limit is not the cluster's, and why."""
    where = f"file {source.origin}" if source.kind == "file" else "the built-in default"
    return (
        f"respawn: the default retry limit ({source.config.fault_tolerance.retry_limit}, from {where}) "
        f"is not the cluster's: cannot read Respawn's configuration in namespace {respawn_namespace}: "
        f"{_one_line(source.problem)}"
    )


async def fetch_quarantine(nats_url: str) -> list[QuarantinedNode]:
    """The entries of the last stored quarantine node verdict (none stored: no entry).

    Raises :class:`Unavailable` when NATS cannot be reached."""
    from respawn.cli.tail import NatsUnavailable, StoredMessage, StreamMissing, connect_nats, stored_messages
    from shared import subjects
    from shared.messages import QUARANTINE_RESOURCE, InvalidMessage, NodeVerdict, decode

    try:
        nc = await connect_nats(nats_url)
    except NatsUnavailable as exc:
        raise Unavailable(str(exc)) from None
    last: StoredMessage | None = None
    try:
        async for message in stored_messages(
            nc, subjects.NODE_VERDICTS_STREAM, subjects.node_verdict(QUARANTINE_RESOURCE)
        ):
            last = message
    except StreamMissing:
        return []
    finally:
        await nc.close()
    if last is None:
        return []
    try:
        return list(decode(NodeVerdict, last.data, last.headers).quarantine)
    except InvalidMessage as exc:
        raise CliError(f"the stored quarantine verdict cannot be read: {exc}") from None


# ------------------------------------------------------------------------------ command


def register(app: typer.Typer, *, output_version: str) -> None:
    namespace_option, all_namespaces_option = namespace_options()

    @app.command("status")
    def status(
        name: str | None = typer.Argument(None, help="One AppWrapper (else all of them)."),
        namespace: str | None = namespace_option,
        all_namespaces: bool = all_namespaces_option,
        output: str | None = output_option(),
        kubeconfig: str | None = typer.Option(None, "--kubeconfig", envvar="KUBECONFIG", show_envvar=True),
        nats_url: str | None = typer.Option(
            None,
            "--nats-url",
            envvar="NATS_URL",
            show_envvar=True,
            help="Where to read the node quarantine from (else it is not shown).",
        ),
        config: Path | None = typer.Option(
            None,
            "--config",
            help=(
                "Operator configuration YAML for the retry-limit default, instead of the one "
                "deployed in the cluster."
            ),
        ),
        respawn_namespace: str = typer.Option(
            DEFAULT_RESPAWN_NAMESPACE,
            "--respawn-namespace",
            help="Where Respawn is installed: its configuration gives the default retry limit.",
        ),
    ) -> None:
        """AppWrappers: phase, attempts/retry limit, unhealthy reason, age of the last transition;
        and the nodes in quarantine, with why (when NATS is configured)."""
        from shared.config import ConfigError

        try:
            fmt = resolve_output(output)
            # Usage errors before anything is read.
            resolve_namespace(namespace, all_namespaces, "default", name=name)
            path = kubeconfig_path(kubeconfig)
            choice = resolve_namespace(namespace, all_namespaces, context_namespace(path), name=name)
            loaded = asyncio.run(_load(path, choice.namespace, name, config, respawn_namespace))
            quarantine = quarantine_rows(asyncio.run(fetch_quarantine(nats_url))) if nats_url else None
        except CliError as exc:
            fail(exc)
        except ConfigError as exc:
            fail(CliError(str(exc)))
        source = loaded.config
        if source.problem:
            typer.echo(fallback_note(source, respawn_namespace), err=True)
        now = datetime.now(UTC)
        rows = status_rows(loaded.appwrappers, source.config.to_fault_tolerance(), source.kind)
        if fmt.document:
            doc = status_json(rows, now, output_version, quarantine, retry_limit_default_json(source))
            emit(doc, fmt)
            return
        if rows:
            wide = fmt is Format.WIDE
            # Wide rows are never folded to the terminal's width: they are for reading whole.
            console = Console(soft_wrap=True, width=10_000 if wide else None)
            console.print(status_table(rows, now, wide=wide))
        else:
            typer.echo(f"No AppWrappers in {choice.describe()}.", err=True)
        if quarantine:
            typer.echo("")
            typer.echo("Node quarantine:")
            Console(soft_wrap=True).print(quarantine_table(quarantine, now))
