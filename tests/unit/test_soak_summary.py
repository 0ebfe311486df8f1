"""The pure parts of `escrowd soak`: the least-squares slope, the growth verdict, the summary."""

from __future__ import annotations

import pytest

from escrowd.invariants import Report
from escrowd.soak import (
    MIN_SLOPE_SAMPLES,
    Samples,
    growth_verdict,
    least_squares_slope,
    memory_slope_mb_per_hour,
    percentile,
    summarize,
)

MB = 2**20


def test_slope_of_a_line_and_of_noise_around_it() -> None:
    assert least_squares_slope([(0, 1), (1, 3), (2, 5)]) == pytest.approx(2.0)
    noisy = [(x, 10 + 0.5 * x + (1 if x % 2 else -1)) for x in range(100)]
    assert least_squares_slope(noisy) == pytest.approx(0.5, abs=0.01)
    assert least_squares_slope([(1, 5)]) == 0.0
    assert least_squares_slope([(1, 5), (1, 9)]) == 0.0  # no spread in x: no slope


def test_memory_slope_is_in_mb_per_hour_and_leaves_the_warm_up_out() -> None:
    # 100 MB in the first minute (start-up), then 1 MB per 10 minutes: 6 MB/hour.
    samples = [(0.0, 50 * MB), (30.0, 150 * MB)] + [(60.0 + 60 * i, 150 * MB + i * MB // 10) for i in range(20)]
    assert memory_slope_mb_per_hour(samples) == pytest.approx(6.0, rel=0.01)
    # With the warm-up kept, the start-up jump dominates.
    assert memory_slope_mb_per_hour(samples, warmup=0.0) > 60


def test_growth_verdict_names_the_process_that_grows() -> None:
    flat = [(60.0 * i, 100 * MB) for i in range(20)]
    leaking = [(60.0 * i, 100 * MB + i * 2 * MB) for i in range(20)]  # 2 MB/min = 120 MB/hour
    verdict = growth_verdict({"api": flat, "lifecycle-0": leaking}, max_slope_mb_per_hour=60)
    assert verdict.grew == {"lifecycle-0": pytest.approx(120.0)}
    assert not verdict.ok
    assert growth_verdict({"api": flat, "lifecycle-0": leaking}, max_slope_mb_per_hour=200).ok


def test_too_few_samples_is_no_verdict_not_a_pass() -> None:
    few = [(60.0 * i, 100 * MB) for i in range(MIN_SLOPE_SAMPLES)]  # the warm-up leaves fewer
    verdict = growth_verdict({"api": few})
    assert verdict.undecided == ["api"]
    assert not verdict.ok


def test_percentiles_interpolate() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile([3.0], 99) == 3.0
    assert percentile([], 50) is None


def test_summary_fails_on_growth_an_exited_process_or_an_invariant() -> None:
    samples = Samples(
        rss={"api": [(60.0 * i, 100 * MB) for i in range(20)]},
        connections=[{"soak-api": 2}, {"soak-api": 5, "soak-indexer": 3}],
        database_bytes=[(0.0, 10 * MB), (3600.0, 30 * MB)],
        tables={"consumer_inbox": 5 * MB, "outbox": 1 * MB},
        lag=[{"escrowd-lifecycle": 9}, {"escrowd-lifecycle": 0}],
        latencies=[1.0, 2.0, 3.0, 4.0],
    )
    held = Report()
    held.add("every task in its expected final state", True)
    summary = summarize(samples, minutes=10, members=2, elapsed_seconds=600, tasks=120, invariants=held)
    assert summary["ok"] is True
    assert summary["tasks_per_second"] == pytest.approx(0.2)
    assert summary["members_per_group"] == 2
    assert summary["finalize_to_confirmed_seconds"]["p50"] == pytest.approx(2.5)
    assert summary["memory"]["api"]["slope_mb_per_hour"] == 0.0
    assert summary["db_connections_peak"] == {"soak-api": 5, "soak-indexer": 3}
    assert summary["db_bytes"]["slope_mb_per_hour"] == pytest.approx(20.0)
    assert summary["consumer_lag_peak"] == {"escrowd-lifecycle": 9}
    assert summary["consumer_lag_final"] == {"escrowd-lifecycle": 0}
    assert list(summary["largest_tables_bytes"]) == ["consumer_inbox", "outbox"]

    assert summarize(samples, minutes=10, members=1, elapsed_seconds=600, tasks=1, invariants=held,
                     exited=["relayer"])["ok"] is False  # fmt: skip
    broken = Report()
    broken.add("token conservation", False, "off by 1")
    assert summarize(samples, minutes=10, members=1, elapsed_seconds=600, tasks=1, invariants=broken)["ok"] is False
    samples.rss["lifecycle-0"] = [(60.0 * i, 100 * MB + i * 2 * MB) for i in range(20)]
    grown = summarize(samples, minutes=10, members=1, elapsed_seconds=600, tasks=1, invariants=held)
    assert grown["ok"] is False and list(grown["grew"]) == ["lifecycle-0"]
