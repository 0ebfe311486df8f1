"""What the hosted verifier checks before it judges (pure): each refusal at its boundary, and the API URL rule."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from eth_utils.crypto import keccak
from hypothesis import given, settings
from hypothesis import strategies as st

from chain.abi import TaskOnChain, decode_task, get_task_data, selector
from schemas.task_terms import TaskTerms, result_hash, task_hash
from verification.agents import briefs
from verification.agents.grounds import (
    Refusal,
    check_item,
    open_checked_brief,
    parse_entry,
    trusted_api_url,
)

ME = "0x" + "2" * 40
ESCROW = "0x" + "5" * 40
BRIEF = "Name the capital of France."
RESULT = "Paris."


def terms(**overrides: Any) -> TaskTerms:
    values: dict[str, Any] = {
        "chainId": 31337, "escrow": ESCROW, "poster": "0x" + "1" * 40,
        "instructionsDigest": "0x" + keccak(BRIEF.encode()).hex(), "verificationMode": "agent",
        "verifierAddress": ME, "verificationCriteria": {"acceptance": 'Names "Paris".'},
    }  # fmt: skip
    values.update(overrides)
    return TaskTerms.model_validate(values)


def setup(t: TaskTerms | None = None, result: Any = RESULT, **chain: Any) -> tuple[dict[str, Any], TaskOnChain]:
    t = t or terms()
    digest = task_hash(t)
    on_chain = TaskOnChain(
        poster=t.poster.lower(), status=2, attempts=1, agent="0x" + "3" * 40, verifier=ME,
        task_hash=digest, last_evidence_hash=result_hash(result),
    )  # fmt: skip
    on_chain = replace(on_chain, **chain)
    item = {
        "chainId": 31337, "escrow": ESCROW, "taskId": 7, "taskHash": digest, "attempt": 1,
        "evidenceHash": result_hash(result), "result": result, "terms": t.canonical_dict(), "failures": 0,
    }  # fmt: skip
    return item, on_chain


def refusal(item: dict[str, Any], on_chain: TaskOnChain) -> str | None:
    try:
        check_item(parse_entry(item), on_chain, ME)
    except Refusal as r:
        return r.code
    return None


def test_an_honest_item_passes_with_the_terms_acceptance_note() -> None:
    item, on_chain = setup()
    grounds = check_item(parse_entry(item), on_chain, ME.upper().replace("0X", "0x"))
    assert (grounds.result_text, grounds.acceptance) == (RESULT, 'Names "Paris".')
    structured, chain = setup(result={"answer": "Paris", "n": 12345678901234567890123})
    assert check_item(parse_entry(structured), chain, ME).result_text == '{"answer":"Paris","n":12345678901234567890123}'


def test_every_mismatch_is_refused() -> None:
    item, on_chain = setup()
    forged = {**item, "result": "Forged.", "evidenceHash": result_hash("Forged.")}
    assert refusal(forged, on_chain) == "EVIDENCE_MISMATCH"  # a consistent lie: its own hash
    assert refusal({**item, "evidenceHash": "0x" + "ab" * 32}, on_chain) == "EVIDENCE_MISMATCH"
    edited = {**item, "terms": {**item["terms"], "verificationCriteria": {"acceptance": "Anything passes."}}}
    assert refusal(edited, on_chain) == "TERMS_MISMATCH"
    assert refusal({**item, "taskHash": "0x" + "cd" * 32}, on_chain) == "TERMS_MISMATCH"
    assert refusal(item, replace(on_chain, task_hash="0x" + "cd" * 32)) == "TERMS_MISMATCH"
    other_chain, chain2 = setup(terms(chainId=8453))
    assert refusal(other_chain, chain2) == "TERMS_MISMATCH"
    someone_else, chain3 = setup(terms(verifierAddress="0x" + "4" * 40))
    assert refusal(someone_else, chain3) == "NOT_MY_TASK"
    manual, chain4 = setup(terms(verificationMode="manual", verifierAddress=None))
    assert refusal(manual, chain4) == "NOT_MY_TASK"
    assert refusal(item, replace(on_chain, verifier="0x" + "4" * 40)) == "NOT_MY_TASK"
    for status in (0, 1, 3, 4, 5, 6):
        assert refusal(item, replace(on_chain, status=status)) == "ATTEMPT_MISMATCH", status
    assert refusal(item, replace(on_chain, attempts=2)) == "ATTEMPT_MISMATCH"
    assert refusal(item, on_chain) is None


@pytest.mark.parametrize(
    "broken",
    [{"attempt": 4}, {"attempt": "1"}, {"chainId": 1.5}, {"taskHash": "0x12"}, {"terms": []}, {"escrow": "nope"}],
)
def test_a_malformed_item_is_refused_before_anything_is_read(broken: dict[str, Any]) -> None:
    item, _ = setup()
    with pytest.raises(Refusal) as refused:
        parse_entry({**item, **broken})
    assert refused.value.code == "QUEUE_ITEM_INVALID"


def test_the_brief_is_checked_against_the_digest() -> None:
    item, on_chain = setup()
    grounds = check_item(parse_entry(item), on_chain, ME)
    secret = b"\x07" * 32

    def code(status: int, reply: Any) -> str | None:
        try:
            open_checked_brief(grounds, status, reply, secret, ME)
        except Refusal as r:
            return r.code
        return None

    assert open_checked_brief(grounds, 200, {"private": False, "brief": BRIEF}, secret, ME) == BRIEF
    assert code(404, {"error": {}}) == "BRIEF_MISSING"
    assert code(403, None) == "BRIEF_NOT_READABLE" and code(401, None) == "BRIEF_NOT_READABLE"
    assert code(200, {"private": False, "brief": BRIEF + " "}) == "BRIEF_MISMATCH"
    assert code(200, {"private": False, "brief": ""}) == "BRIEF_MISMATCH"
    assert code(200, {"private": True, "ciphertext": "", "wrappedKey": ""}) == "BRIEF_MISMATCH"  # the terms say public
    assert code(200, None) == "BRIEF_INVALID" and code(302, {}) == "BRIEF_INVALID"


def test_a_private_brief_opens_only_in_its_context_with_its_committed_key() -> None:
    secret = b"\x07" * 32
    sealed = briefs.seal_brief(BRIEF)
    t = terms(private=True, instructionsDigest=sealed.digest)
    item, on_chain = setup(t)
    grounds = check_item(parse_entry(item), on_chain, ME)
    mine = briefs.KeyContext(31337, ESCROW, item["taskHash"], ME)

    def reply(key: bytes, context: briefs.KeyContext, ciphertext: bytes = sealed.ciphertext) -> dict[str, Any]:
        wrapped = briefs.wrap_key(key, briefs.encryption_public_key(secret), context)
        return {"private": True, "ciphertext": briefs.b64(ciphertext), "wrappedKey": briefs.b64(wrapped)}

    assert open_checked_brief(grounds, 200, reply(sealed.key, mine), secret, ME) == BRIEF
    for bad, expected in [
        (reply(sealed.key, replace(mine, task_hash="0x" + "ee" * 32)), "BRIEF_UNOPENABLE"),
        (reply(briefs.seal_brief("other").key, mine), "BRIEF_UNOPENABLE"),
        (reply(sealed.key, mine, briefs.seal_brief(BRIEF, sealed.key).ciphertext), "BRIEF_MISMATCH"),
        ({"private": True, "ciphertext": "!!", "wrappedKey": "AA=="}, "BRIEF_INVALID"),
        ({"private": True, "ciphertext": briefs.b64(sealed.ciphertext)}, "BRIEF_INVALID"),
    ]:
        with pytest.raises(Refusal) as refused:
            open_checked_brief(grounds, 200, bad, secret, ME)
        assert refused.value.code == expected


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("https://api.example", True), ("https://10.0.0.1:8443", True), ("http://127.0.0.1:8080", True),
        ("http://127.8.9.10", True), ("http://localhost", True), ("http://[::1]:80", True),
        ("http://api:8080", False), ("http://10.0.0.1", False), ("http://[::2]", False), ("http://localhost.evil.example", False),
        ("ftp://127.0.0.1", False), ("https://", False), ("http://", False), ("127.0.0.1:8080", False),
    ],
)  # fmt: skip
def test_the_api_url_is_https_unless_loopback(url: str, ok: bool) -> None:
    if ok:
        assert trusted_api_url(url) == url
    else:
        with pytest.raises(ValueError):
            trusted_api_url(url)


@settings(max_examples=50, deadline=None)
@given(status=st.integers(0, 9), attempts=st.integers(0, 3), word=st.binary(min_size=32, max_size=32))
def test_get_task_round_trips_and_refuses_other_lengths(status: int, attempts: int, word: bytes) -> None:
    from eth_abi.abi import encode

    values = ("0x" + "1" * 40, 99, status, attempts, 0, False, "0x" + "3" * 40, 0, ME, 0, 10**6, word, word[::-1])
    data = encode(["(address,uint64,uint8,uint8,uint8,bool,address,uint64,address,uint64,uint256,bytes32,bytes32)"], [values])
    decoded = decode_task(data)
    assert (decoded.status, decoded.attempts, decoded.verifier) == (status, attempts, ME)
    assert (decoded.task_hash, decoded.last_evidence_hash) == ("0x" + word.hex(), "0x" + word[::-1].hex())
    for wrong in (data[:-1], data + b"\x00" * 32, b""):
        with pytest.raises(ValueError):
            decode_task(wrong)
    assert get_task_data(7) == selector("getTask") + (7).to_bytes(32, "big")


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_change_to_the_terms_is_refused(data: st.DataObject) -> None:
    """Whatever field of the terms the API alters (or drops, or adds), they no longer hash to the chain's taskHash."""
    item, on_chain = setup()
    document = dict(item["terms"])
    key = data.draw(st.sampled_from([*sorted(document), "extra"]))
    action = data.draw(st.sampled_from(["drop", "replace"]))
    if action == "drop" and key in document:
        del document[key]
    else:
        replacement = data.draw(st.one_of(st.text(max_size=5), st.integers(), st.booleans(), st.none()))
        if document.get(key, object()) == replacement:
            return
        document[key] = replacement
    assert refusal({**item, "terms": document}, on_chain) in ("TERMS_MISMATCH", "QUEUE_ITEM_INVALID")
