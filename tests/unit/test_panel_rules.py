"""Panel rules (seed 003): draw, consensus, rerun, bands, calibration, sampling and fees."""

from __future__ import annotations

import hashlib
import hmac
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
    operators = [f"op{i}" for i in range(draw(st.integers(3, 6)))]
    chosen = [operators[i % 3] for i in range(3)] + [draw(st.sampled_from(operators)) for _ in range(size - 3)]
    return [Candidate(f"v{i:02d}", op, draw(positive_ppm)) for i, op in enumerate(chosen)]


@st.composite
def attestations(draw: st.DrawFn, min_size: int = 1, max_size: int = 6) -> list[Attestation]:
    size = draw(st.integers(min_size, max_size))
    return [
        Attestation(f"v{i}", draw(ppm), draw(ppm), draw(positive_ppm), draw(st.booleans()))
        for i in range(size)
    ]


# ---------------------------------------------------------------------------- draw

# The pinned pool: 16 verifiers of 8 operators, calibrations 0.1 … 0.7. Ids end in 01 … 10.
POOL = [Candidate(f"0x{i:040x}", f"op{i % 8}", 100_000 * (1 + i % 7)) for i in range(1, 17)]


def _ends(chosen: list[Candidate]) -> list[str]:
    return [c.id[-2:] for c in chosen]


def test_draw_pinned_vectors() -> None:
    """Literal outputs of the documented formula: any change to the message, the order, the
    weights, the cap or the interval rule moves at least one of them."""
    first = rules.draw(SECRET, TASK, 1, POOL)
    assert _ends(first) == ["04", "02", "0b"]
    assert _ends(rules.draw(SECRET, TASK, 2, POOL)) == ["06", "04", "0f"]
    rerun = rules.draw(SECRET, TASK, 2, POOL, exclude_ids=[c.id for c in first],
                       exclude_operators=[c.operator for c in first])
    assert _ends(rerun) == ["09", "10", "06"]
    assert _ends(rules.draw(SECRET, TASK, 1, POOL, operator_cap_ppm=300_000)) == ["02", "03", "06"]
    assert _ends(rules.draw(b"another-secret-0123456789abcdef", TASK, 1, POOL)) == ["08", "04", "0d"]
    assert _ends(rules.draw(SECRET, TASK[:-1] + "8", 1, POOL)) == ["06", "0a", "0b"]
    assert _ends(rules.draw(SECRET, TASK, 1, list(reversed(POOL)))) == ["04", "02", "0b"]


def test_draw_first_seat_follows_the_documented_hmac() -> None:
    """Seat 0 recomputed from the formula in docs/panels.md, independently of `draw`."""
    def r(suffix: str) -> int:
        message = f"escrowd-panel-draw|{TASK}|1|0|{suffix}".encode()
        return int.from_bytes(hmac.new(SECRET, message, hashlib.sha256).digest(), "big")

    operators = sorted({c.operator for c in POOL})
    weights = [min(sum(c.calibration_ppm for c in POOL if c.operator == o), PPM) for o in operators]
    operator = operators[rules.pick_index(weights, r("operator") % sum(weights))]
    members = sorted((c for c in POOL if c.operator == operator), key=lambda c: c.id)
    inner = [c.calibration_ppm for c in members]
    assert members[rules.pick_index(inner, r("verifier") % sum(inner))] == rules.draw(SECRET, TASK, 1, POOL)[0]


def test_operator_shares_pinned() -> None:
    shares = rules.operator_shares(POOL)
    assert shares["op0"] == Fraction(5, 57) and shares["op4"] == Fraction(10, 57) and shares["op7"] == Fraction(1, 19)
    assert set(rules.operator_shares(POOL, 300_000).values()) == {Fraction(1, 8)}


