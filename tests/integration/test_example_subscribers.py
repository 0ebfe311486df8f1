"""The example subscribers (examples/python, examples/typescript) against the real broker.

A scripted stream with everything docs/subscribing.md tells a subscriber to handle:
redeliveries, a retraction, a reorg that moves an event, an A→B→A comeback under `#1`,
escrow-wide events, a record that is not ours, the newest-wins rule of a compacted topic, and
a restart. Both subscribers must end with exactly the expected views. (The whole-system
simulation runs them again beside the real pipeline and compares with our own consumers.)
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from runtime.kafka import ensure_topics
from schemas.cloudevents import TopicSpec
from tests.support.asyncapi_check import problems
from tests.support.subscribers import Subscriber, Views, python_subscriber, typescript_subscriber

CHAIN = 31337
ESCROW = "0x" + "Ab" * 20
AGENT = "0x" + "Cd" * 20


def _hash(n: int) -> str:
    return "0x" + f"{n:064x}"


def event(name: str, task: int | None, block: int, log: int, status: int | None, *, fork: int = 0,
          removed: bool = False, args: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """(plain event id, body) of one escrow event record."""
    block_hash = _hash(block * 1000 + fork)
    event_id = f"{CHAIN}:{block_hash}:{log}"
    body_args: dict[str, Any] = dict(args or {})
    if task is not None:
        body_args.setdefault("taskId", task)
    if status is not None:
        body_args["status"] = status
    return event_id, {
        "id": event_id, "chain_id": CHAIN, "escrow_address": ESCROW, "block_number": block,
        "block_hash": block_hash, "block_timestamp": 1_700_000_000 + block, "tx_hash": _hash(block + 7),
        "tx_index": 0, "log_index": log, "event": name, "task_id": task, "args": body_args, "removed": removed,
    }


def accepted(task: int, block: int, log: int, **kw: Any) -> tuple[str, dict[str, Any]]:
    return event("TaskAccepted", task, block, log, 1, args={"agent": AGENT}, **kw)


def submitted(task: int, block: int, log: int, **kw: Any) -> tuple[str, dict[str, Any]]:
    return event("EvidenceSubmitted", task, block, log, 2, args={"agent": AGENT, "attempt": 1, "evidenceHash": _hash(9)}, **kw)


def created(task: int, block: int, log: int) -> tuple[str, dict[str, Any]]:
    return event("TaskCreated", task, block, log, 0, args={
        "poster": AGENT, "verifier": AGENT, "token": AGENT, "reward": 10**24, "deadline": 2_000_000_000,
        "taskHash": _hash(5)})


def cancelled(task: int, block: int, log: int) -> tuple[str, dict[str, Any]]:
    return event("TaskCancelled", task, block, log, 8, args={"poster": AGENT, "refund": 10**24})


def reputation(score: int, passes: int) -> dict[str, Any]:
    return {"agent": AGENT, "score": score, "dispute_count": 1, "passes": passes, "failures": 1,
            "matching_score": score * 0.9}


class Stream:
    """Records produced to the prefixed topics, each checked against the AsyncAPI document first."""

    def __init__(self, producer: AIOKafkaProducer, prefix: str) -> None:
        self.producer, self.prefix = producer, prefix

    async def send(self, topic: str, key: str, ce_id: str | None, ce_type: str, body: Any,
                   sequence: int | None = None) -> None:
        headers = {"ce_specversion": "1.0", "ce_source": "escrowd/test", "ce_type": ce_type,
                   "content-type": "application/json"}
        if sequence is not None:
            headers["ce_sequence"] = f"{sequence:020d}"
        if ce_id is not None:
            headers["ce_id"] = ce_id
            assert problems(topic, headers, body) == [], problems(topic, headers, body)
        await self.producer.send_and_wait(
            self.prefix + topic, json.dumps(body).encode(), key=key.encode(),
            headers=[(k, v.encode()) for k, v in headers.items()],
        )

    async def event(self, record: tuple[str, dict[str, Any]], *, ce_id: str | None = None) -> None:
        event_id, body = record
        key = f"{CHAIN}:{body['task_id']}" if body["task_id"] is not None else f"{CHAIN}:escrow:{ESCROW.lower()}"
        await self.send("escrow.events.v1", key, ce_id or event_id, f"io.escrowd.escrow.{body['event']}.v1", body)

    async def retract(self, record: tuple[str, dict[str, Any]], *, incarnation: str | None = None) -> None:
        event_id, body = record
        await self.event((event_id, {**body, "removed": True}), ce_id=f"{incarnation or event_id}:removed")

    async def reputation(self, ce_id: str, body: dict[str, Any], sequence: int) -> None:
        """A reputation record as the outbox publishes it: `sequence` is its outbox row's seq."""
        await self.send("escrow.reputation.v1", AGENT.lower(), ce_id, "io.escrowd.agent.Reputation.v1", body, sequence)


