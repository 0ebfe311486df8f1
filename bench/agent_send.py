"""The hosted verifier agent's send path (`VerifierAgent.complete_on_chain` over the chain
toolkit's `CallSender`), measured in `python -m bench.bench_relayer` (`--agent-verdicts`).

Three figures in one run, on one anvil and one PostgreSQL:

- `raw_batched`: the baseline, presigned `completeVerification` transactions from the agent's
  wallet, sent in JSON-RPC batches of 16 and counted mined (what the node can take);
- `clear`: the agent's send path for the same number of verdicts, all awaited at once
  (nonces pipelined by the sender; each call awaited until confirmed);
- `stuck_first`: the same, but the first verdict's transaction is priced under the base fee
  (the base fee jumps above its max fee before it can be mined) and the others are sent
  behind it: the time until its replacement is mined (`replace_s`, from the jump), and the
  verdicts per second of them all. Before the chain sender the agent took its nonce from
  `pending` and never replaced a transaction: the first verdict never landed and every later
  one waited behind it (0 verdicts confirmed, however long one waits).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
from pydantic import SecretStr

from chain.fees import Fees
from chain.keys import SecretKey
from chain.txs import complete_verification_data, sign_eip1559
from escrowd.devnet import Devnet
from verification.agents.model import ModelClient, ModelSettings
from verification.agents.verifier_agent import VerifierAgent, VerifierAgentSettings

POLL = 0.02


def _delivered(devnet: Devnet, wallet: Any, count: int, tag: int) -> list[dict[str, Any]]:
    devnet.rpc("evm_setAutomine", True)
    items = []
    for i in range(count):
        task_id = devnet.post_task(devnet.posters[i % len(devnet.posters)], verifier=wallet)
        agent = devnet.agents[i % len(devnet.agents)]
        devnet.accept_task(task_id, sender=agent)
        evidence = bytes([tag, i % 256]) * 16
        devnet.submit_evidence(task_id, evidence, sender=agent)
        items.append({"escrow": devnet.escrow_address, "taskId": task_id, "attempt": 1,
                      "evidenceHash": "0x" + evidence.hex()})
    return items


async def _raw_batched(devnet: Devnet, key: SecretKey, items: list[dict[str, Any]]) -> float:
    count = int(devnet.rpc("eth_getTransactionCount", key.address, "latest"), 16)
    base = int(devnet.rpc("eth_getBlockByNumber", "latest", False)["baseFeePerGas"], 16)
    fees = Fees(max_fee_per_gas=4 * base + 10**9, max_priority_fee_per_gas=10**9)
    raws = [
        sign_eip1559(key, chain_id=devnet.chain_id, nonce=count + i, to=devnet.escrow_address, gas_limit=300_000,
                     data=complete_verification_data(it["taskId"], 1, it["evidenceHash"], True, 100), fees=fees).raw_hex
        for i, it in enumerate(items)
    ]
    started = time.perf_counter()
    async with aiohttp.ClientSession() as session:
        for i in range(0, len(raws), 16):
            body = [{"jsonrpc": "2.0", "id": j, "method": "eth_sendRawTransaction", "params": [raw]}
                    for j, raw in enumerate(raws[i : i + 16])]
            async with session.post(devnet.rpc_url, json=body) as response:
                for reply in await response.json():
                    if "error" in reply:
                        raise RuntimeError(f"raw send refused: {reply['error']}")
    while int(devnet.rpc("eth_getTransactionCount", key.address, "latest"), 16) < count + len(raws):  # noqa: ASYNC110 -- polling the node is the measurement
        await asyncio.sleep(POLL)
    return len(items) / (time.perf_counter() - started)


async def agent_send_figure(devnet: Devnet, database_url: str, verdicts: int) -> dict[str, Any]:
    """The three figures above for `verdicts` verdicts each."""
    wallet = devnet.verifier_agents[-1]
    key = SecretKey.from_hex(wallet.private_key)
    raw_items = await asyncio.to_thread(_delivered, devnet, wallet, verdicts, 0x61)
    clear_items = await asyncio.to_thread(_delivered, devnet, wallet, verdicts, 0x62)
    stuck_items = await asyncio.to_thread(_delivered, devnet, wallet, verdicts, 0x63)
    raw = await _raw_batched(devnet, key, raw_items)
    settings = VerifierAgentSettings(
        api_url="http://127.0.0.1:9", rpc_url=devnet.rpc_url, chain_id=devnet.chain_id,
        escrow_address=devnet.escrow_address, wallet_key=SecretStr(wallet.private_key), database_url=database_url,
        replace_after_seconds=3_600.0,
    )  # fmt: skip
    agent = VerifierAgent(settings, ModelClient(ModelSettings(url="http://127.0.0.1:9/v1", name="unused")))
    try:
        sender = await agent.start_sender()
        started = time.perf_counter()
        await asyncio.gather(*(agent.complete_on_chain(it, True, 100) for it in clear_items))
        clear = len(clear_items) / (time.perf_counter() - started)

        devnet.rpc("evm_setAutomine", False)
        try:
            started = time.perf_counter()
            first = asyncio.create_task(agent.complete_on_chain(stuck_items[0], True, 100))
            while not any(s.state == "pending" and s.last_broadcast and not s.in_flight for s in sender.slots.values()):  # noqa: ASYNC110
                await asyncio.sleep(POLL)  # until the first verdict was broadcast
            (slot,) = [s for s in sender.slots.values() if s.state == "pending"]
            underpriced = slot.versions[0]
            devnet.rpc("anvil_setNextBlockBaseFeePerGas", hex(underpriced.fees.max_fee_per_gas * 4))
            devnet.rpc("evm_mine")
            jumped = time.perf_counter()
            later = [asyncio.create_task(agent.complete_on_chain(it, True, 100)) for it in stuck_items[1:]]
        finally:
            devnet.rpc("evm_setAutomine", True)
        first_hash = await first
        replace_s = time.perf_counter() - jumped
        await asyncio.gather(*later)
        stuck = len(stuck_items) / (time.perf_counter() - started)
        assert first_hash != underpriced.tx_hash and len(slot.versions) >= 2, "the first verdict was not replaced"
        assert devnet.rpc("eth_getTransactionReceipt", underpriced.tx_hash) is None
    finally:
        await agent.close()
    return {
        "verdicts": verdicts,
        "raw_batched_tx_per_s": round(raw, 1),
        "clear_verdicts_per_s": round(clear, 1),
        "stuck_first_verdicts_per_s": round(stuck, 1),
        "stuck_first_replace_s": round(replace_s, 3),
        "stuck_first_versions": len(slot.versions),
        "clear_vs_raw": round(clear / raw, 2),
    }
