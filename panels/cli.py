"""`escrowd panel`: the panel rules offline, for operators and auditors (no network, no database).

* ``panel draw --task-key CHAIN:ESCROW:TASK [--round N] --pool POOL.json --secret-file F
  [--exclude-operators A,B] [--exclude-ids X,Y]`` prints ``{"verifiers": [ids...]}``;
  POOL.json is ``[{"id", "operator", "calibration"}]``.
* ``panel consensus --attestations FILE`` prints ``{"consensus", "rerun", ...}``; FILE is
  ``{"round": N, "attestations": [{"verifier", "quality", "confidence", "calibration"}]}``
  (optional per attestation: ``"timed_out"``; optional at the top: ``"schema_ok"`` and
  ``"min_confidence"``, default 0.1: below it an attestation is a decline).
* ``panel draw`` takes ``--operator-cap`` (default 1): the most one operator's verifiers
  weigh together in the draw.

Bad input exits 2 with a one-line error on stderr; a pool too small for the panel exits 3.
The secret is never printed.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError

from panels import rules
from schemas import jsonbounds

EXIT_USAGE = 2
EXIT_POOL_TOO_SMALL = 3
MAX_FILE_BYTES = 8 * 1024 * 1024
MAX_POOL = 100_000
MIN_SECRET_BYTES = 16
TASK_KEY = re.compile(r"^[1-9][0-9]{0,77}:0x[0-9a-fA-F]{40}:[0-9]{1,78}$")

app = typer.Typer(
    help="Panel draw and consensus, offline and reproducible.",
    no_args_is_help=True,
    add_completion=False,
)

_Id = Annotated[str, Field(min_length=1, max_length=200)]
_Unit = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]


class PoolEntry(BaseModel):
    """One verifier of POOL.json."""

    model_config = ConfigDict(extra="forbid", strict=True)

    id: _Id
    operator: _Id
    calibration: _Unit


class AttestationEntry(BaseModel):
    """One attestation of the consensus FILE."""

    model_config = ConfigDict(extra="forbid", strict=True)

    verifier: _Id
    quality: _Unit
    confidence: _Unit
    calibration: _Unit
    timed_out: StrictBool = False


class ConsensusFile(BaseModel):
    """The consensus FILE."""

    model_config = ConfigDict(extra="forbid", strict=True)

    round: int = Field(ge=rules.FIRST_ROUND, le=rules.MAX_ROUND)
    attestations: list[AttestationEntry] = Field(max_length=1000)
    schema_ok: StrictBool = True
    min_confidence: _Unit = rules.MIN_CONFIDENCE_PPM / rules.PPM


def _fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _read(path: Path, what: str) -> bytes:
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        _fail(f"cannot read {what} file {str(path)!r}: {error.strerror or error}")
    if len(raw) > MAX_FILE_BYTES:
        _fail(f"{what} file {str(path)!r} is larger than {MAX_FILE_BYTES} bytes")
    return raw


def _parse(path: Path, what: str) -> object:
    raw = _read(path, what)
    try:
        text = raw.decode("utf-8")
        if jsonbounds.nesting_depth(raw, stop_above=jsonbounds.MAX_DEPTH) > jsonbounds.MAX_DEPTH:
            _fail(f"{what} file {str(path)!r} is nested too deeply")
        return json.loads(text)
    except RecursionError:
        _fail(f"{what} file {str(path)!r} is nested too deeply")
    except (UnicodeDecodeError, ValueError) as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        _fail(f"{what} file {str(path)!r} is not JSON: {first}")


def _invalid(what: str, error: ValidationError) -> NoReturn:
    first = error.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "$"
    _fail(f"{what}: {where}: {first['msg']}")


def _names(value: str | None) -> list[str]:
    return [part.strip() for part in (value or "").split(",") if part.strip()]


def _print(value: object) -> None:
    sys.stdout.write(json.dumps(value) + "\n")


@app.command("draw")
def draw_command(
    task_key: Annotated[str, typer.Option("--task-key", help="CHAIN:ESCROW:TASK")],
    pool: Annotated[Path, typer.Option("--pool", help="POOL.json: [{id, operator, calibration}]")],
    secret_file: Annotated[Path, typer.Option("--secret-file", help="File holding the draw secret")],
    round_number: Annotated[int, typer.Option("--round", help="1 = first panel, 2 = rerun")] = 1,
    exclude_operators: Annotated[
        str | None, typer.Option("--exclude-operators", help="Comma-separated operator ids")
    ] = None,
    exclude_ids: Annotated[
        str | None, typer.Option("--exclude-ids", help="Comma-separated verifier ids (parties, earlier seats)")
    ] = None,
    operator_cap: Annotated[
        str, typer.Option("--operator-cap", help="Most draw weight of one operator's verifiers together (0..1]")
    ] = "1",
) -> None:
    """Print the verifiers drawn for TASK_KEY and ROUND from POOL."""
    if not TASK_KEY.match(task_key):
        _fail("--task-key must be CHAIN:0xESCROW:TASK (decimal chain id and task id)")
    if not rules.FIRST_ROUND <= round_number <= rules.MAX_ROUND:
        _fail(f"--round must be {rules.FIRST_ROUND} or {rules.MAX_ROUND}")
    secret = _read(secret_file, "secret").strip()
    if len(secret) < MIN_SECRET_BYTES:
        _fail(f"the secret file must hold at least {MIN_SECRET_BYTES} bytes")
    data = _parse(pool, "pool")
    if not isinstance(data, list) or len(data) > MAX_POOL:
        _fail(f"pool file must hold a JSON array of at most {MAX_POOL} verifiers")
    try:
        entries = [PoolEntry.model_validate(item) for item in data]
    except ValidationError as error:
        _invalid("pool", error)
    candidates = [rules.Candidate(e.id, e.operator, rules.to_ppm(e.calibration)) for e in entries]
    key = task_key.lower()
    try:
        cap = rules.to_ppm(operator_cap)
    except (ValueError, ArithmeticError):
        _fail("--operator-cap must be a decimal in (0, 1]")
    if cap == 0:
        _fail("--operator-cap must be a decimal in (0, 1]")
    try:
        chosen = rules.draw(
            secret,
            key,
            round_number,
            candidates,
            exclude_operators=_names(exclude_operators),
            exclude_ids=_names(exclude_ids),
            operator_cap_ppm=cap,
        )
    except rules.PoolTooSmall as error:
        _fail(str(error), EXIT_POOL_TOO_SMALL)
    except ValueError as error:
        _fail(str(error))
    _print({"verifiers": [c.id for c in chosen]})


@app.command("consensus")
def consensus_command(
    attestations: Annotated[Path, typer.Option("--attestations", help="{round, attestations: [...]}")],
) -> None:
    """Print the consensus of a round, whether it reruns, its band and the agent's share."""
    try:
        parsed = ConsensusFile.model_validate(_parse(attestations, "attestations"))
    except ValidationError as error:
        _invalid("attestations", error)
    seats = [
        rules.Attestation(
            a.verifier,
            rules.to_ppm(a.quality),
            rules.to_ppm(a.confidence),
            rules.to_ppm(a.calibration),
            a.timed_out,
        )
        for a in parsed.attestations
    ]
    minimum = rules.to_ppm(parsed.min_confidence)
    try:
        result = rules.decide(parsed.round, seats, minimum)
    except ValueError as error:
        _fail(str(error))
    ppm = result.consensus_ppm
    capped = None if ppm is None else rules.cap(ppm, parsed.schema_ok)
    _print(
        {
            "consensus": None if result.consensus is None else float(result.consensus),
            "consensus_ppm": ppm,
            "rerun": result.outcome is rules.Outcome.RERUN,
            "inconclusive": result.outcome is rules.Outcome.INCONCLUSIVE,
            "outcome": result.outcome.value,
            "round": result.round,
            "spread": None if result.spread_ppm is None else result.spread_ppm / rules.PPM,
            "weighted": list(result.weighted),
            "declined": [a.verifier for a in seats if not rules.counts(a, minimum)],
            "min_confidence": minimum / rules.PPM,
            "schema_ok": parsed.schema_ok,
            "band": None if capped is None else rules.band(capped).value,
            "agent_share_bps": None
            if ppm is None
            else rules.agent_share_bps(ppm, parsed.schema_ok),
        }
    )
