"""A verdict whose transaction was mined and reverted is recorded even when the first attempt to
read why it reverted fails: the node's `debug_traceTransaction` answers only errors for a
while (a provider's outage of its debug namespace, rate limits), the tracking round that
found the revert fails with it, and the next round records the verdict `reverted` with its
decoded error once the node answers again. On anvil + PostgreSQL + Kafka, through the fault
proxy in front of anvil."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from escrowd.devnet import Devnet
from tests.settlement.conftest import (
    Relay,
    RelayerRun,
    Submitted,
    fetch,
    on_chain,
    verdict_statuses,
    wait_until,
)
from tests.support.rpc_proxy import Faults, RpcFaultProxy

pytestmark = pytest.mark.timeout(240)

TRACE_DOWN = Faults(error_rate=1.0, methods=frozenset({"debug_traceTransaction"}))


@dataclass
class Reverting:
    """A relayer behind a node that refuses every trace; one verdict reverts, the other lands."""

    run: RelayerRun
    proxy: RpcFaultProxy
    disputed: Submitted
    other: Submitted

    async def settled(self, relay: Relay) -> bool:
        """Mine; whether the disputed verdict is recorded reverted and the other confirmed."""
        self.run.check_alive()
        await on_chain(relay.devnet.mine)
        statuses = await verdict_statuses(relay.database_url)
        return statuses == {self.disputed.task_id: "reverted", self.other.task_id: "confirmed"}


@contextlib.asynccontextmanager
async def reverting(relay: Relay, **settings: Any) -> AsyncIterator[Reverting]:
    """Two verdicts sent one transaction each with automine off; the poster disputes the first
    task with a higher tip, so its dispute is mined first and that verdict reverts."""
    devnet = relay.devnet
    disputed, other = items = await relay.submitted(2)
    with RpcFaultProxy(devnet.rpc_url, TRACE_DOWN) as proxy:
        run, env = await relay.start(rpc_url=proxy.url, relayer_settle_batch_size=0, **settings)
        try:
            await on_chain(devnet.rpc, "evm_setAutomine", False)
            await relay.send_verdicts(env, items)
            await wait_until(lambda: relay.all_sent(run, items), timeout=60, what="both verdicts signed and in the pool")
            task = await on_chain(devnet.get_task, disputed.task_id)
            poster = next(p for p in devnet.posters if p.address.lower() == task.poster.lower())
            await relay.dispute_ahead(disputed.task_id, poster)
            yield Reverting(run, proxy, disputed, other)
        finally:
            await on_chain(devnet.rpc, "evm_setAutomine", True)
            await run.stop()


async def test_a_revert_whose_trace_failed_once_is_recorded_when_the_node_answers_again(
    relay: Relay, devnet: Devnet, database_url: str
) -> None:
    async with reverting(relay) as case:

        async def trace_refused() -> bool:
            case.run.check_alive()
            await on_chain(devnet.mine)
            return sum(case.proxy.stats.injected.values()) >= 5  # one read of the revert, every attempt refused

        await wait_until(trace_refused, timeout=60, what="the revert's trace refused")
        case.proxy.set_faults(Faults())  # the node answers again
        await wait_until(lambda: case.settled(relay), timeout=60, what="the reverted verdict recorded, the other confirmed")
        (row,) = await fetch(
            database_url, "SELECT error, error_args FROM settlement_verdicts WHERE task_id = $1", case.disputed.task_id
        )
        assert row["error"] == "WrongStatus" and json.loads(row["error_args"]) == [5]


async def test_a_revert_whose_trace_never_answers_is_recorded_without_its_reason(
    relay: Relay, devnet: Devnet, database_url: str
) -> None:
    """A provider that never answers `debug_traceTransaction` (403 on the debug namespace, a
    trace it garbles): once `relayer_revert_reason_patience_seconds` have passed the verdict is
    recorded `reverted` without a decoded reason, rather than failing every tracking round from
    then on (which also held up the rest of each round: lost nonces, refused batch items,
    pruning)."""
    async with reverting(relay, relayer_revert_reason_patience_seconds=2) as case:
        await wait_until(
            lambda: case.settled(relay), timeout=120, what="the reverted verdict recorded with the trace still refused"
        )
        assert case.proxy.stats.injected  # the trace was refused throughout
        (row,) = await fetch(
            database_url, "SELECT error FROM settlement_verdicts WHERE task_id = $1", case.disputed.task_id
        )
        assert row["error"] == "Reverted"  # the reason stays unknown
