"""`escrowd run --signer KIND`: every key outside the process (the relayer's, the verification
service's, the hosted verifier agent's wallet) and the whole pipeline still settles every path."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from runtime.services.kafka import KafkaService
from runtime.services.postgres import PostgresService


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", ["aws-kms", "remote"])
def test_run_with_every_key_in_a_signer(pg_service: PostgresService, kafka_service: KafkaService, kind: str) -> None:
    env = {**os.environ, "ESCROWD_DATABASE_URL": pg_service.admin_url, "ESCROWD_KAFKA_BOOTSTRAP": kafka_service.bootstrap}
    result = subprocess.run(
        [sys.executable, "-m", "escrowd.cli", "run", "--tasks", "12", "--exit", "--no-progress", "--signer", kind],
        capture_output=True, text=True, env=env, timeout=540, check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    for role in ("relayer", "verification", "verifier-agent"):
        assert f"(holds the {role} key)" in output
    summary = json.loads(result.stdout[result.stdout.index("{"):])
    assert summary["invariants"]["ok"] is True
    assert all(c["ok"] for c in summary["invariants"]["checks"])
    assert summary["paths"].get("agent_review_hosted", 0) >= 1  # the hosted agent's wallet signed its verdict
    assert summary["paths"].get("auto_pass", 0) >= 1  # signed ahead by the judging stage
    assert summary["paths"].get("manual_review", 0) >= 1  # signed outside the consumer's transaction
