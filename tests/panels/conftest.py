"""Fixtures of the panel and ruling tests: a connection pool on the test's database and an
RPC client on its devnet."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from chain.eth_rpc import EthRpc
from escrowd.devnet import Devnet
from runtime.db import create_pool


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    p = await create_pool(database_url)
    try:
        yield p
    finally:
        await p.close()


@pytest.fixture
async def rpc(devnet: Devnet) -> AsyncIterator[EthRpc]:
    client = EthRpc([devnet.rpc_url], chain_id=devnet.chain_id)
    try:
        yield client
    finally:
        await client.close()
