"""`escrowd soak --api --rpc --devnet FILE` (a real process against anvil) takes nothing in the
file on trust: deep or malformed JSON, a missing field, a key that is not its actor's, a file
for another chain than the RPC's, or no contract at its escrow exit 2 naming the file and the
problem, before any transaction is signed. Before, the first three were tracebacks and the
last two drove traffic with the file's keys at whatever chain the URL reached."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from escrowd.devnet import Devnet

OTHER_KEY = "0x" + "ab" * 32


def _soak(devnet: Devnet, path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ESCROWD_") and k not in ("DATABASE_URL", "KAFKA_BOOTSTRAP")}
    return subprocess.run(
        [sys.executable, "-m", "escrowd.cli", "soak", "--minutes", "0.05", "--sample-seconds", "1",
         "--api", "http://127.0.0.1:9", "--rpc", devnet.rpc_url, "--devnet", str(path)],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip


def _edit(change: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], str]:
    def edited(description: dict[str, Any]) -> str:
        change(description)
        return json.dumps(description)

    return edited


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(description: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = description
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node[last] = value

    return change


CASES: dict[str, tuple[Callable[[dict[str, Any]], str], str]] = {
    "deep": (lambda d: "[" * 100_000 + "]" * 100_000, "JSON_TOO_DEEP"),
    "not-json": (lambda d: '{"chain_id": 31337,', "JSON_INVALID"),
    "missing-escrow": (_edit(lambda d: d["contracts"].pop("escrow")), "contracts.escrow"),
    "string-chain-id": (_edit(_set("chain_id", "31337")), "chain_id"),
    "foreign-key": (_edit(lambda d: d["actors"]["posters"][0].update(private_key=OTHER_KEY)), "is not the key of"),
    "other-chain": (_edit(_set("chain_id", 1)), "the RPC's chain is 31337"),
    "no-escrow-code": (_edit(_set("contracts.escrow", "0x" + "42" * 20)), "no contract at that address"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_devnet_file_that_lies_exits_2_before_any_traffic(devnet: Devnet, tmp_path: Path, case: str) -> None:
    make, expected = CASES[case]
    path = tmp_path / "devnet.json"
    path.write_text(make(devnet.describe()), encoding="utf-8")
    nonces = [devnet.rpc("eth_getTransactionCount", a.address, "latest") for a in devnet.posters[:1] + devnet.agents[:1]]
    result = _soak(devnet, path)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-3000:]
    assert f"--devnet {path}" in result.stderr and expected in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    after = [devnet.rpc("eth_getTransactionCount", a.address, "latest") for a in devnet.posters[:1] + devnet.agents[:1]]
    assert after == nonces  # nothing was sent
