"""The task state machine against an independent reference model of AgentEscrow.sol.

`RefEscrow` is a line-by-line port of the contract's checks (written from the Solidity, not
from the machine). The stateful test drives random calls by every party with random and
boundary time jumps; after every step the machine's state must equal the reference's
storage, its "what can whom do" answer must match what the reference accepts now and at
every boundary ahead, timers must have fired exactly when and once, and folding the events
(in any order, after any reorg) must give the same state.
"""

from __future__ import annotations

import copy
import random as random_module
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import event as note_coverage
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from chain.view import ChainEvent, fold_task
from lifecycle import machine as m
from lifecycle.machine import (
    AppealWindowClosed,
    DeadlinePassed,
    EscalationCollectible,
    RoundJudged,
    StatePublished,
    TimerCancelled,
    TimerScheduled,
    TransitionError,
    advance_time,
    allowed_actions,
    allowed_actions_view,
    event_from_message,
    fold,
    replay,
    transition,
)
from schemas.task_state import (
    MAX_REWARD,
    Capability,
    EscrowRoles,
    TaskState,
    TaskStatus,
    TimerKind,
)

DAY = 86_400
APPEAL = 3 * DAY
ESCALATION = 14 * DAY
GRACE = 7 * DAY  # judging grace: from deadline + GRACE anyone may escalate unjudged work
ZERO = "0x" + "00" * 20
ZERO32 = "0x" + "00" * 32
CHAIN = 31337
ESCROW = "0x" + "e5" * 20
TOKEN = "0x" + "70" * 20
POSTER = "0x" + "01" * 20
AGENT = "0x" + "02" * 20
STRANGER = "0x" + "03" * 20
NAMED_VERIFIER = "0x" + "04" * 20
MARKETPLACE = "0x" + "05" * 20
ARBITER = "0x" + "06" * 20
FEE = "0x" + "08" * 20  # the fee recipient
TASK_HASH = "0x" + "7a" * 32
SENDERS = (POSTER, AGENT, STRANGER, NAMED_VERIFIER, MARKETPLACE, ARBITER)
ACTIONS = (
    "cancel",
    "accept",
    "submit_evidence",
    "raise_dispute",
    "claim_timeout",
    "collect_escalated",
    "resolve_dispute",
    "complete_verification",
)
OPEN, ACCEPTED, SUBMITTED, FAILED, COMPLETED, DISPUTED, ESCALATED, REFUNDED, CANCELLED, RESOLVED = (
    range(10)
)
TERMINAL = {COMPLETED, REFUNDED, CANCELLED, RESOLVED}


class Revert(Exception):
    """The reference contract refused the call."""


