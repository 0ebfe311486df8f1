"""The indexer's pure core: log decoding, range sizing and planning, reorg checks."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from eth_abi.abi import encode as abi_encode
from eth_utils.address import to_checksum_address
from eth_utils.crypto import keccak
from hexbytes import HexBytes
from hypothesis import given, settings
from hypothesis import strategies as st
from web3 import Web3

from indexer.decode import DecodeError, EscrowLogDecoder
from indexer.ranges import RangeSizer, plan_ranges
from indexer.reorg import BlockRef, Extends, Inconsistent, Reorged, check_window, common_ancestor
from schemas.abi import escrow_abi, escrow_events
from schemas.events import event_id

ESCROW = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
BLOCK_HASH = "0x" + "ab" * 32
TX_HASH = "0x" + "cd" * 32
EVENTS = {entry["name"]: entry for entry in escrow_events()}
DECODER = EscrowLogDecoder(escrow_abi())
W3 = Web3()
CONTRACT = W3.eth.contract(address=to_checksum_address(ESCROW), abi=escrow_abi())

# -- decoding -------------------------------------------------------------------------


def _value(solidity_type: str) -> st.SearchStrategy[Any]:
    if solidity_type == "address":
        return st.binary(min_size=20, max_size=20).map(lambda b: to_checksum_address(b))
    if solidity_type == "bool":
        return st.booleans()
    if solidity_type == "bytes32":
        return st.binary(min_size=32, max_size=32)
    if solidity_type.startswith("uint"):
        bits = int(solidity_type[4:] or 256)
        return st.integers(min_value=0, max_value=2**bits - 1)
    raise AssertionError(f"no strategy for {solidity_type}")


def _event_values(name: str) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {inp["name"]: _value(inp["type"]) for inp in EVENTS[name]["inputs"]}
    )


def _topic0(entry: dict[str, Any]) -> str:
    signature = f"{entry['name']}({','.join(i['type'] for i in entry['inputs'])})"
    return "0x" + keccak(text=signature).hex()


def _raw_log(
    name: str, values: dict[str, Any], *, block: int = 7, log_index: int = 3
) -> dict[str, Any]:
    """An `eth_getLogs` entry as a node returns it (hex strings)."""
    entry = EVENTS[name]
    topics = [_topic0(entry)]
    for inp in entry["inputs"]:
        if inp["indexed"]:
            topics.append("0x" + abi_encode([inp["type"]], [values[inp["name"]]]).hex())
    data_inputs = [i for i in entry["inputs"] if not i["indexed"]]
    data = abi_encode([i["type"] for i in data_inputs], [values[i["name"]] for i in data_inputs])
    return {
        "address": ESCROW.lower(),
        "topics": topics,
        "data": "0x" + data.hex(),
        "blockNumber": hex(block),
        "blockHash": BLOCK_HASH,
        "blockTimestamp": hex(1_700_000_000),
        "transactionHash": TX_HASH,
        "transactionIndex": "0x1",
        "logIndex": hex(log_index),
        "removed": False,
    }


def _web3_decode(name: str, raw: dict[str, Any]) -> dict[str, Any]:
    """web3's own decoding of the same log (the reference)."""
    log = {
        "address": to_checksum_address(raw["address"]),
        "topics": [HexBytes(t) for t in raw["topics"]],
        "data": HexBytes(raw["data"]),
        "blockNumber": int(raw["blockNumber"], 16),
        "blockHash": HexBytes(raw["blockHash"]),
        "transactionHash": HexBytes(raw["transactionHash"]),
        "transactionIndex": int(raw["transactionIndex"], 16),
        "logIndex": int(raw["logIndex"], 16),
        "removed": False,
    }
    event = getattr(CONTRACT.events, name)().process_log(log)
    return {
        k: ("0x" + bytes(v).hex() if isinstance(v, bytes) else v) for k, v in event["args"].items()
    }


