"""Auto-check throughput and latency: `python -m bench.bench_autocheck [--seconds S]`.

Prints one JSON object: checks per second on ~2 KB outputs under a typical rule set
(keywords + forbidden phrases + expected schema), p50/p99 latency, and the time for a
1 MB output. One process, one thread. Targets: >= 5,000 checks/s, p99 <= 2 ms,
1 MB <= 150 ms. On a shared machine wall-clock figures move with the load, so CPU-time
figures are reported beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from typing import Any

from schemas.criteria import VerificationCriteria
from verification.auto_check import auto_check

TARGET_CHECKS_PER_S = 5_000
TARGET_P99_MS = 2.0
TARGET_ONE_MB_MS = 150.0

TYPICAL_CRITERIA = VerificationCriteria.model_validate(
    {
        "contains_keywords": ["latency", "throughput", "Kafka"],
        "forbidden_phrases": ["lorem ipsum", "as an ai language model", "TODO"],
        "expected_schema": {
            "type": "object",
            "required": ["summary", "findings", "sources"],
            "properties": {"summary": {"type": "string"}, "findings": {"type": "array"}},
        },
    }
)

_PROSE = (
    "the consumer group rebalanced after a broker restart and partition leadership moved "
    "while producers kept writing with idempotence enabled so no duplicates reached the "
    "ledger table; p99 latency rose during compaction and throughput recovered once the "
    "replica fetchers caught up with the log end offset of every partition in the topic"
)
_VOCABULARY = _PROSE.split()


def _sentence(rng: random.Random, words: int) -> str:
    text = " ".join(rng.choice(_VOCABULARY) for _ in range(words))
    return text[0].upper() + text[1:] + "."


def _two_kb_output(rng: random.Random) -> str:
    """A ~2 KB deliverable: a short Markdown report around a fenced JSON object."""
    findings = [_sentence(rng, 14) for _ in range(4)]
    body = {
        "summary": "Kafka throughput and latency review. " + _sentence(rng, 30),
        "findings": findings,
        "sources": ["https://kafka.apache.org/documentation/", "internal dashboard 7"],
    }
    text = (
        "## Review\n\n"
        + " ".join(_sentence(rng, 18) for _ in range(3))
        + "\n\n```json\n"
        + json.dumps(body, indent=2)
        + "\n```\n\n## Not done / assumptions\n\n- Broker metrics before March were not kept.\n"
    )
    while len(text) < 2_000:
        text += _sentence(rng, 12) + " "
    return text[:2_048]


def _one_mb_output(rng: random.Random) -> str:
    """A ~1 MB deliverable: the JSON object up front, then long Markdown prose."""
    head = _two_kb_output(rng)
    paragraphs = []
    size = len(head)
    while size < 1_000_000:
        paragraph = " ".join(_sentence(rng, 20) for _ in range(8))
        paragraphs.append(paragraph)
        size += len(paragraph) + 2
    return head + "\n\n" + "\n\n".join(paragraphs)


def _percentile(sorted_values: list[float], fraction: float) -> float:
    index = min(len(sorted_values) - 1, round(fraction * (len(sorted_values) - 1)))
    return sorted_values[index]


def run(seconds: float, seed: int) -> dict[str, Any]:
    """Run the benchmark and return its figures."""
    rng = random.Random(seed)
    outputs = [{"output": _two_kb_output(rng)} for _ in range(256)]
    first = auto_check(outputs[0], TYPICAL_CRITERIA)
    if not first.passed:
        raise RuntimeError(f"benchmark output does not pass its own rules: {first.reasons}")
    for result in outputs[:64]:  # warm caches and the allocator
        auto_check(result, TYPICAL_CRITERIA)

    latencies: list[float] = []
    cpu_latencies: list[float] = []
    perf_counter = time.perf_counter
    process_time = time.process_time
    cpu_started = time.process_time()
    wall_started = perf_counter()
    deadline = wall_started + seconds
    index = 0
    while True:
        result = outputs[index & 255]
        cpu_before = process_time()
        started = perf_counter()
        auto_check(result, TYPICAL_CRITERIA)
        finished = perf_counter()
        cpu_latencies.append(process_time() - cpu_before)
        latencies.append(finished - started)
        index += 1
        if finished >= deadline:
            break
    wall = perf_counter() - wall_started
    cpu = time.process_time() - cpu_started
    latencies.sort()
    cpu_latencies.sort()

    big = {"output": _one_mb_output(rng)}
    big_wall: list[float] = []
    big_cpu: list[float] = []
    for _ in range(7):
        cpu_before = time.process_time()
        started = perf_counter()
        verdict = auto_check(big, TYPICAL_CRITERIA)
        big_wall.append((perf_counter() - started) * 1000)
        big_cpu.append((time.process_time() - cpu_before) * 1000)
    checks_per_s = index / wall
    p50 = _percentile(latencies, 0.50) * 1000
    p99 = _percentile(latencies, 0.99) * 1000
    one_mb = statistics.median(big_wall)
    return {
        "benchmark": "autocheck",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "rules": "contains_keywords(3) + forbidden_phrases(3) + expected_schema(required 3)",
        "output_chars": round(statistics.mean(len(r["output"]) for r in outputs)),
        "checks": index,
        "seconds": round(wall, 3),
        "checks_per_s": round(checks_per_s),
        "checks_per_cpu_s": round(index / cpu) if cpu > 0 else None,
        "latency_ms": {
            "p50": round(p50, 4),
            "p99": round(p99, 4),
            "max": round(latencies[-1] * 1000, 3),
        },
        # The same checks in CPU time: what preemption by other processes leaves out.
        "cpu_latency_ms": {
            "p50": round(_percentile(cpu_latencies, 0.50) * 1000, 4),
            "p99": round(_percentile(cpu_latencies, 0.99) * 1000, 4),
        },
        "one_mb": {
            "output_chars": len(big["output"]),
            "passed": verdict.passed,
            "wall_ms_median": round(one_mb, 2),
            "wall_ms_max": round(max(big_wall), 2),
            "cpu_ms_median": round(statistics.median(big_cpu), 2),
        },
        "targets": {
            "checks_per_s": TARGET_CHECKS_PER_S,
            "p99_ms": TARGET_P99_MS,
            "one_mb_ms": TARGET_ONE_MB_MS,
        },
        "meets_targets": checks_per_s >= TARGET_CHECKS_PER_S
        and p99 <= TARGET_P99_MS
        and one_mb <= TARGET_ONE_MB_MS,
    }


def main(argv: list[str]) -> int:
    """Parse arguments, run, print one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="measuring time (default 5)")
    parser.add_argument("--seed", type=int, default=7, help="output generator seed")
    args = parser.parse_args(argv)
    print(json.dumps(run(args.seconds, args.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
