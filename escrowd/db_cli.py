"""`escrowd db`: database maintenance."""

from __future__ import annotations

import asyncio

import typer

from runtime.db import migrate_url

app = typer.Typer(help="Database maintenance.", no_args_is_help=True)


@app.command()
def migrate(database_url: str = typer.Option(..., envvar="ESCROWD_DATABASE_URL", help="PostgreSQL URL")) -> None:
    """Apply the SQL migrations this database lacks."""
    applied = asyncio.run(migrate_url(database_url))
    typer.echo(f"applied: {', '.join(applied) if applied else 'nothing (up to date)'}")