async def eventually(read: Callable[[], Views], want: Views, sub: Subscriber, *, deadline: float = 180.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while read() != want:
        assert sub.running(), f"{sub.language} subscriber exited:\n{sub.tail()}"
        if loop.time() > end:
            raise AssertionError(f"{sub.language}: views {read()} != {want}\n{sub.tail()}")
        await asyncio.sleep(0.5)


Factory = Callable[[str, Path, str], Subscriber]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("language", ["python", "typescript"])
async def test_example_subscriber_handles_redeliveries_retractions_and_comebacks(
    language: str, kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    if language == "typescript" and shutil.which("node") is None:
        pytest.skip("Node.js is required by the project")
    await ensure_topics(kafka_bootstrap, [TopicSpec(topic_prefix + "escrow.events.v1", 4),
                                          TopicSpec(topic_prefix + "escrow.reputation.v1", 4, compacted=True)])
    make = python_subscriber if language == "python" else typescript_subscriber
    sub = make(kafka_bootstrap, tmp_path, f"{topic_prefix}example-{language}", topic_prefix=topic_prefix)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    stream = Stream(producer, topic_prefix)
    task_1 = f"{CHAIN}:{ESCROW.lower()}:1"
    task_2 = f"{CHAIN}:{ESCROW.lower()}:2"
    try:
        # Task 1 on the canonical chain, with a redelivery of its acceptance.
        await stream.event(created(1, 10, 0))
        await stream.event(accepted(1, 11, 0))
        original = submitted(1, 12, 3)
        await stream.event(original)
        await stream.event(accepted(1, 11, 0))  # redelivered: same ce_id, no effect
        # A reorg removes block 12 and mines the submission again in another block 12 (B).
        await stream.retract(original)
        moved = submitted(1, 12, 1, fork=1)
        await stream.event(moved)
        # ...then back to A: B's event is retracted, A's comes back as `<id>#1`.
        await stream.retract(moved)
        await stream.event(original, ce_id=f"{original[0]}#1")
        await stream.event(original, ce_id=f"{original[0]}#1")  # and redelivered
        # Task 2: created, cancelled, the cancellation retracted.
        await stream.event(created(2, 13, 0))
        cancel = cancelled(2, 14, 0)
        await stream.event(cancel)
        await stream.retract(cancel)
        # An escrow-wide event and a record that is not ours.
        await stream.event(event("OwnershipTransferred", None, 15, 0, None,
                                 args={"previousOwner": AGENT, "newOwner": AGENT}))
        await stream.send("escrow.events.v1", f"{CHAIN}:3", None, "junk", {"not": "ours"})
        poison = event("TaskAccepted", 3, 15, 1, None, args={"agent": AGENT})  # no status: cannot apply
        await stream.producer.send_and_wait(
            topic_prefix + "escrow.events.v1", json.dumps(poison[1]).encode(), key=f"{CHAIN}:3".encode(),
            headers=[("ce_id", poison[0].encode()), ("ce_type", b"io.escrowd.escrow.TaskAccepted.v1")])
        # Reputation: the newest record of the key wins; a redelivered old one changes nothing.
        await stream.reputation("reputation:a:1", reputation(50, 1), 101)
        await stream.reputation("reputation:a:2", reputation(60, 2), 102)
        await stream.reputation("reputation:a:1", reputation(50, 1), 101)
        # The publisher's batch holding a:3 failed at the broker while the next one, a:4, went
        # through; both were sent again in order. Offsets put a:3 last of the new ones, and the
        # second a:4 is a redelivery of a seen id: only the sequence says a:4 is the state.
        await stream.reputation("reputation:a:4", reputation(80, 4), 104)
        await stream.reputation("reputation:a:3", reputation(70, 3), 103)
        await stream.reputation("reputation:a:4", reputation(80, 4), 104)

        sub.start()
        want: Views = ({task_1: 2, task_2: 0}, {AGENT.lower(): (80, 1, 4, 1, 72.0)})
        await eventually(sub.views, want, sub)
        assert sub.stop() == 0

        # A restart: committed offsets and `seen` mean only the new record changes anything.
        await stream.event(accepted(1, 11, 0))  # an old one, redelivered across the restart
        await stream.event(event("VerificationCompleted", 1, 16, 2, 4, args={
            "verifier": AGENT, "attempt": 1, "evidenceHash": _hash(9), "passed": True, "score": 90,
            "agent": AGENT, "agentPayout": 9 * 10**23, "fee": 10**23, "failedAt": 0}))
        sub.start()
        await eventually(sub.views, ({task_1: 4, task_2: 0}, want[1]), sub)
    finally:
        if sub.process is not None:
            assert sub.stop() == 0, sub.tail()
        await producer.stop()
    assert "subscriber_stopped" in sub.tail()
    assert "record_skipped" in sub.tail()  # the poison record was skipped, not crash-looped on
