"""The JSON-RPC client's pure parts: the one node-error taxonomy and reply validation."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chain.rpc import (
    AlreadyKnown,
    NonceTooLow,
    Reverted,
    RpcCallError,
    RpcError,
    RpcRangeTooLarge,
    RpcRateLimited,
    RpcTransportError,
    Underpriced,
    classify_send_error,
    hash32,
    header_reply,
    logs_reply,
    node_error,
    node_error_kind,
    quantity,
)
from relayer.settlement.rulings import node_has_it
from relayer.settlement.sender import classify_send_error as sender_classify

KINDS = {
    "transport",
    "rate_limited",
    "range_too_large",
    "reverted",
    "already_known",
    "nonce_too_low",
    "nonce_too_high",
    "underpriced",
    "below_base_fee",
    "insufficient_funds",
    "permanent",
}
TRANSIENT = {"transport", "rate_limited"}


@pytest.mark.parametrize(
    ("method", "code", "message", "kind"),
    [
        # geth / erigon
        ("eth_sendRawTransaction", -32000, "already known", "already_known"),
        ("eth_sendRawTransaction", -32000, "nonce too low: next nonce 5, tx nonce 4", "nonce_too_low"),
        ("eth_sendRawTransaction", -32000, "replacement transaction underpriced", "underpriced"),
        ("eth_sendRawTransaction", -32000, "transaction underpriced", "underpriced"),
        ("eth_sendRawTransaction", -32000, "max fee per gas less than block base fee", "below_base_fee"),
        ("eth_sendRawTransaction", -32000, "insufficient funds for gas * price + value", "insufficient_funds"),
        ("eth_sendRawTransaction", -32000, "intrinsic gas too low", "permanent"),
        ("eth_call", 3, "execution reverted", "reverted"),
        ("eth_estimateGas", -32000, "execution reverted: custom error", "reverted"),
        ("eth_getLogs", -32000, "header not found", "transport"),
        ("eth_getBlockByNumber", -32000, "some unknown server fault", "transport"),
        ("eth_call", -32000, "some unknown server fault", "permanent"),
        # anvil
        ("eth_sendRawTransaction", -32003, "transaction already imported", "already_known"),
        ("eth_sendRawTransaction", -32003, "nonce too high", "nonce_too_high"),
        # besu, nethermind
        ("eth_sendRawTransaction", -32000, "Known transaction", "already_known"),
        ("eth_sendRawTransaction", -32010, "AlreadyKnown", "already_known"),
        ("eth_sendRawTransaction", -32010, "OldNonce, Current nonce: 5", "nonce_too_low"),
        ("eth_getTransactionReceipt", -32000, "unknown transaction", "permanent"),
        # providers
        ("eth_getLogs", -32005, "query returned more than 10000 results", "range_too_large"),
        ("eth_getLogs", -32602, "Log response size exceeded. Use a 2K block range", "range_too_large"),
        ("eth_getLogs", -32005, "exceed maximum block range: 10", "range_too_large"),
        ("eth_getLogs", -32005, "daily request count exceeded, request rate limited", "rate_limited"),
        ("eth_call", -32005, "limit exceeded", "rate_limited"),
        ("eth_chainId", 429, "Too Many Requests", "rate_limited"),
        ("eth_call", -32603, "internal error", "transport"),
        ("eth_getLogs", -32603, "internal error", "transport"),
    ],
)
def test_node_error_texts_map_to_one_kind(method: str, code: int, message: str, kind: str) -> None:
    """Error texts of geth, erigon, anvil, besu, nethermind and hosted providers: one kind each."""
    assert node_error_kind(method, code, message) == kind
    error = node_error(method, {"code": code, "message": message})
    assert error.kind == kind
    assert error.retryable == (kind in TRANSIENT)


def test_refusals_are_their_own_classes() -> None:
    """The refusals a sender acts on are classes under RpcCallError (so `except RpcCallError` still holds)."""
    assert isinstance(node_error("m", {"code": -32000, "message": "already known"}), AlreadyKnown)
    assert isinstance(node_error("m", {"code": -32000, "message": "nonce too low"}), NonceTooLow)
    assert isinstance(node_error("m", {"code": -32000, "message": "transaction underpriced"}), Underpriced)
    reverted = node_error("eth_call", {"code": 3, "message": "execution reverted", "data": "0xdeadbeef"})
    assert isinstance(reverted, Reverted) and reverted.revert_data == bytes.fromhex("deadbeef")
    for error in (reverted, node_error("m", {"code": -32000, "message": "nope"})):
        assert isinstance(error, RpcCallError)
    assert isinstance(node_error("eth_getLogs", {"code": -32005, "message": "too many results"}), RpcRangeTooLarge)
    assert isinstance(node_error("m", {"code": 429, "message": "slow down"}), RpcRateLimited)


@pytest.mark.parametrize(
    ("message", "outcome"),
    [
        ("transaction already imported", "known"),
        ("already known", "known"),
        ("AlreadyKnown", "known"),  # nethermind: the verdict sender's own copy missed it
        ("Known transaction: 0xab", "known"),
        ("nonce too low", "nonce_too_low"),
        ("OldNonce", "nonce_too_low"),
        ("nonce too high", "nonce_too_high"),
        ("replacement transaction underpriced", "underpriced"),
        ("max fee per gas less than block base fee", "below_base_fee"),
        ("insufficient funds for gas * price + value", "insufficient_funds"),
        ("intrinsic gas too low", "refused"),
        ("execution reverted", "refused"),
    ],
)
def test_send_refusals_read_one_way_by_both_senders(message: str, outcome: str) -> None:
    """The verdict sender's and the ruling sender's reading of a refusal are the same function."""
    assert classify_send_error(message) == outcome
    assert sender_classify(message) == outcome
    assert node_has_it(message) == (outcome in ("known", "nonce_too_low"))


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=80),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(method=st.sampled_from(["eth_getLogs", "eth_call", "eth_sendRawTransaction", "batch"]), error=JSON)
def test_any_error_object_becomes_one_rpc_error(method: str, error: Any) -> None:
    """Whatever a node puts in `error`, the client makes one RpcError of a known kind, never raises."""
    result = node_error(method, error)
    assert isinstance(result, RpcError)
    assert result.kind in KINDS
    assert result.retryable == (result.kind in TRANSIENT)
    if isinstance(result, RpcCallError):
        assert len(result.message) <= 500


@settings(max_examples=400, deadline=None)
@given(value=JSON)
def test_reply_checks_refuse_anything_malformed_with_a_transport_error(value: Any) -> None:
    """Every checker either hands back a well-formed value or raises RpcTransportError: nothing else."""
    for check in (quantity, hash32, header_reply, logs_reply):
        with contextlib.suppress(RpcTransportError):
            check(value)


def _log(**changes: Any) -> dict[str, Any]:
    log: dict[str, Any] = {
        "address": "0x" + "11" * 20,
        "topics": ["0x" + "22" * 32],
        "data": "0x",
        "blockNumber": "0x10",
        "blockHash": "0x" + "33" * 32,
        "transactionHash": "0x" + "44" * 32,
        "transactionIndex": "0x0",
        "logIndex": "0x1",
        "removed": False,
    }
    log.update(changes)
    return log


@pytest.mark.parametrize(
    "changes",
    [
        {"data": 0},
        {"blockNumber": 16},
        {"logIndex": "0x" + "f" * 40},
        {"topics": ["0x" + "22" * 32] * 5},
        {"topics": [7]},
        {"address": "0x11"},
        {"blockHash": None},
        {"removed": "no"},
        {"blockTimestamp": 5},
        {"data": "0xabc"},
    ],
)
def test_a_malformed_log_is_refused(changes: dict[str, Any]) -> None:
    """Each field the decoder and the store read is checked for type and size."""
    assert logs_reply([_log()]) == [_log()]
    with pytest.raises(RpcTransportError):
        logs_reply([_log(), _log(**changes)])


def test_hex_digits_of_a_log_are_checked_where_they_are_decoded() -> None:
    """The reply check looks at types and sizes only (it runs on every log of a backfill);
    a log whose quantities are not hex fails in the decoder, as a DecodeError."""
    from eth_abi.abi import encode

    from chain.abi import escrow_codec
    from indexer.decode import DecodeError, EscrowLogDecoder
    from schemas.abi import escrow_abi

    accepted = escrow_codec().events[escrow_codec().topic("TaskAccepted")]
    assert [name for name, _ in accepted.indexed] == ["taskId", "agent"]
    topics = [accepted.topic, "0x" + encode(["uint256"], [7]).hex(), "0x" + encode(["address"], ["0x" + "12" * 20]).hex()]
    good = _log(
        topics=topics,
        data="0x" + encode(list(accepted.data_types), [1] * len(accepted.data_types)).hex(),
        blockTimestamp="0x5",
    )
    decoder = EscrowLogDecoder(escrow_abi())
    decoded = decoder.decode(1, good)
    assert decoded is not None and decoded.task_id == 7
    for field in ("blockNumber", "logIndex", "transactionIndex", "blockTimestamp"):
        bad = {**good, field: "0xzz"}
        assert logs_reply([bad]) == [bad]
        with pytest.raises(DecodeError):
            decoder.decode(1, bad)


def test_quantities_and_headers() -> None:
    """Quantities are 0x hex of at most 256 bits; a header needs its four fields."""
    assert quantity("0x0") == 0 and quantity("0x" + "f" * 64) == 2**256 - 1
    for bad in ("0x", "12", 12, "0x" + "f" * 65, "0xg", None):
        with pytest.raises(RpcTransportError):
            quantity(bad)
    header = {"number": "0x1", "hash": "0x" + "a" * 64, "parentHash": "0x" + "b" * 64, "timestamp": "0x5"}
    assert header_reply(header) is header and header_reply(None) is None
    for field in ("number", "hash", "parentHash", "timestamp"):
        with pytest.raises(RpcTransportError):
            header_reply({**header, field: 1})
