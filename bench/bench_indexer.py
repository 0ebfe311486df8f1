"""Indexer benchmark: backfill throughput against raw `eth_getLogs`, and head latency.

`python -m bench.bench_indexer [--events N]` prints one JSON object on stdout (progress goes
to stderr). In one run it:

1. mines N escrow events on a fresh anvil (`createTask`, `--per-block` per block);
2. (a) fetches the same block range with plain `eth_getLogs` over aiohttp (several range
   sizes and concurrencies; the best is the baseline);
3. the `raw_pipeline` ceiling, before each round of (b): the plumbing with no logic in one
   interpreter, overlapping — (a)'s best shape of `eth_getLogs` → the rows binary-`COPY`ed
   into a table of the event log's shape, one transaction per 10,000 → each committed row's
   bytes produced with the publisher's batching and keys, acks awaited → read back and
   counted (`measure_raw_pipeline`);
4. (b) runs `escrowd index run` (a child process, the real CLI) from an empty database until
   every event is in PostgreSQL and published to Kafka: the end-to-end rate. With
   `--publisher inline` the indexer publishes itself (the default configuration); with
   `--publisher process` it runs with `run_publisher: false` next to an `escrowd index
   publish` child; `--publisher both` (the default) runs `--pairs` pairs of the two, back to
   back on the same chain, each on a fresh database and topic, and prints both;
5. (c) exports the same transactions' receipts and logs with ethereum-etl in a Python 3.10
   virtualenv, when it installs (otherwise the reason is recorded);
6. head latency: on a second, fresh anvil, a steady load of blocks (`--head-tx-per-block`
   transactions every `--head-interval` seconds) with `confirmations: 0`; for each block, the
   time from `evm_mine` returning to the block's last event being read from Kafka.

`--chains` measures only 1, 2 and 4 chains (`--chain-events` each, on anvils of their own)
in one `escrowd index run` against one process per chain on the same database.

Services: `DATABASE_URL` / `KAFKA_BOOTSTRAP` when set, else the embedded PostgreSQL and a
Tansu broker from `runtime.services`. Targets: (b) ≥ 0.5 × (a), ≥ 0.7 × `raw_pipeline` end
to end and into PostgreSQL; head p50 ≤ 20 ms, p99 ≤ 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import platform
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from bench.services import with_services
from escrowd.devnet import Devnet, deploy_devnet
from escrowd.harness import (
    IndexerProcess,
    chain_config,
    escrowd_command,
    generate_task_events,
    read_topic,
    rpc,
    rpc_batch,
    write_config,
)
from indexer.store import EVENT_COLUMNS
from runtime.db import connect, migrate_url
from runtime.kafka import TopicSpec, ensure_topics, make_producer, start_producer
from runtime.logging import configure_logging
from runtime.outbox import KeyPartitioner, send_batches, unpublished
from runtime.services.anvil import AnvilProcess, anvil_binary
from runtime.services.kafka import KafkaService
from runtime.services.postgres import PostgresService
from schemas.events import message_key

ETL_PYTHON = Path("/root/.pyenv/versions/3.10.13/bin/python")


def say(message: str) -> None:
    """Progress on stderr (stdout carries only the result)."""
    print(f"[bench_indexer] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- (a) raw


async def raw_get_logs(
    url: str, address: str, start: int, end: int, span: int, in_flight: int
) -> tuple[int, float]:
    """Fetch [start, end] in `span`-block ranges, `in_flight` at a time; (logs, seconds)."""
    ranges = [(a, min(end, a + span - 1)) for a in range(start, end + 1, span)]
    queue: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
    for r in ranges:
        queue.put_nowait(r)
    total = 0
    connector = aiohttp.TCPConnector(limit=in_flight)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            nonlocal total
            while not queue.empty():
                a, b = queue.get_nowait()
                body = orjson.dumps(
                    {
                        "jsonrpc": "2.0",
                        "id": 1,
                        "method": "eth_getLogs",
                        "params": [{"address": address, "fromBlock": hex(a), "toBlock": hex(b)}],
                    }
                )
                async with session.post(
                    url, data=body, headers={"Content-Type": "application/json"}
                ) as reply:
                    logs = orjson.loads(await reply.read())["result"]
                total += len(logs)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(in_flight)))
        return total, time.perf_counter() - started


async def measure_raw(devnet: Devnet, start: int, end: int, events: int) -> dict[str, Any]:
    """Several shapes of plain `eth_getLogs`; the best logs/s is the baseline."""
    shapes = [(end - start + 1, 1), (1, 1), (1, 4), (10, 4), (50, 4)]
    results = []
    for span, in_flight in shapes:
        best = 0.0
        for _ in range(2):
            logs, seconds = await raw_get_logs(
                devnet.rpc_url, devnet.escrow_address, start, end, span, in_flight
            )
            assert logs == events, (logs, events)
            best = max(best, logs / seconds)
        results.append({"range_blocks": span, "in_flight": in_flight, "logs_per_s": round(best)})
        say(f"raw eth_getLogs span={span} in_flight={in_flight}: {best:,.0f} logs/s")
    top = max(results, key=lambda r: r["logs_per_s"])
    return {"best_logs_per_s": top["logs_per_s"], "best_shape": top, "shapes": results}


# ---------------------------------------------------------------------------- raw pipeline

_RAW_HEADERS = (
    ("ce_specversion", b"1.0"),
    ("ce_source", b"bench/raw_pipeline"),
    ("ce_type", b"raw.log"),
    ("content-type", b"application/json"),
)


def raw_rows(logs: list[dict[str, Any]], chain_id: int, first_position: int) -> list[tuple[Any, ...]]:
    """The log's own fields as rows of the event log's shape: no ABI decoding, only the
    hex quantities as integers (the column types), `data` as the `args` JSON text."""
    return [
        (
            f"{chain_id}:{log['blockHash']}:{log['logIndex']}",
            chain_id,
            log["address"],
            int(log["blockNumber"], 16),
            log["blockHash"],
            int(log.get("blockTimestamp") or "0x0", 16),
            log["transactionHash"],
            int(log["transactionIndex"], 16),
            int(log["logIndex"], 16),
            log["topics"][0],
            int(log["topics"][1], 16) if len(log["topics"]) > 1 else None,
            '"' + log["data"] + '"',
            first_position + i,
        )
        for i, log in enumerate(logs)
    ]


async def measure_raw_pipeline(
    devnet: Devnet,
    database_url: str,
    bootstrap: str,
    start: int,
    end: int,
    events: int,
    *,
    span: int,
    in_flight: int,
    commit_size: int = 10_000,
    batch_size: int = 2_000,
) -> dict[str, Any]:
    """The plumbing with no logic, as one overlapping pipeline in this interpreter.

    Raw `eth_getLogs` (the best shape of (a): `span` blocks per request, `in_flight` at a
    time) → the rows binary-`COPY`ed into a table shaped like the event log (same columns,
    same indexes), one transaction per `commit_size` rows → each committed row's bytes (the
    log's JSON) produced to a fresh topic with the publisher's batching (`send_batches`,
    `batch_size` per batch, one record batch per partition, the next batch sent while the
    previous one's acks are awaited) and the indexer's keys (chain:task) → every record read
    back and counted. Fetch, write and produce run concurrently, as in the indexer.
    """
    topic = f"raw{secrets.token_hex(3)}.pipeline.v1"
    await ensure_topics(bootstrap, [TopicSpec(topic, 4)])
    conn = await connect(database_url)
    await conn.execute("CREATE TABLE raw_pipeline_log (LIKE escrow_events INCLUDING ALL)")
    producer = make_producer(bootstrap, client_id="bench-raw-pipeline")
    await start_producer(producer)
    chain_id = devnet.chain_id
    ranges = [(a, min(end, a + span - 1)) for a in range(start, end + 1, span)]
    committed: asyncio.Queue[list[tuple[Any, ...]] | None] = asyncio.Queue()
    value_bytes = 0
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=in_flight)) as session:

            async def fetch(a: int, b: int) -> list[dict[str, Any]]:
                body = orjson.dumps(
                    {
                        "jsonrpc": "2.0",
                        "id": 1,
                        "method": "eth_getLogs",
                        "params": [{"address": devnet.escrow_address, "fromBlock": hex(a), "toBlock": hex(b)}],
                    }
                )
                async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as reply:
                    result: list[dict[str, Any]] = orjson.loads(await reply.read())["result"]
                    return result

            async def write() -> None:
                # Fetches run `in_flight` ahead of the range being written, in block order.
                ahead: collections.deque[asyncio.Task[list[dict[str, Any]]]] = collections.deque()
                pending = iter(ranges)
                position = 0
                buffered: list[dict[str, Any]] = []

                async def commit(logs: list[dict[str, Any]]) -> None:
                    nonlocal position
                    rows = raw_rows(logs, chain_id, position + 1)
                    position += len(rows)
                    async with conn.transaction():
                        await conn.copy_records_to_table(
                            "raw_pipeline_log", columns=EVENT_COLUMNS, records=rows
                        )
                    committed.put_nowait(list(zip(logs, rows, strict=True)))

                while True:
                    while len(ahead) < in_flight:
                        r = next(pending, None)
                        if r is None:
                            break
                        ahead.append(asyncio.create_task(fetch(*r)))
                    if not ahead:
                        break
                    buffered.extend(await ahead.popleft())
                    while len(buffered) >= commit_size:
                        await commit(buffered[:commit_size])
                        del buffered[:commit_size]
                if buffered:
                    await commit(buffered)
                committed.put_nowait(None)

            async def produce() -> None:
                nonlocal value_bytes
                partitioner = KeyPartitioner()
                previous: asyncio.Future[Any] | None = None
                while (pairs := await committed.get()) is not None:
                    for i in range(0, len(pairs), batch_size):
                        items = []
                        for log, row in pairs[i : i + batch_size]:
                            value = orjson.dumps(log)
                            value_bytes += len(value)
                            items.append(
                                (
                                    topic,
                                    message_key(chain_id, row[10], row[2]),
                                    value,
                                    [*_RAW_HEADERS, ("ce_id", row[0].encode())],
                                )
                            )
                        acks = await send_batches(producer, items, partitioner)
                        if previous is not None:
                            await previous
                        previous = acks
                if previous is not None:
                    await previous

            url = devnet.rpc_url
            started, cpu = time.perf_counter(), time.process_time()
            writer = asyncio.create_task(write())
            producing = asyncio.create_task(produce())
            await writer
            into_db = time.perf_counter() - started
            await producing
            e2e = time.perf_counter() - started
            cpu = time.process_time() - cpu
        stored = await conn.fetchval("SELECT count(*) FROM raw_pipeline_log")
    finally:
        await producer.stop()
        await conn.close()
    assert stored == events, (stored, events)
    records = await read_topic(bootstrap, topic, timeout=600)
    distinct = len({r.id for r in records})
    assert len(records) == distinct == events, (len(records), distinct, events)
    say(
        f"raw pipeline: {events:,} rows COPYed in {into_db:.2f}s, all on Kafka after {e2e:.2f}s"
        f" ({events / e2e:,.0f} events/s)"
    )
    return {
        "events": events,
        "range_blocks": span,
        "in_flight": in_flight,
        "commit_rows": commit_size,
        "batch_messages": batch_size,
        "into_postgres_s": round(into_db, 3),
        "end_to_end_s": round(e2e, 3),
        "postgres_events_per_s": round(events / into_db),
        "events_per_s": round(events / e2e),
        "value_bytes_avg": round(value_bytes / events),
        # CPU of this interpreter (every thread) per event: steadier than wall time on a
        # loaded machine, and what the indexer's process is compared on.
        "cpu_us_per_event": round(cpu / events * 1e6, 2),
        "kafka_records": len(records),
    }


# ---------------------------------------------------------------------------- (b) indexer


class ProfiledIndexerProcess(IndexerProcess):
    """`escrowd index run` under cProfile: the stats go to `profile` when it stops (SIGTERM
    makes the CLI return normally, so the profiler writes its file)."""

    def __init__(self, config: Path, profile: Path) -> None:
        super().__init__(config)
        self.profile = profile

    def start(self) -> ProfiledIndexerProcess:
        """Start the child under `python -m cProfile -o PROFILE -m escrowd.cli`."""
        with self.log_path.open("ab") as out:
            profiler = [sys.executable, "-m", "cProfile", "-o", str(self.profile)]
            self._proc = subprocess.Popen(
                [*profiler, "-m", "escrowd.cli", "index", "run", "--config", str(self.config)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
            )
        self.starts += 1
        return self


def process_cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of a process so far (Linux `/proc`), None when unknown."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # After the command name: state is field 3, utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def profile_summary(path: Path, top: int = 25) -> list[dict[str, Any]]:
    """The `top` functions by own time (tottime) in a cProfile stats file."""
    import pstats

    stats = pstats.Stats(str(path))
    rows = []
    for (file, line, name), (_cc, calls, tottime, cumtime, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append(
            {
                "function": f"{Path(file).name}:{line}({name})",
                "calls": calls,
                "tottime_s": round(tottime, 3),
                "cumtime_s": round(cumtime, 3),
            }
        )
    total = sum(r["tottime_s"] for r in rows)
    rows.sort(key=lambda r: r["tottime_s"], reverse=True)
    return [{**r, "share": round(r["tottime_s"] / total, 3)} for r in rows[:top]]


def start_publisher(config: Path, log_path: Path) -> subprocess.Popen[bytes]:
    """`escrowd index publish --config FILE` as a child process, output to `log_path`."""
    with log_path.open("wb") as out:
        return subprocess.Popen(
            [*escrowd_command(), "index", "publish", "--config", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def stop_publisher(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM and wait (SIGKILL after 15 s)."""
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


async def measure_indexer(
    devnet: Devnet,
    database_url: str,
    bootstrap: str,
    head: int,
    events: int,
    workdir: Path,
    chain: dict[str, Any],
    publisher: str = "inline",
    profile: Path | None = None,
) -> dict[str, Any]:
    """`escrowd index run` from an empty database until every event is published.

    `publisher`: "inline" (the indexer's own publisher) or "process" (`run_publisher: false`
    and an `escrowd index publish` child on the same config file, started together)."""
    topic = f"bench{secrets.token_hex(3)}.escrow.events.v1"
    await ensure_topics(bootstrap, [TopicSpec(topic, 4)])
    config = write_config(
        workdir / "backfill.yaml",
        database_url=database_url,
        kafka_bootstrap=bootstrap,
        topic=topic,
        chains=[chain_config(devnet, **chain)],
        topic_partitions=4,
        run_publisher=publisher == "inline",
    )
    process = IndexerProcess(config) if profile is None else ProfiledIndexerProcess(config, profile)
    publisher_proc: subprocess.Popen[bytes] | None = None
    publisher_log = workdir / f"publisher-{secrets.token_hex(3)}.log"
    conn = await connect(database_url)
    try:
        process.start()
        if publisher == "process":
            publisher_proc = start_publisher(config, publisher_log)
        t_cursor = t_db = t_all = t_first = None
        cpu_at_cursor = cpu_at_end = None
        launched = time.perf_counter()
        while t_all is None:
            if not process.running:
                raise RuntimeError(f"indexer exited:\n{process.output()}")
            if publisher_proc is not None and publisher_proc.poll() is not None:
                tail = publisher_log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"publisher exited:\n{tail}")
            row = await conn.fetchrow(
                "SELECT block_number FROM chain_cursor WHERE chain_id = $1", devnet.chain_id
            )
            now = time.perf_counter()
            if row is not None and t_cursor is None:
                t_cursor = now
                cpu_at_cursor = process_cpu_seconds(process.pid)
            if t_first is None and await conn.fetchval("SELECT EXISTS (SELECT 1 FROM escrow_events)"):
                t_first = now
            if row is not None and row["block_number"] >= head and t_db is None:
                t_db = now
            if t_db is not None:
                # EXISTS stops at the first row past the watermark: a count(*) of a large
                # backlog every poll would load PostgreSQL enough to skew what is measured.
                pending = await unpublished(conn)
                if not pending:
                    t_all = time.perf_counter()
                    cpu_at_end = process_cpu_seconds(process.pid)
            if now - launched > 1800:
                raise RuntimeError("indexer did not finish in 30 minutes")
            await asyncio.sleep(0.05)
        stored = await conn.fetchval("SELECT count(*) FROM escrow_events")
        published = await conn.fetchval(
            "SELECT count(*) FROM escrow_events e JOIN event_log_watermarks w"
            " ON w.chain_id = e.chain_id AND e.position <= w.published_through"
        )
    finally:
        if publisher_proc is not None:
            stop_publisher(publisher_proc)
        process.terminate()
        process.cleanup()
        await conn.close()
    assert t_cursor is not None and t_db is not None
    assert stored >= events and published == stored, (stored, published, events)
    records = await read_topic(bootstrap, topic, timeout=600)
    distinct = len({r.id for r in records})
    assert distinct == stored, (distinct, stored)
    e2e = t_all - t_cursor
    into_db = t_db - t_cursor
    say(
        f"indexer (publisher {publisher}): {stored:,} events into PostgreSQL in {into_db:.2f}s, all published after {e2e:.2f}s"
    )
    return {
        "publisher": publisher,
        "events": stored,
        "startup_s": round(t_cursor - launched, 2),
        # Launch of the CLI to the first events committed (process start-up included).
        "start_to_first_events_commit_s": round((t_first or t_all) - launched, 2),
        "cursor_to_first_events_commit_s": round((t_first or t_all) - t_cursor, 2),
        "into_postgres_s": round(into_db, 3),
        "end_to_end_s": round(e2e, 3),
        "postgres_events_per_s": round(stored / into_db),
        "end_to_end_events_per_s": round(stored / e2e),
        # The `escrowd index run` process's CPU from its first cursor to the last publish
        # (the inline publisher's included; with `--publisher process` the publisher's not).
        "indexer_cpu_us_per_event": (
            round((cpu_at_end - cpu_at_cursor) / stored * 1e6, 2)
            if cpu_at_end is not None and cpu_at_cursor is not None
            else None
        ),
        "kafka_records": len(records),
        "kafka_distinct_ids": distinct,
        "config": chain,
    }