@given(pools(), st.integers(1, 2), st.text(min_size=1, max_size=30))
def test_draw_is_deterministic_and_ignores_pool_order(
    pool: list[Candidate], round_number: int, key: str
) -> None:
    first = rules.draw(SECRET, key, round_number, pool)
    assert rules.draw(SECRET, key, round_number, list(reversed(pool))) == first
    assert len(first) == rules.PANEL_SIZE
    assert len({c.id for c in first}) == rules.PANEL_SIZE
    assert len({c.operator for c in first}) == rules.PANEL_SIZE  # one seat per operator


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
        left = {c.operator for c in pool if c.operator not in excluded_ops and c.id not in excluded_ids}
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


def test_pick_index_boundaries() -> None:
    assert [rules.pick_index([3, 1, 2], r) for r in range(6)] == [0, 0, 0, 1, 2, 2]
    with pytest.raises(ValueError, match="not below"):
        rules.pick_index([3, 1, 2], 6)


def test_draw_favours_higher_calibration_in_proportion() -> None:
    # One seat, two operators with weights 3:1 → about 75 % of 4 000 keys pick the heavier.
    pool = [Candidate("heavy", "a", 750_000), Candidate("light", "b", 250_000)]
    picks = Counter(
        rules.draw(SECRET, f"1:0x{'00' * 20}:{task}", 1, pool, seats=1)[0].id
        for task in range(4_000)
    )
    share = picks["heavy"] / 4_000
    assert 0.72 < share < 0.78  # binomial sd ≈ 0.007: ±4 sd


def test_a_sybil_operator_never_holds_two_seats_and_weighs_at_most_the_cap() -> None:
    # 200 addresses of one operator against 50 honest operators (issue: 89 % sybil majorities).
    sybils = [Candidate(f"s{i:03d}", "sybil", START) for i in range(200)]
    honest = [Candidate(f"h{i:03d}", f"honest{i}", START) for i in range(50)]
    shares = rules.operator_shares(sybils + honest)
    assert shares["sybil"] == Fraction(PPM, PPM + 50 * START)  # capped at one full verifier
    for task in range(300):
        seated = rules.draw(SECRET, f"1:0x{'00' * 20}:{task}", 1, sybils + honest)
        assert sum(c.operator == "sybil" for c in seated) <= 1


def test_rerun_draw_excludes_the_first_panel() -> None:
    pool = [Candidate(f"v{i}", f"op{i}", 500_000) for i in range(6)]
    first = rules.draw(SECRET, TASK, 1, pool)
    second = rules.draw(SECRET, TASK, 2, pool, exclude_ids=[c.id for c in first])
    assert not {c.id for c in first} & {c.id for c in second}
    with pytest.raises(PoolTooSmall):
        rules.draw(SECRET, TASK, 2, pool[:5], exclude_ids=[c.id for c in first])


def test_draw_needs_three_operators_and_refuses_bad_input() -> None:
    pool = [Candidate("v", "a", 1), Candidate("V", "b", 1), Candidate("w", "c", 1)]
    with pytest.raises(ValueError, match="twice"):
        rules.draw(SECRET, TASK, 1, pool)
    with pytest.raises(ValueError, match="secret"):
        rules.draw(b"", TASK, 1, pool[:1])
    two_operators = [Candidate(f"v{i}", "ab"[i % 2], PPM) for i in range(10)]
    with pytest.raises(PoolTooSmall, match="2 eligible operators"):
        rules.draw(SECRET, TASK, 1, two_operators)
    for cap in (0, -1, True):
        with pytest.raises(ValueError, match="cap"):
            rules.draw(SECRET, TASK, 1, POOL, operator_cap_ppm=cap)


# ---------------------------------------------------------------------------- consensus

MIN = rules.MIN_CONFIDENCE_PPM
START = rules.START_CALIBRATION_PPM


def test_minimum_confidence_default_is_pinned() -> None:
    assert MIN == 100_000
    assert rules.counts(Attestation("a", 0, 100_000, PPM))
    assert not rules.counts(Attestation("a", 0, 99_999, PPM))
    assert not rules.counts(Attestation("a", 0, 100_000, PPM, timed_out=True))
    assert rules.counts(Attestation("a", 0, 1, PPM), min_confidence_ppm=0)  # 0 still needs > 0
    assert not rules.counts(Attestation("a", 0, 0, PPM), min_confidence_ppm=0)