def test_the_abi_has_every_event_the_contract_emits() -> None:
    """The decoder knows exactly the ABI's events (16, with PaymentDeferred and Withdrawn), by topic0."""
    assert len(EVENTS) == 16
    assert {"PaymentDeferred", "Withdrawn"} <= set(EVENTS)
    assert set(DECODER.topics) == {_topic0(e) for e in EVENTS.values()}


@pytest.mark.parametrize("name", sorted(EVENTS))
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_decode_matches_web3_for_every_event_type(name: str, data: st.DataObject) -> None:
    """Fields, their order and their Python types equal web3's `process_log` for each event."""
    values = data.draw(_event_values(name))
    block, log_index = data.draw(st.integers(0, 2**40)), data.draw(st.integers(0, 5000))
    raw = _raw_log(name, values, block=block, log_index=log_index)
    decoded = DECODER.decode(31337, raw)
    assert decoded is not None
    expected = _web3_decode(name, raw)
    assert decoded.args == expected
    assert list(decoded.args) == [i["name"] for i in EVENTS[name]["inputs"]]
    assert decoded.event == name
    assert decoded.block_number == block
    assert decoded.log_index == log_index
    assert decoded.id == event_id(31337, BLOCK_HASH, log_index)
    assert decoded.escrow_address == to_checksum_address(ESCROW)
    assert decoded.block_timestamp == 1_700_000_000
    assert decoded.task_id == values.get("taskId")


def test_given_block_timestamp_wins_over_the_log_field_and_is_required_without_it() -> None:
    """A header's timestamp is used when given; a log without either is a DecodeError."""
    raw = _raw_log(
        "TaskAccepted", {"taskId": 5, "agent": to_checksum_address("0x" + "11" * 20), "status": 1}
    )
    decoded = DECODER.decode(1, raw, 42)
    assert decoded is not None and decoded.block_timestamp == 42
    del raw["blockTimestamp"]
    with pytest.raises(DecodeError):
        DECODER.decode(1, raw)


def test_foreign_and_malformed_logs() -> None:
    """Unknown topic0 (e.g. the token's Transfer) is not ours; a wrong topic count is an error."""
    transfer = "0x" + keccak(text="Transfer(address,address,uint256)").hex()
    raw = _raw_log(
        "TaskAccepted", {"taskId": 5, "agent": to_checksum_address("0x" + "11" * 20), "status": 1}
    )
    assert DECODER.decode(1, {**raw, "topics": [transfer, *raw["topics"][1:]]}) is None
    assert DECODER.decode(1, {**raw, "topics": []}) is None
    with pytest.raises(DecodeError):
        DECODER.decode(1, {**raw, "topics": raw["topics"][:2]})
    with pytest.raises(DecodeError):
        DECODER.decode(1, {**raw, "data": "0x1234"})


def test_every_escrow_event_is_decoded_by_its_fixed_layout() -> None:
    """The escrow's events are all static one-word fields: each decodes from one
    `bytes.fromhex` per log (`EventCodec._decode_fixed`), never word by word."""
    codec = DECODER._codec
    assert all(event.fixed is not None for event in codec.events.values())


_CREATED = {
    "taskId": 9,
    "poster": to_checksum_address("0x" + "11" * 20),
    "verifier": to_checksum_address("0x" + "22" * 20),
    "token": to_checksum_address("0x" + "33" * 20),
    "reward": 10**18,
    "deadline": 2**40,
    "taskHash": b"\x42" * 32,
    "status": 1,
}


def _word_edit(raw: dict[str, Any], where: str, word: int, at: int, text: str) -> dict[str, Any]:
    """`raw` with `text` written at hex digit `at` of a 32-byte word (a topic, or of data)."""
    if where == "topic":
        topics = list(raw["topics"])
        t = topics[word]
        topics[word] = t[: 2 + at] + text + t[2 + at + len(text) :]
        return {**raw, "topics": topics}
    d = raw["data"]
    start = 2 + 64 * word + at
    return {**raw, "data": d[:start] + text + d[start + len(text) :]}


