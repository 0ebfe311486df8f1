"""Retention: the tables that grow with traffic lose what no one can need any more.

One pruner per database (an advisory lock elects it; others wait as standbys) runs in the
indexer process, off every hot path: each cycle deletes in small batches, each batch its
own short transaction, and sleeps between cycles. What it deletes (docs/operations.md,
"Retention" has the full table):

- **consumer inboxes** (`consumer_inbox`): rows older than the broker's retention plus a
  margin, and never a row a publisher could still re-send a copy of (see `inbox_cutoff`).
  What protects a redelivered old message whose row is gone is the partition's floor
  (`consumer_inbox_floors`, migration 220): before deleting rows the pruner raises the
  floor of their (consumer, topic, partition) to the highest offset it will delete; after
  `settle_seconds` (so that no insert that started before the floor was visible can still be
  running) it deletes up to that floor. The consumer's inbox insert refuses an offset at or
  below the floor: a partition is consumed in order, so that offset was handled.
- **published outbox rows** after `outbox_keep_hours`;
- **resolved dead letters** (`resolved_at` set by the operator) after `dead_letters_keep_days`;
- **closed judging jobs** (`verification_jobs` done or dropped) after `jobs_keep_hours`. A
  job is a work item, not the record: what keeps a redelivered finalize from being judged
  again is first its inbox row or floor (a duplicate, never handled), and beneath that the
  request and verdict rows (`verification_requests` applied, one final verdict per attempt in
  `verification_results`), which the routing reads before it queues any judgement.

The audit trail (the event log, verdicts and results, proofs, settlement and ruling
transactions, panel rounds) is kept; every growing table's size is exported so an operator
sees when to partition or archive it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime, timedelta

import asyncpg
import structlog
from prometheus_client import Counter, Gauge
from pydantic import BaseModel, ConfigDict, Field

from runtime.aio import wait_event
from runtime.leader import run_as_leader

log = structlog.get_logger(__name__)

_PRUNER_LOCK = 0x7072756E  # "prun"

PRUNED = ("consumer_inbox", "outbox", "dead_letters", "verification_jobs")
"""Tables with a deletion rule."""

MEASURED = (
    *PRUNED,
    "consumer_inbox_floors",
    "escrow_events",
    "escrow_event_retractions",
    "event_log_stream_watermarks",
    "verification_requests",
    "verification_results",
    "settlement_verdicts",
    "settlement_transactions",
    "settlement_tx_versions",
    "settlement_rulings",
    "settlement_ruling_txs",
    "panel_rounds",
    "panel_seats",
    "panel_rulings",
    "lifecycle_events",
    "reputation_outcomes",
    "task_states",
)
"""Tables whose size is exported: every table that grows with traffic."""

DELETED = Counter(
    "escrowd_retention_deleted_rows_total", "Rows deleted by the retention pruner", ["table"]
)
CYCLES = Counter(
    "escrowd_retention_cycles_total", "Pruner cycles, by outcome (ok, failed)", ["outcome"]
)
OVERDUE = Gauge(
    "escrowd_retention_overdue_seconds",
    "How long the oldest row past its retention rule has been kept beyond it (0: none)",
    ["table"],
)
TABLE_BYTES = Gauge(
    "escrowd_table_bytes", "On-disk size of a table with its indexes and TOAST", ["table"]
)
TABLE_ROWS = Gauge(
    "escrowd_table_rows", "Estimated live rows of a table (pg_class.reltuples)", ["table"]
)


class RetentionConfig(BaseModel):
    """How long each pruned table keeps its rows (docs/operations.md, "Retention")."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(default=True, description="Run the retention pruner in this process")
    broker_retention_hours: float = Field(
        default=168,
        gt=0,
        description="The broker's retention of the consumed topics (Kafka's default: 7 days)",
    )
    inbox_margin_hours: float = Field(
        default=24, ge=0, description="Inbox rows live this long beyond the broker's retention"
    )
    outbox_keep_hours: float = Field(
        default=24, ge=0, description="Published outbox rows are kept this long"
    )
    dead_letters_keep_days: float = Field(
        default=30, ge=0, description="Resolved dead letters (resolved_at set) are kept this long"
    )
    jobs_keep_hours: float = Field(
        default=168,
        ge=0,
        description="Closed judging jobs (done, dropped) are kept this long after closing",
    )
    interval_seconds: float = Field(default=60, gt=0, description="Seconds between pruner cycles")
    settle_seconds: float = Field(
        default=60,
        ge=0,
        description="A raised inbox floor is visible this long before rows under it are deleted",
    )
    batch_rows: int = Field(
        default=1000, ge=1, le=100_000, description="Rows deleted per transaction"
    )
    pause_seconds: float = Field(
        default=0.05, ge=0, description="Pause between batches (yields to the hot path)"
    )


