"""Schemathesis (`--checks all`) over a real `escrowd api serve` process: zero failures.

Unsigned requests drawn from the API's own OpenAPI document (valid, near-valid and
negative), a bounded number per operation so it stays fast; `make soak` runs many more.
Every answer must be documented, in the documented shape, and never a 5xx; schema-valid
bodies must not be refused by validation, schema-invalid ones must be.

Left out of the run: `/health/bridge`, whose `503` is its documented answer when the
bridge check is not configured (schemathesis counts every 5xx as a server error). NUL
characters are not generated: the API refuses them on purpose (`JSON_INVALID`, PostgreSQL
text cannot hold them), which `tests/api/test_hostile_http.py` checks.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import ServiceProcess, api_process


@pytest.fixture
def api(database_url: str) -> Iterator[ServiceProcess]:
    with api_process(database_url) as service:
        yield service


def _schemathesis(api: ServiceProcess, tmp_path: Path, examples: int) -> subprocess.CompletedProcess[str]:
    st = shutil.which("st", path=str(Path(sys.executable).parent))
    assert st is not None, "schemathesis is in the dev extra"
    return subprocess.run(
        [
            st, "run", f"{api.url}/openapi.json", "--checks", "all", "--max-examples", str(examples),
            "--workers", "1", "--no-color", "--generation-database", "none", "--generation-allow-x00", "false",
            "--exclude-path", "/health/bridge", "--request-timeout", "60",
            # The agent-review and panel routes authenticate before they validate, and their
            # integer fields are strict (no 24.0): they need the signed run (a signing hook),
            # which is still to be written. Their refusals are tested in tests/agents and tests/panels.
            "--exclude-path-regex", r"^/panels/|^/v1/(executors|rubrics|briefs|listings|verifiers)|/listing$",
        ],
        capture_output=True, text=True, cwd=tmp_path, timeout=1800,
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
