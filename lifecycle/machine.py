"""The task lifecycle as a pure state machine over the escrow's events and chain time.

`transition(state, event, now)` applies one indexed escrow event; `advance_time(state, now)`
fires the timers chain time has crossed; `allowed_actions(state, now)` answers "what can
whom do now"; `fold(events)` rebuilds a task from its events, which is how a retraction is
undone (fold what remains). Nothing here reads a clock or does I/O: `now` is always a block
timestamp, passed in.

The rules are those of `contracts/AgentEscrow.sol` to the second; docs/lifecycle.md has the
tables. An event the contract could not have emitted from the current state raises
`TransitionError`: it means a missed, reordered or foreign event, which no retry can fix.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from schemas.task_state import (
    APPEAL_WINDOW_SECONDS,
    BPS_DENOMINATOR,
    ESCALATION_DELAY_SECONDS,
    FEE_BPS,
    JUDGING_GRACE_SECONDS,
    MAX_REWARD,
    MAX_SUBMISSIONS,
    ZERO_ADDRESS,
    Address,
    AllowedActions,
    AppealWindowClosed,
    Capability,
    DeadlinePassed,
    EscalationCollectible,
    EscrowRoles,
    EventPosition,
    Hash32,
    Payout,
    RoundOutcome,
    TaskScoped,
    TaskState,
    TaskStatus,
    Timer,
    TimerKind,
    Timestamp,
)

if TYPE_CHECKING:
    from schemas.events import EscrowEventMessage

S = TaskStatus


class TransitionError(ValueError):
    """The event cannot follow the task's state (permanent: dead-letter it, do not retry)."""


# ---------------------------------------------------------------------------- domain events


class _TaskEvent(TaskScoped, EventPosition):
    """Chain position and identity shared by every task event.

    Field names are the ABI's in snake_case; the camelCase ABI names are accepted too, so an
    indexed message's `args` validate as they are. `status` is the status the contract
    reports after the call; the machine checks that it agrees.
    """

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
    )

    task_id: int = Field(ge=1)
    status: TaskStatus


class TaskCreated(_TaskEvent):
    """`createTask` / `createTaskWithVerifier`."""

    name: Literal["TaskCreated"] = "TaskCreated"
    poster: Address
    verifier: Address | None = Field(description="Null (or the zero address) for marketplace tasks")
    token: Address
    reward: int = Field(gt=0)
    deadline: Timestamp
    task_hash: Hash32

    @field_validator("verifier")
    @classmethod
    def _zero_is_marketplace(cls, value: str | None) -> str | None:
        return None if value is None or value == ZERO_ADDRESS else value


class TaskCancelled(_TaskEvent):
    """`cancel`: the poster withdrew an Open task."""

    name: Literal["TaskCancelled"] = "TaskCancelled"
    poster: Address
    refund: int


class TaskAccepted(_TaskEvent):
    """`acceptTask`."""

    name: Literal["TaskAccepted"] = "TaskAccepted"
    agent: Address


class EvidenceSubmitted(_TaskEvent):
    """`submitEvidence`: attempt numbers run 1, 2, 3."""

    name: Literal["EvidenceSubmitted"] = "EvidenceSubmitted"
    agent: Address
    attempt: int = Field(ge=1, le=MAX_SUBMISSIONS)
    evidence_hash: Hash32


class VerificationCompleted(_TaskEvent):
    """`completeVerification`: a pass pays out, a fail records `failed_at`."""

    name: Literal["VerificationCompleted"] = "VerificationCompleted"
    verifier: Address
    attempt: int = Field(ge=1, le=MAX_SUBMISSIONS)
    evidence_hash: Hash32
    passed: bool
    score: int = Field(ge=0, le=100)
    agent: Address
    agent_payout: int = Field(ge=0)
    fee: int = Field(ge=0)
    failed_at: Timestamp


class DisputeRaised(_TaskEvent):
    """`raiseDispute`."""

    name: Literal["DisputeRaised"] = "DisputeRaised"
    by: Address
    previous_status: TaskStatus
    attempt: int = Field(ge=0, le=MAX_SUBMISSIONS)


