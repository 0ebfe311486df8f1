"""Panel rules (seed 003): draw, consensus, rerun, bands, calibration, sampling and fees."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from panels import rules
from panels.rules import (
    PPM,
    Attestation,
    Band,
    Candidate,
    Outcome,
    PoolTooSmall,
)

SECRET = b"panel-secret-for-tests-0123456789"
TASK = "31337:0x" + "e3" * 20 + ":7"

ppm = st.integers(0, PPM)
positive_ppm = st.integers(1, PPM)


@st.composite
def pools(draw: st.DrawFn, min_size: int = 3, max_size: int = 15) -> list[Candidate]:
    size = draw(st.integers(min_size, max_size))
    operators = [f"op{i}" for i in range(draw(st.integers(1, 5)))]
    return [
        Candidate(f"v{i:02d}", draw(st.sampled_from(operators)), draw(positive_ppm))
        for i in range(size)
    ]


@st.composite
def attestations(draw: st.DrawFn, min_size: int = 1, max_size: int = 6) -> list[Attestation]:
    size = draw(st.integers(min_size, max_size))
    return [
        Attestation(f"v{i}", draw(ppm), draw(ppm), draw(positive_ppm), draw(st.booleans()))
        for i in range(size)
    ]


# ---------------------------------------------------------------------------- draw


@given(pools(), st.integers(1, 2), st.text(min_size=1, max_size=30))
def test_draw_is_deterministic_and_ignores_pool_order(
    pool: list[Candidate], round_number: int, key: str
) -> None:
    first = rules.draw(SECRET, key, round_number, pool)
    assert rules.draw(SECRET, key, round_number, list(reversed(pool))) == first
    assert len(first) == rules.PANEL_SIZE
    assert len({c.id for c in first}) == rules.PANEL_SIZE


@given(pools(min_size=6, max_size=20), st.data())
def test_draw_never_picks_an_excluded_operator_or_id(pool: list[Candidate], data: st.DataObject) -> None:
    operators = sorted({c.operator for c in pool})
    excluded_ops = data.draw(st.lists(st.sampled_from(operators), max_size=len(operators) - 1))
    excluded_ids = data.draw(st.lists(st.sampled_from([c.id for c in pool]), max_size=3))
    try:
        chosen = rules.draw(
            SECRET, TASK, 1, pool, exclude_operators=[o.upper() for o in excluded_ops],
            exclude_ids=excluded_ids,
        )
    except PoolTooSmall:
        left = [c for c in pool if c.operator not in excluded_ops and c.id not in excluded_ids]
        assert len(left) < rules.PANEL_SIZE
        return
    for c in chosen:
        assert c.operator not in excluded_ops
        assert c.id not in excluded_ids


@given(st.lists(positive_ppm, min_size=1, max_size=6))
def test_pick_index_is_exactly_proportional_to_weight(weights: list[int]) -> None:
    # Scale down so every r can be enumerated: each index owns exactly weights[i] values of r.
    small = [1 + w % 50 for w in weights]
    counts = Counter(rules.pick_index(small, r) for r in range(sum(small)))
    assert [counts[i] for i in range(len(small))] == small


def test_draw_favours_higher_calibration_in_proportion() -> None:
    # One seat, two candidates with weights 3:1 → about 75 % of 4 000 keys pick the heavier.
    pool = [Candidate("heavy", "a", 750_000), Candidate("light", "b", 250_000)]
    picks = Counter(
        rules.draw(SECRET, f"1:0x{'00' * 20}:{task}", 1, pool, seats=1)[0].id
        for task in range(4_000)
    )
    share = picks["heavy"] / 4_000
    assert 0.72 < share < 0.78  # binomial sd ≈ 0.007: ±4 sd


def test_draw_depends_on_secret_round_and_task() -> None:
    pool = [Candidate(f"v{i}", f"op{i}", 500_000) for i in range(30)]
    base = rules.draw(SECRET, TASK, 1, pool)
    others = [
        rules.draw(b"another-secret-0123456789abcdef", TASK, 1, pool),
        rules.draw(SECRET, TASK, 2, pool),
        rules.draw(SECRET, TASK[:-1] + "8", 1, pool),
    ]
    assert all(o != base for o in others)


def test_rerun_draw_excludes_the_first_panel() -> None:
    pool = [Candidate(f"v{i}", f"op{i}", 500_000) for i in range(6)]
    first = rules.draw(SECRET, TASK, 1, pool)
    second = rules.draw(SECRET, TASK, 2, pool, exclude_ids=[c.id for c in first])
    assert not {c.id for c in first} & {c.id for c in second}
    with pytest.raises(PoolTooSmall):
        rules.draw(SECRET, TASK, 2, pool[:5], exclude_ids=[c.id for c in first])


def test_draw_refuses_duplicates_and_empty_secret() -> None:
    pool = [Candidate("v", "a", 1), Candidate("V", "b", 1), Candidate("w", "c", 1)]
    with pytest.raises(ValueError, match="twice"):
        rules.draw(SECRET, TASK, 1, pool)
    with pytest.raises(ValueError, match="secret"):
        rules.draw(b"", TASK, 1, pool[:1])


# ---------------------------------------------------------------------------- consensus


@given(attestations())
def test_consensus_is_the_weighted_mean(seats: list[Attestation]) -> None:
    weights = [0 if a.timed_out else a.confidence_ppm * a.calibration_ppm for a in seats]
    value = rules.consensus(seats)
    if sum(weights) == 0:
        assert value is None
        return
    assert value == Fraction(sum(a.quality_ppm * w for a, w in zip(seats, weights, strict=True)),
                             sum(weights) * PPM)
    weighted = [a.quality_ppm for a, w in zip(seats, weights, strict=True) if w]
    assert Fraction(min(weighted), PPM) <= value <= Fraction(max(weighted), PPM)


@given(attestations(), st.lists(st.tuples(ppm, positive_ppm), max_size=4), st.booleans())
def test_consensus_ignores_confidence_zero_and_timeouts(
    seats: list[Attestation], extra: list[tuple[int, int]], timed_out: bool
) -> None:
    # Declines carry confidence 0; timeouts carry whatever confidence, and still no weight.
    zeros = [
        Attestation(f"z{i}", q, cal if timed_out else 0, cal, timed_out)
        for i, (q, cal) in enumerate(extra)
    ]
    assert rules.consensus(seats + zeros) == rules.consensus(seats)


def test_consensus_worked_example() -> None:
    seats = [
        Attestation("a", 800_000, 1_000_000, 500_000),
        Attestation("b", 600_000, 500_000, 1_000_000),
        Attestation("c", 100_000, 0, 1_000_000),
    ]
    # (0.8·1·0.5 + 0.6·0.5·1) / (1·0.5 + 0.5·1) = 0.7 / 1 = 0.7
    assert rules.consensus(seats) == Fraction(7, 10)
    result = rules.decide(1, seats)
    assert (result.outcome, result.consensus_ppm, result.weighted) == (Outcome.RULING, 700_000, ("a", "b"))


@given(st.integers(0, PPM - 20_000), st.lists(st.integers(0, 20_000), min_size=3, max_size=3), positive_ppm)
def test_colluding_panel_reruns_exactly_once(base: int, offsets: list[int], cal: int) -> None:
    seats = [Attestation(f"v{i}", base + o, PPM, cal) for i, o in enumerate(offsets)]
    assert rules.decide(1, seats).outcome is Outcome.RERUN
    # The rerun round with the same pattern rules instead of rerunning again.
    assert rules.decide(2, seats).outcome is Outcome.RULING


@given(attestations(min_size=2))
def test_rerun_iff_first_round_and_weighted_spread_within_0_02(seats: list[Attestation]) -> None:
    result = rules.decide(1, seats)
    weighted = [a.quality_ppm for a in seats if rules.weight(a) > 0]
    expected_rerun = len(weighted) >= 2 and max(weighted) - min(weighted) <= 20_000
    assert (result.outcome is Outcome.RERUN) == expected_rerun
    assert rules.decide(2, seats).outcome is not Outcome.RERUN


def test_spread_boundary_is_exact() -> None:
    at = [Attestation("a", 500_000, PPM, PPM), Attestation("b", 520_000, PPM, PPM)]
    over = [Attestation("a", 500_000, PPM, PPM), Attestation("b", 520_001, PPM, PPM)]
    assert rules.decide(1, at).outcome is Outcome.RERUN
    assert rules.decide(1, over).outcome is Outcome.RULING
    assert rules.to_ppm(0.52) - rules.to_ppm(0.50) == 20_000  # decimal text, not binary float


def test_no_weight_is_inconclusive_and_one_weighted_seat_rules() -> None:
    none = [Attestation("a", 900_000, 0, PPM), Attestation("b", 900_000, PPM, PPM, timed_out=True)]
    assert rules.decide(1, none).outcome is Outcome.INCONCLUSIVE
    one = [*none, Attestation("c", 300000, 200000, PPM)]
    result = rules.decide(1, one)
    assert (result.outcome, result.consensus_ppm) == (Outcome.RULING, 300_000)


def test_decide_refuses_double_attestation_and_bad_rounds() -> None:
    with pytest.raises(ValueError, match="twice"):
        rules.decide(1, [Attestation("a", 1, 1, 1), Attestation("A", 1, 1, 1)])
    for bad in (0, 3):
        with pytest.raises(ValueError):
            rules.decide(bad, [])


# ---------------------------------------------------------------------------- bands and split


def test_band_edges() -> None:
    assert rules.band(399_999) is Band.REJECT
    assert rules.band(400_000) is Band.REVISION
    assert rules.band(699_999) is Band.REVISION
    assert rules.band(700_000) is Band.ACCEPT
    assert [rules.agent_share_bps(q) for q in (0, 399_999, 400_000, 654_321, 699_999, 700_000, PPM)] == [
        0, 0, 4_000, 6_543, 6_999, 10_000, 10_000,
    ]


@given(ppm, ppm, st.booleans())
def test_share_is_monotone_and_schema_violations_never_reach_accept(a: int, b: int, ok: bool) -> None:
    low, high = sorted((a, b))
    assert rules.agent_share_bps(low, ok) <= rules.agent_share_bps(high, ok)
    assert 0 <= rules.agent_share_bps(high, ok) <= rules.BPS
    capped = rules.agent_share_bps(high, schema_ok=False)
    assert capped <= 6_999
    assert rules.band(rules.cap(high, False)) is not Band.ACCEPT
    if rules.band(high) is not Band.ACCEPT:
        assert capped == rules.agent_share_bps(high)  # the cap only bites in the accept band


def test_schema_violations_are_deterministic() -> None:
    schema = {"type": "object", "required": ["name", "price"], "properties": {"price": {"type": "number"}}}
    assert rules.schema_violations({"name": "x", "price": 3}, schema) == []
    found = rules.schema_violations({"price": "3"}, schema)
    assert found == rules.schema_violations({"price": "3"}, schema)
    assert any("price" in m for m in found) and any("name" in m for m in found)


# ---------------------------------------------------------------------------- calibration


@given(st.integers(rules.MIN_CALIBRATION_PPM, PPM), ppm, ppm, ppm, st.booleans())
def test_calibration_stays_in_bounds(cal: int, q: int, c: int, consensus: int, timed_out: bool) -> None:
    updated = rules.update_verifier(Attestation("v", q, c, cal, timed_out), consensus)
    assert rules.MIN_CALIBRATION_PPM <= updated <= PPM


@given(st.integers(rules.MIN_CALIBRATION_PPM, 900_000), ppm)
def test_confident_miss_costs_and_confident_hit_gains(cal: int, consensus: int) -> None:
    far = 0 if consensus > 500_000 else PPM
    assert rules.update_verifier(Attestation("v", far, PPM, cal), consensus) < cal or cal == rules.MIN_CALIBRATION_PPM
    assert rules.update_verifier(Attestation("v", consensus, PPM, cal), consensus) > cal


@given(st.integers(rules.MIN_CALIBRATION_PPM, PPM), ppm, ppm, ppm)
def test_matched_confidence_beats_mismatched(cal: int, q: int, consensus: int, c: int) -> None:
    hit = abs(q - consensus) <= rules.HIT_TOLERANCE_PPM
    matched = PPM if hit else 0
    best = rules.update_verifier(Attestation("v", q, matched, cal), consensus) if matched else cal
    other = rules.update_verifier(Attestation("v", q, c, cal), consensus)
    if matched:
        assert best >= other


@given(st.integers(0, 100), st.integers(0, 100))
def test_brier_is_proper(p_percent: int, c_percent: int) -> None:
    """Expected score is maximised by stating the true hit probability."""
    p = Fraction(p_percent, 100)

    def expected(conf: int) -> Fraction:
        c = conf * PPM // 100
        return p * rules.brier_score(c, True) + (1 - p) * rules.brier_score(c, False)

    assert expected(p_percent) >= expected(c_percent)


def test_decline_is_neutral_and_timeout_costs() -> None:
    assert rules.update_verifier(Attestation("v", 0, 0, 600_000), 900_000) == 600_000
    assert rules.update_verifier(Attestation("v", 0, 0, 600_000, timed_out=True), 900_000) == 540_000
    # Worked rate: confidence 0.8, hit → brier 0.96; 0.6 + 0.1·(0.96 − 0.6) = 0.636.
    assert rules.update_verifier(Attestation("v", 850_000, 800_000, 600_000), 900_000) == 636_000


def test_poster_calibration_and_drift() -> None:
    assert rules.update_poster(PPM, approved=True, consensus_ppm=PPM) == PPM
    assert rules.update_poster(PPM, approved=True, consensus_ppm=0) == 900_000
    assert rules.drifted(True, 400_000) and not rules.drifted(True, 600_000)
    assert rules.drifted(False, 600_000) and not rules.drifted(False, 500_000)
    streak = 0
    for consensus in (100_000, 200_000):
        streak = rules.next_pair_streak(streak, True, consensus)
    assert streak == rules.PAIR_DRIFT_LIMIT
    assert rules.review_sample_rate_ppm(PPM, streak) == PPM
    assert rules.next_pair_streak(streak, True, 900_000) == 0


# ---------------------------------------------------------------------------- sampling


@given(ppm, ppm, st.integers(0, 5))
def test_sample_rate_rises_as_calibration_falls(a: int, b: int, streak: int) -> None:
    low, high = sorted((a, b))
    assert rules.review_sample_rate_ppm(low, 0) >= rules.review_sample_rate_ppm(high, 0)
    assert rules.BASE_REVIEW_SAMPLE_PPM <= rules.review_sample_rate_ppm(a, 0) <= rules.MAX_POSTER_SAMPLE_PPM
    assert rules.review_sample_rate_ppm(a, streak) >= rules.review_sample_rate_ppm(a, 0)
    assert rules.review_sample_rate_ppm(PPM, 0) == 100_000


def test_sampling_is_deterministic_and_near_ten_percent() -> None:
    keys = [f"1:0x{'ab' * 20}:{i}" for i in range(5_000)]
    sampled = [rules.sample_review(SECRET, k, 1, 100_000) for k in keys]
    assert sampled == [rules.sample_review(SECRET, k, 1, 100_000) for k in keys]
    assert 0.08 < sum(sampled) / len(keys) < 0.12  # binomial sd ≈ 0.004
    assert all(rules.sample_review(SECRET, k, 1, PPM) for k in keys[:100])
    assert not any(rules.sample_review(SECRET, k, 1, 0) for k in keys[:100])
    assert sampled != [rules.sample_review(b"other-secret-0123456789abcdef", k, 1, 100_000) for k in keys]


# ---------------------------------------------------------------------------- fees


@given(st.lists(st.text(min_size=1, max_size=8), unique_by=str.lower, max_size=5), st.integers(0, 10**24))
def test_fee_ledger_sums_to_zero(verifiers: list[str], fee: int) -> None:
    entries = rules.fee_entries(verifiers, fee, "poster:0xabc")
    assert sum(e.delta for e in entries) == 0
    credited = [e.account for e in entries if e.delta > 0]
    assert credited == (verifiers if fee else [])


def test_losing_side() -> None:
    assert rules.losing_side(10_000) == "poster"
    assert rules.losing_side(5_000) == "poster"
    assert rules.losing_side(4_999) == "agent"


@settings(max_examples=50)
@given(attestations(min_size=3, max_size=3), st.integers(1, 10**18))
def test_timed_out_seat_earns_no_fee(seats: list[Attestation], fee: int) -> None:
    result = rules.decide(2, seats)
    entries = rules.fee_entries(list(result.weighted), fee, "agent:0x1")
    paid = {e.account for e in entries if e.delta > 0}
    for a in seats:
        if a.timed_out or a.confidence_ppm == 0:
            assert a.verifier not in paid
