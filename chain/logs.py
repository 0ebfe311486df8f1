"""An `eth_getLogs` entry once checked (`chain.rpc.parse_logs`). Its own module, without the
RPC client's imports, so that the pure decoder (`indexer.decode`) can take it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class RpcLog:
    """One `eth_getLogs` entry, checked and with its quantities parsed once (`parse_logs`).

    A quantity whose digits are not hex is -1 (well-formed ones are never negative): as for
    `logs_reply`, such a log is not a transport fault but a log the indexer refuses where it
    reads that field (a block number or log index: the window; the others: the decoder)."""

    address: str
    topics: list[str]
    data: str
    block_number: int
    block_hash: str
    tx_hash: str
    tx_index: int
    log_index: int
    block_timestamp: int | None
    removed: bool
