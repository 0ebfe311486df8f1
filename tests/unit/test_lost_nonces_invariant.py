"""The run's invariant that a nonce judged lost was taken by a transaction not ours (pure)."""

from __future__ import annotations

from escrowd.invariants import LostNonce, lost_nonces_check

OURS = frozenset({"0x" + "aa" * 32, "0x" + "bb" * 32})


def test_a_nonce_taken_by_a_foreign_transaction_holds() -> None:
    """The arbiter's own `resolveDispute` from outside the relay took the nonce: correct."""
    ok, detail = lost_nonces_check([LostNonce("0xarb", 12, OURS, "0x" + "cc" * 32)])
    assert ok and detail == ""


def test_our_own_mined_version_judged_lost_fails() -> None:
    """Any of our versions mined at the nonce (upper-case from the node too) means the
    sender called its own transaction lost: the failure the check exists for."""
    ok, detail = lost_nonces_check([
        LostNonce("0xarb", 12, OURS, "0x" + "cc" * 32),
        LostNonce("0xarb", 13, OURS, "0x" + "BB" * 32),
    ])
    assert not ok
    assert "nonce 13" in detail and "own" in detail and "nonce 12" not in detail


def test_a_lost_nonce_nothing_was_mined_at_fails() -> None:
    """The chain has no transaction at the nonce: it was not taken, so not lost."""
    ok, detail = lost_nonces_check([LostNonce("0xarb", 7, OURS, None)])
    assert not ok and "no transaction mined" in detail


def test_no_lost_nonces_holds() -> None:
    assert lost_nonces_check([]) == (True, "")