# ---------------------------------------------------------------------------- many chains


async def measure_chains(
    devnets: list[Devnet],
    database_url: str,
    bootstrap: str,
    heads: list[int],
    workdir: Path,
    chain: dict[str, Any],
    layout: str,
) -> dict[str, Any]:
    """Index `devnets` from an empty database until every event is on Kafka, either in one
    `escrowd index run` following every chain (`layout` "one") or one process per chain
    (`layout` "each", on the same database: one publisher holds the lock, the others wait
    as standbys). The rate is every chain's events over the time from every chain having a
    cursor (start-up done) to the last one published."""
    topic = f"bench{secrets.token_hex(3)}.escrow.events.v1"
    await ensure_topics(bootstrap, [TopicSpec(topic, 4)])
    configs = [chain_config(d, **chain) for d in devnets]
    groups = [configs] if layout == "one" else [[c] for c in configs]
    processes = [
        IndexerProcess(
            write_config(
                workdir / f"chains-{layout}-{n}.yaml",
                database_url=database_url,
                kafka_bootstrap=bootstrap,
                topic=topic,
                chains=group,
                topic_partitions=4,
            )
        )
        for n, group in enumerate(groups)
    ]
    wanted = {d.chain_id: head for d, head in zip(devnets, heads, strict=True)}
    conn = await connect(database_url)
    try:
        for process in processes:
            process.start()
        t_started = t_db = t_all = None
        launched = time.perf_counter()
        while t_all is None:
            for process in processes:
                if not process.running:
                    raise RuntimeError(f"indexer exited:\n{process.output()}")
            rows = await conn.fetch("SELECT chain_id, block_number FROM chain_cursor")
            now = time.perf_counter()
            cursors = {r["chain_id"]: r["block_number"] for r in rows}
            if t_started is None and cursors.keys() >= wanted.keys():
                t_started = now
            if t_db is None and all(cursors.get(c, -1) >= h for c, h in wanted.items()):
                t_db = now
            if t_db is not None and not await unpublished(conn):
                t_all = time.perf_counter()
            if now - launched > 1800:
                raise RuntimeError("the indexers did not finish in 30 minutes")
            await asyncio.sleep(0.05)
        stored = await conn.fetchval("SELECT count(*) FROM escrow_events")
    finally:
        for process in processes:
            process.terminate()
            process.cleanup()
        await conn.close()
    assert t_started is not None and t_db is not None
    records = await read_topic(bootstrap, topic, timeout=600)
    distinct = len({r.id for r in records})
    assert distinct == stored, (distinct, stored)
    e2e = t_all - t_started
    say(f"{len(devnets)} chain(s), {layout} process(es): {stored:,} events on Kafka after {e2e:.2f}s")
    return {
        "chains": len(devnets),
        "processes": len(processes),
        "events": stored,
        "into_postgres_s": round(t_db - t_started, 3),
        "end_to_end_s": round(e2e, 3),
        "end_to_end_events_per_s": round(stored / e2e),
    }


