"""`completeVerificationBatch`: each item checked exactly like `completeVerification`, a
refused item stops nothing, settled items emit their usual event, and the gas per verdict.

The refusals are compared with the single call's revert on the same state (same custom
error, same arguments); the hostile token is the re-entering `OddToken` of
tests/contract/test_escrow_tokens.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from eth_abi.abi import decode as abi_decode
from hexbytes import HexBytes

from escrowd.devnet import USDC, Actor, Devnet, TaskStatus, split_fee, text_hash
from tests.contract.test_escrow_rules import REWARD, Cast, c, refused  # noqa: F401 -- fixture c
from tests.contract.test_escrow_tokens import (  # noqa: F401 -- fixtures
    _read_bytes,
    _read_word,
    _selector,
    _set_mode,
    odd,
    odd_token_artifact,
)

BATCH_GAS = 29_000_000
Item = tuple[int, int, bytes, bool, int]  # (taskId, attempt, evidenceHash, passed, score)


def _data(dn: Devnet, items: list[Item]) -> str:
    return dn._codec.encode_call("completeVerificationBatch", [items])


def simulate(dn: Devnet, sender: Actor, items: list[Item]) -> list[tuple[str, tuple[Any, ...]] | None]:
    """Per item: None when it would settle, else the refusal (error name, arguments)."""
    reply = dn.rpc("eth_call", {"from": sender.address, "to": dn.escrow_address, "data": _data(dn, items)}, "latest")
    (refusals,) = abi_decode(["bytes[]"], HexBytes(reply))
    return [dn._codec.decode_error(bytes(r)) if r else None for r in refusals]


def send_batch(dn: Devnet, sender: Actor, items: list[Item]) -> Any:
    tx_hash = dn.rpc(
        "eth_sendTransaction",
        {"from": sender.address, "to": dn.escrow_address, "data": _data(dn, items), "gas": hex(BATCH_GAS)},
    )
    receipt = dn.wait_for_receipt(tx_hash)
    if receipt["status"] != 1:
        raise dn._revert_of(tx_hash)
    return receipt


def submitted(cast: Cast, count: int, *, verifier: Actor | None = None) -> list[Item]:
    """`count` tasks with evidence, as passing verdict items with scores 60, 61, ..."""
    items: list[Item] = []
    for i in range(count):
        tid = cast.dn.post_task(cast.P, reward=REWARD, verifier=verifier)
        cast.dn.accept_task(tid, sender=cast.A)
        ev = text_hash(f"batch evidence {tid}")
        cast.dn.submit_evidence(tid, ev, sender=cast.A)
        items.append((tid, 1, ev, True, 60 + i))
    return items


def test_every_item_settles_with_its_usual_event_and_payout(c: Cast) -> None:  # noqa: F811
    items = submitted(c, 4)
    items[1] = (*items[1][:3], False, 12)  # a failing verdict among passing ones
    assert simulate(c.dn, c.MV, items) == [None] * 4
    before = c.dn.balances_of([c.A, c.FEE])
    receipt = send_batch(c.dn, c.MV, items)
    events = [e for e in c.dn.events(receipt) if e.name == "VerificationCompleted"]
    assert [(e["taskId"], e["attempt"], e["passed"], e["score"]) for e in events] == [
        (tid, 1, passed, score) for tid, _, _, passed, score in items
    ]
    agent_amount, fee = split_fee(REWARD)
    for event, (tid, _, ev, passed, _) in zip(events, items, strict=True):
        assert event["verifier"] == c.MV.address
        assert bytes(event["evidenceHash"]) == ev
        assert event["agent"] == c.A.address
        assert (event["agentPayout"], event["fee"]) == ((agent_amount, fee) if passed else (0, 0))
        assert c.dn.get_task(tid).status == (TaskStatus.COMPLETED if passed else TaskStatus.FAILED)
        assert c.dn.is_judged(tid, 1)
    assert c.dn.balances_of([c.A, c.FEE]) == [before[0] + 3 * agent_amount, before[1] + 3 * fee]


def test_refused_items_change_nothing_and_stop_nothing(c: Cast) -> None:  # noqa: F811
    good = submitted(c, 3)
    judged, mismatch, wrong_attempt, bad_score = submitted(c, 4)
    c.dn.complete_verification(judged[0], 1, judged[2], True, 90, sender=c.MV)
    named = submitted(c, 1, verifier=c.V)[0]
    items: list[Item] = [
        good[0],
        judged,
        (mismatch[0], 1, text_hash("not the evidence"), True, 50),
        (wrong_attempt[0], 2, wrong_attempt[2], True, 50),
        (99_999, 1, good[1][2], True, 50),
        (bad_score[0], 1, bad_score[2], True, 101),
        named,
        good[0],  # the same attempt again in the same batch
        good[1],
        good[2],
    ]
    expected = [
        None,
        ("AlreadyJudged", (1,)),
        ("EvidenceMismatch", ()),
        ("WrongAttempt", (1, 2)),
        ("TaskNotFound", (99_999,)),
        ("InvalidScore", (101,)),
        ("NotVerifier", ()),
        ("AlreadyJudged", (1,)),
        None,
        None,
    ]
    assert simulate(c.dn, c.MV, items) == expected
    # Each refusal is exactly the single call's revert on the same state.
    for item, refusal in zip(items[1:7], expected[1:7], strict=True):
        assert refusal is not None
        with refused(refusal[0], *refusal[1]):
            c.dn.complete_verification(*item, sender=c.MV)
    untouched = [mismatch[0], wrong_attempt[0], bad_score[0], named[0]]
    states = c.dn.get_tasks(untouched)
    receipt = send_batch(c.dn, c.MV, items)
    settled = [e["taskId"] for e in c.dn.events(receipt) if e.name == "VerificationCompleted"]
    assert settled == [good[0][0], good[1][0], good[2][0]]
    assert c.dn.get_tasks(untouched) == states
    assert all(c.dn.get_task(tid).status == TaskStatus.COMPLETED for tid, *_ in good)


def test_roles_are_checked_per_item_as_in_the_single_call(c: Cast) -> None:  # noqa: F811
    marketplace = submitted(c, 2)
    named = submitted(c, 2, verifier=c.V)
    mixed = [marketplace[0], named[0], marketplace[1], named[1]]
    # An outsider settles nothing (and its transaction does not revert).
    assert simulate(c.dn, c.OUT, mixed) == [("NotVerifier", ())] * 4
    receipt = send_batch(c.dn, c.OUT, mixed)
    assert [e for e in c.dn.events(receipt) if e.name == "VerificationCompleted"] == []
    # The named verifier settles its own tasks only; the marketplace key the others.
    assert simulate(c.dn, c.V, mixed) == [("NotVerifier", ()), None, ("NotVerifier", ()), None]
    send_batch(c.dn, c.V, mixed)
    assert [c.dn.is_judged(tid, 1) for tid, *_ in mixed] == [False, True, False, True]
    send_batch(c.dn, c.MV, mixed)
    assert all(c.dn.is_judged(tid, 1) for tid, *_ in mixed)


def test_the_verifier_may_not_judge_its_own_work(c: Cast) -> None:  # noqa: F811
    # The marketplace key rotated to the task's agent: VerifierIsWorker, as in the single call.
    (own,) = submitted(c, 1)
    c.dn.set_marketplace_verifier(c.A)
    assert simulate(c.dn, c.A, [own]) == [("VerifierIsWorker", ())]
    with refused("VerifierIsWorker"):
        c.dn.complete_verification(*own, sender=c.A)
    send_batch(c.dn, c.A, [own])
    assert not c.dn.is_judged(own[0], 1)


def test_an_empty_batch_does_nothing_and_a_huge_one_is_refused(c: Cast) -> None:  # noqa: F811
    assert simulate(c.dn, c.MV, []) == []
    (max_batch,) = c.dn.call(c.dn.escrow_address, "MAX_BATCH")
    assert max_batch == 256
    item = submitted(c, 1)[0]
    with refused("BatchTooLarge", 256):
        send_batch(c.dn, c.MV, [item] * 257)
    assert not c.dn.is_judged(item[0], 1)


def test_a_reentering_token_is_stopped_and_every_agent_paid_once(odd: Devnet) -> None:  # noqa: F811
    p, a, mv = odd.posters[0], odd.agents[0], odd.marketplace_verifier
    items: list[Item] = []
    for i in range(3):
        tid = odd.post_task(p, reward=10 * USDC)
        odd.accept_task(tid, sender=a)
        ev = text_hash(f"odd {i}")
        odd.submit_evidence(tid, ev, sender=a)
        items.append((tid, 1, ev, True, 90))
    # During the first payout the token calls the batch again with the first item (its
    # hook runs under the escrow's TRANSFER_GAS: a longer call read from its storage would
    # run the hook out of gas before the guard is reached; then the push is credited).
    reenter = bytes(HexBytes(_data(odd, items[:1])))
    arm = (
        "0x"
        + _selector("arm(address,bytes)")
        + f"{int(odd.escrow_address, 16):064x}"
        + f"{64:064x}"
        + f"{len(reenter):064x}"
        + reenter.hex().ljust(((len(reenter) + 31) // 32) * 64, "0")
    )
    odd.send(odd.owner, odd.token_address, arm)
    receipt = send_batch(odd, mv, items)
    assert len([e for e in odd.events(receipt) if e.name == "VerificationCompleted"]) == 3
    assert _read_word(odd, "reentryOk()") == 0
    assert _read_bytes(odd, "reentryResult()") == text_hash("Reentrancy()")[:4]
    assert odd.balance_of(a) == 3 * 9 * USDC  # paid exactly once per task
    assert odd.balance_of(odd.escrow_address) == 0


def test_a_refused_payout_is_credited_and_does_not_stop_the_batch(odd: Devnet) -> None:  # noqa: F811
    p, a, mv = odd.posters[0], odd.agents[0], odd.marketplace_verifier
    items: list[Item] = []
    for i in range(2):
        tid = odd.post_task(p, reward=10 * USDC)
        odd.accept_task(tid, sender=a)
        ev = text_hash(f"odd refusing {i}")
        odd.submit_evidence(tid, ev, sender=a)
        items.append((tid, 1, ev, True, 90))
    _set_mode(odd, 1)  # every transfer answers false
    receipt = send_batch(odd, mv, items)
    names = [e.name for e in odd.events(receipt)]
    assert names.count("VerificationCompleted") == 2
    assert names.count("PaymentDeferred") == 4  # agent share and fee, per task
    assert odd.owed(a) == 2 * 9 * USDC


def _gas(receipt: Any) -> int:
    return int(receipt["gasUsed"])


def test_gas_per_verdict_falls_with_the_batch_size(c: Cast) -> None:  # noqa: F811
    """Reported in docs/contract.md; here only its direction is asserted."""
    singles = submitted(c, 3)
    single = [_gas(c.dn.complete_verification(*item, sender=c.MV)) for item in singles]
    per_verdict: dict[int, float] = {}
    for size in (1, 10, 50):
        items = submitted(c, size)
        per_verdict[size] = _gas(send_batch(c.dn, c.MV, items)) / size
    print(f"gas per verdict: single {single}, batch {per_verdict}")
    assert per_verdict[1] > min(single)  # a batch of one carries the array's overhead
    assert per_verdict[10] < min(single)
    assert per_verdict[50] < per_verdict[10]


@pytest.mark.parametrize("passed", [True, False])
def test_a_batch_of_one_matches_the_single_call_state(c: Cast, passed: bool) -> None:  # noqa: F811
    a, b = submitted(c, 2)
    a = (*a[:3], passed, 77)
    b = (*b[:3], passed, 77)
    single = c.dn.complete_verification(*a, sender=c.MV)
    batch = send_batch(c.dn, c.MV, [b])
    ea, eb = c.dn.event(single, "VerificationCompleted"), c.dn.event(batch, "VerificationCompleted")
    different = {"taskId", "evidenceHash", "failedAt"}
    assert {k: v for k, v in ea.args.items() if k not in different} == {
        k: v for k, v in eb.args.items() if k not in different
    }
    ta, tb = c.dn.get_task(a[0]), c.dn.get_task(b[0])
    assert (ta.status, ta.attempts) == (tb.status, tb.attempts)
