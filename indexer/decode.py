"""Escrow logs as the indexer stores them: the arguments decoded by the one ABI codec
(`chain.abi`, built once from the ABI: a dict lookup on topic0 and hex slicing), with the
log's chain coordinates and its event id. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from chain.abi import AbiDecodeError, Codec, to_checksum_address
from schemas import jsoncodec
from schemas.events import event_id


class DecodeError(ValueError):
    """A log claims to be an escrow event but its topics or data do not fit the ABI."""


@dataclass(slots=True)
class DecodedLog:
    """One escrow event with its chain coordinates (not frozen: a frozen dataclass sets each
    field through `object.__setattr__`, a third of the decoder's own time; nothing mutates it)."""

    id: str
    chain_id: int
    escrow_address: str
    block_number: int
    block_hash: str
    block_timestamp: int
    tx_hash: str
    tx_index: int
    log_index: int
    event: str
    task_id: int | None
    args: dict[str, Any]
    args_json: str = ""
    """`args` as JSON, encoded once: the `escrow_events.args` column and the message body
    share it ("" when not encoded yet: `runtime.eventlog.args_json` encodes it then)."""


class EscrowLogDecoder:
    """Decodes raw `eth_getLogs` entries of one ABI."""

    def __init__(self, abi: Iterable[Mapping[str, Any]]) -> None:
        self._codec = Codec([abi])

    @property
    def topics(self) -> list[str]:
        """topic0 of every event this decoder knows (for the `eth_getLogs` filter)."""
        return list(self._codec.events)

    def decode(self, chain_id: int, log: Mapping[str, Any], block_timestamp: int | None = None) -> DecodedLog | None:
        """Decode one raw log; None when its topic0 is not an escrow event."""
        topics: Sequence[str] = log["topics"]
        decoder = self._codec.event_of(topics)
        if decoder is None:
            return None
        try:
            args = decoder.decode(topics, log["data"])
            block_hash: str = log["blockHash"]
            log_index = int(log["logIndex"], 16)
            timestamp = block_timestamp
            if timestamp is None:
                stamp = log.get("blockTimestamp")
                if stamp is None:
                    raise DecodeError("log has no blockTimestamp and none was given")
                timestamp = int(stamp, 16)
            task_id = args.get("taskId")
            return DecodedLog(
                id=event_id(chain_id, block_hash, log_index),
                chain_id=chain_id,
                escrow_address=to_checksum_address(log["address"]),
                block_number=int(log["blockNumber"], 16),
                block_hash=block_hash,
                block_timestamp=timestamp,
                tx_hash=log["transactionHash"],
                tx_index=int(log["transactionIndex"], 16),
                log_index=log_index,
                event=decoder.name,
                task_id=task_id if isinstance(task_id, int) else None,
                args=args,
                args_json=jsoncodec.dumps_str(args),
            )
        except DecodeError:
            raise
        except AbiDecodeError as exc:
            raise DecodeError(str(exc)) from None
        except ValueError as exc:  # a malformed address or quantity: hostile input
            raise DecodeError(f"{decoder.name}: {exc}") from None
