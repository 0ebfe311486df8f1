"""The AsyncAPI document: current, complete, accepted by the reference parser, and it refuses what it should."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from schemas import asyncapi
from schemas.channels import CHANNELS
from schemas.topics import all_topics
from tests.support.asyncapi_check import messages_by_topic, problems

ROOT = Path(__file__).resolve().parents[2]


def test_committed_document_is_current() -> None:
    """Run `escrowd schemas export` when this fails."""
    assert asyncapi.ASYNCAPI_FILE.read_text(encoding="utf-8") == asyncapi.render(), (
        "schemas/asyncapi.yaml is stale: run `escrowd schemas export`"
    )


def test_every_topic_is_a_channel_with_its_clean_up_policy() -> None:
    specs = {spec.name: spec for spec in all_topics()}
    assert [c.topic for c in CHANNELS] == list(specs)
    document = asyncapi.document()
    for channel in document["channels"].values():
        spec = specs[channel["address"]]
        kafka = channel["bindings"]["kafka"]
        assert kafka["partitions"] == spec.partitions
        assert kafka["topicConfiguration"]["cleanup.policy"] == ["compact" if spec.compacted else "delete"]
    compacted = {c["address"] for c in document["channels"].values()
                 if c["bindings"]["kafka"]["topicConfiguration"]["cleanup.policy"] == ["compact"]}
    assert compacted == {"escrow.tasks.v1", "escrow.reputation.v1", "escrow.panel-calibration.v1"}


def test_every_escrow_event_has_a_message() -> None:
    events = messages_by_topic()["escrow.events.v1"]
    assert "io.escrowd.escrow.TaskCreated.v1" in events
    assert "io.escrowd.escrow.VerificationCompleted.v1" in events
    assert len(events) == 16


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is required by the project")
def test_the_reference_parser_accepts_the_document() -> None:
    result = subprocess.run(
        ["node", str(ROOT / "scripts" / "validate_asyncapi.mjs"), str(asyncapi.ASYNCAPI_FILE)],
        capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["errors"] == []
    assert set(report["channels"]) == {spec.name for spec in all_topics()}
    assert report["messages"] == sum(len(c.messages) for c in CHANNELS)


def test_the_reference_parser_refuses_a_broken_document(tmp_path: Path) -> None:
    """The parser check can fail: a document whose payload points nowhere is refused."""
    broken = tmp_path / "asyncapi.yaml"
    broken.write_text(asyncapi.render(), encoding="utf-8")  # no jsonschema/ folder beside it
    result = subprocess.run(
        ["node", str(ROOT / "scripts" / "validate_asyncapi.mjs"), str(broken)],
        capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
    )
    assert result.returncode == 1
    assert "ENOENT" in result.stdout


def _event(**overrides: object) -> dict[str, object]:
    body: dict[str, object] = {
        "id": "31337:0x" + "ab" * 32 + ":3", "chain_id": 31337, "escrow_address": "0x" + "11" * 20,
        "block_number": 7, "block_hash": "0x" + "ab" * 32, "block_timestamp": 1_700_000_000,
        "tx_hash": "0x" + "cd" * 32, "tx_index": 0, "log_index": 3, "event": "TaskAccepted", "task_id": 5,
        "args": {"taskId": 5, "agent": "0x" + "22" * 20, "status": 1}, "removed": False,
    }
    body.update(overrides)
    return body


HEADERS = {"ce_specversion": "1.0", "ce_id": "31337:0x" + "ab" * 32 + ":3", "ce_source": "escrowd/indexer/31337",
           "ce_type": "io.escrowd.escrow.TaskAccepted.v1", "content-type": "application/json"}


def test_the_record_check_accepts_a_good_record_and_names_what_is_wrong() -> None:
    assert problems("escrow.events.v1", HEADERS, _event()) == []
    assert problems("escrow.events.v1", HEADERS, _event(event="TaskCreated"))  # the type says TaskAccepted
    assert problems("escrow.events.v1", HEADERS, _event(args={"taskId": "5", "agent": "x", "status": 1}))
    assert problems("escrow.events.v1", {**HEADERS, "ce_type": "io.escrowd.escrow.Nope.v1"}, _event())
    assert problems("escrow.events.v1", {k: v for k, v in HEADERS.items() if k != "ce_id"}, _event())
    assert problems("escrow.nope.v1", HEADERS, _event())
