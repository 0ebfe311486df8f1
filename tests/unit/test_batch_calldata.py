"""`completeVerificationBatch` calldata by hand, and its all-settle reply read by hand, pinned
to the ABI codec: the same bytes, the same refusals, the same decoded reply."""

from __future__ import annotations

import pytest
from eth_abi.abi import encode
from hypothesis import given
from hypothesis import strategies as st

from chain.abi import encode_call
from chain.txs import (
    VerdictItem,
    complete_verification_batch_data,
    decode_batch_refusals,
    decode_revert,
    selector,
)

ITEM = st.tuples(
    st.integers(0, 2**256 - 1),
    st.integers(0, 255),
    st.binary(min_size=32, max_size=32).map(lambda b: "0x" + b.hex()),
    st.booleans(),
    st.integers(0, 255),
)


def _codec(items: list[VerdictItem]) -> bytes:
    return encode_call(
        "completeVerificationBatch", [(t, a, bytes.fromhex(e.removeprefix("0x")), p, s) for t, a, e, p, s in items]
    )


@given(st.lists(ITEM, max_size=60))
def test_calldata_equals_the_codec(items: list[VerdictItem]) -> None:
    assert complete_verification_batch_data(items) == _codec(items)


@pytest.mark.parametrize(
    "item",
    [
        (-1, 1, "0x" + "11" * 32, True, 90),  # task id below uint256
        (2**256, 1, "0x" + "11" * 32, True, 90),  # above
        (1, 256, "0x" + "11" * 32, True, 90),  # attempt is a uint8
        (1, -1, "0x" + "11" * 32, True, 90),
        (1, 1, "0x" + "11" * 32, True, 256),  # score is a uint8
        (1, 1, "0x" + "11" * 33, True, 90),  # evidence is bytes32
        (1, 1, "0x" + "11" * 32, 1, 90),  # passed is a bool
    ],
)
def test_refuses_what_the_codec_refuses(item: VerdictItem) -> None:
    with pytest.raises(Exception):  # the codec raises its own error types
        _codec([item])
    with pytest.raises((ValueError, TypeError, OverflowError)):
        complete_verification_batch_data([item])


def test_a_short_evidence_hash_is_refused_not_padded() -> None:
    """Stricter than the codec, which pads a short `bytes32` with zeros: an evidence hash is
    32 bytes, and a shorter one is never sent as another hash."""
    short = (1, 1, "0x" + "11" * 31, True, 90)
    assert _codec([short])  # padded
    with pytest.raises(ValueError, match="32 bytes"):
        complete_verification_batch_data([short])


REFUSAL = st.sampled_from(
    [
        b"",
        selector("completeVerificationBatch"),  # any 4 bytes: decoded as an unknown error
        bytes.fromhex("1a8e3b7d") + (1).to_bytes(32, "big"),
        b"\x00" * 3,
    ]
)


@given(st.lists(REFUSAL, max_size=60))
def test_reply_equals_the_codec(refusals: list[bytes]) -> None:
    """Every reply decodes as the codec decodes it, whichever path reads it."""
    data = encode(["bytes[]"], [refusals])
    assert decode_batch_refusals(data) == [decode_revert(r) if r else None for r in refusals]


def test_a_non_canonical_all_empty_reply_goes_to_the_codec() -> None:
    """Two offsets naming the same empty word: valid ABI, not the canonical encoding; the
    codec reads it (not refused as malformed)."""
    data = (32).to_bytes(32, "big") + (2).to_bytes(32, "big") + (64).to_bytes(32, "big") * 2 + bytes(32) * 2
    assert decode_batch_refusals(data) == [None, None]


def test_a_truncated_reply_is_refused() -> None:
    data = encode(["bytes[]"], [[b"", b""]])[:-32]
    with pytest.raises(Exception):  # the codec raises its own error types
        decode_batch_refusals(data)
