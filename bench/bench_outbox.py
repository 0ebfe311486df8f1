"""Outbox rows: publishing throughput of this tree's publisher against a baseline tree's.

`python -m bench.bench_outbox [--rows N] [--rounds K] [--tree PATH] [--writers W]` prints one
JSON object. `--tree` is a checkout of the baseline (by default `/work/wt-outbox-base`, made
with `git worktree add /work/wt-outbox-base cd74ee1~1`: the publisher before each batch was
"the lowest pending seqs but those in flight" and before every record carried `ce_sequence`).

Each run gets a fresh migrated database and two fresh 4-partition topics on the same embedded
PostgreSQL and Tansu, and the same N outbox rows: a third reputation-like records keyed by
500 agents, two thirds task-state-like records keyed by 2,000 tasks, payloads of 300-600
bytes, CloudEvents headers as the handlers write them (`cloudevent_headers`). The publisher
runs in a subprocess whose PYTHONPATH is the tree under test (both trees alike, the current
one being the checkout this module is in), one `OutboxPublisher` calling `publish_cycle`
until every row is marked published. The runs of the two trees alternate (ABBA), so each
pair is measured under the same load; the ratio is current / baseline.

Modes (`--mode`, both by default):

- preloaded: every row is committed (COPY, then ANALYZE) before the publisher starts.
- writers: half the rows are preloaded, the other half committed while the publisher drains
  by `--writers` connections, transactions of 20 rows each taking the key's advisory lock
  first, as the reputation consumer does (the case the in-flight EXCEPT was written for).

Per run: rows/s from the first record batch handed to the producer to the last row marked
published, the publisher process's CPU and its PostgreSQL backend's CPU per row
(`/proc/PID/stat`, so the server must be local), and the one-minute load average at the
start; in the writers mode also `tail_s`, from the last writer's commit to the last mark (the
rate there is mostly the writers'). `BENCH_PROFILE=dir` writes a cProfile of each publisher's drain there.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg
import orjson

from bench.bench_indexer import fresh_database
from bench.services import with_services
from runtime.db import connect
from runtime.kafka import TopicSpec, ensure_topics
from runtime.logging import configure_logging
from runtime.outbox import OutboxMessage, copy_into_outbox, enqueue
from runtime.services.kafka import KafkaService
from runtime.services.postgres import PostgresService
from schemas.cloudevents import cloudevent_headers, iso_time
from schemas.events import message_key

CURRENT = Path(__file__).resolve().parent.parent
BASELINE = Path("/work/wt-outbox-base")
AGENTS = 500
TASKS = 2_000
ESCROW = "0x" + "e5" * 20

PUBLISHER = r"""
import asyncio, os, sys, time
import orjson
import runtime.outbox as outbox
from runtime.db import connect
from runtime.kafka import make_producer


def backend_cpu(pid):
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def main(url, bootstrap, total, topics, profile):
    producer = make_producer(bootstrap)
    await producer.start()
    conn = await connect(url)
    try:
        for topic in topics:
            await producer.partitions_for(topic)  # metadata before the clock
        publisher = outbox.OutboxPublisher(url, producer)
        first = []
        send_batch = producer.send_batch

        async def timed(*args, **kwargs):
            if not first:
                first.append(time.perf_counter())
            return await send_batch(*args, **kwargs)

        producer.send_batch = timed
        print(orjson.dumps({"ready": outbox.__file__}).decode(), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        pid = conn.get_server_pid()
        profiler = None
        if profile:
            import cProfile
            profiler = cProfile.Profile()
            profiler.enable()
        cpu, backend, started = time.process_time(), backend_cpu(pid), time.perf_counter()
        sent = cycles = idle = 0
        while sent < total:
            count = await publisher.publish_cycle(conn)
            cycles += 1
            if count == 0:
                idle += 1
                await asyncio.sleep(0.002)
            sent += count
        ended = time.perf_counter()
        cpu, backend = time.process_time() - cpu, backend_cpu(pid) - backend
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(profile)
        print(orjson.dumps({
            "rows": sent, "cycles": cycles, "idle_cycles": idle,
            "wall_s": ended - first[0], "drain_s": ended - started, "ended": ended,
            "process_cpu_s": cpu, "postgres_cpu_s": backend,
        }).decode(), flush=True)
    finally:
        await conn.close()
        await producer.stop()


asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].split(","), sys.argv[5]))
"""
"""The publisher's process, the same code for both trees: only its PYTHONPATH differs."""


