"""The relayer's consumer takes its partitions directly and keeps its offsets with its verdicts."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from escrowd.devnet import Devnet
from runtime.services.ports import free_port
from tests.settlement.conftest import (
    IndexerRun,
    RelayerRun,
    fetchval,
    on_chain,
    publish,
    relayer_env,
    settings_from_env,
    signed_verdicts,
    submit_tasks,
    verdict_statuses,
    wait_until,
)

pytestmark = pytest.mark.timeout(120)


async def test_offsets_commit_with_the_verdicts_and_a_restart_resumes_after_them(
    devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str, indexer: IndexerRun, service_signer
) -> None:
    """Offsets in PostgreSQL cover exactly the verdicts stored; a new process replays none of them."""
    items = await on_chain(submit_tasks, devnet, 3)
    await indexer.caught_up()
    env = relayer_env(
        devnet=devnet,
        database_url=database_url,
        kafka_bootstrap=kafka_bootstrap,
        topic_prefix=topic_prefix,
        trusted=[service_signer.address],
    )
    settings = settings_from_env(env)
    assert settings.relayer_consumer_assignment == "direct"
    consumer = settings.relayer_consumer_group
    topic = env["ESCROWD_VERDICTS_TOPIC"]
    verdicts = signed_verdicts(devnet, items, service_signer)

    def duplicates() -> float:
        return REGISTRY.get_sample_value(
            "escrowd_consumer_messages_total", {"consumer": consumer, "outcome": "duplicate"}
        ) or 0.0

    async def offsets_total() -> int:
        value = await fetchval(
            database_url,
            "SELECT coalesce(sum(next_offset), 0) FROM consumer_offsets WHERE consumer = $1 AND topic = $2",
            consumer,
            topic,
        )
        return int(value)

    async def stored(n: int) -> bool:
        return len(await verdict_statuses(database_url)) == n

    first = RelayerRun(settings)
    await first.start()
    try:
        await publish(kafka_bootstrap, topic, verdicts[:2])
        await wait_until(lambda: stored(2), timeout=60, what="two verdicts stored")
        # Every partition starts at offset 0: the offsets add up to the messages applied.
        await wait_until(lambda: _equals(offsets_total(), 2), timeout=30, what="offsets stored")
    finally:
        await first.stop()
    assert await offsets_total() == 2

    replays_before = duplicates()
    # The same settings on a new HTTP port (the first server's socket may linger).
    second = RelayerRun(settings.model_copy(update={"relayer_port": free_port()}))
    await second.start()
    try:
        await publish(kafka_bootstrap, topic, verdicts[2:])
        await wait_until(lambda: stored(3), timeout=60, what="third verdict stored")
        await wait_until(lambda: _equals(offsets_total(), 3), timeout=30, what="offsets advanced")

        async def all_confirmed() -> bool:
            second.check_alive()
            return set((await verdict_statuses(database_url)).values()) == {"confirmed"}

        await wait_until(all_confirmed, timeout=60, what="every verdict confirmed")
    finally:
        await second.stop()
    # The new process started after the stored offsets: nothing was consumed twice.
    assert duplicates() == replays_before
    assert await fetchval(database_url, "SELECT count(*) FROM consumer_inbox WHERE consumer = $1", consumer) == 3


async def _equals(value: object, expected: int) -> bool:
    return await value == expected  # type: ignore[misc]
