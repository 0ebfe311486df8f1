"""Lifecycle and reputation consumers on real anvil, PostgreSQL and Kafka.

The indexer publishes the escrow's events; the consumers fold them. The tests compare the
consumers' view with the contract's own (`getTask`), undo a failed verdict with a reorg,
redeliver messages and restart consumers, and try every "can do now" answer on the chain.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import asyncpg
import httpx
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from fastapi import FastAPI

from escrowd.devnet import DAY, Devnet, EscrowRevert, text_hash
from escrowd.scenarios import every_event_type
from indexer.config import ChainConfig
from lifecycle import consumer as lifecycle_consumer
from lifecycle import roles as lifecycle_roles
from lifecycle.machine import allowed_actions
from lifecycle.reputation import consumer as reputation_consumer
from lifecycle.routes import router as lifecycle_router
from runtime.consumer import IdempotentConsumer
from runtime.db import connect, create_pool
from runtime.kafka import TopicSpec, ensure_topics, make_producer
from runtime.outbox import OutboxPublisher, unpublished
from schemas import jsoncodec
from schemas.events import event_id
from schemas.task_state import TaskState
from tests.support.hostile_tokens import block, compile_mock_tokens, escrow_over
from tests.support.indexer_harness import in_process_indexer, read_topic, wait_for


async def unpublished_nothing(conn: asyncpg.Connection) -> bool:
    """Nothing waits to be published (outbox rows and the indexer's event log)."""
    return not await unpublished(conn)


@dataclass
class Consumers:
    """The lifecycle and reputation consumers of one test, on the test's own topics."""

    database_url: str
    bootstrap: str
    prefix: str
    members: list[IdempotentConsumer] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def events_topic(self) -> str:
        return f"{self.prefix}escrow.events.v1"

    def topic(self, name: str) -> str:
        return f"{self.prefix}{name}"

    async def start(self) -> None:
        self.members = [
            lifecycle_consumer.build_consumer(
                bootstrap=self.bootstrap, database_url=self.database_url, events_topic=self.events_topic,
                group=f"{self.prefix}lifecycle", tasks_topic=self.topic("tasks"),
                timers_topic=self.topic("timers"), dlq_topic=self.topic("dlq"),
            ),
            reputation_consumer.build_consumer(
                bootstrap=self.bootstrap, database_url=self.database_url, events_topic=self.events_topic,
                group=f"{self.prefix}reputation", reputation_topic=self.topic("reputation"),
                dlq_topic=self.topic("dlq"),
            ),
        ]
        self.tasks = [asyncio.create_task(m.run()) for m in self.members]

    async def stop(self) -> None:
        for member in self.members:
            member.stop()
        for task in self.tasks:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 20)


@contextlib.asynccontextmanager
async def pipeline(
    devnet: Devnet, database_url: str, bootstrap: str, prefix: str, *, confirmations: int = 0,
    publish: bool = True,
) -> AsyncIterator[Consumers]:
    consumers = Consumers(database_url, bootstrap, prefix)
    await ensure_topics(
        bootstrap,
        [TopicSpec(consumers.events_topic, 2)]
        + [TopicSpec(consumers.topic(n), 2) for n in ("tasks", "timers", "reputation", "dlq")],
    )
    chain = ChainConfig(
        chain_id=devnet.chain_id, rpc_urls=[devnet.rpc_url], ws_url=devnet.ws_url,
        escrow_addresses=[devnet.escrow_address], confirmations=confirmations, poll_interval=0.1,
    )
    async with in_process_indexer(chain, database_url, bootstrap, consumers.events_topic, publish=publish):
        await consumers.start()
        try:
            yield consumers
        finally:
            await consumers.stop()


async def _groups_at_end(bootstrap: str, topic: str, groups: list[str], timeout: float = 60.0) -> None:
    """Positive marker: every group has committed offsets up to the topic's current end, so
    each has handled (transaction committed) every message published so far."""
    probe = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await probe.start()
    await admin.start()
    try:
        parts = [TopicPartition(topic, p) for p in sorted(probe.partitions_for_topic(topic) or ())]
        ends = await probe.end_offsets(parts)

        async def committed() -> bool:
            for group in groups:
                offsets = await admin.list_consumer_group_offsets(group, partitions=parts)
                for tp, end in ends.items():
                    done = offsets.get(tp)
                    if end > 0 and (done is None or done.offset < end):
                        return False
            return True

        await wait_for(committed, timeout=timeout, interval=0.1, what=f"{groups} at the end of {topic}")
    finally:
        await admin.close()
        await probe.stop()


