"""Token handling against hostile and non-standard ERC-20s: a token that returns no bool,
one that returns false (the payout is credited, see `withdraw`), a fee-on-transfer token,
and one that re-enters the escrow. Blacklisting tokens: tests/contract/test_escrow_edges.py.

The test token is compiled here from inline Solidity (it must never ship in `schemas/`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from escrowd.devnet import USDC, Devnet, deploy_contract, load_artifact, text_hash
from tests.contract.test_escrow_rules import refused

ROOT = Path(__file__).resolve().parents[2]

ODD_TOKEN = r"""
// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

/// transfer/transferFrom declare no return value (like USDT). Modes: 0 plain, 1 transfer
/// returns false, 2 transferFrom delivers one unit less, 3 transfer re-enters `target`.
contract OddToken {
    mapping(address => uint256) public balanceOf;
    mapping(address => mapping(address => uint256)) public allowance;
    uint8 public mode;
    address public target;
    bytes public payload;
    bool public reentryOk;
    bytes public reentryResult;

    function setMode(uint8 m) external { mode = m; }
    function arm(address t, bytes calldata p) external { target = t; payload = p; mode = 3; }
    function mint(address to, uint256 a) external { balanceOf[to] += a; }
    function approve(address s, uint256 a) external returns (bool) {
        allowance[msg.sender][s] = a;
        return true;
    }
    function transfer(address to, uint256 a) external {
        if (mode == 1) { assembly { mstore(0, 0) return(0, 32) } }
        if (mode == 3 && target != address(0)) {
            address t = target;
            target = address(0);
            (reentryOk, reentryResult) = t.call(payload);
        }
        _move(msg.sender, to, a);
    }
    function transferFrom(address f, address to, uint256 a) external {
        require(allowance[f][msg.sender] >= a, "allowance");
        allowance[f][msg.sender] -= a;
        if (mode == 2) {
            balanceOf[f] -= 1; // burnt in transit
            a -= 1;
        }
        _move(f, to, a);
    }
    function _move(address f, address to, uint256 a) private {
        require(balanceOf[f] >= a, "balance");
        balanceOf[f] -= a;
        balanceOf[to] += a;
    }
}
"""

_COMPILE_JS = r"""
const solc = require("solc");
let src = "";
process.stdin.on("data", (d) => (src += d)).on("end", () => {
  const input = {
    language: "Solidity",
    sources: { "Odd.sol": { content: src } },
    settings: {
      optimizer: { enabled: true, runs: 200 },
      evmVersion: "cancun",
      outputSelection: { "*": { "*": ["abi", "evm.bytecode.object"] } },
    },
  };
  const out = JSON.parse(solc.compile(JSON.stringify(input)));
  const errors = (out.errors || []).filter((e) => e.severity === "error");
  if (errors.length) { console.error(JSON.stringify(errors)); process.exit(1); }
  process.stdout.write(JSON.stringify(out.contracts["Odd.sol"]));
});
"""


@pytest.fixture(scope="module")
def odd_token_artifact() -> dict[str, Any]:
    node = shutil.which("node")
    assert node, "node is required to compile the test token"
    done = subprocess.run(
        [node, "-e", _COMPILE_JS],
        input=ODD_TOKEN.encode(),
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=300,
    )
    artifact: dict[str, Any] = json.loads(done.stdout)["OddToken"]
    return artifact


@pytest.fixture
def odd(dn: Devnet, odd_token_artifact: dict[str, Any]) -> Devnet:
    """The same actors with a fresh escrow over OddToken (poster0 funded and approved)."""
    token, _ = deploy_contract(
        dn.rpc, dn.owner.address, "0x" + odd_token_artifact["evm"]["bytecode"]["object"], []
    )
    escrow_art = load_artifact("AgentEscrow")
    escrow, block = deploy_contract(
        dn.rpc,
        dn.owner.address,
        escrow_art["bytecode"],
        escrow_art["abi"],
        [token, dn.marketplace_verifier.address, dn.arbiter.address, dn.fee_recipient.address],
    )
    odd_dn = replace(dn, token_address=token, escrow_address=escrow, deploy_block=block)
    odd_dn.mint(dn.posters[0], 100 * USDC)
    odd_dn.approve_escrow(dn.posters[0])
    return odd_dn


def test_token_without_return_value_works_end_to_end(odd: Devnet) -> None:
    p, a = odd.posters[0], odd.agents[0]
    tid = odd.post_task(p, reward=10 * USDC)
    assert odd.balance_of(odd.escrow_address) == 10 * USDC
    odd.accept_task(tid, sender=a)
    ev = text_hash("result")
    odd.submit_evidence(tid, ev, sender=a)
    odd.complete_verification(tid, 1, ev, True, 100, sender=odd.marketplace_verifier)
    assert odd.balance_of(a) == 9 * USDC
    assert odd.balance_of(odd.fee_recipient) == USDC
    assert odd.balance_of(odd.escrow_address) == 0


def _set_mode(odd: Devnet, mode: int) -> None:
    odd.send(odd.owner, odd.token_address, "0x" + _selector("setMode(uint8)") + f"{mode:064x}")


def _selector(signature: str) -> str:
    return text_hash(signature)[:4].hex()


def test_token_returning_false_credits_the_payout_until_it_can_be_withdrawn(odd: Devnet) -> None:
    p = odd.posters[0]
    tid = odd.post_task(p, reward=10 * USDC)
    _set_mode(odd, 1)
    before = odd.balance_of(p)
    receipt = odd.cancel(tid, sender=p)
    assert odd.get_task(tid).status == 8  # the refused refund does not block the cancel
    assert odd.event(receipt, "PaymentDeferred")["amount"] == 10 * USDC
    assert odd.balance_of(p) == before
    assert odd.owed(p) == 10 * USDC
    with refused("TokenTransferFailed"):
        odd.withdraw(p, sender=p)  # still refused: the credit stays
    assert odd.owed(p) == 10 * USDC
    _set_mode(odd, 0)
    odd.withdraw(p, sender=p)
    assert odd.balance_of(p) == before + 10 * USDC
    assert odd.owed(p) == 0 == odd.balance_of(odd.escrow_address)


def test_fee_on_transfer_token_cannot_underfund_a_task(odd: Devnet) -> None:
    _set_mode(odd, 2)
    with refused("TokenTransferFailed"):
        odd.post_task(odd.posters[0], reward=10 * USDC)
    assert odd.task_count() == 0


def test_reentrant_token_is_stopped_by_the_guard(odd: Devnet) -> None:
    p = odd.posters[0]
    tid = odd.post_task(p, reward=10 * USDC)
    # During cancel's refund transfer the token calls cancel(tid) again.
    reenter = "0x" + _selector("cancel(uint256)") + f"{tid:064x}"
    arm = (
        "0x"
        + _selector("arm(address,bytes)")
        + f"{int(odd.escrow_address, 16):064x}"
        + f"{64:064x}"
        + f"{36:064x}"
        + reenter[2:].ljust(128, "0")
    )
    odd.send(odd.owner, odd.token_address, arm)
    before = odd.balance_of(p)
    odd.cancel(tid, sender=p)
    assert odd.balance_of(p) == before + 10 * USDC  # refunded exactly once
    assert odd.balance_of(odd.escrow_address) == 0
    reentry_ok = _read_word(odd, "reentryOk()")
    reentry_result = _read_bytes(odd, "reentryResult()")
    assert reentry_ok == 0
    assert reentry_result == text_hash("Reentrancy()")[:4]


def _eth_call(odd: Devnet, signature: str) -> bytes:
    out = odd.rpc(
        "eth_call", {"to": odd.token_address, "data": "0x" + _selector(signature)}, "latest"
    )
    return bytes.fromhex(str(out)[2:])


def _read_word(odd: Devnet, signature: str) -> int:
    return int.from_bytes(_eth_call(odd, signature)[:32], "big")


def _read_bytes(odd: Devnet, signature: str) -> bytes:
    raw = _eth_call(odd, signature)
    length = int.from_bytes(raw[32:64], "big")
    return raw[64 : 64 + length]
