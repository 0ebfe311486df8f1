"""A verdict whose transaction was mined and reverted is recorded even when the first attempt to
read why it reverted fails: the node's `debug_traceTransaction` answers only errors for a
while (a provider's outage of its debug namespace, rate limits), the tracking round that
found the revert fails with it, and the next round records the verdict `reverted` with its
decoded error once the node answers again. On anvil + PostgreSQL + Kafka, through the fault
proxy in front of anvil."""

from __future__ import annotations

import json

import pytest

from escrowd.devnet import Devnet
from tests.settlement.conftest import (
    Relay,
    fetch,
    on_chain,
    verdict_statuses,
    wait_until,
)
from tests.support.rpc_proxy import Faults, RpcFaultProxy

pytestmark = pytest.mark.timeout(240)

TRACE_DOWN = Faults(error_rate=1.0, methods=frozenset({"debug_traceTransaction"}))


async def test_a_revert_whose_trace_failed_once_is_recorded_when_the_node_answers_again(
    relay: Relay, devnet: Devnet, database_url: str
) -> None:
    items = await relay.submitted(2)
    disputed, other = items
    with RpcFaultProxy(devnet.rpc_url, TRACE_DOWN) as proxy:
        run, env = await relay.start(rpc_url=proxy.url, relayer_settle_batch_size=0)  # one transaction per verdict
        try:
            await on_chain(devnet.rpc, "evm_setAutomine", False)
            await relay.send_verdicts(env, items)

            await wait_until(lambda: relay.all_sent(run, items), timeout=60, what="both verdicts signed and in the pool")
            # The poster disputes one task with a higher tip: mined first, its verdict reverts.
            task = await on_chain(devnet.get_task, disputed.task_id)
            poster = next(p for p in devnet.posters if p.address.lower() == task.poster.lower())
            await relay.dispute_ahead(disputed.task_id, poster)

            async def trace_refused() -> bool:
                run.check_alive()
                await on_chain(devnet.mine)
                return sum(proxy.stats.injected.values()) >= 5  # one read of the revert, every attempt refused

            await wait_until(trace_refused, timeout=60, what="the revert's trace refused")
            proxy.set_faults(Faults())  # the node answers again

            async def settled() -> bool:
                run.check_alive()
                await on_chain(devnet.mine)
                statuses = await verdict_statuses(database_url)
                return statuses == {disputed.task_id: "reverted", other.task_id: "confirmed"}

            await wait_until(settled, timeout=60, what="the reverted verdict recorded, the other confirmed")
            (row,) = await fetch(
                database_url, "SELECT error, error_args FROM settlement_verdicts WHERE task_id = $1", disputed.task_id
            )
            assert row["error"] == "WrongStatus" and json.loads(row["error_args"]) == [5]
        finally:
            await on_chain(devnet.rpc, "evm_setAutomine", True)
            await run.stop()


async def test_a_revert_whose_trace_never_answers_is_recorded_without_its_reason(
    relay: Relay, devnet: Devnet, database_url: str
) -> None:
    """A provider that never answers `debug_traceTransaction` (403 on the debug namespace, a
    trace it garbles): once `relayer_revert_reason_patience_seconds` have passed the verdict is
    recorded `reverted` without a decoded reason, rather than failing every tracking round from
    then on (which also held up the rest of each round: lost nonces, refused batch items,
    pruning)."""
    items = await relay.submitted(2)
    disputed, other = items
    with RpcFaultProxy(devnet.rpc_url, TRACE_DOWN) as proxy:
        run, env = await relay.start(
            rpc_url=proxy.url, relayer_settle_batch_size=0, relayer_revert_reason_patience_seconds=2
        )
        try:
            await on_chain(devnet.rpc, "evm_setAutomine", False)
            await relay.send_verdicts(env, items)
            await wait_until(lambda: relay.all_sent(run, items), timeout=60, what="both verdicts signed and in the pool")
            task = await on_chain(devnet.get_task, disputed.task_id)
            poster = next(p for p in devnet.posters if p.address.lower() == task.poster.lower())
            await relay.dispute_ahead(disputed.task_id, poster)

            async def settled() -> bool:
                run.check_alive()
                await on_chain(devnet.mine)
                statuses = await verdict_statuses(database_url)
                return statuses == {disputed.task_id: "reverted", other.task_id: "confirmed"}

            await wait_until(settled, timeout=120, what="the reverted verdict recorded with the trace still refused")
            assert proxy.stats.injected  # the trace was refused throughout
            (row,) = await fetch(database_url, "SELECT error FROM settlement_verdicts WHERE task_id = $1", disputed.task_id)
            assert row["error"] == "Reverted"  # the reason stays unknown
        finally:
            await on_chain(devnet.rpc, "evm_setAutomine", True)
            await run.stop()
