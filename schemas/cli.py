"""`escrowd schemas`: export JSON Schema files of the shared models and the EIP-712 vectors."""

from __future__ import annotations

import typer

app = typer.Typer(help="Shared message schemas.", no_args_is_help=True)


@app.command("export")
def export_command() -> None:
    """Write schemas/jsonschema/*.json from the pydantic models, and the EIP-712 vectors."""
    from schemas import vectors
    from schemas.export import export

    for path in export():
        typer.echo(str(path))
    typer.echo(str(vectors.export()))


@app.command("list")
def list_command() -> None:
    """List the exported models."""
    from schemas.export import exported_models

    for name in exported_models():
        typer.echo(name)