async def many_chains(
    args: argparse.Namespace, pg: PostgresService, kafka: KafkaService, workdir: Path
) -> dict[str, Any]:
    """1, 2 and 4 chains (`--chain-events` each), one process for all against one per chain,
    alternating which goes first, `--chain-rounds` times."""
    counts = [1, 2, 4]
    with contextlib.ExitStack() as stack:
        anvils = [
            stack.enter_context(
                AnvilProcess(chain_id=31337 + n, extra_args=("--gas-limit", "2000000000"))
            )
            for n in range(max(counts))
        ]
        devnets = [deploy_devnet(a.rpc_url, ws_url=a.ws_url) for a in anvils]
        say(f"mining {args.chain_events:,} events on each of {len(devnets)} chains")
        heads = await asyncio.gather(
            *(
                asyncio.to_thread(generate_task_events, d, args.chain_events, per_block=args.per_block)
                for d in devnets
            )
        )
        chain = {"finality_depth": args.finality_depth, "rpc_timeout": 60.0}
        runs: list[dict[str, Any]] = []
        for n in range(args.chain_rounds):
            for count in counts:
                layouts = ["one", "each"] if n % 2 == 0 else ["each", "one"]
                for layout in layouts if count > 1 else ["one"]:
                    runs.append(
                        await measure_chains(
                            devnets[:count],
                            await fresh_database(pg),
                            kafka.bootstrap,
                            list(heads[:count]),
                            workdir,
                            chain,
                            layout,
                        )
                    )
    summary: dict[str, list[int]] = {}
    for r in runs:
        name = f"{r['chains']}_chains_" + ("one_process" if r["processes"] == 1 else "process_per_chain")
        summary.setdefault(name, []).append(r["end_to_end_events_per_s"])
    return {"events_per_chain": args.chain_events, "events_per_s": summary, "runs": runs}


