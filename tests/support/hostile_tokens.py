"""The test-only hostile tokens of `contracts/mocks/` (never compiled into `schemas/`):
compile them with the pinned npm solc and deploy an escrow over one of them."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

from escrowd.devnet import USDC, Actor, Devnet, deploy_contract, load_artifact, text_hash

ROOT = Path(__file__).resolve().parents[2]
MOCKS = (
    "contracts/mocks/BlacklistToken.sol",
    "contracts/mocks/FeeOnTransferToken.sol",
    "contracts/mocks/GasBurnToken.sol",
)

_COMPILE_JS = r"""
const fs = require("fs");
const solc = require("solc");
const files = process.argv.slice(1);
const sources = {};
for (const f of files) sources[f] = { content: fs.readFileSync(f, "utf8") };
const input = {
  language: "Solidity",
  sources,
  settings: {
    optimizer: { enabled: true, runs: 200 },
    evmVersion: "cancun",
    outputSelection: { "*": { "*": ["abi", "evm.bytecode.object"] } },
  },
};
const out = JSON.parse(solc.compile(JSON.stringify(input)));
const errors = (out.errors || []).filter((e) => e.severity === "error");
if (errors.length) { console.error(JSON.stringify(errors)); process.exit(1); }
const flat = {};
for (const f of files) for (const [name, c] of Object.entries(out.contracts[f])) flat[name] = c;
process.stdout.write(JSON.stringify(flat));
"""


def compile_mock_tokens() -> dict[str, Any]:
    """Contract name -> solc output (abi, evm.bytecode.object)."""
    node = shutil.which("node")
    assert node, "node is required to compile the test tokens"
    done = subprocess.run(
        [node, "-e", _COMPILE_JS, *MOCKS], cwd=ROOT, check=True, capture_output=True, timeout=300
    )
    compiled: dict[str, Any] = json.loads(done.stdout)
    return compiled


def escrow_over(dn: Devnet, artifact: dict[str, Any]) -> Devnet:
    """The same actors with a fresh escrow over the given token; posters funded and approved."""
    token, _ = deploy_contract(
        dn.rpc, dn.owner.address, "0x" + artifact["evm"]["bytecode"]["object"], artifact["abi"]
    )
    escrow_art = load_artifact("AgentEscrow")
    escrow, block = deploy_contract(
        dn.rpc,
        dn.owner.address,
        escrow_art["bytecode"],
        escrow_art["abi"],
        [token, dn.marketplace_verifier.address, dn.arbiter.address, dn.fee_recipient.address],
    )
    other = replace(dn, token_address=token, escrow_address=escrow, deploy_block=block)
    for poster in dn.posters[:2]:
        other.mint(poster, 1_000 * USDC)
        other.approve_escrow(poster)
    return other


def block(dn: Devnet, who: Actor | str, blocked: bool = True) -> None:
    """BlacklistToken.setBlocked(who, blocked)."""
    address = who if isinstance(who, str) else who.address
    selector = text_hash("setBlocked(address,bool)")[:4].hex()
    data = "0x" + selector + f"{int(address, 16):064x}" + f"{int(blocked):064x}"
    dn.send(dn.owner, dn.token_address, data)