@pytest.mark.parametrize(
    ("where", "word", "at", "text"),
    [
        ("topic", 2, 0, "1"),  # poster: non-zero address padding
        ("data", 0, 10, "f"),  # token: non-zero address padding
        ("data", 2, 0, "1"),  # deadline beyond uint64
        ("data", 4, 0, "1"),  # status beyond uint8
        ("data", 1, 63, "g"),  # not a hex digit
        ("topic", 1, 40, "x"),  # not a hex digit in a topic
        ("data", 1, 10, " 0"),  # whitespace, which `bytes.fromhex` would skip
        ("data", 1, 0, "0x"),  # a prefix inside a word (`int(word, 16)` would take it)
    ],
)
def test_a_fixed_layout_word_that_is_not_canonical_is_refused(
    where: str, word: int, at: int, text: str
) -> None:
    """Padding, ranges and digits are checked as strictly as the word-by-word decoder does:
    a non-canonical word is a DecodeError, never a value."""
    raw = _raw_log("TaskCreated", _CREATED)
    decoded = DECODER.decode(1, raw)
    assert decoded is not None and decoded.args["status"] == 1
    with pytest.raises(DecodeError):
        DECODER.decode(1, _word_edit(raw, where, word, at, text))


# -- range sizing and planning --------------------------------------------------------

sizers = st.builds(
    lambda lo, span, size, target: RangeSizer(
        size=min(lo + span, max(lo, size)), min_size=lo, max_size=lo + span, target_logs=target
    ),
    st.integers(1, 50),
    st.integers(0, 10_000),
    st.integers(1, 20_000),
    st.integers(2, 20_000),
)


