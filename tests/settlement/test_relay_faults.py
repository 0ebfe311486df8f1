"""Faults the relayer must survive, on anvil + PostgreSQL + Kafka: refused verdicts, a stuck
transaction, a reorg under a confirmed verdict, and the escrow rotating its verifier key."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client import REGISTRY

from escrowd.devnet import Devnet, text_hash
from schemas.verdict import sign_verdict
from tests.settlement.conftest import (
    IndexerRun,
    RelayerRun,
    Submitted,
    fetch,
    fetchval,
    make_verdict,
    on_chain,
    publish,
    publish_raw,
    relayer_env,
    settings_from_env,
    submit_tasks,
    verdict_events,
    verdict_statuses,
    wait_until,
)

# A hang must fail fast, with its stack, not after the global 10 minutes.
pytestmark = pytest.mark.timeout(120)


def metric(name: str, **labels: str) -> float:
    """Current value of a sample in this process's registry (0 when absent)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def start_relayer(devnet, database_url, kafka_bootstrap, topic_prefix, trusted, **extra) -> tuple[RelayerRun, dict[str, str]]:
    env = relayer_env(
        devnet=devnet,
        database_url=database_url,
        kafka_bootstrap=kafka_bootstrap,
        topic_prefix=topic_prefix,
        trusted=trusted,
        **extra,
    )
    run = RelayerRun(settings_from_env(env))
    await run.start()
    return run, env


async def test_refused_verdicts_are_recorded_and_never_sent(
    devnet: Devnet, database_url, kafka_bootstrap, topic_prefix, indexer: IndexerRun, service_signer, rogue_signer
) -> None:
    """Bad signature, untrusted signer, stale or unindexed attempt, wrong evidence: recorded, never sent."""
    tampered, untrusted, stale, wrong_hash, unindexed = await on_chain(submit_tasks, devnet, 5)
    # `stale`: attempt 1 failed on chain, attempt 2 submitted: a verdict on attempt 1 is stale.
    await on_chain(devnet.complete_verification, stale.task_id, 1, bytes.fromhex(stale.evidence_hash[2:]), False, 10, sender=devnet.marketplace_verifier)
    agent = (await on_chain(devnet.get_task, stale.task_id)).agent
    await on_chain(devnet.submit_evidence, stale.task_id, text_hash("second try"), sender=agent)
    await indexer.caught_up()
    run, env = await start_relayer(
        devnet, database_url, kafka_bootstrap, topic_prefix, [service_signer.address], relayer_evidence_wait_seconds=2
    )
    topic = env["ESCROWD_VERDICTS_TOPIC"]
    before_sig = metric("escrowd_relayer_signature_rejections_total", reason="signer_mismatch")
    try:
        good = sign_verdict(make_verdict(devnet, tampered, score=80), service_signer.private_key)
        # Same verdict with the score changed after signing: the signature no longer matches.
        forged = good.model_copy(update={"verdict": good.verdict.model_copy(update={"score": 100})})
        bad = [
            forged,
            sign_verdict(make_verdict(devnet, untrusted), rogue_signer.private_key),
            sign_verdict(make_verdict(devnet, stale), service_signer.private_key),
            sign_verdict(make_verdict(devnet, wrong_hash, evidence_hash="0x" + "11" * 32), service_signer.private_key),
            sign_verdict(make_verdict(devnet, Submitted(unindexed.task_id, 2, unindexed.evidence_hash)), service_signer.private_key),
        ]
        await publish(kafka_bootstrap, topic, bad)
        await publish_raw(kafka_bootstrap, topic, b"{not json", {"ce_id": "garbage-1", "ce_type": "x"}, b"31337:1")

        async def all_refused() -> bool:
            run.check_alive()
            reasons = await fetch(database_url, "SELECT task_id, reason FROM settlement_rejections")
            dead = await fetchval(database_url, "SELECT count(*) FROM dead_letters WHERE message_id = 'garbage-1'")
            return len(reasons) == 5 and dead == 1

        await wait_until(all_refused, timeout=40, what="five rejections and one dead letter")
        reasons = {int(r["task_id"]): r["reason"] for r in await fetch(database_url, "SELECT task_id, reason FROM settlement_rejections")}
        assert reasons == {
            tampered.task_id: "signer_mismatch",
            untrusted.task_id: "untrusted_signer",
            stale.task_id: "stale_attempt",
            wrong_hash.task_id: "evidence_mismatch",
            unindexed.task_id: "attempt_not_indexed",
        }
        assert metric("escrowd_relayer_signature_rejections_total", reason="signer_mismatch") == before_sig + 1
        # The genuine verdict for the tampered task carries the same message id: it still passes.
        await publish(kafka_bootstrap, topic, [good])

        async def genuine_confirmed() -> bool:
            run.check_alive()
            return (await verdict_statuses(database_url)).get(tampered.task_id) == "confirmed"

        await wait_until(genuine_confirmed, timeout=30, what="the genuine verdict confirmed")
        assert await fetchval(database_url, "SELECT count(*) FROM settlement_transactions") == 1
        assert await fetchval(database_url, "SELECT count(*) FROM settlement_verdicts") == 1
        events = (await on_chain(verdict_events, devnet))
        assert events == {(tampered.task_id, 1): 1, (stale.task_id, 1): 1}  # the latter from the set-up
        assert (await on_chain(devnet.get_task, tampered.task_id)).status == 4
        for item in (untrusted, wrong_hash, unindexed):
            assert (await on_chain(devnet.get_task, item.task_id)).judged_mask == 0
        assert (await on_chain(devnet.get_task, stale.task_id)).judged_mask == 1
    finally:
        await run.stop()


