"""The verdict consumer's batch fast path leaves exactly what the per-message path leaves.

One batch mixing every case the consumer knows (ordinary verdicts, a duplicate copy, a
second verdict for an attempt, an untrusted signature followed by a correctly signed copy
of the same message, malformed and id-less messages, already-judged, named-verifier,
not-yet-indexed and wrong-evidence tasks, a message already in the inbox) is applied on
one fresh database by `VerdictConsumer` (batch path) and on another by the plain runtime
`IdempotentConsumer` with the same handler (one message at a time). Every table the
consumer writes must end up the same, and the expected outcomes are asserted too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from aiokafka import ConsumerRecord, TopicPartition
from eth_account import Account

from relayer.settlement import consumer as settlement_consumer
from relayer.settlement import store
from relayer.settlement.consumer import VerdictConsumer, VerdictHandler
from runtime.consumer import IdempotentConsumer
from runtime.db import connect
from runtime.kafka import encode_headers
from runtime.services.postgres import PostgresService
from schemas.verdict import SignedVerdict, Verdict, sign_verdict, verdict_headers, verdict_payload
from tests.fixtures.services import fresh_database

CHAIN = 31337
ESCROW = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
NAMED = "0x00000000000000000000000000000000000000aa"
CONSUMER = "relayer-batch-test"
TOPIC = "t.verdicts"

SERVICE = Account.create()
ROGUE = Account.create()


def _evidence(task: int) -> str:
    return "0x" + f"{task:064x}"


def _verdict(task: int, *, evidence: str | None = None, score: int = 90, passed: bool = True) -> Verdict:
    return Verdict(
        chain_id=CHAIN,
        escrow=ESCROW,
        task_id=task,
        attempt=1,
        evidence_hash=evidence or _evidence(task),
        passed=passed,
        score=score,
        reasons=["r"],
        verifier_kind="auto-check",
        mode="auto",
        issued_at=datetime(2026, 1, 1, tzinfo=UTC),
    )


def _signed(task: int, key: Any = SERVICE, **changes: Any) -> SignedVerdict:
    return sign_verdict(_verdict(task, **changes), bytes(key.key))


def _record(offset: int, value: bytes, headers: dict[str, str]) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(
        topic=TOPIC,
        partition=0,
        offset=offset,
        timestamp=0,
        timestamp_type=0,
        key=b"k",
        value=value,
        checksum=None,
        serialized_key_size=1,
        serialized_value_size=len(value),
        headers=tuple(encode_headers(headers)),
    )


def _message(offset: int, signed: SignedVerdict, **header_changes: str) -> ConsumerRecord[bytes, bytes]:
    headers = {**verdict_headers(signed), **header_changes}
    return _record(offset, verdict_payload(signed), headers)


def batch() -> list[ConsumerRecord[bytes, bytes]]:
    """The mixed batch, in offset order (comments: what each one must become)."""
    untrusted = _signed(8, ROGUE)
    good_copy = _signed(8)
    no_id_headers = {k: v for k, v in verdict_headers(_signed(13)).items() if k != "ce_id"}
    return [
        _message(0, _signed(1)),  # queued
        _message(1, _signed(2, passed=False, score=10)),  # queued
        _message(2, _signed(1)),  # same message id as offset 0: duplicate
        _message(3, _signed(2, score=99), ce_id="reissued-2"),  # second verdict for the attempt
        _message(4, untrusted),  # untrusted_signer, inbox row released
        _message(5, good_copy),  # same message id as offset 4, correctly signed: queued
        _record(6, b"{not json", {"ce_id": "malformed-1", "ce_type": "io.escrowd.verdict.v1"}),  # dead letter
        _record(7, verdict_payload(_signed(13)), no_id_headers),  # no ce_id: dead letter
        _message(8, _signed(3)),  # judged in the index: already_judged
        _message(9, _signed(4)),  # named verifier: rejected
        _message(10, _signed(5)),  # not indexed: awaiting_evidence
        _message(11, _signed(6, evidence=_evidence(999))),  # evidence mismatch: rejected
        _message(12, _signed(7)),  # its message id is in the inbox already: duplicate
        _message(13, _signed(9)),  # queued
    ]


async def _seed(url: str) -> None:
    """Indexed events for tasks 1-4, 6-9 (task 5 is not indexed), and one inbox row."""
    conn = await connect(url)
    try:
        rows: list[tuple[Any, ...]] = []

        def event(task: int, name: str, args: dict[str, Any]) -> None:
            n = len(rows)
            rows.append(
                (f"{CHAIN}:0xb{n}:{n}", CHAIN, ESCROW, 10 + n, f"0xb{n}", 0, f"0xt{n}", 0, n, name, task, args, n + 1)
            )

        for task in (1, 2, 3, 4, 6, 7, 8, 9):
            event(task, "TaskCreated", {"verifier": NAMED if task == 4 else store.ZERO_ADDRESS})
            event(task, "EvidenceSubmitted", {"attempt": 1, "evidenceHash": _evidence(task)})
        event(3, "VerificationCompleted", {"attempt": 1})
        await conn.executemany(
            "INSERT INTO escrow_events (event_id, chain_id, escrow_address, block_number, block_hash,"
            " block_timestamp, tx_hash, tx_index, log_index, event_name, task_id, args, position)"
            " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
            rows,
        )
        await conn.execute(
            "INSERT INTO consumer_inbox (consumer, message_id) VALUES ($1, $2)",
            CONSUMER,
            verdict_headers(_signed(7))["ce_id"],
        )
    finally:
        await conn.close()


class CountingHandler(VerdictHandler):
    """The relayer's handler, counting the messages that went through the per-message path."""

    calls = 0

    async def __call__(self, conn: asyncpg.Connection, message: Any) -> None:
        self.calls += 1
        await super().__call__(conn, message)


