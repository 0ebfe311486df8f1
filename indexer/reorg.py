"""Chain continuity and reorg outcomes (pure).

A fetched window of headers either extends what is stored, or shows that the stored tip is
no longer canonical. Outcomes are values, not exceptions: the service decides what to do.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BlockRef:
    """A block as the indexer remembers it."""

    number: int
    hash: str
    parent_hash: str
    timestamp: int

    @classmethod
    def from_header(cls, header: Mapping[str, Any]) -> BlockRef:
        """From an `eth_getBlockByNumber` header."""
        return cls(
            number=int(header["number"], 16),
            hash=header["hash"],
            parent_hash=header["parentHash"],
            timestamp=int(header["timestamp"], 16),
        )


@dataclass(frozen=True)
class Extends:
    """The window continues the stored chain."""


@dataclass(frozen=True)
class Reorged:
    """The first block of the window does not build on the stored tip."""


@dataclass(frozen=True)
class Inconsistent:
    """The window changed while it was being fetched (a reorg in flight): fetch it again."""

    reason: str


Continuity = Extends | Reorged | Inconsistent


def check_window(
    tip_hash: str | None,
    headers: Sequence[BlockRef],
    logs_by_block: Mapping[int, set[str]],
) -> Continuity:
    """Does `headers` (consecutive or not, ascending) continue from `tip_hash`?

    `logs_by_block` maps a block number to the block hashes its fetched logs claim; each
    must equal the header's hash, or the logs and the headers come from different forks.
    Consecutive headers must link by parent hash.
    """
    if not headers:
        return Inconsistent("no headers")
    if tip_hash is not None and headers[0].parent_hash != tip_hash:
        return Reorged()
    by_number = {h.number: h for h in headers}
    for previous, current in itertools.pairwise(headers):
        if current.number == previous.number + 1 and current.parent_hash != previous.hash:
            return Inconsistent(f"block {current.number} does not link to {previous.number}")
    for number, hashes in logs_by_block.items():
        header = by_number.get(number)
        if header is not None and hashes != {header.hash}:
            return Inconsistent(f"logs of block {number} come from another fork")
    return Extends()


def common_ancestor(stored: Mapping[int, str], canonical: Mapping[int, str | None]) -> int | None:
    """Highest block number whose stored hash is still canonical; None if none in range."""
    for number in sorted(stored, reverse=True):
        if canonical.get(number) == stored[number]:
            return number
    return None
