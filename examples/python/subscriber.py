"""An example subscriber of escrowd's topics: a task-state view and an agent-reputation view.

    python subscriber.py --bootstrap localhost:9092 --store views.sqlite [--group my-service]

It follows docs/subscribing.md: at-least-once delivery, deduplicated on `ce_id` in the same
SQLite transaction that applies the record, Kafka offsets committed only after that commit;
retractions (`removed: true`) undo the event they name, and a task's state is refolded from
the events that remain, so the order retractions and comebacks arrive in does not matter.

- `tasks` (from `escrow.events.v1`): a task's status is the `status` field of its newest live
  event in chain order (block number, log index). Every escrow task event carries the task's
  status after the event.
- `reputation` (from `escrow.reputation.v1`, compacted): each record is the agent's whole
  reputation; the one with the highest `ce_sequence` wins. (Offsets are not enough: a send the
  publisher retried after a broker failure can land an older record after a newer one, and the
  newer one's redelivery is then dropped as seen.)

Dependencies: aiokafka only (and the standard library). Stop it with Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sqlite3
from typing import Any

from aiokafka import AIOKafkaConsumer

EVENTS = "escrow.events.v1"
REPUTATION = "escrow.reputation.v1"
MAX_RECORD_BYTES = 1 << 20  # our own topics are hostile input too: refuse what no producer of ours sends

SCHEMA = """
CREATE TABLE IF NOT EXISTS seen (ce_id TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS task_events (
    ce_id TEXT PRIMARY KEY, chain_id INTEGER NOT NULL, escrow TEXT NOT NULL, task_id TEXT NOT NULL,
    block_number INTEGER NOT NULL, log_index INTEGER NOT NULL, status INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS task_events_task ON task_events (chain_id, escrow, task_id);
CREATE TABLE IF NOT EXISTS tasks (
    chain_id INTEGER NOT NULL, escrow TEXT NOT NULL, task_id TEXT NOT NULL, status INTEGER NOT NULL,
    PRIMARY KEY (chain_id, escrow, task_id)
);
CREATE TABLE IF NOT EXISTS reputation (
    agent TEXT PRIMARY KEY, score INTEGER NOT NULL, dispute_count INTEGER NOT NULL,
    passes INTEGER NOT NULL, failures INTEGER NOT NULL, matching_score REAL NOT NULL,
    sequence TEXT NOT NULL
);
"""


def headers_of(record: Any) -> dict[str, str]:
    return {key: (value or b"").decode("utf-8", "replace") for key, value in record.headers or ()}


def refold_task(db: sqlite3.Connection, chain_id: int, escrow: str, task_id: str) -> None:
    """The task's status from its live events: the newest one's `status`, or no row at all."""
    newest = db.execute(
        "SELECT status FROM task_events WHERE chain_id = ? AND escrow = ? AND task_id = ?"
        " ORDER BY block_number DESC, log_index DESC LIMIT 1",
        (chain_id, escrow, task_id),
    ).fetchone()
    if newest is None:
        db.execute("DELETE FROM tasks WHERE chain_id = ? AND escrow = ? AND task_id = ?", (chain_id, escrow, task_id))
    else:
        db.execute(
            "INSERT INTO tasks VALUES (?, ?, ?, ?)"
            " ON CONFLICT (chain_id, escrow, task_id) DO UPDATE SET status = excluded.status",
            (chain_id, escrow, task_id, newest[0]),
        )


def apply_event(db: sqlite3.Connection, ce_id: str, body: dict[str, Any]) -> None:
    task_id = body.get("task_id")
    if task_id is None:
        return  # an escrow-wide event (owner, verifier, arbiter changes): not about a task
    chain_id, escrow, task = int(body["chain_id"]), str(body["escrow_address"]).lower(), str(int(task_id))
    if body.get("removed"):
        # A retraction's id is `<id of the message it retracts>:removed`.
        db.execute("DELETE FROM task_events WHERE ce_id = ?", (ce_id.removesuffix(":removed"),))
    else:
        status = body["args"]["status"]
        if not isinstance(status, int) or not 0 <= status <= 9:
            raise ValueError(f"status {status!r} is not an escrow status")
        db.execute(
            "INSERT INTO task_events VALUES (?, ?, ?, ?, ?, ?, ?)",
            (ce_id, chain_id, escrow, task, int(body["block_number"]), int(body["log_index"]), status),
        )
    refold_task(db, chain_id, escrow, task)


def apply_reputation(db: sqlite3.Connection, body: dict[str, Any], sequence: str) -> None:
    """Keep the agent's record with the highest sequence (20 digits: text order is number order)."""
    if len(sequence) != 20 or not sequence.isascii() or not sequence.isdigit():
        raise ValueError("ce_sequence is not 20 digits")
    db.execute(
        "INSERT INTO reputation VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (agent) DO UPDATE SET score = excluded.score,"
        " dispute_count = excluded.dispute_count, passes = excluded.passes, failures = excluded.failures,"
        " matching_score = excluded.matching_score, sequence = excluded.sequence"
        " WHERE excluded.sequence > reputation.sequence",
        (str(body["agent"]).lower(), int(body["score"]), int(body["dispute_count"]), int(body["passes"]),
         int(body["failures"]), float(body["matching_score"]), sequence),
    )


def apply(db: sqlite3.Connection, topic: str, record: Any, topics: dict[str, str]) -> None:
    """Apply one record once: a `ce_id` seen before is a redelivery and changes nothing."""
    headers = headers_of(record)
    ce_id = headers.get("ce_id", "")
    if not ce_id or record.value is None or len(record.value) > MAX_RECORD_BYTES:
        return  # not one of ours, or far too large: a production service would dead-letter it
    if db.execute("INSERT INTO seen VALUES (?) ON CONFLICT DO NOTHING", (ce_id,)).rowcount == 0:
        return
    db.execute("SAVEPOINT record")
    try:
        body = json.loads(record.value)
        if topic == topics["events"]:
            apply_event(db, ce_id, body)
        elif topic == topics["reputation"]:
            apply_reputation(db, body, headers.get("ce_sequence", ""))
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        # Never stop a partition on one record: undo its partial effect and go on (a production
        # service would dead-letter it). It stays in `seen`, so a redelivery is skipped too.
        db.execute("ROLLBACK TO record")
        print(json.dumps({"event": "record_skipped", "ce_id": ce_id, "error": type(error).__name__}), flush=True)
    db.execute("RELEASE record")


async def run(bootstrap: str, store: str, group: str, topics: dict[str, str]) -> None:
    db = sqlite3.connect(store, isolation_level=None)
    db.executescript(SCHEMA)
    consumer = AIOKafkaConsumer(
        topics["events"], topics["reputation"], bootstrap_servers=bootstrap, group_id=group,
        enable_auto_commit=False, auto_offset_reset="earliest",
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await consumer.start()
    print(json.dumps({"event": "subscriber_started", "group": group}), flush=True)
    try:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=500, max_records=500)
            if not batch:
                continue
            db.execute("BEGIN IMMEDIATE")
            try:
                for tp, records in batch.items():
                    for record in records:
                        apply(db, tp.topic, record, topics)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            # Offsets only after the commit: a crash in between redelivers, and `seen` drops it.
            await consumer.commit({tp: records[-1].offset + 1 for tp, records in batch.items()})
    finally:
        await consumer.stop()
        db.close()
        print(json.dumps({"event": "subscriber_stopped"}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True, help="host:port of a Kafka broker")
    parser.add_argument("--store", required=True, help="SQLite file holding the views")
    parser.add_argument("--group", default="example-python-subscriber", help="Kafka consumer group")
    parser.add_argument("--events-topic", default=EVENTS, help="the escrow events topic (if renamed)")
    parser.add_argument("--reputation-topic", default=REPUTATION, help="the reputation topic (if renamed)")
    args = parser.parse_args()
    topics = {"events": args.events_topic, "reputation": args.reputation_topic}
    asyncio.run(run(args.bootstrap, args.store, args.group, topics))


if __name__ == "__main__":
    main()