async def _states(conn: asyncpg.Connection) -> dict[int, TaskState]:
    rows = await conn.fetch("SELECT state FROM task_states")
    return {s.task_id: s for s in (TaskState.model_validate(r["state"]) for r in rows)}


async def _wait_consumed(conn: asyncpg.Connection, devnet: Devnet, timeout: float = 60.0) -> dict[int, TaskState]:
    """Until every task's consumer state shows the chain's status and attempts."""
    async def caught_up() -> bool:
        states = await _states(conn)
        for task_id in range(1, devnet.task_count() + 1):
            view = devnet.get_task(task_id)
            state = states.get(task_id)
            if state is None or int(state.status) != int(view.status) or state.attempts_used != view.attempts:
                return False
        return True

    await wait_for(caught_up, timeout=timeout, interval=0.1, what="consumers caught up with the chain")
    return await _states(conn)


def _assert_matches_contract(devnet: Devnet, state: TaskState) -> None:
    view = devnet.get_task(state.task_id)
    assert int(state.status) == int(view.status), state.task_id
    assert state.attempts_used == view.attempts
    assert state.poster.lower() == view.poster.lower()
    assert state.reward == view.reward
    assert state.deadline == view.deadline
    assert (state.agent or "0x" + "0" * 40).lower() == view.agent.lower()
    assert (state.failed_at or 0) == view.failed_at
    assert (state.escalated_at or 0) == view.escalated_at
    assert state.disputed == view.disputed
    assert set(state.judged_attempts) == {a for a in (1, 2, 3) if view.judged_mask >> (a - 1) & 1}


def _expected_score(devnet: Devnet, agent: str) -> int:
    score = 100
    for log in devnet.logs():
        if log.name == "VerificationCompleted" and log.args["agent"].lower() == agent:
            score = min(100, score + 1) if log.args["passed"] else max(0, score - 10)
    return score


async def _reputation(conn: asyncpg.Connection, agent: str) -> tuple[int, int] | None:
    row = await conn.fetchrow("SELECT score, dispute_count FROM agent_reputation WHERE agent = $1", agent.lower())
    return None if row is None else (row["score"], row["dispute_count"])


