"""`python -m bench [name ...]`: run the benchmarks, one JSON object per line on stdout.

Names: autocheck, eip712, cli, indexer, kafka-clients, publisher-read, relayer, restart, rulings, sandbox, static_membership, verification (default: all that exist). Extra arguments after `--`
are passed to each benchmark module.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

BENCHMARKS = {
    "autocheck": "bench.bench_autocheck",
    "eip712": "bench.bench_eip712",
    "cli": "bench.bench_cli",
    "indexer": "bench.bench_indexer",
    "kafka-clients": "bench.bench_kafka_clients",
    "publisher-read": "bench.bench_publisher_read",
    "relayer": "bench.bench_relayer",
    "rulings": "bench.bench_rulings",
    "restart": "bench.bench_restart",
    "sandbox": "bench.bench_sandbox",
    "verification": "bench.bench_verification",
    "static_membership": "bench.bench_static_membership",
}


def main(argv: list[str]) -> int:
    """Run the named benchmarks (all by default) as separate processes."""
    extra: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1 :]
    names = argv or list(BENCHMARKS)
    status = 0
    for name in names:
        module = BENCHMARKS.get(name)
        if module is None:
            print(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}", file=sys.stderr)
            return 2
        if importlib.util.find_spec(module) is None:
            print(f"benchmark {name} is not available", file=sys.stderr)
            status = 1
            continue
        result = subprocess.run([sys.executable, "-m", module, *extra], check=False)
        status = status or result.returncode
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
