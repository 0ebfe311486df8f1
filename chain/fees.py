"""EIP-1559 fee maths: pure functions, no I/O.

- `price`: a fresh transaction pays `base_fee * base_fee_multiplier + priority` as its
  max fee (room for the base fee to rise for a few blocks) and the suggested priority fee
  clamped to the policy's range; never above the cap.
- `bump`: a replacement must raise BOTH fields by at least the node's minimum (geth and
  anvil's pool rule: +10%; we default to +12.5% to stay clear of rounding), and also
  reach today's price if the market moved more than that. If that would exceed the cap,
  there is no valid replacement: `None`, and the caller keeps the old transaction.

Invariants (property-tested): every result satisfies `priority <= max_fee <= cap`, and a
bump is a valid replacement of its input under the node's rule.
"""

from __future__ import annotations

from dataclasses import dataclass

GWEI = 10**9
BPS = 10_000
NODE_MIN_BUMP_BPS = 1_000  # geth's and anvil's txpool price bump: 10%


@dataclass(frozen=True)
class FeePolicy:
    """How this relayer prices transactions."""

    fee_cap: int = 500 * GWEI  # max_fee_per_gas never exceeds this
    min_priority_fee: int = 1  # wei; some nodes refuse a zero tip
    max_priority_fee: int = 50 * GWEI
    base_fee_multiplier_bps: int = 20_000  # 2x base fee headroom
    bump_bps: int = 1_250  # +12.5% per replacement

    def __post_init__(self) -> None:
        if self.fee_cap <= 0:
            raise ValueError("fee_cap must be positive")
        if not 0 <= self.min_priority_fee <= self.max_priority_fee:
            raise ValueError("need 0 <= min_priority_fee <= max_priority_fee")
        if self.base_fee_multiplier_bps < BPS:
            raise ValueError("base_fee_multiplier_bps must be >= 10000 (1x)")
        if self.bump_bps < NODE_MIN_BUMP_BPS:
            raise ValueError("bump_bps must be at least the node minimum (1000 = 10%)")


@dataclass(frozen=True, order=True)
class Fees:
    """The two EIP-1559 price fields of one transaction, in wei."""

    max_fee_per_gas: int
    max_priority_fee_per_gas: int


def _ceil_scale(value: int, bps: int) -> int:
    # Ceiling, so the result always meets a floor-division threshold on the node.
    return -((-value * bps) // BPS)


def price(base_fee: int, suggested_priority: int, policy: FeePolicy) -> Fees:
    """Fees for a new transaction at the current base fee and suggested tip."""
    if base_fee < 0 or suggested_priority < 0:
        raise ValueError("fees cannot be negative")
    priority = min(max(suggested_priority, policy.min_priority_fee), policy.max_priority_fee)
    max_fee = _ceil_scale(base_fee, policy.base_fee_multiplier_bps) + priority
    max_fee = min(max_fee, policy.fee_cap)
    return Fees(max_fee_per_gas=max_fee, max_priority_fee_per_gas=min(priority, max_fee))


def min_replacement(previous: Fees, bump_bps: int = NODE_MIN_BUMP_BPS) -> Fees:
    """The lowest fees the node accepts as a replacement of `previous`.

    Each field strictly grows (a zero tip becomes 1 wei) so a replacement always differs.
    """
    priority = max(
        _ceil_scale(previous.max_priority_fee_per_gas, BPS + bump_bps),
        previous.max_priority_fee_per_gas + 1,
    )
    max_fee = max(
        _ceil_scale(previous.max_fee_per_gas, BPS + bump_bps), previous.max_fee_per_gas + 1
    )
    return Fees(max_fee_per_gas=max(max_fee, priority), max_priority_fee_per_gas=priority)


def bump(previous: Fees, base_fee: int, suggested_priority: int, policy: FeePolicy) -> Fees | None:
    """Fees for a replacement of `previous`, or None when the cap leaves no valid bump."""
    floor = min_replacement(previous, policy.bump_bps)
    market = price(base_fee, suggested_priority, policy)
    priority = max(floor.max_priority_fee_per_gas, market.max_priority_fee_per_gas)
    max_fee = max(floor.max_fee_per_gas, market.max_fee_per_gas, priority)
    if max_fee > policy.fee_cap:
        return None
    return Fees(max_fee_per_gas=max_fee, max_priority_fee_per_gas=priority)


def is_valid_replacement(old: Fees, new: Fees, min_bump_bps: int = NODE_MIN_BUMP_BPS) -> bool:
    """The node's rule: both fields at least +min_bump (geth divides with floor)."""
    tip_floor = old.max_priority_fee_per_gas * (BPS + min_bump_bps) // BPS
    cap_floor = old.max_fee_per_gas * (BPS + min_bump_bps) // BPS
    return (
        new.max_priority_fee_per_gas >= tip_floor
        and new.max_fee_per_gas >= cap_floor
        and new != old
    )


def over_cap(base_fee: int, policy: FeePolicy) -> bool:
    """True when no transaction under the cap can enter a block at `base_fee` (with the least
    tip): new sends are held rather than signed at a price that would leave their nonce stuck."""
    return base_fee + policy.min_priority_fee > policy.fee_cap


def includable(fees: Fees, base_fee: int) -> bool:
    """True when a transaction with `fees` can enter a block whose base fee is `base_fee`."""
    return fees.max_fee_per_gas >= base_fee
