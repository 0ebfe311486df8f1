"""Faults around the indexer: a misbehaving RPC, a dead RPC URL, broker and database outages.

Every test ends with the same check: the database holds exactly the chain's escrow events
and the distinct message ids on Kafka are exactly those events.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from escrowd.devnet import Devnet, deploy_devnet
from indexer.config import ChainConfig
from runtime.db import connect
from runtime.services.anvil import AnvilProcess
from runtime.services.ports import free_port
from tests.support.indexer_harness import (
    ChainLog,
    assert_db_matches_chain,
    chain_config,
    create_topic,
    escrowd_command,
    generate_task_events,
    in_process_indexer,
    proxied_tansu,
    read_topic,
    wait_for,
    wait_for_cursor,
    wait_until_published,
    write_config,
)
from tests.support.rpc_proxy import Faults, RpcFaultProxy
from tests.support.tcp_proxy import TcpProxy, postgres_upstream, proxied_database_url


@pytest.fixture
def big_devnet() -> Iterator[Devnet]:
    """A fresh devnet whose blocks can hold hundreds of escrow transactions."""
    with AnvilProcess(extra_args=("--gas-limit", "1000000000")) as anvil:
        yield deploy_devnet(anvil.rpc_url, ws_url=anvil.ws_url)


async def _assert_complete(
    database_url: str, bootstrap: str, topic: str, devnet: Devnet
) -> list[ChainLog]:
    """DB = chain, nothing left in the outbox, Kafka's distinct ids = the chain's events."""
    head = devnet.block_number()
    await wait_until_published(database_url, devnet.chain_id, head, timeout=90)
    conn = await connect(database_url)
    try:
        logs = await assert_db_matches_chain(conn, devnet, to_block=head)
    finally:
        await conn.close()
    records = await read_topic(bootstrap, topic)
    assert {r.id for r in records} == {g.id for g in logs}
    return logs


# -- a misbehaving provider -------------------------------------------------------------


async def test_rpc_errors_timeouts_refusals_and_slowness_leave_no_gap(
    big_devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """5xx/429/garbage, timeouts, slow replies, "too many results", dropped WebSockets: no gap."""
    devnet = big_devnet
    await asyncio.to_thread(generate_task_events, devnet, 4000, per_block=40)
    faults = Faults(
        error_rate=0.12,
        timeout_rate=0.03,
        hang_seconds=1.5,
        slow_rate=0.1,
        slow_seconds=0.2,
        max_logs=300,
        first=("http503", "timeout", "http429", "slow", "rpc_internal", "garbage"),
        seed=4,
    )
    topic = f"{topic_prefix}escrow.events.v1"
    await create_topic(kafka_bootstrap, topic)
    with RpcFaultProxy(devnet.rpc_url, faults) as proxy:
        chain = ChainConfig(
            **chain_config(
                devnet,
                rpc_urls=[proxy.url],
                ws_url=proxy.ws_url,
                rpc_timeout=0.5,
                finality_depth=8,
                initial_range=64,
                max_range=256,
            )
        )
        async with in_process_indexer(chain, database_url, kafka_bootstrap, topic) as running:
            await wait_for_cursor(database_url, devnet.chain_id, devnet.block_number(), timeout=120)
            running.check()
            # Refused ranges made the sizer shrink well below where it started.
            assert running.indexer.sizer.size < chain.initial_range
            assert proxy.stats.injected["too_many_results"] >= 1
            spans = proxy.stats.get_logs_spans
            assert spans[0] >= chain.initial_range and min(spans) <= 300 // 40

            # Live blocks while WebSockets keep being dropped: followed all the same.
            for _ in range(3):
                assert await asyncio.to_thread(proxy.drop_websockets) >= 0
                await asyncio.to_thread(generate_task_events, devnet, 30, per_block=10)
            await _assert_complete(database_url, kafka_bootstrap, topic, devnet)
            # A dropped subscription is opened again after the indexer's 1 s pause; polling may
            # complete the events above before that (on a quiet machine it does), so wait for
            # the reconnect rather than race it (the deadline only bounds a hung run).
            for _ in range(600):
                if proxy.stats.ws_dropped >= 1 and proxy.stats.ws_connections >= 2:
                    break
                await asyncio.sleep(0.1)
            running.check()
        injected = proxy.stats.injected
        for kind in ("http503", "http429", "rpc_internal", "garbage", "timeout", "slow"):
            assert injected[kind] >= 1, (kind, dict(injected))
        assert proxy.stats.ws_dropped >= 1 and proxy.stats.ws_connections >= 2


async def test_block_range_limit_and_logs_without_timestamps(
    big_devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """A provider capping the block span and omitting `blockTimestamp`: shrink, fetch headers."""
    devnet = big_devnet
    await asyncio.to_thread(generate_task_events, devnet, 1500, per_block=15)
    topic = f"{topic_prefix}escrow.events.v1"
    await create_topic(kafka_bootstrap, topic)
    faults = Faults(max_block_range=10, strip_block_timestamp=True)
    with RpcFaultProxy(devnet.rpc_url, faults) as proxy:
        chain = ChainConfig(
            **chain_config(
                devnet, rpc_urls=[proxy.url], finality_depth=4, initial_range=80, max_range=80
            )
        )
        async with in_process_indexer(chain, database_url, kafka_bootstrap, topic) as running:
            await _assert_complete(database_url, kafka_bootstrap, topic, devnet)
            running.check()
            assert running.indexer.sizer.size < chain.initial_range
        # Refused spans made it shrink: the backfill got through in ranges of at most 10 blocks.
        spans = proxy.stats.get_logs_spans
        assert proxy.stats.injected["block_range"] >= 1
        assert max(spans) <= 10
        assert sum(spans) >= devnet.block_number() - devnet.deploy_block - chain.finality_depth
        assert proxy.stats.injected["stripped_timestamp"] >= 1500
    # The block time came from the headers: it equals the chain's.
    conn = await connect(database_url)
    try:
        rows = await conn.fetch("SELECT DISTINCT block_number, block_timestamp FROM escrow_events")
    finally:
        await conn.close()
    for row in rows[:: max(1, len(rows) // 10)]:
        header = devnet.rpc("eth_getBlockByNumber", hex(row["block_number"]), False)
        assert row["block_timestamp"] == int(header["timestamp"], 16)


async def test_a_hostile_log_is_refused_and_fetched_again(
    big_devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """Replies whose logs carry a field of the wrong type are malformed replies: retried, never
    crashing the indexer, never stored; the events all arrive from the honest retries."""
    devnet = big_devnet
    await asyncio.to_thread(generate_task_events, devnet, 400, per_block=20)
    topic = f"{topic_prefix}escrow.events.v1"
    await create_topic(kafka_bootstrap, topic)
    with RpcFaultProxy(devnet.rpc_url, Faults(hostile_logs=3)) as proxy:
        chain = ChainConfig(
            **chain_config(devnet, rpc_urls=[proxy.url], finality_depth=4, initial_range=5, max_range=5)
        )
        async with in_process_indexer(chain, database_url, kafka_bootstrap, topic) as running:
            await _assert_complete(database_url, kafka_bootstrap, topic, devnet)
            running.check()
        assert proxy.stats.injected["hostile_log"] == 3


# -- failover ---------------------------------------------------------------------------


async def test_failover_to_the_second_rpc_url(
    big_devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """URL 1 dead from the start, then URL 2's path cut mid-run: the indexer keeps going."""
    devnet = big_devnet
    await asyncio.to_thread(generate_task_events, devnet, 600, per_block=20)
    topic = f"{topic_prefix}escrow.events.v1"
    await create_topic(kafka_bootstrap, topic)
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with TcpProxy(("127.0.0.1", int(devnet.rpc_url.rsplit(":", 1)[1]))) as flaky:
        chain = ChainConfig(
            **chain_config(
                devnet,
                rpc_urls=[dead, f"http://{flaky.address}", devnet.rpc_url],
                rpc_timeout=1.0,
                finality_depth=8,
                initial_range=5,
            )
        )
        async with in_process_indexer(chain, database_url, kafka_bootstrap, topic) as running:
            await wait_for_cursor(database_url, devnet.chain_id, devnet.block_number(), timeout=60)
            assert flaky.connections_total >= 1
            flaky.refuse()
            await asyncio.to_thread(generate_task_events, devnet, 600, per_block=20)
            await _assert_complete(database_url, kafka_bootstrap, topic, devnet)
            running.check()
            endpoints = running.indexer.rpc.endpoints
            # Marked unhealthy and never recovered (the window itself is time-based: a slow
            # run may see it lapse, so the mark, not the clock, is what is asserted).
            assert endpoints[0].failures >= 1 and endpoints[0].unhealthy_until > 0
            assert endpoints[1].failures >= 1
            assert endpoints[2].failures == 0 and endpoints[2].last_latency > 0


