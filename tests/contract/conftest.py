"""Contract test fixtures: one anvil + deployment per module, snapshot/revert per test.

A fresh anvil per module keeps the chain short (anvil's automine slows as it grows); the
snapshot taken before each test and reverted after it gives every test the just-deployed
state without paying for a redeploy.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from escrowd.devnet import Devnet, deploy_devnet
from runtime.services.anvil import AnvilProcess


@pytest.fixture(scope="module")
def module_devnet() -> Iterator[Devnet]:
    """anvil with MockUSDC + AgentEscrow deployed and the actors funded."""
    with AnvilProcess() as anvil:
        yield deploy_devnet(anvil.rpc_url, ws_url=anvil.ws_url)


@pytest.fixture
def dn(module_devnet: Devnet) -> Iterator[Devnet]:
    """The module's devnet, returned to its freshly deployed state after the test."""
    snap = module_devnet.snapshot()
    try:
        yield module_devnet
    finally:
        module_devnet.revert(snap)