class DisputeResolved(_TaskEvent):
    """`resolveDispute`: the arbiter's split of a Disputed or Escalated task."""

    name: Literal["DisputeResolved"] = "DisputeResolved"
    arbiter: Address
    agent_share_bps: int = Field(ge=0, le=BPS_DENOMINATOR)
    agent: Address
    agent_amount: int = Field(ge=0)
    fee: int = Field(ge=0)
    poster: Address
    poster_amount: int = Field(ge=0)
    previous_status: TaskStatus


class TaskRefunded(_TaskEvent):
    """`claimTimeout` that refunded the poster (never delivered, or failed and unappealed)."""

    name: Literal["TaskRefunded"] = "TaskRefunded"
    poster: Address
    amount: int = Field(gt=0)
    previous_status: TaskStatus


class TaskEscalated(_TaskEvent):
    """`claimTimeout` on work delivered but never judged."""

    name: Literal["TaskEscalated"] = "TaskEscalated"
    poster: Address
    agent: Address
    attempt: int = Field(ge=1, le=MAX_SUBMISSIONS)
    escalated_at: Timestamp
    collectible_at: Timestamp


class EscalationCollected(_TaskEvent):
    """`collectEscalated`: the agent took an escalated reward nobody ruled on."""

    name: Literal["EscalationCollected"] = "EscalationCollected"
    agent: Address
    agent_amount: int = Field(ge=0)
    fee: int = Field(ge=0)


class PaymentDeferred(_TaskEvent):
    """A transfer of the settling call just before it that the token refused: the escrow
    credited `amount` to `account` (withdrawn later with `withdraw`, an escrow-wide event)."""

    name: Literal["PaymentDeferred"] = "PaymentDeferred"
    account: Address
    amount: int = Field(gt=0)


DomainEvent = Annotated[
    TaskCreated
    | TaskCancelled
    | TaskAccepted
    | EvidenceSubmitted
    | VerificationCompleted
    | DisputeRaised
    | DisputeResolved
    | TaskRefunded
    | TaskEscalated
    | EscalationCollected
    | PaymentDeferred,
    Field(discriminator="name"),
]

_EVENT_TYPES: dict[str, type[_TaskEvent]] = {
    cls.__name__: cls
    for cls in (
        TaskCreated,
        TaskCancelled,
        TaskAccepted,
        EvidenceSubmitted,
        VerificationCompleted,
        DisputeRaised,
        DisputeResolved,
        TaskRefunded,
        TaskEscalated,
        EscalationCollected,
        PaymentDeferred,
    )
}


def event_from_message(message: EscrowEventMessage) -> DomainEvent | None:
    """The domain event of an indexed escrow message; None for escrow-wide events
    (key rotation, arbiter or owner changes, withdrawals), which do not belong to a task."""
    event_type = _EVENT_TYPES.get(message.event)
    if event_type is None:
        return None
    fields: dict[str, Any] = {
        **message.args,
        "event_id": message.id,
        "chain_id": message.chain_id,
        "escrow": message.escrow_address,
        "block_number": message.block_number,
        "block_timestamp": message.block_timestamp,
        "log_index": message.log_index,
    }
    event: DomainEvent = event_type.model_validate(fields)  # type: ignore[assignment]
    return event


# ---------------------------------------------------------------------------- effects


class StatePublished(BaseModel):
    """Publish the task's new state (compacted `tasks` topic, keyed by task)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["state_published"] = "state_published"
    state: TaskState


class _TimerEffect(BaseModel):
    """A timer of one task: what a scheduled and a cancelled timer both carry."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    chain_id: int
    escrow: Address
    task_id: int
    timer: Timer

    @classmethod
    def of(cls, state: TaskState, timer: Timer) -> Self:
        """The effect for `timer` of the task `state` describes."""
        return cls(chain_id=state.chain_id, escrow=state.escrow, task_id=state.task_id, timer=timer)


class TimerScheduled(_TimerEffect):
    """A timer became relevant; a scheduler may wake at `timer.at` (chain time)."""

    kind: Literal["timer_scheduled"] = "timer_scheduled"


