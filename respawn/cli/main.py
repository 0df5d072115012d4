"""The `respawn` command line (typer): local testbed, services, demo.

Output meant for other programs (``-o json|yaml``) is versioned, and the exit codes have one
meaning across commands: see docs/cli.md.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

# typer keeps the script templates here; its own --show-completion uses the same function.
from typer._completion_shared import Shells, get_completion_script

from respawn.cli import explain, status, tail
from respawn.cli.output import (
    CLI_OUTPUT_VERSION,
    EXIT_FAILURE,
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    Format,
    UsageError,
    emit,
    fail,
    json_flag,
    output_option,
    resolve_output,
)
from respawn.testbed.errors import TestbedError
from respawn.testbed.services import MAX_REPLICAS, SERVICES, parse_replicas, replica_table, service_of

if TYPE_CHECKING:
    from respawn.testbed import cluster

# add_completion: --install-completion and --show-completion (bash, zsh, fish, PowerShell).
# The shells --show-completion takes by name (completion_script).
_SHELLS = frozenset(shell.value for shell in Shells)
app = typer.Typer(no_args_is_help=True, add_completion=True, help="Respawn: fault tolerance for AppWrappers.")
local_app = typer.Typer(
    no_args_is_help=True, help="The local testbed (Kubernetes control plane + NATS, no Docker)."
)
app.add_typer(local_app, name="local")

for _command in (status, tail, explain):
    _command.register(app, output_version=CLI_OUTPUT_VERSION)

# The line width -o wide tables are laid out for: wider than any row, so no cell is folded.
WIDE_WIDTH = 10_000

StateDir = typer.Option(
    Path(".respawn"), "--state-dir", help="Where the testbed keeps its state, logs and kubeconfig."
)


def version() -> str:
    """This installation's version (the package's metadata), else the source tree's."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("respawn")
    except PackageNotFoundError:
        import tomllib

        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
        return str(tomllib.loads(pyproject.read_text())["project"]["version"])


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"respawn {version()}")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: bool = typer.Option(
        False,
        "--version",
        is_eager=True,
        callback=_print_version,
        help="Print the version and exit.",
    ),
) -> None:
    """Respawn: fault tolerance for AppWrappers."""


def _format(output: str | None, as_json: bool) -> Format:
    """``-o`` and the deprecated ``--json``; a usage error exits 2."""
    try:
        return resolve_output(output, as_json)
    except UsageError as exc:
        fail(exc)


def _say(msg: str) -> None:
    typer.echo(f"respawn: {msg}", err=True)


def _replicas(value: str | None, *, no_services: bool) -> dict[str, int] | None:
    """``--replicas``, parsed; else a usage error: one line naming what is wrong, exit 2."""
    if value is None:
        return None
    try:
        if no_services:
            raise ValueError("cannot go with --no-services (it starts services)")
        return parse_replicas(value)
    except ValueError as exc:
        typer.echo(f"error: --replicas: {exc}", err=True)
        raise typer.Exit(EXIT_USAGE) from None


def _fail(exc: Exception, code: int = EXIT_FAILURE) -> None:
    fail(str(exc), code)


