"""A node that answers the relayer's `isJudged` reads with no bytes ("0x": a node behind the
chain, without the escrow's code yet) costs the verdicts a round, never the relayer: the
answer tells nothing, so nothing is sent blind, and the verdicts go out once the node answers
properly. On anvil + PostgreSQL + Kafka, through the fault proxy in front of anvil."""

from __future__ import annotations

import pytest

from chain.txs import is_judged_data
from escrowd.devnet import Devnet
from tests.settlement.conftest import (
    Relay,
    on_chain,
    verdict_events,
    verdict_statuses,
    wait_until,
)
from tests.support.rpc_proxy import Faults, RpcFaultProxy

pytestmark = pytest.mark.timeout(240)

IS_JUDGED = "0x" + is_judged_data(0, 0)[:4].hex()


async def test_an_empty_is_judged_answer_holds_the_verdict_and_keeps_the_relayer_running(
    relay: Relay, devnet: Devnet, database_url: str
) -> None:
    items = await relay.submitted(2)
    with RpcFaultProxy(devnet.rpc_url, Faults(empty_calls=frozenset({IS_JUDGED}))) as proxy:
        # Without the preflight simulation every round reads `isJudged` of each verdict first.
        run, env = await relay.start(
            rpc_url=proxy.url, relayer_settle_batch_size=0, relayer_preflight_simulation="false"
        )
        try:
            await relay.send_verdicts(env, items)

            async def answered_empty() -> bool:
                run.check_alive()
                return proxy.stats.injected["empty_call"] >= len(items)

            await wait_until(answered_empty, timeout=60, what="the isJudged reads answered with no bytes")
            run.check_alive()
            assert set((await verdict_statuses(database_url)).values()) == {"queued"}  # nothing sent blind
            proxy.set_faults(Faults())  # the node caught up

            await wait_until(lambda: relay.all_confirmed(run, items), timeout=90, what="the verdicts confirmed")
            assert await on_chain(verdict_events, devnet) == {(i.task_id, 1): 1 for i in items}
        finally:
            await run.stop()