class TimerCancelled(_TimerEffect):
    """A pending timer became moot (the task moved on before chain time reached it)."""

    kind: Literal["timer_cancelled"] = "timer_cancelled"


class RoundJudged(BaseModel):
    """A verdict landed: the reputation consumer counts it (see lifecycle.reputation.rules)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["round_judged"] = "round_judged"
    outcome: RoundOutcome


Effect = (
    StatePublished
    | TimerScheduled
    | TimerCancelled
    | RoundJudged
    | DeadlinePassed
    | AppealWindowClosed
    | EscalationCollectible
)


# ---------------------------------------------------------------------------- transitions


def transition(
    state: TaskState | None, event: DomainEvent, now: int
) -> tuple[TaskState, list[Effect]]:
    """Apply one escrow event to a task; `now` is chain time, at least the event's block time.

    Timers due by the event's block time fire first, then the event applies, then timers
    due by `now`. An event at or before the last applied position is a redelivery and
    changes nothing (no effects). Raises `TransitionError` for an event the contract could
    not have emitted from `state`.
    """
    if now < event.block_timestamp:
        raise ValueError(f"now={now} is before the event's block time {event.block_timestamp}")
    fired: list[Effect] = []
    if state is None:
        if not isinstance(event, TaskCreated):
            raise TransitionError(f"{event.name} for task {event.task_id} before its TaskCreated")
        new_state, effects = _created(event)
    else:
        if (event.chain_id, event.escrow.lower(), event.task_id) != state.key:
            raise TransitionError(f"event {event.event_id} belongs to another task")
        if event.position <= state.position:
            if event.position == state.position and event.event_id != state.last_event_id:
                raise TransitionError(
                    f"event {event.event_id} replaces applied {state.last_event_id}: retract first"
                )
            return state, []
        if event.block_timestamp < state.last_block_timestamp:
            raise TransitionError(f"event {event.event_id} goes back in chain time")
        state, fired = _fire_due(state, event.block_timestamp)
        new_state, effects = _apply(state, event)
    new_state, fired_after = _fire_due(new_state, now)
    return new_state, [*fired, *effects, *fired_after, StatePublished(state=new_state)]


def advance_time(state: TaskState, now: int) -> tuple[TaskState, list[Effect]]:
    """Fire every pending timer whose instant chain time `now` has reached, each once.

    `now` must not run ahead of events not yet applied: pass the timestamp of the newest
    block whose events are all folded in, or a timer may fire that an earlier event voids.
    """
    state, fired = _fire_due(state, now)
    if not fired:
        return state, []
    return state, [*fired, StatePublished(state=state)]


def replay(
    events: Iterable[DomainEvent], now: int | None = None
) -> tuple[TaskState | None, list[Effect]]:
    """Fold a task's events in chain order (duplicates dropped), then advance to `now`.

    The result does not depend on the order or repetition of `events`; effects come out
    as they would have live (timer ids are deterministic, so re-published ones dedupe).
    """
    unique = {event.event_id: event for event in events}
    state: TaskState | None = None
    effects: list[Effect] = []
    for event in sorted(unique.values(), key=lambda e: e.position):
        state, step = transition(state, event, event.block_timestamp)
        effects.extend(step)
    if state is not None and now is not None:
        state, step = advance_time(state, now)
        effects.extend(step)
    return state, effects


def fold(events: Iterable[DomainEvent], now: int | None = None) -> TaskState | None:
    """A task's state from its events (None when there are none, e.g. creation retracted).

    Undo is a fold of what remains: a retracted event's effect disappears with it.
    """
    return replay(events, now)[0]


def _created(event: TaskCreated) -> tuple[TaskState, list[Effect]]:
    if event.deadline <= event.block_timestamp:
        raise TransitionError(f"task {event.task_id} created with a deadline in the past")
    if event.reward > MAX_REWARD:
        raise TransitionError(f"task {event.task_id} created with a reward above the cap")
    deadline_timer = Timer(kind=TimerKind.DEADLINE_PASSED, at=event.deadline)
    state = TaskState(
        chain_id=event.chain_id,
        escrow=event.escrow,
        task_id=event.task_id,
        poster=event.poster,
        verifier=event.verifier,
        token=event.token,
        reward=event.reward,
        deadline=event.deadline,
        task_hash=event.task_hash,
        created_at=event.block_timestamp,
        status=S.OPEN,
        pending_timers=(deadline_timer,),
        last_event_id=event.event_id,
        last_event_name=event.name,
        last_block_number=event.block_number,
        last_log_index=event.log_index,
        last_block_timestamp=event.block_timestamp,
    )
    _expect_status(state, event)
    return state, [TimerScheduled.of(state, deadline_timer)]


def _apply(state: TaskState, event: DomainEvent) -> tuple[TaskState, list[Effect]]:
    """The contract's checks, in terms of the state, then the state after the call."""
    ts = event.block_timestamp
    updates: dict[str, Any]
    new_timers: list[Timer] = []
    effects: list[Effect] = []
    match event:
        case TaskCreated():
            raise TransitionError(f"task {event.task_id} created twice")
        case TaskCancelled():
            _require(state, event, S.OPEN)
            _check(event.refund == state.reward, event, "refund is not the reward")
            updates = {"status": S.CANCELLED}
            updates["payouts"] = _payouts(
                state, event, ("poster", state.poster, event.refund, "cancelled")
            )
        case TaskAccepted():
            _require(state, event, S.OPEN)
            _check(ts < state.deadline, event, "accepted at or after the deadline")
            _check(not _same(event.agent, state.poster), event, "the poster accepted")
            _check(not _same(event.agent, state.verifier), event, "the named verifier accepted")
            updates = {"status": S.ACCEPTED, "agent": event.agent}
        case EvidenceSubmitted():
            _require(state, event, S.ACCEPTED, S.FAILED)
            _check(_same(event.agent, state.agent), event, "not the holding agent")
            _check(ts < state.deadline, event, "submitted at or after the deadline")
            _check(state.attempts_used < MAX_SUBMISSIONS, event, "a fourth submission")
            _check(event.attempt == state.attempts_used + 1, event, "attempt out of sequence")
            updates = {
                "status": S.SUBMITTED,
                "attempts_used": event.attempt,
                "last_evidence_hash": event.evidence_hash,
            }
        case VerificationCompleted():
            _require(state, event, S.SUBMITTED)
            _check(event.attempt == state.attempts_used, event, "verdict on another attempt")
            _check(event.attempt not in state.judged_attempts, event, "attempt judged twice")
            _check(
                event.evidence_hash.lower() == (state.last_evidence_hash or "").lower(),
                event,
                "verdict on other evidence",
            )
            _check(_same(event.agent, state.agent), event, "verdict names another agent")
            _check(not _same(event.verifier, state.agent), event, "the agent judged its own work")
            _check(not _same(event.verifier, state.poster), event, "the poster judged its own task")
            if state.verifier is not None:
                _check(_same(event.verifier, state.verifier), event, "not the named verifier")
            updates = {
                "judged_attempts": (*state.judged_attempts, event.attempt),
                "last_score": event.score,
            }
            if event.passed:
                agent_amount, fee = _split(state.reward)
                _check((event.agent_payout, event.fee) == (agent_amount, fee), event, "wrong split")
                updates["status"] = S.COMPLETED
                updates["payouts"] = _payouts(
                    state,
                    event,
                    ("agent", state.agent, agent_amount, "verification_passed"),
                    ("platform", None, fee, "verification_passed"),
                )
            else:
                _check(event.failed_at == ts, event, "failedAt is not the block time")
                closes_at = ts + APPEAL_WINDOW_SECONDS
                updates["status"] = S.FAILED
                updates["failed_at"] = ts
                updates["appeal_window_closes_at"] = closes_at
                # The contract refuses an agent's late dispute once block.timestamp >
                # failedAt + 3 days, so the window is closed from the next second on.
                new_timers.append(Timer(kind=TimerKind.APPEAL_WINDOW_CLOSED, at=closes_at + 1))
            effects.append(RoundJudged(outcome=_outcome(state, event)))
        case DisputeRaised():
            _require(state, event, S.SUBMITTED, S.FAILED)
            _check(event.previous_status == state.status, event, "wrong previousStatus")
            _check(event.attempt == state.attempts_used, event, "wrong attempt")
            by_poster = _same(event.by, state.poster)
            _check(by_poster or _same(event.by, state.agent), event, "raised by a non-party")
            if ts >= state.deadline:
                _check(not by_poster, event, "poster dispute at or after the deadline")
                _check(state.status == S.FAILED, event, "late dispute on unjudged work")
                _check(
                    state.appeal_window_closes_at is not None
                    and ts <= state.appeal_window_closes_at,
                    event,
                    "late dispute after the appeal window",
                )
            updates = {"status": S.DISPUTED, "disputed": True, "dispute_raised_by": event.by}
        case DisputeResolved():
            _require(state, event, S.DISPUTED, S.ESCALATED)
            _check(event.previous_status == state.status, event, "wrong previousStatus")
            _check(
                not (_same(event.arbiter, state.poster) or _same(event.arbiter, state.agent)),
                event,
                "the arbiter ruled on its own dispute",
            )
            agent_gross = state.reward * event.agent_share_bps // BPS_DENOMINATOR
            agent_amount, fee = _split(agent_gross)
            poster_amount = state.reward - agent_gross
            _check(
                (event.agent_amount, event.fee, event.poster_amount)
                == (agent_amount, fee, poster_amount),
                event,
                "wrong split",
            )
            updates = {"status": S.RESOLVED, "agent_share_bps": event.agent_share_bps}
            updates["payouts"] = _payouts(
                state,
                event,
                ("agent", state.agent, agent_amount, "dispute_resolved"),
                ("platform", None, fee, "dispute_resolved"),
                ("poster", state.poster, poster_amount, "dispute_resolved"),
            )
        case TaskRefunded():
            _require(state, event, S.OPEN, S.ACCEPTED, S.FAILED)
            _check(event.previous_status == state.status, event, "wrong previousStatus")
            _check(ts >= state.deadline, event, "refund before the deadline")
            if state.status == S.FAILED:
                _check(
                    state.appeal_window_closes_at is not None
                    and ts > state.appeal_window_closes_at,
                    event,
                    "refund while the appeal window is open",
                )
            _check(event.amount == state.reward, event, "refund is not the reward")
            updates = {"status": S.REFUNDED}
            updates["payouts"] = _payouts(
                state, event, ("poster", state.poster, event.amount, "refunded")
            )
        case TaskEscalated():
            # The poster from the deadline, anyone from deadline + 7 days: the event does not
            # name the caller, so only the earlier bound can be checked.
            _require(state, event, S.SUBMITTED)
            _check(ts >= state.deadline, event, "escalated before the deadline")
            _check(_same(event.poster, state.poster), event, "names another poster")
            _check(event.attempt == state.attempts_used, event, "wrong attempt")
            _check(
                (event.escalated_at, event.collectible_at) == (ts, ts + ESCALATION_DELAY_SECONDS),
                event,
                "escalation times disagree with the block time",
            )
            updates = {
                "status": S.ESCALATED,
                "escalated_at": ts,
                "escalation_collectible_at": event.collectible_at,
            }
            new_timers.append(Timer(kind=TimerKind.ESCALATION_COLLECTIBLE, at=event.collectible_at))
        case PaymentDeferred():
            updates = {"payouts": _deferred(state, event)}
        case EscalationCollected():
            _require(state, event, S.ESCALATED)
            _check(_same(event.agent, state.agent), event, "collected by another address")
            collectible_at = state.escalation_collectible_at
            _check(collectible_at is not None and ts >= collectible_at, event, "collected early")
            agent_amount, fee = _split(state.reward)
            _check((event.agent_amount, event.fee) == (agent_amount, fee), event, "wrong split")
            updates = {"status": S.COMPLETED}
            updates["payouts"] = _payouts(
                state,
                event,
                ("agent", state.agent, agent_amount, "escalation_collected"),
                ("platform", None, fee, "escalation_collected"),
            )
    updates.update(
        last_event_id=event.event_id,
        last_event_name=event.name,
        last_block_number=event.block_number,
        last_log_index=event.log_index,
        last_block_timestamp=ts,
    )
    new_state = state.model_copy(update=updates)
    _expect_status(new_state, event)
    new_state, timer_effects = _retime(new_state, new_timers)
    return new_state, [*timer_effects, *effects]


