"""A `CallSender` running on the devnet and PostgreSQL for a test, with the steps its tests share."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from chain.eth_rpc import EthRpc
from chain.gate import SendGate
from chain.keys import SecretKey
from chain.sender import CallSender, SenderMetrics, SenderOptions
from escrowd.devnet import Devnet
from runtime.db import create_pool


@dataclass
class RunningSender:
    """The sender, the task running it, and whether the test turned anvil's automine off."""

    sender: CallSender
    runner: asyncio.Task[None]
    devnet: Devnet
    automine: bool = True

    async def until(self, condition: Callable[[], Awaitable[bool]], what: str, timeout: float = 120.0) -> None:
        """Poll `condition` while the sender keeps running (it must not stop meanwhile)."""
        async with asyncio.timeout(timeout):
            while not await condition():
                if self.runner.done():
                    raise AssertionError(f"the sender stopped while waiting for {what}: {self.runner.exception()!r}")
                await asyncio.sleep(0.05)

    async def set_automine(self, on: bool) -> None:
        """Anvil's automine (put back on when the sender's context ends)."""
        await asyncio.to_thread(self.devnet.rpc, "evm_setAutomine", on)
        self.automine = on

    async def send_unmined(self, to: str) -> int:
        """Automine off, a plain transfer sent and broadcast: its nonce."""
        await self.set_automine(False)
        nonce = await self.sender.send(to, b"", 21_000)

        async def broadcast() -> bool:
            slot = self.sender.slots[nonce]
            return not slot.in_flight and slot.last_broadcast is not None

        await self.until(broadcast, "the broadcast")
        return nonce


@contextlib.asynccontextmanager
async def running_call_sender(
    devnet: Devnet, database_url: str, key: SecretKey, *, rpc_url: str, name: str, recheck_interval: float
) -> AsyncIterator[RunningSender]:
    """A started `CallSender` for `key` through `rpc_url` (stopped, and automine back on, at the end)."""
    rpc = EthRpc([rpc_url], chain_id=devnet.chain_id)
    pool = await create_pool(database_url, max_size=4)
    sender = CallSender(
        chain_id=devnet.chain_id, key=key, rpc=rpc, pool=pool, gate=SendGate(open_=True),
        options=SenderOptions(recheck_interval=recheck_interval, replace_after=3_600.0),
        metrics=SenderMetrics.create(name, "the test", CollectorRegistry()),
        confirmations=1, poll_interval=0.1,
    )  # fmt: skip
    running = RunningSender(sender, asyncio.create_task(sender.run()), devnet)
    try:
        started = asyncio.create_task(sender.started.wait())
        await asyncio.wait({started, running.runner}, return_when=asyncio.FIRST_COMPLETED)
        assert not running.runner.done(), running.runner.exception()
        yield running
        assert not running.runner.done(), "the sender stopped"
    finally:
        if not running.automine:
            await asyncio.to_thread(devnet.rpc, "evm_setAutomine", True)
        running.runner.cancel()
        with contextlib.suppress(BaseException):
            await running.runner
        await pool.close()
        await rpc.close()
