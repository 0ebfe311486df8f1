"""Schemathesis (`--checks all`) over a real `escrowd api serve` process: zero failures.

Unsigned requests drawn from the API's own OpenAPI document (valid, near-valid and
negative), a bounded number per operation so it stays fast; `make soak` runs many more.
Every answer must be documented, in the documented shape, and never a 5xx; schema-valid
bodies must not be refused by validation, schema-invalid ones must be.

The agent and panel routes authenticate before they validate: they run in a second pass
where `schemathesis_signing.py` (a schemathesis hook) signs every generated request with an
EIP-712 request signature for the deployment the API serves, so the fuzz reaches their
validation and handlers; the test also checks from the answers that it did.

Left out of the run: `/health/bridge`, whose `503` is its documented answer when the
bridge check is not configured (schemathesis counts every 5xx as a server error). NUL
characters are not generated: the API refuses them on purpose (`JSON_INVALID`, PostgreSQL
text cannot hold them), which `tests/api/test_hostile_http.py` checks.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import TEST_CHAIN_ID, TEST_ESCROW, ServiceProcess, api_process

SIGNED_ROUTES = r"^/panels/|^/v1/(executors|rubrics|briefs|listings|verifiers)|/listing$"
"""The routes that authenticate before they validate: fuzzed signed (`schemathesis_signing.py`)."""
HOOKS = Path(__file__).with_name("schemathesis_signing.py")
CONFIG = Path(__file__).with_name("schemathesis.toml")
FUZZ_KEY = "0x" + "4f" * 32


@pytest.fixture
def api(database_url: str) -> Iterator[ServiceProcess]:
    with api_process(database_url) as service:
        yield service


def _schemathesis(
    api: ServiceProcess, tmp_path: Path, examples: int, *, signed: bool = False
) -> subprocess.CompletedProcess[str]:
    st = shutil.which("st", path=str(Path(sys.executable).parent))
    assert st is not None, "schemathesis is in the dev extra"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SCHEMATHESIS_", "ESCROWD_FUZZ_"))}
    if signed:
        # Only the signed routes, every request signed for the deployment the API serves.
        routes = ["--include-path-regex", SIGNED_ROUTES]
        env.update({"SCHEMATHESIS_HOOKS": str(HOOKS), "ESCROWD_FUZZ_SIGNING_KEY": FUZZ_KEY,
                    "ESCROWD_FUZZ_CHAIN_ID": str(TEST_CHAIN_ID), "ESCROWD_FUZZ_ESCROW": TEST_ESCROW,
                    "ESCROWD_FUZZ_REPORT": str(tmp_path / "answers.txt")})
    else:
        routes = ["--exclude-path-regex", SIGNED_ROUTES]
    return subprocess.run(
        [
            st, "--config-file", str(CONFIG), "run", f"{api.url}/openapi.json", "--checks", "all", "--max-examples", str(examples),
            "--workers", "1", "--no-color", "--generation-database", "none", "--generation-allow-x00", "false",
            "--exclude-path", "/health/bridge", "--request-timeout", "60", *routes,
        ],
        capture_output=True, text=True, cwd=tmp_path, timeout=1800, env=env,
    )  # fmt: skip


def test_schemathesis_finds_no_failure(api: ServiceProcess, tmp_path: Path) -> None:
    """All checks, every operation, unsigned: no failure, and the process is still up."""
    run = _schemathesis(api, tmp_path, examples=15)
    assert run.returncode == 0, run.stdout[-6000:]
    assert "passed" in run.stdout
    assert api.alive()


@pytest.mark.soak
def test_schemathesis_soak(api: ServiceProcess, tmp_path: Path) -> None:
    """The same run with 1,000 examples per operation (`make soak`)."""
    run = _schemathesis(api, tmp_path, examples=1000)
    assert run.returncode == 0, run.stdout[-6000:]
    assert api.alive()


def _answers(tmp_path: Path) -> list[tuple[str, str, int, str]]:
    lines = (tmp_path / "answers.txt").read_text(encoding="utf-8").splitlines()
    return [(m, p, int(s), c) for m, p, s, c in (line.split(" ") for line in lines)]


def test_schemathesis_signed_routes_find_no_failure(api: ServiceProcess, tmp_path: Path) -> None:
    """The agent and panel routes, every request validly signed for the served deployment:
    all checks pass (no 5xx, every status and body documented, valid bodies accepted and
    invalid ones refused), and the signatures were accepted, so the fuzz reached validation
    and the handlers rather than stopping at 401."""
    run = _schemathesis(api, tmp_path, examples=15, signed=True)
    assert run.returncode == 0, run.stdout[-12000:]
    assert api.alive()
    answers = _answers(tmp_path)
    assert answers and not [a for a in answers if a[2] >= 500]
    signed_paths = {p for _, p, _, _ in answers if not p.startswith(("/panels/rounds", "/panels/calibration"))}
    assert len(signed_paths) >= 10
    refused_signatures = [a for a in answers if a[3] in ("SIGNATURE_INVALID", "AUTH_REQUIRED", "SIGNATURE_EXPIRED")]
    # Only the attestation route refuses signatures here: it checks the attestation's own
    # EIP-712 signature, which the fuzz cannot forge.
    assert {p for _, p, _, _ in refused_signatures} <= {"/panels/attestations"}, refused_signatures[:5]
    statuses = {s for _, _, s, _ in answers}
    assert 422 in statuses and statuses & {200, 201, 204}, sorted(statuses)
    # Accepted signed writes: registrations that went through as the signer's own.
    assert ("POST", "/panels/verifiers", 201, "-") in answers
    assert any(m == "PUT" and p == "/v1/executors/me" and s in (200, 201) for m, p, s, _ in answers)


@pytest.mark.soak
def test_schemathesis_signed_soak(api: ServiceProcess, tmp_path: Path) -> None:
    """The signed run with 1,000 examples per operation (`make soak`)."""
    run = _schemathesis(api, tmp_path, examples=1000, signed=True)
    assert run.returncode == 0, run.stdout[-12000:]
    assert api.alive()
