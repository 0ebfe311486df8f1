"""The committed JSON Schema files are exactly what the models produce."""

from __future__ import annotations

from schemas.export import JSONSCHEMA_DIR, expected_files


def test_committed_json_schemas_are_current() -> None:
    """Run `escrowd schemas export` when this fails."""
    expected = expected_files()
    committed = {p: p.read_text(encoding="utf-8") for p in JSONSCHEMA_DIR.rglob("*.json")}
    assert set(committed) == set(expected), "schema files added or removed: run `escrowd schemas export`"
    for path, text in expected.items():
        assert committed[path] == text, f"{path.name} is stale: run `escrowd schemas export`"


def test_event_message_schema_names_every_field() -> None:
    """Subscribers rely on these fields."""
    schema = expected_files()[JSONSCHEMA_DIR / "EscrowEventMessage.json"]
    for field in ("chain_id", "escrow_address", "block_number", "block_hash", "tx_hash", "log_index",
                  "event", "task_id", "args", "removed"):
        assert f'"{field}"' in schema
