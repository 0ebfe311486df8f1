"""The relayer packing verdicts over a token that lets one recipient burn the gas
(`GasBurnToken`, contracts/mocks/): no batch reverts, every verdict is settled once.

An agent whose transfer hook spends without end costs its items ~230k gas each instead of
~31k. The escrow gives each push a bounded stipend and refuses the rest of a batch with
`GasTooLow` when gas runs low; the relayer simulates each batch with its own gas limit before
signing, leaves the items it would refuse queued for the next round, and so sends no batch
that reverts or strands an item. Before the stipend, each batch holding such an item ran out
of gas and every verdict in it was recorded `reverted`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from escrowd.devnet import USDC, Devnet, deploy_devnet, split_fee, text_hash
from runtime.services.anvil import AnvilProcess
from tests.settlement.conftest import (
    IndexerRun,
    fetch,
    on_chain,
    publish,
    signed_verdicts,
    submit_tasks,
    verdict_events,
)
from tests.settlement.test_relay_batches import _all_confirmed
from tests.settlement.test_relay_crash import relayer_transactions
from tests.settlement.test_relay_faults import start_relayer
from tests.support.hostile_tokens import compile_mock_tokens, escrow_over


@pytest.fixture(scope="module")
def burn_token() -> dict[str, Any]:
    return compile_mock_tokens()["GasBurnToken"]


@pytest.fixture
def devnet(anvil: AnvilProcess, burn_token: dict[str, Any]) -> Iterator[Devnet]:
    """The test's anvil with an escrow over GasBurnToken (the fixtures index and relay it)."""
    base = deploy_devnet(anvil.rpc_url, ws_url=anvil.ws_url, posters=2, agents=3, spare=3)
    yield escrow_over(base, burn_token)


def _set_burner(dn: Devnet, who: str) -> None:
    selector = text_hash("setBurner(address,bool)")[:4].hex()
    dn.send(dn.owner, dn.token_address, "0x" + selector + f"{int(who, 16):064x}" + f"{1:064x}")


@pytest.mark.timeout(240)
async def test_a_recipient_that_burns_gas_sinks_no_batch(
    devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str, indexer: IndexerRun, service_signer
) -> None:
    burner = devnet.agents[1].address  # every third task's agent (submit_tasks goes round)
    await on_chain(_set_burner, devnet, burner)
    items = await on_chain(submit_tasks, devnet, 36)
    await indexer.caught_up()
    run, env = await start_relayer(
        devnet, database_url, kafka_bootstrap, topic_prefix, [service_signer.address],
        relayer_settle_batch_size=12, relayer_settle_batch_min=2,
    )  # fmt: skip
    try:
        await publish(kafka_bootstrap, env["ESCROWD_VERDICTS_TOPIC"], signed_verdicts(devnet, items, service_signer))
        await _all_confirmed(run, devnet, database_url, len(items), timeout=120)
        assert await on_chain(verdict_events, devnet) == {(i.task_id, 1): 1 for i in items}
        mined = await on_chain(relayer_transactions, devnet, devnet.marketplace_verifier.address, 1)
        assert mined and all(tx["status"] == 1 for tx in mined), "a relayer transaction reverted"
        kinds = [r["kind"] for r in await fetch(database_url, "SELECT kind FROM settlement_transactions")]
        assert "batch" in kinds
        # The burning agent's shares are credited to it; nobody else's payout is touched.
        agent_share, _ = split_fee(10 * USDC)  # post_task's default reward
        burned = sum(1 for i, _ in enumerate(items) if i % len(devnet.agents) == 1)
        assert await on_chain(devnet.owed, burner) == burned * agent_share
        assert await on_chain(devnet.total_owed) == burned * agent_share
    finally:
        await run.stop()
