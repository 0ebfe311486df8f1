"""The escrow at its edges (issue 16, items 1-4), on a real anvil:

1. delivered work nobody judges still pays the agent, without the poster;
2. the largest accepted reward settles through every payout path, the next one is refused;
3. a recipient the token refuses (blacklisted agent, poster or fee recipient) cannot block
   a task: its payout is credited and withdrawn later; a fee-on-transfer token is refused;
4. role overlaps: no verifier judges a task it posted, no arbiter rules on its own dispute,
   a rotated-out verifier judges nothing.

The hostile tokens are the test-only mocks in `contracts/mocks/`, compiled here.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from escrowd.devnet import (
    BPS,
    DAY,
    ESCALATION_DELAY,
    JUDGING_GRACE,
    MAX_REWARD,
    USDC,
    Devnet,
    TaskStatus,
    split_fee,
)
from tests.contract.test_escrow_rules import EV1, WEEK, Cast, c, refused  # noqa: F401
from tests.support.hostile_tokens import block, compile_mock_tokens, escrow_over

YEAR = 365 * DAY

@pytest.fixture(scope="module")
def mock_tokens() -> dict[str, Any]:
    return compile_mock_tokens()


@pytest.fixture
def bl(c: Cast, mock_tokens: dict[str, Any]) -> Cast:  # noqa: F811
    """The cast over an escrow whose token has a blacklist."""
    return replace(c, dn=escrow_over(c.dn, mock_tokens["BlacklistToken"]))


def _conserved(dn: Devnet, live_rewards: int) -> None:
    """Escrow balance = rewards of unsettled tasks + credited payouts."""
    assert dn.balance_of(dn.escrow_address) == live_rewards + dn.total_owed()


# ---------------------------------------------------------------------------- 1. never judged


def test_delivered_work_nobody_judges_pays_the_agent_a_year_later(c: Cast) -> None:  # noqa: F811
    """Before: a year after the deadline the agent's collect, dispute and claimTimeout all
    reverted and only the poster could unlock the task. Now the agent escalates it."""
    tid = c.submitted(duration=WEEK)
    c.dn.increase_time(WEEK + YEAR)
    with refused("WrongStatus", int(TaskStatus.SUBMITTED)):
        c.dn.collect_escalated(tid, sender=c.A)
    with refused("WrongStatus", int(TaskStatus.SUBMITTED)):
        c.dn.raise_dispute(tid, sender=c.A)
    receipt = c.dn.claim_timeout(tid, sender=c.A)
    escalated = c.dn.event(receipt, "TaskEscalated")
    assert escalated["poster"] == c.P.address  # the task's poster, whoever escalated
    assert c.status(tid) == TaskStatus.ESCALATED
    c.dn.increase_time(ESCALATION_DELAY)
    before = c.dn.balance_of(c.A)
    c.dn.collect_escalated(tid, sender=c.A)
    assert c.dn.balance_of(c.A) - before == split_fee(10 * USDC)[0]
    assert c.status(tid) == TaskStatus.COMPLETED


def test_anyone_may_escalate_unjudged_work_from_seven_days_after_the_deadline(c: Cast) -> None:  # noqa: F811
    tid = c.submitted(duration=WEEK)
    deadline = c.dn.get_task(tid).deadline
    opens_at = deadline + JUDGING_GRACE
    c.dn.set_next_timestamp(opens_at - 1)
    with refused("EscalationNotOpen", opens_at):
        c.dn.claim_timeout(tid, sender=c.OUT)
    # Meanwhile the verifier may still judge; the poster may escalate from the deadline.
    c.dn.set_next_timestamp(opens_at)
    receipt = c.dn.claim_timeout(tid, sender=c.OUT)
    assert int(c.dn.event(receipt, "TaskEscalated")["collectibleAt"]) == opens_at + ESCALATION_DELAY


def test_only_the_poster_escalates_at_the_deadline_and_only_the_poster_is_refunded(c: Cast) -> None:  # noqa: F811
    tid = c.submitted(duration=WEEK)
    deadline = c.dn.get_task(tid).deadline
    c.dn.set_next_timestamp(deadline)
    with refused("EscalationNotOpen", deadline + JUDGING_GRACE):
        c.dn.claim_timeout(tid, sender=c.A)
    c.dn.claim_timeout(tid, sender=c.P)
    assert c.status(tid) == TaskStatus.ESCALATED
    # A refund (never delivered) stays the poster's alone, however late.
    tid2 = c.accepted(duration=WEEK)
    c.dn.increase_time(WEEK + YEAR)
    with refused("NotPoster"):
        c.dn.claim_timeout(tid2, sender=c.A)
    with refused("NotPoster"):
        c.dn.claim_timeout(tid, sender=c.A)  # already escalated: not the agent's to touch


# ---------------------------------------------------------------------------- 2. reward cap


def test_reward_cap_is_the_largest_reward_every_payout_path_settles(c: Cast) -> None:  # noqa: F811
    assert int(c.dn.call(c.dn.escrow_address, "MAX_REWARD")[0]) == MAX_REWARD
    assert MAX_REWARD * BPS < 2**256 <= (MAX_REWARD + 1) * BPS
    c.dn.mint(c.P, 9 * MAX_REWARD)
    with refused("RewardTooLarge", MAX_REWARD):
        c.open(reward=MAX_REWARD + 1)
    assert c.dn.task_count() == 0
    fee_of = {bps: split_fee(MAX_REWARD * bps // BPS) for bps in (10_000, 9_999, 1, 0)}

    def paid(tid: int, who: Any, action: Any) -> int:
        before = c.dn.balance_of(who)
        action()
        assert c.dn.get_task(tid).reward == MAX_REWARD
        return c.dn.balance_of(who) - before

    # Pass, escalated collection, and the arbiter's split at 100%, 99.99%, 0.01% and 0%.
    tid = c.submitted(reward=MAX_REWARD)
    got = paid(tid, c.A, lambda: c.dn.complete_verification(tid, 1, EV1, True, 90, sender=c.MV))
    assert got == split_fee(MAX_REWARD)[0]
    tid = c.submitted(reward=MAX_REWARD)
    c.dn.increase_time(WEEK)
    c.dn.claim_timeout(tid, sender=c.P)
    c.dn.increase_time(ESCALATION_DELAY)
    assert paid(tid, c.A, lambda: c.dn.collect_escalated(tid, sender=c.A)) == split_fee(MAX_REWARD)[0]
    for bps, (agent_amount, _fee) in fee_of.items():
        tid = c.submitted(reward=MAX_REWARD)
        c.dn.raise_dispute(tid, sender=c.P)
        poster_before = c.dn.balance_of(c.P)
        got = paid(tid, c.A, lambda tid=tid, bps=bps: c.dn.resolve_dispute(tid, bps))
        assert got == agent_amount
        assert c.dn.balance_of(c.P) - poster_before == MAX_REWARD - MAX_REWARD * bps // BPS
    # Refund and cancel return the whole reward.
    tid = c.accepted(reward=MAX_REWARD)
    c.dn.increase_time(WEEK)
    assert paid(tid, c.P, lambda: c.dn.claim_timeout(tid, sender=c.P)) == MAX_REWARD
    tid = c.open(reward=MAX_REWARD)
    assert paid(tid, c.P, lambda: c.dn.cancel(tid, sender=c.P)) == MAX_REWARD
    _conserved(c.dn, 0)


# ---------------------------------------------------------------------------- 3. hostile tokens


def test_blocked_agent_is_credited_and_withdraws_to_another_address(bl: Cast) -> None:
    dn = bl.dn
    tid = bl.submitted()
    block(dn, bl.A)
    receipt = dn.complete_verification(tid, 1, EV1, True, 90, sender=bl.MV)
    agent_amount, fee = split_fee(10 * USDC)
    assert bl.status(tid) == TaskStatus.COMPLETED
    deferred = dn.event(receipt, "PaymentDeferred")
    assert deferred.args == {
        "taskId": tid,
        "account": bl.A.address,
        "amount": agent_amount,
        "status": int(TaskStatus.COMPLETED),
    }
    assert dn.balance_of(bl.FEE) == fee  # the fee recipient is not held up by the agent
    assert dn.owed(bl.A) == agent_amount
    _conserved(dn, 0)
    # The blocked address cannot receive: the withdrawal is refused and the credit kept.
    with refused("TokenTransferFailed"):
        dn.withdraw(bl.A, sender=bl.A)
    assert dn.owed(bl.A) == agent_amount
    receipt = dn.withdraw(bl.A2, sender=bl.A)
    assert dn.event(receipt, "Withdrawn").args == {
        "account": bl.A.address,
        "to": bl.A2.address,
        "amount": agent_amount,
    }
    assert dn.balance_of(bl.A2) == agent_amount
    assert dn.owed(bl.A) == 0 == dn.total_owed()
    with refused("NothingOwed"):
        dn.withdraw(bl.A2, sender=bl.A)


def test_blocked_fee_recipient_blocks_no_pass(bl: Cast) -> None:
    dn = bl.dn
    block(dn, bl.FEE)
    agent_amount, fee = split_fee(10 * USDC)
    for _ in range(2):
        tid = bl.submitted()
        dn.complete_verification(tid, 1, EV1, True, 90, sender=bl.MV)
        assert bl.status(tid) == TaskStatus.COMPLETED
    assert dn.balance_of(bl.A) == 2 * agent_amount
    assert dn.owed(bl.FEE) == 2 * fee
    _conserved(dn, 0)
    block(dn, bl.FEE, False)  # unblocked later: it withdraws to itself
    dn.withdraw(bl.FEE, sender=bl.FEE)
    assert dn.balance_of(bl.FEE) == 2 * fee
    _conserved(dn, 0)


def test_blocked_agent_cannot_freeze_collection_rulings_or_refunds(bl: Cast) -> None:
    dn = bl.dn
    agent_amount, fee = split_fee(10 * USDC)
    escalated = bl.submitted()
    disputed = bl.submitted()
    dn.raise_dispute(disputed, sender=bl.P)
    block(dn, bl.A)
    dn.increase_time(WEEK)
    dn.claim_timeout(escalated, sender=bl.P)
    dn.increase_time(ESCALATION_DELAY)
    dn.collect_escalated(escalated, sender=bl.A)
    dn.resolve_dispute(disputed, 5_000)
    half_agent, half_fee = split_fee(5 * USDC)
    assert bl.status(escalated) == TaskStatus.COMPLETED
    assert bl.status(disputed) == TaskStatus.RESOLVED
    assert dn.owed(bl.A) == agent_amount + half_agent
    assert dn.balance_of(bl.FEE) == fee + half_fee
    # A blocked poster's refund and cancel are credited the same way.
    open_tid = bl.open()
    accepted = bl.open()
    dn.accept_task(accepted, sender=bl.A2)
    block(dn, bl.P)
    dn.cancel(open_tid, sender=bl.P)
    dn.increase_time(WEEK)
    dn.claim_timeout(accepted, sender=bl.P)
    assert dn.owed(bl.P) == 20 * USDC  # cancel + refund
    _conserved(dn, 0)


def test_fee_on_transfer_token_is_refused_at_creation(c: Cast, mock_tokens: dict[str, Any]) -> None:  # noqa: F811
    """Chosen: such a token is refused (balance delta measured), so every task is funded
    with exactly its reward and every event's amounts are what the escrow holds."""
    fot = escrow_over(c.dn, mock_tokens["FeeOnTransferToken"])
    with refused("TokenTransferFailed"):
        fot.post_task(c.P, reward=10 * USDC)
    assert fot.task_count() == 0
    assert fot.balance_of(fot.escrow_address) == 0


