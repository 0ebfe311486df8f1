"""The `escrowd` command line: one subcommand per service, no logic of its own."""

from __future__ import annotations

import typer

from schemas.jsonbounds import cap_recursion_limit

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


def main() -> None:
    """Console-script entry point (every service process starts here)."""
    settle_recursion_limit()
    app()


if __name__ == "__main__":
    main()
