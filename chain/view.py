"""The chain view of a task: its escrow events folded by one pure function.

`fold_task(events)` is the one fold of a task's indexed events into what the chain says
about it: the parties, the terms' hash, the status the contract reported last, every
attempt's evidence, every verdict, the dispute, the escalation. It is lenient by design
(it records what the events say, in chain order, whatever arrived first and whatever is
missing), so every reader can use it: verification routing and the API (`ChainTask` as
is), the settlement relayer (`IndexedTask`, a projection), and the lifecycle machine,
whose validated state agrees with it field by field (a stateful test checks that against
a reference escrow). Checking that the events are a sequence the contract could emit is
the lifecycle machine's job, not this fold's. Pure: no I/O; the SQL that reads the events
is `chain.indexed`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from schemas.task_state import ZERO_ADDRESS, TaskStatus


@dataclass(frozen=True)
class TaskKey:
    """A task on one escrow of one chain (escrow as an EIP-55 address)."""

    chain_id: int
    escrow: str
    task_id: int


@dataclass(frozen=True)
class ChainEvent:
    """One escrow event about a task, as indexed (`args` with the ABI's names)."""

    event_id: str
    block_number: int
    log_index: int
    tx_hash: str
    name: str
    args: Mapping[str, Any]


@dataclass(frozen=True)
class ChainVerdict:
    """A `VerificationCompleted` on chain."""

    attempt: int
    evidence_hash: str
    passed: bool
    score: int
    verifier: str
    tx_hash: str
    block_number: int


@dataclass(frozen=True)
class ChainTask:
    """A task as its escrow events tell it (the fold of the events not retracted)."""

    task_hash: str | None = None
    poster: str | None = None
    verifier: str | None = None
    deadline: int | None = None
    agent: str | None = None
    status: int | None = None
    attempts: Mapping[int, str] = field(default_factory=dict)
    """Attempt -> evidence hash (lower-case), every submission."""
    verdicts: Mapping[int, ChainVerdict] = field(default_factory=dict)
    created: bool = False
    """True once the task's `TaskCreated` is among the events."""
    token: str | None = None
    reward: int | None = None
    last_attempt: int = 0
    """The attempt of the latest `EvidenceSubmitted` in chain order (0 before any)."""
    last_score: int | None = None
    failed_at: int | None = None
    """Time of the latest failed verdict (kept after a resubmission)."""
    disputed: bool = False
    dispute_raised_by: str | None = None
    agent_share_bps: int | None = None
    escalated_at: int | None = None
    escalation_collectible_at: int | None = None

    @property
    def current_attempt(self) -> int:
        """The latest submitted attempt (0 before the first submission)."""
        return max(self.attempts, default=0)

    @property
    def submitted(self) -> bool:
        """True while the latest attempt waits for its verdict."""
        return self.status == TaskStatus.SUBMITTED

    @property
    def judged_attempts(self) -> frozenset[int]:
        """Attempts with a verdict on chain."""
        return frozenset(self.verdicts)

    def is_pending(self, attempt: int, evidence_hash: str) -> bool:
        """True when `attempt` with `evidence_hash` is the current, unjudged submission."""
        return (
            self.submitted
            and attempt == self.current_attempt
            and self.attempts.get(attempt) == evidence_hash
            and attempt not in self.verdicts
        )

    def moved_past(self, attempt: int) -> bool:
        """True when `attempt` can no longer be judged: judged on chain, or a later one exists."""
        return attempt in self.verdicts or self.current_attempt > attempt


def address_or_none(value: Any) -> str | None:
    """An address argument, None for an empty or zero address (a marketplace task's verifier)."""
    text = str(value) if value is not None else ""
    return None if not text or text.lower() == ZERO_ADDRESS else text


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def fold_task(events: Iterable[ChainEvent]) -> ChainTask:
    """The task's chain view from its events, applied in chain order (block, log index)."""
    values: dict[str, Any] = {}
    attempts: dict[int, str] = {}
    verdicts: dict[int, ChainVerdict] = {}
    for event in sorted(events, key=lambda e: (e.block_number, e.log_index)):
        args = event.args
        if "status" in args:
            values["status"] = int(args["status"])
        name = event.name
        if name == "TaskCreated":
            values.update(
                created=True,
                task_hash=str(args["taskHash"]).lower() if "taskHash" in args else None,
                poster=address_or_none(args.get("poster")),
                verifier=address_or_none(args.get("verifier")),
                deadline=_int(args.get("deadline")),
                token=address_or_none(args.get("token")),
                reward=_int(args.get("reward")),
            )
        elif name == "TaskAccepted":
            values["agent"] = address_or_none(args.get("agent"))
        elif name == "EvidenceSubmitted":
            attempt = int(args["attempt"])
            attempts[attempt] = str(args["evidenceHash"]).lower()
            values["last_attempt"] = attempt
        elif name == "VerificationCompleted":
            attempt = int(args["attempt"])
            verdict = ChainVerdict(
                attempt=attempt,
                evidence_hash=str(args.get("evidenceHash", "")).lower(),
                passed=bool(args.get("passed", False)),
                score=int(args.get("score", 0)),
                verifier=str(args.get("verifier", "")),
                tx_hash=event.tx_hash,
                block_number=event.block_number,
            )
            verdicts[attempt] = verdict
            if "score" in args:
                values["last_score"] = verdict.score
            if "passed" in args and not verdict.passed:
                values["failed_at"] = _int(args.get("failedAt"))
        elif name == "DisputeRaised":
            values.update(disputed=True, dispute_raised_by=address_or_none(args.get("by")))
        elif name == "DisputeResolved":
            values["agent_share_bps"] = _int(args.get("agentShareBps"))
        elif name == "TaskEscalated":
            values.update(escalated_at=_int(args.get("escalatedAt")), escalation_collectible_at=_int(args.get("collectibleAt")))
    return ChainTask(attempts=attempts, verdicts=verdicts, **values)
