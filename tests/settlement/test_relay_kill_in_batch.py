"""Two kills while one verdict is in flight must not drop it as a poison pill.

The kill -9 campaigns (`test_relay_batches.py::test_kill_nine_with_packing_keeps_exactly_once`,
`test_relay_crash_packed.py`) sometimes ended with one verdict never stored: the consumer had
dead-lettered it ("poison: the consumer process died while handling this message (2x)")
although it had not killed anything. The consumer's batch fast path marks only a batch's
first message in flight while it applies the whole batch (and yields to the senders, whose
crash points kill the process); the next run charged that death to the first message, so one
more death during that message's own handler, in the next run, dead-lettered it.

Here the relayer (the CLI, as a process) is killed twice at chosen moments, held there by a
table lock the test takes: once inside a fast batch (blocked inserting its inbox rows, after
the batch's mark) and once inside the first message's own handler (blocked inserting its
verdict). One death in its own handler is below `poison_after_deaths` (2): the third run must
apply and settle every verdict, with no dead letter. Two deaths in its own handler still make
it poison.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import asyncpg
import pytest

from runtime.consumer import IdempotentConsumer, InboundMessage
from runtime.kafka import TopicSpec, ensure_topics
from tests.settlement.conftest import Relay, Submitted, fetch, publish, verdict_statuses, wait_until
from tests.settlement.test_relay_crash import kill9, spawn


async def _killed_in_flight(
    database_url: str, env: dict[str, str], log_file: Path, consumer: str, table: str
) -> asyncpg.Record:
    """Start the relayer while `table` is locked against writes, wait until its consumer
    marked a message in flight and is blocked on the lock, kill -9 it; that mark."""
    holder = await asyncpg.connect(database_url)
    proc: subprocess.Popen[bytes] | None = None
    try:
        lock = holder.transaction()
        await lock.start()
        await holder.execute(f"LOCK TABLE {table} IN SHARE ROW EXCLUSIVE MODE")
        proc = spawn(env, log_file)
        run = f"{proc.pid}:"
        marks: list[asyncpg.Record] = []

        async def blocked_in_a_message() -> bool:
            assert proc is not None and proc.poll() is None, f"relayer exited: see {log_file}"
            marks[:] = await fetch(
                database_url,
                'SELECT topic, partition, "offset", deaths FROM consumer_in_flight'
                " WHERE consumer = $1 AND starts_with(run_id, $2) ORDER BY seq DESC LIMIT 1",
                consumer,
                run,
            )
            waiting = await fetch(
                database_url,
                "SELECT 1 FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
                " WHERE NOT l.granted AND c.relname = $1",
                table,
            )
            return bool(marks) and marks[0]["offset"] is not None and bool(waiting)

        await wait_until(blocked_in_a_message, timeout=60, what=f"the consumer blocked on {table} with a mark")
        kill9(proc)
        await lock.rollback()
        return marks[0]
    finally:
        if proc is not None and proc.poll() is None:
            kill9(proc)
        await holder.close()


async def _kills(relay: Relay, database_url: str, log_file: Path, in_handler: int) -> tuple[list[Submitted], dict[str, str]]:
    """Six verdicts on a one-partition topic; the relayer killed once inside a fast batch
    (its first message marked, its inbox rows waiting for a lock), then `in_handler` times
    inside that first message's own handler (one message at a time after a death; its
    verdict row waiting for a lock). The verdicts and the relayer's settings."""
    items = await relay.submitted(6, prefix="marks")
    env = relay.env()
    topic = env["ESCROWD_VERDICTS_TOPIC"]
    consumer = env["ESCROWD_RELAYER_CONSUMER_GROUP"]
    # One partition: every run reads the verdicts in the same order, from the same first one.
    await ensure_topics(relay.kafka_bootstrap, [TopicSpec(topic, 1)])
    await publish(relay.kafka_bootstrap, topic, relay.signed(items))
    # The per-message path inserts a message's inbox row before its mark: a mark seen while
    # the inbox is locked is the fast path's, named after the batch's first message.
    first = await _killed_in_flight(database_url, env, log_file, consumer, "consumer_inbox")
    where = ("topic", "partition", "offset")
    for _ in range(in_handler):
        again = await _killed_in_flight(database_url, env, log_file, consumer, "settlement_verdicts")
        assert [again[k] for k in where] == [first[k] for k in where], "the same message in flight at each death"
    return items, env