@dataclass
class RefEscrow:
    """AgentEscrow.sol for one task, ported check by check. The parties' addresses are
    distinct; the marketplace verifier and the arbiter may be rotated onto any of them, and
    the token may refuse transfers to some addresses (`blocked`: those payouts are credited
    and announced with PaymentDeferred)."""

    poster: str
    verifier: str  # ZERO: the marketplace verifier judges
    reward: int
    deadline: int
    status: int = OPEN
    attempts: int = 0
    judged: set[int] = field(default_factory=set)
    disputed: bool = False
    agent: str = ZERO
    failed_at: int = 0
    escalated_at: int = 0
    last_evidence: str = ZERO32
    marketplace: str = MARKETPLACE
    arbiter: str = ARBITER
    blocked: set[str] = field(default_factory=set)
    # (recipient, amount, credited-to address or None when delivered)
    transfers: list[tuple[str, int, str | None]] = field(default_factory=list)
    deferred: list[dict[str, Any]] = field(default_factory=list)  # of the last call
    # Which timers fired, and at which instant: the reference's own reading of the rules.
    fired: set[tuple[str, int]] = field(default_factory=set)

    def clone(self) -> RefEscrow:
        twin = copy.copy(self)
        twin.judged, twin.transfers, twin.fired = (
            set(self.judged),
            list(self.transfers),
            set(self.fired),
        )
        twin.blocked, twin.deferred = set(self.blocked), list(self.deferred)
        return twin

    def judge(self) -> str:
        return self.verifier if self.verifier != ZERO else self.marketplace

    def roles(self) -> EscrowRoles:
        return EscrowRoles(marketplace_verifier=self.marketplace, arbiter=self.arbiter)

    def call(self, sender: str, action: str, now: int, **args: Any) -> tuple[str, dict[str, Any]]:
        """Run a call in a block at `now`; raises Revert like the contract would. The
        PaymentDeferred events the call emits after its task event are in `deferred`."""
        self.deferred = []
        result: tuple[str, dict[str, Any]] = getattr(self, "_" + action)(sender, now, **args)
        return result

    def accepts(self, sender: str, action: str, now: int) -> bool:
        """Whether the call, with valid arguments, would succeed at `now` (no state change)."""
        try:
            self.clone().call(sender, action, now, **self.valid_args(action))
        except Revert:
            return False
        return True

    def valid_args(self, action: str) -> dict[str, Any]:
        if action == "submit_evidence":
            return {"evidence_hash": "0x" + f"{self.attempts + 1:064x}"}
        if action == "complete_verification":
            return {
                "attempt": self.attempts,
                "evidence_hash": self.last_evidence,
                "passed": True,
                "score": 80,
            }
        if action == "resolve_dispute":
            return {"share_bps": 5_000}
        return {}

    def _split(self, amount: int) -> tuple[int, int]:
        fee = amount * 1000 // 10_000
        return amount - fee, fee

    def _pay(self, recipient: str, address: str, amount: int) -> None:
        """_send: push, or credit when the token refuses the recipient."""
        if address in self.blocked:
            self.transfers.append((recipient, amount, address))
            self.deferred.append({"account": address, "amount": amount})
        else:
            self.transfers.append((recipient, amount, None))

    def _pay_agent(self, amount: int, fee: int) -> None:
        if amount:
            self._pay("agent", self.agent, amount)
        if fee:
            self._pay("platform", FEE, fee)

    def _cancel(self, s: str, now: int) -> tuple[str, dict[str, Any]]:
        if s != self.poster:
            raise Revert("NotPoster")
        if self.status != OPEN:
            raise Revert("WrongStatus")
        self.status = CANCELLED
        self._pay("poster", self.poster, self.reward)
        return "TaskCancelled", {"poster": s, "refund": self.reward, "status": CANCELLED}

    def _accept(self, s: str, now: int) -> tuple[str, dict[str, Any]]:
        if self.status != OPEN:
            raise Revert("WrongStatus")
        if s == self.poster:
            raise Revert("PosterCannotAccept")
        if s == self.judge():
            raise Revert("VerifierCannotAccept")
        if now >= self.deadline:
            raise Revert("DeadlinePassed")
        self.agent = s
        self.status = ACCEPTED
        return "TaskAccepted", {"agent": s, "status": ACCEPTED}

    def _submit_evidence(self, s: str, now: int, evidence_hash: str) -> tuple[str, dict[str, Any]]:
        if s != self.agent:
            raise Revert("NotAgent")
        if self.status not in (ACCEPTED, FAILED):
            raise Revert("WrongStatus")
        if now >= self.deadline:
            raise Revert("DeadlinePassed")
        if self.attempts >= 3:
            raise Revert("MaxSubmissionsReached")
        if evidence_hash == ZERO32:
            raise Revert("ZeroHash")
        self.attempts += 1
        self.last_evidence = evidence_hash
        self.status = SUBMITTED
        return "EvidenceSubmitted", {
            "agent": s,
            "attempt": self.attempts,
            "evidence_hash": evidence_hash,
            "status": SUBMITTED,
        }

    def _complete_verification(
        self, s: str, now: int, attempt: int, evidence_hash: str, passed: bool, score: int
    ) -> tuple[str, dict[str, Any]]:
        if s != self.judge():
            raise Revert("NotVerifier")
        if s == self.agent:
            raise Revert("VerifierIsWorker")
        if s == self.poster:
            raise Revert("VerifierIsPoster")
        if 1 <= attempt <= 3 and attempt in self.judged:
            raise Revert("AlreadyJudged")
        if self.status != SUBMITTED:
            raise Revert("WrongStatus")
        if attempt != self.attempts:
            raise Revert("WrongAttempt")
        if evidence_hash != self.last_evidence:
            raise Revert("EvidenceMismatch")
        if score > 100:
            raise Revert("InvalidScore")
        self.judged.add(attempt)
        fields = {
            "verifier": s,
            "attempt": attempt,
            "evidence_hash": evidence_hash,
            "passed": passed,
        }
        fields |= {"score": score, "agent": self.agent}
        if passed:
            self.status = COMPLETED
            amount, fee = self._split(self.reward)
            self._pay_agent(amount, fee)
            return "VerificationCompleted", fields | {
                "agent_payout": amount,
                "fee": fee,
                "failed_at": 0,
                "status": COMPLETED,
            }
        self.status = FAILED
        self.failed_at = now
        return "VerificationCompleted", fields | {
            "agent_payout": 0,
            "fee": 0,
            "failed_at": now,
            "status": FAILED,
        }

    def _raise_dispute(self, s: str, now: int) -> tuple[str, dict[str, Any]]:
        is_poster = s == self.poster
        if not is_poster and s != self.agent:
            raise Revert("NotParty")
        status = self.status
        if status not in (SUBMITTED, FAILED):
            raise Revert("WrongStatus")
        if now >= self.deadline:
            if is_poster:
                raise Revert("DeadlinePassed")
            if status != FAILED:
                raise Revert("WrongStatus")
            if now > self.failed_at + APPEAL:
                raise Revert("AppealWindowClosed")
        self.status = DISPUTED
        self.disputed = True
        return "DisputeRaised", {
            "by": s,
            "previous_status": status,
            "attempt": self.attempts,
            "status": DISPUTED,
        }

    def _resolve_dispute(self, s: str, now: int, share_bps: int) -> tuple[str, dict[str, Any]]:
        if s != self.arbiter:
            raise Revert("NotArbiter")
        if s in (self.poster, self.agent):
            raise Revert("ArbiterIsParty")
        status = self.status
        if status not in (DISPUTED, ESCALATED):
            raise Revert("WrongStatus")
        if share_bps > 10_000:
            raise Revert("InvalidShare")
        self.status = RESOLVED
        gross = self.reward * share_bps // 10_000
        amount, fee = self._split(gross)
        poster_amount = self.reward - gross
        self._pay_agent(amount, fee)
        if poster_amount:
            self._pay("poster", self.poster, poster_amount)
        return "DisputeResolved", {
            "arbiter": s,
            "agent_share_bps": share_bps,
            "agent": self.agent,
            "agent_amount": amount,
            "fee": fee,
            "poster": self.poster,
            "poster_amount": poster_amount,
            "previous_status": status,
            "status": RESOLVED,
        }

    def _claim_timeout(self, s: str, now: int) -> tuple[str, dict[str, Any]]:
        status = self.status
        is_poster = s == self.poster
        if not is_poster and status != SUBMITTED:
            raise Revert("NotPoster")
        if status > FAILED:
            raise Revert("WrongStatus")
        if now < self.deadline:
            raise Revert("DeadlineNotReached")
        if status == SUBMITTED:
            if not is_poster and now < self.deadline + GRACE:
                raise Revert("EscalationNotOpen")
            self.status = ESCALATED
            self.escalated_at = now
            return "TaskEscalated", {
                "poster": self.poster,
                "agent": self.agent,
                "attempt": self.attempts,
                "escalated_at": now,
                "collectible_at": now + ESCALATION,
                "status": ESCALATED,
            }
        if status == FAILED and now <= self.failed_at + APPEAL:
            raise Revert("AppealWindowOpen")
        self.status = REFUNDED
        self._pay("poster", self.poster, self.reward)
        return "TaskRefunded", {
            "poster": s,
            "amount": self.reward,
            "previous_status": status,
            "status": REFUNDED,
        }

    def _collect_escalated(self, s: str, now: int) -> tuple[str, dict[str, Any]]:
        if s != self.agent:
            raise Revert("NotAgent")
        if self.status != ESCALATED:
            raise Revert("WrongStatus")
        if now < self.escalated_at + ESCALATION:
            raise Revert("EscalationNotMature")
        self.status = COMPLETED
        amount, fee = self._split(self.reward)
        self._pay_agent(amount, fee)
        return "EscalationCollected", {
            "agent": s,
            "agent_amount": amount,
            "fee": fee,
            "status": COMPLETED,
        }

    def tick(self, now: int) -> None:
        """Chain time reached `now` (before any call in that block): note what became due.

        The rules as the docs state them: the deadline counts for a task still live, the
        appeal window for a task still Failed, the escalation for a task still Escalated.
        """
        if now >= self.deadline and self.status not in TERMINAL:
            self.fired.add(("deadline_passed", self.deadline))
        if self.status == FAILED and now > self.failed_at + APPEAL:
            self.fired.add(("appeal_window_closed", self.failed_at + APPEAL + 1))
        if self.status == ESCALATED and now >= self.escalated_at + ESCALATION:
            self.fired.add(("escalation_collectible", self.escalated_at + ESCALATION))

    def boundaries(self) -> set[int]:
        """Every instant where some rule flips, with its neighbours."""
        anchors = {self.deadline, self.deadline + GRACE}
        if self.failed_at:
            anchors.add(self.failed_at + APPEAL)
        if self.escalated_at:
            anchors.add(self.escalated_at + ESCALATION)
        return {anchor + delta for anchor in anchors for delta in (-1, 0, 1)}