# ---------------------------------------------------------------------------- (c) ethereum-etl


def measure_etl(
    devnet: Devnet, start: int, end: int, max_tx: int, workdir: Path, venv: Path | None
) -> dict[str, Any]:
    """ethereum-etl `export_receipts_and_logs` over (the first `max_tx`) transactions of the range.

    It fetches one receipt per transaction, which anvil serves slowly from large blocks, so
    a subset keeps the run short; the rate is what matters.
    """
    python = ETL_PYTHON
    if not python.is_file():
        return {"skipped": f"no Python 3.10 at {python}"}
    env_dir = venv or workdir / "etl-venv"
    etl = env_dir / "bin" / "ethereumetl"
    if not etl.is_file():
        say("installing ethereum-etl into a Python 3.10 virtualenv")
        try:
            subprocess.run(
                [str(python), "-m", "venv", str(env_dir)],
                check=True,
                capture_output=True,
                timeout=300,
            )
            subprocess.run(
                [str(env_dir / "bin" / "pip"), "install", "-q", "ethereum-etl"],
                check=True,
                capture_output=True,
                timeout=900,
            )
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            tail = getattr(exc, "stderr", b"") or b""
            return {
                "skipped": f"ethereum-etl did not install: {tail.decode(errors='replace')[-300:]}"
            }
    logs = rpc(
        devnet.rpc_url,
        "eth_getLogs",
        [{"address": devnet.escrow_address, "fromBlock": hex(start), "toBlock": hex(end)}],
    )
    hashes = list(dict.fromkeys(log["transactionHash"] for log in logs))[:max_tx]
    (workdir / "tx_hashes.txt").write_text("\n".join(hashes) + "\n", encoding="utf-8")
    started = time.perf_counter()
    result = subprocess.run(
        [
            str(etl),
            "export_receipts_and_logs",
            "--transaction-hashes",
            str(workdir / "tx_hashes.txt"),
            "--provider-uri",
            devnet.rpc_url,
            "--receipts-output",
            str(workdir / "receipts.csv"),
            "--logs-output",
            str(workdir / "logs.csv"),
            "--batch-size",
            "100",
            "--max-workers",
            "4",
        ],
        capture_output=True,
        timeout=3600,
        check=False,
    )
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        return {"skipped": f"ethereum-etl failed: {result.stderr.decode(errors='replace')[-300:]}"}
    with (workdir / "logs.csv").open("rb") as f:
        exported = sum(1 for _ in f) - 1
    escrow = devnet.escrow_address.lower()
    with (workdir / "logs.csv").open(encoding="utf-8") as f:
        escrow_logs = sum(1 for line in f if escrow in line.lower())
    say(f"ethereum-etl: {exported:,} logs ({escrow_logs:,} escrow) in {seconds:.2f}s")
    return {
        "command": "export_receipts_and_logs --batch-size 100 --max-workers 4",
        "transactions": len(hashes),
        "logs_exported": exported,
        "escrow_logs_exported": escrow_logs,
        "seconds": round(seconds, 2),
        "logs_per_s": round(exported / seconds),
        "escrow_events_per_s": round(escrow_logs / seconds),
    }