def _retime(state: TaskState, new_timers: list[Timer]) -> tuple[TaskState, list[Effect]]:
    """Drop pending timers the new state made moot, add the new ones."""
    kept: list[Timer] = []
    effects: list[Effect] = []
    for timer in state.pending_timers:
        if _still_relevant(timer, state):
            kept.append(timer)
        else:
            effects.append(TimerCancelled.of(state, timer))
    effects.extend(TimerScheduled.of(state, timer) for timer in new_timers)
    pending = tuple(sorted([*kept, *new_timers], key=_timer_order))
    return state.model_copy(update={"pending_timers": pending}), effects


def _still_relevant(timer: Timer, state: TaskState) -> bool:
    match timer.kind:
        case TimerKind.DEADLINE_PASSED:
            return not state.status.is_terminal
        case TimerKind.APPEAL_WINDOW_CLOSED:
            return state.status == S.FAILED
        case TimerKind.ESCALATION_COLLECTIBLE:
            return state.status == S.ESCALATED


_KIND_ORDER = {kind: index for index, kind in enumerate(TimerKind)}


def _timer_order(timer: Timer) -> tuple[int, int]:
    return (timer.at, _KIND_ORDER[timer.kind])


def _fire_due(state: TaskState, now: int) -> tuple[TaskState, list[Effect]]:
    """Fire the pending timers with `at <= now`, in time order; each leaves the pending set."""
    due = [timer for timer in state.pending_timers if timer.at <= now]
    if not due:
        return state, []
    fired: list[Effect] = [_timer_event(state, timer, now) for timer in due]
    pending = tuple(timer for timer in state.pending_timers if timer.at > now)
    return state.model_copy(update={"pending_timers": pending}), fired


