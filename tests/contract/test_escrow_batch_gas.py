"""No item can sink `completeVerificationBatch` (issue 26, item 4), on a real anvil.

The hostile token is `GasBurnToken` (contracts/mocks/): a transfer to a marked recipient burns
all the gas it is given, as a token with a transfer hook does when the recipient is a contract
wallet that spends without end. Before the stipend the escrow forwarded all remaining gas to
the token: one such item ran the batch out of gas at the relayer's limit and reverted every
verdict in it.

- each push gets at most `TRANSFER_GAS`; a recipient that burns it has its payout credited
  (`PaymentDeferred`, `owed`) and the batch goes on;
- an item started with less than `BATCH_ITEM_GAS` left is refused with `GasTooLow`, with the
  items after it: the batch never runs out of gas, whatever its limit;
- a push never fails for the caller's lack of gas: with too little gas for the whole stipend
  the call reverts (`GasTooLow`) instead of crediting the payout.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from eth_abi.abi import decode as abi_decode
from hexbytes import HexBytes
from web3.types import TxReceipt

from escrowd.devnet import Actor, Devnet, split_fee, text_hash
from relayer.settlement.sender import SenderOptions
from tests.contract.test_escrow_batch import Item, _data, simulate, submitted
from tests.contract.test_escrow_rules import REWARD, Cast, c, refused  # noqa: F401 -- fixture c
from tests.support.hostile_tokens import compile_mock_tokens, escrow_over


@pytest.fixture(scope="module")
def mock_tokens() -> dict[str, Any]:
    return compile_mock_tokens()


@pytest.fixture
def burn(c: Cast, mock_tokens: dict[str, Any]) -> Cast:  # noqa: F811
    """The cast over an escrow whose token lets a marked recipient burn the gas."""
    return replace(c, dn=escrow_over(c.dn, mock_tokens["GasBurnToken"]))


def _burner(dn: Devnet, who: Actor, burns: bool = True) -> None:
    selector = text_hash("setBurner(address,bool)")[:4].hex()
    dn.send(
        dn.owner,
        dn.token_address,
        "0x" + selector + f"{int(who.address, 16):064x}" + f"{int(burns):064x}",
    )


def _constant(dn: Devnet, name: str) -> int:
    (value,) = dn.call(dn.escrow_address, name)
    return int(value)


def _send(dn: Devnet, sender: Actor, data: str, gas: int) -> TxReceipt:
    """Send with this gas limit; the receipt whatever its status."""
    tx_hash = dn.rpc(
        "eth_sendTransaction",
        {"from": sender.address, "to": dn.escrow_address, "data": data, "gas": hex(gas)},
    )
    return dn.wait_for_receipt(tx_hash)


def _relayer_batch_gas(count: int) -> int:
    """The gas limit the relayer gives a batch of `count` items by default."""
    options = SenderOptions(policy=None)  # type: ignore[arg-type]
    return options.batch_gas_base + options.batch_gas_per_item * count


def simulate_with_gas(
    dn: Devnet, sender: Actor, items: list[Item], gas: int
) -> list[tuple[str, tuple[Any, ...]] | None]:
    """Per item: None when it would settle with this gas limit, else the refusal."""
    call = {
        "from": sender.address,
        "to": dn.escrow_address,
        "data": _data(dn, items),
        "gas": hex(gas),
    }
    (refusals,) = abi_decode(["bytes[]"], HexBytes(dn.rpc("eth_call", call, "latest")))
    return [dn._codec.decode_error(bytes(r)) if r else None for r in refusals]


def _settled(dn: Devnet, receipt: TxReceipt) -> list[int]:
    return [int(e["taskId"]) for e in dn.events(receipt) if e.name == "VerificationCompleted"]


def test_a_recipient_that_burns_gas_cannot_revert_the_batch(burn: Cast) -> None:
    dn = burn.dn
    good = submitted(burn, 5)
    hostile = submitted(replace(burn, A=burn.A2), 1)[0]
    _burner(dn, burn.A2)
    items: list[Item] = [good[0], hostile, *good[1:]]
    before = dn.balances_of([burn.A, burn.FEE])
    gas = _relayer_batch_gas(len(items))
    refusals = simulate_with_gas(dn, burn.MV, items, gas)
    assert refusals[:2] == [None, None]
    assert all(r in (None, ("GasTooLow", ())) for r in refusals)
    receipt = _send(dn, burn.MV, _data(dn, items), gas)
    assert int(receipt["status"]) == 1, "one recipient reverted the whole batch"
    settled = _settled(dn, receipt)
    assert settled == [tid for (tid, *_), r in zip(items, refusals, strict=True) if r is None]
    assert hostile[0] in settled
    agent_amount, fee = split_fee(REWARD)
    # The burning recipient's share is credited, everything else paid as usual.
    deferred = [
        (str(e["account"]).lower(), int(e["amount"]))
        for e in dn.events(receipt)
        if e.name == "PaymentDeferred"
    ]
    assert deferred == [(burn.A2.address.lower(), agent_amount)]
    assert dn.owed(burn.A2) == agent_amount
    paid = len(settled) - 1
    assert dn.balances_of([burn.A, burn.FEE]) == [
        before[0] + paid * agent_amount,
        before[1] + len(settled) * fee,
    ]
    # The refused items are untouched and settle in the next batch.
    rest = [item for item, r in zip(items, refusals, strict=True) if r is not None]
    if rest:
        again = _send(dn, burn.MV, _data(dn, rest), _relayer_batch_gas(len(rest)))
        assert _settled(dn, again) == [tid for tid, *_ in rest]


@pytest.mark.parametrize("burning", [False, True])
def test_items_are_refused_not_the_batch_when_gas_runs_low(burn: Cast, burning: bool) -> None:
    dn = burn.dn
    items = submitted(burn, 8)
    if burning:
        _burner(dn, burn.A)  # every item burns its stipend: the costliest items there are
    item_gas = _constant(dn, "BATCH_ITEM_GAS")
    gas = 60_000 + item_gas + 2 * 60_000  # room for the first few items only
    refusals = simulate_with_gas(dn, burn.MV, items, gas)
    receipt = _send(dn, burn.MV, _data(dn, items), gas)
    assert int(receipt["status"]) == 1, "the batch ran out of gas"
    settled = _settled(dn, receipt)
    assert 1 <= len(settled) < len(items)
    assert settled == [tid for tid, *_ in items[: len(settled)]]
    assert refusals == [None] * len(settled) + [("GasTooLow", ())] * (len(items) - len(settled))
    # The rest changed nothing: each is still open to a verdict.
    left = items[len(settled) :]
    assert simulate(dn, burn.MV, left) == [None] * len(left)
    assert not any(dn.is_judged(tid, 1) for tid, *_ in left)


def test_a_single_verdict_to_a_burning_recipient_settles_and_credits_it(burn: Cast) -> None:
    dn = burn.dn
    (item,) = submitted(burn, 1)
    _burner(dn, burn.A)
    gas_limit = SenderOptions(policy=None).gas_limit  # type: ignore[arg-type]
    data = dn._codec.encode_call("completeVerification", list(item))
    receipt = _send(dn, burn.MV, data, gas_limit)
    assert int(receipt["status"]) == 1
    agent_amount, _ = split_fee(REWARD)
    assert dn.owed(burn.A) == agent_amount
    assert dn.is_judged(item[0], 1)


def test_a_push_short_of_gas_reverts_instead_of_crediting(burn: Cast) -> None:
    """Too little gas for the whole stipend is the caller's fault: the call reverts, and the
    payout is not credited as if the recipient had refused it."""
    dn = burn.dn
    (item,) = submitted(burn, 1)
    data = dn._codec.encode_call("completeVerification", list(item))
    with refused("GasTooLow"):
        _send_or_raise(dn, burn.MV, data, 90_000)
    assert not dn.is_judged(item[0], 1)
    assert dn.owed(burn.A) == 0


def _send_or_raise(dn: Devnet, sender: Actor, data: str, gas: int) -> None:
    tx = {"from": sender.address, "to": dn.escrow_address, "data": data, "gas": hex(gas)}
    tx_hash = dn.rpc("eth_sendTransaction", tx)
    if int(dn.wait_for_receipt(tx_hash)["status"]) != 1:
        raise dn._revert_of(tx_hash)
