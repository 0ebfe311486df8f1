"""Task terms: the canonical JSON (RFC 8785), the task hash, the result hash."""

from __future__ import annotations

import struct

import pytest
from eth_utils.crypto import keccak
from hypothesis import given
from hypothesis import strategies as st

from schemas.task_terms import CanonicalJsonError, TaskTerms, canonical_json, result_hash, task_hash

# RFC 8785 appendix B: IEEE 754 bit patterns and their canonical text.
RFC8785_NUMBERS = [
    ("0000000000000000", "0"), ("8000000000000000", "0"), ("0000000000000001", "5e-324"),
    ("8000000000000001", "-5e-324"), ("7fefffffffffffff", "1.7976931348623157e+308"),
    ("4340000000000000", "9007199254740992"), ("c340000000000000", "-9007199254740992"),
    ("4430000000000000", "295147905179352830000"), ("44b52d02c7e14af5", "9.999999999999997e+22"),
    ("44b52d02c7e14af6", "1e+23"), ("44b52d02c7e14af7", "1.0000000000000001e+23"),
    ("444b1ae4d6e2ef4e", "999999999999999700000"), ("444b1ae4d6e2ef4f", "999999999999999900000"),
    ("444b1ae4d6e2ef50", "1e+21"), ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"),
    ("3eb0c6f7a0b5ed8d", "0.000001"), ("41b3de4355555553", "333333333.3333332"),
    ("41b3de4355555554", "333333333.33333325"), ("41b3de4355555555", "333333333.3333333"),
    ("41b3de4355555556", "333333333.3333334"), ("41b3de4355555557", "333333333.33333343"),
    ("becbf647612f3696", "-0.0000033333333333333333"), ("43143ff3c1cb0959", "1424953923781206.2"),
]  # fmt: skip


@pytest.mark.parametrize(("bits", "text"), RFC8785_NUMBERS)
def test_numbers_serialise_as_rfc8785_says(bits: str, text: str) -> None:
    value = struct.unpack(">d", bytes.fromhex(bits))[0]
    assert canonical_json(value) == text


def test_rfc8785_structure_example() -> None:
    """Keys sorted by UTF-16 code units, no whitespace, literal non-ASCII, minimal escapes."""
    value = {
        "numbers": [333333333.33333329, 1e30, 4.50, 2e-3, 0.000000000000000000000000001],
        "string": "€$\u000f\nA'B\"\\\\\"/",
        "literals": [None, True, False],
    }
    assert canonical_json(value) == (
        '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
        '"string":"€$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}'
    )
    # UTF-16 order puts U+1F600 (a surrogate pair, D83D…) before U+FB33; code-point order would not.
    utf16 = canonical_json({"\u20ac": 1, "\U0001f600": 2, "\ufb33": 3, "a": 4})
    assert utf16 == '{"a":4,"\u20ac":1,"\U0001f600":2,"\ufb33":3}'


def test_values_without_a_canonical_form_are_refused() -> None:
    for bad in (float("nan"), float("inf"), "\ud800", {1: "x"}, object()):
        with pytest.raises(CanonicalJsonError):
            canonical_json(bad)


@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
))  # fmt: skip
def test_canonical_json_is_json_that_round_trips(value: object) -> None:
    """The canonical text parses back to an equal value, and canonicalising it again changes nothing."""
    import json

    text = canonical_json(value)
    assert canonical_json(json.loads(text)) == text


def terms(**extra: object) -> TaskTerms:
    data: dict[str, object] = {
        "chainId": 31337, "escrow": "0x5fbdb2315678afecb367f032d93f642f64180aa3",
        "poster": "0x70997970C51812dc3A010C7d01b50e0d17dc79C8", "instructionsDigest": "0x" + "AB" * 32,
    }  # fmt: skip
    data.update(extra)
    return TaskTerms.model_validate(data)


def test_equivalent_terms_hash_alike_and_the_hash_is_keccak_of_the_canonical_text() -> None:
    """Address case, hash case, a default mode written out and dropped unknown criteria fields do not matter."""
    plain = terms(verificationCriteria={"min_length": 10})
    same = terms(escrow="0x5FbDB2315678afecb367f032d93F642f64180aa3", instructionsDigest="0x" + "ab" * 32,
                 verificationMode="manual", verificationCriteria={"min_length": 10.0, "min_lenght": 5})  # fmt: skip
    assert task_hash(plain) == task_hash(same)
    assert task_hash(plain) == "0x" + keccak(plain.canonical().encode()).hex()
    assert plain.canonical() == (
        '{"chainId":31337,"escrow":"0x5FbDB2315678afecb367f032d93F642f64180aa3",'
        '"instructionsDigest":"0x' + "ab" * 32 + '","poster":"0x70997970C51812dc3A010C7d01b50e0d17dc79C8",'
        '"private":false,"verificationCriteria":{"min_length":10},"verificationMode":"manual"}'
    )


def test_every_term_changes_the_hash() -> None:
    base = task_hash(terms())
    variants = [
        terms(private=True), terms(salt="1"), terms(verificationMode="auto"), terms(chainId=1),
        terms(verificationCriteria={"min_length": 11}),
        terms(verificationMode="agent", verifierAddress="0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC"),
    ]  # fmt: skip
    hashes = {task_hash(v) for v in variants}
    assert base not in hashes and len(hashes) == len(variants)


def test_result_hash() -> None:
    """A string result hashes as its UTF-8 text; anything else as its canonical JSON."""
    assert result_hash("Paris") == "0x" + keccak(b"Paris").hex()
    assert result_hash({"output": "x", "a": 1.0}) == "0x" + keccak(b'{"a":1,"output":"x"}').hex()
