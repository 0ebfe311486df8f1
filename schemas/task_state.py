"""Derived task state, timer events, "what can whom do now" and agent reputation.

These are the values the lifecycle and reputation consumers publish (compacted `tasks` and
`reputation` topics) and the API serves. They are computed by pure functions in
`lifecycle.machine` and `lifecycle.reputation.rules`; see docs/lifecycle.md.

Times are block timestamps (unix seconds of chain time), never wall-clock time. Every
bound named `..._at`, `from_` or `until` is inclusive and compares with `block.timestamp`
exactly as `contracts/AgentEscrow.sol` does.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

Address = Annotated[str, StringConstraints(pattern=r"^0x[0-9a-fA-F]{40}$")]
Hash32 = Annotated[str, StringConstraints(pattern=r"^0x[0-9a-fA-F]{64}$")]
Timestamp = Annotated[int, Field(ge=0, description="Block timestamp, unix seconds")]

ZERO_ADDRESS = "0x" + "0" * 40

# Contract parameters (AgentEscrow.sol); the machine must agree with them exactly.
MAX_SUBMISSIONS = 3
APPEAL_WINDOW_SECONDS = 3 * 24 * 3600
ESCALATION_DELAY_SECONDS = 14 * 24 * 3600
FEE_BPS = 1_000
BPS_DENOMINATOR = 10_000
JUDGING_GRACE_SECONDS = 7 * 24 * 3600  # from deadline + this, anyone may escalate unjudged work
MAX_REWARD = (2**256 - 1) // BPS_DENOMINATOR  # larger rewards are refused (RewardTooLarge)

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class TaskStatus(IntEnum):
    """The escrow's status codes. Fixed: consumers store them, never renumber."""

    OPEN = 0
    ACCEPTED = 1
    SUBMITTED = 2
    FAILED = 3
    COMPLETED = 4
    DISPUTED = 5
    ESCALATED = 6
    REFUNDED = 7
    CANCELLED = 8
    RESOLVED = 9

    @property
    def is_terminal(self) -> bool:
        """True when no call can change the task any more."""
        return self in _TERMINAL


_TERMINAL = frozenset(
    {TaskStatus.COMPLETED, TaskStatus.REFUNDED, TaskStatus.CANCELLED, TaskStatus.RESOLVED}
)


class TimerKind(StrEnum):
    """Chain-time instants after which what the parties may do changes."""

    DEADLINE_PASSED = "deadline_passed"
    APPEAL_WINDOW_CLOSED = "appeal_window_closed"
    ESCALATION_COLLECTIBLE = "escalation_collectible"


class Timer(BaseModel):
    """A pending timer: it fires once, at the first chain time `>= at`."""

    model_config = _FROZEN

    kind: TimerKind
    at: Timestamp


PayoutReason = Literal[
    "verification_passed", "escalation_collected", "dispute_resolved", "refunded", "cancelled"
]


class Payout(BaseModel):
    """One transfer out of the escrow for this task (zero amounts are not transfers)."""

    model_config = _FROZEN

    recipient: Literal["agent", "platform", "poster"]
    address: Address | None = Field(
        description="Recipient address; null for the platform fee (the escrow's feeRecipient)"
    )
    amount: int = Field(gt=0, description="Token base units")
    reason: PayoutReason
    event_id: str
    deferred_to: Address | None = Field(
        default=None,
        description="Set when the token refused the transfer: the amount was credited to this"
        " address in the escrow (PaymentDeferred), to be withdrawn with `withdraw`",
    )


class TaskScoped(BaseModel):
    """The key every message about one task carries: its chain, escrow and id."""

    model_config = _FROZEN

    chain_id: int
    escrow: Address
    task_id: int

    def task_fields(self) -> dict[str, Any]:
        """The key as keyword arguments, for another message about the same task."""
        return self.model_dump(include=set(TaskScoped.model_fields))


