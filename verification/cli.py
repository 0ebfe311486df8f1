"""`escrowd verify`: run the auto check or the post-time criteria validation on files.

* ``verify auto --criteria CRITERIA.json --result RESULT.json`` prints the
  `verificationResult` JSON on stdout and exits 0 whether the result passed or failed.
* ``verify validate-criteria FILE [--mode auto|agent|manual]`` prints the post-time
  verdict JSON and exits 0 when the criteria would be accepted, 1 when refused.
* ``verify run --verifier VERIFIER.json --result RESULT.json`` runs one registry verifier
  (a `VerifierRef` `{"kind", "ref", "config"}`) on a result (`{"output": ...}`) exactly as
  the consumer does (code in the sandbox), prints `{"passed", "reward", "detail",
  "reasons"}` and exits 0 on pass or fail; 3 when the verifier could not answer (the
  reason on stderr and as `{"error": ...}` on stdout). `--sandbox-url URL`
  (`ESCROWD_SANDBOX_URL`) sends code to a sandbox runner service; `--sandbox-accounting
  auto|cgroup|pidns` (`ESCROWD_SANDBOX_ACCOUNTING`) picks how a local run's CPU is counted.
* ``verify proof FILE --signer ADDRESS [--chain-id N --escrow ADDRESS --evidence-hash H
  --terms TERMS.json]`` checks a signed proof offline (signature, signer among the registered
  keys, chain/escrow of the domain, evidence hash, criteria hash recomputed from the terms;
  with `--verifier V.json --result R.json` it re-runs the verifier and compares passed and the
  counts) and prints `{"valid", "problems", "proof"}`: exit 0 when valid, 1 when not.
* ``verify serve-sandbox [--host H --port P --max-parallel N]`` runs the sandbox runner
  service (`verification.sandbox_service`), for a container that holds no secrets.

A file that cannot be read or is not JSON (or criteria that are not a JSON object)
exits 2 with a one-line error on stderr.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from schemas import jsonbounds
from verification.auto_check import auto_check
from verification.criteria_validation import MODES, validate_criteria

if TYPE_CHECKING:
    from schemas.task_terms import VerifierRef
    from verification.registry import VerifierOutcome

EXIT_USAGE = 2
EXIT_COULD_NOT_ANSWER = 3
MAX_FILE_BYTES = 8 * 1024 * 1024
"""Largest criteria or result file read (the API takes results up to 512 KiB)."""

app = typer.Typer(
    help="Auto-check a result against verification criteria, or validate criteria.",
    no_args_is_help=True,
    add_completion=False,
)


def _run_verifier(
    ref: VerifierRef, result_data: object, sandbox_url: str | None = None, accounting: str = "auto"
) -> VerifierOutcome:
    """Run the verifier `ref` names on a result with the default registry.

    Imported here, not at the top: the registry brings aiohttp and the sandbox client, which
    `verify auto` never needs. Raises `VerificationError` when the verifier cannot answer.
    `sandbox_url`: code runs go to that sandbox runner service instead of a local bwrap.
    """
    from verification.sandbox import SandboxSettings
    from verification.verifiers import default_registry

    async def judge() -> VerifierOutcome:
        settings = SandboxSettings(remote_url=sandbox_url, accounting=accounting)  # type: ignore[arg-type]
        registry = default_registry(sandbox_settings=settings)
        try:
            return await registry.verify(ref, {}, result_data)
        finally:
            await registry.close()

    return asyncio.run(judge())


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


@app.command("run")
def run_command(
    verifier: Annotated[Path, typer.Option("--verifier", help="VerifierRef JSON file {kind, ref, config}.")],
    result: Annotated[Path, typer.Option("--result", help="The agent's result JSON file ({output: ...}).")],
    sandbox_url: Annotated[
        str | None,
        typer.Option(
            "--sandbox-url",
            envvar="ESCROWD_SANDBOX_URL",
            help="Sandbox runner service (escrowd verify serve-sandbox) for code; default: bwrap here.",
        ),
    ] = None,
    accounting: Annotated[
        str,
        typer.Option(
            "--sandbox-accounting",
            envvar="ESCROWD_SANDBOX_ACCOUNTING",
            help="auto | cgroup | pidns: how a local run's CPU is accounted (docs/security.md).",
        ),
    ] = "auto",
) -> None:
    """Run one verifier on RESULT as the consumer would (exit 0 on pass or fail, 3 if it cannot answer)."""
    from pydantic import ValidationError

    from schemas.task_terms import VerifierRef

    if accounting not in ("auto", "cgroup", "pidns"):
        _fail(f"--sandbox-accounting must be auto, cgroup or pidns, not {accounting!r}")
    ref_data = _read_json(verifier, "verifier")
    result_data = _read_json(result, "result")
    try:
        ref = VerifierRef.model_validate(ref_data)
    except ValidationError as exc:
        _fail(f"verifier file {str(verifier)!r} is not a VerifierRef: {exc.errors()[0]['msg']}")

    from verification.registry import VerificationError

    try:
        outcome = _run_verifier(ref, result_data, sandbox_url, accounting)
    except VerificationError as exc:
        typer.echo(f"could not answer: {exc}", err=True)
        _print_json({"error": str(exc)})
        raise typer.Exit(EXIT_COULD_NOT_ANSWER) from None
    _print_json(
        {
            "passed": outcome.reward >= ref.pass_reward,
            "reward": outcome.reward,
            "detail": outcome.detail,
            "reasons": list(outcome.reasons),
        }
    )


@app.command("proof")
def proof_command(
    file: Annotated[Path, typer.Argument(help="Signed proof JSON (as served by GET .../proof).")],
    signer: Annotated[list[str], typer.Option("--signer", help="A registered verification key address.")],
    chain_id: Annotated[int | None, typer.Option("--chain-id", help="The chain the task is on.")] = None,
    escrow: Annotated[str | None, typer.Option("--escrow", help="The escrow the task is on.")] = None,
    evidence_hash: Annotated[str | None, typer.Option("--evidence-hash", help="The attempt's evidence hash on chain.")] = None,
    terms: Annotated[Path | None, typer.Option("--terms", help="The task's registered terms JSON.")] = None,
    verifier: Annotated[
        Path | None, typer.Option("--verifier", help="Re-run this VerifierRef (deterministic verifiers).")
    ] = None,
    result: Annotated[Path | None, typer.Option("--result", help="The delivered result, to re-run on.")] = None,
) -> None:
    """Check a signed proof offline (exit 0 valid, 1 not); optionally re-run the verifier and compare."""
    from pydantic import ValidationError

    from verification.proof import SignedProof, check_proof, criteria_hash

    data = _read_json(file, "proof")
    try:
        signed = SignedProof.model_validate(data)
    except ValidationError as exc:
        _print_json({"valid": False, "problems": [f"not a signed proof: {exc.errors()[0]['msg']}"], "proof": None})
        raise typer.Exit(1) from None
    expected_criteria = None
    if terms is not None:
        terms_data = _read_json(terms, "terms")
        if not isinstance(terms_data, dict):
            _fail(f"terms file {str(terms)!r} must hold a JSON object")
        expected_criteria = criteria_hash(terms_data.get("verificationCriteria"), terms_data.get("verifier"))
    try:
        problems = check_proof(
            signed, signer, chain_id=chain_id, escrow=escrow, evidence_hash=evidence_hash, criteria=expected_criteria
        )
    except ValueError as exc:
        _fail(str(exc))
    if (verifier is None) != (result is None):
        _fail("--verifier and --result go together")
    if verifier is not None and result is not None:
        problems += _rerun_problems(signed.proof, verifier, result)
    _print_json({"valid": not problems, "problems": problems, "proof": signed.to_json_dict()["proof"]})
    if problems:
        raise typer.Exit(1)


@app.command("serve-sandbox")
def serve_sandbox_command(
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 8090,
    max_parallel: Annotated[int, typer.Option("--max-parallel", min=1, help="Runs at a time.")] = 2,
) -> None:
    """Serve sandboxed runs over HTTP (POST /v1/run) until interrupted."""
    from runtime.shell import run_service
    from verification.sandbox import SandboxUnavailable, find_bwrap
    from verification.sandbox_service import create_app, serve

    try:
        find_bwrap(None)
    except SandboxUnavailable as exc:
        _fail(str(exc))
    app = create_app(max_parallel=max_parallel)
    run_service("sandbox", lambda stop: serve(app, host=host, port=port, stop=stop))


def _rerun_problems(proof: Any, verifier: Path, result: Path) -> list[str]:
    """Where re-running the verifier disagrees with the proof (passed and the counts it signs)."""
    from pydantic import ValidationError

    from schemas.task_terms import VerifierRef
    from verification.proof import proof_fields

    try:
        ref = VerifierRef.model_validate(_read_json(verifier, "verifier"))
    except ValidationError as exc:
        _fail(f"verifier file {str(verifier)!r} is not a VerifierRef: {exc.errors()[0]['msg']}")
    result_data = _read_json(result, "result")

    from verification.registry import VerificationError

    try:
        outcome = _run_verifier(ref, result_data)
    except VerificationError as exc:
        return [f"re-running the verifier could not answer: {exc.reason}"]
    problems = []
    passed = outcome.reward >= ref.pass_reward
    if passed != proof.passed:
        problems.append(f"re-running the verifier gives passed={passed}, the proof says {proof.passed}")
    signed = {"publicTests": proof.public_tests, "hiddenTests": proof.hidden_tests, "resourceLimits": proof.resource_limits}
    for name, value in proof_fields(outcome.detail).items():
        if signed[name] and value != signed[name]:
            problems.append(f"re-running the verifier gives {name} {value}, the proof says {signed[name]}")
    return problems
