"""`escrowd soak`: every service its own process under traffic, sampled, judged (`make soak` only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from runtime.services.kafka import KafkaService
from runtime.services.postgres import PostgresService

PROCESSES = {"indexer", "relayer", "rulings", "api"} | {
    f"{group}-{member}" for group in ("verification", "lifecycle", "reputation", "panels") for member in (0, 1)
}


@pytest.mark.soak
@pytest.mark.timeout(1500)
def test_short_soak_with_two_members_per_group(pg_service: PostgresService, kafka_service: KafkaService) -> None:
    """Exit 0 and one JSON summary: every process sampled, latencies timed, lag read, invariants held."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ESCROWD_")}
    env |= {"DATABASE_URL": pg_service.admin_url, "KAFKA_BOOTSTRAP": kafka_service.bootstrap}
    result = subprocess.run(
        [sys.executable, "-m", "escrowd.cli", "soak", "--minutes", "3", "--members", "2", "--sample-seconds", "5"],
        capture_output=True, text=True, env=env, timeout=1400, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-4000:]
    summary = json.loads(result.stdout)
    assert summary["ok"] is True and summary["members_per_group"] == 2
    assert set(summary["memory"]) == PROCESSES
    assert all(m["samples"] >= 10 for m in summary["memory"].values()), summary["memory"]
    assert summary["grew"] == {} and summary["undecided"] == [] and summary["exited"] == []
    assert summary["tasks"] >= 12 and summary["tasks_per_second"] > 0
    assert summary["finalize_to_confirmed_seconds"]["count"] >= 1
    assert summary["finalize_to_confirmed_seconds"]["p99"] >= summary["finalize_to_confirmed_seconds"]["p50"] > 0
    # Connections are told apart by process; the consumers' lag is read per group.
    assert {"soak-api", "soak-indexer", "soak-lifecycle-0", "soak-lifecycle-1"} <= set(summary["db_connections_peak"])
    assert {"escrowd-lifecycle", "escrowd-verification", "settlement-relayer"} <= set(summary["consumer_lag_final"])
    assert summary["largest_tables_bytes"] and summary["db_bytes"]["last"] >= summary["db_bytes"]["first"]
    names = {c["name"] for c in summary["invariants"]["checks"]}
    assert {"token conservation (deposits = payouts + fees + refunds + escrowed)", "at most one verdict per attempt",
            "no service process exited", "every batch of traffic completed"} <= names  # fmt: skip
    assert all(c["ok"] for c in summary["invariants"]["checks"])
