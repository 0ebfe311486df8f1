"""When an unmined transaction is sent again, replaced with higher fees, or left as it is (pure).

A transaction whose nonce is still ours is stuck when it cannot pay the next block's base
fee, or when it waited `replace_after` seconds while the account made no progress. A stuck
one is replaced: same nonce, both EIP-1559 fields raised by at least the bump (and at least
to today's market price), never above the cap (`chain.fees.bump`); at the cap the live
version stays and is broadcast again.
"""

from __future__ import annotations

from chain.fees import FeePolicy, Fees, bump, includable


def stuck_action(
    latest: Fees, *, base_fee: int, suggested_priority: int, policy: FeePolicy, waited: float, replace_after: float
) -> tuple[str, Fees | None]:
    """What to do with an unmined transaction whose nonce is still ours.

    `wait` (rebroadcast the live version) while it can enter the next block and was broadcast
    less than `replace_after` seconds ago; otherwise it is stuck: `bump` with fees that are a
    valid EIP-1559 replacement, or `capped` when that would pass the policy's fee cap.
    """
    if includable(latest, base_fee) and waited < replace_after:
        return "wait", None
    fees = bump(latest, base_fee, suggested_priority, policy)
    return ("capped", None) if fees is None else ("bump", fees)


def is_due(
    *,
    broadcast: bool,
    needs_bump: bool,
    fees: Fees,
    base_fee: int,
    waited: float,
    stalled: bool,
    replace_after: float,
) -> bool:
    """True when a pending transaction must be looked at now: never broadcast by this process
    (restart, reorg, a transient failure), refused as underpriced, priced under the base fee,
    or unmined for `replace_after` seconds while the account made no progress."""
    return (
        not broadcast
        or needs_bump
        or not includable(fees, base_fee)
        or (stalled and waited >= replace_after)
    )
