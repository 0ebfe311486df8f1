"""Pure rules of the ruling path: when a stuck ruling is replaced and with what fees, and what
depth makes a ruling confirmed and final."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from chain.fees import GWEI, FeePolicy, Fees, is_valid_replacement
from relayer.settlement.rulings import mined_status, stuck_action

wei = st.integers(min_value=0, max_value=1_000 * GWEI)


@st.composite
def fees(draw: st.DrawFn) -> Fees:
    tip = draw(st.integers(min_value=0, max_value=100 * GWEI))
    return Fees(max_fee_per_gas=tip + draw(wei), max_priority_fee_per_gas=tip)


@given(fees(), wei, wei, st.integers(min_value=GWEI, max_value=2_000 * GWEI),
       st.floats(min_value=0, max_value=100), st.floats(min_value=0.001, max_value=100))
def test_a_bump_is_a_valid_replacement_under_the_cap(
    latest: Fees, base_fee: int, tip: int, cap: int, waited: float, replace_after: float
) -> None:
    policy = FeePolicy(fee_cap=cap)
    action, new = stuck_action(latest, base_fee=base_fee, suggested_priority=tip, policy=policy,
                               waited=waited, replace_after=replace_after)
    stuck = latest.max_fee_per_gas < base_fee or waited >= replace_after
    assert action == ("wait" if not stuck else ("bump" if new is not None else "capped"))
    if new is not None:
        assert is_valid_replacement(latest, new)  # tip and max fee both +10 % at least
        assert new.max_priority_fee_per_gas <= new.max_fee_per_gas <= cap


def test_a_fresh_includable_ruling_waits_and_an_old_one_is_bumped() -> None:
    latest = Fees(max_fee_per_gas=3 * GWEI, max_priority_fee_per_gas=GWEI)
    policy = FeePolicy()
    assert stuck_action(latest, base_fee=GWEI, suggested_priority=GWEI, policy=policy, waited=1,
                        replace_after=30) == ("wait", None)
    action, new = stuck_action(latest, base_fee=GWEI, suggested_priority=GWEI, policy=policy, waited=30,
                               replace_after=30)
    assert action == "bump" and new is not None and is_valid_replacement(latest, new)
    action, new = stuck_action(latest, base_fee=10 * GWEI, suggested_priority=GWEI, policy=policy, waited=0,
                               replace_after=30)
    assert action == "bump" and new is not None and new.max_fee_per_gas >= 10 * GWEI
    capped = FeePolicy(fee_cap=3 * GWEI)
    assert stuck_action(latest, base_fee=GWEI, suggested_priority=GWEI, policy=capped, waited=60,
                        replace_after=30) == ("capped", None)


@given(st.integers(min_value=1, max_value=200), st.integers(min_value=1, max_value=20),
       st.integers(min_value=0, max_value=200))
def test_confirmed_from_the_confirmation_depth_final_from_the_finality_depth(
    depth: int, confirmations: int, extra: int
) -> None:
    finality = confirmations + extra
    status, final = mined_status(depth=depth, confirmations=confirmations, finality_depth=finality)
    assert status == ("confirmed" if depth >= confirmations else "sent")
    assert final == (depth >= finality)


@given(st.integers(min_value=1, max_value=200), st.integers(min_value=1, max_value=20),
       st.integers(min_value=0, max_value=200), st.sampled_from(["confirmed", "reverted", "already_resolved"]))
def test_a_reverted_outcome_is_held_to_the_same_depths_as_a_confirmed_one(
    depth: int, confirmations: int, extra: int, outcome: str
) -> None:
    """A receipt with status 0 is not final on sight: a reorg can free its nonce."""
    finality = confirmations + extra
    status, final = mined_status(depth=depth, confirmations=confirmations, finality_depth=finality, outcome=outcome)
    assert status == (outcome if depth >= confirmations else "sent")
    assert final == (depth >= finality)


def test_a_node_that_has_the_transaction_is_not_a_refusal() -> None:
    from relayer.settlement.rulings import node_has_it

    for message in ("already known", "transaction already imported", "Known transaction", "nonce too low",
                    "OldNonce", "ALREADY_KNOWN"):
        assert node_has_it(message), message
    for message in ("insufficient funds for gas * price + value", "replacement transaction underpriced",
                    "intrinsic gas too low", "exceeds block gas limit", ""):
        assert not node_has_it(message), message
