"""`escrowd … run`: the verification consumer service (settings from `ESCROWD_*` variables)."""

from __future__ import annotations

import typer

from runtime.config_file import load
from runtime.options import ConfigOption, LogJsonOption
from runtime.shell import startup_failure

app = typer.Typer(help="The verification consumer: judges finalized results, records verdicts.", no_args_is_help=True)


@app.command()
def run(
    config: ConfigOption = None,
    log_json: LogJsonOption = True,
) -> None:
    """Run the verification consumer, the retry scheduler and an outbox publisher until Ctrl-C."""
    from runtime.logging import configure_logging
    from runtime.shell import run_service
    from verification.service import (
        SigningKeyError,
        VerificationSettings,
        run_verification_consumer,
    )

    configure_logging(json=log_json)
    try:
        settings = load(VerificationSettings, "verification", config)
    except Exception as exc:
        startup_failure("configuration error", exc)
    try:
        run_service("verification", lambda stop: run_verification_consumer(settings, stop), configure=False)
    except SigningKeyError as exc:
        startup_failure("signing key", exc)


@app.command()
def check(
    config: ConfigOption = None,
) -> None:
    """Validate the configuration and the signing key (a KMS or remote one is asked for its
    address), print the signer address, and exit."""
    import asyncio

    from chain.signers import SignerError
    from verification.service import SigningKeyError, VerificationSettings, open_verification_signer

    async def address(settings: VerificationSettings) -> str:
        signer = await open_verification_signer(settings)
        await signer.aclose()
        return signer.address

    try:
        settings = load(VerificationSettings, "verification", config)
        signer_address = asyncio.run(address(settings))
    except (SigningKeyError, SignerError) as exc:
        startup_failure("signing key", exc)
    except Exception as exc:
        startup_failure("configuration error", exc)
    typer.echo(f"verdicts will be signed by {signer_address}")


if __name__ == "__main__":
    app()