@given(attestations(), st.integers(0, PPM))
def test_consensus_is_the_weighted_mean(seats: list[Attestation], minimum: int) -> None:
    weights = [a.confidence_ppm * a.calibration_ppm if rules.counts(a, minimum) else 0 for a in seats]
    value = rules.consensus(seats, minimum)
    if sum(weights) == 0:
        assert value is None
        return
    assert value == Fraction(sum(a.quality_ppm * w for a, w in zip(seats, weights, strict=True)),
                             sum(weights) * PPM)
    weighted = [a.quality_ppm for a, w in zip(seats, weights, strict=True) if w]
    assert Fraction(min(weighted), PPM) <= value <= Fraction(max(weighted), PPM)


@given(attestations(), st.lists(st.tuples(ppm, st.integers(0, MIN - 1), positive_ppm), max_size=4), st.booleans())
def test_declines_change_nothing(
    seats: list[Attestation], extra: list[tuple[int, int, int]], timed_out: bool
) -> None:
    # Below the minimum confidence, or timed out with any confidence: no weight, no spread.
    declines = [
        Attestation(f"z{i}", q, PPM if timed_out else c, cal, timed_out)
        for i, (q, c, cal) in enumerate(extra)
    ]
    assert rules.consensus(seats + declines) == rules.consensus(seats)
    with_declines, alone = rules.decide(1, seats + declines), rules.decide(1, seats)
    assert (with_declines.outcome, with_declines.spread_ppm, with_declines.weighted) == (
        alone.outcome, alone.spread_ppm, alone.weighted)


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


def test_consensus_rounds_once_half_to_even() -> None:
    def ppm_of(*qualities: int) -> int | None:
        return rules.decide(2, [Attestation(f"v{i}", q, PPM, PPM) for i, q in enumerate(qualities)]).consensus_ppm

    # Exact means 1.5, 2.5 and 3.5 ppm: half to even gives 2, 2 and 4 (half up would give 3 for 2.5).
    assert (ppm_of(1, 2), ppm_of(2, 3), ppm_of(3, 4)) == (2, 2, 4)
    assert ppm_of(0, 0, 1) == 0 and ppm_of(0, 1, 1) == 1  # 1/3 and 2/3 ppm
    assert ppm_of(1_000_000, 0, 0) == 333_333 and ppm_of(1_000_000, 1_000_000, 0) == 666_667
    assert rules.round_ppm(Fraction(1, 2 * PPM)) == 0 and rules.round_ppm(Fraction(3, 2 * PPM)) == 2


def test_two_colluders_cannot_dodge_the_rerun_with_a_weightless_third() -> None:
    # Issue 25 item 5: two agree exactly, the third attests quality 0 with confidence 1e-6.
    seats = [Attestation("a", 950_000, PPM, START), Attestation("b", 950_000, PPM, START),
             Attestation("c", 0, 1, START)]
    result = rules.decide(1, seats)
    assert (result.outcome, result.spread_ppm, result.weighted) == (Outcome.RERUN, 0, ("a", "b"))
    # At the minimum the third counts: it widens the spread, and it pays for it (below).
    counted = rules.decide(1, [*seats[:2], Attestation("c", 0, MIN, START)])
    assert (counted.outcome, counted.spread_ppm) == (Outcome.RULING, 950_000)


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
    assert rules.decide(1, at[:1]).outcome is Outcome.RULING  # one weighted seat never reruns
    assert rules.to_ppm(0.52) - rules.to_ppm(0.50) == 20_000  # decimal text, not binary float


def test_no_weight_is_inconclusive_and_one_weighted_seat_rules() -> None:
    none = [Attestation("a", 900_000, 0, PPM), Attestation("b", 900_000, PPM, PPM, timed_out=True),
            Attestation("d", 900_000, MIN - 1, PPM)]
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