def eligible(cap: Capability, sender: str, judge: str) -> bool:
    """Whether `sender` is who the capability names (see Capability's docstring)."""
    if cap.address is not None:
        return sender.lower() == cap.address.lower()
    if cap.action == "accept":
        return sender not in (POSTER, judge)
    if cap.actor == "anyone":
        return True
    if cap.actor == "verifier":
        return sender == MARKETPLACE
    if cap.actor == "arbiter":
        return sender == ARBITER
    raise AssertionError(f"capability without an address: {cap}")


def predicted(caps: list[Capability], sender: str, action: str, at: int, judge: str) -> bool:
    """Whether the machine's answer says `sender` may call `action` at `at`."""
    return any(
        cap.action == action and eligible(cap, sender, judge) and cap.is_open(at) for cap in caps
    )


def fired_timers(effects: list[m.Effect]) -> list[tuple[str, int]]:
    return [
        (str(e.kind), e.at)
        for e in effects
        if isinstance(e, DeadlinePassed | AppealWindowClosed | EscalationCollectible)
    ]


class Chain:
    """Turns the reference's emissions into indexed domain events, block by block."""

    def __init__(self) -> None:
        self.block = 100
        self.log_index = 0
        self.generation = 0  # bumped by a reorg, so re-mined blocks get new ids

    def event(
        self, name: str, fields: dict[str, Any], now: int, *, same_tx: bool = False
    ) -> m.DomainEvent:
        """The event in a new block, or (`same_tx`) as the next log of the previous one."""
        if same_tx:
            self.log_index += 1
        else:
            self.block += 1
            self.log_index = 0
        block_hash = f"0x{self.generation:032x}{self.block:032x}"
        cls = getattr(m, name)
        event: m.DomainEvent = cls(
            event_id=f"{CHAIN}:{block_hash}:{self.log_index}",
            chain_id=CHAIN,
            escrow=ESCROW,
            task_id=1,
            block_number=self.block,
            block_timestamp=now,
            log_index=self.log_index,
            **fields,
        )
        return event


_POSITION_FIELDS = {"event_id", "chain_id", "escrow", "block_number", "block_timestamp", "log_index", "name"}


def chain_event(event: m.DomainEvent) -> ChainEvent:
    """The indexed form of a domain event (ABI-named `args`), as the other services read it."""
    return ChainEvent(
        event_id=event.event_id,
        block_number=event.block_number,
        log_index=event.log_index,
        tx_hash="0x" + "00" * 32,
        name=event.name,
        args=event.model_dump(mode="json", by_alias=True, exclude=_POSITION_FIELDS),
    )


def agrees(state: TaskState, ref: RefEscrow) -> None:
    """The machine's state equals the reference's storage, field by field."""
    assert state.status == ref.status
    assert state.poster == ref.poster
    assert state.verifier == (None if ref.verifier == ZERO else ref.verifier)
    assert state.agent == (None if ref.agent == ZERO else ref.agent)
    assert (state.reward, state.deadline) == (ref.reward, ref.deadline)
    assert state.attempts_used == ref.attempts
    assert set(state.judged_attempts) == ref.judged
    assert state.last_evidence_hash == (None if ref.last_evidence == ZERO32 else ref.last_evidence)
    assert state.disputed == ref.disputed
    assert state.failed_at == (ref.failed_at or None)
    assert state.appeal_window_closes_at == (ref.failed_at + APPEAL if ref.failed_at else None)
    assert state.escalated_at == (ref.escalated_at or None)
    assert state.escalation_collectible_at == (
        ref.escalated_at + ESCALATION if ref.escalated_at else None
    )
    assert [(p.recipient, p.amount, p.deferred_to) for p in state.payouts] == ref.transfers
    assert sum(p.amount for p in state.payouts) in ((0,) if not ref.transfers else (ref.reward,))


# Mostly small steps: the boundary rule below makes the large, exact jumps.
time_jumps = st.one_of(
    st.sampled_from([1, 2, 59, 3_600, DAY, APPEAL, APPEAL + 1, ESCALATION, ESCALATION + 1]),
    st.integers(1, 2 * DAY),
)
PROGRESS = ("accept", "submit_evidence", "complete_verification", "collect_escalated")
PREFIXES = ("open", "open", "accepted", "failed1", "failed2", "failed3", "escalated")


