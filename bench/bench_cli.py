"""CLI start-up: CPU and wall time of `escrowd` commands against a bare `python -c pass`.

    python -m bench.bench_cli [--runs N]

Each command runs N times as a child process in this same run (the baseline too), and the
median user+system CPU time and wall time are reported, with the heavy modules each command
loaded (web3, eth_account, fastapi, aiokafka). One JSON object on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAVY = ("web3", "eth_account", "fastapi", "aiokafka", "asyncpg", "uvicorn", "aiohttp")


def _measure(argv: list[str], runs: int) -> dict[str, float]:
    cpu: list[float] = []
    wall: list[float] = []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        wall.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
    return {"cpu_s": round(statistics.median(cpu), 3), "wall_s": round(statistics.median(wall), 3)}


def _heavy_loaded(args: list[str]) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "modules.json"
        code = (
            "import sys, json, atexit;"
            f"atexit.register(lambda: open({str(out)!r}, 'w').write(json.dumps(sorted(sys.modules))));"
            "from escrowd.cli import main; main(sys.argv[1:])"
        )
        subprocess.run([sys.executable, "-c", code, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        loaded = {m.split(".")[0] for m in json.loads(out.read_text(encoding="utf-8"))}
    return sorted(loaded & set(HEAVY))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7)
    opts = parser.parse_args()
    script = str(Path(sys.executable).parent / "escrowd")
    with tempfile.TemporaryDirectory() as tmp:
        criteria = Path(tmp) / "criteria.json"
        criteria.write_text('{"type": "json_schema", "schema": {"type": "object"}}', encoding="utf-8")
        result = Path(tmp) / "result.json"
        result.write_text('{"answer": 42}', encoding="utf-8")
        commands = {
            "escrowd --help": ["--help"],
            "escrowd --version": ["--version"],
            "escrowd verify auto": ["verify", "auto", "--criteria", str(criteria), "--result", str(result)],
            "escrowd index run --help": ["index", "run", "--help"],
            "escrowd relay run --help": ["relay", "run", "--help"],
        }
        baseline = _measure([sys.executable, "-c", "pass"], opts.runs)
        rows = {}
        for name, args in commands.items():
            figures = _measure([script, *args], opts.runs)
            figures["cpu_over_baseline_s"] = round(figures["cpu_s"] - baseline["cpu_s"], 3)
            figures["heavy_modules"] = _heavy_loaded(args)  # type: ignore[assignment]
            rows[name] = figures
    print(json.dumps({"benchmark": "cli_startup", "runs": opts.runs, "cpus": os.cpu_count(),
                      "load_1m": round(os.getloadavg()[0], 2), "baseline_python_c_pass": baseline,
                      "commands": rows}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