def test_hit_tolerance_and_window_pinned() -> None:
    assert rules.HIT_TOLERANCE_PPM == 100_000
    assert rules.hit(500_000, 600_000) and rules.hit(500_000, 400_000)
    assert not rules.hit(500_000, 600_001) and not rules.hit(500_000, 399_999)
    assert [rules.window_ppm(q) for q in (0, 50_000, 100_000, 500_000, 950_000, PPM)] == [
        100_000, 150_000, 200_000, 200_000, 150_000, 100_000]


def test_accuracy_score_pinned_vectors() -> None:
    # hit: 1/2 + c − c²/2; miss: 1/2 − c·w/(1 − w) − c²/2 (w the window's width).
    assert rules.accuracy_score(500_000, 900_000, 550_000) == Fraction(199, 200)
    assert rules.accuracy_score(500_000, 900_000, 700_000) == Fraction(-13, 100)
    assert rules.accuracy_score(0, PPM, 800_000) == Fraction(-1, 9)
    assert rules.accuracy_score(PPM, 500_000, 950_000) == Fraction(7, 8)
    assert rules.accuracy_score(50_000, 200_000, 500_000) == Fraction(189, 425)
    assert rules.accuracy_score(123_456, 0, 999_999) == Fraction(1, 2)  # c = 0: neutral either way


@settings(max_examples=300)
@given(ppm, st.integers(0, 100), st.integers(0, 100))
def test_the_score_is_proper_in_confidence(q: int, p_percent: int, other_percent: int) -> None:
    """For any quality, the expected score under the verifier's own hit probability p is
    largest at c = (p − w)/(1 − w) (0 when p ≤ w): stating anything else loses."""
    p = Fraction(p_percent, 100)
    w = Fraction(rules.window_ppm(q), PPM)
    far = (q + 500_000) % (PPM + 1)  # a reference outside the window

    def expected(c: Fraction) -> Fraction:
        conf = round(c * PPM)
        return p * rules.accuracy_score(q, conf, q) + (1 - p) * rules.accuracy_score(q, conf, far)

    best = max(Fraction(0), (p - w) / (1 - w))
    assert expected(best) >= expected(Fraction(other_percent, 100)) - Fraction(1, 10**9)


@given(ppm, st.integers(1, PPM))
def test_a_blind_quality_never_gains(q: int, c: int) -> None:
    """A verifier with no information hits by chance (p = w): every confidence above 0 scores
    below the neutral 1/2 in expectation, so farming with junk loses calibration."""
    w = Fraction(rules.window_ppm(q), PPM)
    far = (q + 500_000) % (PPM + 1)
    expected = w * rules.accuracy_score(q, c, q) + (1 - w) * rules.accuracy_score(q, c, far)
    assert expected < Fraction(1, 2)


def test_calibration_farming_loses_to_an_honest_verifier() -> None:
    # Issue 25 item 5: quality 0, confidence 1e-6, 30 rounds against a consensus of 0.8.
    farmer = honest = low_farmer = START
    for _ in range(30):
        farmer = rules.update_verifier(Attestation("f", 0, 1, farmer), 800_000)
        low_farmer = rules.update_verifier(Attestation("g", 0, MIN, low_farmer), 800_000)
        honest = rules.update_verifier(Attestation("h", 790_000, 900_000, honest), 800_000)
    assert farmer == START  # a decline: no move
    assert (low_farmer, honest) == (484_570, 974_016)  # at the minimum it pays; honesty gains


def test_update_verifier_pinned_vectors() -> None:
    assert rules.update_verifier(Attestation("v", 850_000, 800_000, 600_000), 900_000) == 638_000
    assert rules.update_verifier(Attestation("v", 0, 100_000, 600_000), 900_000) == 588_389
    assert rules.update_verifier(Attestation("v", 0, PPM, 600_000), 900_000) == 528_889
    assert rules.update_verifier(Attestation("v", 0, 0, 600_000, timed_out=True), 900_000) == 540_000
    assert rules.update_verifier(Attestation("v", 0, 0, 600_000), 900_000) == 600_000
    assert rules.update_verifier(Attestation("v", 0, MIN - 1, 600_000), 900_000) == 600_000
    assert rules.update_verifier(Attestation("v", 900_000, PPM, 600_000), None) == 600_000
    assert rules.update_verifier(Attestation("v", 0, PPM, 10_000), PPM) == 10_000  # the floor
    assert rules.update_verifier(Attestation("v", PPM, PPM, PPM), PPM) == PPM  # the ceiling


