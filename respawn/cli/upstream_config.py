"""``respawn config convert-upstream``: the upstream AppWrapper operator's configuration as
Respawn's configuration file (``respawn/upstreamconfig.py`` does the mapping; docs/migration.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from respawn.upstreamconfig import UpstreamConfigError, convert_text


def register(app: typer.Typer, *, output_version: str) -> None:
    # The output is a configuration file, not a report: it carries no output version.
    del output_version
    config_app = typer.Typer(no_args_is_help=True, help="Respawn's operator configuration.")
    app.add_typer(config_app, name="config")

    @config_app.command("convert-upstream")
    def convert_upstream(
        source: str = typer.Argument(
            ...,
            metavar="FILE",
            help=(
                "The upstream operator's ConfigMap (as `kubectl get configmap -o yaml` prints it) "
                "or its config.yaml; - reads standard input."
            ),
        ),
        onto: Path | None = typer.Option(
            None,
            "--onto",
            help=(
                "A Respawn configuration file (such as deploy/base/config/config.yaml) to write the "
                "converted keys over; its other keys stay."
            ),
        ),
        output: Path | None = typer.Option(
            None, "--output-file", help="Write Respawn's configuration file here instead of to stdout."
        ),
    ) -> None:
        """Convert the upstream AppWrapper (or CodeFlare) operator configuration into Respawn's.

        Keys with no Respawn setting are named, with the reason, in the file's leading comment
        and on stderr. Exits 1, naming the key, if a value cannot be converted or the result is
        not a valid Respawn configuration.
        """
        try:
            text = sys.stdin.read() if source == "-" else Path(source).read_text()
            base = None if onto is None else onto.read_text()
        except OSError as exc:
            typer.echo(f"error: cannot read {exc.filename}: {exc.strerror}", err=True)
            raise typer.Exit(1) from None
        try:
            conversion = convert_text(text, base)
        except UpstreamConfigError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None
        for item in conversion.ignored:
            typer.echo(f"respawn: left out {item.key}: {item.why}", err=True)
        if output is None:
            typer.echo(conversion.yaml(), nl=False)
        else:
            output.write_text(conversion.yaml())
