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
    only: Annotated[
        list[str] | None,
        typer.Option("--section", "-s", help="Check only this section (repeatable), present in the file or not"),
    ] = None,
) -> None:
    """Validate FILE (with the environment) against every service's settings.

    Prints one line per section; exit 0 when every section is valid, 2 otherwise. Values are
    never printed, only field names and what is wrong with them. The sections of the optional
    processes (`rulings`, `panels`, `verifier_agent`, `verifier_bot`) are checked when the file
    has them, and reported as skipped otherwise; a top-level key no service reads is an error.
    `--section NAME` checks only the sections named (a verifier's file holds no indexer).
    """
    import yaml

    from api.settings import ApiSettings
    from escrowd.consumers_cli import ConsumerSettings
    from indexer.config import load_settings
    from panels.bot import load_bot_settings
    from panels.settings import load_panel_settings
    from relayer.settlement.config import RelayerSettings
    from relayer.settlement.rulings import load_ruling_settings
    from runtime.config_file import key_name
    from runtime.config_file import load as load_config
    from runtime.errors import describe
    from verification.agents.verifier_agent import load_agent_settings
    from verification.service import VerificationSettings

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
    optional: list[tuple[str, Callable[[], object]]] = [
        ("rulings", lambda: load_ruling_settings(config)),
        ("panels", lambda: load_panel_settings(config)),
        ("verifier_agent", lambda: load_agent_settings(config)),
        ("verifier_bot", lambda: load_bot_settings(config)),
    ]
    everything = [*sections, *optional]
    if only:
        unknown = sorted(set(only) - {name for name, _ in everything})
        if unknown:
            typer.echo(f"--section: unknown section {', '.join(key_name(n) for n in unknown)}", err=True)
            raise typer.Exit(2)
        sections = [(name, load) for name, load in everything if name in only]
    else:
        for name, load in optional:
            if name in loaded:
                sections.append((name, load))
            else:
                typer.echo(f"{name}: skipped (no `{name}:` section)")
        stray = unread_top_level_keys(loaded)
        if stray:
            typer.echo(f"top level: unknown key {', '.join(stray)} (no service reads it)", err=True)
            failed = True
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


def unread_top_level_keys(loaded: dict[object, object]) -> list[str]:
    """Top-level keys that are neither a section, an `x-` anchor, nor a setting of any service."""
    from api.settings import ApiSettings
    from escrowd.consumers_cli import ConsumerSettings
    from indexer.config import IndexerSettings
    from panels.bot import BotSettings
    from panels.settings import PanelSettings
    from relayer.settlement.config import RelayerSettings
    from relayer.settlement.rulings import RulingRelaySettings
    from runtime.config_file import SECTIONS, key_name
    from verification.agents.verifier_agent import VerifierAgentSettings
    from verification.service import VerificationSettings

    known: set[str] = set(SECTIONS)
    for model in (IndexerSettings, RelayerSettings, ApiSettings, VerificationSettings, ConsumerSettings,
                  RulingRelaySettings, PanelSettings, VerifierAgentSettings, BotSettings):  # fmt: skip
        known.update(model.model_fields)
    return sorted({key_name(k) for k in loaded if not (isinstance(k, str) and (k in known or k.startswith("x-")))})
