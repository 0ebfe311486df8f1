"""Receipts of packed batches as nodes may answer them, on anvil + PostgreSQL + Kafka through
the fault proxy in front of anvil: logs a node garbled (a topic that is not hex) are refused
like any malformed reply and read again, and a receipt without `status` is read as the
receipt checks read it (a success); neither is an exception that ends the relayer."""

from __future__ import annotations

from collections import Counter

import pytest

from escrowd.devnet import Devnet
from tests.settlement.conftest import (
    Relay,
    fetch,
    on_chain,
    verdict_events,
    wait_until,
)
from tests.support.rpc_proxy import Faults, RpcFaultProxy

pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize(
    ("faults", "injected"),
    [(Faults(hostile_receipt_logs=1), "hostile_receipt_log"), (Faults(strip_receipt_status=True), "stripped_status")],
    ids=["garbled-log", "no-status"],
)
async def test_a_batch_receipt_as_a_node_may_answer_it_leaves_the_relayer_running_and_its_verdicts_confirmed(
    relay: Relay, devnet: Devnet, database_url: str, faults: Faults, injected: str
) -> None:
    items = await relay.submitted(4)
    with RpcFaultProxy(devnet.rpc_url, faults) as proxy:
        run, env = await relay.start(rpc_url=proxy.url)  # packed: the verdicts go out in batches
        try:
            await relay.send_verdicts(env, items)
            # `all_confirmed` checks the relayer is alive: a garbled receipt must not end it.
            await wait_until(lambda: relay.all_confirmed(run, items), timeout=90, what="the verdicts confirmed")
            assert proxy.stats.injected[injected] >= 1
            assert await on_chain(verdict_events, devnet) == {(i.task_id, 1): 1 for i in items}
            kinds = Counter(r["kind"] for r in await fetch(database_url, "SELECT kind FROM settlement_transactions"))
            assert kinds["batch"] >= 1
        finally:
            await run.stop()
