"""The compiled fixed-layout event decoder agrees with the word-by-word one and eth_abi."""

from __future__ import annotations

import dataclasses
from typing import Any

from eth_abi.abi import encode
from hypothesis import given
from hypothesis import strategies as st

from chain.abi import Codec, to_checksum_address

ABI: list[dict[str, Any]] = [
    {
        "type": "event",
        "name": "Mixed",
        "anonymous": False,
        "inputs": [
            {"name": "small", "type": "int8", "indexed": False},
            {"name": "who", "type": "address", "indexed": True},
            {"name": "flag", "type": "bool", "indexed": False},
            {"name": "tag", "type": "bytes4", "indexed": False},
            {"name": "wide", "type": "int256", "indexed": True},
            {"name": "amount", "type": "uint96", "indexed": False},
        ],
    },
    {
        "type": "event",
        "name": "WithArray",
        "anonymous": False,
        "inputs": [{"name": "pair", "type": "uint256[2]", "indexed": False}],
    },
]
CODEC = Codec([ABI])
MIXED = CODEC.events[CODEC.topic("Mixed")]


@given(
    small=st.integers(-(2**7), 2**7 - 1),
    who=st.binary(min_size=20, max_size=20),
    flag=st.booleans(),
    tag=st.binary(min_size=4, max_size=4),
    wide=st.integers(-(2**255), 2**255 - 1),
    amount=st.integers(0, 2**96 - 1),
)
def test_fixed_layout_equals_the_word_decoders(
    small: int, who: bytes, flag: bool, tag: bytes, wide: int, amount: int
) -> None:
    """Indexed and data fields interleaved in the ABI, signed and narrow types: the compiled
    decoder returns what the word-by-word path returns, in ABI order, equal to the values
    eth_abi encoded."""
    topics = [MIXED.topic, "0x" + encode(["address"], [who]).hex(), "0x" + encode(["int256"], [wide]).hex()]
    data = "0x" + encode(["int8", "bool", "bytes4", "uint96"], [small, flag, tag, amount]).hex()
    assert MIXED.fixed is not None
    fixed = MIXED.decode(topics, data)
    words = dataclasses.replace(MIXED, fixed=None).decode(topics, data)
    assert fixed == words
    assert list(fixed) == ["small", "who", "flag", "tag", "wide", "amount"]
    assert fixed == {
        "small": small,
        "who": to_checksum_address("0x" + who.hex()),
        "flag": flag,
        "tag": "0x" + tag.hex(),
        "wide": wide,
        "amount": amount,
    }


def test_static_arrays_are_not_a_fixed_layout() -> None:
    """`uint256[2]` is two words for one field: decoded by eth_abi, never word by word."""
    event = CODEC.events[CODEC.topic("WithArray")]
    assert event.fixed is None and event.words is None
    assert event.decode([event.topic], "0x" + encode(["uint256[2]"], [[1, 2]]).hex()) == {"pair": (1, 2)}