def _handler() -> CountingHandler:
    return CountingHandler(
        consumer_name=CONSUMER,
        trusted_signers=frozenset({SERVICE.address}),
        served={CHAIN: frozenset({ESCROW})},
        wait_limit=timedelta(hours=1),
    )


def _consumer(kind: type[IdempotentConsumer], handler: VerdictHandler) -> IdempotentConsumer:
    return kind(
        name=CONSUMER,
        topics=[TOPIC],
        bootstrap="unused:9092",
        database_url="unused",
        handler=handler,
        dlq_topic="t.dlq",
        assignment="direct",
        poison_after_deaths=2,  # as the relayer runs it
    )


async def _apply(url: str, consumer: IdempotentConsumer, records: list[ConsumerRecord[bytes, bytes]]) -> None:
    conn = await connect(url)
    try:
        await consumer._process(conn, {TopicPartition(TOPIC, 0): records})
    finally:
        await conn.close()


async def _state(url: str) -> dict[str, list[tuple[Any, ...]]]:
    conn = await connect(url)
    try:
        queries = {
            "verdicts": "SELECT chain_id, escrow, task_id, attempt, evidence_hash, passed, score, message_id,"
            " signer, signed_verdict::text, status, wait_until IS NOT NULL FROM settlement_verdicts ORDER BY task_id",
            "rejections": "SELECT dedup_key, message_id, reason, detail, payload, chain_id, escrow, task_id,"
            " attempt, signer FROM settlement_rejections ORDER BY dedup_key",
            "inbox": "SELECT consumer, message_id FROM consumer_inbox ORDER BY message_id",
            "dead_letters": 'SELECT consumer, topic, partition, "offset", message_id, reason FROM dead_letters'
            ' ORDER BY "offset"',
            "outbox": "SELECT message_id, topic FROM outbox ORDER BY message_id",
            "offsets": "SELECT consumer, topic, partition, next_offset FROM consumer_offsets",
        }
        return {name: [tuple(r) for r in await conn.fetch(q)] for name, q in queries.items()}
    finally:
        await conn.close()


@pytest.fixture
def second_database_url(pg_service: PostgresService) -> Iterator[str]:
    """Another fresh, migrated database (the per-message path's)."""
    with fresh_database(pg_service) as url:
        yield url


@pytest.fixture
async def seeded(database_url: str, second_database_url: str) -> AsyncIterator[tuple[str, str]]:
    """(batch path's database, per-message path's database), both seeded alike."""
    await _seed(database_url)
    await _seed(second_database_url)
    yield database_url, second_database_url