def at_start() -> None:
    """Every series at 0: the dashboards and alerts read 0, not "No data", before the first cycle."""
    for outcome in ("ok", "failed"):
        CYCLES.labels(outcome)
    for table in PRUNED:
        DELETED.labels(table)
        OVERDUE.labels(table).set(0)
    for table in MEASURED:
        TABLE_BYTES.labels(table).set(0)
        TABLE_ROWS.labels(table).set(0)


# ----------------------------------------------------------------------------- pure rules


def inbox_cutoff(
    now: datetime, config: RetentionConfig, oldest_resendable: datetime | None
) -> datetime:
    """Inbox rows processed before this instant may go.

    Broker retention plus the margin: the broker holds no copy of an older message. And
    never past `oldest_resendable`, when a publisher may still re-send a copy under a new
    offset (an outbox row tried but not marked published, an event-log window between
    `published_through` and `sending_through`): the copy's row must still be there, since a
    new offset is above every floor.
    """
    cutoff = now - timedelta(hours=config.broker_retention_hours + config.inbox_margin_hours)
    if oldest_resendable is not None:
        cutoff = min(cutoff, oldest_resendable)
    return cutoff


# ----------------------------------------------------------------------------- SQL

_OLDEST_RESENDABLE_SQL = """
SELECT least(
    (SELECT min(created_at) FROM outbox WHERE published_at IS NULL AND send_attempts > 0),
    (SELECT min(updated_at) FROM event_log_watermarks WHERE sending_through > published_through),
    (SELECT min(updated_at) FROM event_log_stream_watermarks WHERE sending_through > published_through)
)
"""

# A floor is promoted (the pruner may delete under it) once it has been visible long enough.
_PROMOTE_SQL = """
UPDATE consumer_inbox_floors SET settled_through = pruned_through
WHERE settled_through < pruned_through AND raised_at <= now() - make_interval(secs => $1)
"""

# Floors of partitions with rows past the cutoff, raised only when the last raise has settled
# (a floor raised at every cycle would never settle).
_RAISE_SQL = """
INSERT INTO consumer_inbox_floors AS f (consumer, topic, partition, pruned_through)
SELECT consumer, topic, partition, max("offset") FROM consumer_inbox
WHERE processed_at < $1 AND topic IS NOT NULL
GROUP BY consumer, topic, partition
ON CONFLICT (consumer, topic, partition) DO UPDATE
SET pruned_through = EXCLUDED.pruned_through, raised_at = now()
WHERE f.settled_through = f.pruned_through AND EXCLUDED.pruned_through > f.pruned_through
"""

_DELETE_INBOX_SQL = """
DELETE FROM consumer_inbox i WHERE (i.consumer, i.message_id) IN (
    SELECT c.consumer, c.message_id FROM consumer_inbox c
    LEFT JOIN consumer_inbox_floors f
      ON f.consumer = c.consumer AND f.topic = c.topic AND f.partition = c.partition
    WHERE c.processed_at < $1 AND (c.topic IS NULL OR c."offset" <= f.settled_through)
    LIMIT $2 FOR UPDATE OF c SKIP LOCKED)
"""

_DELETE_OUTBOX_SQL = """
DELETE FROM outbox WHERE seq IN (
    SELECT seq FROM outbox WHERE published_at < $1 ORDER BY seq LIMIT $2 FOR UPDATE SKIP LOCKED)
"""

_DELETE_DEAD_LETTERS_SQL = """
DELETE FROM dead_letters WHERE id IN (
    SELECT id FROM dead_letters WHERE resolved_at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED)
"""

# Closed jobs only: an open one (queued, judging) is work still to do, whatever its age.
_DELETE_JOBS_SQL = """
DELETE FROM verification_jobs WHERE seq IN (
    SELECT seq FROM verification_jobs WHERE state IN ('done', 'dropped') AND updated_at < $1
    LIMIT $2 FOR UPDATE SKIP LOCKED)
"""