async def test_stuck_transaction_is_replaced_and_only_one_lands(
    devnet: Devnet, database_url, kafka_bootstrap, topic_prefix, indexer: IndexerRun, service_signer
) -> None:
    """Mining paused: the verdict tx is replaced with a fee bump; the old one never lands."""
    (item,) = await on_chain(submit_tasks, devnet, 1)
    await indexer.caught_up()
    run, env = await start_relayer(
        devnet, database_url, kafka_bootstrap, topic_prefix, [service_signer.address], relayer_replace_after_seconds=1
    )
    replaced_before = metric("escrowd_relayer_tx_replaced_total", chain_id=str(devnet.chain_id))
    try:
        await on_chain(devnet.rpc, "evm_setAutomine", False)
        await publish(kafka_bootstrap, env["ESCROWD_VERDICTS_TOPIC"], [sign_verdict(make_verdict(devnet, item), service_signer.private_key)])

        async def replaced() -> bool:
            run.check_alive()
            return (await fetchval(database_url, "SELECT count(*) FROM settlement_tx_versions")) >= 2

        await wait_until(replaced, timeout=40, what="a replacement")
        versions = await fetch(
            database_url,
            "SELECT tx_hash, nonce, version, max_fee_per_gas, max_priority_fee_per_gas FROM settlement_tx_versions ORDER BY version",
        )
        assert len({v["nonce"] for v in versions}) == 1
        first, second = versions[0], versions[1]
        assert second["max_fee_per_gas"] * 100 >= first["max_fee_per_gas"] * 110
        assert second["max_priority_fee_per_gas"] * 100 >= first["max_priority_fee_per_gas"] * 110
        pool = (await on_chain(devnet.rpc, "txpool_content"))["pending"]
        in_pool = {tx["hash"] for txs in pool.values() for tx in txs.values()}
        assert first["tx_hash"] not in in_pool
        await on_chain(devnet.rpc, "evm_setAutomine", True)
        await on_chain(devnet.mine)

        async def confirmed() -> bool:
            run.check_alive()
            return (await verdict_statuses(database_url)).get(item.task_id) == "confirmed"

        await wait_until(confirmed, timeout=30, what="the replacement confirmed")
        row = (await fetch(database_url, "SELECT tx_hash FROM settlement_verdicts"))[0]
        assert row["tx_hash"] == versions[-1]["tx_hash"]
        assert (await on_chain(devnet.rpc, "eth_getTransactionReceipt", first["tx_hash"])) is None
        await on_chain(devnet.mine, 3)
        assert (await on_chain(devnet.rpc, "eth_getTransactionReceipt", first["tx_hash"])) is None
        assert (await on_chain(verdict_events, devnet)) == {(item.task_id, 1): 1}
        assert metric("escrowd_relayer_tx_replaced_total", chain_id=str(devnet.chain_id)) >= replaced_before + 1
    finally:
        await on_chain(devnet.rpc, "evm_setAutomine", True)
        await run.stop()