async def _run_to_the_end(
    env: dict[str, str], database_url: str, log_file: Path, items: list[Submitted], poison: int | None
) -> None:
    """A run without faults: every verdict confirmed but the one at offset `poison`
    (dead-lettered as poison, never stored)."""
    proc = spawn(env, log_file)
    try:

        async def settled() -> bool:
            assert proc.poll() is None, f"relayer exited with {proc.returncode}: see {log_file}"
            dead = {r["offset"]: r["reason"] for r in await fetch(database_url, 'SELECT "offset", reason FROM dead_letters')}
            assert set(dead) <= ({poison} if poison is not None else set()), f"dead-lettered: {dead}"
            statuses = await verdict_statuses(database_url)
            expected = len(items) - (poison is not None)
            return (
                len(statuses) == expected
                and set(statuses.values()) == {"confirmed"}
                and set(dead) == ({poison} if poison is not None else set())
            )

        await wait_until(settled, timeout=90, interval=0.2, what="every verdict confirmed")
    finally:
        kill9(proc)


@pytest.mark.timeout(240)
async def test_a_death_in_a_batch_and_one_in_the_message_do_not_make_it_poison(
    relay: Relay, database_url: str, tmp_path: Path
) -> None:
    log_file = tmp_path / "relayer.log"
    items, env = await _kills(relay, database_url, log_file, in_handler=1)
    await _run_to_the_end(env, database_url, log_file, items, poison=None)


@pytest.mark.timeout(240)
async def test_two_deaths_in_the_message_s_own_handler_still_make_it_poison(
    relay: Relay, database_url: str, tmp_path: Path
) -> None:
    log_file = tmp_path / "relayer.log"
    items, env = await _kills(relay, database_url, log_file, in_handler=2)
    await _run_to_the_end(env, database_url, log_file, items, poison=0)
    dead = await fetch(database_url, "SELECT reason FROM dead_letters")
    assert [r["reason"] for r in dead] == [
        "poison: the consumer process died while handling this message (2x); not handled again"
    ]


async def test_a_dead_run_s_mark_below_the_committed_offset_suspects_nothing(database_url: str) -> None:
    """Two dead runs with marks on one partition: the next run keeps one as the suspect, and
    the other, once a later run has committed past it, would never come round; loaded at
    every start it kept each later run message by message for ever (in the campaigns, where
    every kill then charges some message a death). A mark below the committed offset is
    dropped; one at or above it is still the suspect."""
    consumer_name, topic = "marks.settlement", "marks.verdicts"
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "INSERT INTO consumer_offsets (consumer, topic, partition, next_offset) VALUES ($1, $2, 0, 10), ($1, $2, 1, 3)",
            consumer_name,
            topic,
        )
        await conn.executemany(
            'INSERT INTO consumer_in_flight (consumer, run_id, topic, partition, "offset", deaths) VALUES ($1, $2, $3, $4, $5, $6)',
            [
                (consumer_name, "1:past", topic, 0, 7, 0),  # applied since: offset 7 < 10
                (consumer_name, "2:ahead", topic, 1, 3, 0),  # not applied yet: the suspect
            ],
        )
        consumer = IdempotentConsumer(
            name=consumer_name, topics=[topic], bootstrap="unused:9092", database_url=database_url,
            handler=_never, assignment="direct", poison_after_deaths=2,
        )  # fmt: skip
        await consumer._open_marks()
        assert consumer._marks is not None
        await consumer._marks.close()
        assert consumer._suspects == {(topic, 1): (3, 0, "2:ahead")}
        left = await conn.fetch("SELECT run_id FROM consumer_in_flight WHERE consumer = $1", consumer_name)
        assert [r["run_id"] for r in left] == ["2:ahead"]
    finally:
        await conn.close()


async def _never(_conn: asyncpg.Connection, _message: InboundMessage) -> None:
    raise AssertionError("no message is handled here")
