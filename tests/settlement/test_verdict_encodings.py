"""A verdict has one signature: the relayer refuses its other encodings, and sends the verdict itself.

The v = 0/1 form (the bare recovery id) and the high-s twin of a valid verdict signature both
recover the service key in eth_account; the relayer used to send the first. Through the
relayer process on anvil, PostgreSQL and Kafka: both are recorded as `bad_signature` and
never sent, and the canonical signature of the same verdict (same message id) then lands once.
"""

from __future__ import annotations

import pytest

from escrowd.devnet import Devnet
from schemas.verdict import sign_verdict
from tests.settlement.conftest import (
    IndexerRun,
    RelayerRun,
    fetch,
    fetchval,
    make_verdict,
    on_chain,
    publish,
    relayer_env,
    settings_from_env,
    submit_tasks,
    verdict_events,
    verdict_statuses,
    wait_until,
)

pytestmark = pytest.mark.timeout(120)
N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141


async def test_other_encodings_of_a_verdict_signature_are_refused_and_never_sent(
    devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str, indexer: IndexerRun, service_signer
) -> None:
    bare_item, twin_item = await on_chain(submit_tasks, devnet, 2, prefix="enc")
    await indexer.caught_up()
    env = relayer_env(devnet=devnet, database_url=database_url, kafka_bootstrap=kafka_bootstrap,
                      topic_prefix=topic_prefix, trusted=[service_signer.address])  # fmt: skip
    run = RelayerRun(settings_from_env(env))
    await run.start()
    try:
        bare_good = sign_verdict(make_verdict(devnet, bare_item, score=77), service_signer.private_key)
        twin_good = sign_verdict(make_verdict(devnet, twin_item, score=66), service_signer.private_key)
        raw = bytes.fromhex(bare_good.signature[2:])
        bare = bare_good.model_copy(update={"signature": "0x" + (raw[:64] + bytes([raw[64] - 27])).hex()})
        raw = bytes.fromhex(twin_good.signature[2:])
        s = int.from_bytes(raw[32:64], "big")
        twin = twin_good.model_copy(
            update={"signature": "0x" + (raw[:32] + (N - s).to_bytes(32, "big") + bytes([55 - raw[64]])).hex()}
        )
        await publish(kafka_bootstrap, env["ESCROWD_VERDICTS_TOPIC"], [bare, twin])

        async def both_refused() -> bool:
            run.check_alive()
            return len(await fetch(database_url, "SELECT task_id FROM settlement_rejections")) == 2

        await wait_until(both_refused, timeout=40, what="two rejections")
        rows = await fetch(database_url, "SELECT task_id, reason FROM settlement_rejections")
        assert {int(r["task_id"]): r["reason"] for r in rows} == {
            bare_item.task_id: "bad_signature",
            twin_item.task_id: "bad_signature",
        }
        assert await fetchval(database_url, "SELECT count(*) FROM settlement_transactions") == 0

        await publish(kafka_bootstrap, env["ESCROWD_VERDICTS_TOPIC"], [bare_good, twin_good])

        async def both_confirmed() -> bool:
            run.check_alive()
            statuses = await verdict_statuses(database_url)
            return statuses.get(bare_item.task_id) == statuses.get(twin_item.task_id) == "confirmed"

        await wait_until(both_confirmed, timeout=40, what="the canonical verdicts confirmed")
        events = await on_chain(verdict_events, devnet)
        assert events == {(bare_item.task_id, 1): 1, (twin_item.task_id, 1): 1}
    finally:
        await run.stop()