@given(
    sizers, st.lists(st.tuples(st.booleans(), st.integers(0, 50_000), st.floats(0, 5)), max_size=40)
)
def test_sizer_stays_within_bounds(sizer: RangeSizer, steps: list[tuple[bool, int, float]]) -> None:
    """Whatever happens, the size stays in [min_size, max_size]; a shrink never grows it."""
    for refused, logs, seconds in steps:
        before = sizer.size
        sizer = sizer.shrink() if refused else sizer.observe(logs=logs, seconds=seconds)
        assert sizer.min_size <= sizer.size <= sizer.max_size
        if refused:
            assert sizer.size == max(sizer.min_size, before // 2)


@given(sizers)
def test_sizer_grows_while_cheap_and_shrinks_when_heavy(sizer: RangeSizer) -> None:
    """Cheap replies grow the range (up to the max), heavy ones shrink it (down to the min)."""
    grown = sizer.observe(logs=0, seconds=0.0)
    assert grown.size > sizer.size or sizer.size == sizer.max_size
    heavy = sizer.observe(logs=sizer.target_logs + 1, seconds=0.0)
    assert heavy.size < sizer.size or sizer.size == sizer.min_size
    slow = sizer.observe(logs=0, seconds=sizer.target_seconds * 2)
    assert slow.size < sizer.size or sizer.size == sizer.min_size


def test_repeated_refusals_reach_the_minimum() -> None:
    """ "Too many results" again and again: halving reaches one block, and stops there."""
    sizer = RangeSizer(size=5000, max_size=5000)
    sizes = []
    for _ in range(15):
        sizer = sizer.shrink()
        sizes.append(sizer.size)
    assert sizes[:3] == [2500, 1250, 625]
    assert sizes[-1] == 1


@given(st.integers(0, 10**9), st.integers(-5, 10_000), st.integers(1, 500), st.integers(1, 16))
def test_plan_ranges_is_consecutive_and_bounded(
    start: int, length: int, size: int, count: int
) -> None:
    """Ranges are consecutive from `start`, at most `size` long, at most `count`, none past `end`."""
    end = start + length
    ranges = plan_ranges(start, end, size, count)
    if end < start:
        assert ranges == []
        return
    assert 1 <= len(ranges) <= count
    assert ranges[0][0] == start
    for (_, b), (c, _) in itertools.pairwise(ranges):
        assert c == b + 1
    for a, b in ranges:
        assert a <= b <= end
        assert b - a + 1 <= size
    covered = ranges[-1][1] - start + 1
    assert covered == min(length + 1, size * count)


# -- reorg checks ---------------------------------------------------------------------


def _hash(fork: int, number: int) -> str:
    return "0x" + keccak(text=f"{fork}:{number}").hex()


def _chain(
    fork: int, start: int, end: int, *, base: dict[int, str] | None = None
) -> list[BlockRef]:
    """Blocks `start..end` of fork `fork`; blocks in `base` keep their hashes."""
    hashes = dict(base or {})
    refs = []
    for n in range(start, end + 1):
        hashes.setdefault(n, _hash(fork, n))
        parent = hashes.get(n - 1, _hash(fork, n - 1))
        refs.append(BlockRef(n, hashes[n], parent, 1_000 + n))
    return refs


@given(st.integers(1, 1000), st.integers(1, 30))
def test_a_window_that_builds_on_the_tip_extends(tip: int, length: int) -> None:
    """Linked headers from the tip's child, logs from the same blocks: Extends."""
    refs = _chain(0, tip + 1, tip + length)
    logs = {r.number: {r.hash} for r in refs[::2]}
    assert check_window(_hash(0, tip), refs, logs) == Extends()
    assert check_window(None, refs, logs) == Extends()
    # Sparse (range mode: first and last header only) still extends.
    assert check_window(_hash(0, tip), [refs[0], refs[-1]], {}) == Extends()


@given(st.integers(1, 1000), st.integers(1, 30))
def test_a_window_on_another_parent_is_a_reorg(tip: int, length: int) -> None:
    """The first header's parent is not the stored tip: Reorged."""
    refs = _chain(1, tip + 1, tip + length)
    assert check_window(_hash(0, tip), refs, {}) == Reorged()


@given(st.integers(1, 1000), st.integers(2, 30), st.data())
def test_a_window_that_changed_while_fetched_is_inconsistent(
    tip: int, length: int, data: st.DataObject
) -> None:
    """A broken parent link inside the window, or logs of another fork: Inconsistent."""
    refs = _chain(0, tip + 1, tip + length)
    i = data.draw(st.integers(1, length - 1))
    broken = [
        *refs[:i],
        BlockRef(refs[i].number, refs[i].hash, _hash(9, refs[i].number - 1), 0),
        *refs[i + 1 :],
    ]
    assert isinstance(check_window(_hash(0, tip), broken, {}), Inconsistent)
    j = data.draw(st.integers(0, length - 1))
    logs = {refs[j].number: {_hash(7, refs[j].number)}}
    assert isinstance(check_window(_hash(0, tip), refs, logs), Inconsistent)
    mixed = {refs[j].number: {refs[j].hash, _hash(7, refs[j].number)}}
    assert isinstance(check_window(_hash(0, tip), refs, mixed), Inconsistent)
    assert isinstance(check_window(_hash(0, tip), [], {}), Inconsistent)


@given(
    st.integers(0, 500),
    st.integers(1, 80),
    st.integers(0, 90),
    st.sets(st.integers(0, 80)),
)
def test_common_ancestor_is_the_highest_shared_stored_block(
    low: int, length: int, fork_after: int, sparse: set[int]
) -> None:
    """Against brute force: stored blocks (possibly sparse) vs a canonical chain forked after `fork_after`."""
    high = low + length
    fork_point = low + fork_after  # blocks <= fork_point are shared
    stored_all = {r.number: r.hash for r in _chain(0, low, high)}
    keep = {low + s for s in sparse if low + s <= high} or {high}
    stored = {n: h for n, h in stored_all.items() if n in keep}
    canonical: dict[int, str | None] = {
        n: (_hash(0, n) if n <= fork_point else _hash(1, n)) for n in range(low, high + 1)
    }
    shared = [n for n in stored if n <= fork_point]
    assert common_ancestor(stored, canonical) == (max(shared) if shared else None)
    # Blocks the node no longer has (a shorter chain) are not ancestors either.
    shorter = {n: (h if n <= fork_point else None) for n, h in canonical.items()}
    assert common_ancestor(stored, shorter) == (max(shared) if shared else None)
