"""The lifecycle consumer: each task's state from the indexed events, timers from chain time.

Group `escrowd-lifecycle`, topic `escrow.events.v1`. For each task event it applies
`machine.transition` and stores the new state; a retraction (or an event the machine cannot
place, e.g. after a retraction reordered history) refolds the task from the events that
remain. Every new state goes to the compacted `escrow.tasks.v1` topic; timer events
(deadline passed, appeal window closed, escalation collectible) go to `escrow.timers.v1`.
A refold also withdraws every published timer the remaining events no longer justify
(`TimerRetracted`, e.g. "appeal window closed" after a reorg removed the failed verdict),
and a timer that comes back later is published again under a new id.

Chain time for timers is per task (`lifecycle/clock.py`): the newest confirmed
block below the first of the task's indexed events this consumer has not applied yet. When
every partition a member owns is caught up it sweeps its tasks whose next timer is due at
that time, so a timer never fires ahead of an event that precedes it on the chain, however
far the publisher or the broker lags.
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg
import structlog
from aiokafka import TopicPartition

from lifecycle import clock, machine, roles
from runtime.consumer import IdempotentConsumer, InboundMessage, PermanentError
from runtime.kafka import cloudevent_headers, iso_time
from runtime.outbox import OutboxMessage, enqueue
from schemas import jsoncodec
from schemas.events import EscrowEventMessage, message_key
from schemas.task_state import (
    AppealWindowClosed,
    DeadlinePassed,
    EscalationCollectible,
    TaskState,
    TimerRetracted,
)
from schemas.topics import DEAD_LETTERS, ESCROW_EVENTS, TASKS, TIMERS

log = structlog.get_logger(__name__)

GROUP = "escrowd-lifecycle"
_TIMER_EVENTS = (DeadlinePassed, AppealWindowClosed, EscalationCollectible)


_SWEEP_CLOCK = clock.TASK_TIME_SQL.format(chain="s.chain_id", escrow="s.escrow", task="s.task_id")


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
        key = (event_message.chain_id, event_message.escrow_address.lower(), event_message.task_id)
        # Not the event's own id: the outbox and every subscriber drop an id they have seen.
        cause = message.delivered_id
        if event_message.removed:
            await conn.execute("DELETE FROM lifecycle_events WHERE event_id = $1", event_message.id)
            await self._refold(conn, key, message.partition, cause=cause)
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
        # Recorded even when the machine ignores it: the task's clock waits for every one of
        # its indexed events to be applied (lifecycle/clock.py).
        event = machine.event_from_message(event_message)
        if inserted is None or event is None:
            return
        state = await self._load(conn, key)
        latest_position = state.position if state is not None else None
        if latest_position is not None and (event.block_number, event.log_index) <= latest_position:
            # Arrives behind the state (history rewritten by a reorg): refold everything.
            await self._refold(conn, key, message.partition, cause=cause)
            return
        try:
            new_state, effects = machine.transition(state, event, event.block_timestamp)
        except machine.TransitionError:
            await self._refold(conn, key, message.partition, cause=cause)
            return
        await self._save(conn, new_state, message.partition)
        await self._emit(conn, new_state, effects, cause=cause)

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
        now = await clock.task_time(conn, *key)
        try:
            state, effects = machine.replay(events, now)
        except machine.TransitionError as exc:
            raise PermanentError(f"task {key[2]}: events do not fold into a state: {exc}") from None
        # Every timer the remaining events justify at this chain time; the rest are withdrawn.
        justified = {(e.kind.value, e.at) for e in effects if isinstance(e, _TIMER_EVENTS)}
        await self._retract_timers(conn, key, justified, cause=cause)
        if state is None:
            await conn.execute(
                "DELETE FROM task_states WHERE chain_id = $1 AND escrow = $2 AND task_id = $3", *key
            )
            return
        await self._save(conn, state, partition)
        timers = [e for e in effects if isinstance(e, _TIMER_EVENTS)]
        await self._emit(conn, state, [*timers, machine.StatePublished(state=state)], cause=cause)

    async def _retract_timers(
        self, conn: asyncpg.Connection, key: tuple[int, str, int], justified: set[tuple[str, int]], *, cause: str
    ) -> None:
        rows = await conn.fetch(
            "SELECT kind, at, generation FROM lifecycle_fired_timers"
            " WHERE chain_id = $1 AND escrow = $2 AND task_id = $3 AND live",
            *key,
        )
        messages: list[OutboxMessage] = []
        for row in rows:
            if (row["kind"], row["at"]) in justified:
                continue
            await conn.execute(
                "UPDATE lifecycle_fired_timers SET live = false, updated_at = now()"
                " WHERE chain_id = $1 AND escrow = $2 AND task_id = $3 AND kind = $4 AND at = $5",
                *key,
                row["kind"],
                row["at"],
            )
            withdrawn = _timer_message_id(key[0], key[2], row["kind"], row["at"], row["generation"])
            retraction = TimerRetracted(
                chain_id=key[0], escrow=key[1], task_id=key[2], timer_kind=row["kind"], at=row["at"],
                retracts=withdrawn, cause=cause,
            )
            message_id = f"{withdrawn}:removed"
            messages.append(
                OutboxMessage(
                    message_id=message_id,
                    topic=self.timers_topic,
                    key=message_key(key[0], key[2], key[1]),
                    payload=jsoncodec.dumps(retraction.model_dump(mode="json")),
                    headers=cloudevent_headers(
                        id=message_id,
                        source=f"escrowd/lifecycle/{key[0]}/{key[1]}",
                        type="io.escrowd.task.TimerRetracted.v1",
                        subject=str(key[2]),
                        time=None,
                    ),
                )
            )
        await enqueue(conn, messages)

    async def _fire(self, conn: asyncpg.Connection, state: TaskState, kind: str, at: int) -> str | None:
        """Record a timer as published; its message id, or None when it is live already."""
        generation = await conn.fetchval(
            "INSERT INTO lifecycle_fired_timers AS f (chain_id, escrow, task_id, kind, at, generation, live)"
            " VALUES ($1, $2, $3, $4, $5, 0, true)"
            " ON CONFLICT (chain_id, escrow, task_id, kind, at) DO UPDATE"
            " SET live = true, generation = f.generation + 1, updated_at = now() WHERE NOT f.live"
            " RETURNING generation",
            *state.key,
            kind,
            at,
        )
        if generation is None:
            return None
        return _timer_message_id(state.chain_id, state.task_id, kind, at, generation)

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
                fired_id = await self._fire(conn, state, effect.kind.value, effect.at)
                if fired_id is None:
                    continue  # published before and still standing
                message_id = fired_id
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
            f" JOIN LATERAL ({_SWEEP_CLOCK}) t(chain_time) ON true"
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


def _timer_message_id(chain_id: int, task_id: int, kind: str, at: int, generation: int) -> str:
    """`timer:<chain>:<task>:<kind>:<at>`, with `#<n>` for the n-th comeback after a retraction."""
    base = f"timer:{chain_id}:{task_id}:{kind}:{at}"
    return f"{base}#{generation}" if generation else base


def build_consumer(
    *, bootstrap: str, database_url: str, events_topic: str = ESCROW_EVENTS, group: str = GROUP,
    tasks_topic: str = TASKS, timers_topic: str = TIMERS, dlq_topic: str | None = None,
    session_timeout_ms: int = 10_000,
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
        session_timeout_ms=session_timeout_ms,
    )
