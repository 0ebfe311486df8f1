"""Sandbox overhead: `python -m bench.bench_sandbox [--runs N]`.

Prints one JSON object: the wall time of one bubblewrap run of a trivial solution (start
the sandbox, the interpreter and the harness, fork the worker, one case, tear down), p50
and max over N runs; the CPU time measured for the submission itself; and the wall time of
one whole `test_suite` check (public and hidden stages, each run twice). Wall-clock
figures move with the load of a shared machine; compare them on a quiet one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from typing import Any

from schemas.task_terms import VerifierRef
from verification.sandbox import run_cases
from verification.verifiers import default_registry

SOLUTION = "def solve(a, b):\n    return a + b\n"


async def measure(runs: int) -> dict[str, Any]:
    """The figures, one run after another."""
    walls: list[float] = []
    cpus: list[int] = []
    for _ in range(runs):
        started = time.perf_counter()
        run = await run_cases(SOLUTION, "solve", [[1, 2]], time_limit_ms=1000, memory_mb=128)
        walls.append(time.perf_counter() - started)
        cpus.append(run.cpu_ms)
    suite = VerifierRef(
        kind="test_suite",
        ref="bench",
        config={"publicTests": [{"args": [1, 2], "expected": 3}], "hiddenTests": [{"args": [2, 2], "expected": 4}]},
    )
    started = time.perf_counter()
    await default_registry().verify(suite, {}, SOLUTION)
    check = time.perf_counter() - started
    return {
        "benchmark": "sandbox",
        "runs": runs,
        "run_wall_ms_p50": round(statistics.median(walls) * 1000, 1),
        "run_wall_ms_max": round(max(walls) * 1000, 1),
        "submission_cpu_ms_p50": statistics.median(cpus),
        "test_suite_check_wall_ms": round(check * 1000, 1),
        "load_average_1m": os.getloadavg()[0],
        "machine": platform.machine(),
    }


def main() -> None:
    """Parse arguments, measure, print the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args.runs))))


if __name__ == "__main__":
    main()
