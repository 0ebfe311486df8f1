"""A consumer process stopped by SIGTERM in the middle of a batch drains, and the restart accuses no one.

Observation 1 of the operations issue: `escrowd consume verification run` died of SIGTERM at
once, leaving its in-flight mark; the next run took the mark for a message that had killed
the process and dead-lettered an innocent event. Now SIGTERM finishes (or hands back) the
batch, clears the mark, commits, leaves the group and logs one stop line; the restart
handles every message exactly once and dead-letters none.

"In the middle of a batch" is made, not raced: the test holds uncommitted inbox rows for the
first message of each of the four partitions, so whichever batch the consumer takes first,
its inbox insert waits on one of those rows' locks with the batch's transaction open and its
in-flight mark set. SIGTERM goes in then, and the rows are rolled back: the drain has to
finish the batch it is in (at most 500 of the 1,200 messages) and stop. (Polling for the
window lost the race on a loaded machine: the consumer handled all 1,200 messages between
two polls.)
"""

from __future__ import annotations

import asyncio
import re
import signal
import tempfile
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from escrowd.devnet import anvil_key
from escrowd.harness import task_created_record
from runtime.db import connect
from runtime.kafka import TopicSpec, ensure_topics
from tests.support.indexer_harness import wait_for
from tests.support.processes import consumer_process

MESSAGES = 1200
BLOCKED_TASKS = (1, 2, 3, 4)  # the first message of partitions 1, 2, 3 and 0


@pytest.mark.parametrize("service", ["verification", "lifecycle", "reputation", "panels"])
async def test_sigterm_in_the_middle_of_a_batch_drains_and_the_restart_dead_letters_nothing(
    service: str, database_url: str, kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    names = {"events_topic": f"{topic_prefix}events", "dead_letter_topic": f"{topic_prefix}dlq"}
    argv = ["consume", service]
    extra: dict[str, str] = {}
    group = {"lifecycle": "escrowd-lifecycle", "reputation": "escrowd-reputation", "panels": "escrowd-panels"}.get(service, "")
    if service == "verification":
        argv, group = ["consume", "verification", "run"], f"{topic_prefix}verification"
        names |= {"verification_requests_topic": f"{topic_prefix}requests", "verdicts_topic": f"{topic_prefix}verdicts"}
        extra = {"ESCROWD_VERIFICATION_SIGNING_KEY": anvil_key(9)[1], "ESCROWD_VERIFICATION_GROUP": group}
    elif service in ("lifecycle", "reputation"):
        names |= {"tasks_topic": f"{topic_prefix}tasks", "timers_topic": f"{topic_prefix}timers",
                  "reputation_topic": f"{topic_prefix}reputation"}  # fmt: skip
    else:
        secret = tmp_path / "panel-secret"
        secret.write_bytes(b"s" * 32)
        extra = {"ESCROWD_PANEL_SECRET_FILE": str(secret), "ESCROWD_PANEL_SIGNING_KEY": anvil_key(8)[1]}
    await ensure_topics(
        kafka_bootstrap,
        [TopicSpec(names["events_topic"], 4)] + [TopicSpec(t, 1) for k, t in names.items() if k != "events_topic"],
    )
    env = {
        "ESCROWD_DATABASE_URL": database_url,
        "ESCROWD_KAFKA_BOOTSTRAP": kafka_bootstrap,
        **extra,
        **{f"ESCROWD_{k.upper()}": v for k, v in names.items()},
    }
    conn = await connect(database_url)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=20)
    await producer.start()
    log = Path(tempfile.mkdtemp()) / f"{service}.log"
    try:
        ids = []
        sends = []
        for task in range(1, MESSAGES + 1):
            message_id, key, payload, headers = task_created_record(names["events_topic"], task)
            ids.append(message_id)
            sends.append(await producer.send(names["events_topic"], payload, key=key, partition=task % 4, headers=headers))
        sent = await asyncio.gather(*sends)

        async def handled() -> int:
            return int(await conn.fetchval("SELECT count(*) FROM consumer_inbox WHERE consumer = $1", group))

        async def in_a_batch() -> bool:
            # The consumer's inbox insert waits on one of the held rows: its batch is open.
            # (Its in-flight mark may be uncommitted in that same transaction, so not looked for.)
            waiting = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
                " AND query LIKE 'INSERT INTO consumer_inbox%'"
            )
            return bool(waiting)

        holder = await connect(database_url)
        hold = holder.transaction()
        await hold.start()
        held = True
        await holder.executemany(
            'INSERT INTO consumer_inbox (consumer, message_id, topic, partition, "offset") VALUES ($1, $2, $3, $4, $5)',
            [(group, ids[task - 1], names["events_topic"], task % 4, sent[task - 1].offset) for task in BLOCKED_TASKS],
        )
        try:
            with consumer_process(argv, env, log) as process:
                await wait_for(in_a_batch, timeout=180, interval=0.05, what="the consumer waiting inside a batch")
                process.process.send_signal(signal.SIGTERM)
                await hold.rollback()
                held = False
                code = await asyncio.to_thread(process.process.wait, 120)
                output = log.read_text()
                assert code == 0, output[-3000:]
                assert '"consumer_stopped"' in output and '"service_stopped"' in output, output[-3000:]
                assert "Traceback" not in output
        finally:
            if held:
                await hold.rollback()
            await holder.close()
        first_run = await handled()
        assert 0 < first_run < MESSAGES  # stopped in the middle of the work
        left = await conn.fetchval(
            'SELECT count(*) FROM consumer_in_flight WHERE consumer = $1 AND "offset" IS NOT NULL', group
        )
        assert left == 0  # the mark was cleared: no message stands accused

        with consumer_process(argv, env, log) as process:
            await wait_for(lambda: _equals(handled(), MESSAGES), timeout=240, interval=0.2, what="every message handled")
            assert process.alive(), log.read_text()[-3000:]
            process.process.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(process.process.wait, 120) == 0
        assert await conn.fetchval("SELECT count(*) FROM dead_letters WHERE consumer = $1", group) == 0
        inbox = {r["message_id"] for r in await conn.fetch("SELECT message_id FROM consumer_inbox WHERE consumer = $1", group)}
        assert inbox == set(ids)  # nothing lost (and the inbox key makes twice impossible)
        assert "consumer_found_poison_marks" not in log.read_text()
        assert len(re.findall(r'"service_stopped"', log.read_text())) == 2
    finally:
        await producer.stop()
        await conn.close()


async def _equals(count: object, expected: int) -> bool:
    assert asyncio.iscoroutine(count)
    return bool(await count == expected)