def _timer_event(state: TaskState, timer: Timer, now: int) -> Effect:
    key: dict[str, Any] = {
        "chain_id": state.chain_id,
        "escrow": state.escrow,
        "task_id": state.task_id,
        "at": timer.at,
        "observed_at": now,
    }
    match timer.kind:
        case TimerKind.DEADLINE_PASSED:
            return DeadlinePassed(**key, deadline=state.deadline)
        case TimerKind.APPEAL_WINDOW_CLOSED:
            assert state.failed_at is not None and state.appeal_window_closes_at is not None
            assert state.agent is not None
            return AppealWindowClosed(
                **key,
                failed_at=state.failed_at,
                appeal_window_closes_at=state.appeal_window_closes_at,
                agent=state.agent,
            )
        case TimerKind.ESCALATION_COLLECTIBLE:
            assert state.escalated_at is not None and state.agent is not None
            return EscalationCollectible(**key, escalated_at=state.escalated_at, agent=state.agent)


def _split(amount: int) -> tuple[int, int]:
    """The contract's split of an agent payout: the fee rounds down, the agent gets the rest."""
    fee = amount * FEE_BPS // BPS_DENOMINATOR
    return amount - fee, fee


def _payouts(
    state: TaskState, event: _TaskEvent, *transfers: tuple[str, str | None, int, str]
) -> tuple[Payout, ...]:
    """The state's payouts plus this event's transfers; zero amounts are skipped like the
    contract skips them."""
    new = tuple(
        Payout.model_validate(
            {
                "recipient": recipient,
                "address": address,
                "amount": amount,
                "reason": reason,
                "event_id": event.event_id,
            }
        )
        for recipient, address, amount, reason in transfers
        if amount > 0
    )
    return (*state.payouts, *new)


