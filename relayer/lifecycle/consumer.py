"""The lifecycle consumer: each task's state from the indexed events, timers from chain time.

Group `escrowd-lifecycle`, topic `escrow.events.v1`. For each task event it applies
`machine.transition` and stores the new state; a retraction (or an event the machine cannot
place, e.g. after a retraction reordered history) refolds the task from the events that
remain. Every new state goes to the compacted `escrow.tasks.v1` topic; timer events
(deadline passed, appeal window closed, escalation collectible) go to `escrow.timers.v1`.

Chain time for timers comes from the indexer's published position: when every partition a
member owns is caught up, it sweeps its tasks whose next timer is due at the timestamp of
the newest block whose events are all published (`chain_time`), so a timer never fires
ahead of an event that precedes it on the chain.
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg
import structlog
from aiokafka import TopicPartition

from escrowd.consumer import IdempotentConsumer, InboundMessage, PermanentError
from escrowd.kafka import cloudevent_headers, iso_time
from escrowd.outbox import OutboxMessage, enqueue
from relayer.lifecycle import machine, roles
from schemas import jsoncodec
from schemas.events import EscrowEventMessage, message_key
from schemas.task_state import AppealWindowClosed, DeadlinePassed, EscalationCollectible, TaskState
from schemas.topics import DEAD_LETTERS, ESCROW_EVENTS, TASKS, TIMERS

log = structlog.get_logger(__name__)

GROUP = "escrowd-lifecycle"
_TIMER_EVENTS = (DeadlinePassed, AppealWindowClosed, EscalationCollectible)


def _next_timer_at(state: TaskState) -> int | None:
    return min((t.at for t in state.pending_timers), default=None)


class LifecycleHandler:
    """Applies escrow events to task states (the handler of the consumer)."""

    def __init__(
        self, *, events_topic: str = ESCROW_EVENTS, tasks_topic: str = TASKS, timers_topic: str = TIMERS
    ) -> None:
        self.events_topic = events_topic
        self.tasks_topic = tasks_topic
        self.timers_topic = timers_topic

    async def __call__(self, conn: asyncpg.Connection, message: InboundMessage) -> None:
        event_message = EscrowEventMessage.model_validate(message.json())
        if event_message.task_id is None:
            # Escrow-wide events belong to no task; role changes are kept for "what can
            # whom do", the rest (owner, fee recipient, withdrawals) change no task.
            await roles.record(conn, event_message)
            return
        event = machine.event_from_message(event_message)
        if event is None:
            return
        key = (event_message.chain_id, event_message.escrow_address.lower(), event_message.task_id)
        if event_message.removed:
            await conn.execute("DELETE FROM lifecycle_events WHERE event_id = $1", event_message.id)
            await self._refold(conn, key, message.partition, cause=f"{event_message.id}:removed")
            return
        inserted = await conn.fetchval(
            "INSERT INTO lifecycle_events (event_id, chain_id, escrow, task_id, block_number, log_index, message)"
            " VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING RETURNING 1",
            event_message.id,
            key[0],
            key[1],
            key[2],
            event_message.block_number,
            event_message.log_index,
            event_message.model_dump(mode="json"),
        )
        if inserted is None:
            return
        state = await self._load(conn, key)
        latest_position = state.position if state is not None else None
        if latest_position is not None and (event.block_number, event.log_index) <= latest_position:
            # Arrives behind the state (history rewritten by a reorg): refold everything.
            await self._refold(conn, key, message.partition, cause=event_message.id)
            return
        try:
            new_state, effects = machine.transition(state, event, event.block_timestamp)
        except machine.TransitionError:
            await self._refold(conn, key, message.partition, cause=event_message.id)
            return
        await self._save(conn, new_state, message.partition)
        await self._emit(conn, new_state, effects, cause=event_message.id)

    async def _load(self, conn: asyncpg.Connection, key: tuple[int, str, int]) -> TaskState | None:
        raw = await conn.fetchval(
            "SELECT state FROM task_states WHERE chain_id = $1 AND escrow = $2 AND task_id = $3", *key
        )
        return None if raw is None else TaskState.model_validate(raw)

    async def _refold(
        self, conn: asyncpg.Connection, key: tuple[int, str, int], partition: int, *, cause: str
    ) -> None:
        rows = await conn.fetch(
            "SELECT message FROM lifecycle_events WHERE chain_id = $1 AND escrow = $2 AND task_id = $3",
            *key,
        )
        events = [
            e
            for e in (machine.event_from_message(EscrowEventMessage.model_validate(r["message"])) for r in rows)
            if e is not None
        ]
        try:
            state = machine.fold(events)
        except machine.TransitionError as exc:
            raise PermanentError(f"task {key[2]}: events do not fold into a state: {exc}") from None
        if state is None:
            await conn.execute(
                "DELETE FROM task_states WHERE chain_id = $1 AND escrow = $2 AND task_id = $3", *key
            )
            return
        await self._save(conn, state, partition)
        await self._emit(conn, state, [machine.StatePublished(state=state)], cause=cause)

    async def _save(self, conn: asyncpg.Connection, state: TaskState, partition: int) -> None:
        await conn.execute(
            "INSERT INTO task_states (chain_id, escrow, task_id, status, state, next_timer_at, kafka_partition)"
            " VALUES ($1, $2, $3, $4, $5, $6, $7)"
            " ON CONFLICT (chain_id, escrow, task_id) DO UPDATE SET status = EXCLUDED.status,"
            " state = EXCLUDED.state, next_timer_at = EXCLUDED.next_timer_at,"
            " kafka_partition = EXCLUDED.kafka_partition, updated_at = now()",
            state.chain_id,
            state.escrow.lower(),
            state.task_id,
            int(state.status),
            state.model_dump(mode="json"),
            _next_timer_at(state),
            partition,
        )

    async def _emit(
        self, conn: asyncpg.Connection, state: TaskState, effects: Sequence[machine.Effect], *, cause: str
    ) -> None:
        messages: list[OutboxMessage] = []
        key = message_key(state.chain_id, state.task_id, state.escrow)
        source = f"escrowd/lifecycle/{state.chain_id}/{state.escrow}"
        for effect in effects:
            if isinstance(effect, machine.StatePublished):
                message_id = f"task-state:{state.chain_id}:{state.task_id}:{cause}"
                messages.append(
                    OutboxMessage(
                        message_id=message_id,
                        topic=self.tasks_topic,
                        key=key,
                        payload=jsoncodec.dumps(effect.state.model_dump(mode="json")),
                        headers=cloudevent_headers(
                            id=message_id,
                            source=source,
                            type="io.escrowd.task.State.v1",
                            subject=str(state.task_id),
                            time=iso_time(effect.state.last_block_timestamp),
                        ),
                    )
                )
            elif isinstance(effect, _TIMER_EVENTS):
                body = effect.model_dump(mode="json")
                message_id = f"timer:{state.chain_id}:{state.task_id}:{body['kind']}:{body.get('at', '')}"
                messages.append(
                    OutboxMessage(
                        message_id=message_id,
                        topic=self.timers_topic,
                        key=key,
                        payload=jsoncodec.dumps(body),
                        headers=cloudevent_headers(
                            id=message_id,
                            source=source,
                            type=f"io.escrowd.task.{type(effect).__name__}.v1",
                            subject=str(state.task_id),
                            time=None,
                        ),
                    )
                )
        await enqueue(conn, messages)

    async def sweep_timers(self, conn: asyncpg.Connection, assignment: frozenset[TopicPartition]) -> int:
        """Fire due timers of the tasks this member owns, at the published chain time."""
        partitions = [tp.partition for tp in assignment if tp.topic == self.events_topic]
        rows = await conn.fetch(
            "SELECT s.state, s.kafka_partition, t.chain_time FROM task_states s"
            " JOIN LATERAL (SELECT b.timestamp AS chain_time FROM chain_cursor c"
            "   JOIN chain_blocks b ON b.chain_id = c.chain_id AND b.block_number <= c.block_number - c.confirmations"
            "   WHERE c.chain_id = s.chain_id ORDER BY b.block_number DESC LIMIT 1) t ON true"
            " WHERE s.next_timer_at IS NOT NULL AND s.next_timer_at <= t.chain_time"
            " AND s.kafka_partition = ANY($1::int[])"
            " FOR UPDATE OF s SKIP LOCKED",
            partitions,
        )
        fired = 0
        for row in rows:
            state = TaskState.model_validate(row["state"])
            new_state, effects = machine.advance_time(state, row["chain_time"])
            if not effects:
                continue
            await self._save(conn, new_state, row["kafka_partition"])
            await self._emit(conn, new_state, effects, cause=f"t{row['chain_time']}")
            fired += 1
        return fired

    async def on_idle(self, conn: asyncpg.Connection, assignment: frozenset[TopicPartition]) -> None:
        """The consumer runtime's idle hook: sweep due timers."""
        fired = await self.sweep_timers(conn, assignment)
        if fired:
            log.info("timers_fired", tasks=fired)


def build_consumer(
    *, bootstrap: str, database_url: str, events_topic: str = ESCROW_EVENTS, group: str = GROUP,
    tasks_topic: str = TASKS, timers_topic: str = TIMERS, dlq_topic: str | None = None,
) -> IdempotentConsumer:
    """The lifecycle consumer group member."""
    handler = LifecycleHandler(events_topic=events_topic, tasks_topic=tasks_topic, timers_topic=timers_topic)
    return IdempotentConsumer(
        name=group,
        topics=[events_topic],
        bootstrap=bootstrap,
        database_url=database_url,
        handler=handler,
        on_idle=handler.on_idle,
        dlq_topic=dlq_topic or DEAD_LETTERS,
    )