def _pad(body: dict[str, Any], size: int) -> bytes:
    """`body` as JSON of `size` bytes (a `note` field filled to length)."""
    body["note"] = ""
    short = len(orjson.dumps(body))
    body["note"] = "x" * max(0, size - short)
    return orjson.dumps(body)


def make_rows(count: int, reputation_topic: str, tasks_topic: str) -> list[OutboxMessage]:
    """`count` rows, deterministic: every third a reputation record of one of 500 agents
    (300-400 bytes), the others a task-state record of one of 2,000 tasks (400-600 bytes)."""
    rows: list[OutboxMessage] = []
    for i in range(count):
        if i % 3 == 0:
            agent = "0x" + f"{(i // 3) % AGENTS:040x}"
            message_id = f"reputation:{agent}:bench-{i}"
            body: dict[str, Any] = {"agent": agent, "score": i % 101, "dispute_count": i % 7, "passes": i % 50,
                                    "failures": i % 9, "matching_score": (i % 101) * 0.93}
            rows.append(OutboxMessage(
                message_id=message_id, topic=reputation_topic, key=agent.encode(),
                payload=_pad(body, 300 + (i * 37) % 101),
                headers=cloudevent_headers(id=message_id, source="escrowd/reputation",
                                           type="io.escrowd.agent.Reputation.v1", subject=agent, time=None),
            ))  # fmt: skip
        else:
            task_id = 1_000 + i % TASKS
            message_id = f"task-state:1:{task_id}:0x{i:064x}"
            body = {"chain_id": 1, "escrow": ESCROW, "task_id": task_id, "status": i % 8,
                    "poster": "0x" + "a1" * 20, "agent": "0x" + f"{i % AGENTS:040x}", "amount": str(10**18 + i),
                    "deadline": 1_700_000_000 + i, "spec_hash": "0x" + "11" * 32,
                    "last_block_number": 10_000 + i, "last_block_timestamp": 1_700_000_000 + i}
            rows.append(OutboxMessage(
                message_id=message_id, topic=tasks_topic, key=message_key(1, task_id, ESCROW),
                payload=_pad(body, 400 + (i * 53) % 201),
                headers=cloudevent_headers(id=message_id, source=f"escrowd/lifecycle/1/{ESCROW}",
                                           type="io.escrowd.task.State.v1", subject=str(task_id),
                                           time=iso_time(1_700_000_000 + i)),
            ))  # fmt: skip
    return rows


async def _writer(url: str, rows: list[OutboxMessage]) -> None:
    """Commit `rows` in transactions of 20, each first taking its keys' advisory locks."""
    conn = await connect(url)
    try:
        for at in range(0, len(rows), 20):
            chunk = rows[at : at + 20]
            async with conn.transaction():
                for key in sorted({m.key or b"" for m in chunk}):
                    await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", key.decode())
                await enqueue(conn, chunk)
    finally:
        await conn.close()


async def _reply(proc: asyncio.subprocess.Process, prefix: bytes) -> Any:
    """The publisher's next line starting with `prefix`, decoded (other output is skipped)."""
    assert proc.stdout is not None
    while line := await proc.stdout.readline():
        if line.startswith(prefix):
            return orjson.loads(line)
    return None


