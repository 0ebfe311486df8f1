"""`escrowd index`: follow the escrow's events into PostgreSQL and Kafka."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import typer
from pydantic import ValidationError

from escrowd.logging import configure_logging

app = typer.Typer(help="Index escrow events into PostgreSQL and Kafka.", no_args_is_help=True)


def config_error(exc: ValidationError) -> str:
    """One line per bad field, naming it."""
    lines = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"]) or "(root)"
        lines.append(f"  {where}: {error['msg']}")
    return "invalid configuration:\n" + "\n".join(lines)


@app.command("run")
def run(
    config: Path | None = typer.Option(None, "--config", "-c", envvar="ESCROWD_CONFIG", help="YAML/JSON config file"),
) -> None:
    """Index every configured chain until interrupted."""
    from indexer.app import run_indexer
    from indexer.config import load_settings

    try:
        settings = load_settings(config)
    except ValidationError as exc:
        typer.echo(config_error(exc), err=True)
        raise typer.Exit(2) from None
    except (OSError, ValueError) as exc:
        typer.echo(f"invalid configuration: {exc}", err=True)
        raise typer.Exit(2) from None
    configure_logging(json=settings.log_json)
    try:
        asyncio.run(run_indexer(settings))
    except KeyboardInterrupt:
        sys.exit(130)
