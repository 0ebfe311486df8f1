"""The transaction sender on anvil and PostgreSQL, through the RPC fault proxy: a nonce of ours
is taken by another holder of the key, and the reconciliation that follows meets a provider
that answers the batched account counts with null. That reply is refused like any malformed
reply (the maintain loop retries) rather than ending the sender, and the reconciliation is
done once the provider answers properly: the request is not dropped by the failed try."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from chain.eth_rpc import EthRpc
from chain.fees import Fees
from chain.gate import SendGate
from chain.keys import SecretKey
from chain.sender import CallFailed, CallSender, SenderMetrics, SenderOptions
from chain.signers import KeystoreSigner
from chain.txs import UnsignedTx
from escrowd.devnet import Devnet
from runtime.db import create_pool
from tests.support.rpc_proxy import Faults, RpcFaultProxy

pytestmark = pytest.mark.timeout(300)

NULL_COUNTS = Faults(null_in_batches=frozenset({"eth_getTransactionCount"}))


async def _until(condition, runner: asyncio.Task[None], what: str, timeout: float = 120.0) -> None:  # type: ignore[no-untyped-def]
    """Poll `condition` (a coroutine function) while the sender keeps running."""
    async with asyncio.timeout(timeout):
        while not await condition():
            if runner.done():
                raise AssertionError(f"the sender stopped while waiting for {what}: {runner.exception()!r}")
            await asyncio.sleep(0.05)


async def test_a_malformed_count_during_a_reconciliation_is_retried_and_the_reconciliation_done(
    devnet: Devnet, database_url: str
) -> None:
    wallet = devnet.spare[2]
    key = SecretKey.from_hex(wallet.private_key)
    with RpcFaultProxy(devnet.rpc_url) as proxy:
        rpc = EthRpc([proxy.url], chain_id=devnet.chain_id)
        pool = await create_pool(database_url, max_size=4)
        sender = CallSender(
            chain_id=devnet.chain_id, key=key, rpc=rpc, pool=pool, gate=SendGate(open_=True),
            options=SenderOptions(recheck_interval=0.3, replace_after=3_600.0),
            metrics=SenderMetrics.create("test_sender_reconcile", "the test", CollectorRegistry()),
            confirmations=1, poll_interval=0.1,
        )  # fmt: skip
        runner = asyncio.create_task(sender.run())
        automine = True
        try:
            started = asyncio.create_task(sender.started.wait())
            await asyncio.wait({started, runner}, return_when=asyncio.FIRST_COMPLETED)
            assert not runner.done(), runner.exception()
            await asyncio.to_thread(devnet.rpc, "evm_setAutomine", False)
            automine = False
            nonce = await sender.send(devnet.spare[1].address, b"", 21_000)

            async def broadcast() -> bool:
                slot = sender.slots[nonce]
                return not slot.in_flight and slot.last_broadcast is not None

            await _until(broadcast, runner, "the broadcast")
            # Another holder of the key replaces our transaction in the pool, at twice its fees.
            ours = sender.slots[nonce].latest.fees
            other = await KeystoreSigner(key).sign_transaction(UnsignedTx(
                chain_id=devnet.chain_id, nonce=nonce, to=wallet.address, data=b"", gas_limit=21_000,
                fees=Fees(ours.max_fee_per_gas * 2, ours.max_priority_fee_per_gas * 2),
            ))  # fmt: skip
            await asyncio.to_thread(devnet.rpc, "eth_sendRawTransaction", other.raw_hex)
            proxy.set_faults(NULL_COUNTS)
            waiting = asyncio.create_task(sender.confirmed(nonce))
            with capture_logs() as logs:
                await asyncio.to_thread(devnet.rpc, "evm_mine")

                async def refused() -> bool:
                    return proxy.stats.injected["null_in_batch"] >= 4  # two tries, two counts each

                await _until(refused, runner, "the reconciliation's counts answered null")
                assert waiting.done() and isinstance(waiting.exception(), CallFailed)  # the nonce was lost
                proxy.set_faults(Faults())  # the provider answers properly again

                async def reconciled() -> bool:
                    return any(e["event"] == "nonces_reconciled" and e.get("trigger") == "nonce_lost" for e in logs)

                await _until(reconciled, runner, "the reconciliation after the lost nonce")
            await asyncio.to_thread(devnet.rpc, "evm_setAutomine", True)
            automine = True
            later = await sender.send(devnet.spare[1].address, b"", 21_000)
            assert later == nonce + 1
            await asyncio.wait_for(sender.confirmed(later), 60)
            assert not runner.done()
        finally:
            if not automine:
                await asyncio.to_thread(devnet.rpc, "evm_setAutomine", True)
            runner.cancel()
            with contextlib.suppress(BaseException):
                await runner
            await pool.close()
            await rpc.close()
