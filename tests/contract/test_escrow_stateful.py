"""Random sequences of escrow calls by several actors, with time jumps, against a Python
reference model of the rules.

Every call's acceptance or refusal (and the refusal's custom error) must be what the model
predicts. After every step: the escrow's token balance equals the sum of unsettled rewards,
every holder's balance equals the model's ledger (so no task is ever paid twice), each
settling transaction moves exactly the task's reward out of the escrow, every task's
on-chain fields match the model, and statuses only move along the allowed edges.

The token is the test-only BlacklistToken (contracts/mocks/): a rule blocks or unblocks a
poster, an agent or the fee recipient, so payouts to them are credited instead of pushed
(PaymentDeferred) and later withdrawn to an unblocked address; every holder's credit must
equal the model's, and the escrow's balance the unsettled rewards plus the credits.

Speed: one anvil per module, evm_snapshot/evm_revert between examples, the block time of
every transaction set explicitly (so the model knows it to the second), and one batched
JSON-RPC request per invariant check.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from escrowd.devnet import (
    APPEAL_WINDOW,
    BPS,
    DAY,
    ESCALATION_DELAY,
    JUDGING_GRACE,
    MAX_REWARD,
    MAX_SUBMISSIONS,
    USDC,
    Actor,
    Devnet,
    EscrowRevert,
    decode_task,
    split_fee,
    task_id_of,
    text_hash,
)
from tests.support.hostile_tokens import block, compile_mock_tokens, escrow_over

OPEN, ACCEPTED, SUBMITTED, FAILED, COMPLETED, DISPUTED, ESCALATED, REFUNDED, CANCELLED, RESOLVED = (
    range(10)
)
UNSETTLED = {OPEN, ACCEPTED, SUBMITTED, FAILED, DISPUTED, ESCALATED}
ALLOWED_EDGES = {
    (OPEN, ACCEPTED), (OPEN, CANCELLED), (OPEN, REFUNDED),
    (ACCEPTED, SUBMITTED), (ACCEPTED, REFUNDED),
    (SUBMITTED, COMPLETED), (SUBMITTED, FAILED), (SUBMITTED, DISPUTED), (SUBMITTED, ESCALATED),
    (FAILED, SUBMITTED), (FAILED, DISPUTED), (FAILED, REFUNDED),
    (DISPUTED, RESOLVED),
    (ESCALATED, RESOLVED), (ESCALATED, COMPLETED),
}  # fmt: skip

MAX_TASKS = 3
MAX_EXAMPLES = int(os.environ.get("ESCROW_STATEFUL_EXAMPLES", "200"))
STEPS = 35


@dataclass
class MTask:
    """The model's view of one task."""

    tid: int
    poster: Actor
    verifier: Actor | None
    reward: int
    deadline: int
    status: int = OPEN
    agent: Actor | None = None
    attempts: int = 0
    evidence: bytes = bytes(32)
    failed_at: int = 0
    escalated_at: int = 0
    judged: int = 0  # bit n-1: attempt n judged
    disputed: bool = False
    paid_out: int = 0  # tokens that left the escrow for this task
    settlements: int = 0  # transactions that moved them
    seen_status: int = OPEN  # last status read from the chain


@dataclass
class Outcome:
    """What a call should do: refuse with `error`, or succeed and move `payout` tokens."""

    error: str | None = None
    payouts: dict[str, int] = field(default_factory=dict)  # address -> tokens received