async def _run(
    pg: PostgresService, bootstrap: str, tree: Path, args: argparse.Namespace, mode: str, label: str
) -> dict[str, Any]:
    """One publisher run of `tree` on a fresh database and fresh topics."""
    url = await fresh_database(pg)
    suffix = secrets.token_hex(3)
    topics = (f"bench-outbox-reputation-{suffix}", f"bench-outbox-tasks-{suffix}")
    await ensure_topics(bootstrap, [TopicSpec(topic, 4, compacted=True) for topic in topics])
    rows = make_rows(args.rows, *topics)
    preload = rows if mode == "preloaded" else rows[: len(rows) // 2]
    later = rows[len(preload) :]
    conn: asyncpg.Connection = await connect(url)
    try:
        await copy_into_outbox(conn, preload)
        await conn.execute("ANALYZE outbox")
    finally:
        await conn.close()
    profile = ""
    if os.environ.get("BENCH_PROFILE"):
        profile = f"{os.environ['BENCH_PROFILE']}/outbox-{mode}-{label}-{suffix}.prof"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PUBLISHER, url, bootstrap, str(len(rows)), ",".join(topics), profile,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(tree)}, cwd=str(tree),
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    try:
        ready = await _reply(proc, b'{"ready"')
        if not ready or not str(ready["ready"]).startswith(str(tree)):
            raise RuntimeError(f"the publisher of {tree} did not start (or ran other code: {ready})")
        load = os.getloadavg()[0]
        proc.stdin.write(b"go\n")
        await proc.stdin.drain()
        writers_s = writers_end = 0.0
        if later:
            started = time.perf_counter()
            await asyncio.gather(*(_writer(url, later[w :: args.writers]) for w in range(args.writers)))
            writers_end = time.perf_counter()
            writers_s = writers_end - started
        figures = await _reply(proc, b'{"rows"')
    except BaseException:
        proc.kill()
        raise
    finally:
        await proc.wait()
    if proc.returncode != 0 or not figures or figures["rows"] < len(rows):
        raise RuntimeError(f"the publisher of {tree} failed ({proc.returncode}): {figures}")
    count = figures["rows"]
    result = {
        "rows_per_s": round(count / figures["wall_s"]),
        "process_cpu_us_per_row": round(figures["process_cpu_s"] / count * 1e6, 1),
        "postgres_cpu_us_per_row": round(figures["postgres_cpu_s"] / count * 1e6, 1),
        "wall_s": round(figures["wall_s"], 3),
        "cycles": figures["cycles"],
        "load_average": round(load, 2),
    }
    if later:
        result["writers_s"] = round(writers_s, 3)
        # perf_counter is CLOCK_MONOTONIC, one clock for both processes
        result["tail_s"] = round(figures["ended"] - writers_end, 3)
        result["idle_cycles"] = figures["idle_cycles"]
    return result


async def run(args: argparse.Namespace, pg: PostgresService, kafka: KafkaService) -> dict[str, Any]:
    """For each mode, `--rounds` pairs of runs of the two trees, alternating which goes first."""
    trees = {"baseline": args.tree.resolve(), "current": CURRENT}
    result: dict[str, Any] = {
        "benchmark": "outbox",
        "rows": args.rows,
        "trees": {name: str(path) for name, path in trees.items()},
    }
    for mode in args.mode:
        runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "current": []}
        for n in range(args.rounds):
            order = ("baseline", "current") if n % 2 == 0 else ("current", "baseline")
            for name in order:
                runs[name].append(await _run(pg, kafka.bootstrap, trees[name], args, mode, name))
                print(f"{mode} {name} {runs[name][-1]}", file=sys.stderr, flush=True)
        pairs = [c["rows_per_s"] / b["rows_per_s"] for b, c in zip(runs["baseline"], runs["current"], strict=True)]
        keys = ("rows_per_s", "process_cpu_us_per_row", "postgres_cpu_us_per_row")
        result[mode] = {
            "runs": runs,
            "median": {name: {key: statistics.median(r[key] for r in rs) for key in keys} for name, rs in runs.items()},
            "pair_ratios": [round(r, 3) for r in pairs],
            "ratio_current_vs_baseline": round(statistics.median(pairs), 3),
        }
    result["load_average"] = os.getloadavg()[0]
    return result


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run, print the JSON."""
    parser = argparse.ArgumentParser(prog="python -m bench.bench_outbox", description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=20_000, help="outbox rows per run (default 20000)")
    parser.add_argument("--rounds", type=int, default=4, help="pairs of runs per mode (default 4)")
    parser.add_argument("--tree", type=Path, default=BASELINE, help=f"the baseline checkout (default {BASELINE})")
    parser.add_argument("--writers", type=int, default=4, help="concurrent writers in the writers mode (default 4)")
    parser.add_argument("--mode", choices=("preloaded", "writers"), action="append",
                        help="preloaded, writers (repeatable; default both)")  # fmt: skip
    args = parser.parse_args(argv)
    args.mode = args.mode or ["preloaded", "writers"]
    if not (args.tree / "runtime" / "outbox.py").is_file():
        parser.error(f"{args.tree} is not a checkout of this project (git worktree add {BASELINE} cd74ee1~1)")
    configure_logging(json=True)
    result = with_services(lambda pg, kafka: run(args, pg, kafka))
    print(orjson.dumps(result).decode(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
