"""What every `respawn` command shares: the output flag, the namespace flags and the exit codes.

Pure apart from :func:`fail` and :func:`emit`, which write to the terminal (docs/cli.md).
"""

from __future__ import annotations

import enum
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import typer
import yaml

__all__ = [
    "CLI_OUTPUT_VERSION",
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "CliError",
    "Format",
    "NamespaceChoice",
    "NotFound",
    "Unavailable",
    "UsageError",
    "context_namespace",
    "default_namespace",
    "document",
    "emit",
    "fail",
    "json_flag",
    "namespace_options",
    "output_option",
    "resolve_namespace",
    "resolve_output",
]

# The version of every machine-readable document the CLI prints (docs/cli.md, "JSON and YAML
# output"): fields are only added within it; a removal or change of meaning bumps it.
CLI_OUTPUT_VERSION = "respawn.cli/v1"

# docs/cli.md, "Exit codes". Scripts branch on these, so each has one meaning for every command.
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_UNAVAILABLE = 4
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """A failure to report as one ``error: ...`` line; exits with :attr:`exit_code`."""

    exit_code = EXIT_FAILURE


class UsageError(CliError):
    """The command line itself is wrong: a bad value or flags that do not go together."""

    exit_code = EXIT_USAGE


class NotFound(CliError):
    """What was asked for does not exist: an AppWrapper, a testbed, a stream, the AppWrapper API."""

    exit_code = EXIT_NOT_FOUND


class Unavailable(CliError):
    """The cluster or NATS cannot be used: not configured, unreachable, untrusted, or refused."""

    exit_code = EXIT_UNAVAILABLE


def fail(exc: CliError | str, code: int | None = None) -> NoReturn:
    """One ``error: ...`` line on stderr, then exit with the error's code (or ``code``)."""
    typer.echo(f"error: {exc}", err=True)
    exit_code = code if code is not None else exc.exit_code if isinstance(exc, CliError) else EXIT_FAILURE
    raise typer.Exit(exit_code)


# ------------------------------------------------------------------------------ output format


class Format(enum.Enum):
    """``-o``: the human view (``table``, the default), a wider one, or a versioned document."""

    TABLE = "table"
    WIDE = "wide"
    JSON = "json"
    YAML = "yaml"

    @property
    def document(self) -> bool:
        return self in (Format.JSON, Format.YAML)


FORMAT_NAMES = tuple(f.value for f in Format)


def output_option() -> Any:
    return typer.Option(
        None,
        "--output",
        "-o",
        metavar="FORMAT",
        help="table (the default) | wide | json | yaml; json and yaml are versioned (docs/cli.md).",
    )


def json_flag() -> Any:
    # Kept so that scripts written for earlier releases keep working; no note is printed, so
    # their stderr stays as it was.
    return typer.Option(False, "--json", help="Deprecated: the same as -o json.")


def resolve_output(output: str | None, as_json: bool = False) -> Format:
    """The format asked for by ``-o`` and the deprecated ``--json``; :class:`UsageError` if
    unknown or contradictory."""
    if output is None:
        return Format.JSON if as_json else Format.TABLE
    try:
        chosen = Format(output.strip().lower())
    except ValueError:
        raise UsageError(f"unknown output format {output!r}; use one of {', '.join(FORMAT_NAMES)}") from None
    if as_json and chosen is not Format.JSON:
        raise UsageError(f"--json (the same as -o json) cannot go with -o {chosen.value}")
    return chosen


def document(doc: Mapping[str, Any], fmt: Format) -> str:
    """A versioned document as JSON (one line) or YAML (keys in the JSON's order)."""
    if fmt is Format.YAML:
        return yaml.safe_dump(dict(doc), sort_keys=False, allow_unicode=True, default_flow_style=False)
    return json.dumps(doc, ensure_ascii=False)


def emit(doc: Mapping[str, Any], fmt: Format, *, stream: bool = False) -> None:
    """Print a document; a stream of them (``tail``) is one JSON per line, or YAML documents
    each opened by ``---``."""
    text = document(doc, fmt)
    if fmt is Format.YAML:
        typer.echo(("---\n" if stream else "") + text, nl=False)
    else:
        typer.echo(text)


# ------------------------------------------------------------------------------ namespaces


@dataclass(frozen=True, slots=True)
class NamespaceChoice:
    """Which namespace a command reads: one (``namespace``), or all of them (``None``)."""

    namespace: str | None

    @property
    def all(self) -> bool:
        return self.namespace is None

    def describe(self) -> str:
        return "any namespace" if self.namespace is None else f"namespace {self.namespace}"


def namespace_options() -> tuple[Any, Any]:
    return (
        typer.Option(
            None,
            "--namespace",
            "-n",
            help="The namespace (default: the kubeconfig context's, else 'default').",
        ),
        typer.Option(False, "--all-namespaces", "-A", help="Every namespace."),
    )


def resolve_namespace(
    namespace: str | None, all_namespaces: bool, default: str, *, name: str | None = None
) -> NamespaceChoice:
    """kubectl's rule: ``-n`` wins, ``-A`` means every namespace, else the context's namespace.

    ``-n`` with ``-A`` and ``-A`` with one object's name are usage errors."""
    if all_namespaces and namespace:
        raise UsageError("--namespace and --all-namespaces cannot be combined")
    if all_namespaces and name:
        raise UsageError(f"{name}: one AppWrapper is in one namespace; use -n, not --all-namespaces")
    if all_namespaces:
        return NamespaceChoice(None)
    return NamespaceChoice(namespace or default)


def context_namespace(kubeconfig: str | None) -> str:
    """The current context's namespace in ``kubeconfig`` (as kubectl uses it), else "default";
    ``None``: in a pod, its service account's namespace."""
    if kubeconfig is None:
        sa = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        return sa.read_text().strip() if sa.is_file() else "default"
    try:
        config = yaml.safe_load(Path(kubeconfig).read_text())
    except (OSError, yaml.YAMLError):
        return "default"
    if not isinstance(config, Mapping):
        return "default"
    current = config.get("current-context")
    for ctx in config.get("contexts") or []:
        if isinstance(ctx, Mapping) and ctx.get("name") == current:
            inner = ctx.get("context")
            found = inner.get("namespace") if isinstance(inner, Mapping) else None
            return str(found) if found else "default"
    return "default"


def default_namespace(kubeconfig: str | None) -> str:
    """The namespace a command without ``-n`` reads, for a command that may run without a
    cluster (``tail``): the context's of the first kubeconfig that exists, else "default"."""
    entries = [p for p in (kubeconfig or "").split(os.pathsep) if p]
    entries.append(str(Path("~/.kube/config").expanduser()))
    for entry in entries:
        if Path(entry).expanduser().is_file():
            return context_namespace(str(Path(entry).expanduser()))
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return context_namespace(None)
    return "default"