# -- broker outage ----------------------------------------------------------------------


async def test_broker_outage_fills_the_outbox_then_drains_it(
    big_devnet: Devnet, database_url: str, topic_prefix: str
) -> None:
    """Broker unreachable: indexing goes on into the outbox; all is published when it returns."""
    devnet = big_devnet
    topic = f"{topic_prefix}escrow.events.v1"
    with proxied_tansu() as (bootstrap, broker):
        await create_topic(bootstrap, topic)
        chain = ChainConfig(**chain_config(devnet, finality_depth=8))
        async with in_process_indexer(chain, database_url, bootstrap, topic) as running:
            await asyncio.to_thread(generate_task_events, devnet, 500, per_block=50)
            await wait_until_published(
                database_url, devnet.chain_id, devnet.block_number(), timeout=60
            )

            broker.refuse()
            await asyncio.to_thread(generate_task_events, devnet, 2000, per_block=50)
            head = devnet.block_number()
            await wait_for_cursor(database_url, devnet.chain_id, head, timeout=60)
            conn = await connect(database_url)
            try:
                # Positive marker: the publisher picked rows written during the outage (the
                # attempt is recorded before the send), so it is trying, and failing.
                async def tried() -> bool:
                    return bool(
                        await conn.fetchval(
                            "SELECT count(*) FROM event_log_messages WHERE state = 'sending'"
                        )
                    )

                await wait_for(tried, timeout=60, what="the publisher tried during the outage")
                pending = await conn.fetchval(
                    "SELECT count(*) FROM event_log_messages WHERE state <> 'published'"
                )
                assert pending == 2000
                assert not broker.listening
            finally:
                await conn.close()

            broker.resume()
            logs = await _assert_complete(database_url, bootstrap, topic, devnet)
            assert len(logs) == 2500 + 4  # + the escrow's four constructor events
            running.check()