async def test_reorg_removing_a_confirmed_verdict_is_detected_and_resent(
    devnet: Devnet, database_url, kafka_bootstrap, topic_prefix, indexer: IndexerRun, service_signer
) -> None:
    """A reorg drops a confirmed verdict tx: the relayer notices and sends it again."""
    (item,) = await on_chain(submit_tasks, devnet, 1)
    await indexer.caught_up()
    run, env = await start_relayer(
        devnet, database_url, kafka_bootstrap, topic_prefix, [service_signer.address], confirmations=2
    )
    reorgs_before = metric("escrowd_relayer_reorgs_detected_total", chain_id=str(devnet.chain_id))
    try:
        await publish(kafka_bootstrap, env["ESCROWD_VERDICTS_TOPIC"], [sign_verdict(make_verdict(devnet, item), service_signer.private_key)])

        async def confirmed() -> bool:
            run.check_alive()
            await on_chain(devnet.mine)
            return (await verdict_statuses(database_url)).get(item.task_id) == "confirmed"

        await wait_until(confirmed, timeout=30, what="first confirmation")
        mined_block = await fetchval(database_url, "SELECT block_number FROM settlement_verdicts")
        assert (await on_chain(devnet.is_judged, item.task_id, 1))
        depth = (await on_chain(devnet.block_number)) - mined_block + 1
        await on_chain(devnet.reorg, depth)  # replaces the blocks from the verdict's one up: the tx is gone
        assert not (await on_chain(devnet.is_judged, item.task_id, 1))

        async def resent_and_confirmed() -> bool:
            run.check_alive()
            await on_chain(devnet.mine)
            rows = await fetch(database_url, "SELECT status, reorgs FROM settlement_verdicts")
            return rows[0]["reorgs"] >= 1 and rows[0]["status"] == "confirmed" and (await on_chain(devnet.is_judged, item.task_id, 1))

        await wait_until(resent_and_confirmed, timeout=30, what="resend after the reorg")
        assert (await on_chain(verdict_events, devnet)) == {(item.task_id, 1): 1}
        assert metric("escrowd_relayer_reorgs_detected_total", chain_id=str(devnet.chain_id)) >= reorgs_before + 1
        assert await fetchval(database_url, "SELECT count(*) FROM settlement_transactions") == 1
    finally:
        await run.stop()


async def test_rotating_the_verifier_key_stops_and_resumes_sending(
    devnet: Devnet, database_url, kafka_bootstrap, topic_prefix, indexer: IndexerRun, service_signer
) -> None:
    """The escrow trusts another key: verifierMatches false once the periodic check runs, no sends; back: resumes."""
    first, second = await on_chain(submit_tasks, devnet, 2)
    await indexer.caught_up()
    run, env = await start_relayer(devnet, database_url, kafka_bootstrap, topic_prefix, [service_signer.address])
    interval = run.settings.relayer_poll_interval
    url = f"http://127.0.0.1:{run.port}/health/bridge"
    mismatches_before = metric("escrowd_relayer_verifier_key_mismatch_total", chain_id=str(devnet.chain_id))
    try:
        async with httpx.AsyncClient() as client:

            async def matches(expected: bool) -> bool:
                run.check_alive()
                body = (await client.get(url)).json()
                return body["chains"][0]["verifier"]["verifierMatches"] is expected

            await wait_until(lambda: matches(True), timeout=60, what="initial match")
            await on_chain(devnet.set_marketplace_verifier, devnet.spare[2])
            # The periodic key check notices on its own (no request triggers it); how soon
            # is a speed figure, not something a test on a loaded machine can assert.
            await wait_until(lambda: matches(False), timeout=60, interval=0.02, what="mismatch seen")
            body = (await client.get(url)).json()["chains"][0]
            assert body["verifier"]["marketplaceVerifier"] == devnet.spare[2].address
            assert body["relayer"]["sending"] is False
            assert devnet.spare[2].address in body["verifier"]["reason"]
            assert body["relayer"]["pausedReason"]
            metrics_text = (await client.get(f"http://127.0.0.1:{run.port}/metrics")).text
            assert f'escrowd_relayer_verifier_key_match{{chain_id="{devnet.chain_id}"}} 0.0' in metrics_text
            assert metric("escrowd_relayer_verifier_key_mismatch_total", chain_id=str(devnet.chain_id)) == mismatches_before + 1

            await publish(
                kafka_bootstrap,
                env["ESCROWD_VERDICTS_TOPIC"],
                [sign_verdict(make_verdict(devnet, item), service_signer.private_key) for item in (first, second)],
            )

            async def queued() -> bool:
                run.check_alive()
                return len(await verdict_statuses(database_url)) == 2

            await wait_until(queued, timeout=60, what="verdicts accepted")
            # A positive marker instead of a pause: the key check runs twice more (each time
            # finding the mismatch) while the queued verdicts stay unsent.
            checks: list[str] = []

            async def checked_again() -> bool:
                body = (await client.get(url)).json()
                assert body["chains"][0]["verifier"]["verifierMatches"] is False
                if not checks or body["checkedAt"] != checks[-1]:
                    checks.append(body["checkedAt"])
                return len(checks) >= 3

            await wait_until(checked_again, timeout=60, interval=interval / 4, what="two more key checks")
            assert set((await verdict_statuses(database_url)).values()) == {"queued"}
            assert await fetchval(database_url, "SELECT count(*) FROM settlement_transactions") == 0

            await on_chain(devnet.set_marketplace_verifier, devnet.marketplace_verifier)
            await wait_until(lambda: matches(True), timeout=10, what="match again")

            async def confirmed() -> bool:
                run.check_alive()
                return set((await verdict_statuses(database_url)).values()) == {"confirmed"}

            await wait_until(confirmed, timeout=30, what="sending resumed")
            assert (await on_chain(verdict_events, devnet)) == {(first.task_id, 1): 1, (second.task_id, 1): 1}
    finally:
        await run.stop()