# ---------------------------------------------------------------------------- head latency


class BlockLoad(threading.Thread):
    """Mines a block of `per_block` createTask transactions every `interval` seconds."""

    def __init__(self, devnet: Devnet, per_block: int, interval: float, blocks: int) -> None:
        super().__init__(name="block-load", daemon=True)
        self.devnet = devnet
        self.per_block = per_block
        self.interval = interval
        self.blocks = blocks
        self.mined_at: dict[int, float] = {}
        self.mined_wall: dict[int, float] = {}
        self.mine_call_s: list[float] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            dn = self.devnet
            url = dn.rpc_url
            data = dn._codec.encode_call("createTask", [b"\x42" * 32, 1, 2**40])
            posters = dn.posters
            nonces = [
                int(n, 16)
                for n in rpc_batch(
                    url, [("eth_getTransactionCount", [p.address, "pending"]) for p in posters]
                )
            ]
            rpc(url, "evm_setAutomine", [False])
            number = int(rpc(url, "eth_blockNumber"), 16)
            next_at = time.perf_counter()
            for _ in range(self.blocks):
                calls = []
                for i in range(self.per_block):
                    k = i % len(posters)
                    tx = {
                        "from": posters[k].address,
                        "to": dn.escrow_address,
                        "data": data,
                        "gas": hex(200_000),
                    }
                    tx["nonce"] = hex(nonces[k])
                    nonces[k] += 1
                    calls.append(("eth_sendTransaction", [tx]))
                rpc_batch(url, calls)
                before = time.perf_counter()
                rpc(url, "evm_mine")
                after = time.perf_counter()
                number += 1
                self.mined_at[number] = after
                self.mined_wall[number] = time.time()
                self.mine_call_s.append(after - before)
                next_at += self.interval
                time.sleep(max(0.0, next_at - time.perf_counter()))
        except BaseException as exc:
            self.error = exc


