"""The `escrowd` command line: one subcommand per service, no logic of its own."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="escrowd",
    help="Agent-work escrow backend: indexer, consumers, settlement relayer and API.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


def _register() -> None:
    # Each service module exposes a Typer app or a command function; import errors of a
    # module under construction must not take the whole CLI down, so each is optional.
    import importlib

    sub_apps = {
        "verify": ("relayer.verification.cli", "app"),
        "index": ("indexer.cli", "app"),
        "consume": ("relayer.consumers_cli", "app"),
        "relay": ("relayer.settlement.cli", "app"),
        "api": ("relayer.api.cli", "app"),
        "schemas": ("schemas.cli", "app"),
        "db": ("escrowd.db_cli", "app"),
    }
    for name, (module_name, attr) in sub_apps.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                continue
            raise
        app.add_typer(getattr(module, attr), name=name)
    commands = {
        "devnet": ("escrowd.devnet_cli", "devnet"),
        "run": ("escrowd.run", "run"),
        "verifier-agent": ("relayer.agents.verifier_agent", "verifier_agent"),
    }
    for name, (module_name, attr) in commands.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                continue
            raise
        app.command(name=name)(getattr(module, attr))


_register()


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
