"""`escrowd relay`: run the settlement relayer, or write an encrypted keystore for it."""

from __future__ import annotations

import getpass
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

RULING_OUTCOMES = ("accepted", "duplicate", "rejected", "sent", "broadcast_refused", "replaced", "reorged",
                   "fee_capped", "final", "nonce_lost", "bad_reply", "step_crashed", "signer_unavailable")  # fmt: skip
"""The outcomes `relay rulings` counts (`escrowd_relayer_rulings_total`), created at 0 at start."""

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
    from chain.signers import SignerError
    from relayer.settlement.config import RelayerSettings
    from relayer.settlement.service import run_relayer
    from runtime.logging import configure_logging
    from runtime.shell import cancel_on_stop, run_service, startup_failure

    try:
        settings = RelayerSettings.load(config)
    except (ValidationError, FileNotFoundError) as exc:
        # pydantic hides SecretStr values in its messages; nothing else here is secret.
        startup_failure("invalid relayer settings", exc)
    configure_logging(json=settings.log_json)
    from relayer.settlement import metrics

    metrics.at_start(chain.chain_id for chain in settings.chains)
    try:
        # The relayer's loops stop by cancellation: each one's `finally` is its drain.
        run_service("relayer", lambda stop: cancel_on_stop(stop, run_relayer(settings)), configure=False)
    except (KeyLoadError, SignerError) as exc:
        startup_failure("relayer key", exc)


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
    from chain.signers import SignerError
    from relayer.settlement.rulings import RULINGS, load_ruling_settings, run_ruling_relay
    from runtime.errors import StartupError
    from runtime.logging import configure_logging
    from runtime.shell import run_service, startup_failure

    try:
        settings = load_ruling_settings(config)
    except (ValidationError, StartupError) as exc:
        # One line naming the field; never a value of the input (the key, the database URL).
        startup_failure("invalid ruling relay settings", exc)
    configure_logging(json=True)
    from runtime.metrics import at_zero

    at_zero(RULINGS, RULING_OUTCOMES)
    try:
        run_service("rulings", lambda stop: run_ruling_relay(settings, stop), configure=False)
    except (KeyLoadError, SignerError) as exc:
        startup_failure("arbiter key", exc)


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