EXPECTED_STATUSES = {1: "queued", 2: "queued", 3: "already_judged", 5: "awaiting_evidence", 8: "queued", 9: "queued"}
EXPECTED_REJECTIONS = {"untrusted_signer", "named_verifier_task", "evidence_mismatch"}


async def test_batch_path_equals_the_per_message_path(seeded: tuple[str, str]) -> None:
    fast_db, slow_db = seeded
    fast_handler, slow_handler = _handler(), _handler()
    await _apply(fast_db, _consumer(VerdictConsumer, fast_handler), batch())
    await _apply(slow_db, _consumer(IdempotentConsumer, slow_handler), batch())

    fast, slow = await _state(fast_db), await _state(slow_db)
    assert fast == slow
    statuses = {int(r[2]): r[10] for r in fast["verdicts"]}
    assert statuses == EXPECTED_STATUSES
    scores = {int(r[2]): r[6] for r in fast["verdicts"]}
    assert scores[2] == 10, "the first verdict for an attempt wins"
    assert {r[2] for r in fast["rejections"]} == EXPECTED_REJECTIONS
    assert [r[3] for r in fast["dead_letters"]] == [6, 7]
    assert fast["offsets"] == [(CONSUMER, TOPIC, 0, 14)]
    # The per-message path ran every message through the handler but the duplicates by id
    # (offsets 2, 12) and the one without an id (7); the batch path only the unusual ones:
    # 3 (an attempt seen before), 4 (untrusted), 5 (an id seen before), 6 (malformed).
    assert slow_handler.calls == 11
    assert fast_handler.calls == 4


async def test_a_failing_bulk_statement_falls_back_to_one_message_at_a_time(
    seeded: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fast_db, slow_db = seeded

    async def broken(*_args: Any, **_kwargs: Any) -> set[tuple[int, str, int, int]]:
        raise ValueError("bulk insert refused")

    monkeypatch.setattr(store, "insert_verdicts", broken)
    handler = _handler()
    await _apply(fast_db, _consumer(VerdictConsumer, handler), batch())
    await _apply(slow_db, _consumer(IdempotentConsumer, _handler()), batch())
    assert await _state(fast_db) == await _state(slow_db)
    assert handler.calls == 11  # everything went through the per-message path


async def test_after_a_death_in_a_batch_messages_go_one_at_a_time(seeded: tuple[str, str]) -> None:
    fast_db, _ = seeded
    handler = _handler()
    consumer = _consumer(VerdictConsumer, handler)
    # A mark left by a run that died in this partition (what `_open_marks` finds at start-up).
    consumer._suspects = {(TOPIC, 0): (0, 0, "dead-run")}
    await _apply(fast_db, consumer, batch())
    assert handler.calls == 11, "while a death is unexplained, each message gets its own mark"
    assert not consumer._suspects
    statuses = {int(r[2]): r[10] for r in (await _state(fast_db))["verdicts"]}
    assert statuses == EXPECTED_STATUSES


async def test_indexed_tasks_equals_indexed_task(seeded: tuple[str, str]) -> None:
    fast_db, _ = seeded
    conn = await connect(fast_db)
    try:
        keys = [(CHAIN, ESCROW.lower(), t) for t in range(1, 11)] + [(CHAIN, "0x" + "00" * 20, 1)]
        many = await store.indexed_tasks(conn, keys)
        for key in keys:
            assert many.get(key) == await store.indexed_task(conn, key[0], key[1], key[2])
        assert set(many) == {(CHAIN, ESCROW.lower(), t) for t in (1, 2, 3, 4, 6, 7, 8, 9)}
        assert many[(CHAIN, ESCROW.lower(), 3)].judged_attempts == frozenset({1})
        assert many[(CHAIN, ESCROW.lower(), 4)].named_verifier == NAMED
    finally:
        await conn.close()


async def test_fetches_wait_briefly_for_new_verdicts() -> None:
    consumer = settlement_consumer.VerdictConsumer(
        name=CONSUMER,
        topics=[TOPIC],
        bootstrap="127.0.0.1:1",
        database_url="unused",
        handler=_handler(),
        fetch_max_wait_ms=25,
        assignment="direct",
    )
    kafka_consumer = consumer._make_consumer()
    try:
        assert kafka_consumer._fetch_max_wait_ms == 25
    finally:
        await kafka_consumer.stop()
