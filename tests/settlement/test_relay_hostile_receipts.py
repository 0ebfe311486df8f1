"""A packed batch's receipt whose logs a node garbled (a topic that is not hex) is refused
like any malformed reply and read again, never an exception that ends the relayer: the
batch's verdicts are confirmed once the node answers properly. On anvil + PostgreSQL + Kafka,
through the fault proxy in front of anvil."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from escrowd.devnet import Devnet
from tests.settlement.conftest import (
    Relay,
    RelayerRun,
    fetch,
    on_chain,
    settings_from_env,
    verdict_events,
    verdict_statuses,
    wait_until,
)
from tests.support.rpc_proxy import Faults, RpcFaultProxy

pytestmark = pytest.mark.timeout(240)


async def test_a_batch_receipt_with_a_garbled_log_is_read_again_and_its_verdicts_confirmed(
    relay: Relay, devnet: Devnet, database_url: str
) -> None:
    items = await relay.submitted(4)
    with RpcFaultProxy(devnet.rpc_url, Faults(hostile_receipt_logs=1)) as proxy:
        env = relay.env()  # packed: the verdicts go out in batches
        chains = json.loads(env["ESCROWD_CHAINS"])
        chains[0]["rpc_urls"] = [proxy.url]
        env["ESCROWD_CHAINS"] = json.dumps(chains)
        run = RelayerRun(settings_from_env(env))
        await run.start()
        try:
            await relay.send_verdicts(env, items)

            async def all_confirmed() -> bool:
                run.check_alive()  # a garbled receipt must not end the relayer
                await on_chain(devnet.mine)
                statuses = await verdict_statuses(database_url)
                return len(statuses) == len(items) and set(statuses.values()) == {"confirmed"}

            await wait_until(all_confirmed, timeout=90, what="the verdicts confirmed")
            assert proxy.stats.injected["hostile_receipt_log"] == 1
            assert await on_chain(verdict_events, devnet) == {(i.task_id, 1): 1 for i in items}
            kinds = Counter(r["kind"] for r in await fetch(database_url, "SELECT kind FROM settlement_transactions"))
            assert kinds["batch"] >= 1
        finally:
            await run.stop()
