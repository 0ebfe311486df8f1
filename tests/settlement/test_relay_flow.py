"""The relayer end to end on anvil + PostgreSQL + Kafka: verdicts in, verdicts on chain."""

from __future__ import annotations

import httpx
import pytest

from escrowd.devnet import Devnet
from tests.settlement.conftest import (
    IndexerRun,
    RelayerRun,
    fetch,
    on_chain,
    publish,
    relayer_env,
    settings_from_env,
    signed_verdicts,
    submit_tasks,
    verdict_events,
    verdict_statuses,
    wait_until,
)

# A hang must fail fast, with its stack, not after the global 10 minutes.
pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("packed", [False, True], ids=["single", "packed"])
async def test_verdicts_are_relayed_and_confirmed(
    devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str, indexer: IndexerRun, service_signer,
    packed: bool,
) -> None:
    """Signed verdicts from Kafka end up judged on chain exactly once, confirmed in the database
    (one transaction per verdict, or packed: the default)."""
    items = await on_chain(submit_tasks, devnet, 12)
    await indexer.caught_up()
    env = relayer_env(
        devnet=devnet,
        database_url=database_url,
        kafka_bootstrap=kafka_bootstrap,
        topic_prefix=topic_prefix,
        trusted=[service_signer.address],
        confirmations=2,
        **({} if packed else {"relayer_settle_batch_size": 0}),
    )
    run = RelayerRun(settings_from_env(env))
    await run.start()
    try:
        verdicts = signed_verdicts(devnet, items, service_signer)
        await publish(kafka_bootstrap, env["ESCROWD_VERDICTS_TOPIC"], verdicts)

        async def all_confirmed() -> bool:
            run.check_alive()
            await on_chain(devnet.mine)  # a live chain keeps producing blocks: confirmations need them
            statuses = await verdict_statuses(database_url)
            return len(statuses) == len(items) and set(statuses.values()) == {"confirmed"}

        await wait_until(all_confirmed, timeout=60, what="all verdicts confirmed")
        events = (await on_chain(verdict_events, devnet))
        assert events == {(i.task_id, 1): 1 for i in items}
        for item, signed in zip(items, verdicts, strict=True):
            task = (await on_chain(devnet.get_task, item.task_id))
            assert task.judged_mask == 1
            assert int(task.status) == (4 if signed.verdict.passed else 3)
        rows = await fetch(database_url, "SELECT count(*) AS n, count(DISTINCT nonce) AS d FROM settlement_transactions")
        if packed:
            # Every verdict in exactly one transaction (here the batches), one row per nonce.
            carried = await fetch(
                database_url,
                "SELECT b.verdict_id, count(*) AS n FROM settlement_batch_items b JOIN settlement_transactions t"
                " USING (chain_id, sender, nonce) WHERE t.kind = 'batch' GROUP BY b.verdict_id",
            )
            singles = await fetch(database_url, "SELECT verdict_id FROM settlement_transactions WHERE kind = 'verdict'")
            assert len(carried) + len(singles) == len(items) and all(r["n"] == 1 for r in carried)
            assert {r["verdict_id"] for r in carried}.isdisjoint(r["verdict_id"] for r in singles)
            assert carried, "the verdicts went out packed"
            assert rows[0]["n"] == rows[0]["d"] < len(items)
        else:
            assert rows[0]["n"] == rows[0]["d"] == len(items)
        async with httpx.AsyncClient() as client:
            # The report is the monitor's latest check (one per poll interval): one taken while
            # the last transactions were still pending may be served for a moment after.
            async def nothing_pending() -> bool:
                report = (await client.get(f"http://127.0.0.1:{run.port}/health/bridge")).json()
                return bool(report["chains"][0]["relayer"]["pendingTransactions"] == 0)

            await wait_until(nothing_pending, timeout=60, what="the bridge report shows nothing pending")
            health = (await client.get(f"http://127.0.0.1:{run.port}/health/bridge")).json()
            metrics = (await client.get(f"http://127.0.0.1:{run.port}/metrics")).text
        chain = health["chains"][0]
        assert chain["verifier"]["verifierMatches"] is True
        assert chain["relayer"]["address"] == devnet.marketplace_verifier.address
        assert chain["relayer"]["pendingTransactions"] == 0
        assert "escrowd_relayer_tx_confirmed_total" in metrics
        assert 'escrowd_relayer_verifier_key_match{chain_id="31337"} 1.0' in metrics
        secret = devnet.marketplace_verifier.private_key.lower().removeprefix("0x")
        assert secret not in str(health).lower() and secret not in metrics.lower()
    finally:
        await run.stop()


async def test_verdict_waits_for_its_evidence_to_be_indexed(
    devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str, indexer: IndexerRun, service_signer
) -> None:
    """A verdict that arrives before its attempt is indexed waits, then is sent, not refused."""
    from escrowd.devnet import text_hash
    from schemas.verdict import sign_verdict
    from tests.settlement.conftest import Submitted, make_verdict

    agent = devnet.agents[0]
    task_id = (await on_chain(devnet.post_task, devnet.posters[0]))
    await on_chain(devnet.accept_task, task_id, sender=agent)
    evidence = text_hash("delivered later")
    await indexer.caught_up()
    env = relayer_env(
        devnet=devnet,
        database_url=database_url,
        kafka_bootstrap=kafka_bootstrap,
        topic_prefix=topic_prefix,
        trusted=[service_signer.address],
    )
    run = RelayerRun(settings_from_env(env))
    await run.start()
    try:
        signed = sign_verdict(make_verdict(devnet, Submitted(task_id, 1, "0x" + evidence.hex())), service_signer.private_key)
        await publish(kafka_bootstrap, env["ESCROWD_VERDICTS_TOPIC"], [signed])

        async def waiting() -> bool:
            run.check_alive()
            return (await verdict_statuses(database_url)).get(task_id) == "awaiting_evidence"

        await wait_until(waiting, timeout=30, what="the verdict waiting for its evidence")
        await on_chain(devnet.submit_evidence, task_id, evidence, sender=agent)

        async def confirmed() -> bool:
            run.check_alive()
            return (await verdict_statuses(database_url)).get(task_id) == "confirmed"

        await wait_until(confirmed, timeout=30, what="the verdict sent once its evidence was indexed")
        assert (await on_chain(verdict_events, devnet)) == {(task_id, 1): 1}
        assert await fetch(database_url, "SELECT * FROM settlement_rejections") == []
    finally:
        await run.stop()
