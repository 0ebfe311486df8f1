"""docs/operations.md "Replaying the dead-letter queue", executed as written against real
processes: the indexer publishing a devnet's events, `escrowd consume lifecycle` killed with
SIGKILL in the middle of a batch (its in-flight mark stays), the next run dead-lettering that
innocent event as poison, then the runbook's own SQL blocks (read from the page, the filter
adapted as the page says) replaying it: the event is handled, nothing twice, nothing lost.

The runbook once filtered on `consumer = 'verification'` (0 rows: the name is
`escrowd-verification`) and did not say that the inbox `DELETE` removes 0 rows for a poison
dead letter, nor that a chain event needs the watermark rewind rather than the outbox update.
"""

from __future__ import annotations

import asyncio
import re
import signal
from pathlib import Path

from escrowd.devnet import Devnet
from escrowd.harness import IndexerProcess, chain_config, generate_task_events, write_config
from runtime.db import connect
from runtime.kafka import TopicSpec, ensure_topics
from tests.support.indexer_harness import wait_for
from tests.support.processes import consumer_process

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
EVENTS = 600
CONSUMER = "escrowd-lifecycle"


def runbook_sql(section: str) -> list[str]:
    """The ```sql blocks of one `## section` of the runbook, in order."""
    text = OPERATIONS.read_text(encoding="utf-8")
    start = text.index(f"## {section}\n")
    end = text.find("\n## ", start + 1)
    return re.findall(r"```sql\n(.*?)```", text[start : end if end > 0 else None], flags=re.S)


def statements(block: str) -> list[str]:
    """A block's statements (comments dropped), split on the `;` that ends a line."""
    lines = [line for line in block.splitlines() if not line.strip().startswith("--")]
    return [s.strip() for s in re.split(r";\s*$", "\n".join(lines), flags=re.M) if s.strip()]


async def test_the_runbook_replays_a_poison_dead_letter_left_by_a_kill(
    devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    names = {"events_topic": f"{topic_prefix}events", "dead_letter_topic": f"{topic_prefix}dlq",
             "tasks_topic": f"{topic_prefix}tasks", "timers_topic": f"{topic_prefix}timers",
             "reputation_topic": f"{topic_prefix}reputation"}  # fmt: skip
    await ensure_topics(kafka_bootstrap, [TopicSpec(names["events_topic"], 2)] + [
        TopicSpec(t, 1) for k, t in names.items() if k != "events_topic"])  # fmt: skip
    config = write_config(tmp_path / "indexer.yaml", database_url=database_url, kafka_bootstrap=kafka_bootstrap,
                          topic=names["events_topic"], chains=[chain_config(devnet)])  # fmt: skip
    env = {"ESCROWD_DATABASE_URL": database_url, "ESCROWD_KAFKA_BOOTSTRAP": kafka_bootstrap,
           **{f"ESCROWD_{k.upper()}": v for k, v in names.items()}}  # fmt: skip
    log = tmp_path / "lifecycle.log"
    indexer = IndexerProcess(config)
    conn = await connect(database_url)
    try:
        await asyncio.to_thread(generate_task_events, devnet, EVENTS)
        indexer.start()
        total = EVENTS + 0  # every TaskCreated; the deployment emits no other escrow event

        async def escrow_events() -> int:
            return int(await conn.fetchval("SELECT count(*) FROM escrow_events"))

        await wait_for(lambda: _at_least(escrow_events(), total), timeout=180, what="the events indexed")
        total = await escrow_events()

        async def handled() -> int:
            return int(await conn.fetchval("SELECT count(*) FROM consumer_inbox WHERE consumer = $1", CONSUMER))

        async def in_a_batch() -> bool:
            row = await conn.fetchrow(
                'SELECT "offset" FROM consumer_in_flight WHERE consumer = $1 ORDER BY seq DESC LIMIT 1', CONSUMER
            )
            return row is not None and row["offset"] is not None and 0 < await handled() < total

        with consumer_process(["consume", "lifecycle"], env, log) as process:
            await wait_for(in_a_batch, timeout=180, interval=0.005, what="the consumer in the middle of a batch")
            process.process.send_signal(signal.SIGKILL)  # a node failure: the mark stays
            await asyncio.to_thread(process.process.wait, 60)

        async def dead() -> list[str]:
            rows = await conn.fetch("SELECT message_id FROM dead_letters WHERE consumer = $1", CONSUMER)
            return [str(r["message_id"]) for r in rows]

        with consumer_process(["consume", "lifecycle"], env, log) as process:
            await wait_for(lambda: _equals(handled(), total - 1), timeout=240, interval=0.2, what="all but the accused")
            (accused,) = await dead()
            assert "the consumer process died" in await conn.fetchval("SELECT reason FROM dead_letters")

            # Step 1 of the runbook: the reasons, as written.
            for sql in statements(runbook_sql("Replaying the dead-letter queue")[0]):
                rows = await conn.fetch(sql)
                assert any(r["consumer"] == CONSUMER for r in rows), sql
            # Step 3, as written, with the filter adapted to this dead letter (the page says so).
            replay, rewind = runbook_sql("Replaying the dead-letter queue")[1:3]
            adapted = replay.replace("'escrowd-verification'", f"'{CONSUMER}'").replace("'invalid payload%'", "'poison%'")
            assert adapted != replay
            results = []
            async with conn.transaction():
                for sql in statements(adapted):
                    if sql.upper() not in ("BEGIN", "COMMIT"):
                        results.append(await conn.execute(sql))
            assert results[1:] == ["DELETE 0", "UPDATE 0"]  # poison: no inbox row; a chain event: no outbox row
            (rewind_sql,) = statements(rewind)
            assert await conn.execute(rewind_sql.replace("<message id>", accused)) == "UPDATE 1"

            # The publisher sends from there again; the consumer handles the accused event
            # and skips the rest (already in its inbox).
            await wait_for(lambda: _equals(handled(), total), timeout=240, interval=0.2, what="the replayed event handled")
            assert await conn.fetchval(
                "SELECT count(*) FROM consumer_inbox WHERE consumer = $1 AND message_id = $2", CONSUMER, accused
            ) == 1
            assert await dead() == [accused]  # not dead-lettered again
            assert process.alive(), log.read_text()[-3000:]
            process.process.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(process.process.wait, 120) == 0
    finally:
        await conn.close()
        indexer.cleanup()


async def _equals(count: object, expected: int) -> bool:
    assert asyncio.iscoroutine(count)
    return bool(await count == expected)


async def _at_least(count: object, expected: int) -> bool:
    assert asyncio.iscoroutine(count)
    return bool(await count >= expected)
