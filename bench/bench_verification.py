"""Verdicts per second through the verification consumer process, against a slow verifier.

    python -m bench.bench_verification [--verifier-latency-ms 1000] [--tasks 200]

The verification consumer runs as a real process (`escrowd consume verification run`) on an
embedded PostgreSQL and a Tansu broker; every task's terms name one local endpoint verifier
that answers after `--verifier-latency-ms`. Each task goes through two attempts: attempt 1
fails, and as soon as its verdict is recorded the bench indexes its settlement and attempt 2
(which passes) with its finalize, as the relayer and the agent would. So each task's second
request can only be judged after its first.

Printed: one JSON line with `verdicts_per_s` (verdicts recorded over the seconds from the first
finalize to the last verdict), `order_ok` (every task: attempt 1 judged and recorded before
attempt 2, the verifier never called for a task twice at once, one verdict per attempt) and
the verifier's peak concurrency, and the consumer process's CPU time (per verdict) with the
machine's load average: on a shared machine the wall-clock figure follows the load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

from bench.services import on_services
from escrowd.verification_load import Feed, LatencyVerifier, VerificationProcess
from runtime.db import migrate_url
from runtime.logging import configure_logging


def _cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a live process (Linux /proc)."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _peak(calls: list[tuple[float, float]]) -> int:
    edges = sorted([(start, 1) for start, _ in calls] + [(end, -1) for _, end in calls])
    peak = current = 0
    for _, step in edges:
        current += step
        peak = max(peak, current)
    return peak


async def run(latency_ms: float, tasks: int, database_url: str, bootstrap: str, timeout: float) -> dict[str, Any]:
    await migrate_url(database_url)
    verifier = LatencyVerifier(default_latency_ms=latency_ms)
    await verifier.start()
    feed = Feed(database_url, bootstrap, f"b{uuid.uuid4().hex[:8]}.")
    await feed.start()
    process = VerificationProcess(feed.env())
    process.start()
    ids = list(range(1, tasks + 1))
    try:
        for task in ids:
            await feed.task(task, verifier.url("judge"))
        # The clock starts once the consumer is in its group and has read every task's events.
        await feed.consumed(2 * tasks, timeout)
        begin = time.monotonic()
        # Sent concurrently: the producer batches them, as the API's publisher would.
        await asyncio.gather(*(feed.submit(task, 1, passed=False) for task in ids))

        async def advance(task: int) -> None:
            await feed.judged_on_chain(task, 1, passed=False)
            await feed.submit(task, 2, passed=True)

        advanced: set[int] = set()
        deadline = begin + timeout
        rows = await feed.results()
        while len(rows) < 2 * tasks:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(rows)} of {2 * tasks} verdicts after {timeout:g} s\n{process.output()}")
            due = {int(row["task_id"]) for row in rows if row["attempt"] == 1} - advanced
            advanced |= due
            await asyncio.gather(*(advance(task) for task in sorted(due)))
            await asyncio.sleep(0.05)
            rows = await feed.results()
        elapsed = time.monotonic() - begin
        cpu = _cpu_seconds(process.pid)
    finally:
        process.terminate()
        await feed.stop()
        await verifier.stop()
    per_task: dict[int, list[Any]] = {}
    for row in rows:
        per_task.setdefault(int(row["task_id"]), []).append(row)
    calls: dict[int, list[tuple[float, float, int]]] = {}
    for call in verifier.calls:
        calls.setdefault(call.task, []).append((call.started, call.ended, call.attempt))
    order_ok = all(
        [r["attempt"] for r in per_task.get(task, [])] == [1, 2]
        and [r["passed"] for r in per_task[task]] == [False, True]
        and all(a[1] <= b[0] for a, b in zip(sorted(calls[task]), sorted(calls[task])[1:], strict=False))
        and [c[2] for c in sorted(calls[task])][-1] == 2
        for task in ids
    )
    process.cleanup()
    return {
        "benchmark": "verification",
        "tasks": tasks,
        "verifier_latency_ms": latency_ms,
        "verdicts": len(rows),
        "verifier_calls": len(verifier.calls),
        "seconds": round(elapsed, 3),
        "verdicts_per_s": round(len(rows) / elapsed, 2),
        "order_ok": order_ok,
        "verifier_peak_concurrency": _peak([(c.started, c.ended) for c in verifier.calls]),
        # The consumer process's CPU time (start-up included): what a loaded machine divides.
        "consumer_cpu_s": round(cpu, 2),
        "consumer_cpu_ms_per_verdict": round(1000 * cpu / max(1, len(rows)), 1),
        "load_average_1m": round(os.getloadavg()[0], 1),
    }


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--verifier-latency-ms", type=float, default=1000.0)
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds before the run is declared stuck")
    args = parser.parse_args()
    configure_logging(json=True, level="WARNING")
    result = on_services(lambda url, bootstrap: run(args.verifier_latency_ms, args.tasks, url, bootstrap, args.timeout))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    cli()