class EventPosition(BaseModel):
    """Where an escrow event stands on its chain: its id, block, time and log index."""

    model_config = _FROZEN

    event_id: str
    block_number: int = Field(ge=0)
    block_timestamp: Timestamp
    log_index: int = Field(ge=0)

    @property
    def position(self) -> tuple[int, int]:
        """(block number, log index): the event's place in the chain."""
        return (self.block_number, self.log_index)

    def position_fields(self) -> dict[str, Any]:
        """The position as keyword arguments, for a record of what this event caused."""
        return self.model_dump(include=set(EventPosition.model_fields))


class TaskState(TaskScoped):
    """One task as the lifecycle consumer knows it, folded from the escrow's events.

    The on-chain fields mirror `AgentEscrow.getTask` (with null where the contract stores 0);
    the rest is derived: the appeal window and escalation instants, payouts, pending timers
    and the position of the last applied event.
    """

    task_id: int = Field(ge=1)
    poster: Address
    verifier: Address | None = Field(
        description="Named verifier agent; null when the marketplace verifier judges"
    )
    token: Address
    reward: int = Field(gt=0)
    deadline: Timestamp
    task_hash: Hash32
    created_at: Timestamp
    status: TaskStatus
    agent: Address | None = None
    attempts_used: int = Field(default=0, ge=0, le=MAX_SUBMISSIONS)
    last_evidence_hash: Hash32 | None = None
    judged_attempts: tuple[int, ...] = ()
    last_score: int | None = Field(default=None, ge=0, le=100)
    failed_at: Timestamp | None = Field(
        default=None, description="Time of the latest failed verdict (kept after a resubmission)"
    )
    appeal_window_closes_at: Timestamp | None = Field(
        default=None,
        description="failed_at + 3 days: the last second an agent's post-deadline dispute is accepted",
    )
    escalated_at: Timestamp | None = None
    escalation_collectible_at: Timestamp | None = Field(
        default=None, description="escalated_at + 14 days: the first second the agent may collect"
    )
    disputed: bool = False
    dispute_raised_by: Address | None = None
    agent_share_bps: int | None = Field(default=None, ge=0, le=BPS_DENOMINATOR)
    payouts: tuple[Payout, ...] = ()
    pending_timers: tuple[Timer, ...] = ()
    last_event_id: str
    last_event_name: str
    last_block_number: int = Field(ge=0)
    last_log_index: int = Field(ge=0)
    last_block_timestamp: Timestamp

    @property
    def key(self) -> tuple[int, str, int]:
        """(chain id, escrow address lower-cased, task id): the task's identity."""
        return (self.chain_id, self.escrow.lower(), self.task_id)

    @property
    def position(self) -> tuple[int, int]:
        """Chain position (block number, log index) of the last applied event."""
        return (self.last_block_number, self.last_log_index)


Actor = Literal["poster", "agent", "verifier", "arbiter", "anyone"]
Action = Literal[
    "cancel",
    "accept",
    "submit_evidence",
    "raise_dispute",
    "claim_timeout",
    "collect_escalated",
    "resolve_dispute",
    "complete_verification",
]


class Capability(BaseModel):
    """One call the escrow accepts from `actor`, for block timestamps in [from_, until].

    `from_`/`until` are inclusive bounds (null: unbounded) and hold only until the next
    event of the task changes its state. `address` is the one address that may call;
    null means: for `accept`, any address but the poster and the task's judge; for
    `anyone`, any address; for `verifier`, the marketplace verifier the escrow trusts; for
    `arbiter`, the escrow's arbiter (both named when the answer is computed with the
    escrow's `EscrowRoles`).
    """

    model_config = ConfigDict(
        frozen=True, extra="forbid", validate_by_name=True, validate_by_alias=True
    )

    actor: Actor
    action: Action
    address: Address | None = None
    from_: Timestamp | None = Field(default=None, alias="from")
    until: Timestamp | None = None
    leads_to: TaskStatus | None = Field(
        default=None, description="Status the call leads to; null when its arguments decide"
    )

    def is_open(self, now: int) -> bool:
        """Whether the escrow accepts this call in a block with timestamp `now`."""
        return (self.from_ is None or now >= self.from_) and (
            self.until is None or now <= self.until
        )


