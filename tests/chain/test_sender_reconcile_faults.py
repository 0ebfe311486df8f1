"""The transaction sender on anvil and PostgreSQL, through the RPC fault proxy: a nonce of ours
is taken by another holder of the key, and the reconciliation that follows meets a provider
that answers the batched account counts with null. That reply is refused like any malformed
reply (the maintain loop retries) rather than ending the sender, and the reconciliation is
done once the provider answers properly: the request is not dropped by the failed try."""

from __future__ import annotations

import asyncio

import pytest
from structlog.testing import capture_logs

from chain.fees import Fees
from chain.keys import SecretKey
from chain.sender import CallFailed
from chain.signers import KeystoreSigner
from chain.txs import UnsignedTx
from escrowd.devnet import Devnet
from tests.support.call_sender import running_call_sender
from tests.support.rpc_proxy import Faults, RpcFaultProxy

pytestmark = pytest.mark.timeout(300)

NULL_COUNTS = Faults(null_in_batches=frozenset({"eth_getTransactionCount"}))


async def test_a_malformed_count_during_a_reconciliation_is_retried_and_the_reconciliation_done(
    devnet: Devnet, database_url: str
) -> None:
    wallet = devnet.spare[2]
    key = SecretKey.from_hex(wallet.private_key)
    with RpcFaultProxy(devnet.rpc_url) as proxy:
        async with running_call_sender(
            devnet, database_url, key, rpc_url=proxy.url, name="test_sender_reconcile", recheck_interval=0.3
        ) as running:
            sender = running.sender
            nonce = await running.send_unmined(devnet.spare[1].address)
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

                await running.until(refused, "the reconciliation's counts answered null")
                assert waiting.done() and isinstance(waiting.exception(), CallFailed)  # the nonce was lost
                proxy.set_faults(Faults())  # the provider answers properly again

                async def reconciled() -> bool:
                    return any(e["event"] == "nonces_reconciled" and e.get("trigger") == "nonce_lost" for e in logs)

                await running.until(reconciled, "the reconciliation after the lost nonce")
            await running.set_automine(True)
            later = await sender.send(devnet.spare[1].address, b"", 21_000)
            assert later == nonce + 1
            await asyncio.wait_for(sender.confirmed(later), 60)
