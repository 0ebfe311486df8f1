"""The escrow's compiled artifacts (ABI and bytecode), committed under `schemas/contracts/`.

The Python side never needs a compiler: `scripts/compile_contracts.js` writes these files
and a test proves they match the Solidity source.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
from typing import Any


@functools.cache
def artifact(name: str) -> dict[str, Any]:
    """The compiled artifact `schemas/contracts/<name>.json`."""
    text = importlib.resources.files("schemas").joinpath("contracts", f"{name}.json").read_text("utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def escrow_abi() -> list[dict[str, Any]]:
    """ABI of the AgentEscrow contract."""
    abi: list[dict[str, Any]] = artifact("AgentEscrow")["abi"]
    return abi


def token_abi() -> list[dict[str, Any]]:
    """ABI of the mock 6-decimal token."""
    abi: list[dict[str, Any]] = artifact("MockUSDC")["abi"]
    return abi


def escrow_events() -> list[dict[str, Any]]:
    """Event entries of the escrow ABI, in ABI order."""
    return [entry for entry in escrow_abi() if entry.get("type") == "event"]