class EscrowRoles(BaseModel):
    """The escrow-wide roles as the latest `MarketplaceVerifierChanged` / `ArbiterChanged`
    events set them; lets "what can whom do" name the judge and the arbiter and leave out
    calls the escrow would refuse for a role overlap."""

    model_config = _FROZEN

    marketplace_verifier: Address
    arbiter: Address


class AllowedActions(BaseModel):
    """What can whom do on one task, as of chain time `as_of` (served by the API)."""

    model_config = _FROZEN

    chain_id: int
    escrow: Address
    task_id: int
    status: TaskStatus
    as_of: Timestamp
    capabilities: tuple[Capability, ...]


class _TimerEvent(TaskScoped):
    """Common fields of the events emitted when chain time crosses a timer."""

    kind: TimerKind
    at: Timestamp = Field(description="The timer's instant: it fired at the first time >= at")
    observed_at: Timestamp = Field(description="Chain time at which the crossing was seen")

    @property
    def timer_id(self) -> str:
        """Deterministic id, the same however often the state is recomputed."""
        return f"{self.chain_id}:{self.escrow.lower()}:{self.task_id}:{self.kind}:{self.at}"


class DeadlinePassed(_TimerEvent):
    """The deadline passed on a live task: no more accepts, submissions or poster disputes;
    the poster may claim the timeout."""

    kind: Literal[TimerKind.DEADLINE_PASSED] = TimerKind.DEADLINE_PASSED
    deadline: Timestamp


class AppealWindowClosed(_TimerEvent):
    """Three days passed since the failed verdict and the task is still Failed: after the
    deadline the agent can no longer dispute and the poster may take the refund."""

    kind: Literal[TimerKind.APPEAL_WINDOW_CLOSED] = TimerKind.APPEAL_WINDOW_CLOSED
    failed_at: Timestamp
    appeal_window_closes_at: Timestamp
    agent: Address


class EscalationCollectible(_TimerEvent):
    """Fourteen days passed since the escalation and the arbiter has not ruled: the agent
    may collect the reward."""

    kind: Literal[TimerKind.ESCALATION_COLLECTIBLE] = TimerKind.ESCALATION_COLLECTIBLE
    escalated_at: Timestamp
    agent: Address


TimerEvent = Annotated[
    DeadlinePassed | AppealWindowClosed | EscalationCollectible, Field(discriminator="kind")
]


class TimerRetracted(TaskScoped):
    """A timer event published earlier no longer holds: a reorg retracted its cause (the
    failed verdict, the escalation, the task itself) or moved chain time back before it.

    Sent on the timers topic with the task's key; `retracts` is the CloudEvents id of the
    withdrawn timer message. If the cause comes back, the timer is published again under
    a new id (`…#n`).
    """

    kind: Literal["timer_retracted"] = "timer_retracted"
    timer_kind: TimerKind
    at: Timestamp = Field(description="The withdrawn timer's instant")
    retracts: str = Field(description="CloudEvents id of the timer message withdrawn")
    cause: str = Field(description="Id of the retraction (or event) that triggered the refold")


class RoundOutcome(TaskScoped, EventPosition):
    """A verdict on one attempt (at the position of its `VerificationCompleted`), as it counts
    for the agent's reputation."""

    agent: Address
    passed: bool
    attempt: int = Field(ge=1, le=MAX_SUBMISSIONS)

    @property
    def order_key(self) -> tuple[int, int, int, int]:
        """Canonical order across chains: time, then chain, then position on the chain."""
        return (self.block_timestamp, self.chain_id, self.block_number, self.log_index)


class Reputation(BaseModel):
    """An agent's reputation: 0–100 score, failed-round count and the matching score."""

    model_config = _FROZEN

    agent: Address
    score: int = Field(ge=0, le=100)
    dispute_count: int = Field(
        ge=0, description="Failed rounds (seed 000 calls each one a dispute), never decreases"
    )
    passes: int = Field(ge=0)
    failures: int = Field(ge=0)
    matching_score: float = Field(ge=0, le=100, description="score lowered by dispute_count")