@given(st.integers(rules.MIN_CALIBRATION_PPM, PPM), ppm, ppm, ppm, st.booleans())
def test_calibration_stays_in_bounds(cal: int, q: int, c: int, consensus: int, timed_out: bool) -> None:
    updated = rules.update_verifier(Attestation("v", q, c, cal, timed_out), consensus)
    assert rules.MIN_CALIBRATION_PPM <= updated <= PPM


@given(st.integers(rules.MIN_CALIBRATION_PPM, 900_000), ppm)
def test_confident_miss_costs_and_confident_hit_gains(cal: int, consensus: int) -> None:
    far = 0 if consensus > 500_000 else PPM
    assert rules.update_verifier(Attestation("v", far, PPM, cal), consensus) < cal or cal == rules.MIN_CALIBRATION_PPM
    assert rules.update_verifier(Attestation("v", consensus, PPM, cal), consensus) > cal


def test_a_heavy_verifier_is_scored_against_the_others() -> None:
    # Weight 1·1 against 0.5·0.5 twice: the round's consensus is 0.6, within 0.1 of the heavy
    # seat's 0.5, but the other seats say 0.8: against them the heavy seat misses.
    seats = [Attestation("heavy", 500_000, PPM, PPM), Attestation("b", 800_000, 500_000, 500_000),
             Attestation("c", 800_000, 500_000, 500_000)]
    assert rules.decide(2, seats).consensus_ppm == 600_000
    assert rules.peer_consensus_ppm(seats, "HEAVY") == 800_000
    assert rules.peer_consensus_ppm(seats, "b") == 560_000  # (0.5·1 + 0.8·0.25) / 1.25
    assert rules.peer_consensus_ppm(seats[:1], "heavy") is None
    assert rules.update_verifier(seats[0], rules.peer_consensus_ppm(seats, "heavy")) < PPM


def test_decline_is_neutral_and_timeout_costs() -> None:
    assert rules.update_verifier(Attestation("v", 0, 0, 600_000), 900_000) == 600_000
    assert rules.update_verifier(Attestation("v", 0, 0, 600_000, timed_out=True), 900_000) == 540_000


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


def test_sample_rate_pinned() -> None:
    assert [rules.review_sample_rate_ppm(c, 0) for c in (PPM, 750_000, 500_000, 10_000, 0)] == [
        100_000, 200_000, 300_000, 496_000, 500_000]
    assert rules.review_sample_rate_ppm(PPM, 1) == 100_000
    assert rules.review_sample_rate_ppm(PPM, 2) == PPM


def test_sampling_pinned_vectors() -> None:
    keys = [f"1:0x{'ab' * 20}:{i}" for i in range(40)]
    assert [i for i, k in enumerate(keys) if rules.sample_review(SECRET, k, 1, 100_000)] == [9, 10, 33]
    assert [i for i, k in enumerate(keys) if rules.sample_review(SECRET, k, 2, 300_000)] == [
        4, 5, 6, 8, 11, 15, 16, 23, 24, 33, 38, 39]
    # HMAC(secret, "escrowd-review-sample|TASK|1") mod 10⁶ = 33 007: sampled exactly above it.
    message = f"escrowd-review-sample|{TASK}|1".encode()
    assert int.from_bytes(hmac.new(SECRET, message, hashlib.sha256).digest(), "big") % PPM == 33_007
    assert not rules.sample_review(SECRET, TASK, 1, 33_007)
    assert rules.sample_review(SECRET, TASK, 1, 33_008)


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
        if not rules.counts(a):
            assert a.verifier not in paid
