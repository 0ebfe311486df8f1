"""Nonce reconciliation: the decision is a pure function of what the database and the chain say.

The relayer owns its nonces: the next one lives in `settlement_nonces` and is advanced in
the same transaction that stores the signed transaction using it, so every nonce below
`next_nonce` has a transaction we hold (a "slot"), except after an outside event (the key
used elsewhere, a restored database). At start-up and whenever the node answers
"nonce too low" or "nonce too high", `reconcile` compares:

- `local_next`: our counter (None when this database never used the key);
- `chain_latest`: the account's mined transaction count;
- `chain_pending`: the count including the node's pool;
- `held`: the nonces of slots we hold that are not known to be mined.

and decides, without drift in either direction:

- `next_nonce = max(local_next, chain_latest, chain_pending)`: never reuse a nonce the chain
  or the pool already has, never skip ahead of what we know;
- `rebroadcast`: held nonces in `[chain_latest, next_nonce)`: send them again;
- `fill`: nonces in `[chain_latest, next_nonce)` with no held slot, and no transaction in
  the pool for them: a gap that would block everything above it; fill it with a 0-value
  self-transfer (pool nonces at or above our counter belong to someone else: not ours to
  fill, and counted past);
- `check_mined`: held nonces below `chain_latest`: consumed on chain; the receipts say
  whether by our transaction or by another one (then the slot is lost and its verdict is
  queued again).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass


@dataclass(frozen=True)
class NoncePlan:
    """What to do so that the local counter and the chain agree with no gap."""

    next_nonce: int
    rebroadcast: tuple[int, ...]
    fill: tuple[int, ...]
    check_mined: tuple[int, ...]
    foreign_pending: int  # pool transactions above our counter that are not ours

    @property
    def drifted(self) -> bool:
        """True when the chain forced the counter forward or a gap needs filling."""
        return bool(self.fill) or self.foreign_pending > 0


def reconcile(
    local_next: int | None, chain_latest: int, chain_pending: int, held: Collection[int]
) -> NoncePlan:
    """Decide the next nonce, what to resend, what to fill and what to check on chain."""
    if chain_latest < 0 or chain_pending < 0:
        raise ValueError("transaction counts cannot be negative")
    local = chain_latest if local_next is None else local_next
    # A pool count below the mined count is a node quirk (a reorg in progress): trust mined.
    pending = max(chain_pending, chain_latest)
    next_nonce = max(local, pending)
    held_set = set(held)
    window = range(chain_latest, next_nonce)
    rebroadcast = tuple(n for n in window if n in held_set)
    # Nonces we never handed out (>= local) but the pool holds are someone else's: leave them.
    fill = tuple(n for n in window if n not in held_set and n < local)
    check_mined = tuple(sorted(n for n in held_set if n < chain_latest))
    return NoncePlan(
        next_nonce=next_nonce,
        rebroadcast=rebroadcast,
        fill=fill,
        check_mined=check_mined,
        foreign_pending=max(0, pending - local),
    )


def gaps_below(lowest_held: int, chain_latest: int, held: Collection[int]) -> tuple[int, ...]:
    """Nonces between the chain's count and a pending transaction that nothing fills.

    A pool holds a transaction with a nonce above the account's count forever: these are
    the nonces to fill before anything at or above `lowest_held` can be mined.
    """
    held_set = set(held)
    return tuple(n for n in range(chain_latest, lowest_held) if n not in held_set)
