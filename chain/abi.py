"""The one ABI codec: selectors, event topics, calldata encoding, output, error and log
decoding, built once from the compiled ABIs (`eth_abi` is the engine).

Everything is precomputed per ABI entry, so the hot paths are dict lookups: a log is
decoded by hex slicing when every data field is a static one-word type (an order of
magnitude faster than `eth_abi.decode`, and as strict: padding and ranges are checked),
else by one `eth_abi.decode` call. Decoded `bytes` values are 0x hex strings (the form
events travel in as JSON) unless the codec is built with `hex_bytes=False` (the devnet
driver's native values). Pure: no I/O.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eth_abi.abi import decode as abi_decode
from eth_abi.abi import encode as abi_encode
from eth_utils.address import to_checksum_address as _to_checksum_address
from eth_utils.crypto import keccak

from schemas.abi import escrow_abi, token_abi

PANIC_SELECTOR = bytes.fromhex("4e487b71")
ERROR_STRING_SELECTOR = bytes.fromhex("08c379a0")


@functools.lru_cache(maxsize=65536)
def to_checksum_address(value: str) -> str:
    """EIP-55 form of an address; cached because the same few addresses recur in every log."""
    return str(_to_checksum_address(value))


class AbiDecodeError(ValueError):
    """Bytes that claim an ABI shape (an event's topics and data) but do not fit it."""


def abi_type(param: Mapping[str, Any]) -> str:
    """The canonical type of an ABI parameter (tuples spelled out, as selectors need)."""
    kind = str(param["type"])
    if kind.startswith("tuple"):
        return f"({','.join(abi_type(c) for c in param['components'])}){kind[5:]}"
    return kind


def signature(entry: Mapping[str, Any]) -> str:
    """`name(type,...)` of a function, event or error entry."""
    return f"{entry['name']}({','.join(abi_type(p) for p in entry['inputs'])})"


def selector_of(entry: Mapping[str, Any]) -> bytes:
    """The 4-byte selector of a function or error entry."""
    return keccak(text=signature(entry))[:4]


def topic_of(entry: Mapping[str, Any]) -> str:
    """topic0 (0x hex) of an event entry."""
    return "0x" + keccak(text=signature(entry)).hex()


# ------------------------------------------------------------------ one-word decoders

Word = Callable[[str], Any]


def _word_decoder(solidity_type: str, hex_bytes: bool) -> Word | None:
    """Decoder of one 32-byte ABI word (64 hex chars) of a static type, strict like eth_abi; else None."""
    if "[" in solidity_type or "(" in solidity_type:
        return None  # arrays and tuples: `eth_abi.decode`
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

        def fixed_bytes(word: str) -> Any:
            if word[size:].strip("0"):
                raise ValueError(f"{solidity_type} word has non-zero padding")
            if not hex_bytes:
                return bytes.fromhex(word[:size])
            int(word, 16)  # hex digits only
            return "0x" + word[:size].lower()

        return fixed_bytes
    return None


_UINT, _INT, _ADDRESS, _BOOL, _BYTES = range(5)
_ZERO_WORD = bytes(32)

WordLayout = tuple[int, int]
"""How to read one 32-byte word of a fixed-layout event: (kind, bits or byte size)."""


def _word_layout(solidity_type: str) -> WordLayout | None:
    """The layout of a static one-word type (what `_word_decoder` decodes); else None."""
    if "[" in solidity_type or "(" in solidity_type:
        return None
    if solidity_type == "address":
        return (_ADDRESS, 0)
    if solidity_type == "bool":
        return (_BOOL, 0)
    if solidity_type.startswith("uint"):
        return (_UINT, int(solidity_type[4:] or 256))
    if solidity_type.startswith("int"):
        return (_INT, int(solidity_type[3:] or 256))
    if solidity_type.startswith("bytes") and solidity_type != "bytes":
        return (_BYTES, int(solidity_type[5:]))
    return None


def _fixed_decoder(
    name: str, layout: tuple[WordLayout, ...], names: tuple[str, ...], topics: int, order: tuple[str, ...], hex_bytes: bool
) -> Callable[[Sequence[str], str], dict[str, Any]]:
    """A straight-line decoder of one fixed-layout event (compiled once per ABI entry: a loop
    over the words, or a call per word, costs twice as much per log).

    The topics after topic0 and the data words are read as one `bytes.fromhex` (every digit
    checked at once); padding and ranges are checked as strictly as `_word_decoder` does,
    raising ValueError. Only the layout is interpolated into the source, never a value.
    """
    words = len(layout) - topics
    lines = [
        "def decode(topics, data):",
        f"    if len(data) < {2 + 64 * words}:",
        f"        raise AbiDecodeError({name!r} + ': data is %d bytes, expected {32 * words}' % (len(data) // 2 - 1))",
    ]
    parts = []
    for k in range(1, topics + 1):
        lines.append(f"    t{k} = topics[{k}]")
        lines.append(f"    if len(t{k}) != 66: raise ValueError('a topic is not 32 bytes')")
        parts.append(f"t{k}[2:]")
    parts.append(f"data[2:{2 + 64 * words}]")
    lines.append(f"    raw = fromhex({' + '.join(parts)})")
    # `fromhex` skips whitespace: fewer bytes than digits/2 is not the event's shape.
    lines.append(f"    if len(raw) != {32 * len(layout)}: raise ValueError('whitespace in the hex')")
    for i, (kind, arg) in enumerate(layout):
        o = 32 * i
        word = f"raw[{o}:{o + 32}]"
        if kind == _UINT:
            lines.append(f"    v{i} = from_bytes({word})")
            if arg < 256:
                lines.append(f"    if v{i} >> {arg}: raise ValueError('value does not fit uint{arg}')")
        elif kind == _INT:
            lines.append(f"    v{i} = from_bytes({word}, signed=True)")
            lines.append(
                f"    if not {-(1 << (arg - 1))} <= v{i} < {1 << (arg - 1)}: raise ValueError('value does not fit int{arg}')"
            )
        elif kind == _ADDRESS:
            lines.append(f"    if raw[{o}:{o + 12}] != ZERO12: raise ValueError('address word has non-zero padding')")
            lines.append(f"    v{i} = checksum('0x' + raw[{o + 12}:{o + 32}].hex())")
        elif kind == _BOOL:
            lines.append(f"    v{i} = from_bytes({word})")
            lines.append(f"    if v{i} > 1: raise ValueError('bool word is neither 0 nor 1')")
            lines.append(f"    v{i} = v{i} == 1")
        else:
            if arg < 32:
                lines.append(
                    f"    if raw[{o + arg}:{o + 32}] != ZERO[{arg}:]: raise ValueError('bytes{arg} word has non-zero padding')"
                )
            value = f"'0x' + raw[{o}:{o + arg}].hex()" if hex_bytes else f"raw[{o}:{o + arg}]"
            lines.append(f"    v{i} = {value}")
    position = {n: i for i, n in enumerate(names)}
    lines.append("    return {" + ", ".join(f"{n!r}: v{position[n]}" for n in order) + "}")
    namespace: dict[str, Any] = {
        "AbiDecodeError": AbiDecodeError,
        "fromhex": bytes.fromhex,
        "from_bytes": int.from_bytes,
        "checksum": to_checksum_address,
        "ZERO": _ZERO_WORD,
        "ZERO12": _ZERO_WORD[:12],
    }
    exec("\n".join(lines), namespace)  # the source holds only the layout: names as reprs, numbers
    decoder: Callable[[Sequence[str], str], dict[str, Any]] = namespace["decode"]
    return decoder


def _topic_decoder(solidity_type: str, hex_bytes: bool) -> Word:
    """An indexed parameter: a value type's word, or the keccak of a dynamic one (kept as is)."""
    word = _word_decoder(solidity_type, hex_bytes)
    if word is not None:
        return word
    if hex_bytes:
        return lambda topic: "0x" + topic.lower()
    return bytes.fromhex


def _data_converter(solidity_type: str, hex_bytes: bool) -> Callable[[Any], Any] | None:
    """What to apply to an `eth_abi.decode` value (None: keep it)."""
    if solidity_type == "address":
        return to_checksum_address
    if hex_bytes and solidity_type.startswith("bytes") and "[" not in solidity_type:
        return lambda value: "0x" + value.hex()
    return None


@dataclass(frozen=True)
class EventCodec:
    """One event: its topic0 and how to decode its topics and data."""

    name: str
    topic: str
    indexed: tuple[tuple[str, Word], ...]
    data_names: tuple[str, ...]
    data_types: tuple[str, ...]
    data_converters: tuple[Callable[[Any], Any] | None, ...]
    order: tuple[str, ...]
    # One decoder per data word when every data field is a static one-word type; else None.
    words: tuple[tuple[str, Word], ...] | None
    # Fixed-layout events (every topic and data field a static one-word type): a compiled
    # straight-line decoder (`_fixed_decoder`); else None.
    fixed: Callable[[Sequence[str], str], dict[str, Any]] | None = None

    @classmethod
    def of(cls, entry: Mapping[str, Any], hex_bytes: bool) -> EventCodec:
        """From an ABI event entry."""
        inputs = entry["inputs"]
        data_inputs = [p for p in inputs if not p["indexed"]]
        word_decoders = [_word_decoder(abi_type(p), hex_bytes) for p in data_inputs]
        words = (
            tuple((p["name"], fn) for p, fn in zip(data_inputs, word_decoders, strict=True) if fn is not None)
            if all(fn is not None for fn in word_decoders)
            else None
        )
        indexed = [p for p in inputs if p["indexed"]]
        layouts = [_word_layout(abi_type(p)) for p in (*indexed, *data_inputs)]
        fixed = None
        if None not in layouts:
            fixed = _fixed_decoder(
                str(entry["name"]),
                tuple(w for w in layouts if w is not None),
                tuple(p["name"] for p in (*indexed, *data_inputs)),
                len(indexed),
                tuple(p["name"] for p in inputs),
                hex_bytes,
            )
        return cls(
            fixed=fixed,
            name=str(entry["name"]),
            topic=topic_of(entry),
            indexed=tuple((p["name"], _topic_decoder(abi_type(p), hex_bytes)) for p in inputs if p["indexed"]),
            data_names=tuple(p["name"] for p in data_inputs),
            data_types=tuple(abi_type(p) for p in data_inputs),
            data_converters=tuple(_data_converter(abi_type(p), hex_bytes) for p in data_inputs),
            order=tuple(p["name"] for p in inputs),
            words=words,
        )

    def decode(self, topics: Sequence[str], data: str) -> dict[str, Any]:
        """The arguments, in ABI order, of a log with these topics (topic0 included) and data
        (0x hex); AbiDecodeError when they do not fit."""
        if len(topics) != len(self.indexed) + 1:
            raise AbiDecodeError(f"{self.name}: expected {len(self.indexed)} indexed topics, got {len(topics) - 1}")
        if self.fixed is not None:
            try:
                return self.fixed(topics, data)
            except AbiDecodeError:
                raise
            except Exception as exc:  # bad hex digits, padding, ranges: all hostile input
                raise AbiDecodeError(f"{self.name}: does not decode: {exc}") from None
        args: dict[str, Any] = {}
        try:
            for (name, convert), topic in zip(self.indexed, topics[1:], strict=True):
                if len(topic) != 66:
                    raise ValueError("a topic is not 32 bytes")
                args[name] = convert(topic[2:])
            words = self.words
            if words is not None:
                if len(data) < 2 + 64 * len(words):
                    raise AbiDecodeError(f"{self.name}: data is {len(data) // 2 - 1} bytes, expected {32 * len(words)}")
                offset = 2
                for name, word in words:
                    args[name] = word(data[offset : offset + 64])
                    offset += 64
            elif self.data_types:
                values = abi_decode(self.data_types, bytes.fromhex(data[2:]))
                for name, converter, value in zip(self.data_names, self.data_converters, values, strict=True):
                    args[name] = converter(value) if converter is not None else value
        except AbiDecodeError:
            raise
        except Exception as exc:  # eth_abi's errors, bad hex digits: all hostile input
            raise AbiDecodeError(f"{self.name}: does not decode: {exc}") from None
        return {name: args[name] for name in self.order}


# ---------------------------------------------------------------------------- errors


@dataclass(frozen=True)
class DecodedError:
    """A revert reason: the contract's custom error name and its arguments."""

    name: str
    args: tuple[Any, ...] = ()

    def __str__(self) -> str:
        return f"{self.name}{self.args!r}" if self.args else f"{self.name}()"


@dataclass(frozen=True)
class Function:
    """One function: selector, input and output types."""

    name: str
    selector: bytes
    input_types: tuple[str, ...]
    output_types: tuple[str, ...]


class Codec:
    """Selectors, topics, encoders and decoders of one or more ABIs (the first entry of a
    name wins when ABIs share it)."""

    def __init__(self, abis: Iterable[Iterable[Mapping[str, Any]]], *, hex_bytes: bool = True) -> None:
        self.functions: dict[str, Function] = {}
        self.errors: dict[bytes, tuple[str, tuple[str, ...]]] = {}
        self.events: dict[str, EventCodec] = {}
        """By topic0 (lower-case 0x hex)."""
        self.topics: dict[str, str] = {}
        """Event name -> topic0."""
        for abi in abis:
            for entry in abi:
                kind = entry.get("type")
                if kind == "function":
                    self.functions.setdefault(
                        str(entry["name"]),
                        Function(
                            name=str(entry["name"]),
                            selector=selector_of(entry),
                            input_types=tuple(abi_type(p) for p in entry["inputs"]),
                            output_types=tuple(abi_type(p) for p in entry.get("outputs", ())),
                        ),
                    )
                elif kind == "error":
                    self.errors.setdefault(
                        selector_of(entry), (str(entry["name"]), tuple(abi_type(p) for p in entry["inputs"]))
                    )
                elif kind == "event" and not entry.get("anonymous"):
                    event = EventCodec.of(entry, hex_bytes)
                    self.events.setdefault(event.topic, event)
                    self.topics.setdefault(event.name, event.topic)

    def selector(self, function: str) -> bytes:
        """The 4-byte selector of a function."""
        return self.functions[function].selector

    def topic(self, event: str) -> str:
        """topic0 of an event."""
        return self.topics[event]

    def encode_call(self, function: str, args: Sequence[Any]) -> bytes:
        """Calldata of `function(args...)`."""
        f = self.functions[function]
        return f.selector + abi_encode(list(f.input_types), list(args))

    def decode_output(self, function: str, data: bytes) -> tuple[Any, ...]:
        """The return values of a call of `function`."""
        return tuple(abi_decode(list(self.functions[function].output_types), data))

    def decode_error(self, data: bytes) -> DecodedError:
        """Revert data as the contract's custom error (or Panic / Error(string)); "Reverted"
        when empty, "Unknown" when unrecognised, "Malformed" when it does not decode."""
        if not data:
            return DecodedError("Reverted")
        head, body = data[:4], data[4:]
        known = self.errors.get(head)
        try:
            if known is not None:
                name, types = known
                return DecodedError(name, tuple(abi_decode(list(types), body)))
            if head == PANIC_SELECTOR:
                return DecodedError("Panic", tuple(abi_decode(["uint256"], body)))
            if head == ERROR_STRING_SELECTOR:
                return DecodedError("Error", tuple(abi_decode(["string"], body)))
        except Exception:
            return DecodedError("Malformed", ("0x" + data.hex(),))
        return DecodedError("Unknown", ("0x" + data.hex(),))

    def event_of(self, topics: Sequence[str]) -> EventCodec | None:
        """The event a log's topic0 names (None: not one of ours)."""
        if not topics:
            return None
        topic0 = topics[0]
        return self.events.get(topic0) or self.events.get(topic0.lower())

    def decode_log(self, topics: Sequence[str], data: str) -> tuple[str, dict[str, Any]] | None:
        """(event name, arguments) of a log, None when topic0 is not one of ours."""
        event = self.event_of(topics)
        return None if event is None else (event.name, event.decode(topics, data))


@functools.cache
def escrow_codec() -> Codec:
    """The escrow's codec (bytes as 0x hex)."""
    return Codec([escrow_abi()])


@functools.cache
def devnet_codec() -> Codec:
    """The escrow's and the mock token's codec with native values (bytes as bytes)."""
    return Codec([escrow_abi(), token_abi()], hex_bytes=False)


def selector(function: str) -> bytes:
    """The 4-byte selector of an escrow function."""
    return escrow_codec().selector(function)


def event_topic(event: str) -> str:
    """topic0 of an escrow event."""
    return escrow_codec().topic(event)


def encode_call(function: str, *args: Any) -> bytes:
    """Calldata of an escrow function call."""
    return escrow_codec().encode_call(function, args)


def decode_revert(data: bytes) -> DecodedError:
    """Revert data as the escrow's custom error (or Panic / Error(string))."""
    return escrow_codec().decode_error(data)


# ---------------------------------------------------------------------------- reading a task


@dataclass(frozen=True)
class TaskOnChain:
    """The fields of `getTask(taskId)` a verifier checks what it is shown against (addresses lower-case)."""

    poster: str
    status: int
    attempts: int
    agent: str
    verifier: str
    task_hash: str
    last_evidence_hash: str


def get_task_data(task_id: int) -> bytes:
    """Calldata of `getTask(taskId)`."""
    return encode_call("getTask", task_id)


@functools.cache
def _task_fields() -> tuple[str, ...]:
    entry = next(e for e in escrow_abi() if e.get("type") == "function" and e["name"] == "getTask")
    (output,) = entry["outputs"]
    return tuple(str(c["name"]) for c in output["components"])


def decode_task(data: bytes) -> TaskOnChain:
    """The return value of `getTask`; ValueError when it is not exactly one Task tuple."""
    names = _task_fields()
    if len(data) != 32 * len(names):  # a static tuple: one word per field, nothing else
        raise ValueError(f"getTask returned {len(data)} bytes, not {32 * len(names)}")
    (values,) = escrow_codec().decode_output("getTask", data)
    fields = dict(zip(names, values, strict=True))
    return TaskOnChain(
        poster=str(fields["poster"]).lower(), status=int(fields["status"]), attempts=int(fields["attempts"]),
        agent=str(fields["agent"]).lower(), verifier=str(fields["verifier"]).lower(),
        task_hash=_hex32(fields["taskHash"]), last_evidence_hash=_hex32(fields["lastEvidenceHash"]),
    )  # fmt: skip


def _hex32(value: Any) -> str:
    return value if isinstance(value, str) else "0x" + bytes(value).hex()
