"""`escrowd verify`: run the auto check or the post-time criteria validation on files.

* ``verify auto --criteria CRITERIA.json --result RESULT.json`` prints the
  `verificationResult` JSON on stdout and exits 0 whether the result passed or failed.
* ``verify validate-criteria FILE [--mode auto|agent|manual]`` prints the post-time
  verdict JSON and exits 0 when the criteria would be accepted, 1 when refused.

A file that cannot be read or is not JSON (or criteria that are not a JSON object)
exits 2 with a one-line error on stderr.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from relayer.verification.auto_check import auto_check
from relayer.verification.criteria_validation import MODES, validate_criteria
from schemas import jsonbounds

EXIT_USAGE = 2
MAX_FILE_BYTES = 8 * 1024 * 1024
"""Largest criteria or result file read (the API takes results up to 512 KiB)."""

app = typer.Typer(
    help="Auto-check a result against verification criteria, or validate criteria.",
    no_args_is_help=True,
    add_completion=False,
)


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(EXIT_USAGE)


def _read_json(path: Path, what: str) -> object:
    try:
        raw = path.read_bytes()
    except OSError as error:
        _fail(f"cannot read {what} file {str(path)!r}: {error.strerror or error}")
    try:
        return jsonbounds.loads(raw, max_bytes=MAX_FILE_BYTES)
    except jsonbounds.JsonRefused as error:
        if error.code == "JSON_TOO_DEEP":
            _fail(f"{what} file {str(path)!r} is nested too deeply to read")
        if error.code == "JSON_TOO_LARGE":
            _fail(f"{what} file {str(path)!r} is larger than {MAX_FILE_BYTES} bytes")
        first_line = str(error).splitlines()[0].removeprefix("not JSON: ")
        _fail(f"{what} file {str(path)!r} is not JSON: {first_line}")
    except (UnicodeDecodeError, ValueError) as error:
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        _fail(f"{what} file {str(path)!r} is not JSON: {first_line}")


def _print_json(value: object) -> None:
    sys.stdout.write(json.dumps(value, ensure_ascii=False) + "\n")


@app.command("auto")
def auto_command(
    criteria: Annotated[Path, typer.Option("--criteria", help="verificationCriteria JSON file.")],
    result: Annotated[Path, typer.Option("--result", help="The agent's result JSON file.")],
) -> None:
    """Print the verificationResult for RESULT against CRITERIA (exit 0 on pass or fail)."""
    criteria_data = _read_json(criteria, "criteria")
    result_data = _read_json(result, "result")
    if not isinstance(criteria_data, dict):
        _fail(f"criteria file {str(criteria)!r} must hold a JSON object")
    _print_json(auto_check(result_data, criteria_data).to_json_dict())


@app.command("validate-criteria")
def validate_criteria_command(
    file: Annotated[Path, typer.Argument(help="verificationCriteria JSON file.")],
    mode: Annotated[
        str, typer.Option("--mode", help=f"Verification mode: {', '.join(MODES)}.")
    ] = "auto",
) -> None:
    """Print the post-time verdict on FILE (exit 0 accepted, 1 refused)."""
    if mode not in MODES:
        _fail(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    verdict = validate_criteria(_read_json(file, "criteria"), mode)
    _print_json(verdict.to_json_dict())
    if not verdict.ok:
        raise typer.Exit(1)
