"""An `eth_getLogs` reply is checked against the range it answers before its logs are stored."""

from __future__ import annotations

from indexer.service import _misplaced


def _log(block: int, index: int) -> dict[str, str]:
    return {"blockNumber": hex(block), "logIndex": hex(index)}


def test_logs_inside_the_range_in_any_order_are_accepted() -> None:
    assert _misplaced([_log(12, 1), _log(10, 0), _log(12, 0)], 10, 12) is None


def test_a_log_outside_the_range_is_refused() -> None:
    assert "outside the range" in (_misplaced([_log(10, 0), _log(13, 0)], 10, 12) or "")
    assert "outside the range" in (_misplaced([_log(9, 0)], 10, 12) or "")


def test_the_same_log_twice_is_refused() -> None:
    assert "twice" in (_misplaced([_log(11, 4), _log(11, 4)], 10, 12) or "")


def test_a_log_without_hex_coordinates_is_refused_not_raised() -> None:
    assert _misplaced([{"blockNumber": "0xa"}], 10, 12) is not None
    assert _misplaced([{"blockNumber": 10, "logIndex": "0x0"}], 10, 12) is not None
    assert _misplaced([{"blockNumber": "0xzz", "logIndex": "0x0"}], 10, 12) is not None
