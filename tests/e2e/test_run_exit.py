"""`escrowd run --tasks N --exit`: the whole pipeline, traffic on every path, invariants checked."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from escrowd.harness import read_topic
from runtime.services.kafka import KafkaService
from runtime.services.postgres import PostgresService
from schemas.topics import all_topics
from tests.support.asyncapi_check import problems


@pytest.mark.timeout(600)
def test_run_drives_every_path_and_the_invariants_hold(
    pg_service: PostgresService, kafka_service: KafkaService
) -> None:
    """Exit code 0, a JSON summary, every path played, every invariant checked and true."""
    env = {**os.environ, "ESCROWD_DATABASE_URL": pg_service.admin_url, "ESCROWD_KAFKA_BOOTSTRAP": kafka_service.bootstrap}
    result = subprocess.run(
        [sys.executable, "-m", "escrowd.cli", "run", "--tasks", "20", "--exit", "--no-progress"],
        capture_output=True, text=True, env=env, timeout=540, check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    summary = json.loads(result.stdout)
    assert summary["tasks"] == 20
    assert summary["invariants"]["ok"] is True
    names = {c["name"] for c in summary["invariants"]["checks"]}
    assert "token conservation (deposits = payouts + fees + refunds + escrowed)" in names
    assert "indexer holds exactly the chain's events" in names
    assert "panels: each panel dispute resolved on chain once, with the panel's split" in names
    assert "senders: every nonce judged lost was taken by a transaction not ours" in names
    assert summary["paths"].get("panel_dispute", 0) >= 1
    assert all(c["ok"] for c in summary["invariants"]["checks"])
    assert len(summary["paths"]) >= 6
    assert summary["paths"].get("agent_review_hosted", 0) >= 1  # judged by the running hosted verifier
    conforms_to_the_asyncapi_document(kafka_service.bootstrap)


def conforms_to_the_asyncapi_document(bootstrap: str) -> None:
    """Every record the run published, on every topic, is what schemas/asyncapi.yaml says."""
    found: list[str] = []
    seen: dict[str, set[str]] = {}
    for spec in all_topics():
        records = asyncio.run(read_topic(bootstrap, spec.name))
        seen[spec.name] = {r.headers.get("ce_type", "") for r in records}
        for record in records:
            found += problems(spec.name, record.headers, record.payload)
    assert not found, "records the AsyncAPI document does not describe:\n" + "\n".join(found[:40])
    # The run plays every path: these topics cannot be empty, so the check above checked something.
    for topic in ("escrow.events.v1", "escrow.verification-requests.v1", "escrow.verdicts.v1", "escrow.tasks.v1",
                  "escrow.reputation.v1", "escrow.panel-rounds.v1", "escrow.panel-rulings.v1"):
        assert seen[topic], f"{topic}: no record after the run"
    assert len(seen["escrow.events.v1"]) >= 8
