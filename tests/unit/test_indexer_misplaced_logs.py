"""An `eth_getLogs` reply is checked against the range it answers before its logs are stored."""

from __future__ import annotations

from typing import Any

import pytest

from chain.logs import RpcLog
from chain.rpc import RpcTransportError, parse_logs
from indexer.service import _misplaced


def _raw(block: Any, index: Any) -> dict[str, Any]:
    return {
        "address": "0x" + "11" * 20, "topics": [], "data": "0x", "blockNumber": block, "blockHash": "0x" + "33" * 32,
        "transactionHash": "0x" + "44" * 32, "transactionIndex": "0x0", "logIndex": index,
    }  # fmt: skip


def _log(block: int, index: int) -> RpcLog:
    (parsed,) = parse_logs([_raw(hex(block), hex(index))])
    return parsed


def test_logs_inside_the_range_in_any_order_are_accepted() -> None:
    assert _misplaced([_log(12, 1), _log(10, 0), _log(12, 0)], 10, 12) is None


def test_a_log_outside_the_range_is_refused() -> None:
    assert "outside the range" in (_misplaced([_log(10, 0), _log(13, 0)], 10, 12) or "")
    assert "outside the range" in (_misplaced([_log(9, 0)], 10, 12) or "")


def test_the_same_log_twice_is_refused() -> None:
    assert "twice" in (_misplaced([_log(11, 4), _log(11, 4)], 10, 12) or "")


def test_a_log_without_hex_coordinates_is_refused_not_raised() -> None:
    assert _misplaced(parse_logs([_raw("0xzz", "0x0")]), 10, 12) is not None
    assert _misplaced(parse_logs([_raw("0xa", "0xzz")]), 10, 12) is not None
    # Missing or non-text coordinates do not even parse: a transport fault, retried elsewhere.
    for block, index in (("0xa", None), (10, "0x0")):
        with pytest.raises(RpcTransportError):
            parse_logs([_raw(block, index)])
