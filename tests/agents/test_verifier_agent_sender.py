"""The hosted verifier agent's send path on anvil and PostgreSQL: its verdicts go out through
the chain toolkit's transaction sender (its own nonce row), so a first transaction priced
under the base fee is replaced with a fee bump, and the verdicts sent after it are confirmed
rather than stuck behind it."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from pydantic import SecretStr

from chain.signers import SignerError, SignerSpec
from escrowd.devnet import Devnet
from runtime.services.localsigner import RemoteSignerProcess
from tests.agents.conftest import ModelEndpoint
from verification.agents.verifier_agent import VerifierAgent, VerifierAgentSettings, open_wallet

pytestmark = pytest.mark.timeout(300)


def _delivered(devnet: Devnet, count: int) -> list[dict[str, object]]:
    """Tasks naming the verifier agent, accepted, with evidence: queue items as the API gives them."""
    verifier = devnet.verifier_agents[0]
    items = []
    for i in range(count):
        task_id = devnet.post_task(devnet.posters[0], verifier=verifier)
        agent = devnet.agents[i % len(devnet.agents)]
        devnet.accept_task(task_id, sender=agent)
        evidence = bytes([0x40 + i]) * 32
        devnet.submit_evidence(task_id, evidence, sender=agent)
        items.append({"chainId": devnet.chain_id, "escrow": devnet.escrow_address, "taskId": task_id,
                      "attempt": 1, "evidenceHash": "0x" + evidence.hex()})
    return items


async def test_an_underpriced_first_verdict_is_replaced_and_later_verdicts_still_land(
    devnet: Devnet, database_url: str, model_endpoint: ModelEndpoint
) -> None:
    items = await asyncio.to_thread(_delivered, devnet, 3)
    verifier = devnet.verifier_agents[0]
    settings = VerifierAgentSettings(
        api_url="http://127.0.0.1:9", rpc_url=devnet.rpc_url, chain_id=devnet.chain_id,
        escrow_address=devnet.escrow_address, wallet_key=SecretStr(verifier.private_key),
        database_url=database_url, replace_after_seconds=3_600.0,  # only the base fee makes it stuck here
    )  # fmt: skip
    agent = VerifierAgent(settings, model_endpoint.client())
    count_before = int(await asyncio.to_thread(devnet.rpc, "eth_getTransactionCount", verifier.address, "latest"), 16)
    try:
        sender = await agent.start_sender()
        await asyncio.to_thread(devnet.rpc, "evm_setAutomine", False)
        try:
            first = asyncio.create_task(agent.complete_on_chain(items[0], True, 100))
            for _ in range(600):
                if sender.slots and all(not s.in_flight and s.last_broadcast for s in sender.slots.values()):
                    break
                await asyncio.sleep(0.05)
            (slot,) = sender.slots.values()
            underpriced = slot.versions[0]
            pool = (await asyncio.to_thread(devnet.rpc, "txpool_content"))["pending"]
            assert underpriced.tx_hash in {tx["hash"] for txs in pool.values() for tx in txs.values()}
            # The base fee jumps above what the first verdict offers: it cannot enter a block.
            await asyncio.to_thread(
                devnet.rpc, "anvil_setNextBlockBaseFeePerGas", hex(underpriced.fees.max_fee_per_gas * 4))
            await asyncio.to_thread(devnet.rpc, "evm_mine")
            assert await asyncio.to_thread(devnet.rpc, "eth_getTransactionReceipt", underpriced.tx_hash) is None
            later = [asyncio.create_task(agent.complete_on_chain(item, i % 2 == 0, 100 if i % 2 == 0 else 0))
                     for i, item in enumerate(items[1:])]
        finally:
            await asyncio.to_thread(devnet.rpc, "evm_setAutomine", True)
        hashes = await asyncio.gather(first, *later)
        async with asyncpg.create_pool(database_url, min_size=1, max_size=1) as db:
            versions = await db.fetch(
                "SELECT nonce, version, tx_hash, max_fee_per_gas FROM settlement_tx_versions WHERE sender = $1"
                " ORDER BY nonce, version", verifier.address.lower())
            states = await db.fetch("SELECT nonce, kind, state FROM settlement_transactions WHERE sender = $1"
                                    " ORDER BY nonce", verifier.address.lower())
    finally:
        await agent.close()
    # The first nonce was replaced (same nonce, higher fee, at least the new base fee) and that
    # replacement is what landed; the later verdicts, at the next nonces, landed too.
    at_first = [v for v in versions if v["nonce"] == slot.nonce]
    assert len(at_first) >= 2 and int(at_first[-1]["max_fee_per_gas"]) > underpriced.fees.max_fee_per_gas
    assert hashes[0] in {v["tx_hash"] for v in at_first[1:]}
    assert await asyncio.to_thread(devnet.rpc, "eth_getTransactionReceipt", underpriced.tx_hash) is None
    assert [(s["kind"], s["state"]) for s in states] == [("call", "confirmed")] * 3
    assert [s["nonce"] for s in states] == [count_before, count_before + 1, count_before + 2]
    count_after = int(await asyncio.to_thread(devnet.rpc, "eth_getTransactionCount", verifier.address, "latest"), 16)
    assert count_after == count_before + 3  # one transaction per verdict, nothing else
    events = await asyncio.to_thread(lambda: list(devnet.logs()))
    judged = [(int(e.args["taskId"]), str(e.args["verifier"]).lower())
              for e in events if e.name == "VerificationCompleted"]
    for item in items:
        assert judged.count((item["taskId"], verifier.address.lower())) == 1


async def test_a_wallet_in_a_remote_signer_signs_nothing_while_down_and_its_verdict_lands_once_after(
    devnet: Devnet, database_url: str, model_endpoint: ModelEndpoint
) -> None:
    (item,) = await asyncio.to_thread(_delivered, devnet, 1)
    verifier = devnet.verifier_agents[0]
    remote = RemoteSignerProcess(verifier.private_key).start()
    spec = SignerSpec(kind="remote", remote_url=remote.url, address=verifier.address, timeout=2)
    settings = VerifierAgentSettings(
        api_url="http://127.0.0.1:9", rpc_url=devnet.rpc_url, chain_id=devnet.chain_id,
        escrow_address=devnet.escrow_address, wallet_signer=spec, encryption_key=SecretStr("0x" + "22" * 32),
        database_url=database_url, receipt_timeout_seconds=3.0,
    )  # fmt: skip
    signer = await open_wallet(settings)
    agent = VerifierAgent(settings, model_endpoint.client(), signer=signer)
    count_before = int(await asyncio.to_thread(devnet.rpc, "eth_getTransactionCount", verifier.address, "latest"), 16)
    try:
        assert agent.address == verifier.address
        await agent.start_sender()
        remote.stop()  # the wallet's signer is gone: no request signed, no transaction sent
        with pytest.raises(SignerError):
            await agent._request("GET", "/v1/verifiers/me/queue")
        with pytest.raises((TimeoutError, RuntimeError, SignerError)):
            await agent.complete_on_chain(item, True, 100)
        count = int(await asyncio.to_thread(devnet.rpc, "eth_getTransactionCount", verifier.address, "pending"), 16)
        assert count == count_before
        remote.start()  # back: the verdict goes out, once
        tx_hash = None
        for _ in range(20):
            try:
                tx_hash = await agent.complete_on_chain(item, True, 100)
                break
            except (TimeoutError, RuntimeError, SignerError):
                continue  # the sender's backoff after the outage has not run out yet
        assert tx_hash is not None
    finally:
        await agent.close()
        await signer.aclose()
        remote.stop()
    count_after = int(await asyncio.to_thread(devnet.rpc, "eth_getTransactionCount", verifier.address, "latest"), 16)
    assert count_after == count_before + 1
    events = await asyncio.to_thread(lambda: list(devnet.logs()))
    judged = [int(e.args["taskId"]) for e in events
              if e.name == "VerificationCompleted" and str(e.args["verifier"]).lower() == verifier.address.lower()]
    assert judged.count(item["taskId"]) == 1
