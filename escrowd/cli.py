"""The `escrowd` command line: one subcommand per service, no logic of its own.

Subcommands are imported when they run, not when the CLI starts: `escrowd --help` and
`escrowd verify auto` never load web3, eth-account, FastAPI or aiokafka. A subcommand whose
module fails to import fails loudly when it is used (and `tests/unit/test_cli.py` imports
every one), it is never dropped from the CLI.

Every command's start-up failure (invalid YAML or settings, unreachable database or broker)
is one short line on stderr and exit code 2; `--debug` (or `ESCROWD_DEBUG=1`) shows the
traceback instead.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

from schemas.jsonbounds import cap_recursion_limit

# name: (module, attribute, one-line help shown by `escrowd --help` without importing it)
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "index": ("indexer.cli", "app", "Index escrow events into PostgreSQL and Kafka."),
    "consume": ("escrowd.consumers_cli", "app", "Kafka consumers: verification, lifecycle, reputation."),
    "relay": ("relayer.settlement.cli", "app", "Settlement relayer: signed verdicts in, completeVerification out."),
    "api": ("api.cli", "app", "The HTTP API: task terms, finalize, review, results."),
    "verify": ("verification.cli", "app", "Auto-check a result against verification criteria, or validate criteria."),
    "db": ("escrowd.db_cli", "app", "Database maintenance."),
    "config": ("escrowd.config_cli", "app", "Check a configuration file against every service's settings."),
    "keys": ("escrowd.keys_cli", "app", "Keystores for the relayer and the verification service."),
    "schemas": ("schemas.cli", "app", "Shared message schemas."),
    "devnet": ("escrowd.devnet_cli", "devnet", "Start anvil with the escrow deployed and keep it running."),
    "run": ("escrowd.run", "run", "Run the whole pipeline on embedded services, with traffic."),
    "soak": ("escrowd.soak", "soak", "Every service as its own process under steady traffic: memory, lag, latency, invariants."),
    "verifier-agent": ("verification.agents.verifier_agent", "verifier_agent", "The hosted verifier of agent review: queue, model, completeVerification."),
    "panel": ("panels.cli", "app", "Dispute panels, offline: draw a panel, compute a consensus."),
    "verifier-bot": ("panels.bot", "verifier_bot", "The reference panel verifier: registers, polls assignments, attests."),
}


class LazyGroup(TyperGroup):
    """A group whose subcommands are imported on first use."""

    def list_commands(self, ctx: Any) -> list[str]:
        return [*super().list_commands(ctx), *SUBCOMMANDS]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is not None or cmd_name not in SUBCOMMANDS:
            return command
        if self._listing:
            help_text = SUBCOMMANDS[cmd_name][2]
            return TyperCommand(cmd_name, help=help_text, short_help=help_text)
        return load_command(cmd_name)

    _listing = False

    def format_help(self, ctx: Any, formatter: Any) -> None:
        # The help lists every subcommand's help line: serve the static lines from
        # SUBCOMMANDS instead of importing each module to read its own.
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


def load_command(name: str) -> Any:
    """Import subcommand `name` and return it as a Typer/click command (import errors propagate)."""
    module_name, attr, help_text = SUBCOMMANDS[name]
    target = getattr(importlib.import_module(module_name), attr)
    if isinstance(target, typer.Typer):
        command: Any = typer.main.get_group(target)
    else:
        single = typer.Typer()
        single.command(name=name, help=target.__doc__ or help_text)(target)
        command = typer.main.get_command(single)
    command.name = name
    return command


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("escrowd")
    except PackageNotFoundError:  # running from a source tree without installing
        return "0+unknown"


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"escrowd {_version()}")
        raise typer.Exit()


app = typer.Typer(
    name="escrowd",
    cls=LazyGroup,
    help="Agent-work escrow backend: indexer, consumers, settlement relayer and API.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def root(
    version: bool = typer.Option(
        False, "--version", callback=_show_version, is_eager=True, help="Print the version and exit."
    ),
    debug: bool = typer.Option(
        False, "--debug", envvar="ESCROWD_DEBUG", help="Show tracebacks of start-up errors."
    ),
) -> None:
    """Agent-work escrow backend: indexer, consumers, settlement relayer and API."""


def _debug(args: list[str]) -> bool:
    if os.environ.get("ESCROWD_DEBUG", "").lower() in ("1", "true", "yes"):
        return True
    return "--debug" in args


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: exit 0, 1 (failure), 2 (start-up or usage error), 130/143."""
    # Before any service module: py_ecc raises the recursion limit when first imported.
    settle_recursion_limit()
    args = sys.argv[1:] if argv is None else list(argv)
    debug = _debug(args)
    try:
        # Typer handles usage errors (exit 2), `typer.Exit` and `--help` and exits itself.
        app(args=args, prog_name="escrowd")
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:
        if debug:
            raise
        try:
            code = _report(exc)
        except KeyboardInterrupt:  # a Ctrl-C while reporting: still no traceback
            code = 130
        sys.exit(code)


def _report(exc: BaseException) -> int:
    from runtime.errors import describe, redact_url
    from runtime.logging import redact

    described = describe(exc)
    if described is not None:
        typer.echo(f"escrowd: {redact(described[0])}", err=True)
        return 2
    lines = redact(redact_url(str(exc))).splitlines()
    detail = f": {lines[0]}" if lines else ""
    typer.echo(f"escrowd: {type(exc).__name__}{detail} (run with --debug for the traceback)", err=True)
    return 1


def settle_recursion_limit() -> int:
    """Import the libraries that raise Python's recursion limit, then put it back; return it.

    py_ecc (imported by the signing stack) sets the limit to 100,000 when it is first
    imported, which lets C-level recursion overflow the stack (SIGSEGV) before Python's
    guard fires. Importing it here, before any service, makes its later imports no-ops.
    """
    import importlib

    for module_name in _LIMIT_RAISERS:
        try:
            importlib.import_module(module_name)
        except ImportError:
            continue
    return cap_recursion_limit()


_LIMIT_RAISERS = ("py_ecc",)


if __name__ == "__main__":
    main()