def _deferred(state: TaskState, event: PaymentDeferred) -> tuple[Payout, ...]:
    """The payouts with the one the token refused marked as credited to `event.account`.

    It must be a transfer of the last settling call (PaymentDeferred follows it in the same
    transaction): the agent's or poster's by address, else the platform fee.
    """
    settling = state.payouts[-1].event_id if state.payouts else None
    candidates = [
        index
        for index, payout in enumerate(state.payouts)
        if payout.event_id == settling
        and payout.deferred_to is None
        and payout.amount == event.amount
    ]
    by_address = [i for i in candidates if _same(event.account, state.payouts[i].address)]
    platform = [i for i in candidates if state.payouts[i].recipient == "platform"]
    chosen = (by_address or platform)[:1]
    _check(bool(chosen), event, "no transfer of the settling call matches")
    payouts = list(state.payouts)
    payouts[chosen[0]] = payouts[chosen[0]].model_copy(update={"deferred_to": event.account})
    return tuple(payouts)


def _outcome(state: TaskState, event: VerificationCompleted) -> RoundOutcome:
    # The state's key, not the event's: the outcome counts for the task the machine folded.
    return RoundOutcome(
        agent=event.agent, passed=event.passed, attempt=event.attempt, **state.task_fields(), **event.position_fields()
    )