async def test_consumer_state_equals_the_contract_for_every_path(
    devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """Every scripted path: the folded state equals `getTask`; reputation follows the verdicts."""
    async with pipeline(devnet, database_url, kafka_bootstrap, topic_prefix) as consumers:
        every_event_type(devnet)
        conn = await connect(database_url)
        try:
            states = await _wait_consumed(conn, devnet)
            for state in states.values():
                _assert_matches_contract(devnet, state)
            fails: dict[str, int] = {}
            passes: dict[str, int] = {}
            for log in devnet.logs():
                if log.name == "VerificationCompleted":
                    bucket = passes if log.args["passed"] else fails
                    bucket[log.args["agent"].lower()] = bucket.get(log.args["agent"].lower(), 0) + 1

            async def reputations_done() -> bool:
                for agent in set(fails) | set(passes):
                    rep = await _reputation(conn, agent)
                    if rep is None or rep[1] != fails.get(agent, 0):
                        return False
                return True

            await wait_for(reputations_done, timeout=30, what="reputation caught up")
            for agent in set(fails) | set(passes):
                rep = await _reputation(conn, agent)
                assert rep is not None
                assert rep[1] == fails.get(agent, 0)
                # Start 100, -10 per failed round, +1 per pass, clamped to 0..100, in chain order.
                assert rep[0] == _expected_score(devnet, agent)
            records = await read_topic(kafka_bootstrap, consumers.topic("tasks"), timeout=20)
            assert {int(r.key.decode().split(":")[1]) for r in records if r.key} == set(states)
        finally:
            await conn.close()


async def test_retracted_failed_verdict_restores_state_and_reputation(
    devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """A reorg drops a failed verdict: the task is Submitted again and the agent's reputation restored."""
    poster, agent = devnet.posters[0], devnet.agents[0]
    async with pipeline(devnet, database_url, kafka_bootstrap, topic_prefix):
        conn = await connect(database_url)
        try:
            task = devnet.post_task(poster)
            devnet.accept_task(task, sender=agent)
            evidence = text_hash("will be judged, then un-judged")
            devnet.submit_evidence(task, evidence, sender=agent)
            states = await _wait_consumed(conn, devnet)
            assert int(states[task].status) == 2
            devnet.complete_verification(task, 1, evidence, False, 5, sender=devnet.marketplace_verifier)
            states = await _wait_consumed(conn, devnet)
            assert int(states[task].status) == 3
            await wait_for(lambda: _reputation(conn, agent.address), timeout=20, what="reputation row")
            assert await _reputation(conn, agent.address) == (90, 1)

            devnet.reorg(1)  # the verdict's block is replaced by an empty one
            assert int(devnet.get_task(task).status) == 2
            states = await _wait_consumed(conn, devnet)
            assert int(states[task].status) == 2
            assert states[task].failed_at is None
            _assert_matches_contract(devnet, states[task])

            async def restored() -> bool:
                return await _reputation(conn, agent.address) == (100, 0)

            await wait_for(restored, timeout=20, what="reputation restored")
        finally:
            await conn.close()


async def test_duplicates_and_restarts_change_nothing(
    devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """Every event delivered twice more and both consumers restarted: same states, same reputation."""
    async with pipeline(devnet, database_url, kafka_bootstrap, topic_prefix) as consumers:
        every_event_type(devnet)
        conn = await connect(database_url)
        try:
            before = await _wait_consumed(conn, devnet)
            await wait_for(lambda: conn.fetchval("SELECT count(*) > 0 FROM agent_reputation"), timeout=20)
            groups = [f"{topic_prefix}lifecycle", f"{topic_prefix}reputation"]
            await _groups_at_end(kafka_bootstrap, consumers.events_topic, groups)
            reputation_before = [dict(r) for r in await conn.fetch(
                "SELECT agent, score, dispute_count, passes, failures FROM agent_reputation ORDER BY agent")]
            records = await read_topic(kafka_bootstrap, consumers.events_topic, timeout=20)
            assert records
            await consumers.stop()
            producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=False)
            await producer.start()
            try:
                for _ in range(2):
                    for record in reversed(records):
                        await producer.send_and_wait(
                            consumers.events_topic, jsoncodec.dumps(record.payload), key=record.key,
                            headers=[(k, v.encode()) for k, v in record.headers.items()],
                        )
            finally:
                await producer.stop()
            processed_before = await conn.fetchval("SELECT count(*) FROM consumer_inbox")
            await consumers.start()

            async def drained() -> bool:
                rows = await conn.fetchval(
                    "SELECT count(*) FROM consumer_inbox WHERE consumer = $1", f"{topic_prefix}lifecycle")
                return rows == len(records)

            await wait_for(drained, timeout=30, what="inbox stable")
            # Both groups have handled every duplicate (offsets committed after each batch's
            # transaction), so the inbox count below is final, not merely not-yet-changed.
            await _groups_at_end(kafka_bootstrap, consumers.events_topic, groups)
            assert await conn.fetchval("SELECT count(*) FROM consumer_inbox") == processed_before
            after = await _states(conn)
            assert after == before
            reputation_after = [dict(r) for r in await conn.fetch(
                "SELECT agent, score, dispute_count, passes, failures FROM agent_reputation ORDER BY agent")]
            assert reputation_after == reputation_before
        finally:
            await conn.close()


async def test_can_do_now_answers_agree_with_the_contract(
    devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """Random calls and time jumps; then every capability the consumer reports is tried on chain."""
    rng = random.Random(7)
    actors = [*devnet.posters[:2], *devnet.agents[:2], devnet.marketplace_verifier, devnet.arbiter]
    async with pipeline(devnet, database_url, kafka_bootstrap, topic_prefix):
        conn = await connect(database_url)
        try:
            tasks = [devnet.post_task(devnet.posters[i % 2], duration=rng.choice((DAY, 3 * DAY))) for i in range(6)]
            for step in range(60):
                task = rng.choice(tasks)
                actor = rng.choice(actors)
                action = rng.choice(("accept", "submit", "pass", "fail", "dispute", "resolve", "timeout",
                                     "collect", "cancel", "time"))
                view = devnet.get_task(task)
                with contextlib.suppress(EscrowRevert):
                    match action:
                        case "accept":
                            devnet.accept_task(task, sender=actor)
                        case "submit":
                            devnet.submit_evidence(task, text_hash(f"{task}-{step}"), sender=actor)
                        case "pass" | "fail":
                            devnet.complete_verification(task, view.attempts, view.last_evidence_hash,
                                                         action == "pass", 50, sender=actor)
                        case "dispute":
                            devnet.raise_dispute(task, sender=actor)
                        case "resolve":
                            devnet.resolve_dispute(task, rng.choice((0, 5_000, 10_000)))
                        case "timeout":
                            devnet.claim_timeout(task, sender=actor)
                        case "collect":
                            devnet.collect_escalated(task, sender=actor)
                        case "cancel":
                            devnet.cancel(task, sender=actor)
                        case "time":
                            devnet.increase_time(rng.choice((3600, DAY, 3 * DAY, 14 * DAY)))
            devnet.mine()
            states = await _wait_consumed(conn, devnet)
            now = devnet.now()
            checked = 0
            for task in tasks:
                state = states[task]
                _assert_matches_contract(devnet, state)
                for cap in allowed_actions(state, now + 1):
                    if not cap.is_open(now + 1):
                        continue
                    snapshot = devnet.snapshot()
                    try:
                        sender = _actor_for(devnet, state, cap.actor)
                        _try(devnet, state, cap.action, sender)  # must not revert
                        checked += 1
                    finally:
                        devnet.revert(snapshot)
            assert checked > 0
            refused = 0
            every = [("poster", a) for a in ("cancel", "claim_timeout", "raise_dispute")] + [
                ("agent", a) for a in ("accept", "submit_evidence", "raise_dispute", "collect_escalated")
            ] + [("arbiter", "resolve_dispute"), ("verifier", "complete_verification")]
            for task in tasks:
                state = states[task]
                open_now = {(c.actor, c.action) for c in allowed_actions(state, now + 1) if c.is_open(now + 1)}
                for role, action in every:
                    if (role, action) in open_now:
                        continue
                    snapshot = devnet.snapshot()
                    try:
                        try:
                            _try(devnet, state, action, _actor_for(devnet, state, role))
                        except EscrowRevert:
                            refused += 1
                        else:
                            raise AssertionError(f"task {task}: {role} could {action}, the consumer said no")
                    finally:
                        devnet.revert(snapshot)
            assert refused > 0
        finally:
            await conn.close()


def _actor_for(devnet: Devnet, state: TaskState, role: str) -> str:
    if role == "poster":
        return state.poster
    if role == "agent":
        return state.agent or devnet.agents[3].address
    if role == "arbiter":
        return devnet.arbiter.address
    if role == "anyone":
        return devnet.spare[0].address
    return state.verifier or devnet.marketplace_verifier.address


def _try(devnet: Devnet, state: TaskState, action: str, sender: str) -> None:
    task = state.task_id
    devnet.set_next_timestamp(devnet.now() + 1)
    match action:
        case "cancel":
            devnet.cancel(task, sender=sender)
        case "accept":
            devnet.accept_task(task, sender=sender)
        case "submit_evidence":
            devnet.submit_evidence(task, text_hash("probe"), sender=sender)
        case "raise_dispute":
            devnet.raise_dispute(task, sender=sender)
        case "claim_timeout":
            devnet.claim_timeout(task, sender=sender)
        case "collect_escalated":
            devnet.collect_escalated(task, sender=sender)
        case "resolve_dispute":
            devnet.resolve_dispute(task, 5_000, sender=sender)
        case "complete_verification":
            view = devnet.get_task(task)
            devnet.complete_verification(task, view.attempts, view.last_evidence_hash, True, 80, sender=sender)
        case _:
            raise AssertionError(f"unknown action {action}")


async def test_timers_fire_once_as_chain_time_crosses_them(
    devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """Deadline passed and appeal window closed are published when chain time (not wall time) passes them."""
    poster, agent = devnet.posters[0], devnet.agents[0]
    async with pipeline(devnet, database_url, kafka_bootstrap, topic_prefix) as consumers:
        conn = await connect(database_url)
        try:
            task = devnet.post_task(poster, duration=DAY)
            devnet.accept_task(task, sender=agent)
            evidence = text_hash("failing work")
            devnet.submit_evidence(task, evidence, sender=agent)
            devnet.complete_verification(task, 1, evidence, False, 0, sender=devnet.marketplace_verifier)
            await _wait_consumed(conn, devnet)
            # Every event handled (the consumer sweeps timers once caught up); none is due
            # at this chain time, so none may have been published.
            await _groups_at_end(kafka_bootstrap, consumers.events_topic, [f"{topic_prefix}lifecycle"])
            early = await read_topic(kafka_bootstrap, consumers.topic("timers"), timeout=3)
            assert [r for r in early if r.payload.get("task_id") == task] == []
            devnet.increase_time(DAY + 3 * DAY + 10)  # past the deadline and the appeal window
            devnet.mine()

            async def fired() -> bool:
                records = await read_topic(kafka_bootstrap, consumers.topic("timers"), timeout=3)
                kinds = [r.payload["kind"] for r in records if r.payload.get("task_id") == task]
                return "appeal_window_closed" in kinds and "deadline_passed" in kinds

            await wait_for(fired, timeout=40, interval=0.5, what="timers published")
            records = await read_topic(kafka_bootstrap, consumers.topic("timers"), timeout=3)
            kinds = [r.payload["kind"] for r in records if r.payload.get("task_id") == task]
            assert sorted(kinds) == ["appeal_window_closed", "deadline_passed"]
            state = (await _states(conn))[task]
            assert state.pending_timers == ()
        finally:
            await conn.close()


async def test_a_timer_is_retracted_with_its_cause(
    devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """"Appeal window closed" was published; a reorg removes the failed verdict: the timer is withdrawn."""
    poster, agent = devnet.posters[0], devnet.agents[0]
    async with pipeline(devnet, database_url, kafka_bootstrap, topic_prefix) as consumers:
        conn = await connect(database_url)
        try:
            task = devnet.post_task(poster, duration=DAY)
            devnet.accept_task(task, sender=agent)
            evidence = text_hash("failing work, later un-failed")
            devnet.submit_evidence(task, evidence, sender=agent)
            devnet.complete_verification(task, 1, evidence, False, 0, sender=devnet.marketplace_verifier)
            verdict_block = devnet.block_number()
            devnet.increase_time(DAY + 3 * DAY + 10)  # past the deadline and the appeal window

            async def timer_messages() -> list[dict[str, object]]:
                records = await read_topic(kafka_bootstrap, consumers.topic("timers"), timeout=3)
                return [r.payload for r in records if r.payload.get("task_id") == task]

            async def fired() -> bool:
                kinds = {m["kind"] for m in await timer_messages()}
                return {"appeal_window_closed", "deadline_passed"} <= kinds

            await wait_for(fired, timeout=60, interval=0.5, what="timers published")
            closed = next(m for m in await timer_messages() if m["kind"] == "appeal_window_closed")

            # The verdict's block and the later one are replaced by empty blocks.
            devnet.reorg(devnet.block_number() - verdict_block + 1)
            assert int(devnet.get_task(task).status) == 2  # Submitted: no verdict, nothing to appeal

            # The new branch's blocks carry earlier times: neither timer holds on it any more.
            assert devnet.now() < devnet.get_task(task).deadline

            async def retracted() -> bool:
                return sum(m["kind"] == "timer_retracted" for m in await timer_messages()) >= 2

            await wait_for(retracted, timeout=60, interval=0.5, what="timer retractions published")
            retractions = {m["timer_kind"]: m for m in await timer_messages() if m["kind"] == "timer_retracted"}
            assert set(retractions) == {"appeal_window_closed", "deadline_passed"}
            assert retractions["appeal_window_closed"]["at"] == closed["at"]
            prefix = f"timer:{devnet.chain_id}:{task}"
            assert retractions["appeal_window_closed"]["retracts"] == f"{prefix}:appeal_window_closed:{closed['at']}"
            assert await conn.fetchval("SELECT count(*) FROM lifecycle_fired_timers WHERE task_id = $1 AND live", task) == 0

            # Time passes the deadline again on the new branch: that timer comes back (a new
            # id, so subscribers that saw its retraction take it); the appeal window does not.
            devnet.increase_time(DAY + 10)

            async def deadline_again() -> bool:
                return [m["kind"] for m in await timer_messages()].count("deadline_passed") == 2

            await wait_for(deadline_again, timeout=60, interval=0.5, what="deadline timer published again")
            records = await read_topic(kafka_bootstrap, consumers.topic("timers"), timeout=3)
            ids = [r.headers.get("ce_id") for r in records if r.payload.get("task_id") == task]
            deadline_at = retractions["deadline_passed"]["at"]
            assert f"{prefix}:deadline_passed:{deadline_at}#1" in ids
            messages = await timer_messages()
            assert [m["kind"] for m in messages].count("appeal_window_closed") == 1
            live = await conn.fetch("SELECT kind FROM lifecycle_fired_timers WHERE task_id = $1 AND live", task)
            assert [r["kind"] for r in live] == ["deadline_passed"]
            state = (await _states(conn))[task]
            assert state.failed_at is None and int(state.status) == 2
        finally:
            await conn.close()


async def test_the_api_answers_at_the_confirmed_time_task_state_holds(
    devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """"What can whom do now" is answered at the confirmation line's time, not at the head's."""
    from api.app import create_app
    from api.settings import ApiSettings

    poster = devnet.posters[0]
    async with pipeline(devnet, database_url, kafka_bootstrap, topic_prefix, confirmations=3):
        conn = await connect(database_url)
        try:
            task = devnet.post_task(poster, duration=DAY)
            for _ in range(3):
                devnet.mine()
            await _wait_consumed(conn, devnet)
            deadline = devnet.get_task(task).deadline
            devnet.increase_time(DAY + 10)
            devnet.mine()  # the head passes the deadline; the confirmation line (3 blocks back) does not

            async def head_seen() -> bool:
                return bool(await conn.fetchval(
                    "SELECT head_timestamp > $2 FROM chain_cursor WHERE chain_id = $1", devnet.chain_id, deadline))

            await wait_for(head_seen, timeout=60, what="indexer saw the new head")
            app = create_app(ApiSettings(database_url=database_url))
            async with app.router.lifespan_context(app):
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
                    url = f"/v1/tasks/{devnet.chain_id}/{devnet.escrow_address}/{task}/state"
                    body = (await client.get(url)).json()
                    as_of = body["allowed"]["as_of"]
                    assert as_of < deadline  # the answer's clock: the confirmed block's time
                    confirmed = await conn.fetchval(
                        "SELECT b.timestamp FROM chain_cursor c JOIN chain_blocks b ON b.chain_id = c.chain_id"
                        " AND b.block_number = c.block_number - c.confirmations WHERE c.chain_id = $1",
                        devnet.chain_id,
                    )  # fmt: skip
                    assert as_of == confirmed
                    answers = {(c["actor"], c["action"]) for c in body["allowed"]["capabilities"]}
                    assert ("agent", "accept") in answers  # before the deadline, as the state knows it
                    at_head = (await client.get(url, params={"at": deadline + 10})).json()
                    assert at_head["allowed"]["as_of"] == deadline + 10
                    assert ("agent", "accept") not in {
                        (c["actor"], c["action"]) for c in at_head["allowed"]["capabilities"]
                    }
        finally:
            await conn.close()


@contextlib.asynccontextmanager
async def _publisher(database_url: str, bootstrap: str) -> AsyncIterator[None]:
    producer = make_producer(bootstrap, client_id="test-publisher")
    await producer.start()
    publisher = OutboxPublisher(database_url, producer)
    task = asyncio.create_task(publisher.run())
    try:
        yield
    finally:
        publisher.stop()
        await asyncio.wait_for(task, 20)
        await producer.stop()


async def test_a_timer_never_fires_ahead_of_an_event_still_unpublished(
    devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """The publisher stalls with a cancel in the outbox; time passes the deadline: no "deadline passed"."""
    poster = devnet.posters[0]
    async with pipeline(devnet, database_url, kafka_bootstrap, topic_prefix, publish=False):
        conn = await connect(database_url)
        try:
            async with _publisher(database_url, kafka_bootstrap):
                victim = devnet.post_task(poster, duration=DAY)
                control = devnet.post_task(poster, duration=DAY)
                await _wait_consumed(conn, devnet)
            # The publisher is stopped: what follows is indexed but reaches no consumer.
            devnet.cancel(victim, sender=poster)
            devnet.increase_time(DAY + 10)  # past both deadlines
            head = devnet.block_number()

            async def indexed() -> bool:
                cursor = await conn.fetchval("SELECT block_number FROM chain_cursor WHERE chain_id = $1", devnet.chain_id)
                return cursor is not None and cursor >= head

            await wait_for(indexed, timeout=60, what="the cancel and the time jump indexed")
            unpublished = await conn.fetchval(
                "SELECT count(*) FROM event_log_messages WHERE state <> 'published'")
            assert unpublished >= 1  # the cancel waits in the outbox
            assert await conn.fetchval("SELECT count(*) FROM escrow_events WHERE event_name = 'TaskCancelled'") == 1

            # The control task's deadline fires: the sweep ran at the new chain time...
            async def control_fired() -> bool:
                return bool(await conn.fetchval(
                    "SELECT count(*) FROM lifecycle_fired_timers WHERE task_id = $1 AND kind = 'deadline_passed'",
                    control))

            await wait_for(control_fired, timeout=60, what="the control task's deadline timer")
            # ...and in that same sweep the victim's clock stopped below its unapplied cancel.
            assert await conn.fetchval(
                "SELECT count(*) FROM lifecycle_fired_timers WHERE task_id = $1", victim) == 0
            assert (await _states(conn))[victim].status == 0  # still Open as far as the consumer knows

            async with _publisher(database_url, kafka_bootstrap):
                states = await _wait_consumed(conn, devnet)
                assert int(states[victim].status) == int(devnet.get_task(victim).status)  # Cancelled
                await wait_for(
                    lambda: unpublished_nothing(conn),
                    timeout=60, what="outbox drained",
                )  # fmt: skip
            assert await conn.fetchval(
                "SELECT count(*) FROM lifecycle_fired_timers WHERE task_id = $1", victim) == 0
            timers = await read_topic(kafka_bootstrap, f"{topic_prefix}timers", timeout=10)
            assert [r.payload["kind"] for r in timers if r.payload.get("task_id") == victim] == []
            assert [r.payload["kind"] for r in timers if r.payload.get("task_id") == control] == ["deadline_passed"]
        finally:
            await conn.close()


async def _capabilities(app: FastAPI, devnet: Devnet, task: int) -> dict[str, str | None]:
    """action -> address of the API's "what can whom do now" answer for one task."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        reply = await client.get(f"/v1/tasks/{devnet.chain_id}/{devnet.escrow_address}/{task}/state")
    assert reply.status_code == 200, reply.text
    return {c["action"]: c["address"] for c in reply.json()["allowed"]["capabilities"]}


async def test_role_changes_reach_the_can_do_now_answer(
    devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """The consumer keeps the escrow's roles from its events; the API names the judge and the
    arbiter and leaves out a verdict or ruling the chain refuses for a role overlap."""
    p, a = devnet.posters[0], devnet.agents[0]
    async with pipeline(devnet, database_url, kafka_bootstrap, topic_prefix):
        conn = await connect(database_url)
        app = FastAPI()
        app.include_router(lifecycle_router)
        app.state.pool = await create_pool(database_url)
        try:
            judged = devnet.post_task(p)
            disputed = devnet.post_task(p)
            for task in (judged, disputed):
                devnet.accept_task(task, sender=a)
                devnet.submit_evidence(task, text_hash(f"work {task}"), sender=a)
            devnet.raise_dispute(disputed, sender=a)
            await _wait_consumed(conn, devnet)

            async def roles_are(verifier: str, arbiter: str) -> bool:
                now = await lifecycle_roles.load(conn, devnet.chain_id, devnet.escrow_address)
                return now is not None and (now.marketplace_verifier, now.arbiter) == (verifier, arbiter)

            await wait_for(lambda: roles_are(devnet.marketplace_verifier.address, devnet.arbiter.address),
                           timeout=60, what="the deployment's roles")
            assert (await _capabilities(app, devnet, judged))["complete_verification"] == (
                devnet.marketplace_verifier.address
            )
            assert (await _capabilities(app, devnet, disputed))["resolve_dispute"] == devnet.arbiter.address

            devnet.set_marketplace_verifier(p)  # the poster would judge its own task
            devnet.set_arbiter(a)  # the agent would rule on its own dispute
            await wait_for(lambda: roles_are(p.address, a.address), timeout=60, what="the rotation")
            assert "complete_verification" not in await _capabilities(app, devnet, judged)
            assert "resolve_dispute" not in await _capabilities(app, devnet, disputed)
            view = devnet.get_task(judged)
            for refused_call, error in (
                (lambda: devnet.complete_verification(judged, 1, view.last_evidence_hash, True, 90, sender=p),
                 "VerifierIsPoster"),
                (lambda: devnet.resolve_dispute(disputed, 5_000, sender=a), "ArbiterIsParty"),
            ):
                snapshot = devnet.snapshot()
                try:
                    refused_call()
                except EscrowRevert as exc:
                    assert exc.name == error
                else:
                    raise AssertionError(f"the chain accepted what the answer left out ({error})")
                finally:
                    devnet.revert(snapshot)
        finally:
            await app.state.pool.close()
            await conn.close()


async def test_refused_payouts_are_indexed_credited_and_withdrawn(
    devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """Over a token that blocks the agent: the pass still completes the task, the indexer
    decodes PaymentDeferred and the consumer marks the agent's payout as credited; the
    escrow-wide Withdrawn changes no task and dead-letters nothing."""
    hostile = escrow_over(devnet, compile_mock_tokens()["BlacklistToken"])
    p, a, elsewhere = hostile.posters[0], hostile.agents[0], hostile.spare[1]
    async with pipeline(hostile, database_url, kafka_bootstrap, topic_prefix) as consumers:
        conn = await connect(database_url)
        try:
            task = hostile.post_task(p, reward=10_000_000)
            hostile.accept_task(task, sender=a)
            evidence = text_hash("work")
            hostile.submit_evidence(task, evidence, sender=a)
            block(hostile, a)
            hostile.complete_verification(task, 1, evidence, True, 90, sender=hostile.marketplace_verifier)
            receipt = hostile.withdraw(elsewhere, sender=a)
            assert hostile.balance_of(elsewhere) == 9_000_000
            withdrawn = hostile.event(receipt, "Withdrawn")
            block_hash = hostile.w3.eth.get_block(withdrawn.block_number)["hash"].to_0x_hex()
            withdrawn_id = event_id(hostile.chain_id, block_hash, withdrawn.log_index)

            async def credited() -> bool:
                state = (await _states(conn)).get(task)
                return state is not None and any(p.deferred_to is not None for p in state.payouts)

            await wait_for(credited, timeout=60, what="the credited payout in the task state")
            state = (await _states(conn))[task]
            assert [(x.recipient, x.amount, x.deferred_to) for x in state.payouts] == [
                ("agent", 9_000_000, a.address),
                ("platform", 1_000_000, None),
            ]
            assert state.last_event_name == "PaymentDeferred"

            async def withdrawn_consumed() -> bool:
                done = await conn.fetchval(
                    "SELECT count(*) FROM consumer_inbox WHERE consumer = $1 AND message_id = $2",
                    f"{consumers.prefix}lifecycle",
                    withdrawn_id,
                )
                return bool(done)

            await wait_for(withdrawn_consumed, timeout=60, what="the lifecycle consumer took Withdrawn")
            dead = await conn.fetchval("SELECT count(*) FROM dead_letters")
            assert dead == 0
        finally:
            await conn.close()