_OVERDUE_SQL = {
    "consumer_inbox": "SELECT extract(epoch FROM $1 - min(processed_at)) FROM consumer_inbox WHERE processed_at < $1",
    "outbox": "SELECT extract(epoch FROM $1 - min(published_at)) FROM outbox WHERE published_at < $1",
    "dead_letters": "SELECT extract(epoch FROM $1 - min(resolved_at)) FROM dead_letters WHERE resolved_at < $1",
    "verification_jobs": "SELECT extract(epoch FROM $1 - min(updated_at)) FROM verification_jobs"
    " WHERE state IN ('done', 'dropped') AND updated_at < $1",
}

_SIZES_SQL = """
SELECT c.relname, pg_total_relation_size(c.oid) AS bytes, greatest(c.reltuples, 0)::bigint AS rows
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = current_schema() AND c.relkind = 'r' AND c.relname = ANY($1::text[])
"""


@dataclass(frozen=True)
class CycleResult:
    """What one cycle deleted, per table."""

    deleted: dict[str, int]


class Pruner:
    """The retention loop of one database (see the module)."""

    def __init__(self, database_url: str, config: RetentionConfig) -> None:
        self._url = database_url
        self.config = config
        self._stopping = asyncio.Event()
        # Before the service says it is ready: a scrape right after /readyz sees every series.
        at_start()

    def stop(self) -> None:
        """Ask `run` to return after the batch in flight."""
        self._stopping.set()

    async def run(self) -> None:
        """Lead (or wait as a standby), then prune every `interval_seconds` until stopped."""
        await run_as_leader(
            self._url, _PRUNER_LOCK, self._stopping, self._prune, name="retention", poll=5.0
        )

    async def _prune(self, conn: asyncpg.Connection) -> None:
        while not self._stopping.is_set():
            try:
                result = await self.cycle(conn)
            except Exception:
                CYCLES.labels("failed").inc()
                raise
            CYCLES.labels("ok").inc()
            if any(result.deleted.values()):
                log.info("retention_pruned", **result.deleted)
            await wait_event(self._stopping, self.config.interval_seconds)

    async def cycle(self, conn: asyncpg.Connection) -> CycleResult:
        """One pass over every rule, then the size metrics. Each statement is its own transaction."""
        c = self.config
        now: datetime = await conn.fetchval("SELECT now()")
        resendable: datetime | None = await conn.fetchval(_OLDEST_RESENDABLE_SQL)
        cutoffs = {
            "consumer_inbox": inbox_cutoff(now, c, resendable),
            "outbox": now - timedelta(hours=c.outbox_keep_hours),
            "dead_letters": now - timedelta(days=c.dead_letters_keep_days),
            "verification_jobs": now - timedelta(hours=c.jobs_keep_hours),
        }
        await conn.execute(_PROMOTE_SQL, c.settle_seconds)
        deleted = {
            "consumer_inbox": await self._drain(
                conn, _DELETE_INBOX_SQL, cutoffs["consumer_inbox"], "consumer_inbox"
            ),
            "outbox": await self._drain(conn, _DELETE_OUTBOX_SQL, cutoffs["outbox"], "outbox"),
            "dead_letters": await self._drain(
                conn, _DELETE_DEAD_LETTERS_SQL, cutoffs["dead_letters"], "dead_letters"
            ),
            "verification_jobs": await self._drain(
                conn, _DELETE_JOBS_SQL, cutoffs["verification_jobs"], "verification_jobs"
            ),
        }
        # After the deletes: the rows left past the cutoff get the floor they will be deleted under.
        await conn.execute(_RAISE_SQL, cutoffs["consumer_inbox"])
        rule_cutoffs = {**cutoffs, "consumer_inbox": inbox_cutoff(now, c, None)}
        for table, sql in _OVERDUE_SQL.items():
            overdue = await conn.fetchval(sql, rule_cutoffs[table])
            OVERDUE.labels(table).set(float(overdue or 0))
        for row in await conn.fetch(_SIZES_SQL, list(MEASURED)):
            TABLE_BYTES.labels(row["relname"]).set(row["bytes"])
            TABLE_ROWS.labels(row["relname"]).set(row["rows"])
        return CycleResult(deleted=deleted)

    async def _drain(self, conn: asyncpg.Connection, sql: str, cutoff: datetime, table: str) -> int:
        total = 0
        while not self._stopping.is_set():
            status = await conn.execute(sql, cutoff, self.config.batch_rows)
            count = int(status.split()[-1])
            total += count
            DELETED.labels(table).inc(count)
            if count < self.config.batch_rows:
                break
            await asyncio.sleep(self.config.pause_seconds)
        return total
