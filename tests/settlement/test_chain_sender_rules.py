"""Pure parts of the chain sender: when a pending transaction is due (`chain.stuck.is_due`),
receipts checked as hostile input (`chain.receipts`), depth below the head, and the core's
rules (one calldata per nonce, one track round at a time, the gate's closure count)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from chain.fees import GWEI, FeePolicy, Fees, includable, over_cap, price
from chain.gate import SendGate
from chain.keys import SecretKey
from chain.receipts import BadReply, Receipt, depth
from chain.sender import DestinationRefused, SenderMetrics, SenderOptions, Slot, TxSender
from chain.stuck import is_due
from chain.txs import sign_eip1559
from chain.txstore import version_of

fees = st.builds(lambda cap, tip: Fees(cap + tip, tip), st.integers(0, 10**12), st.integers(0, 10**10))


@given(st.booleans(), st.booleans(), fees, st.integers(0, 10**13), st.floats(0, 100), st.booleans(),
       st.floats(0.01, 100))
def test_due_exactly_when_one_reason_holds(broadcast: bool, needs_bump: bool, f: Fees, base_fee: int,
                                           waited: float, stalled: bool, replace_after: float) -> None:
    due = is_due(broadcast=broadcast, needs_bump=needs_bump, fees=f, base_fee=base_fee, waited=waited,
                 stalled=stalled, replace_after=replace_after)
    reasons = [not broadcast, needs_bump, f.max_fee_per_gas < base_fee, stalled and waited >= replace_after]
    assert due == any(reasons)


def test_a_healthy_transaction_is_left_alone() -> None:
    assert not is_due(broadcast=True, needs_bump=False, fees=Fees(10, 1), base_fee=10, waited=29.0,
                      stalled=True, replace_after=30.0)
    # Waiting long is not enough while the account makes progress (others of ours are mined).
    assert not is_due(broadcast=True, needs_bump=False, fees=Fees(10, 1), base_fee=5, waited=3_600.0,
                      stalled=False, replace_after=30.0)


H = "0x" + "ab" * 32


def test_receipts_are_checked() -> None:
    good = {"transactionHash": H, "blockNumber": "0x10", "blockHash": "0x" + "cd" * 32, "status": "0x1"}
    assert Receipt.parse(good, H) == Receipt(16, "0x" + "cd" * 32, False)
    assert Receipt.parse({**good, "status": "0x0"}, H.upper().replace("0X", "0x")) == Receipt(16, "0x" + "cd" * 32, True)
    assert Receipt.parse({**good, "blockNumber": None}, H) is None  # pending
    for bad in ({**good, "transactionHash": "0x" + "ef" * 32}, {**good, "status": "0x2"},
                {**good, "blockNumber": "16"}, {**good, "blockHash": "0x12"}, [good], "receipt"):
        with pytest.raises(BadReply):
            Receipt.parse(bad, H)


@given(st.integers(0, 10**9), st.integers(0, 10**9))
def test_depth_counts_the_block_itself(head: int, block: int) -> None:
    d = depth(head, block)
    assert d >= 1 and (d == head - block + 1 if head >= block else d == 1)


# ---------------------------------------------------------------------------- the core's rules

KEY = "0x" + "59" * 32
TARGET = "0x" + "e5" * 20


def _sender() -> TxSender:
    # Only the pure parts are exercised: no pool or node is touched before the guards below.
    return TxSender(chain_id=31337, key=SecretKey.from_hex(KEY), rpc=None, pool=None,  # type: ignore[arg-type]
                    gate=SendGate(), options=SenderOptions(), metrics=METRICS)


# A registry of the test's own: these families are not the product's (the dashboard test reads
# every `escrowd_*` family of the process registry).
METRICS = SenderMetrics.create("escrowd_test_core_rules", "the test", CollectorRegistry())


@given(st.binary(max_size=512), st.binary(max_size=512), st.sampled_from(["call", "verdict", "batch"]))
def test_a_replacement_signs_the_calldata_first_signed(first: bytes, later: bytes, kind: str) -> None:
    """One calldata per nonce: whatever the slot carries since, a bump re-signs the first call."""
    sender = _sender()
    tx = sign_eip1559(SecretKey.from_hex(KEY), chain_id=31337, nonce=4, to=TARGET, data=first, gas_limit=90_000,
                      fees=Fees(2 * GWEI, GWEI))
    slot = Slot(nonce=4, kind=kind, versions=[version_of(tx, 0, kind)], to=TARGET, data=later)
    assert sender._call(slot) == (TARGET, first, 90_000)
    slot.kind = "filler"  # cancelled: a replacement is a 0-value self-transfer
    assert sender._call(slot)[:2] == (sender.address, b"")


async def test_two_track_rounds_at_once_are_refused() -> None:
    sender = _sender()
    sender._tracking = True  # a round in progress
    with pytest.raises(RuntimeError, match="two track rounds"):
        await sender._track(full=False)
    assert sender._tracking, "the refused call leaves the running round's flag alone"


def test_the_gate_counts_its_closures() -> None:
    gate = SendGate(open_=True)
    assert gate.closures == 0
    gate.close("a")
    gate.open()
    gate.close("b")
    assert gate.closures == 2 and not gate.is_open and gate.reason == "b"


async def test_a_destination_outside_the_policy_is_refused_before_signing() -> None:
    """Only the configured escrows (and the key itself, for fillers) are ever signed for."""
    sender = TxSender(chain_id=31337, key=SecretKey.from_hex(KEY), rpc=None, pool=None,  # type: ignore[arg-type]
                      gate=SendGate(), options=SenderOptions(allowed_to=frozenset({TARGET})), metrics=METRICS)
    fees = Fees(2 * GWEI, GWEI)
    assert (await sender._sign(0, TARGET, b"\x01", 90_000, fees)).nonce == 0
    assert (await sender._sign(1, sender.address, b"", 21_000, fees)).nonce == 1
    with pytest.raises(DestinationRefused):
        await sender._sign(2, "0x" + "66" * 20, b"\x01", 90_000, fees)


@given(st.integers(0, 10**12), st.integers(1, 10**12), st.integers(0, 10**6))
def test_the_fee_hold_is_on_exactly_when_no_send_under_the_cap_could_be_mined(base: int, cap: int, tip: int) -> None:
    policy = FeePolicy(fee_cap=cap, min_priority_fee=tip, max_priority_fee=max(tip, 1))
    gate = SendGate(open_=True)
    sender = TxSender(chain_id=31337, key=SecretKey.from_hex(KEY), rpc=None, pool=None,  # type: ignore[arg-type]
                      gate=gate, options=SenderOptions(policy=policy), metrics=METRICS)
    sender._check_fee_hold(base)
    assert (gate.fee_hold is not None) == (base + tip > cap)
    if gate.fee_hold is None:
        # Not held: a fresh price pays the base fee and the least tip, under the cap.
        fresh = price(base, tip, policy)
        assert includable(fresh, base) and fresh.max_fee_per_gas - base >= tip and fresh.max_fee_per_gas <= cap
    sender._check_fee_hold(0)  # fees fall back: the hold lifts by itself (unless no tip fits the cap)
    assert (gate.fee_hold is None) == (tip <= cap) == (not over_cap(0, policy))
