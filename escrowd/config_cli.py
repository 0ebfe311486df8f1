"""`escrowd config check`: validate a configuration file against every service's settings."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(help="Configuration files.", no_args_is_help=True)


@dataclass(frozen=True)
class Section:
    """One section: how its service loads its settings, and how it loads its secrets from them."""

    name: str
    load: Callable[[Path], Any]
    secrets: Callable[[Any], object] | None = None
    optional: bool = False


def sections() -> list[Section]:
    """Every section `config check` knows, in the order it reports them."""
    from api.settings import ApiSettings
    from escrowd.consumers_cli import LifecycleSettings, ReputationSettings
    from indexer.config import load_settings
    from panels.bot import load_bot_settings
    from panels.settings import PanelSettings, load_panel_settings
    from relayer.settlement.config import RelayerSettings
    from relayer.settlement.rulings import load_ruling_settings
    from relayer.settlement.service import load_relayer_key
    from runtime.config_file import load
    from verification.agents.verifier_agent import load_agent_settings
    from verification.service import VerificationSettings, load_signing_key

    def in_process(kind: Callable[[Any], str], read: Callable[[Any], object]) -> Callable[[Any], object]:
        # A key held by a KMS or remote signer is not in the file or the environment: the
        # service reaches its signer and checks the address at start.
        return lambda settings: read(settings) if kind(settings) == "keystore" else None

    def panel_secrets(settings: PanelSettings) -> None:
        settings.read_secret()
        settings.signing_key()
        settings.read_allowlist()

    return [
        Section("indexer", load_settings),
        Section("relayer", RelayerSettings.load, in_process(lambda s: s.relayer_signer.kind, load_relayer_key)),
        Section("api", lambda path: load(ApiSettings, "api", path)),
        Section(
            "verification", lambda path: load(VerificationSettings, "verification", path),
            in_process(lambda s: s.verification_signer.kind, load_signing_key),
        ),
        Section("lifecycle", lambda path: load(LifecycleSettings, "lifecycle", path)),
        Section("reputation", lambda path: load(ReputationSettings, "reputation", path)),
        Section("rulings", load_ruling_settings, lambda s: s.ruling_signer.kind != "keystore" or s.arbiter_key(), optional=True),
        Section("panels", load_panel_settings, panel_secrets, optional=True),
        Section(
            "verifier_agent", load_agent_settings,
            in_process(lambda loaded: loaded[0].wallet_signer.kind, lambda loaded: loaded[0].wallet()), optional=True,
        ),
        Section("verifier_bot", load_bot_settings, lambda s: s.signing_key(), optional=True),
    ]


@app.command("check")
def check(
    config: Annotated[
        Path, typer.Option("--config", "-c", envvar="ESCROWD_CONFIG", help="YAML/JSON configuration file")
    ],
    only: Annotated[
        list[str] | None,
        typer.Option("--section", "-s", help="Check only this section (repeatable), present in the file or not"),
    ] = None,
    no_secrets: Annotated[
        bool,
        typer.Option("--no-secrets", help="Lint without secrets at hand: keys, keystores and passwords not loaded"),
    ] = False,
) -> None:
    """Validate FILE (with the environment) against every service's settings.

    Prints one line per section; exit 0 when every section is valid, 2 otherwise. Values are
    never printed, only field names and what is wrong with them. A key a section's service
    does not read is an error in every section, as is a top-level key no service reads. Each
    service's secrets are loaded as at start-up (keystores decrypted with their passwords,
    key files read); `--no-secrets` skips that and accepts a missing key or an unset
    `${VAR}` in a secret setting, so a file can be linted in CI. The sections of the optional
    processes (`rulings`, `panels`, `verifier_agent`, `verifier_bot`) are checked when the
    file has them, and reported as skipped otherwise. `--section NAME` checks only the
    sections named (a verifier's file holds no indexer).
    """
    import contextlib

    import yaml

    from runtime.config_file import key_name
    from runtime.errors import describe
    from runtime.settings import without_secrets

    # Syntax first: a YAML error is reported once, not once per section.
    text = config.read_text(encoding="utf-8")
    loaded = yaml.safe_load(text)
    if not isinstance(loaded, dict):
        typer.echo(f"{config}: expected a mapping at the top level", err=True)
        raise typer.Exit(2)
    failed = False
    everything = sections()
    if only:
        unknown = sorted(set(only) - {s.name for s in everything})
        if unknown:
            typer.echo(f"--section: unknown section {', '.join(key_name(n) for n in unknown)}", err=True)
            raise typer.Exit(2)
        chosen = [s for s in everything if s.name in only]
    else:
        chosen = []
        for s in everything:
            if s.optional and s.name not in loaded:
                typer.echo(f"{s.name}: skipped (no `{s.name}:` section)")
            else:
                chosen.append(s)
        stray = unread_top_level_keys(loaded)
        if stray:
            typer.echo(f"top level: unknown key {', '.join(stray)} (no service reads it)", err=True)
            failed = True
    for s in chosen:
        try:
            with without_secrets() if no_secrets else contextlib.nullcontext():
                settings = s.load(config)
        except Exception as exc:
            described = describe(exc)
            if described is None:
                raise
            typer.echo(f"{s.name}: {described[0]}", err=True)
            failed = True
            continue
        if s.secrets is not None and not no_secrets:
            try:
                s.secrets(settings)
            except Exception as exc:
                typer.echo(f"{s.name}: {_secret_problem(exc)}", err=True)
                failed = True
                continue
        typer.echo(f"{s.name}: ok" + (" (secrets not checked)" if no_secrets and s.secrets is not None else ""))
    if failed:
        raise typer.Exit(2)


def _secret_problem(exc: BaseException) -> str:
    """What is wrong with a secret, in one line: key loaders name the file and the problem,
    never a byte of the secret (their own message, not the OS error they replaced)."""
    from runtime.errors import safe_message

    if isinstance(exc, OSError):
        return safe_message(exc)
    from runtime.errors import redact_url
    from runtime.logging import redact

    lines = redact(redact_url(str(exc))).splitlines()
    return lines[0] if lines else type(exc).__name__


def unread_top_level_keys(loaded: dict[object, object]) -> list[str]:
    """Top-level keys that are neither a section, an `x-` anchor, nor a setting of any service
    (a renamed section with its note)."""
    from api.settings import ApiSettings
    from escrowd.consumers_cli import LifecycleSettings, ReputationSettings
    from indexer.config import IndexerSettings
    from panels.bot import BotSettings
    from panels.settings import PanelSettings
    from relayer.settlement.config import RelayerSettings
    from relayer.settlement.rulings import RulingRelaySettings
    from runtime.config_file import MOVED, SECTIONS, key_name
    from verification.agents.verifier_agent import VerifierAgentSettings
    from verification.service import VerificationSettings

    known: set[str] = set(SECTIONS)
    for model in (IndexerSettings, RelayerSettings, ApiSettings, VerificationSettings, LifecycleSettings,
                  ReputationSettings, RulingRelaySettings, PanelSettings, VerifierAgentSettings, BotSettings):  # fmt: skip
        known.update(model.model_fields)
    stray = {key_name(k) for k in loaded if not (isinstance(k, str) and (k in known or k.startswith("x-")))}
    return sorted(f"{k} ({MOVED[k]})" if k in MOVED else k for k in stray)