@local_app.command("up")
def local_up(
    state_dir: Path = StateDir,
    nodes: int = typer.Option(4, "--nodes", min=1, max=500, help="Number of kwok fake nodes (8 GPUs each)."),
    no_services: bool = typer.Option(
        False, "--no-services", help="Start the bare testbed without Respawn's services."
    ),
    output: str | None = output_option(),
    as_json: bool = json_flag(),
    api_port: int | None = typer.Option(
        None, "--api-port", help="Fixed kube-apiserver port (default: a free one)."
    ),
    nats_port: int | None = typer.Option(
        None, "--nats-port", help="Fixed NATS client port (default: a free one)."
    ),
    nats_tls: bool = typer.Option(
        False,
        "--nats-tls",
        help="NATS requires TLS, with a certificate of the testbed's CA (its path: natsCaFile).",
    ),
    real_node: bool = typer.Option(
        False,
        "--real-node",
        help=(
            "Also run a real node (containerd + kubelet, as root) that runs pods for real, beside "
            "kwok's; tainted respawn.dev/real-node=true:NoSchedule."
        ),
    ),
    kueue: bool = typer.Option(
        False,
        "--kueue",
        help=(
            "Also run Kueue as MLBatch configures it, admitting the AppWrappers of namespaces "
            "labelled respawn.dev/kueue=true (docs/kueue.md); on a running testbed, adds it."
        ),
    ),
    replicas: str | None = typer.Option(
        None,
        "--replicas",
        metavar="SERVICE=N,...",
        help=(
            f"How many processes of a service to run (1 to {MAX_REPLICAS}), e.g. health=2,lifecycle=2; "
            "a service not named runs what runs already, else one."
        ),
    ),
) -> None:
    """Start the testbed on 127.0.0.1 and return once everything is ready."""
    from respawn.testbed import cluster, services

    fmt = _format(output, as_json)
    counts = _replicas(replicas, no_services=no_services)
    fixed = {k: v for k, v in {"apiserver": api_port, "nats": nats_port}.items() if v}
    try:
        state = cluster.up(
            state_dir, nodes=nodes, log=_say, fixed_ports=fixed, nats_tls=nats_tls, real_node=real_node
        )
        if kueue:
            from respawn.testbed import kueue as kueue_testbed

            kueue_testbed.up(state, log=_say)
        started: list[str] = []
        if not no_services:
            started = services.start_all(state, replicas=counts, log=_say)
    except (TestbedError, TimeoutError) as exc:
        _fail(exc)
        return
    info = {
        "version": CLI_OUTPUT_VERSION,
        "kubeconfig": str(state.kubeconfig),
        "natsUrl": state.nats_url,
        "apiServer": state.api_url,
        "stateDir": str(state.state_dir),
        # The services this `up` started processes of, by service name whatever their replicas'.
        "services": [s for s in SERVICES if any(service_of(name) == s for name in started)],
        "natsCaFile": str(state.nats_ca_file) if state.nats_ca_file else None,
        "replicas": replica_table(state),
        "realNode": _real_node(state),
        "kueue": "kueue" in state.pids,
    }
    if fmt.document:
        emit(info, fmt)
    else:
        typer.echo(f"export KUBECONFIG={state.kubeconfig}")
        typer.echo(f"export NATS_URL={state.nats_url}")
        # What the services and `respawn tail`/`explain` read to trust the testbed's NATS.
        for name, value in state.nats_tls_env().items():
            typer.echo(f"export {name}={value}")


def _real_node(state: cluster.State) -> dict[str, object] | None:
    """The real node of a testbed, as `local up --json` and `local status --json` show it."""
    if state.real_node is None:
        return None
    from respawn.testbed import realnode

    return {
        "name": state.real_node,
        "ready": realnode.node_ready(state.kubeconfig) is True,
        "taint": realnode.TAINT,
        "containerdSocket": str(realnode.Layout(state.state_dir).socket),
    }


@local_app.command("deploy")
def local_deploy(
    state_dir: Path = StateDir,
    timeout: float = typer.Option(300, "--timeout", min=10, help="Seconds to wait for every pod Ready."),
    output: str | None = output_option(),
    as_json: bool = json_flag(),
) -> None:
    """Deploy Respawn from deploy/overlays/testbed onto the testbed's real node, as pods of its
    own image; returns once every pod is Ready. Needs `local up --real-node` (and, to avoid two
    controllers, `--no-services`)."""
    from respawn.testbed import cluster, incluster

    fmt = _format(output, as_json)
    state = cluster.State.load(state_dir.resolve())
    if state is None:
        _fail(
            TestbedError(
                f"no testbed running in {state_dir}; run 'respawn local up --real-node --no-services'"
            ),
            EXIT_NOT_FOUND,
        )
        return
    try:
        rollout = incluster.deploy(state, log=_say, timeout=timeout)
    except TestbedError as exc:
        _fail(exc)
        return
    if fmt.document:
        emit(
            {
                "version": CLI_OUTPUT_VERSION,
                "namespace": incluster.NAMESPACE,
                "images": {
                    k: {"name": v.name, "digest": v.digest} for k, v in sorted(rollout.images.items())
                },
                "importSeconds": round(rollout.import_seconds, 2),
                "readySeconds": round(rollout.ready_seconds, 2),
            },
            fmt,
        )
    else:
        seconds = rollout.ready_seconds
        _say(f"Respawn Ready in namespace {incluster.NAMESPACE} ({seconds:.1f}s after the image import)")


@local_app.command("undeploy")
def local_undeploy(state_dir: Path = StateDir) -> None:
    """Remove what `local deploy` applied; the AppWrapper CRD and users' AppWrappers stay."""
    from respawn.testbed import cluster, incluster

    state = cluster.State.load(state_dir.resolve())
    if state is None:
        _fail(TestbedError(f"no testbed running in {state_dir}"), EXIT_NOT_FOUND)
        return
    try:
        incluster.undeploy(state, log=_say)
    except TestbedError as exc:
        _fail(exc)


