"""Decoded escrow logs built by hand, for tests that feed consumers without a chain."""

from __future__ import annotations

from indexer.decode import DecodedLog
from schemas.events import event_id

ESCROW = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
"""The devnet's escrow address (the first contract anvil's first account deploys)."""


def verification_completed(block: int, agent: str, passed: bool) -> DecodedLog:
    """Task `block`'s `VerificationCompleted` for `agent`, alone in block `block` on chain 31337."""
    block_hash = "0x" + f"{block:064x}"
    return DecodedLog(
        id=event_id(31337, block_hash, 0), chain_id=31337, escrow_address=ESCROW, block_number=block,
        block_hash=block_hash, block_timestamp=1_767_225_600 + block, tx_hash=block_hash, tx_index=0, log_index=0,
        event="VerificationCompleted", task_id=block,
        args={
            "taskId": block, "verifier": "0x" + "99" * 20, "attempt": 1, "evidenceHash": "0x" + "ab" * 32,
            "passed": passed, "score": 90 if passed else 10, "agent": agent, "agentPayout": 0, "fee": 0,
            "failedAt": 0, "status": 4 if passed else 2,
        },
    )  # fmt: skip