async def outbox_stages(database_url: str, mined_wall: dict[int, float]) -> dict[str, float]:
    """Median wall-clock time from mining to the event rows' insert (the indexer's
    transaction start), per block. (The log keeps no per-row publish time: the time to
    Kafka is the latency measured above.)"""
    conn = await connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT block_number, extract(epoch FROM max(indexed_at))::float8 AS stored"
            " FROM escrow_events GROUP BY block_number"
        )
    finally:
        await conn.close()
    stored = []
    for row in rows:
        mined = mined_wall.get(row["block_number"])
        if mined is not None:
            stored.append((row["stored"] - mined) * 1000.0)
    if not stored:
        return {}
    return {"mined_to_indexer_commit_start": round(statistics.median(stored), 2)}


async def measure_head_latency(
    database_url: str,
    bootstrap: str,
    workdir: Path,
    *,
    per_block: int,
    interval: float,
    blocks: int,
) -> dict[str, Any]:
    """Block mined → its events readable from Kafka, under a steady load, confirmations 0."""
    topic = f"bench{secrets.token_hex(3)}.escrow.events.v1"
    await ensure_topics(bootstrap, [TopicSpec(topic, 4)])
    with AnvilProcess(extra_args=("--gas-limit", "1000000000")) as anvil:
        devnet = deploy_devnet(anvil.rpc_url, ws_url=anvil.ws_url)
        config = write_config(
            workdir / "head.yaml",
            database_url=database_url,
            kafka_bootstrap=bootstrap,
            topic=topic,
            chains=[chain_config(devnet, ws_url=anvil.ws_url, confirmations=0, poll_interval=0.5)],
            topic_partitions=4,
        )
        process = IndexerProcess(config)
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            enable_auto_commit=False,
            fetch_max_wait_ms=5,
            fetch_min_bytes=1,
        )
        await consumer.start()
        arrivals: dict[int, list[float]] = {}
        try:
            tps = [TopicPartition(topic, p) for p in range(4)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            process.start()
            conn = await connect(database_url)
            try:
                head = devnet.block_number()
                deadline = time.perf_counter() + 60
                while True:
                    cursor = await conn.fetchval(
                        "SELECT block_number FROM chain_cursor WHERE chain_id = $1", devnet.chain_id
                    )
                    if cursor is not None and cursor >= head:
                        break
                    if time.perf_counter() > deadline or not process.running:
                        raise RuntimeError(f"indexer did not start:\n{process.output()}")
                    await asyncio.sleep(0.02)
            finally:
                await conn.close()
            load = BlockLoad(devnet, per_block, interval, blocks)
            load.start()
            last_block = head + blocks
            while True:
                batch = await consumer.getmany(timeout_ms=50)
                now = time.perf_counter()
                for records in batch.values():
                    for record in records:
                        payload = orjson.loads(record.value)
                        arrivals.setdefault(payload["block_number"], []).append(now)
                if load.error is not None:
                    raise load.error
                complete = len(arrivals.get(last_block, [])) >= per_block
                if complete or (
                    not load.is_alive()
                    and time.perf_counter() - load.mined_at.get(last_block, now) > 10
                ):
                    break
            load.join(timeout=10)
            stages = await outbox_stages(database_url, load.mined_wall)
        finally:
            await consumer.stop()
            process.terminate()
            process.cleanup()
    # The first blocks warm the caches; with very few blocks keep at least one measured.
    warmup = min(5, max(0, len(load.mined_at) - 1))
    latencies = []
    for number, mined in sorted(load.mined_at.items())[warmup:]:
        seen = arrivals.get(number, [])
        if len(seen) < per_block:
            raise RuntimeError(f"block {number}: {len(seen)} of {per_block} events read")
        latencies.append((max(seen) - mined) * 1000.0)
    latencies.sort()
    p50 = statistics.median(latencies)
    p99 = latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))]
    say(f"head latency over {len(latencies)} blocks: p50 {p50:.1f} ms, p99 {p99:.1f} ms")
    return {
        "blocks": len(latencies),
        "tx_per_block": per_block,
        "block_interval_s": interval,
        "p50_ms": round(p50, 2),
        "p90_ms": round(latencies[round(0.9 * (len(latencies) - 1))], 2),
        "p99_ms": round(p99, 2),
        "max_ms": round(latencies[-1], 2),
        "evm_mine_call_p50_ms": round(statistics.median(load.mine_call_s) * 1000, 2),
        "stages_p50_ms": stages,
    }


