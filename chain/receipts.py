"""Receipts: fetched in batches, checked as hostile input, and their depth below the head.

Every field used is checked for type and range before anything is decided from it: a
node's reply is outside input like any other.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from chain.eth_rpc import EthRpc, RpcError

RECEIPT_BATCH = 500  # receipts per JSON-RPC batch request

_QUANTITY = re.compile(r"0x[0-9a-fA-F]{1,64}")
_HASH = re.compile(r"0x[0-9a-fA-F]{64}")
INT64 = 2**63 - 1


class BadReply(RpcError):
    """A node's reply of the wrong type or out of range: nothing is decided from it."""


def quantity(value: object, what: str, limit: int = INT64) -> int:
    """A JSON-RPC quantity (0x hex string) no larger than `limit`, or BadReply."""
    if not isinstance(value, str) or not _QUANTITY.fullmatch(value):
        raise BadReply(f"{what}: not a quantity")
    number = int(value, 16)
    if number > limit:
        raise BadReply(f"{what}: out of range")
    return number


def hash32(value: object, what: str) -> str:
    """A 32-byte 0x hash, lower-cased, or BadReply."""
    if not isinstance(value, str) or not _HASH.fullmatch(value):
        raise BadReply(f"{what}: not a 32-byte hash")
    return value.lower()


@dataclass(frozen=True)
class Receipt:
    """The fields of a transaction receipt a sender reads, checked (`parse`)."""

    block_number: int
    block_hash: str
    failed: bool

    @classmethod
    def parse(cls, raw: object, tx_hash: str) -> Receipt | None:
        """A mined receipt of `tx_hash`, None while pending; BadReply for anything malformed
        (wrong types, another transaction's receipt, a status other than 0x0 / 0x1)."""
        if not isinstance(raw, dict):
            raise BadReply("eth_getTransactionReceipt: not an object")
        if raw.get("blockNumber") is None:
            return None
        if hash32(raw.get("transactionHash"), "receipt transactionHash") != tx_hash.lower():
            raise BadReply("eth_getTransactionReceipt: the receipt of another transaction")
        status = raw.get("status", "0x1")
        if status not in ("0x0", "0x1"):
            raise BadReply("eth_getTransactionReceipt: status is neither 0x0 nor 0x1")
        return cls(quantity(raw["blockNumber"], "receipt blockNumber"),
                   hash32(raw.get("blockHash"), "receipt blockHash"), status == "0x0")


def depth(head_number: int, block_number: int) -> int:
    """Blocks deep a transaction mined at `block_number` is (1 in the head block itself)."""
    return max(head_number, block_number) - block_number + 1


async def fetch_receipts(rpc: EthRpc, hashes: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The receipts of the mined ones among `hashes` (one batched round trip per 500).

    A failed item fails the whole read (raised): an unreadable receipt is never taken for a
    missing one, which would count as a miss towards "taken by someone else".
    """
    found: dict[str, dict[str, Any]] = {}
    for start in range(0, len(hashes), RECEIPT_BATCH):
        chunk = hashes[start : start + RECEIPT_BATCH]
        replies = await rpc.batch([("eth_getTransactionReceipt", [h]) for h in chunk])
        for tx_hash, reply in zip(chunk, replies, strict=True):
            if isinstance(reply, Exception):
                raise reply
            if reply is None:
                continue
            if Receipt.parse(reply, tx_hash) is None:
                continue  # pending (some nodes answer a pending transaction's receipt)
            found[tx_hash] = reply
    return found
