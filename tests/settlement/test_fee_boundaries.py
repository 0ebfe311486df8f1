"""The fee maths at its boundaries (chain/fees.py): the tip clamped from below,
from above and to the max fee, and a replacement bump that lands exactly on the cap (allowed)
or one wei over it (no valid replacement). The property tests in test_units.py never reach
these lines with their policy, so each is pinned here with exact numbers."""

from __future__ import annotations

import pytest

from chain.fees import GWEI, FeePolicy, Fees, bump, is_valid_replacement, price

# A policy whose tip bounds are far apart so each clamp is visible.
POLICY = FeePolicy(fee_cap=100 * GWEI, min_priority_fee=2 * GWEI, max_priority_fee=10 * GWEI)


@pytest.mark.parametrize(
    ("suggested", "tip"),
    [
        (0, 2 * GWEI),  # below the floor: raised to it
        (2 * GWEI - 1, 2 * GWEI),
        (2 * GWEI, 2 * GWEI),  # exactly the floor
        (2 * GWEI + 1, 2 * GWEI + 1),
        (10 * GWEI - 1, 10 * GWEI - 1),
        (10 * GWEI, 10 * GWEI),  # exactly the ceiling
        (10 * GWEI + 1, 10 * GWEI),  # above it: lowered to it
        (10**30, 10 * GWEI),
    ],
)
def test_tip_is_clamped_to_the_policy_range(suggested: int, tip: int) -> None:
    fees = price(GWEI, suggested, POLICY)
    assert fees == Fees(max_fee_per_gas=2 * GWEI + tip, max_priority_fee_per_gas=tip)


def test_tip_is_clamped_to_a_max_fee_the_cap_lowered() -> None:
    """When the cap cuts the max fee below the tip, the tip follows it down (never tip >
    max fee, which a node refuses)."""
    tight = FeePolicy(fee_cap=5 * GWEI, min_priority_fee=1, max_priority_fee=10 * GWEI)
    assert price(0, 8 * GWEI, tight) == Fees(max_fee_per_gas=5 * GWEI, max_priority_fee_per_gas=5 * GWEI)
    # One wei under the cap the tip is untouched.
    assert price(0, 5 * GWEI - 1, tight) == Fees(5 * GWEI - 1, 5 * GWEI - 1)
    # The max fee reaches the cap exactly: kept, not lowered further.
    assert price(2 * GWEI, GWEI, FeePolicy(fee_cap=5 * GWEI)) == Fees(5 * GWEI, GWEI)


def test_bump_to_exactly_the_cap_is_a_replacement() -> None:
    """+12.5% of 1000 wei is exactly the 1125-wei cap: allowed; from 1001 wei it is not."""
    policy = FeePolicy(fee_cap=1_125, min_priority_fee=1, max_priority_fee=100)
    old = Fees(max_fee_per_gas=1_000, max_priority_fee_per_gas=0)
    new = bump(old, 0, 0, policy)
    assert new == Fees(max_fee_per_gas=1_125, max_priority_fee_per_gas=1)
    assert is_valid_replacement(old, new)
    assert bump(Fees(max_fee_per_gas=1_001, max_priority_fee_per_gas=0), 0, 0, policy) is None


def test_bump_refused_when_only_the_tip_would_cross_the_cap() -> None:
    """The max fee fits but the bumped tip (which the max fee must cover) does not."""
    policy = FeePolicy(fee_cap=1_125, min_priority_fee=1, max_priority_fee=2_000)
    assert bump(Fees(1_000, 1_000), 0, 0, policy) == Fees(1_125, 1_125)
    assert bump(Fees(1_000, 1_001), 0, 0, policy) is None


def test_bump_following_the_market_up_to_the_cap() -> None:
    """The market price alone reaches the cap: the bump takes it, capped, not None."""
    policy = FeePolicy(fee_cap=100 * GWEI, max_priority_fee=10 * GWEI)
    new = bump(Fees(10 * GWEI, GWEI), 60 * GWEI, GWEI, policy)
    assert new == Fees(max_fee_per_gas=100 * GWEI, max_priority_fee_per_gas=-(-GWEI * 11_250 // 10_000))
