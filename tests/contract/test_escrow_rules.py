"""Every escrow rule on a real anvil: each allowed transition, each refusal (by custom
error), exact payouts to the token unit, and the time boundaries."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from escrowd.devnet import (
    APPEAL_WINDOW,
    DAY,
    ESCALATION_DELAY,
    USDC,
    Actor,
    Devnet,
    EscrowRevert,
    TaskStatus,
    split_fee,
    task_id_of,
    text_hash,
)

ZERO = "0x0000000000000000000000000000000000000000"
REWARD = 10 * USDC
WEEK = 7 * DAY
EV1, EV2, EV3, EV4 = (text_hash(f"evidence {i}") for i in range(1, 5))


@contextmanager
def refused(name: str, *args: Any) -> Iterator[None]:
    """The block must raise EscrowRevert with this custom error (and these args, if given)."""
    with pytest.raises(EscrowRevert) as info:
        yield
    assert info.value.name == name, f"expected {name}, got {info.value}"
    if args:
        assert info.value.error_args == args, f"expected {name}{args}, got {info.value}"


@dataclass
class Cast:
    dn: Devnet
    P: Actor  # poster
    P2: Actor  # another poster
    A: Actor  # agent
    A2: Actor  # another agent
    V: Actor  # named verifier agent
    MV: Actor  # marketplace verifier key
    ARB: Actor  # arbiter
    OWNER: Actor
    FEE: Actor  # platform fee recipient
    OUT: Actor  # an outsider with no role

    def open(
        self, *, reward: int = REWARD, duration: int = WEEK, verifier: Actor | None = None
    ) -> int:
        return self.dn.post_task(self.P, reward=reward, duration=duration, verifier=verifier)

    def accepted(self, **kw: Any) -> int:
        tid = self.open(**kw)
        self.dn.accept_task(tid, sender=self.A)
        return tid

    def submitted(self, ev: bytes = EV1, **kw: Any) -> int:
        tid = self.accepted(**kw)
        self.dn.submit_evidence(tid, ev, sender=self.A)
        return tid

    def judge(self, tid: int) -> Actor:
        return self.V if self.dn.get_task(tid).verifier != ZERO else self.MV

    def fail(self, tid: int, attempt: int, ev: bytes) -> int:
        """Fail `attempt`; returns failedAt."""
        r = self.dn.complete_verification(tid, attempt, ev, False, 10, sender=self.judge(tid))
        return int(self.dn.event(r, "VerificationCompleted")["failedAt"])

    def failed(self, **kw: Any) -> tuple[int, int]:
        tid = self.submitted(EV1, **kw)
        return tid, self.fail(tid, 1, EV1)

    def status(self, tid: int) -> TaskStatus:
        return self.dn.get_task(tid).status


def block_ts(dn: Devnet, receipt: Any) -> int:
    return int(dn.w3.eth.get_block(receipt["blockNumber"])["timestamp"])


@pytest.fixture
def c(dn: Devnet) -> Cast:
    return Cast(
        dn=dn,
        P=dn.posters[0],
        P2=dn.posters[1],
        A=dn.agents[0],
        A2=dn.agents[1],
        V=dn.verifier_agents[0],
        MV=dn.marketplace_verifier,
        ARB=dn.arbiter,
        OWNER=dn.owner,
        FEE=dn.fee_recipient,
        OUT=dn.spare[0],
    )


# ---------------------------------------------------------------------------- deployment


def test_constructor_announces_configuration(c: Cast) -> None:
    events = {e.name: e.args for e in c.dn.logs(to_block=c.dn.deploy_block)}
    assert events["OwnershipTransferred"] == {"previousOwner": ZERO, "newOwner": c.OWNER.address}
    assert events["MarketplaceVerifierChanged"] == {
        "previousVerifier": ZERO,
        "newVerifier": c.MV.address,
    }
    assert events["ArbiterChanged"] == {"previousArbiter": ZERO, "newArbiter": c.ARB.address}
    assert events["FeeRecipientChanged"] == {
        "previousRecipient": ZERO,
        "newRecipient": c.FEE.address,
    }
    assert c.dn.current_marketplace_verifier() == c.MV.address
    assert c.dn.task_count() == 0


def test_status_codes_are_fixed(c: Cast) -> None:
    names = [
        "OPEN", "ACCEPTED", "SUBMITTED", "FAILED", "COMPLETED",
        "DISPUTED", "ESCALATED", "REFUNDED", "CANCELLED", "RESOLVED",
    ]  # fmt: skip
    for code, name in enumerate(names):
        (onchain,) = c.dn.call(c.dn.escrow_address, f"STATUS_{name}")
        assert onchain == code == TaskStatus[name]


# ---------------------------------------------------------------------------- posting


def test_create_task_pulls_reward_and_announces_everything(c: Cast) -> None:
    dn = c.dn
    before_poster, before_escrow = dn.balance_of(c.P), dn.balance_of(dn.escrow_address)
    deadline = dn.now() + WEEK
    th = text_hash("terms")
    r = dn.create_task(sender=c.P, reward=1_234_567, deadline=deadline, task_hash=th)
    ev = dn.event(r, "TaskCreated")
    assert ev.args == {
        "taskId": 1,
        "poster": c.P.address,
        "verifier": ZERO,
        "token": dn.token_address,
        "reward": 1_234_567,
        "deadline": deadline,
        "taskHash": th,
        "status": 0,
    }
    assert dn.balance_of(c.P) == before_poster - 1_234_567
    assert dn.balance_of(dn.escrow_address) == before_escrow + 1_234_567
    t = dn.get_task(1)
    assert (t.poster, t.reward, t.deadline, t.task_hash) == (c.P.address, 1_234_567, deadline, th)
    assert (t.status, t.attempts, t.agent, t.verifier) == (TaskStatus.OPEN, 0, ZERO, ZERO)
    assert (t.failed_at, t.escalated_at, t.disputed, t.judged_mask) == (0, 0, False, 0)
    assert dn.verifier_of(1) == c.MV.address


def test_task_ids_are_sequential_from_one(c: Cast) -> None:
    assert [c.open(), c.open(), c.open()] == [1, 2, 3]
    assert c.dn.task_count() == 3
    with refused("TaskNotFound", 4):
        c.dn.get_task(4)
    with refused("TaskNotFound", 0):
        c.dn.get_task(0)


def test_create_task_with_verifier(c: Cast) -> None:
    dn = c.dn
    deadline = dn.now() + WEEK
    r = dn.create_task_with_verifier(sender=c.P, verifier=c.V, reward=REWARD, deadline=deadline)
    ev = dn.event(r, "TaskCreated")
    assert ev["verifier"] == c.V.address and ev["poster"] == c.P.address
    tid = task_id_of(dn, r)
    assert dn.get_task(tid).verifier == c.V.address
    assert dn.verifier_of(tid) == c.V.address


def test_create_refusals(c: Cast) -> None:
    dn = c.dn
    now = dn.now()
    with refused("ZeroReward"):
        dn.create_task(sender=c.P, reward=0, deadline=now + DAY)
    with refused("ZeroHash"):
        dn.create_task(sender=c.P, reward=1, deadline=now + DAY, task_hash=bytes(32))
    with refused("VerifierIsPoster"):
        dn.create_task_with_verifier(sender=c.P, verifier=c.P, reward=1, deadline=now + DAY)
    with refused("ZeroAddress"):
        dn.create_task_with_verifier(sender=c.P, verifier=ZERO, reward=1, deadline=now + DAY)
    # The deadline must be strictly in the future: equal to the block time is refused.
    t = dn.now() + 10
    dn.set_next_timestamp(t)
    with refused("DeadlineInPast"):
        dn.create_task(sender=c.P, reward=1, deadline=t)
    dn.set_next_timestamp(t + 1)
    dn.create_task(sender=c.P, reward=1, deadline=t + 2)
    # No allowance / no funds: the pull fails and nothing is created.
    dn.mint(c.OUT, REWARD)
    with refused("TokenTransferFailed"):
        dn.create_task(sender=c.OUT, reward=REWARD, deadline=dn.now() + DAY)
    assert dn.task_count() == 1
    assert dn.balance_of(c.OUT) == REWARD


# ---------------------------------------------------------------------------- cancel


def test_cancel_open_task_refunds_in_full(c: Cast) -> None:
    dn = c.dn
    before = dn.balance_of(c.P)
    tid = c.open(reward=7_777_777)
    r = dn.cancel(tid, sender=c.P)
    assert dn.event(r, "TaskCancelled").args == {
        "taskId": tid,
        "poster": c.P.address,
        "refund": 7_777_777,
        "status": TaskStatus.CANCELLED,
    }
    assert dn.balance_of(c.P) == before
    assert dn.balance_of(dn.escrow_address) == 0
    assert c.status(tid) == TaskStatus.CANCELLED


def test_cancel_refusals(c: Cast) -> None:
    dn = c.dn
    tid = c.open()
    with refused("NotPoster"):
        dn.cancel(tid, sender=c.A)
    with refused("TaskNotFound", 99):
        dn.cancel(99, sender=c.P)
    dn.accept_task(tid, sender=c.A)
    with refused("WrongStatus", TaskStatus.ACCEPTED):
        dn.cancel(tid, sender=c.P)
    other = c.open()
    dn.cancel(other, sender=c.P)
    with refused("WrongStatus", TaskStatus.CANCELLED):
        dn.cancel(other, sender=c.P)


# ---------------------------------------------------------------------------- accept


def test_accept(c: Cast) -> None:
    tid = c.open()
    r = c.dn.accept_task(tid, sender=c.A)
    assert c.dn.event(r, "TaskAccepted").args == {
        "taskId": tid,
        "agent": c.A.address,
        "status": TaskStatus.ACCEPTED,
    }
    t = c.dn.get_task(tid)
    assert (t.status, t.agent) == (TaskStatus.ACCEPTED, c.A.address)


def test_accept_refusals(c: Cast) -> None:
    dn = c.dn
    tid = c.open()
    with refused("PosterCannotAccept"):
        dn.accept_task(tid, sender=c.P)
    with refused("VerifierCannotAccept"):  # the marketplace verifier judges this task
        dn.accept_task(tid, sender=c.MV)
    named = c.open(verifier=c.V)
    with refused("VerifierCannotAccept"):
        dn.accept_task(named, sender=c.V)
    dn.accept_task(tid, sender=c.A)
    with refused("WrongStatus", TaskStatus.ACCEPTED):
        dn.accept_task(tid, sender=c.A2)


def test_marketplace_key_may_work_a_task_it_does_not_judge(c: Cast) -> None:
    # Decision: only the task's own judge is barred; on a named-verifier task the
    # marketplace key is just another address.
    tid = c.open(verifier=c.V)
    c.dn.accept_task(tid, sender=c.MV)
    assert c.dn.get_task(tid).agent == c.MV.address


def test_accept_deadline_boundary(c: Cast) -> None:
    dn = c.dn
    deadline = dn.now() + DAY
    a, b = (
        task_id_of(dn, dn.create_task(sender=c.P, reward=REWARD, deadline=deadline))
        for _ in range(2)
    )
    dn.set_next_timestamp(deadline - 1)
    dn.accept_task(a, sender=c.A)
    dn.set_next_timestamp(deadline)
    with refused("DeadlinePassed"):
        dn.accept_task(b, sender=c.A)


# ---------------------------------------------------------------------------- submit


def test_submit_evidence(c: Cast) -> None:
    dn = c.dn
    tid = c.accepted()
    r = dn.submit_evidence(tid, EV1, sender=c.A)
    assert dn.event(r, "EvidenceSubmitted").args == {
        "taskId": tid,
        "agent": c.A.address,
        "attempt": 1,
        "evidenceHash": EV1,
        "status": TaskStatus.SUBMITTED,
    }
    t = dn.get_task(tid)
    assert (t.status, t.attempts, t.last_evidence_hash) == (TaskStatus.SUBMITTED, 1, EV1)
    assert not dn.is_judged(tid, 1)


def test_submit_refusals(c: Cast) -> None:
    dn = c.dn
    open_tid = c.open()
    with refused("NotAgent"):  # nobody holds an Open task
        dn.submit_evidence(open_tid, EV1, sender=c.A)
    tid = c.accepted()
    for outsider in (c.P, c.A2, c.MV):
        with refused("NotAgent"):
            dn.submit_evidence(tid, EV1, sender=outsider)
    with refused("ZeroHash"):
        dn.submit_evidence(tid, bytes(32), sender=c.A)
    dn.submit_evidence(tid, EV1, sender=c.A)
    with refused("WrongStatus", TaskStatus.SUBMITTED):
        dn.submit_evidence(tid, EV2, sender=c.A)
    dn.complete_verification(tid, 1, EV1, True, 90, sender=c.MV)
    with refused("WrongStatus", TaskStatus.COMPLETED):
        dn.submit_evidence(tid, EV2, sender=c.A)


def test_third_submission_allowed_fourth_refused(c: Cast) -> None:
    dn = c.dn
    tid = c.accepted()
    for attempt, ev in enumerate((EV1, EV2, EV3), start=1):
        r = dn.submit_evidence(tid, ev, sender=c.A)
        assert dn.event(r, "EvidenceSubmitted")["attempt"] == attempt
        c.fail(tid, attempt, ev)
    t = dn.get_task(tid)
    assert (t.status, t.attempts, t.judged_mask) == (TaskStatus.FAILED, 3, 0b111)
    with refused("MaxSubmissionsReached"):
        dn.submit_evidence(tid, EV4, sender=c.A)


def test_submission_at_deadline_refused_one_second_before_allowed(c: Cast) -> None:
    dn = c.dn
    tid = c.accepted(duration=DAY)
    deadline = dn.get_task(tid).deadline
    dn.set_next_timestamp(deadline - 1)
    dn.submit_evidence(tid, EV1, sender=c.A)
    dn.set_next_timestamp(deadline - 1)  # anvil allows equal block timestamps
    c.fail(tid, 1, EV1)
    dn.set_next_timestamp(deadline)
    with refused("DeadlinePassed"):
        dn.submit_evidence(tid, EV2, sender=c.A)
    dn.set_next_timestamp(deadline + 1)
    with refused("DeadlinePassed"):
        dn.submit_evidence(tid, EV2, sender=c.A)


def test_resubmission_from_failed_with_new_evidence(c: Cast) -> None:
    dn = c.dn
    tid, _ = c.failed()
    r = dn.submit_evidence(tid, EV2, sender=c.A)
    assert dn.event(r, "EvidenceSubmitted")["attempt"] == 2
    t = dn.get_task(tid)
    assert (t.status, t.attempts, t.last_evidence_hash) == (TaskStatus.SUBMITTED, 2, EV2)
    assert dn.is_judged(tid, 1) and not dn.is_judged(tid, 2)


# ---------------------------------------------------------------------------- verdicts


@pytest.mark.parametrize(
    ("reward", "agent_amount", "fee"),
    [(10 * USDC, 9 * USDC, USDC), (1_000_009, 900_009, 100_000), (9, 9, 0), (1, 1, 0)],
)
def test_pass_pays_90_10_in_the_same_transaction(
    c: Cast, reward: int, agent_amount: int, fee: int
) -> None:
    dn = c.dn
    assert split_fee(reward) == (agent_amount, fee)
    tid = c.submitted(reward=reward)
    agent0, fee0 = dn.balance_of(c.A), dn.balance_of(c.FEE)
    r = dn.complete_verification(tid, 1, EV1, True, 95, sender=c.MV)
    assert dn.event(r, "VerificationCompleted").args == {
        "taskId": tid,
        "verifier": c.MV.address,
        "attempt": 1,
        "evidenceHash": EV1,
        "passed": True,
        "score": 95,
        "agent": c.A.address,
        "agentPayout": agent_amount,
        "fee": fee,
        "failedAt": 0,
        "status": TaskStatus.COMPLETED,
    }
    transfers = [(e["to"], e["value"]) for e in dn.events(r) if e.name == "Transfer"]
    assert transfers == [(c.A.address, agent_amount)] + ([(c.FEE.address, fee)] if fee else [])
    assert dn.balance_of(c.A) == agent0 + agent_amount
    assert dn.balance_of(c.FEE) == fee0 + fee
    assert dn.balance_of(dn.escrow_address) == 0
    assert c.status(tid) == TaskStatus.COMPLETED
    assert dn.is_judged(tid, 1)


def test_fail_records_failure_time_and_pays_nothing(c: Cast) -> None:
    dn = c.dn
    tid = c.submitted()
    agent0 = dn.balance_of(c.A)
    r = dn.complete_verification(tid, 1, EV1, False, 42, sender=c.MV)
    ev = dn.event(r, "VerificationCompleted")
    assert ev["passed"] is False and ev["score"] == 42
    assert (ev["agentPayout"], ev["fee"], ev["status"]) == (0, 0, TaskStatus.FAILED)
    assert ev["failedAt"] == block_ts(dn, r)
    t = dn.get_task(tid)
    assert (t.status, t.failed_at) == (TaskStatus.FAILED, ev["failedAt"])
    assert dn.balance_of(c.A) == agent0
    assert dn.balance_of(dn.escrow_address) == REWARD
    assert not [e for e in dn.events(r) if e.name == "Transfer"]


def test_named_verifier_only(c: Cast) -> None:
    dn = c.dn
    tid = c.submitted(verifier=c.V)
    for wrong in (c.MV, c.P, c.A, c.OUT, c.ARB):
        with refused("NotVerifier"):
            dn.complete_verification(tid, 1, EV1, True, 100, sender=wrong)
    r = dn.complete_verification(tid, 1, EV1, True, 100, sender=c.V)
    assert dn.event(r, "VerificationCompleted")["verifier"] == c.V.address


def test_marketplace_verifier_only(c: Cast) -> None:
    dn = c.dn
    tid = c.submitted()
    for wrong in (c.V, c.P, c.A, c.OUT, c.OWNER):
        with refused("NotVerifier"):
            dn.complete_verification(tid, 1, EV1, True, 100, sender=wrong)
    dn.complete_verification(tid, 1, EV1, True, 100, sender=c.MV)


def test_verdict_never_from_the_worker(c: Cast) -> None:
    # The only way the judge can be the worker: the marketplace key rotated to the agent.
    dn = c.dn
    tid = c.submitted()
    dn.set_marketplace_verifier(c.A)
    with refused("VerifierIsWorker"):
        dn.complete_verification(tid, 1, EV1, True, 100, sender=c.A)
    # ...and the rotated key may not take marketplace tasks either.
    with refused("VerifierCannotAccept"):
        dn.accept_task(c.open(), sender=c.A)


def test_verdict_must_name_current_attempt_and_evidence(c: Cast) -> None:
    dn = c.dn
    tid = c.submitted()
    with refused("WrongAttempt", 1, 2):
        dn.complete_verification(tid, 2, EV1, True, 100, sender=c.MV)
    with refused("WrongAttempt", 1, 0):
        dn.complete_verification(tid, 0, EV1, True, 100, sender=c.MV)
    with refused("EvidenceMismatch"):
        dn.complete_verification(tid, 1, EV2, True, 100, sender=c.MV)
    with refused("InvalidScore", 101):
        dn.complete_verification(tid, 1, EV1, True, 101, sender=c.MV)
    c.fail(tid, 1, EV1)
    dn.submit_evidence(tid, EV2, sender=c.A)
    # A late verdict for attempt 1 can never land on attempt 2.
    with refused("AlreadyJudged", 1):
        dn.complete_verification(tid, 1, EV1, True, 100, sender=c.MV)
    with refused("EvidenceMismatch"):
        dn.complete_verification(tid, 2, EV1, True, 100, sender=c.MV)
    dn.complete_verification(tid, 2, EV2, True, 100, sender=c.MV)
    with refused("AlreadyJudged", 2):
        dn.complete_verification(tid, 2, EV2, True, 100, sender=c.MV)
    with refused("WrongStatus", TaskStatus.COMPLETED):
        dn.complete_verification(tid, 3, EV3, True, 100, sender=c.MV)


def test_verdict_needs_a_submission(c: Cast) -> None:
    tid = c.accepted()
    with refused("WrongStatus", TaskStatus.ACCEPTED):
        c.dn.complete_verification(tid, 1, EV1, True, 100, sender=c.MV)
    with refused("WrongStatus", TaskStatus.OPEN):
        c.dn.complete_verification(c.open(), 1, EV1, True, 100, sender=c.MV)


def test_verdict_after_deadline_while_still_submitted(c: Cast) -> None:
    dn = c.dn
    tid = c.submitted(duration=DAY)
    dn.set_next_timestamp(dn.get_task(tid).deadline + DAY)
    dn.complete_verification(tid, 1, EV1, True, 100, sender=c.MV)
    assert c.status(tid) == TaskStatus.COMPLETED


# ---------------------------------------------------------------------------- rotation


def test_marketplace_verifier_rotation(c: Cast) -> None:
    dn = c.dn
    new = dn.spare[1]
    tid = c.submitted()
    named = c.submitted(verifier=c.V)
    with refused("NotOwner"):
        dn.set_marketplace_verifier(new, sender=c.MV)
    with refused("ZeroAddress"):
        dn.set_marketplace_verifier(ZERO)
    r = dn.set_marketplace_verifier(new)
    assert dn.event(r, "MarketplaceVerifierChanged").args == {
        "previousVerifier": c.MV.address,
        "newVerifier": new.address,
    }
    assert dn.current_marketplace_verifier() == new.address
    assert dn.verifier_of(tid) == new.address
    with refused("NotVerifier"):
        dn.complete_verification(tid, 1, EV1, True, 100, sender=c.MV)
    dn.complete_verification(tid, 1, EV1, True, 100, sender=new)
    # A named verifier is unaffected by the rotation.
    with refused("NotVerifier"):
        dn.complete_verification(named, 1, EV1, True, 100, sender=new)
    dn.complete_verification(named, 1, EV1, True, 100, sender=c.V)


def test_owner_administration(c: Cast) -> None:
    dn = c.dn
    new_owner, new_fee, new_arb = dn.spare[0], dn.spare[1], dn.spare[2]
    for call in (dn.set_arbiter, dn.set_fee_recipient, dn.transfer_ownership):
        with refused("NotOwner"):
            call(new_owner, sender=c.P)
        with refused("ZeroAddress"):
            call(ZERO)
    r = dn.set_fee_recipient(new_fee)
    assert dn.event(r, "FeeRecipientChanged").args == {
        "previousRecipient": c.FEE.address,
        "newRecipient": new_fee.address,
    }
    r = dn.set_arbiter(new_arb)
    assert dn.event(r, "ArbiterChanged")["newArbiter"] == new_arb.address
    r = dn.transfer_ownership(new_owner)
    assert dn.event(r, "OwnershipTransferred").args == {
        "previousOwner": c.OWNER.address,
        "newOwner": new_owner.address,
    }
    with refused("NotOwner"):
        dn.set_marketplace_verifier(c.OUT, sender=c.OWNER)
    dn.set_marketplace_verifier(dn.spare[1], sender=new_owner)
    # The new fee recipient receives the fee.
    tid = c.submitted()
    dn.complete_verification(tid, 1, EV1, True, 100, sender=dn.spare[1])
    assert dn.balance_of(new_fee) == USDC


# ---------------------------------------------------------------------------- disputes


def test_poster_disputes_submitted_before_deadline(c: Cast) -> None:
    dn = c.dn
    tid = c.submitted()
    r = dn.raise_dispute(tid, sender=c.P)
    assert dn.event(r, "DisputeRaised").args == {
        "taskId": tid,
        "by": c.P.address,
        "previousStatus": TaskStatus.SUBMITTED,
        "attempt": 1,
        "status": TaskStatus.DISPUTED,
    }
    t = dn.get_task(tid)
    assert (t.status, t.disputed) == (TaskStatus.DISPUTED, True)
    # A disputed task is frozen for everyone but the arbiter.
    with refused("WrongStatus", TaskStatus.DISPUTED):
        dn.complete_verification(tid, 1, EV1, True, 100, sender=c.MV)
    with refused("WrongStatus", TaskStatus.DISPUTED):
        dn.raise_dispute(tid, sender=c.A)
    with refused("WrongStatus", TaskStatus.DISPUTED):
        dn.claim_timeout(tid, sender=c.P)


@pytest.mark.parametrize("who", ["poster", "agent"])
@pytest.mark.parametrize("state", ["submitted", "failed"])
def test_either_party_disputes_before_deadline(c: Cast, who: str, state: str) -> None:
    tid = c.submitted() if state == "submitted" else c.failed()[0]
    sender = c.P if who == "poster" else c.A
    r = c.dn.raise_dispute(tid, sender=sender)
    assert c.dn.event(r, "DisputeRaised")["by"] == sender.address
    assert c.status(tid) == TaskStatus.DISPUTED


def test_dispute_refusals_before_deadline(c: Cast) -> None:
    dn = c.dn
    tid = c.submitted()
    for outsider in (c.OUT, c.A2, c.MV, c.ARB):
        with refused("NotParty"):
            dn.raise_dispute(tid, sender=outsider)
    with refused("WrongStatus", TaskStatus.OPEN):
        dn.raise_dispute(c.open(), sender=c.P)
    with refused("WrongStatus", TaskStatus.ACCEPTED):
        dn.raise_dispute(c.accepted(), sender=c.A)
    done = c.submitted()
    dn.complete_verification(done, 1, EV1, True, 100, sender=c.MV)
    with refused("WrongStatus", TaskStatus.COMPLETED):
        dn.raise_dispute(done, sender=c.P)


def test_after_deadline_only_the_agent_only_on_failed(c: Cast) -> None:
    dn = c.dn
    failed, failed_at = c.failed(duration=DAY)
    submitted = c.submitted(duration=DAY)
    # "At the deadline" already counts as after it: use the later of the two deadlines.
    deadline = max(dn.get_task(failed).deadline, dn.get_task(submitted).deadline)
    dn.set_next_timestamp(deadline)
    with refused("DeadlinePassed"):
        dn.raise_dispute(failed, sender=c.P)
    with refused("DeadlinePassed"):
        dn.raise_dispute(submitted, sender=c.P)
    with refused("WrongStatus", TaskStatus.SUBMITTED):
        dn.raise_dispute(submitted, sender=c.A)
    r = dn.raise_dispute(failed, sender=c.A)
    assert dn.event(r, "DisputeRaised")["previousStatus"] == TaskStatus.FAILED
    assert failed_at + APPEAL_WINDOW > deadline


def test_poster_dispute_one_second_before_deadline(c: Cast) -> None:
    dn = c.dn
    tid = c.submitted(duration=DAY)
    dn.set_next_timestamp(dn.get_task(tid).deadline - 1)
    dn.raise_dispute(tid, sender=c.P)
    assert c.status(tid) == TaskStatus.DISPUTED


def _failed_at_deadline(c: Cast) -> tuple[int, int]:
    """A task whose only attempt failed one second before its deadline."""
    dn = c.dn
    tid = c.submitted(duration=DAY)
    dn.set_next_timestamp(dn.get_task(tid).deadline - 1)
    return tid, c.fail(tid, 1, EV1)


def test_agent_dispute_at_exactly_three_days(c: Cast) -> None:
    tid, failed_at = _failed_at_deadline(c)
    c.dn.set_next_timestamp(failed_at + APPEAL_WINDOW)
    c.dn.raise_dispute(tid, sender=c.A)
    assert c.status(tid) == TaskStatus.DISPUTED


def test_agent_dispute_one_second_after_three_days(c: Cast) -> None:
    tid, failed_at = _failed_at_deadline(c)
    c.dn.set_next_timestamp(failed_at + APPEAL_WINDOW + 1)
    with refused("AppealWindowClosed"):
        c.dn.raise_dispute(tid, sender=c.A)


def test_appeal_window_counts_from_the_verdict_not_the_deadline(c: Cast) -> None:
    # Failed early: by the time the deadline passes, the 3 days are long over.
    dn = c.dn
    tid, failed_at = c.failed(duration=WEEK)
    deadline = dn.get_task(tid).deadline
    assert deadline > failed_at + APPEAL_WINDOW
    dn.set_next_timestamp(deadline)
    with refused("AppealWindowClosed"):
        dn.raise_dispute(tid, sender=c.A)
    dn.claim_timeout(tid, sender=c.P)  # ...and the poster's refund is open at once
    assert c.status(tid) == TaskStatus.REFUNDED


# ---------------------------------------------------------------------------- rulings


@pytest.mark.parametrize(
    ("reward", "bps", "agent_amount", "fee", "poster_amount"),
    [
        (10_000_001, 6_000, 5_400_000, 600_000, 4_000_001),
        (10 * USDC, 10_000, 9 * USDC, USDC, 0),
        (10 * USDC, 0, 0, 0, 10 * USDC),
        (7, 5_000, 3, 0, 4),
    ],
)
def test_arbiter_split(
    c: Cast, reward: int, bps: int, agent_amount: int, fee: int, poster_amount: int
) -> None:
    dn = c.dn
    tid = c.submitted(reward=reward)
    dn.raise_dispute(tid, sender=c.P)
    p0, a0, f0 = dn.balance_of(c.P), dn.balance_of(c.A), dn.balance_of(c.FEE)
    r = dn.resolve_dispute(tid, bps)
    assert dn.event(r, "DisputeResolved").args == {
        "taskId": tid,
        "arbiter": c.ARB.address,
        "agentShareBps": bps,
        "agent": c.A.address,
        "agentAmount": agent_amount,
        "fee": fee,
        "poster": c.P.address,
        "posterAmount": poster_amount,
        "previousStatus": TaskStatus.DISPUTED,
        "status": TaskStatus.RESOLVED,
    }
    assert agent_amount + fee + poster_amount == reward
    assert dn.balance_of(c.P) == p0 + poster_amount
    assert dn.balance_of(c.A) == a0 + agent_amount
    assert dn.balance_of(c.FEE) == f0 + fee
    assert dn.balance_of(dn.escrow_address) == 0
    assert c.status(tid) == TaskStatus.RESOLVED


def test_resolve_refusals(c: Cast) -> None:
    dn = c.dn
    tid = c.submitted()
    with refused("WrongStatus", TaskStatus.SUBMITTED):
        dn.resolve_dispute(tid, 5_000)
    dn.raise_dispute(tid, sender=c.A)
    for wrong in (c.P, c.A, c.OWNER, c.MV):
        with refused("NotArbiter"):
            dn.resolve_dispute(tid, 5_000, sender=wrong)
    with refused("InvalidShare", 10_001):
        dn.resolve_dispute(tid, 10_001)
    dn.resolve_dispute(tid, 5_000)
    with refused("WrongStatus", TaskStatus.RESOLVED):
        dn.resolve_dispute(tid, 5_000)


def test_arbiter_rotation(c: Cast) -> None:
    dn = c.dn
    tid = c.submitted()
    dn.raise_dispute(tid, sender=c.A)
    dn.set_arbiter(dn.spare[2])
    with refused("NotArbiter"):
        dn.resolve_dispute(tid, 0, sender=c.ARB)
    dn.resolve_dispute(tid, 0, sender=dn.spare[2])


# ---------------------------------------------------------------------------- timeouts


@pytest.mark.parametrize("state", ["open", "accepted"])
def test_never_delivered_full_refund_at_deadline(c: Cast, state: str) -> None:
    dn = c.dn
    p0 = dn.balance_of(c.P)
    tid = c.open(reward=3_333_333, duration=DAY) if state == "open" else c.accepted(duration=DAY)
    reward = dn.get_task(tid).reward
    deadline = dn.get_task(tid).deadline
    dn.set_next_timestamp(deadline - 1)
    with refused("DeadlineNotReached"):
        dn.claim_timeout(tid, sender=c.P)
    dn.set_next_timestamp(deadline)
    r = dn.claim_timeout(tid, sender=c.P)
    assert dn.event(r, "TaskRefunded").args == {
        "taskId": tid,
        "poster": c.P.address,
        "amount": reward,
        "previousStatus": TaskStatus.OPEN if state == "open" else TaskStatus.ACCEPTED,
        "status": TaskStatus.REFUNDED,
    }
    assert dn.balance_of(c.P) == p0
    assert dn.balance_of(dn.escrow_address) == 0


def test_claim_timeout_refusals(c: Cast) -> None:
    dn = c.dn
    tid = c.open(duration=DAY)
    done = c.submitted(duration=DAY)
    dn.complete_verification(done, 1, EV1, True, 100, sender=c.MV)
    disputed = c.submitted(duration=DAY)
    dn.raise_dispute(disputed, sender=c.P)
    dn.set_next_timestamp(dn.get_task(tid).deadline + 1)
    with refused("NotPoster"):
        dn.claim_timeout(tid, sender=c.A)
    with refused("WrongStatus", TaskStatus.COMPLETED):
        dn.claim_timeout(done, sender=c.P)
    with refused("WrongStatus", TaskStatus.DISPUTED):
        dn.claim_timeout(disputed, sender=c.P)
    dn.claim_timeout(tid, sender=c.P)
    with refused("WrongStatus", TaskStatus.REFUNDED):
        dn.claim_timeout(tid, sender=c.P)


def test_failed_refund_waits_for_the_appeal_window(c: Cast) -> None:
    dn = c.dn
    tid, failed_at = _failed_at_deadline(c)
    p0 = dn.balance_of(c.P)
    closes = failed_at + APPEAL_WINDOW
    dn.set_next_timestamp(closes)
    with refused("AppealWindowOpen", closes):  # exactly 3 days: the agent may still appeal
        dn.claim_timeout(tid, sender=c.P)
    dn.set_next_timestamp(closes + 1)
    r = dn.claim_timeout(tid, sender=c.P)
    ev = dn.event(r, "TaskRefunded")
    assert (ev["amount"], ev["previousStatus"]) == (REWARD, TaskStatus.FAILED)
    assert dn.balance_of(c.P) == p0 + REWARD


def test_failed_task_before_deadline_is_not_refundable(c: Cast) -> None:
    tid, _ = c.failed()
    with refused("DeadlineNotReached"):
        c.dn.claim_timeout(tid, sender=c.P)


def test_delivered_never_judged_escalates_without_refund(c: Cast) -> None:
    dn = c.dn
    tid = c.submitted(duration=DAY)
    p0 = dn.balance_of(c.P)
    deadline = dn.get_task(tid).deadline
    dn.set_next_timestamp(deadline)
    r = dn.claim_timeout(tid, sender=c.P)
    now = block_ts(dn, r)
    assert dn.event(r, "TaskEscalated").args == {
        "taskId": tid,
        "poster": c.P.address,
        "agent": c.A.address,
        "attempt": 1,
        "escalatedAt": now,
        "collectibleAt": now + ESCALATION_DELAY,
        "status": TaskStatus.ESCALATED,
    }
    t = dn.get_task(tid)
    assert (t.status, t.escalated_at) == (TaskStatus.ESCALATED, now)
    assert dn.balance_of(c.P) == p0
    assert dn.balance_of(dn.escrow_address) == REWARD
    with refused("WrongStatus", TaskStatus.ESCALATED):
        dn.complete_verification(tid, 1, EV1, True, 100, sender=c.MV)
    with refused("WrongStatus", TaskStatus.ESCALATED):
        dn.claim_timeout(tid, sender=c.P)
    with refused("WrongStatus", TaskStatus.ESCALATED):
        dn.raise_dispute(tid, sender=c.A)


def _escalated(c: Cast, reward: int = REWARD) -> tuple[int, int]:
    tid = c.submitted(duration=DAY, reward=reward)
    c.dn.set_next_timestamp(c.dn.get_task(tid).deadline)
    r = c.dn.claim_timeout(tid, sender=c.P)
    return tid, int(c.dn.event(r, "TaskEscalated")["escalatedAt"])


def test_collect_one_second_before_fourteen_days_refused(c: Cast) -> None:
    tid, at = _escalated(c)
    c.dn.set_next_timestamp(at + ESCALATION_DELAY - 1)
    with refused("EscalationNotMature", at + ESCALATION_DELAY):
        c.dn.collect_escalated(tid, sender=c.A)


def test_collect_at_exactly_fourteen_days_pays_like_a_pass(c: Cast) -> None:
    dn = c.dn
    tid, at = _escalated(c, reward=1_000_009)
    a0, f0 = dn.balance_of(c.A), dn.balance_of(c.FEE)
    dn.set_next_timestamp(at + ESCALATION_DELAY)
    r = dn.collect_escalated(tid, sender=c.A)
    assert dn.event(r, "EscalationCollected").args == {
        "taskId": tid,
        "agent": c.A.address,
        "agentAmount": 900_009,
        "fee": 100_000,
        "status": TaskStatus.COMPLETED,
    }
    assert dn.balance_of(c.A) == a0 + 900_009
    assert dn.balance_of(c.FEE) == f0 + 100_000
    assert dn.balance_of(dn.escrow_address) == 0
    with refused("WrongStatus", TaskStatus.COMPLETED):
        dn.collect_escalated(tid, sender=c.A)


def test_collect_refusals(c: Cast) -> None:
    dn = c.dn
    submitted = c.submitted()
    with refused("WrongStatus", TaskStatus.SUBMITTED):
        dn.collect_escalated(submitted, sender=c.A)
    tid, at = _escalated(c)
    dn.set_next_timestamp(at + ESCALATION_DELAY)
    for wrong in (c.P, c.A2, c.ARB):
        with refused("NotAgent"):
            dn.collect_escalated(tid, sender=wrong)


def test_arbiter_rules_first_on_escalated_task(c: Cast) -> None:
    dn = c.dn
    tid, at = _escalated(c)
    p0 = dn.balance_of(c.P)
    dn.set_next_timestamp(at + ESCALATION_DELAY - 1)
    r = dn.resolve_dispute(tid, 0)  # the arbiter sides with the poster
    ev = dn.event(r, "DisputeResolved")
    assert (ev["previousStatus"], ev["posterAmount"]) == (TaskStatus.ESCALATED, REWARD)
    assert dn.balance_of(c.P) == p0 + REWARD
    dn.set_next_timestamp(at + ESCALATION_DELAY)
    with refused("WrongStatus", TaskStatus.RESOLVED):
        dn.collect_escalated(tid, sender=c.A)
    t = dn.get_task(tid)
    assert (t.status, t.disputed) == (TaskStatus.RESOLVED, False)