# -- database outage --------------------------------------------------------------------


async def test_database_outage_mid_backfill(
    big_devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    """PostgreSQL unreachable mid-backfill (connections reset, new ones refused): resumes, loses nothing."""
    devnet = big_devnet
    await asyncio.to_thread(generate_task_events, devnet, 6000, per_block=30)
    head = devnet.block_number()
    topic = f"{topic_prefix}escrow.events.v1"
    await create_topic(kafka_bootstrap, topic)
    with TcpProxy(postgres_upstream(database_url)) as db_proxy:
        url = proxied_database_url(database_url, db_proxy)
        chain = ChainConfig(
            **chain_config(
                devnet, finality_depth=8, initial_range=2, max_range=4, ranges_in_flight=1
            )
        )
        async with in_process_indexer(chain, url, kafka_bootstrap, topic) as running:
            conn = await connect(database_url)
            try:

                async def started() -> bool:
                    return bool(await conn.fetchval("SELECT count(*) FROM escrow_events") > 0)

                await wait_for(started, timeout=60, interval=0.005, what="backfill started")
                cut_at = await conn.fetchval("SELECT count(*) FROM escrow_events")
                db_proxy.refuse()
                await asyncio.sleep(2.0)
                during = await conn.fetchval("SELECT count(*) FROM escrow_events")
                assert during < 6000, "the outage came too late to interrupt the backfill"
                assert during >= cut_at
                connections_before = db_proxy.connections_total
                db_proxy.resume()
                await wait_for_cursor(url, devnet.chain_id, head, timeout=90)
                assert db_proxy.connections_total > connections_before
            finally:
                await conn.close()
            await _assert_complete(database_url, kafka_bootstrap, topic, devnet)
            running.check()


# -- configuration ----------------------------------------------------------------------


def _valid_config() -> dict[str, object]:
    return {
        "database_url": "postgresql://postgres@127.0.0.1:1/x",
        "kafka_bootstrap": "127.0.0.1:1",
        "chains": [
            {
                "chain_id": 31337,
                "rpc_urls": ["http://127.0.0.1:1"],
                "escrow_addresses": ["0x5FbDB2315678afecb367f032d93F642f64180aa3"],
            }
        ],
    }


BAD_CONFIGS = {
    "chains.0.rpc_urls": lambda c: c["chains"][0].update(rpc_urls=["ftp://node"]),
    "chains.0.confirmations": lambda c: c["chains"][0].update(confirmations=-1),
    "chains.0.escrow_addresses": lambda c: c["chains"][0].update(escrow_addresses=["0x1234"]),
    "chains.0.confirmation": lambda c: c["chains"][0].update(confirmation=3),
    "database_url": lambda c: c.update(database_url="mysql://db"),
    "kafka_bootstrap": lambda c: c.pop("kafka_bootstrap"),
}


def test_bad_config_fails_at_start_up_naming_the_field(tmp_path: Path) -> None:
    """`escrowd index run --config bad.yaml` exits 2 and names the offending field (each case)."""
    import os

    import yaml

    env = {k: v for k, v in os.environ.items() if not k.startswith("ESCROWD_")}
    children: dict[str, subprocess.Popen[str]] = {}
    try:
        for i, (field, spoil) in enumerate(sorted(BAD_CONFIGS.items())):
            config = _valid_config()
            spoil(config)
            path = tmp_path / f"bad{i}.yaml"
            path.write_text(yaml.safe_dump({"indexer": config}), encoding="utf-8")
            children[field] = subprocess.Popen(
                [*escrowd_command(), "index", "run", "--config", str(path)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
        for field, child in children.items():
            _, stderr = child.communicate(timeout=60)
            assert child.returncode == 2, (field, stderr)
            assert "invalid configuration" in stderr
            assert f"{field}:" in stderr, (field, stderr)  # the field is named
    finally:
        for child in children.values():
            if child.poll() is None:
                child.kill()
                child.wait()


def test_a_valid_config_file_is_accepted_by_the_loader(tmp_path: Path) -> None:
    """The harness's generated YAML parses (the bad-config cases differ from it in one field)."""
    from indexer.config import load_settings

    path = write_config(
        tmp_path / "ok.yaml",
        database_url="postgresql://postgres@127.0.0.1:1/x",
        kafka_bootstrap="127.0.0.1:1",
        topic="t.escrow.events.v1",
        chains=[_valid_config()["chains"][0]],  # type: ignore[index]
    )
    settings = load_settings(path)
    assert settings.chains[0].chain_id == 31337
    assert settings.events_topic == "t.escrow.events.v1"
