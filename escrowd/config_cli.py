"""`escrowd config check`: validate a configuration file against every service's settings."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="Configuration files.", no_args_is_help=True)


@app.command("check")
def check(
    config: Annotated[
        Path, typer.Option("--config", "-c", envvar="ESCROWD_CONFIG", help="YAML/JSON configuration file")
    ],
) -> None:
    """Validate FILE (with the environment) against every service's settings.

    Prints one line per section; exit 0 when every section is valid, 2 otherwise. Values are
    never printed, only field names and what is wrong with them.
    """
    import yaml

    from indexer.config import load_settings
    from relayer.api.settings import ApiSettings
    from relayer.consumers_cli import ConsumerSettings
    from relayer.settlement.config import RelayerSettings
    from relayer.verification.service import VerificationSettings
    from runtime.config_file import load as load_config
    from runtime.errors import describe

    # Syntax first: a YAML error is reported once, not once per section.
    text = config.read_text(encoding="utf-8")
    loaded = yaml.safe_load(text)
    if not isinstance(loaded, dict):
        typer.echo(f"{config}: expected a mapping at the top level", err=True)
        raise typer.Exit(2)
    failed = False
    sections: list[tuple[str, Callable[[], object]]] = [
        ("indexer", lambda: load_settings(config)),
        ("relayer", lambda: RelayerSettings.load(config)),
        ("api", lambda: load_config(ApiSettings, "api", config)),
        ("verification", lambda: load_config(VerificationSettings, "verification", config)),
        ("consumers", lambda: load_config(ConsumerSettings, "consumers", config)),
    ]
    for name, load in sections:
        try:
            load()
        except Exception as exc:
            described = describe(exc)
            if described is None:
                raise
            typer.echo(f"{name}: {described[0]}", err=True)
            failed = True
        else:
            typer.echo(f"{name}: ok")
    if failed:
        raise typer.Exit(2)
