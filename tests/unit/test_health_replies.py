"""The bridge health check reads a node's replies as hostile input: a null or garbage
`marketplaceVerifier()` reply is "no trusted key read", never an exception."""

from __future__ import annotations

import pytest

from relayer.settlement.health import _address_word

ADDRESS = "0x" + "ab" * 20


def test_an_abi_address_word_is_read_checksummed() -> None:
    word = "0x" + "0" * 24 + ADDRESS[2:]
    assert _address_word(word) is not None
    assert _address_word(word).lower() == ADDRESS  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "reply",
    [None, "None", 5, "0x", ADDRESS, "0x" + "1" * 64, "0x" + "0" * 24 + "zz" * 20, RuntimeError("cut"), {"a": 1}],
    ids=["null", "text", "number", "empty", "bare-address", "dirty-padding", "not-hex", "error", "object"],
)
def test_anything_else_is_no_address(reply: object) -> None:
    assert _address_word(reply) is None