def test_random_call_sequences_follow_the_model(module_devnet: Devnet) -> None:
    dn = escrow_over(module_devnet, compile_mock_tokens()["BlacklistToken"])
    posters = dn.posters[:2]
    agents = dn.agents[:3]
    named_verifier = dn.verifier_agents[0]
    original_mv = dn.marketplace_verifier
    outsider = dn.spare[0]
    people = [*posters, *agents, named_verifier, original_mv, outsider, dn.arbiter, dn.owner]
    ledger_holders = [*people, dn.fee_recipient]  # anyone may end up paid
    # Role overlaps: the marketplace key and the arbiter may be rotated onto a party.
    rotation_targets = [original_mv, outsider, agents[0], posters[0]]
    arbiter_targets = [dn.arbiter, posters[0], agents[0]]
    blockable = [posters[0], agents[0], dn.fee_recipient]
    for poster in posters:  # enough for tasks at the largest reward the escrow accepts
        dn.mint(poster, MAX_TASKS * MAX_REWARD)
    snapshot = {"id": dn.snapshot()}

    class EscrowMachine(RuleBasedStateMachine):
        tasks = Bundle("tasks")

        def __init__(self) -> None:
            super().__init__()
            # Every example starts from the freshly deployed chain.
            dn.revert(snapshot["id"])
            snapshot["id"] = dn.snapshot()
            self.t = dn.now() + 1  # the timestamp the next transaction will get
            self.model: dict[int, MTask] = {}
            self.mv: Actor = original_mv
            self.arb: Actor = dn.arbiter
            self.rotations = 0
            self.ledger: dict[str, int] = dict(
                zip(
                    [h.address for h in ledger_holders],
                    dn.balances_of(ledger_holders),
                    strict=True,
                )
            )
            self.escrow_balance = dn.balance_of(dn.escrow_address)
            self.task_count = dn.task_count()
            self.blocked: set[str] = set()  # addresses the token refuses
            self.owed: dict[str, int] = {}  # the escrow's credits (undeliverable payouts)

        # ---------------------------------------------------------- plumbing

        def judge(self, m: MTask) -> Actor:
            return m.verifier if m.verifier is not None else self.mv

        def pick(self, choice: int, intended: Actor) -> Actor:
            """Mostly the actor the rule is meant for; sometimes anybody (to hit refusals)."""
            return intended if choice < 75 else people[choice % len(people)]

        def transact(self, expected: Outcome, send: Any) -> Any:
            """Run `send` at the model's clock and check it against the expectation."""
            dn.set_next_timestamp(self.t)
            self.t += 1
            try:
                receipt = send()
            except EscrowRevert as exc:
                assert expected.error is not None, f"refused with {exc}, model expected success"
                assert exc.name == expected.error, f"refused with {exc}, expected {expected.error}"
                return None
            assert expected.error is None, f"accepted, model expected {expected.error}"
            # Exactly the expected payouts left the escrow in this transaction; those to a
            # blocked address were credited instead, each announced by PaymentDeferred.
            out: dict[str, int] = {}
            credited: dict[str, int] = {}
            for e in dn.events(receipt):
                if e.name == "Transfer" and e["from"] == dn.escrow_address:
                    out[e["to"]] = out.get(e["to"], 0) + e["value"]
                if e.name == "PaymentDeferred":
                    credited[e["account"]] = credited.get(e["account"], 0) + e["amount"]
            due = {k: v for k, v in expected.payouts.items() if v}
            assert out == {k: v for k, v in due.items() if k not in self.blocked}
            assert credited == {k: v for k, v in due.items() if k in self.blocked}
            for addr, amount in out.items():
                self.ledger[addr] = self.ledger.get(addr, 0) + amount
                self.escrow_balance -= amount
            for addr, amount in credited.items():
                self.owed[addr] = self.owed.get(addr, 0) + amount
            return receipt

        def settle(self, m: MTask, payouts: dict[str, int]) -> dict[str, int]:
            total = sum(payouts.values())
            assert total == m.reward
            m.paid_out += total
            m.settlements += 1
            return payouts

        def pay_agent(self, m: MTask, gross: int) -> dict[str, int]:
            assert m.agent is not None
            agent_amount, fee = split_fee(gross)
            payouts: dict[str, int] = {m.agent.address: agent_amount}
            payouts[dn.fee_recipient.address] = payouts.get(dn.fee_recipient.address, 0) + fee
            return payouts

        # ---------------------------------------------------------- rules

        @initialize(target=tasks)
        def first_task(self) -> Any:
            return self._create(posters[0], 10 * USDC, 2 * DAY, None)

        # Few tasks per example, so each one gets deep into its life.
        @precondition(lambda self: len(self.model) < MAX_TASKS)
        @rule(
            target=tasks,
            poster=st.sampled_from(posters),
            reward=st.one_of(
                st.integers(1, 25),
                st.integers(1, 10**9),
                st.sampled_from([MAX_REWARD, MAX_REWARD + 1]),
            ),
            duration=st.sampled_from([0, 60, 3_600, DAY, DAY, 2 * DAY, 2 * DAY, 4 * DAY]),
            verifier=st.sampled_from(["marketplace"] * 3 + ["named"] * 2 + ["self"]),
        )
        def create(self, poster: Actor, reward: int, duration: int, verifier: str) -> Any:
            named = {"marketplace": None, "named": named_verifier, "self": poster}[verifier]
            return self._create(poster, reward, duration, named)

        def _create(self, poster: Actor, reward: int, duration: int, named: Actor | None) -> Any:
            deadline = self.t + duration
            error = None
            if poster == (named if named is not None else self.mv):
                error = "VerifierIsPoster"  # the poster would judge its own task
            elif reward > MAX_REWARD:
                error = "RewardTooLarge"
            elif deadline <= self.t:
                error = "DeadlineInPast"
            elif poster.address in self.blocked:
                error = "TokenTransferFailed"  # the token refuses to move the reward in
            expected = Outcome(error)

            def send() -> Any:
                h = text_hash(f"terms {self.task_count}")
                if named is None:
                    return dn.create_task(
                        sender=poster, reward=reward, deadline=deadline, task_hash=h
                    )
                return dn.create_task_with_verifier(
                    sender=poster, verifier=named, reward=reward, deadline=deadline, task_hash=h
                )

            receipt = self.transact(expected, send)
            if receipt is None:
                return multiple()
            tid = task_id_of(dn, receipt)
            self.task_count += 1
            assert tid == self.task_count
            self.ledger[poster.address] -= reward
            self.escrow_balance += reward
            self.model[tid] = MTask(tid, poster, named, reward, deadline)
            return tid

        @rule(tid=tasks, choice=st.integers(0, 99))
        def cancel(self, tid: int, choice: int) -> None:
            m = self.model[tid]
            sender = self.pick(choice, m.poster)
            if sender != m.poster:
                expected = Outcome("NotPoster")
            elif m.status != OPEN:
                expected = Outcome("WrongStatus")
            else:
                expected = Outcome(payouts={m.poster.address: m.reward})
            if self.transact(expected, lambda: dn.cancel(tid, sender=sender)):
                self.settle(m, expected.payouts)
                m.status = CANCELLED

        @rule(tid=tasks, choice=st.integers(0, 99))
        def accept(self, tid: int, choice: int) -> None:
            m = self.model[tid]
            sender = self.pick(choice, agents[choice % len(agents)])
            if m.status != OPEN:
                expected = Outcome("WrongStatus")
            elif sender == m.poster:
                expected = Outcome("PosterCannotAccept")
            elif sender == self.judge(m):
                expected = Outcome("VerifierCannotAccept")
            elif self.t >= m.deadline:
                expected = Outcome("DeadlinePassed")
            else:
                expected = Outcome()
            if self.transact(expected, lambda: dn.accept_task(tid, sender=sender)):
                m.status, m.agent = ACCEPTED, sender

        @rule(tid=tasks, choice=st.integers(0, 99), variant=st.integers(0, 3))
        def submit(self, tid: int, choice: int, variant: int) -> None:
            m = self.model[tid]
            sender = self.pick(choice, m.agent or agents[0])
            evidence = text_hash(f"evidence {tid} {m.attempts} {variant}")
            if sender != m.agent:
                expected = Outcome("NotAgent")
            elif m.status not in (ACCEPTED, FAILED):
                expected = Outcome("WrongStatus")
            elif self.t >= m.deadline:
                expected = Outcome("DeadlinePassed")
            elif m.attempts >= MAX_SUBMISSIONS:
                expected = Outcome("MaxSubmissionsReached")
            else:
                expected = Outcome()
            if self.transact(expected, lambda: dn.submit_evidence(tid, evidence, sender=sender)):
                m.attempts += 1
                m.evidence = evidence
                m.status = SUBMITTED

        @rule(
            tid=tasks,
            choice=st.integers(0, 99),
            attempt_offset=st.sampled_from([0, 0, 0, 0, -1, 1]),
            right_evidence=st.sampled_from([True, True, True, False]),
            passed=st.booleans(),
            score=st.sampled_from([0, 59, 60, 100, 101]),
        )
        def verdict(
            self,
            tid: int,
            choice: int,
            attempt_offset: int,
            right_evidence: bool,
            passed: bool,
            score: int,
        ) -> None:
            m = self.model[tid]
            sender = self.pick(choice, self.judge(m))
            attempt = max(0, m.attempts + attempt_offset)
            evidence = m.evidence if right_evidence else text_hash("forged")
            already = 1 <= attempt <= MAX_SUBMISSIONS and bool(m.judged & (1 << (attempt - 1)))
            if sender != self.judge(m):
                expected = Outcome("NotVerifier")
            elif sender == m.agent:
                expected = Outcome("VerifierIsWorker")
            elif sender == m.poster:
                expected = Outcome("VerifierIsPoster")
            elif already:
                expected = Outcome("AlreadyJudged")
            elif m.status != SUBMITTED:
                expected = Outcome("WrongStatus")
            elif attempt != m.attempts:
                expected = Outcome("WrongAttempt")
            elif evidence != m.evidence:
                expected = Outcome("EvidenceMismatch")
            elif score > 100:
                expected = Outcome("InvalidScore")
            elif passed:
                expected = Outcome(payouts=self.pay_agent(m, m.reward))
            else:
                expected = Outcome()
            send = lambda: dn.complete_verification(  # noqa: E731
                tid, attempt, evidence, passed, score, sender=sender
            )
            if self.transact(expected, send):
                m.judged |= 1 << (attempt - 1)
                if passed:
                    self.settle(m, expected.payouts)
                    m.status = COMPLETED
                else:
                    m.status, m.failed_at = FAILED, self.t - 1

        @rule(tid=tasks, choice=st.integers(0, 99))
        def dispute(self, tid: int, choice: int) -> None:
            m = self.model[tid]
            intended = m.poster if choice % 2 == 0 or m.agent is None else m.agent
            sender = self.pick(choice, intended)
            if sender not in (m.poster, m.agent):
                expected = Outcome("NotParty")
            elif m.status not in (SUBMITTED, FAILED):
                expected = Outcome("WrongStatus")
            elif self.t >= m.deadline and sender == m.poster:
                expected = Outcome("DeadlinePassed")
            elif self.t >= m.deadline and m.status != FAILED:
                expected = Outcome("WrongStatus")
            elif self.t >= m.deadline and self.t > m.failed_at + APPEAL_WINDOW:
                expected = Outcome("AppealWindowClosed")
            else:
                expected = Outcome()
            if self.transact(expected, lambda: dn.raise_dispute(tid, sender=sender)):
                m.status, m.disputed = DISPUTED, True

        @rule(
            tid=tasks,
            choice=st.integers(0, 99),
            bps=st.one_of(st.sampled_from([0, 5_000, BPS, BPS + 1]), st.integers(0, BPS)),
        )
        def resolve(self, tid: int, choice: int, bps: int) -> None:
            m = self.model[tid]
            sender = self.pick(choice, self.arb)
            if sender != self.arb:
                expected = Outcome("NotArbiter")
            elif sender in (m.poster, m.agent):
                expected = Outcome("ArbiterIsParty")
            elif m.status not in (DISPUTED, ESCALATED):
                expected = Outcome("WrongStatus")
            elif bps > BPS:
                expected = Outcome("InvalidShare")
            else:
                gross = m.reward * bps // BPS
                payouts = self.pay_agent(m, gross)
                payouts[m.poster.address] = payouts.get(m.poster.address, 0) + m.reward - gross
                expected = Outcome(payouts=payouts)
            if self.transact(expected, lambda: dn.resolve_dispute(tid, bps, sender=sender)):
                self.settle(m, expected.payouts)
                m.status = RESOLVED

        @rule(tid=tasks, choice=st.integers(0, 99))
        def claim_timeout(self, tid: int, choice: int) -> None:
            m = self.model[tid]
            # Mostly the poster; a third of the time the agent (escalating unjudged work).
            agent_turn = choice % 3 == 1 and m.agent is not None
            sender = self.pick(choice, m.agent if agent_turn and m.agent else m.poster)
            is_poster = sender == m.poster
            escalate = False
            if not is_poster and m.status != SUBMITTED:
                expected = Outcome("NotPoster")
            elif m.status > FAILED:
                expected = Outcome("WrongStatus")
            elif self.t < m.deadline:
                expected = Outcome("DeadlineNotReached")
            elif m.status == SUBMITTED and not is_poster and self.t < m.deadline + JUDGING_GRACE:
                expected = Outcome("EscalationNotOpen")
            elif m.status == SUBMITTED:
                expected, escalate = Outcome(), True
            elif m.status == FAILED and self.t <= m.failed_at + APPEAL_WINDOW:
                expected = Outcome("AppealWindowOpen")
            else:
                expected = Outcome(payouts={m.poster.address: m.reward})
            if self.transact(expected, lambda: dn.claim_timeout(tid, sender=sender)):
                if escalate:
                    m.status, m.escalated_at = ESCALATED, self.t - 1
                else:
                    self.settle(m, expected.payouts)
                    m.status = REFUNDED

        @rule(tid=tasks, choice=st.integers(0, 99))
        def collect(self, tid: int, choice: int) -> None:
            m = self.model[tid]
            sender = self.pick(choice, m.agent or agents[0])
            if sender != m.agent:
                expected = Outcome("NotAgent")
            elif m.status != ESCALATED:
                expected = Outcome("WrongStatus")
            elif self.t < m.escalated_at + ESCALATION_DELAY:
                expected = Outcome("EscalationNotMature")
            else:
                expected = Outcome(payouts=self.pay_agent(m, m.reward))
            if self.transact(expected, lambda: dn.collect_escalated(tid, sender=sender)):
                self.settle(m, expected.payouts)
                m.status = COMPLETED

        # The rules above draw senders and arguments freely and mostly hit refusals once a
        # task has moved on; these three (one body, six names to weigh it) take the next
        # step a task's own parties would take, so examples reach deep states.
        @rule(tid=tasks, branch=st.integers(0, 9), passed=st.booleans(), bps=st.integers(0, BPS))
        def progress_a(self, tid: int, branch: int, passed: bool, bps: int) -> None:
            self._progress(tid, branch, passed, bps)

        @rule(tid=tasks, branch=st.integers(0, 9), passed=st.booleans(), bps=st.integers(0, BPS))
        def progress_b(self, tid: int, branch: int, passed: bool, bps: int) -> None:
            self._progress(tid, branch, passed, bps)

        @rule(tid=tasks, branch=st.integers(0, 9), passed=st.booleans(), bps=st.integers(0, BPS))
        def progress_c(self, tid: int, branch: int, passed: bool, bps: int) -> None:
            self._progress(tid, branch, passed, bps)

        @rule(tid=tasks, branch=st.integers(0, 9), passed=st.booleans(), bps=st.integers(0, BPS))
        def progress_d(self, tid: int, branch: int, passed: bool, bps: int) -> None:
            self._progress(tid, branch, passed, bps)

        @rule(tid=tasks, branch=st.integers(0, 9), passed=st.booleans(), bps=st.integers(0, BPS))
        def progress_e(self, tid: int, branch: int, passed: bool, bps: int) -> None:
            self._progress(tid, branch, passed, bps)

        @rule(tid=tasks, branch=st.integers(0, 9), passed=st.booleans(), bps=st.integers(0, BPS))
        def progress_f(self, tid: int, branch: int, passed: bool, bps: int) -> None:
            self._progress(tid, branch, passed, bps)

        def _progress(self, tid: int, branch: int, passed: bool, bps: int) -> None:
            m = self.model[tid]
            edge = bps % 2  # 0: one second before a time boundary, 1: exactly on it
            if m.status == OPEN:
                if branch == 0:
                    self.cancel(tid, 0)
                else:
                    self.accept(tid, branch % len(agents))
            elif m.status == ACCEPTED:
                if branch < 8:
                    self.submit(tid, 0, branch % 4)
                else:
                    self.jump_to(m.deadline - 1 + edge)
                    self.claim_timeout(tid, 0)
            elif m.status == SUBMITTED:
                if branch < 6:
                    # Mostly fail: failed rounds lead to resubmissions, appeals and refunds.
                    self.verdict(tid, 0, 0, True, passed and branch < 2, 60)
                elif branch < 8:
                    self.dispute(tid, branch)
                elif branch == 8:
                    self.jump_to(m.deadline - 1 + edge)
                    self.claim_timeout(tid, 0)
                else:  # nobody judged: the agent escalates once the judging grace ends
                    self.jump_to(m.deadline + JUDGING_GRACE - 1 + edge)
                    self.claim_timeout(tid, 1)
            elif m.status == FAILED:
                window_end = m.failed_at + APPEAL_WINDOW
                if branch < 4:
                    self.submit(tid, 0, branch)
                elif branch < 6:
                    self.dispute(tid, 1)
                elif branch < 8:
                    self.jump_to(max(m.deadline, window_end + edge))
                    self.dispute(tid, branch)  # 6: poster, 7: agent
                else:
                    self.jump_to(max(m.deadline, window_end + edge))
                    self.claim_timeout(tid, 0)
            elif m.status == DISPUTED:
                self.resolve(tid, 0, bps)
            elif m.status == ESCALATED:
                if branch < 8:
                    self.jump_to(m.escalated_at + ESCALATION_DELAY - 1 + edge)
                    self.collect(tid, 0)
                else:
                    self.resolve(tid, 0, bps)

        def jump_to(self, timestamp: int) -> None:
            """Move the clock forward to `timestamp` (never back)."""
            self.t = max(self.t, timestamp)

        @precondition(lambda self: self.rotations < 3)
        @rule(choice=st.integers(0, 99), target_index=st.integers(0, 3))
        def rotate_marketplace_verifier(self, choice: int, target_index: int) -> None:
            sender = self.pick(choice, dn.owner)
            new = rotation_targets[target_index]
            expected = Outcome("NotOwner" if sender != dn.owner else None)
            self.rotations += 1
            if self.transact(expected, lambda: dn.set_marketplace_verifier(new, sender=sender)):
                self.mv = new

        @precondition(lambda self: self.rotations < 3)
        @rule(choice=st.integers(0, 99), target_index=st.integers(0, 2))
        def rotate_arbiter(self, choice: int, target_index: int) -> None:
            sender = self.pick(choice, dn.owner)
            new = arbiter_targets[target_index]
            expected = Outcome("NotOwner" if sender != dn.owner else None)
            self.rotations += 1
            if self.transact(expected, lambda: dn.set_arbiter(new, sender=sender)):
                self.arb = new

        # Mostly blocking, mostly the fee recipient: every agent payout carries a fee.
        @rule(who=st.sampled_from([0, 1, 2, 2, 2]), blocked=st.sampled_from([True, True, False]))
        def token_blocks(self, who: int, blocked: bool) -> None:
            """The token starts or stops refusing an address (a blacklist update)."""
            account = blockable[who]
            dn.set_next_timestamp(self.t)
            self.t += 1
            block(dn, account, blocked)
            if blocked:
                self.blocked.add(account.address)
            else:
                self.blocked.discard(account.address)

        @rule(who=st.integers(0, 2), to=st.integers(0, 3))
        def withdraw(self, who: int, to: int) -> None:
            account = blockable[who]
            recipient = [*blockable, outsider][to]
            amount = self.owed.get(account.address, 0)
            if amount == 0:
                expected = Outcome("NothingOwed")
            elif recipient.address in self.blocked:
                expected = Outcome("TokenTransferFailed")  # refused: the credit stays
            else:
                expected = Outcome(payouts={recipient.address: amount})
            if self.transact(expected, lambda: dn.withdraw(recipient, sender=account)):
                self.owed[account.address] = 0

        @rule(
            tid=tasks,
            kind=st.sampled_from(["deadline", "grace", "appeal", "escalation", "seconds"]),
            delta=st.sampled_from([-1, 0, 1]),
            seconds=st.sampled_from([1, 3_600, DAY, 3 * DAY, 14 * DAY]),
        )
        def advance_time(self, tid: int, kind: str, delta: int, seconds: int) -> None:
            # Time only moves forward; jumps land on the rule boundaries (and one second
            # either side) so the model is tested exactly where the rules flip.
            m = self.model[tid]
            boundary = {
                "deadline": m.deadline,
                "grace": m.deadline + JUDGING_GRACE,
                "appeal": m.failed_at + APPEAL_WINDOW if m.failed_at else 0,
                "escalation": m.escalated_at + ESCALATION_DELAY if m.escalated_at else 0,
                "seconds": self.t + seconds,
            }[kind]
            self.jump_to(boundary + delta if kind != "seconds" else boundary)

        # ---------------------------------------------------------- invariants

        @invariant()
        def chain_matches_model(self) -> None:
            ids = sorted(self.model)
            holders = [dn.escrow_address, *self.ledger]
            owed_of = [b.address for b in blockable]
            replies = dn.call_many(
                [(dn.escrow_address, "taskCount", ()), (dn.escrow_address, "totalOwed", ())]
                + [(dn.escrow_address, "owed", (a,)) for a in owed_of]
                + [(dn.token_address, "balanceOf", (h,)) for h in holders]
                + [(dn.escrow_address, "getTask", (i,)) for i in ids]
            )
            task_count, total_owed = replies[0][0], replies[1][0]
            owed = [r[0] for r in replies[2 : 2 + len(owed_of)]]
            rest = replies[2 + len(owed_of) :]
            escrow_balance, *holder_balances = (r[0] for r in rest[: len(holders)])
            views = [decode_task(i, r[0]) for i, r in zip(ids, rest[len(holders) :], strict=True)]
            assert task_count == self.task_count
            assert owed == [self.owed.get(a, 0) for a in owed_of]
            assert total_owed == sum(self.owed.values())

            unsettled = sum(m.reward for m in self.model.values() if m.status in UNSETTLED)
            assert escrow_balance == unsettled + total_owed == self.escrow_balance
            assert dict(zip(self.ledger, holder_balances, strict=True)) == self.ledger

            for m, v in zip((self.model[i] for i in ids), views, strict=True):
                # Paid at most once, and in full once settled.
                assert m.settlements == (0 if m.status in UNSETTLED else 1)
                assert m.paid_out == (0 if m.status in UNSETTLED else m.reward)
                assert v.status == m.status, f"task {m.tid}: chain {v.status}, model {m.status}"
                assert (m.seen_status == v.status) or (m.seen_status, v.status) in ALLOWED_EDGES
                m.seen_status = v.status
                assert v.poster == m.poster.address and v.reward == m.reward
                assert v.deadline == m.deadline
                assert v.agent == (m.agent.address if m.agent else "0x" + "0" * 40)
                assert v.attempts == m.attempts and v.judged_mask == m.judged
                assert v.last_evidence_hash == m.evidence
                assert v.failed_at == m.failed_at and v.escalated_at == m.escalated_at
                assert v.disputed == m.disputed

    run_state_machine_as_test(
        EscrowMachine,
        settings=settings(
            max_examples=MAX_EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            print_blob=True,
        ),
    )
