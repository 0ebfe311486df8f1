"""The committed ABI/bytecode must be what the Solidity source compiles to today."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = ["AgentEscrow", "MockUSDC"]


def committed(name: str) -> dict[str, Any]:
    text = resources.files("schemas").joinpath("contracts", f"{name}.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


@pytest.fixture(scope="module")
def fresh_text(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    node = shutil.which("node")
    assert node, "node is required to recompile the contracts"
    out = tmp_path_factory.mktemp("artifacts")
    subprocess.run(
        [node, str(ROOT / "scripts" / "compile_contracts.js"), "--out", str(out)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=300,
    )
    return {name: (out / f"{name}.json").read_text() for name in CONTRACTS}


@pytest.fixture(scope="module")
def fresh(fresh_text: dict[str, str]) -> dict[str, dict[str, Any]]:
    return {name: json.loads(text) for name, text in fresh_text.items()}


@pytest.mark.parametrize("name", CONTRACTS)
def test_committed_artifact_matches_source(name: str, fresh: dict[str, dict[str, Any]]) -> None:
    old, new = committed(name), fresh[name]
    hint = "stale artifact: run `make compile` and commit schemas/contracts/"
    assert old["abi"] == new["abi"], hint
    assert old["bytecode"] == new["bytecode"], hint
    assert old["deployedBytecode"] == new["deployedBytecode"], hint
    assert old["compiler"] == new["compiler"], hint
    source = (ROOT / "contracts" / f"{name}.sol").read_bytes()
    assert old["sourceHash"] == "sha256:" + hashlib.sha256(source).hexdigest(), hint


@pytest.mark.parametrize("name", CONTRACTS)
def test_compile_is_deterministic(name: str, fresh_text: dict[str, str]) -> None:
    # Byte-identical files, so `make compile` on unchanged sources leaves git clean.
    committed_text = resources.files("schemas").joinpath("contracts", f"{name}.json").read_text()
    assert fresh_text[name] == committed_text


def test_artifact_shape() -> None:
    for name in CONTRACTS:
        art = committed(name)
        assert art["contractName"] == name
        assert art["compiler"]["version"].startswith("0.8.28")
        assert art["compiler"]["settings"]["optimizer"]["enabled"] is True
        assert art["bytecode"].startswith("0x") and len(art["bytecode"]) > 1000
    names = {item.get("name") for item in committed("AgentEscrow")["abi"]}
    for fn in (
        "createTask", "createTaskWithVerifier", "cancel", "acceptTask", "submitEvidence",
        "completeVerification", "raiseDispute", "resolveDispute", "claimTimeout",
        "collectEscalated", "setMarketplaceVerifier", "getTask", "taskCount", "isJudged",
        "marketplaceVerifier",
    ):  # fmt: skip
        assert fn in names, fn
