"""A fee spike above the relayer's cap and back: new sends are held (verdicts stay queued, no
nonce is taken, /health/bridge and the metric say why), and when the base fee falls the
relayer resumes by itself: every verdict lands exactly once, no nonce left stuck."""

from __future__ import annotations

import httpx
import pytest

from escrowd.devnet import Devnet
from tests.settlement.conftest import (
    Relay,
    fetchval,
    on_chain,
    settings_from_env,
    verdict_events,
    verdict_statuses,
    wait_until,
)

pytestmark = pytest.mark.timeout(180)
GWEI = 10**9
CAP = 20 * GWEI


def set_base_fee(devnet: Devnet, wei: int) -> None:
    devnet.rpc("anvil_setNextBlockBaseFeePerGas", hex(wei))
    devnet.mine()


async def test_fee_spike_holds_sends_and_resumes(
    relay: Relay, devnet: Devnet, database_url: str,
) -> None:
    items = await relay.submitted(6, prefix="spike")
    run, env = await relay.start(relayer_fee_cap_wei=CAP)
    try:
        await on_chain(set_base_fee, devnet, 10 * CAP)  # the spike: no transaction under the cap could be mined
        url = f"http://127.0.0.1:{run.port}"
        async with httpx.AsyncClient() as client:

            async def held() -> bool:
                run.check_alive()
                relayer = (await client.get(f"{url}/health/bridge")).json()["chains"][0]["relayer"]
                metrics = (await client.get(f"{url}/metrics")).text
                return (
                    relayer["sending"] is False
                    and "fee cap" in (relayer["pausedReason"] or "")
                    and 'escrowd_relayer_fee_cap_held{chain_id="31337"} 1.0' in metrics
                )

            await wait_until(held, timeout=30, what="the fee hold reported")
            await relay.send_verdicts(env, items)

            async def queued() -> bool:
                statuses = await verdict_statuses(database_url)
                return len(statuses) == len(items) and set(statuses.values()) == {"queued"}

            await wait_until(queued, timeout=30, what="the verdicts queued")
            await on_chain(devnet.mine, 3)  # heads go by, still above the cap
            assert set((await verdict_statuses(database_url)).values()) == {"queued"}
            assert await fetchval(database_url, "SELECT count(*) FROM settlement_transactions") == 0

            await on_chain(set_base_fee, devnet, GWEI)  # fees fall back: sending resumes by itself

            async def confirmed() -> bool:
                run.check_alive()
                await on_chain(devnet.mine)
                statuses = await verdict_statuses(database_url)
                return set(statuses.values()) == {"confirmed"}

            await wait_until(confirmed, timeout=60, what="every verdict confirmed")
            metrics = (await client.get(f"{url}/metrics")).text
            gas_limit = settings_from_env(env).relayer_gas_limit
            runway: dict[str, int] = {}

            async def runway_follows_the_fees() -> bool:
                # The runway: what the balance pays for at the node's gas price and the full gas
                # limit. The report is the health monitor's last check: one made during the spike
                # priced 10x higher, so wait for a check made after the fall.
                relayer = (await client.get(f"{url}/health/bridge")).json()["chains"][0]["relayer"]
                gas_price = int(await on_chain(devnet.rpc, "eth_gasPrice"), 16)
                runway["expected"] = int(relayer["balanceWei"]) // (gas_price * gas_limit)
                runway["reported"] = relayer["runwayVerdicts"] or 0
                return runway["expected"] // 2 <= runway["reported"] <= runway["expected"] * 2

            await wait_until(runway_follows_the_fees, timeout=30, what="the runway at the current fees")
        assert 'escrowd_relayer_fee_cap_held{chain_id="31337"} 0.0' in metrics
        assert "escrowd_relayer_runway_verdicts{" in metrics
        events = await on_chain(verdict_events, devnet)
        assert {k: v for k, v in events.items() if k[0] in {i.task_id for i in items}} == {(i.task_id, 1): 1 for i in items}
        # No nonce stuck: the chain's count reached the relayer's counter.
        count = int(devnet.rpc("eth_getTransactionCount", devnet.marketplace_verifier.address, "latest"), 16)
        assert count == await fetchval(database_url, "SELECT next_nonce FROM settlement_nonces")
    finally:
        await run.stop()
