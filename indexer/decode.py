"""Pure, fast decoding of escrow logs.

Decoders are built once from the ABI; the hot path is a dict lookup on topic0, hex slicing
for indexed words and one `eth_abi.decode` call for the data, with no web3 contract
reflection (which decodes an order of magnitude slower).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eth_abi.abi import decode as abi_decode
from eth_utils.address import to_checksum_address as _to_checksum_address
from eth_utils.crypto import keccak

from schemas.events import event_id


@functools.lru_cache(maxsize=65536)
def to_checksum_address(value: str) -> str:
    """EIP-55 form of an address; cached because the same few addresses recur in every log."""
    return str(_to_checksum_address(value))


class DecodeError(ValueError):
    """A log claims to be an escrow event but its topics or data do not fit the ABI."""


@dataclass(frozen=True, slots=True)
class DecodedLog:
    """One escrow event with its chain coordinates."""

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


def _signature(entry: Mapping[str, Any]) -> str:
    return f"{entry['name']}({','.join(inp['type'] for inp in entry['inputs'])})"


def _indexed_converter(solidity_type: str) -> Any:
    if solidity_type == "address":
        return lambda word: to_checksum_address("0x" + word[-40:])
    if solidity_type.startswith("uint"):
        return lambda word: int(word, 16)
    if solidity_type == "bool":
        return lambda word: int(word, 16) != 0
    if solidity_type.startswith("bytes"):
        return lambda word: "0x" + word
    if solidity_type.startswith("int"):
        bits = 256

        def signed(word: str) -> int:
            value = int(word, 16)
            return value - (1 << bits) if value >= 1 << (bits - 1) else value

        return signed
    raise ValueError(f"indexed {solidity_type} parameters are not supported")


def _data_converter(solidity_type: str) -> Any:
    if solidity_type == "address":
        return to_checksum_address
    if solidity_type.startswith("bytes") and solidity_type != "bytes":
        return lambda value: "0x" + value.hex()
    if solidity_type == "bytes":
        return lambda value: "0x" + value.hex()
    return None


def _word_decoder(solidity_type: str) -> Any:
    """Decoder of one 32-byte ABI word (64 hex chars) of a static type, strict like eth_abi; else None."""
    if solidity_type == "address":

        def address(word: str) -> str:
            if word[:24].strip("0"):
                raise ValueError("address word has non-zero padding")
            return to_checksum_address("0x" + word[24:])

        return address
    if solidity_type == "bool":

        def boolean(word: str) -> bool:
            value = int(word, 16)
            if value > 1:
                raise ValueError("bool word is neither 0 nor 1")
            return value == 1

        return boolean
    if solidity_type.startswith("uint"):
        bits = int(solidity_type[4:] or 256)

        def unsigned(word: str) -> int:
            value = int(word, 16)
            if value >> bits:
                raise ValueError(f"value does not fit {solidity_type}")
            return value

        return unsigned
    if solidity_type.startswith("int"):
        bits = int(solidity_type[3:] or 256)

        def signed(word: str) -> int:
            value = int(word, 16)
            if value >> 255:
                value -= 1 << 256
            if not -(1 << (bits - 1)) <= value < 1 << (bits - 1):
                raise ValueError(f"value does not fit {solidity_type}")
            return value

        return signed
    if solidity_type.startswith("bytes") and solidity_type != "bytes":
        size = 2 * int(solidity_type[5:])

        def fixed_bytes(word: str) -> str:
            if word[size:].strip("0"):
                raise ValueError(f"{solidity_type} word has non-zero padding")
            int(word, 16)  # hex digits only
            return "0x" + word[:size].lower()

        return fixed_bytes
    return None


@dataclass(frozen=True)
class _EventDecoder:
    name: str
    indexed: tuple[tuple[str, Any], ...]
    data_names: tuple[str, ...]
    data_types: tuple[str, ...]
    data_converters: tuple[Any, ...]
    order: tuple[str, ...]
    # One decoder per data word when every data field is a static one-word type (hex
    # slicing: an order of magnitude faster than eth_abi.decode); None otherwise.
    words: tuple[tuple[str, Any], ...] | None = None


class EscrowLogDecoder:
    """Decodes raw `eth_getLogs` entries of one ABI."""

    def __init__(self, abi: Iterable[Mapping[str, Any]]) -> None:
        self._by_topic: dict[str, _EventDecoder] = {}
        for entry in abi:
            if entry.get("type") != "event" or entry.get("anonymous"):
                continue
            topic0 = "0x" + keccak(text=_signature(entry)).hex()
            indexed = tuple(
                (inp["name"], _indexed_converter(inp["type"])) for inp in entry["inputs"] if inp["indexed"]
            )
            data_inputs = [inp for inp in entry["inputs"] if not inp["indexed"]]
            word_decoders = [_word_decoder(inp["type"]) for inp in data_inputs]
            words = (
                tuple((inp["name"], fn) for inp, fn in zip(data_inputs, word_decoders, strict=True))
                if all(fn is not None for fn in word_decoders)
                else None
            )
            self._by_topic[topic0] = _EventDecoder(
                name=entry["name"],
                indexed=indexed,
                data_names=tuple(inp["name"] for inp in data_inputs),
                data_types=tuple(inp["type"] for inp in data_inputs),
                data_converters=tuple(_data_converter(inp["type"]) for inp in data_inputs),
                order=tuple(inp["name"] for inp in entry["inputs"]),
                words=words,
            )

    @property
    def topics(self) -> list[str]:
        """topic0 of every event this decoder knows (for the `eth_getLogs` filter)."""
        return list(self._by_topic)

    def decode(self, chain_id: int, log: Mapping[str, Any], block_timestamp: int | None = None) -> DecodedLog | None:
        """Decode one raw log; None when its topic0 is not an escrow event."""
        topics: Sequence[str] = log["topics"]
        if not topics:
            return None
        decoder = self._by_topic.get(topics[0].lower())
        if decoder is None:
            return None
        if len(topics) != len(decoder.indexed) + 1:
            raise DecodeError(f"{decoder.name}: expected {len(decoder.indexed)} indexed topics, got {len(topics) - 1}")
        args: dict[str, Any] = {}
        for (name, convert), topic in zip(decoder.indexed, topics[1:], strict=True):
            args[name] = convert(topic[2:])
        if decoder.words is not None:
            data: str = log["data"][2:]
            if len(data) < 64 * len(decoder.words):
                raise DecodeError(f"{decoder.name}: data is {len(data) // 2} bytes, expected {32 * len(decoder.words)}")
            try:
                for i, (name, word) in enumerate(decoder.words):
                    args[name] = word(data[64 * i : 64 * i + 64])
            except ValueError as exc:
                raise DecodeError(f"{decoder.name}: data does not decode: {exc}") from None
        elif decoder.data_types:
            raw = bytes.fromhex(log["data"][2:])
            try:
                values = abi_decode(decoder.data_types, raw)
            except Exception as exc:
                raise DecodeError(f"{decoder.name}: data does not decode: {exc}") from None
            for name, convert, value in zip(decoder.data_names, decoder.data_converters, values, strict=True):
                args[name] = convert(value) if convert is not None else value
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
            args={name: args[name] for name in decoder.order},
        )
