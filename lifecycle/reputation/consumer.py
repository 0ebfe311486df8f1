"""The reputation consumer: per agent a 0–100 score and a dispute count, from the verdicts.

Group `escrowd-reputation`, topic `escrow.events.v1`. Each `VerificationCompleted` is one
round for the agent (a failed round costs 10 and adds a dispute; a pass adds the configured
step). The agent's reputation is refolded from its stored outcomes on every change, so a
retracted verdict (a reorg) is undone exactly, whatever order messages arrive in. Each new
reputation goes to the compacted `escrow.reputation.v1` topic keyed by agent.
"""

from __future__ import annotations

import asyncpg

from lifecycle.reputation.rules import DEFAULT_RULES, ReputationRules, fold
from runtime.consumer import IdempotentConsumer, InboundMessage
from runtime.kafka import cloudevent_headers
from runtime.outbox import OutboxMessage, enqueue
from schemas import jsoncodec
from schemas.events import EscrowEventMessage
from schemas.task_state import Reputation, RoundOutcome
from schemas.topics import DEAD_LETTERS, ESCROW_EVENTS, REPUTATION

GROUP = "escrowd-reputation"


def outcome_of(message: EscrowEventMessage) -> RoundOutcome:
    """The round a VerificationCompleted event reports."""
    args = message.args
    assert message.task_id is not None
    return RoundOutcome(
        agent=args["agent"],
        passed=bool(args["passed"]),
        chain_id=message.chain_id,
        escrow=message.escrow_address,
        task_id=message.task_id,
        attempt=int(args["attempt"]),
        event_id=message.id,
        block_number=message.block_number,
        log_index=message.log_index,
        block_timestamp=message.block_timestamp,
    )


class ReputationHandler:
    """Keeps `agent_reputation` equal to the fold of each agent's verdicts."""

    def __init__(self, *, rules: ReputationRules = DEFAULT_RULES, topic: str = REPUTATION) -> None:
        self.rules = rules
        self.topic = topic

    async def __call__(self, conn: asyncpg.Connection, message: InboundMessage) -> None:
        event = EscrowEventMessage.model_validate(message.json())
        if event.event != "VerificationCompleted":
            return
        outcome = outcome_of(event)
        agent = outcome.agent.lower()
        # An agent's verdicts come from many tasks, so from every member of the group at once.
        # The agent's lock, taken before its outcomes are read, makes each fold include every
        # verdict committed before it, and gives the agent's outbox rows their seqs in commit
        # order (the publisher keeps that order on the topic).
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext('agent_reputation'), hashtext($1))", agent)
        if event.removed:
            await conn.execute("DELETE FROM reputation_outcomes WHERE event_id = $1", event.id)
        else:
            await conn.execute(
                "INSERT INTO reputation_outcomes (event_id, agent, passed, chain_id, escrow, task_id, attempt,"
                " block_number, log_index, block_timestamp) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
                " ON CONFLICT DO NOTHING",
                outcome.event_id,
                agent,
                outcome.passed,
                outcome.chain_id,
                outcome.escrow.lower(),
                outcome.task_id,
                outcome.attempt,
                outcome.block_number,
                outcome.log_index,
                outcome.block_timestamp,
            )
        reputation = await self.recompute(conn, agent)
        # Not the event's own id: the outbox and every subscriber drop an id they have seen.
        message_id = f"reputation:{agent}:{message.delivered_id}"
        await enqueue(
            conn,
            [
                OutboxMessage(
                    message_id=message_id,
                    topic=self.topic,
                    key=agent.encode(),
                    payload=jsoncodec.dumps(reputation.model_dump(mode="json")),
                    headers=cloudevent_headers(
                        id=message_id,
                        source="escrowd/reputation",
                        type="io.escrowd.agent.Reputation.v1",
                        subject=agent,
                        time=None,
                    ),
                )
            ],
        )

    async def recompute(self, conn: asyncpg.Connection, agent: str) -> Reputation:
        """Refold the agent from its stored outcomes and store the result."""
        rows = await conn.fetch(
            "SELECT event_id, agent, passed, chain_id, escrow, task_id, attempt, block_number, log_index,"
            " block_timestamp FROM reputation_outcomes WHERE agent = $1",
            agent,
        )
        # The columns are the outcome's fields; task_id is NUMERIC (a uint256) in the table.
        outcomes = [RoundOutcome(**{**dict(r), "task_id": int(r["task_id"])}) for r in rows]
        reputation = fold(agent, outcomes, self.rules)
        await conn.execute(
            "INSERT INTO agent_reputation (agent, score, dispute_count, passes, failures, matching_score)"
            " VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (agent) DO UPDATE SET score = EXCLUDED.score,"
            " dispute_count = EXCLUDED.dispute_count, passes = EXCLUDED.passes, failures = EXCLUDED.failures,"
            " matching_score = EXCLUDED.matching_score, updated_at = now()",
            agent,
            reputation.score,
            reputation.dispute_count,
            reputation.passes,
            reputation.failures,
            reputation.matching_score,
        )
        return reputation


def build_consumer(
    *,
    bootstrap: str,
    database_url: str,
    events_topic: str = ESCROW_EVENTS,
    group: str = GROUP,
    rules: ReputationRules = DEFAULT_RULES,
    reputation_topic: str = REPUTATION,
    dlq_topic: str = DEAD_LETTERS,
    session_timeout_ms: int = 10_000,
) -> IdempotentConsumer:
    """The reputation consumer group member."""
    return IdempotentConsumer(
        name=group,
        topics=[events_topic],
        bootstrap=bootstrap,
        database_url=database_url,
        handler=ReputationHandler(rules=rules, topic=reputation_topic),
        dlq_topic=dlq_topic,
        session_timeout_ms=session_timeout_ms,
    )
