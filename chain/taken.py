"""Was a nonce taken by someone else's transaction? Decided on two looks, never one.

The account's mined count passing a nonce we hold says the nonce is used; only a receipt of
one of our versions says by us. A node answers the count and the receipts from different
moments (anvil for a moment after mining, a load-balanced provider whose nodes are a block
apart, a reorg between the two reads): a count that has passed our nonce while our receipt
is not there yet is what an own transaction looks like in that window. Calling it lost on
that one look queues the work again and sends it twice (`escrowd run --tasks 1000` did, for
rulings). So a nonce is lost only when two looks in a row, each reading the count *before*
the receipts, saw the count past it and no receipt of ours.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

LOOKS_BEFORE_LOST = 2


def verdict(misses_before: int, count_passed: bool, own_receipt: bool) -> tuple[int, bool]:
    """(misses after this look, lost) for one look at a nonce we hold (pure).

    A receipt of ours, or a count not past the nonce, clears the misses; a count past it
    with no receipt of ours is one more miss, and `LOOKS_BEFORE_LOST` of them in a row mean
    another transaction took the nonce.
    """
    if own_receipt or not count_passed:
        return 0, False
    misses = misses_before + 1
    return misses, misses >= LOOKS_BEFORE_LOST


@dataclass
class TakenWatch:
    """The misses of each held nonce between looks (memory only: a restart starts again from
    zero, which can only delay a "lost", never cause one)."""

    misses: dict[Hashable, int] = field(default_factory=dict)

    def look(self, key: Hashable, *, count_passed: bool, own_receipt: bool) -> bool:
        """Record one look at `key`'s nonce; True when it is lost (then forgotten)."""
        misses, lost = verdict(self.misses.get(key, 0), count_passed, own_receipt)
        if misses == 0 or lost:
            self.misses.pop(key, None)
        else:
            self.misses[key] = misses
        return lost