# ---------------------------------------------------------------------------- main


def machine() -> dict[str, Any]:
    """What this ran on."""
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    anvil_version = subprocess.run(
        [str(anvil_binary()), "--version"], capture_output=True, text=True, check=False
    )
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "anvil": anvil_version.stdout.strip().splitlines()[0] if anvil_version.stdout else "",
    }


async def fresh_database(service: PostgresService) -> str:
    """A new migrated database on the service's server."""
    name = f"bench_{secrets.token_hex(4)}"
    conn = await asyncpg.connect(service.admin_url)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(service.admin_url)
    url = urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))
    await migrate_url(url)
    return url


async def backfill(
    args: argparse.Namespace, pg: PostgresService, kafka: KafkaService, workdir: Path
) -> dict[str, Any]:
    """(a), (b) and (c) on one chain of `args.events` events."""
    result: dict[str, Any] = {}
    with AnvilProcess(extra_args=("--gas-limit", "2000000000")) as anvil:
        devnet = deploy_devnet(anvil.rpc_url, ws_url=anvil.ws_url)
        say(f"mining {args.events:,} escrow events, {args.per_block} per block")
        started = time.perf_counter()
        first = devnet.block_number() + 1
        head = generate_task_events(devnet, args.events, per_block=args.per_block)
        result["chain"] = {
            "events": args.events,
            "blocks": head - first + 1,
            "events_per_block": args.per_block,
            "generation_s": round(time.perf_counter() - started, 1),
        }
        say(f"mined blocks {first}..{head} in {result['chain']['generation_s']}s")
        result["raw_eth_getLogs"] = await measure_raw(devnet, first, head, args.events)
        chain = {"finality_depth": args.finality_depth, "rpc_timeout": 60.0}
        modes = ["inline", "process"] if args.publisher == "both" else [args.publisher]
        rounds = args.pairs if args.publisher == "both" else 1
        runs: list[dict[str, Any]] = []
        pipelines: list[dict[str, Any]] = []
        shape = result["raw_eth_getLogs"]["best_shape"]
        for n in range(rounds):
            # The ceiling next to each round of indexer runs, on the same chain and server.
            pipelines.append(
                await measure_raw_pipeline(
                    devnet,
                    await fresh_database(pg),
                    kafka.bootstrap,
                    first,
                    head,
                    args.events,
                    span=shape["range_blocks"],
                    in_flight=shape["in_flight"],
                )
            )
            # Alternate which mode goes first, so neither always runs on the warmer caches.
            for mode in modes if n % 2 == 0 else modes[::-1]:
                database = await fresh_database(pg)
                runs.append(
                    await measure_indexer(
                        devnet, database, kafka.bootstrap, head, args.events, workdir, chain, mode
                    )
                )
        if args.profile is not None:
            # One more inline run under cProfile, kept out of the figures above (the
            # profiler slows the interpreter): where the in-process pipeline spends its time.
            database = await fresh_database(pg)
            profiled = await measure_indexer(
                devnet, database, kafka.bootstrap, head, args.events, workdir, chain, "inline",
                profile=args.profile,
            )
            result["inline_profile"] = {
                "end_to_end_events_per_s_under_profiler": profiled["end_to_end_events_per_s"],
                "stats_file": str(args.profile),
                "top_tottime": profile_summary(args.profile),
            }
        if args.skip_etl:
            result["ethereum_etl"] = {"skipped": "--skip-etl"}
        else:
            result["ethereum_etl"] = await asyncio.to_thread(
                measure_etl, devnet, first, head, args.etl_max_tx, workdir, args.etl_venv
            )
    a = result["raw_eth_getLogs"]["best_logs_per_s"]
    etl = result["ethereum_etl"].get("escrow_events_per_s")
    ceiling = max(pipelines, key=lambda p: p["events_per_s"])
    result["raw_pipeline"] = {**ceiling, "runs": pipelines}
    for r in runs:
        r["end_to_end_vs_raw"] = round(r["end_to_end_events_per_s"] / a, 3)
        r["postgres_only_vs_raw"] = round(r["postgres_events_per_s"] / a, 3)
        r["end_to_end_vs_raw_pipeline"] = round(r["end_to_end_events_per_s"] / ceiling["events_per_s"], 3)
        r["postgres_only_vs_raw_pipeline"] = round(
            r["postgres_events_per_s"] / ceiling["postgres_events_per_s"], 3
        )
        if r["indexer_cpu_us_per_event"] is not None:
            # CPU per event, indexer process ÷ the raw pipeline's (best run): 1.0 is no logic.
            r["cpu_per_event_vs_raw_pipeline"] = round(
                r["indexer_cpu_us_per_event"] / min(p["cpu_us_per_event"] for p in pipelines), 2
            )
    by_mode = {m: [r for r in runs if r["publisher"] == m] for m in modes}
    # The headline figure is the best end-to-end run of the first mode asked for (inline
    # when both): the configuration `escrowd index run` ships with.
    best = {m: max(rs, key=lambda r: r["end_to_end_events_per_s"]) for m, rs in by_mode.items()}
    result["indexer_backfill"] = best[modes[0]]
    result["indexer_backfill_runs"] = runs
    b = result["indexer_backfill"]["end_to_end_events_per_s"]
    result["ratios"] = {
        "indexer_vs_raw": round(b / a, 3),
        "indexer_postgres_only_vs_raw": round(
            result["indexer_backfill"]["postgres_events_per_s"] / a, 3
        ),
        "indexer_vs_ethereum_etl": round(b / etl, 2) if etl else None,
        "raw_pipeline_vs_raw": round(ceiling["events_per_s"] / a, 3),
        "indexer_vs_raw_pipeline": round(b / ceiling["events_per_s"], 3),
        "indexer_postgres_only_vs_raw_pipeline": round(
            result["indexer_backfill"]["postgres_events_per_s"] / ceiling["postgres_events_per_s"], 3
        ),
    }
    for m, rs in by_mode.items():
        result["ratios"][f"end_to_end_vs_raw_publisher_{m}"] = [r["end_to_end_vs_raw"] for r in rs]
    if len(modes) == 2:
        result["ratios"]["process_over_inline_per_pair"] = [
            round(p["end_to_end_events_per_s"] / i["end_to_end_events_per_s"], 2)
            for i, p in zip(by_mode["inline"], by_mode["process"], strict=True)
        ]
    return result


