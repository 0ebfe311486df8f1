"""The CLI: every subcommand loads, none is dropped silently, start-up stays light."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from escrowd.cli import SUBCOMMANDS, load_command
from escrowd.harness import escrowd_command

HEAVY = ("web3", "eth_account", "fastapi", "aiokafka", "asyncpg", "uvicorn", "aiohttp")


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_subcommand_imports_and_has_help(name: str) -> None:
    """An installed command works: its module imports and `--help` exits 0."""
    command = load_command(name)
    assert command.name == name
    proc = subprocess.run([*escrowd_command(), name, "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Usage" in proc.stdout


def test_a_subcommand_whose_module_fails_to_import_fails_loudly(tmp_path: Path) -> None:
    """A broken module is an error naming it, not a command that vanished from the CLI."""
    (tmp_path / "broken_mod.py").write_text("import this_module_does_not_exist\n", encoding="utf-8")
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from escrowd import cli;"
        "cli.SUBCOMMANDS['broken'] = ('broken_mod', 'app', 'A module under construction.');"
        "cli.main(sys.argv[2:])"
    )
    listing = subprocess.run([sys.executable, "-c", code, str(tmp_path), "--help"], capture_output=True, text=True, timeout=120)
    assert listing.returncode == 0 and "broken" in listing.stdout
    used = subprocess.run([sys.executable, "-c", code, str(tmp_path), "broken", "--help"], capture_output=True, text=True, timeout=120)
    assert used.returncode != 0
    assert "this_module_does_not_exist" in used.stderr


def _modules_after(argv: list[str], tmp_path: Path) -> set[str]:
    out = tmp_path / "modules.json"
    code = (
        "import sys, json, atexit;"
        f"atexit.register(lambda: open({str(out)!r}, 'w').write(json.dumps(sorted(sys.modules))));"
        "from escrowd.cli import main; main(sys.argv[1:])"
    )
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(out.read_text(encoding="utf-8")))


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["--version"],
        ["verify", "auto", "--criteria", "{criteria}", "--result", "{result}"],
        ["config", "--help"],
    ],
    ids=["help", "version", "verify-auto", "config-help"],
)
def test_light_paths_import_no_heavy_dependency(argv: list[str], tmp_path: Path) -> None:
    """`escrowd --help` and `escrowd verify auto` never load web3, eth-account, FastAPI, aiokafka or aiohttp."""
    criteria = tmp_path / "criteria.json"
    criteria.write_text('{"type": "json_schema", "schema": {"type": "object"}}', encoding="utf-8")
    result = tmp_path / "result.json"
    result.write_text('{"answer": 42}', encoding="utf-8")
    args = [a.format(criteria=criteria, result=result) for a in argv]
    loaded = _modules_after(args, tmp_path)
    assert not {m.split(".")[0] for m in loaded} & set(HEAVY)


def test_version_prints_the_package_version() -> None:
    from importlib.metadata import version

    proc = subprocess.run([*escrowd_command(), "--version"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"escrowd {version('escrowd')}"