class LifecycleAgainstContract(RuleBasedStateMachine):
    """Random calls by every party and random time jumps, checked against RefEscrow."""

    @initialize(
        named=st.booleans(),
        reward=st.one_of(st.sampled_from([1, 9, 10, 11, 10**6]), st.integers(1, 10**24)),
        start=st.integers(1_600_000_000, 1_800_000_000),
        lead=st.one_of(
            st.sampled_from([1, 2, 60, DAY, APPEAL, APPEAL + 1, 5 * DAY]), st.integers(1, 30 * DAY)
        ),
        prefix=st.sampled_from(PREFIXES),
        # The roles as the owner set them right after the task was created (a creation by
        # the marketplace verifier itself is refused): often overlapping a party.
        marketplace=st.sampled_from([MARKETPLACE, MARKETPLACE, POSTER, AGENT, STRANGER]),
        arbiter=st.sampled_from([ARBITER, ARBITER, POSTER, AGENT, STRANGER]),
    )
    def create(
        self,
        named: bool,
        reward: int,
        start: int,
        lead: int,
        prefix: str,
        marketplace: str,
        arbiter: str,
    ) -> None:
        self.now = start
        self.chain = Chain()
        self.ref = RefEscrow(
            poster=POSTER,
            verifier=NAMED_VERIFIER if named else ZERO,
            reward=reward,
            deadline=start + lead,
        )
        self.state: TaskState | None = None
        self.events: list[m.DomainEvent] = []
        self.history: list[tuple[TaskState, RefEscrow, Chain]] = []
        self.fired: list[tuple[str, int]] = []
        self.apply(
            "TaskCreated",
            {
                "poster": POSTER,
                "verifier": self.ref.verifier,
                "token": TOKEN,
                "reward": reward,
                "deadline": self.ref.deadline,
                "task_hash": TASK_HASH,
                "status": OPEN,
            },
        )
        self.ref.marketplace, self.ref.arbiter = marketplace, arbiter
        self.play(prefix)

    def play(self, prefix: str) -> None:
        """Start some runs deep in the lifecycle: after 1–3 failed rounds, or escalated."""
        judge = self.ref.judge()
        verdict = {"passed": False, "score": 0}
        steps: dict[str, list[tuple[str, str, dict[str, Any]]]] = {
            "open": [],
            "accepted": [(AGENT, "accept", {})],
            "failed1": [
                (AGENT, "accept", {}),
                (AGENT, "submit_evidence", {}),
                (judge, "complete_verification", verdict),
            ],
        }
        steps["failed2"] = steps["failed1"] + steps["failed1"][1:]
        steps["failed3"] = steps["failed2"] + steps["failed1"][1:]
        steps["escalated"] = [
            (AGENT, "accept", {}),
            (AGENT, "submit_evidence", {}),
            (POSTER, "claim_timeout", {}),
        ]
        for sender, action, args in steps[prefix]:
            if action == "claim_timeout":
                self.move_to(self.ref.deadline)
            self.attempt(sender, action, self.ref.valid_args(action) | args)

    def apply(self, name: str, fields: dict[str, Any], *, same_tx: bool = False) -> list[m.Effect]:
        event = self.chain.event(name, fields, self.now, same_tx=same_tx)
        self.state, effects = transition(self.state, event, self.now)
        self.events.append(event)
        self.fired.extend(fired_timers(effects))
        self.history.append((self.state, self.ref.clone(), copy.copy(self.chain)))
        # Coverage of the situations the rules are about (pytest --hypothesis-show-statistics).
        late = "late" if self.now >= self.ref.deadline else "early"
        note_coverage(
            f"{name} -> {TaskStatus(self.state.status).name} ({late}, attempt {self.state.attempts_used})"
        )
        assert isinstance(effects[-1], StatePublished)
        assert effects[-1].state == self.state
        return effects

    def move_to(self, target: int) -> None:
        if target <= self.now:
            return
        self.now = target
        self.ref.tick(target)
        assert self.state is not None
        self.state, effects = advance_time(self.state, target)
        self.fired.extend(fired_timers(effects))
        assert all(isinstance(e, StatePublished) for e in effects[-1:])

    def live(self) -> bool:
        return self.state is not None and not self.state.status.is_terminal

    @precondition(live)
    @rule(seconds=time_jumps)
    def wait(self, seconds: int) -> None:
        self.move_to(self.now + seconds)

    @precondition(live)
    @rule(delta=st.sampled_from([-1, 0, 1]), which=st.integers(0, 3))
    def wait_until_a_boundary(self, delta: int, which: int) -> None:
        anchors = [self.ref.deadline]
        if self.ref.failed_at:
            anchors.append(self.ref.failed_at + APPEAL)
        if self.ref.escalated_at:
            anchors.append(self.ref.escalated_at + ESCALATION)
        if self.ref.status == SUBMITTED:
            anchors.append(self.ref.deadline + GRACE)
        self.move_to(anchors[which % len(anchors)] + delta)

    def attempt(self, sender: str, action: str, args: dict[str, Any]) -> None:
        assert self.state is not None
        expected = predicted(
            allowed_actions(self.state, self.now, self.ref.roles()),
            sender,
            action,
            self.now,
            self.ref.judge(),
        )
        trial = self.ref.clone()
        try:
            name, fields = trial.call(sender, action, self.now, **args)
        except Revert:
            assert not expected, f"machine allows {action} by {sender}, contract refuses"
            return
        assert expected, f"contract accepts {action} by {sender}, machine does not allow it"
        self.ref = trial
        effects = self.apply(name, fields)
        for credited in trial.deferred:
            self.apply("PaymentDeferred", credited | {"status": trial.status}, same_tx=True)
        verdicts = [e.outcome for e in effects if isinstance(e, RoundJudged)]
        if name == "VerificationCompleted":
            assert [(v.passed, v.attempt, v.agent) for v in verdicts] == [
                (args["passed"], args["attempt"], self.ref.agent)
            ]
        else:
            assert verdicts == []

    @precondition(live)
    @rule(sender=st.sampled_from(SENDERS), action=st.sampled_from(ACTIONS), data=st.data())
    def anyone_tries_anything(self, sender: str, action: str, data: st.DataObject) -> None:
        self.attempt(sender, action, self.draw_args(action, data))

    @precondition(live)
    @rule(data=st.data())
    def someone_does_what_is_allowed(self, data: st.DataObject) -> None:
        assert self.state is not None
        # Cancelling ends a run early; make it rare so runs go deep.
        cancel_ok = data.draw(st.integers(0, 9)) == 0
        options = [
            (sender, cap.action)
            for cap in allowed_actions(self.state, self.now, self.ref.roles())
            if cap.is_open(self.now)
            for sender in SENDERS
            if eligible(cap, sender, self.ref.judge()) and (cap.action != "cancel" or cancel_ok)
        ]
        if options:
            sender, action = data.draw(st.sampled_from(options))
            self.attempt(sender, action, self.draw_args(action, data))

    @precondition(live)
    @rule(data=st.data())
    def the_work_moves_forward(self, data: st.DataObject) -> None:
        """Accept, submit, judge or collect when possible: runs reach the 3rd and 4th submission."""
        assert self.state is not None
        options = [
            (sender, cap.action)
            for cap in allowed_actions(self.state, self.now, self.ref.roles())
            if cap.is_open(self.now) and cap.action in PROGRESS
            for sender in SENDERS
            if eligible(cap, sender, self.ref.judge())
        ]
        if options:
            sender, action = data.draw(st.sampled_from(options))
            self.attempt(sender, action, self.draw_args(action, data))

    def draw_args(self, action: str, data: st.DataObject) -> dict[str, Any]:
        args = self.ref.valid_args(action)
        if action == "complete_verification":
            # Failures are likelier, so runs reach the third and fourth submission.
            args["passed"] = data.draw(st.sampled_from([False, False, True]))
            args["score"] = data.draw(st.integers(0, 100))
        if action == "resolve_dispute":
            args["share_bps"] = data.draw(
                st.sampled_from([0, 1, 5_000, 9_999, 10_000]) | st.integers(0, 10_000)
            )
        return args

    @precondition(live)
    @rule(
        role=st.sampled_from(["marketplace", "arbiter"]),
        new=st.sampled_from([POSTER, AGENT, *SENDERS]),
    )
    def owner_rotates_a_role(self, role: str, new: str) -> None:
        """An escrow-wide key change: it may put the judge or the arbiter on a party."""
        setattr(self.ref, role, new)

    @precondition(live)
    @rule(who=st.sampled_from([POSTER, AGENT, FEE]), blocked=st.booleans())
    def the_token_blocks_or_unblocks_a_recipient(self, who: str, blocked: bool) -> None:
        if blocked:
            self.ref.blocked.add(who)
        else:
            self.ref.blocked.discard(who)

    @rule(data=st.data())
    def an_event_is_delivered_again(self, data: st.DataObject) -> None:
        event = data.draw(st.sampled_from(self.events))
        state, effects = transition(self.state, event, self.now)
        assert (state, effects) == (self.state, [])

    @precondition(lambda self: len(self.events) > 1)
    @rule(data=st.data())
    def reorg_retracts_recent_events(self, data: st.DataObject) -> None:
        keep = data.draw(st.integers(1, len(self.events) - 1))
        # A reorg drops whole blocks: never a PaymentDeferred without its settling call.
        while keep < len(self.events) and self.events[keep].name == "PaymentDeferred":
            keep += 1
        if keep == len(self.events):
            return
        before_state, before_ref, chain = self.history[keep - 1]
        self.events = self.events[:keep]
        self.history = self.history[:keep]
        roles_now = (self.ref.marketplace, self.ref.arbiter, set(self.ref.blocked))
        self.ref = before_ref.clone()
        # Role changes and the token's blocklist are not task events: a reorg of the
        # task's events leaves them as they are.
        self.ref.marketplace, self.ref.arbiter, self.ref.blocked = roles_now
        self.ref.tick(self.now)
        self.chain = copy.copy(chain)
        self.chain.generation += 1
        state, effects = replay(self.events, self.now)
        assert state == advance_time(before_state, self.now)[0]
        self.state = state
        self.fired = fired_timers(effects)
        note_coverage(f"reorg back to {state.last_event_name}")

    @invariant()
    def state_matches_the_contract(self) -> None:
        assert self.state is not None
        agrees(self.state, self.ref)

    @invariant()
    def allowed_actions_match_the_contract_now_and_at_every_boundary(self) -> None:
        assert self.state is not None
        caps = allowed_actions(self.state, self.now, self.ref.roles())
        assert all(cap.until is None or cap.until >= self.now for cap in caps)
        instants = {self.now, self.now + 1, self.now + 40 * DAY} | {
            t for t in self.ref.boundaries() if t >= self.now
        }
        for at in sorted(instants):
            for sender in SENDERS:
                for action in ACTIONS:
                    allowed = predicted(caps, sender, action, at, self.ref.judge())
                    assert allowed == self.ref.accepts(sender, action, at), (
                        f"{action} by {sender} at now{at - self.now:+d}"
                    )

    @invariant()
    def timers_fire_exactly_once_and_exactly_when_due(self) -> None:
        assert self.state is not None
        assert len(self.fired) == len(set(self.fired)), "a timer fired twice"
        assert set(self.fired) == self.ref.fired
        assert all(timer.at > self.now for timer in self.state.pending_timers)
        pending = {(str(t.kind), t.at) for t in self.state.pending_timers}
        ref = self.ref
        expected = set()
        if ref.status not in TERMINAL and self.now < ref.deadline:
            expected.add(("deadline_passed", ref.deadline))
        if ref.status == FAILED and self.now <= ref.failed_at + APPEAL:
            expected.add(("appeal_window_closed", ref.failed_at + APPEAL + 1))
        if ref.status == ESCALATED and self.now < ref.escalated_at + ESCALATION:
            expected.add(("escalation_collectible", ref.escalated_at + ESCALATION))
        assert pending == expected

    @invariant()
    def the_one_chain_fold_agrees_with_the_machine(self) -> None:
        """`chain.view.fold_task` (what verification and settlement read) says what the
        machine's validated state says, field by field, in any arrival order."""
        assert self.state is not None
        shuffled = list(self.events)
        random_module.Random(len(self.events) + 1).shuffle(shuffled)
        view = fold_task([chain_event(e) for e in shuffled])
        s = self.state
        assert view.created and view.status == int(s.status)
        assert (view.poster, view.verifier, view.agent, view.token) == (s.poster, s.verifier, s.agent, s.token)
        assert (view.reward, view.deadline, view.task_hash) == (s.reward, s.deadline, s.task_hash.lower())
        assert view.last_attempt == view.current_attempt == s.attempts_used
        assert view.attempts.get(view.last_attempt) == (s.last_evidence_hash.lower() if s.last_evidence_hash else None)
        assert view.judged_attempts == set(s.judged_attempts)
        assert (view.last_score, view.failed_at) == (s.last_score, s.failed_at)
        assert (view.disputed, view.dispute_raised_by, view.agent_share_bps) == (
            s.disputed,
            s.dispute_raised_by,
            s.agent_share_bps,
        )
        assert (view.escalated_at, view.escalation_collectible_at) == (s.escalated_at, s.escalation_collectible_at)
        assert view.submitted == (s.status == TaskStatus.SUBMITTED)

    @invariant()
    def folding_the_events_in_any_order_gives_the_state(self) -> None:
        shuffled = list(self.events) + self.events[: len(self.events) // 2]
        random_module.Random(len(self.events)).shuffle(shuffled)
        assert fold(shuffled, self.now) == self.state


LifecycleAgainstContract.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLifecycleAgainstContract = LifecycleAgainstContract.TestCase


# ---------------------------------------------------------------------------- examples


class Scenario:
    """One task driven through the reference contract and the machine together."""

    def __init__(
        self, *, lead: int = 10 * DAY, named: bool = False, reward: int = 1_000_000
    ) -> None:
        self.start = 1_700_000_000
        self.now = self.start
        self.chain = Chain()
        self.ref = RefEscrow(
            poster=POSTER,
            verifier=NAMED_VERIFIER if named else ZERO,
            reward=reward,
            deadline=self.start + lead,
        )
        self.events: list[m.DomainEvent] = []
        self.effects: list[m.Effect] = []
        event = self.chain.event(
            "TaskCreated",
            {
                "poster": POSTER,
                "verifier": self.ref.verifier,
                "token": TOKEN,
                "reward": reward,
                "deadline": self.ref.deadline,
                "task_hash": TASK_HASH,
                "status": OPEN,
            },
            self.now,
        )
        self.state, effects = transition(None, event, self.now)
        self.events.append(event)
        self.effects.extend(effects)

    @property
    def deadline(self) -> int:
        return self.ref.deadline

    def at(self, when: int) -> Scenario:
        assert when >= self.now
        self.now = when
        self.state, effects = advance_time(self.state, when)
        self.effects.extend(effects)
        return self

    def allowed(self, sender: str, action: str) -> bool:
        caps = allowed_actions(self.state, self.now, self.ref.roles())
        return predicted(caps, sender, action, self.now, self.ref.judge())

    def do(self, sender: str, action: str, **args: Any) -> m.DomainEvent:
        """Perform a call the contract accepts, asserting the machine allowed it."""
        assert self.allowed(sender, action), f"machine does not allow {action} by {sender}"
        name, fields = self.ref.call(
            sender, action, self.now, **(self.ref.valid_args(action) | args)
        )
        event = self.chain.event(name, fields, self.now)
        self.state, effects = transition(self.state, event, self.now)
        self.events.append(event)
        self.effects.extend(effects)
        for credited in self.ref.deferred:
            fields = credited | {"status": self.ref.status}
            deferred = self.chain.event("PaymentDeferred", fields, self.now, same_tx=True)
            self.state, effects = transition(self.state, deferred, self.now)
            self.events.append(deferred)
            self.effects.extend(effects)
        agrees(self.state, self.ref)
        return event

    def refused(self, sender: str, action: str) -> None:
        """The contract refuses the call and the machine does not allow it."""
        assert not self.ref.accepts(sender, action, self.now)
        assert not self.allowed(sender, action)

    def fail_round(self) -> None:
        self.do(AGENT, "submit_evidence")
        self.do(MARKETPLACE, "complete_verification", passed=False, score=10)


def failed_after_deadline(*, lead: int = DAY) -> tuple[Scenario, int]:
    """A task whose only submission failed after the deadline; returns it and the close."""
    sc = Scenario(lead=lead)
    sc.do(AGENT, "accept")
    sc.do(AGENT, "submit_evidence")
    sc.at(sc.deadline + 5)
    sc.do(MARKETPLACE, "complete_verification", passed=False, score=0)
    closes_at = sc.now + APPEAL
    assert sc.state.appeal_window_closes_at == closes_at
    return sc, closes_at


def test_late_dispute_is_accepted_at_exactly_three_days() -> None:
    """The agent disputes at failedAt + 3 days exactly (the contract compares <=)."""
    sc, closes_at = failed_after_deadline()
    sc.at(closes_at)
    sc.refused(POSTER, "claim_timeout")
    sc.refused(POSTER, "raise_dispute")
    sc.do(AGENT, "raise_dispute")
    assert sc.state.status == TaskStatus.DISPUTED
    assert sc.state.dispute_raised_by == AGENT


def test_late_dispute_is_refused_one_second_after_three_days_and_refund_opens() -> None:
    """At failedAt + 3 days + 1 the window is closed: no dispute, the poster is refunded."""
    sc, closes_at = failed_after_deadline()
    sc.at(closes_at + 1)
    sc.refused(AGENT, "raise_dispute")
    assert next(e for e in sc.effects if isinstance(e, AppealWindowClosed)).at == closes_at + 1
    sc.do(POSTER, "claim_timeout")
    assert sc.state.status == TaskStatus.REFUNDED
    assert [(p.recipient, p.amount) for p in sc.state.payouts] == [("poster", 1_000_000)]


def test_machine_rejects_a_dispute_event_after_the_window() -> None:
    """A DisputeRaised past the window cannot have come from the contract."""
    sc, closes_at = failed_after_deadline()
    sc.at(closes_at + 1)
    bad = sc.chain.event(
        "DisputeRaised",
        {"by": AGENT, "previous_status": FAILED, "attempt": 1, "status": DISPUTED},
        sc.now,
    )
    with pytest.raises(TransitionError, match="appeal window"):
        transition(sc.state, bad, sc.now)


def test_escalation_collectible_at_exactly_fourteen_days() -> None:
    """Unjudged work escalates at the deadline; the agent collects at +14 days, not before."""
    sc = Scenario(lead=DAY)
    sc.do(AGENT, "accept")
    sc.do(AGENT, "submit_evidence")
    sc.at(sc.deadline - 1)
    sc.refused(POSTER, "claim_timeout")
    sc.at(sc.deadline)
    sc.do(POSTER, "claim_timeout")
    assert sc.state.status == TaskStatus.ESCALATED
    collectible_at = sc.deadline + ESCALATION
    assert sc.state.escalation_collectible_at == collectible_at
    caps = allowed_actions(sc.state, sc.now)
    collect = [c for c in caps if c.action == "collect_escalated"]
    assert [(c.address, c.from_, c.until) for c in collect] == [(AGENT, collectible_at, None)]
    sc.at(collectible_at - 1)
    sc.refused(AGENT, "collect_escalated")
    assert not any(isinstance(e, EscalationCollectible) for e in sc.effects)
    sc.at(collectible_at)
    assert [e.at for e in sc.effects if isinstance(e, EscalationCollectible)] == [collectible_at]
    collected = sc.do(AGENT, "collect_escalated")
    assert isinstance(collected, m.EscalationCollected)
    assert sc.state.status == collected.status == TaskStatus.COMPLETED
    assert [(p.recipient, p.amount) for p in sc.state.payouts] == [
        ("agent", 900_000),
        ("platform", 100_000),
    ]


def test_arbiter_may_rule_on_an_escalation_before_it_matures() -> None:
    """The arbiter rules first: the escalation timer is cancelled and never fires."""
    sc = Scenario(lead=DAY)
    sc.do(AGENT, "accept")
    sc.do(AGENT, "submit_evidence")
    sc.at(sc.deadline)
    sc.do(POSTER, "claim_timeout")
    sc.at(sc.deadline + ESCALATION - 1)
    sc.do(ARBITER, "resolve_dispute", share_bps=2_500)
    assert sc.state.status == TaskStatus.RESOLVED
    assert [(p.recipient, p.amount) for p in sc.state.payouts] == [
        ("agent", 225_000),
        ("platform", 25_000),
        ("poster", 750_000),
    ]
    cancelled = [e.timer.kind for e in sc.effects if isinstance(e, TimerCancelled)]
    assert cancelled == [TimerKind.ESCALATION_COLLECTIBLE]
    sc.at(sc.deadline + 30 * DAY)
    assert not any(isinstance(e, EscalationCollectible) for e in sc.effects)
    assert allowed_actions(sc.state, sc.now) == []


def test_third_submission_is_accepted_and_fourth_refused() -> None:
    """Three submissions in total: after the third fails, the agent may only dispute."""
    sc = Scenario()
    sc.do(AGENT, "accept")
    sc.fail_round()
    sc.fail_round()
    assert sc.allowed(AGENT, "submit_evidence")
    sc.fail_round()
    assert sc.state.attempts_used == 3
    sc.refused(AGENT, "submit_evidence")
    assert sc.allowed(AGENT, "raise_dispute")
    fourth = sc.chain.event(
        "EvidenceSubmitted",
        {"agent": AGENT, "attempt": 3, "evidence_hash": "0x" + "44" * 32, "status": SUBMITTED},
        sc.now,
    )
    with pytest.raises(TransitionError, match="fourth"):
        transition(sc.state, fourth, sc.now)
    verdicts = [e.outcome.passed for e in sc.effects if isinstance(e, RoundJudged)]
    assert verdicts == [False, False, False]


def test_submission_one_second_before_the_deadline_but_not_at_it() -> None:
    """Submissions need block.timestamp < deadline."""
    sc = Scenario(lead=DAY)
    sc.do(AGENT, "accept")
    sc.at(sc.deadline - 1)
    assert [
        c.until for c in allowed_actions(sc.state, sc.now) if c.action == "submit_evidence"
    ] == [sc.deadline - 1]
    late = Scenario(lead=DAY)
    late.do(AGENT, "accept")
    late.at(late.deadline)
    late.refused(AGENT, "submit_evidence")
    event = late.chain.event(
        "EvidenceSubmitted",
        {"agent": AGENT, "attempt": 1, "evidence_hash": "0x" + "01" * 32, "status": SUBMITTED},
        late.now,
    )
    with pytest.raises(TransitionError, match="deadline"):
        transition(late.state, event, late.now)
    sc.do(AGENT, "submit_evidence")
    assert sc.state.status == TaskStatus.SUBMITTED


def test_deadline_boundary_for_accept_disputes_and_refund() -> None:
    """Before the deadline: accept, both may dispute, no refund. At it: the reverse."""
    sc = Scenario(lead=DAY)
    sc.at(sc.deadline - 1)
    assert sc.allowed(STRANGER, "accept")
    sc.refused(POSTER, "claim_timeout")
    sc.at(sc.deadline)
    sc.refused(STRANGER, "accept")
    assert [e.at for e in sc.effects if isinstance(e, DeadlinePassed)] == [sc.deadline]
    sc.do(POSTER, "claim_timeout")
    assert sc.state.status == TaskStatus.REFUNDED


def test_failed_before_the_deadline_either_party_disputes_until_it() -> None:
    """A failure early on: both parties may dispute until the deadline, the agent
    beyond it only while the 3-day window lasts; the refund opens after both."""
    sc = Scenario(lead=DAY)
    sc.do(AGENT, "accept")
    sc.fail_round()
    failed_at = sc.now
    caps = {(c.actor, c.action): c for c in allowed_actions(sc.state, sc.now)}
    assert caps["poster", "raise_dispute"].until == sc.deadline - 1
    assert caps["agent", "raise_dispute"].until == failed_at + APPEAL
    assert caps["poster", "claim_timeout"].from_ == failed_at + APPEAL + 1
    sc.at(sc.deadline)
    sc.refused(POSTER, "raise_dispute")
    assert sc.allowed(AGENT, "raise_dispute")


def test_verdict_after_the_deadline_is_accepted_while_submitted() -> None:
    """A submission just before the deadline can be judged after it, until escalation."""
    sc = Scenario(lead=DAY, named=True)
    sc.do(AGENT, "accept")
    sc.do(AGENT, "submit_evidence")
    sc.at(sc.deadline + DAY)
    sc.refused(MARKETPLACE, "complete_verification")
    sc.refused(AGENT, "raise_dispute")
    sc.do(NAMED_VERIFIER, "complete_verification", passed=True, score=95)
    assert sc.state.status == TaskStatus.COMPLETED
    assert sc.state.last_score == 95


def test_cancel_only_while_open() -> None:
    """The poster cancels an Open task; once accepted, cancel is gone."""
    sc = Scenario()
    assert sc.allowed(POSTER, "cancel")
    sc.refused(AGENT, "cancel")
    sc.do(AGENT, "accept")
    sc.refused(POSTER, "cancel")
    other = Scenario()
    other.do(POSTER, "cancel")
    assert other.state.status == TaskStatus.CANCELLED
    assert [e.timer.kind for e in other.effects if isinstance(e, TimerCancelled)] == [
        TimerKind.DEADLINE_PASSED
    ]


def test_timers_fire_once_however_often_time_advances() -> None:
    """Advancing past a timer twice fires it once; advancing backwards fires nothing."""
    sc = Scenario(lead=DAY)
    first = advance_time(sc.state, sc.deadline + 10)
    assert [type(e) for e in first[1]] == [DeadlinePassed, StatePublished]
    fired = first[1][0]
    assert isinstance(fired, DeadlinePassed) and fired.observed_at == sc.deadline + 10
    assert advance_time(first[0], sc.deadline + 20) == (first[0], [])
    assert advance_time(first[0], sc.deadline - 10) == (first[0], [])
    assert advance_time(sc.state, sc.deadline - 1) == (sc.state, [])


def test_a_retracted_failed_verdict_restores_the_previous_state() -> None:
    """Reorg: without the failed verdict the task is Submitted again, its timer pending."""
    sc = Scenario()
    sc.do(AGENT, "accept")
    sc.do(AGENT, "submit_evidence")
    submitted = sc.state
    sc.do(MARKETPLACE, "complete_verification", passed=False, score=3)
    assert sc.state.status == TaskStatus.FAILED
    restored = fold(sc.events[:-1], sc.now)
    assert restored == submitted
    assert restored is not None and restored.failed_at is None
    assert fold(list(reversed(sc.events)), sc.now) == sc.state
    assert fold([], sc.now) is None


def test_redelivery_is_a_no_op_and_a_different_event_at_the_same_place_is_refused() -> None:
    """Same event again: nothing. Another event id at an applied position: retract first."""
    sc = Scenario()
    accepted = sc.do(AGENT, "accept")
    assert transition(sc.state, accepted, sc.now) == (sc.state, [])
    impostor = accepted.model_copy(update={"event_id": "other"})
    with pytest.raises(TransitionError, match="retract first"):
        transition(sc.state, impostor, sc.now)


def test_events_that_cannot_follow_the_state_are_refused() -> None:
    """Missed or foreign events surface as TransitionError, never as a silent state."""
    sc = Scenario()
    accept = sc.chain.event("TaskAccepted", {"agent": AGENT, "status": ACCEPTED}, sc.now)
    with pytest.raises(TransitionError, match="before its TaskCreated"):
        transition(None, accept, sc.now)
    wrong_status = sc.chain.event("TaskAccepted", {"agent": AGENT, "status": SUBMITTED}, sc.now)
    with pytest.raises(TransitionError, match="contract reports SUBMITTED"):
        transition(sc.state, wrong_status, sc.now)
    foreign = accept.model_copy(update={"task_id": 2})
    with pytest.raises(TransitionError, match="another task"):
        transition(sc.state, foreign, sc.now)
    verdict = sc.chain.event(
        "VerificationCompleted",
        {
            "verifier": MARKETPLACE,
            "attempt": 1,
            "evidence_hash": "0x" + "01" * 32,
            "passed": True,
            "score": 90,
            "agent": AGENT,
            "agent_payout": 900_000,
            "fee": 100_000,
            "failed_at": 0,
            "status": COMPLETED,
        },
        sc.now,
    )
    with pytest.raises(TransitionError, match="OPEN"):
        transition(sc.state, verdict, sc.now)
    with pytest.raises(ValueError, match="before the event"):
        transition(sc.state, accept, sc.now - 1)


def test_wrong_payout_split_is_refused() -> None:
    """The machine recomputes the contract's 90/10 split and refuses a mismatch."""
    sc = Scenario(reward=1_000_001)
    sc.do(AGENT, "accept")
    sc.do(AGENT, "submit_evidence")
    name, fields = sc.ref.clone().call(
        MARKETPLACE, "complete_verification", sc.now, **sc.ref.valid_args("complete_verification")
    )
    assert (fields["agent_payout"], fields["fee"]) == (900_001, 100_000)
    bad = sc.chain.event(name, fields | {"agent_payout": 900_000, "fee": 100_001}, sc.now)
    with pytest.raises(TransitionError, match="split"):
        transition(sc.state, bad, sc.now)


def test_transition_fires_due_timers_before_and_after_the_event() -> None:
    """An event in a block past the deadline first fires DeadlinePassed, in order."""
    sc = Scenario(lead=DAY)
    sc.do(AGENT, "accept")
    sc.now = sc.deadline + 1
    name, fields = sc.ref.call(POSTER, "claim_timeout", sc.now)
    event = sc.chain.event(name, fields, sc.now)
    state, effects = transition(sc.state, event, sc.now)
    assert [type(e) for e in effects] == [DeadlinePassed, StatePublished]
    assert state.status == TaskStatus.REFUNDED and state.pending_timers == ()
    scheduled = [e for e in sc.effects if isinstance(e, TimerScheduled)]
    assert [(e.timer.kind, e.timer.at) for e in scheduled] == [
        (TimerKind.DEADLINE_PASSED, sc.deadline)
    ]


def test_allowed_actions_view_serialises_from_with_its_alias() -> None:
    """The API record names the lower bound `from`, as a JSON client expects."""
    sc = Scenario(lead=DAY)
    view = allowed_actions_view(sc.state, sc.now)
    dumped = view.model_dump(mode="json", by_alias=True)
    claim = next(c for c in dumped["capabilities"] if c["action"] == "claim_timeout")
    assert claim["from"] == sc.deadline and claim["actor"] == "poster"
    assert view.as_of == sc.now and view.status == TaskStatus.OPEN


def test_event_from_message_maps_abi_names_and_zero_verifier() -> None:
    """An indexed message's camelCase args become a domain event; key rotation is skipped."""
    from schemas.events import EscrowEventMessage

    common = {
        "id": "31337:0xabc:3",
        "chain_id": CHAIN,
        "escrow_address": ESCROW,
        "block_number": 7,
        "block_hash": "0xabc",
        "block_timestamp": 1_700_000_000,
        "tx_hash": "0xdef",
        "tx_index": 0,
        "log_index": 3,
    }
    created = EscrowEventMessage(
        **common,
        event="TaskCreated",
        task_id=1,
        args={
            "taskId": 1,
            "poster": POSTER,
            "verifier": ZERO,
            "token": TOKEN,
            "reward": 5,
            "deadline": 1_700_000_100,
            "taskHash": TASK_HASH,
            "status": 0,
        },
    )
    event = event_from_message(created)
    assert isinstance(event, m.TaskCreated)
    assert (event.event_id, event.task_hash, event.verifier, event.log_index) == (
        "31337:0xabc:3",
        TASK_HASH,
        None,
        3,
    )
    rotation = EscrowEventMessage(
        **common,
        event="MarketplaceVerifierChanged",
        task_id=None,
        args={"previousVerifier": MARKETPLACE, "newVerifier": STRANGER},
    )
    assert event_from_message(rotation) is None


# ---------------------------------------------------------------------------- issue 16 edges


def test_anyone_escalates_unjudged_work_once_the_judging_grace_ends() -> None:
    """Delivered, never judged: the poster may escalate from the deadline, anyone else from
    deadline + 7 days; the agent then collects 14 days later without the poster."""
    sc = Scenario(lead=DAY)
    sc.do(AGENT, "accept")
    sc.do(AGENT, "submit_evidence")
    sc.at(sc.deadline)
    assert sc.allowed(POSTER, "claim_timeout")
    sc.refused(AGENT, "claim_timeout")
    sc.refused(STRANGER, "claim_timeout")
    sc.at(sc.deadline + GRACE - 1)
    sc.refused(AGENT, "claim_timeout")
    sc.at(sc.deadline + GRACE + 365 * DAY)  # a year later nobody judged
    sc.do(AGENT, "claim_timeout")
    assert sc.state.status == TaskStatus.ESCALATED
    sc.at(sc.now + ESCALATION)
    sc.do(AGENT, "collect_escalated")
    assert [(p.recipient, p.amount) for p in sc.state.payouts] == [
        ("agent", 900_000),
        ("platform", 100_000),
    ]


def test_role_overlaps_are_not_offered_and_their_events_are_refused() -> None:
    """The judge never judges work it did or a task it posted; the arbiter never rules on
    its own dispute. With the escrow's roles the machine offers neither."""
    sc = Scenario()
    sc.do(AGENT, "accept")
    sc.do(AGENT, "submit_evidence")
    for judge in (POSTER, AGENT):
        sc.ref.marketplace = judge
        assert not any(
            c.action == "complete_verification"
            for c in allowed_actions(sc.state, sc.now, sc.ref.roles())
        )
        sc.refused(judge, "complete_verification")
    sc.ref.marketplace = STRANGER
    caps = allowed_actions(sc.state, sc.now, sc.ref.roles())
    verdict_caps = [c for c in caps if c.action == "complete_verification"]
    assert [c.address for c in verdict_caps] == [STRANGER]
    sc.refused(MARKETPLACE, "complete_verification")  # the rotated-out key
    name, fields = sc.ref.clone().call(
        STRANGER, "complete_verification", sc.now, **sc.ref.valid_args("complete_verification")
    )
    for party in (POSTER, AGENT):
        forged = sc.chain.event(name, fields | {"verifier": party}, sc.now)
        with pytest.raises(TransitionError, match="judged its own"):
            transition(sc.state, forged, sc.now)
    sc.do(POSTER, "raise_dispute")
    for party in (POSTER, AGENT):
        sc.ref.arbiter = party
        assert allowed_actions(sc.state, sc.now, sc.ref.roles()) == []
        sc.refused(party, "resolve_dispute")
    sc.ref.arbiter = ARBITER
    name, fields = sc.ref.clone().call(ARBITER, "resolve_dispute", sc.now, share_bps=5_000)
    forged = sc.chain.event(name, fields | {"arbiter": AGENT}, sc.now)
    with pytest.raises(TransitionError, match="arbiter ruled on its own"):
        transition(sc.state, forged, sc.now)
    sc.do(ARBITER, "resolve_dispute", share_bps=5_000)
    assert sc.state.status == TaskStatus.RESOLVED


def test_without_roles_the_verdict_and_ruling_name_no_address() -> None:
    sc = Scenario()
    sc.do(AGENT, "accept")
    sc.do(AGENT, "submit_evidence")
    verdicts = [c for c in allowed_actions(sc.state, sc.now) if c.actor == "verifier"]
    assert [c.address for c in verdicts] == [None]


def test_refused_transfers_are_recorded_as_credited() -> None:
    """PaymentDeferred marks the settling call's payout as credited to the account; one
    that matches no payout of that call is refused."""
    sc = Scenario()
    sc.do(AGENT, "accept")
    sc.do(AGENT, "submit_evidence")
    sc.ref.blocked = {AGENT, FEE}
    sc.do(MARKETPLACE, "complete_verification", passed=True, score=90)
    assert [(p.recipient, p.amount, p.deferred_to) for p in sc.state.payouts] == [
        ("agent", 900_000, AGENT),
        ("platform", 100_000, FEE),
    ]
    stray = sc.chain.event(
        "PaymentDeferred", {"account": POSTER, "amount": 5, "status": COMPLETED}, sc.now
    )
    with pytest.raises(TransitionError, match="no transfer"):
        transition(sc.state, stray, sc.now)


def test_a_reward_above_the_cap_cannot_have_been_created() -> None:
    Scenario(reward=MAX_REWARD)  # the largest accepted
    with pytest.raises(TransitionError, match="above the cap"):
        Scenario(reward=MAX_REWARD + 1)