def _same(address: str, other: str | None) -> bool:
    return other is not None and address.lower() == other.lower()


def _require(state: TaskState, event: _TaskEvent, *allowed: TaskStatus) -> None:
    if state.status not in allowed:
        raise TransitionError(
            f"{type(event).__name__} ({event.event_id}) on task {state.task_id}"
            f" in status {state.status.name}"
        )


def _check(condition: bool, event: _TaskEvent, reason: str) -> None:
    if not condition:
        raise TransitionError(f"{type(event).__name__} ({event.event_id}): {reason}")


def _expect_status(state: TaskState, event: _TaskEvent) -> None:
    _check(
        state.status == event.status,
        event,
        f"contract reports {event.status.name}, machine has {state.status.name}",
    )


# ---------------------------------------------------------------------------- what can whom do


def allowed_actions(
    state: TaskState, now: int, roles: EscrowRoles | None = None
) -> list[Capability]:
    """Every call the escrow accepts at chain time `now`, or will accept later by the mere
    passage of time, with its inclusive time bounds (`Capability.is_open(t)`).

    With the escrow's current `roles`, the verdict and the ruling name their address and
    are left out when the escrow would refuse them for a role overlap (the judge is the
    poster or the agent; the arbiter is a party). Without them those two name no address
    and are offered as if the roles did not overlap. Valid until the task's next event (or
    the next role change). Expired calls (`until < now`) are left out.
    """
    return [cap for cap in _capabilities(state, roles) if cap.until is None or cap.until >= now]


def allowed_actions_view(
    state: TaskState, now: int, roles: EscrowRoles | None = None
) -> AllowedActions:
    """`allowed_actions` as the record the API serves."""
    return AllowedActions(
        chain_id=state.chain_id,
        escrow=state.escrow,
        task_id=state.task_id,
        status=state.status,
        as_of=now,
        capabilities=tuple(allowed_actions(state, now, roles)),
    )