@local_app.command("down")
def local_down(state_dir: Path = StateDir) -> None:
    """Stop everything `up` started (by pid) and remove the state directory."""
    from respawn.testbed import cluster

    try:
        found = cluster.down(state_dir, log=_say)
    except TestbedError as exc:
        _fail(exc)
        return
    _say("testbed stopped" if found else f"no testbed running in {state_dir}")


@local_app.command("status")
def local_status(
    state_dir: Path = StateDir, output: str | None = output_option(), as_json: bool = json_flag()
) -> None:
    """Show which testbed processes are running."""
    from respawn.testbed import cluster

    fmt = _format(output, as_json)
    state = cluster.State.load(state_dir.resolve())
    if state is None:
        if fmt.document:
            emit({"version": CLI_OUTPUT_VERSION, "running": False, "processes": {}, "replicas": {}}, fmt)
        else:
            typer.echo(f"no testbed in {state_dir}")
        raise typer.Exit(EXIT_NOT_FOUND)
    running = state.running()
    if fmt.document:
        emit(
            {
                "version": CLI_OUTPUT_VERSION,
                "running": all(running.values()),
                "processes": running,
                "replicas": replica_table(state),
                "realNode": _real_node(state),
            },
            fmt,
        )
        return
    from rich.console import Console
    from rich.table import Table

    # Every process, each replica of a service its own row with the port of its probes.
    # -o wide: where each process logs.
    wide = fmt is Format.WIDE
    table = Table("process", "pid", "probes", "state", *(("log",) if wide else ()))
    for name, alive in running.items():
        port = state.ports.get(f"{name}-probes")
        probes = str(port) if port else ""
        cells = [name, str(state.pids[name]), probes, "running" if alive else "stopped"]
        if wide:
            log = state.state_dir / "logs" / f"{name}.log"
            cells.append(str(log) if log.exists() else "")
        table.add_row(*cells)
    # Wide rows are never folded to the terminal's width: they are for reading whole, or for grep.
    console = Console(width=WIDE_WIDTH) if wide else Console()
    console.print(table)
    if (node := _real_node(state)) is not None:
        console.print(
            f"real node {node['name']}: {'Ready' if node['ready'] else 'not Ready'}, "
            f"taint {node['taint']}, containerd {node['containerdSocket']}"
        )


@app.command("run")
def run_service(
    service: str = typer.Argument(..., help="watcher | health | lifecycle | autopilot"),
    config: Path | None = typer.Option(
        None, "--config", help="Operator configuration YAML (else RESPAWN_CONFIG)."
    ),
) -> None:
    """Run one service in the foreground against KUBECONFIG and NATS_URL."""
    import importlib
    import os

    # The same entry point as the service's Deployment (`python -m services.<name>`); nothing of
    # the testbed is involved.
    if service not in SERVICES:
        _fail(ValueError(f"unknown service {service!r}; choose one of {', '.join(SERVICES)}"), EXIT_USAGE)
    if config is not None:
        os.environ["RESPAWN_CONFIG"] = str(config)
    importlib.import_module(f"services.{service}.__main__").main()


@app.command("demo")
def demo(
    state_dir: Path = typer.Option(
        Path(".respawn-demo"), "--state-dir", help="State directory for the demo testbed."
    ),
    keep: bool = typer.Option(False, "--keep", help="Leave the testbed running afterwards."),
) -> None:
    """Bring the testbed up, run a sample workload through Respawn, print what happened, tear down."""
    from respawn.demo import run_demo

    try:
        run_demo(state_dir, keep=keep, log=_say)
    except (TestbedError, TimeoutError) as exc:
        _fail(exc)


def _register_config() -> None:
    """``respawn config ...`` (respawn/cli/upstream_config.py)."""
    from respawn.cli import upstream_config

    upstream_config.register(app, output_version=CLI_OUTPUT_VERSION)


_register_config()


def completion_script(argv: list[str]) -> str | None:
    """The completion script ``respawn --show-completion SHELL`` asks for, None for any other
    command line. typer's own ``--show-completion`` takes no value: it detects the shell from the
    parent processes and ignores a name after it (and finds none under a service manager or in a
    container), so the named shell is honoured here."""
    if len(argv) != 2 or argv[0] != "--show-completion" or argv[1] not in _SHELLS:
        return None
    return str(get_completion_script(prog_name="respawn", complete_var="_RESPAWN_COMPLETE", shell=argv[1]))


def main() -> None:
    script = completion_script(sys.argv[1:])
    if script is not None:
        typer.echo(script)
        raise SystemExit(0)
    app()


if __name__ == "__main__":
    main()