async def run(args: argparse.Namespace, pg: PostgresService, kafka: KafkaService) -> dict[str, Any]:
    """Every measurement; returns the result document."""
    workdir = Path(tempfile.mkdtemp(prefix="escrowd-bench-"))
    result: dict[str, Any] = {"benchmark": "indexer", "machine": machine()}
    try:
        async with asyncpg.create_pool(pg.admin_url, min_size=1, max_size=1) as pool:
            result["machine"]["postgres"] = await pool.fetchval("SHOW server_version")
        result["machine"]["broker"] = "external" if os.environ.get("KAFKA_BOOTSTRAP") else "tansu"
        targets: dict[str, bool] = {}
        if args.chains:
            result["many_chains"] = await many_chains(args, pg, kafka, workdir)
            result["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
            return result
        if not args.head_only:
            result.update(await backfill(args, pg, kafka, workdir))
            targets["backfill_half_of_raw"] = result["ratios"]["indexer_vs_raw"] >= 0.5
            targets["backfill_0_7_of_raw_pipeline"] = result["ratios"]["indexer_vs_raw_pipeline"] >= 0.7
            targets["postgres_0_7_of_raw_pipeline"] = (
                result["ratios"]["indexer_postgres_only_vs_raw_pipeline"] >= 0.7
            )
        head = await measure_head_latency(
            await fresh_database(pg),
            kafka.bootstrap,
            workdir,
            per_block=args.head_tx_per_block,
            interval=args.head_interval,
            blocks=args.head_blocks,
        )
        result["head_latency"] = head
        targets["head_p50_le_20ms"] = head["p50_ms"] <= 20.0
        targets["head_p99_le_100ms"] = head["p99_ms"] <= 100.0
        result["targets"] = targets
        result["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return result


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run, print the JSON."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_indexer", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--events", type=int, default=200_000, help="escrow events to mine (default 200000)"
    )
    parser.add_argument(
        "--per-block", type=int, default=1000, help="events per block (default 1000)"
    )
    parser.add_argument(
        "--finality-depth", type=int, default=64, help="indexer finality_depth (default 64)"
    )
    parser.add_argument(
        "--head-blocks", type=int, default=200, help="blocks mined under load (default 200)"
    )
    parser.add_argument(
        "--head-interval", type=float, default=0.1, help="seconds between blocks (default 0.1)"
    )
    parser.add_argument(
        "--head-tx-per-block", type=int, default=20, help="transactions per block (default 20)"
    )
    parser.add_argument(
        "--skip-etl", action="store_true", help="do not install or run ethereum-etl"
    )
    parser.add_argument(
        "--etl-max-tx",
        type=int,
        default=20_000,
        help="transactions ethereum-etl exports (default 20000)",
    )
    parser.add_argument(
        "--publisher",
        choices=("inline", "process", "both"),
        default="both",
        help="backfill with the indexer's own publisher, an `index publish` process, or both"
        " (default both, in --pairs alternating pairs)",
    )
    parser.add_argument(
        "--pairs", type=int, default=1, help="inline/process pairs with --publisher both (default 1)"
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="one more inline backfill under cProfile, stats written to this file",
    )
    parser.add_argument("--head-only", action="store_true", help="measure head latency only")
    parser.add_argument(
        "--chains",
        action="store_true",
        help="only the many-chains figures: 1, 2, 4 chains in one process vs one per chain",
    )
    parser.add_argument(
        "--chain-events", type=int, default=20_000, help="events per chain with --chains (default 20000)"
    )
    parser.add_argument(
        "--chain-rounds", type=int, default=2, help="rounds of the --chains figures (default 2)"
    )
    parser.add_argument(
        "--etl-venv", type=Path, default=None, help="reuse this ethereum-etl virtualenv"
    )
    args = parser.parse_args(argv)
    configure_logging(json=True)  # structlog to stderr: stdout carries only the result
    result = with_services(lambda pg, kafka: run(args, pg, kafka))
    print(orjson.dumps(result).decode(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