def _capabilities(state: TaskState, roles: EscrowRoles | None) -> list[Capability]:
    before_deadline = state.deadline - 1  # the contract requires block.timestamp < deadline
    poster, agent = state.poster, state.agent
    judge = state.verifier or (roles.marketplace_verifier if roles is not None else None)
    arbiter = roles.arbiter if roles is not None else None
    # Seed 000: a verifier never judges its own work, nor a task it posted (VerifierIsWorker,
    # VerifierIsPoster); a party never rules on its dispute (ArbiterIsParty).
    judge_ok = judge is None or not (_same(judge, poster) or _same(judge, agent))
    arbiter_ok = arbiter is None or not (_same(arbiter, poster) or _same(arbiter, agent))
    caps: list[Capability] = []
    match state.status:
        case S.OPEN:
            caps.append(_cap("poster", "cancel", poster, leads_to=S.CANCELLED))
            # Any address but the poster and the task's judge (named or marketplace).
            caps.append(_cap("agent", "accept", None, until=before_deadline, leads_to=S.ACCEPTED))
            caps.append(
                _cap("poster", "claim_timeout", poster, from_=state.deadline, leads_to=S.REFUNDED)
            )
        case S.ACCEPTED:
            caps.append(
                _cap("agent", "submit_evidence", agent, until=before_deadline, leads_to=S.SUBMITTED)
            )
            caps.append(
                _cap("poster", "claim_timeout", poster, from_=state.deadline, leads_to=S.REFUNDED)
            )
        case S.SUBMITTED:
            # Accepted after the deadline too, until the task is escalated.
            if judge_ok:
                caps.append(_cap("verifier", "complete_verification", judge))
            caps.append(
                _cap("poster", "raise_dispute", poster, until=before_deadline, leads_to=S.DISPUTED)
            )
            caps.append(
                _cap("agent", "raise_dispute", agent, until=before_deadline, leads_to=S.DISPUTED)
            )
            caps.append(
                _cap("poster", "claim_timeout", poster, from_=state.deadline, leads_to=S.ESCALATED)
            )
            # Delivered, never judged: after the judging grace anyone may escalate, so the
            # 14-day path to the agent's payment never waits on the poster.
            caps.append(
                _cap(
                    "anyone",
                    "claim_timeout",
                    None,
                    from_=state.deadline + JUDGING_GRACE_SECONDS,
                    leads_to=S.ESCALATED,
                )
            )
        case S.FAILED:
            assert state.appeal_window_closes_at is not None
            closes_at = state.appeal_window_closes_at
            if state.attempts_used < MAX_SUBMISSIONS:
                caps.append(
                    _cap(
                        "agent",
                        "submit_evidence",
                        agent,
                        until=before_deadline,
                        leads_to=S.SUBMITTED,
                    )
                )
            caps.append(
                _cap("poster", "raise_dispute", poster, until=before_deadline, leads_to=S.DISPUTED)
            )
            # Before the deadline the agent may always dispute; at or after it only while
            # block.timestamp <= failedAt + 3 days. The union is one interval.
            caps.append(
                _cap(
                    "agent",
                    "raise_dispute",
                    agent,
                    until=max(before_deadline, closes_at),
                    leads_to=S.DISPUTED,
                )
            )
            caps.append(
                _cap(
                    "poster",
                    "claim_timeout",
                    poster,
                    from_=max(state.deadline, closes_at + 1),
                    leads_to=S.REFUNDED,
                )
            )
        case S.DISPUTED:
            if arbiter_ok:
                caps.append(_cap("arbiter", "resolve_dispute", arbiter, leads_to=S.RESOLVED))
        case S.ESCALATED:
            if arbiter_ok:
                caps.append(_cap("arbiter", "resolve_dispute", arbiter, leads_to=S.RESOLVED))
            caps.append(
                _cap(
                    "agent",
                    "collect_escalated",
                    agent,
                    from_=state.escalation_collectible_at,
                    leads_to=S.COMPLETED,
                )
            )
        case S.COMPLETED | S.REFUNDED | S.CANCELLED | S.RESOLVED:
            pass
    return caps


def _cap(
    actor: str,
    action: str,
    address: str | None,
    *,
    from_: int | None = None,
    until: int | None = None,
    leads_to: TaskStatus | None = None,
) -> Capability:
    return Capability.model_validate(
        {
            "actor": actor,
            "action": action,
            "address": address,
            "from_": from_,
            "until": until,
            "leads_to": leads_to,
        }
    )


__all__ = [
    "AppealWindowClosed",
    "DeadlinePassed",
    "DisputeRaised",
    "DisputeResolved",
    "DomainEvent",
    "Effect",
    "EscalationCollected",
    "EscalationCollectible",
    "EvidenceSubmitted",
    "PaymentDeferred",
    "RoundJudged",
    "StatePublished",
    "TaskAccepted",
    "TaskCancelled",
    "TaskCreated",
    "TaskEscalated",
    "TaskRefunded",
    "TimerCancelled",
    "TimerScheduled",
    "TransitionError",
    "VerificationCompleted",
    "advance_time",
    "allowed_actions",
    "allowed_actions_view",
    "event_from_message",
    "fold",
    "replay",
    "transition",
]
