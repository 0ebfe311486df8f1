"""`escrowd relay`: run the settlement relayer, or write an encrypted keystore for it."""

from __future__ import annotations

import getpass
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="Settlement relayer: signed verdicts in, completeVerification out.", no_args_is_help=True)


@app.command()
def run(
    config: Annotated[
        Path | None, typer.Option("--config", help="YAML/JSON settings file (default: $ESCROWD_CONFIG)")
    ] = None,
) -> None:
    """Run the relayer until SIGINT/SIGTERM."""
    from pydantic import ValidationError

    from chain.keys import KeyLoadError
    from relayer.settlement.config import RelayerSettings
    from relayer.settlement.service import run_relayer
    from runtime.errors import safe_message
    from runtime.logging import configure_logging
    from runtime.shell import cancel_on_stop, run_service

    try:
        settings = RelayerSettings.load(config)
    except (ValidationError, FileNotFoundError) as exc:
        # pydantic hides SecretStr values in its messages; nothing else here is secret.
        typer.echo(f"invalid relayer settings: {safe_message(exc)}", err=True)
        raise typer.Exit(2) from None
    configure_logging(json=settings.log_json)
    try:
        # The relayer's loops stop by cancellation: each one's `finally` is its drain.
        run_service("relayer", lambda stop: cancel_on_stop(stop, run_relayer(settings)), configure=False)
    except KeyLoadError as exc:
        typer.echo(f"relayer key: {safe_message(exc)}", err=True)
        raise typer.Exit(2) from None


@app.command("rulings")
def rulings(
    config: Annotated[
        Path | None,
        typer.Option("--config", envvar="ESCROWD_CONFIG", help="YAML/JSON settings file (its `rulings:` section)"),
    ] = None,
) -> None:
    """Send signed panel rulings as resolveDispute from the arbiter key, until SIGINT/SIGTERM."""
    from pydantic import ValidationError

    from chain.keys import KeyLoadError
    from relayer.settlement.rulings import load_ruling_settings, run_ruling_relay
    from runtime.errors import StartupError, safe_message
    from runtime.logging import configure_logging
    from runtime.shell import run_service

    try:
        settings = load_ruling_settings(config)
    except (ValidationError, StartupError) as exc:
        # One line naming the field; never a value of the input (the key, the database URL).
        typer.echo(f"invalid ruling relay settings: {safe_message(exc)}", err=True)
        raise typer.Exit(2) from None
    configure_logging(json=True)
    try:
        run_service("rulings", lambda stop: run_ruling_relay(settings, stop), configure=False)
    except KeyLoadError as exc:
        typer.echo(f"arbiter key: {safe_message(exc)}", err=True)
        raise typer.Exit(2) from None


@app.command("keystore")
def keystore(
    out: Annotated[Path, typer.Argument(help="Keystore file to write (mode 0600)")],
    key_env: Annotated[str, typer.Option(help="Environment variable holding the raw key")] = "ESCROWD_RELAYER_KEY",
) -> None:
    """Encrypt the raw key from the environment into a keystore file (password prompted)."""
    from chain.keys import KeyLoadError, SecretKey, write_keystore

    raw = os.environ.get(key_env)
    if not raw:
        typer.echo(f"${key_env} is not set", err=True)
        raise typer.Exit(2)
    try:
        key = SecretKey.from_hex(raw)
    except KeyLoadError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    password = getpass.getpass("keystore password: ")
    if password != getpass.getpass("again: "):
        typer.echo("passwords differ", err=True)
        raise typer.Exit(2)
    write_keystore(key, out, password)
    typer.echo(f"wrote {out} for {key.address}")


if __name__ == "__main__":  # `python -m relayer.settlement.cli run`
    sys.exit(app())