# ---------------------------------------------------------------------------- 4. role overlaps


def test_marketplace_verifier_cannot_post_a_task_it_would_judge(c: Cast) -> None:  # noqa: F811
    c.dn.mint(c.MV, 100 * USDC)
    c.dn.approve_escrow(c.MV)
    with refused("VerifierIsPoster"):
        c.dn.post_task(c.MV, reward=10 * USDC)
    # A task it posts for a named verifier is judged by that verifier, not by itself.
    tid = c.dn.post_task(c.MV, reward=10 * USDC, verifier=c.V)
    assert c.dn.verifier_of(tid) == c.V.address


def test_verifier_rotated_to_the_poster_cannot_judge_its_own_task(c: Cast) -> None:  # noqa: F811
    tid = c.submitted()
    c.dn.set_marketplace_verifier(c.P)
    with refused("VerifierIsPoster"):
        c.dn.complete_verification(tid, 1, EV1, True, 90, sender=c.P)
    # The old key judges nothing after the rotation.
    with refused("NotVerifier"):
        c.dn.complete_verification(tid, 1, EV1, True, 90, sender=c.MV)
    c.dn.set_marketplace_verifier(c.OUT)
    c.dn.complete_verification(tid, 1, EV1, True, 90, sender=c.OUT)
    assert c.status(tid) == TaskStatus.COMPLETED


def test_arbiter_never_rules_on_its_own_dispute(c: Cast) -> None:  # noqa: F811
    tid = c.submitted()
    c.dn.raise_dispute(tid, sender=c.A)
    for party in (c.P, c.A):
        c.dn.set_arbiter(party)
        with refused("ArbiterIsParty"):
            c.dn.resolve_dispute(tid, 10_000, sender=party)
    with refused("NotArbiter"):
        c.dn.resolve_dispute(tid, 10_000, sender=c.ARB)  # rotated out
    c.dn.set_arbiter(c.ARB)
    c.dn.resolve_dispute(tid, 10_000)
    assert c.status(tid) == TaskStatus.RESOLVED
