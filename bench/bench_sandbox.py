"""Sandbox overhead, before and after, in one run: `python -m bench.bench_sandbox [--runs N] [--baseline REV]`.

Prints one JSON object. For each variant, the wall time of one bubblewrap run of a trivial
solution (start the sandbox, the interpreter and the harness, fork the worker, its cases,
tear down), p50 and max over N runs, the host CPU it cost (this process's children: bwrap,
the harness, the worker), and the CPU measured for the submission itself. Variants:

* `baseline`: `verification/sandbox.py` and `sandbox_harness.py` as of `--baseline`
  (default `BASELINE`, the last main before issue 25), loaded from git into a temporary
  package: one stage per run, the harness polling `/proc` as a plain child;
* `pidns`: this tree, the harness as the namespace's init, accounting by its poll;
* `cgroup`: this tree with one cgroup v2 per run (left out where the host offers none).

`host_cpu_ms` is everything the run's processes used, measured from a cgroup v2 this
process moves into (see `HostCpu`).

The variants are interleaved run by run (baseline, pidns, cgroup, baseline, ...), so load
on a shared machine falls on all of them alike. It also gives the wall time of one whole
`test_suite` check (public and hidden stages, two runs) with this tree.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from schemas.task_terms import VerifierRef
from verification import sandbox
from verification.verifiers import default_registry

SOLUTION = "def solve(a, b):\n    return a + b\n"
CASES = [[1, 2], [2, 3]]
REPO = Path(__file__).resolve().parents[1]
BASELINE = "9b06deb"
"""The last main before issue 25's sandbox work (the harness a plain child, one stage per run)."""


def load_baseline(rev: str, where: Path) -> ModuleType:
    """`verification/sandbox.py` (with its harness beside it) as of `rev`, as a module of its own."""
    for name in ("sandbox.py", "sandbox_harness.py"):
        text = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{rev}:verification/{name}"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        (where / name).write_text(text)
    spec = importlib.util.spec_from_file_location("baseline_sandbox", where / "sandbox.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["baseline_sandbox"] = module
    spec.loader.exec_module(module)
    return module


class HostCpu:
    """CPU spent by everything a run starts, whoever reaps it.

    With a cgroup v2 at hand, this process moves into a cgroup of its own and a run's cost is
    that cgroup's `usage_usec` minus this process's own CPU (bwrap's init reaps the baseline's
    harness, so `RUSAGE_CHILDREN` would miss it); run cgroups are made inside it. Without one,
    `RUSAGE_CHILDREN` (`exact: false`).
    """

    def __init__(self) -> None:
        base = sandbox.cgroup_base(None)
        self.cgroup: Path | None = None
        self.home: Path | None = None
        if base is not None:
            self.home = base
            self.cgroup = base / f"escrowd-bench-{os.getpid()}"
            self.cgroup.mkdir()
            (self.cgroup / "cgroup.procs").write_text(str(os.getpid()))

    def now(self) -> float:
        own = resource.getrusage(resource.RUSAGE_SELF)
        if self.cgroup is None:
            ru = resource.getrusage(resource.RUSAGE_CHILDREN)
            return float(ru.ru_utime + ru.ru_stime)
        total = sandbox.cpu_stat_usec((self.cgroup / "cpu.stat").read_text()) / 1e6
        return total - float(own.ru_utime + own.ru_stime)

    def close(self) -> None:
        if self.cgroup is not None and self.home is not None:
            (self.home / "cgroup.procs").write_text(str(os.getpid()))
            for _ in range(100):
                try:
                    self.cgroup.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)


def _local_run(settings: sandbox.SandboxSettings) -> Callable[[], Awaitable[Any]]:
    return lambda: sandbox.run_cases(
        SOLUTION, "solve", CASES, time_limit_ms=1000, memory_mb=128, settings=settings
    )


async def measure(runs: int, baseline_rev: str) -> dict[str, Any]:
    """The figures for every variant, interleaved."""
    variants: dict[str, Callable[[], Awaitable[Any]]] = {}
    meter = HostCpu()
    try:
        return await _measure(runs, baseline_rev, variants, meter)
    finally:
        meter.close()


async def _measure(
    runs: int, baseline_rev: str, variants: dict[str, Callable[[], Awaitable[Any]]], meter: HostCpu
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        baseline = load_baseline(baseline_rev, Path(tmp))
        variants["baseline"] = lambda: baseline.run_cases(
            SOLUTION, "solve", CASES, time_limit_ms=1000, memory_mb=128
        )
        modes: list[sandbox.Accounting] = ["pidns", "cgroup"]
        for mode in modes:
            if mode == "cgroup" and sandbox.cgroup_base(None) is None:
                continue
            variants[mode] = _local_run(
                sandbox.SandboxSettings(accounting=mode, cgroup_root=meter.cgroup)
            )
        walls: dict[str, list[float]] = {name: [] for name in variants}
        host_cpu: dict[str, list[float]] = {name: [] for name in variants}
        code_cpu: dict[str, list[int]] = {name: [] for name in variants}
        for run in variants.values():
            await run()  # warm: the staged interpreter, bwrap's --help probe
        for _ in range(runs):
            for name, run in variants.items():
                cpu_before = meter.now()
                started = time.perf_counter()
                result = await run()
                walls[name].append(time.perf_counter() - started)
                host_cpu[name].append(meter.now() - cpu_before)
                code_cpu[name].append(result.cpu_ms)
                assert result.stage == "ok", result
    suite = VerifierRef(
        kind="test_suite",
        ref="bench",
        config={
            "publicTests": [{"args": [1, 2], "expected": 3}],
            "hiddenTests": [{"args": [2, 2], "expected": 4}],
        },
    )
    started = time.perf_counter()
    outcome = await default_registry().verify(suite, {}, SOLUTION)
    check = time.perf_counter() - started
    figures: dict[str, Any] = {}
    for name in variants:
        figures[name] = {
            "run_wall_ms_p50": round(statistics.median(walls[name]) * 1000, 1),
            "run_wall_ms_max": round(max(walls[name]) * 1000, 1),
            "host_cpu_ms_p50": round(statistics.median(host_cpu[name]) * 1000, 1),
            "submission_cpu_ms_p50": statistics.median(code_cpu[name]),
        }
    base = figures["baseline"]["run_wall_ms_p50"]
    for name in variants:
        figures[name]["wall_vs_baseline"] = round(figures[name]["run_wall_ms_p50"] / base, 2)
    return {
        "benchmark": "sandbox",
        "runs": runs,
        "baseline": baseline_rev,
        "variants": figures,
        "test_suite_check_wall_ms": round(check * 1000, 1),
        "test_suite_accounting": outcome.detail["measured"]["accounting"],
        "host_cpu_exact": meter.cgroup is not None,
        "load_average_1m": os.getloadavg()[0],
        "machine": platform.machine(),
    }


def main() -> None:
    """Parse arguments, measure, print the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument(
        "--baseline",
        default=BASELINE,
        help="git revision of the baseline sandbox (default: before issue 25)",
    )
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args.runs, args.baseline))))


if __name__ == "__main__":
    main()
