"""Dispute panels as pure rules (seed 003, SPEC §6.5): draw, consensus, rerun, bands, split,
calibration, review sampling and fees. No I/O; every number is exact.

Units. Quality, confidence and calibration are values in [0, 1] carried as integers in parts
per million (`PPM` = 1 000 000), so comparisons such as "within 0.02" are exact and a round
gives the same answer on every machine. Consensus is an exact `Fraction` until it is rounded
once (half to even) to ppm. Splits are basis points (`BPS` = 10 000); fees are integer token
units. `docs/panels.md` restates every formula.

Rounds are numbered from 1: round 1 is the first panel of a task, round 2 its only possible
rerun (`MAX_ROUND`).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from typing import Any

PPM = 1_000_000
BPS = 10_000

PANEL_SIZE = 3
FIRST_ROUND = 1
MAX_ROUND = 2
"""Round 2 is the rerun; a rerun never reruns."""

COLLUSION_SPREAD_PPM = 20_000
"""A panel whose weighted qualities all lie within 0.02 of each other is rerun (seed 003)."""

# Bands, defined here and nowhere else: [0, REVISION_FLOOR) reject, [REVISION_FLOOR,
# ACCEPT_FLOOR) revision, [ACCEPT_FLOOR, 1] accept.
REVISION_FLOOR_PPM = 400_000
ACCEPT_FLOOR_PPM = 700_000

START_CALIBRATION_PPM = 500_000
"""Calibration of a newly registered verifier: neither trusted nor distrusted."""
MIN_CALIBRATION_PPM = 10_000
"""Calibration never falls below 0.01, so nobody is weightless in the draw, only rare."""
CALIBRATION_RATE = Fraction(1, 10)
"""η: the share of the gap to the round's score that calibration moves each round."""
HIT_TOLERANCE_PPM = 100_000
"""The window an attestation claims: the consensus lies within 0.1 of its quality."""
MIN_CONFIDENCE_PPM = 100_000
"""Default minimum confidence (0.1): below it an attestation is a decline (no weight, no fee,
no calibration move, outside the spread), so a near-zero confidence buys nothing."""
OPERATOR_WEIGHT_CAP_PPM = PPM
"""Default draw weight cap of one operator identity: all its verifiers together weigh at most
one fully calibrated verifier. One operator never holds two seats of one panel."""
OPERATOR_COOLDOWN_SECONDS = 7 * 86_400
"""A verifier's new operator id takes effect only after this long (until then both count for
exclusions, the old one for the draw)."""

POSTER_START_CALIBRATION_PPM = PPM
"""A poster starts fully trusted (nothing held against it yet), like reputation."""
BASE_REVIEW_SAMPLE_PPM = 100_000
"""10 % of manually reviewed tasks go to a panel (seed 003)."""
MAX_POSTER_SAMPLE_PPM = 500_000
"""A poster at the calibration floor is sampled at 50 %."""
PAIR_DRIFT_LIMIT = 2
"""A poster–agent pair with this many drifting reviews in a row is sampled at 100 %."""
DRIFT_THRESHOLD_PPM = 500_000
"""A sampled review drifts when its claim lies more than 0.5 from the panel's consensus."""


class Band(StrEnum):
    """Where a quality lands: the ruling's coarse outcome."""

    REJECT = "reject"
    REVISION = "revision"
    ACCEPT = "accept"


class Outcome(StrEnum):
    """What a closed round leads to."""

    RULING = "ruling"
    RERUN = "rerun"
    INCONCLUSIVE = "inconclusive"


class PoolTooSmall(ValueError):
    """Fewer eligible verifiers than seats: the round goes to the human arbiter."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """A registered verifier as the draw sees it."""

    id: str
    operator: str
    calibration_ppm: int


@dataclass(frozen=True, slots=True)
class Attestation:
    """One seat's answer. A decline, failure or timeout is confidence 0."""

    verifier: str
    quality_ppm: int
    confidence_ppm: int
    calibration_ppm: int
    timed_out: bool = False


@dataclass(frozen=True, slots=True)
class RoundResult:
    """The consensus of one round and what follows from it."""

    round: int
    outcome: Outcome
    consensus: Fraction | None
    consensus_ppm: int | None
    spread_ppm: int | None
    weighted: tuple[str, ...]


def to_ppm(value: float | int | str) -> int:
    """A [0, 1] value as exact ppm, rounded half to even from its decimal text."""
    exact = Fraction(str(value)) if not isinstance(value, int) else Fraction(value)
    if not 0 <= exact <= 1:
        raise ValueError(f"{value!r} outside [0, 1]")
    return round(exact * PPM)


def _check_ppm(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= PPM:
        raise ValueError(f"{name} {value!r} outside 0..{PPM} ppm")


# ---------------------------------------------------------------------------- the draw


def _hmac_int(secret: bytes, message: str) -> int:
    return int.from_bytes(hmac.new(secret, message.encode(), hashlib.sha256).digest(), "big")


def pick_index(weights: Sequence[int], r: int) -> int:
    """The index whose cumulative-weight interval holds `r` (0 <= r < sum(weights)).

    Exactly `weights[i]` values of `r` pick index `i`: the draw is proportional to weight.
    """
    total = 0
    for index, weight in enumerate(weights):
        total += weight
        if r < total:
            return index
    raise ValueError(f"r={r} not below the total weight {total}")


def eligible(
    pool: Iterable[Candidate],
    exclude_operators: Iterable[str] = (),
    exclude_ids: Iterable[str] = (),
) -> list[Candidate]:
    """The candidates that may sit: not an excluded operator or id (case-insensitive), positive
    calibration, one entry per id; sorted by id so the pool's order never matters."""
    operators = {o.lower() for o in exclude_operators}
    ids = {i.lower() for i in exclude_ids}
    seen: dict[str, Candidate] = {}
    for candidate in pool:
        _check_ppm("calibration", candidate.calibration_ppm)
        key = candidate.id.lower()
        if key in seen:
            raise ValueError(f"verifier {candidate.id!r} listed twice")
        seen[key] = candidate
    return sorted(
        (
            c
            for key, c in seen.items()
            if key not in ids and c.operator.lower() not in operators and c.calibration_ppm > 0
        ),
        key=lambda c: c.id.lower(),
    )


def draw(
    secret: bytes,
    task_key: str,
    round_number: int,
    pool: Iterable[Candidate],
    *,
    exclude_operators: Iterable[str] = (),
    exclude_ids: Iterable[str] = (),
    seats: int = PANEL_SIZE,
    operator_cap_ppm: int = OPERATOR_WEIGHT_CAP_PPM,
) -> list[Candidate]:
    """Draw `seats` verifiers of `seats` distinct operators, without replacement.

    Seat `s` first picks an operator: `r = HMAC-SHA256(secret, "escrowd-panel-draw|<task
    key>|<round>|<s>|operator") mod W` over the operators not yet seated (sorted by id, each
    weighing the sum of its verifiers' calibration capped at `operator_cap_ppm`, W their
    total); then one of that operator's verifiers: `HMAC(..., "...|<s>|verifier") mod` their
    total calibration, over them sorted by id. An operator holds at most one seat, and a
    thousand addresses of one operator weigh no more than the cap. Anyone with the secret
    reproduces it; without the secret nobody can predict it.
    """
    if not secret:
        raise ValueError("the draw secret is empty")
    if round_number < FIRST_ROUND:
        raise ValueError(f"round {round_number} < {FIRST_ROUND}")
    if isinstance(operator_cap_ppm, bool) or not isinstance(operator_cap_ppm, int) or operator_cap_ppm < 1:
        raise ValueError(f"operator cap {operator_cap_ppm!r} must be a positive integer (ppm)")
    groups: dict[str, list[Candidate]] = {}
    for candidate in eligible(pool, exclude_operators, exclude_ids):
        groups.setdefault(candidate.operator.lower(), []).append(candidate)
    if len(groups) < seats:
        raise PoolTooSmall(f"{len(groups)} eligible operators for {seats} seats")
    chosen: list[Candidate] = []
    for seat in range(seats):
        operators = sorted(groups)
        weights = [min(sum(c.calibration_ppm for c in groups[o]), operator_cap_ppm) for o in operators]
        prefix = f"escrowd-panel-draw|{task_key}|{round_number}|{seat}"
        operator = operators[pick_index(weights, _hmac_int(secret, prefix + "|operator") % sum(weights))]
        members = groups.pop(operator)
        inner = [c.calibration_ppm for c in members]
        chosen.append(members[pick_index(inner, _hmac_int(secret, prefix + "|verifier") % sum(inner))])
    return chosen


def operator_shares(pool: Iterable[Candidate], operator_cap_ppm: int = OPERATOR_WEIGHT_CAP_PPM) -> dict[str, Fraction]:
    """Each operator's chance of the first seat: its capped weight over the total."""
    totals: dict[str, int] = {}
    for c in eligible(pool):
        totals[c.operator.lower()] = totals.get(c.operator.lower(), 0) + c.calibration_ppm
    capped = {o: min(t, operator_cap_ppm) for o, t in totals.items()}
    whole = sum(capped.values())
    return {o: Fraction(w, whole) for o, w in sorted(capped.items())}


# ---------------------------------------------------------------------------- consensus


def counts(attestation: Attestation, min_confidence_ppm: int = MIN_CONFIDENCE_PPM) -> bool:
    """Whether the attestation carries weight: in time and at least the minimum confidence.

    Anything else (a timeout, a decline, a confidence below the minimum) is a decline: no
    weight, no fee, no calibration move for accuracy, and outside the spread.
    """
    _check_ppm("minimum confidence", min_confidence_ppm)
    return not attestation.timed_out and attestation.confidence_ppm >= max(1, min_confidence_ppm)


def weight(attestation: Attestation, min_confidence_ppm: int = MIN_CONFIDENCE_PPM) -> int:
    """confidence × calibration (ppm²); 0 for a decline, a failure, a timeout or a confidence
    below the minimum."""
    if not counts(attestation, min_confidence_ppm):
        return 0
    return attestation.confidence_ppm * attestation.calibration_ppm


def consensus(
    attestations: Iterable[Attestation], min_confidence_ppm: int = MIN_CONFIDENCE_PPM
) -> Fraction | None:
    """Σ q·c·cal / Σ c·cal over the weighted attestations, exact; None when nothing carries weight."""
    numerator = 0
    denominator = 0
    for a in attestations:
        for name in ("quality_ppm", "confidence_ppm", "calibration_ppm"):
            _check_ppm(name, getattr(a, name))
        w = weight(a, min_confidence_ppm)
        numerator += a.quality_ppm * w
        denominator += w
    if denominator == 0:
        return None
    return Fraction(numerator, denominator * PPM)


def round_ppm(value: Fraction) -> int:
    """A [0, 1] fraction as ppm, rounded once, half to even."""
    return round(value * PPM)


def peer_consensus_ppm(
    attestations: Sequence[Attestation], verifier: str, min_confidence_ppm: int = MIN_CONFIDENCE_PPM
) -> int | None:
    """The consensus of the *other* seats (ppm), against which `verifier` is scored.

    Scoring a seat against a consensus it helped make would let a heavy verifier pull the
    reference toward itself and always look right; None when no other seat carries weight.
    """
    others = [a for a in attestations if a.verifier.lower() != verifier.lower()]
    value = consensus(others, min_confidence_ppm)
    return None if value is None else round_ppm(value)


def decide(
    round_number: int, attestations: Sequence[Attestation], min_confidence_ppm: int = MIN_CONFIDENCE_PPM
) -> RoundResult:
    """Close a round: consensus, and whether it rules, reruns or goes to the human arbiter.

    Rerun rule: in the first round, when at least two attestations carry weight and their
    qualities all lie within `COLLUSION_SPREAD_PPM` of each other (max − min ≤ 0.02), the
    round reruns with fresh verifiers. Declines (below the minimum confidence) are outside
    the spread, so an attestation that carries no weight cannot widen it to dodge the rerun.
    A rerun round (`MAX_ROUND`) never reruns.
    """
    if not FIRST_ROUND <= round_number <= MAX_ROUND:
        raise ValueError(f"round {round_number} outside {FIRST_ROUND}..{MAX_ROUND}")
    ids = [a.verifier.lower() for a in attestations]
    if len(set(ids)) != len(ids):
        raise ValueError("one verifier attested twice in a round")
    value = consensus(attestations, min_confidence_ppm)
    weighted = tuple(a for a in attestations if counts(a, min_confidence_ppm))
    if value is None:
        return RoundResult(round_number, Outcome.INCONCLUSIVE, None, None, None, ())
    qualities = [a.quality_ppm for a in weighted]
    spread = max(qualities) - min(qualities)
    rerun = round_number < MAX_ROUND and len(weighted) >= 2 and spread <= COLLUSION_SPREAD_PPM
    return RoundResult(
        round_number,
        Outcome.RERUN if rerun else Outcome.RULING,
        value,
        round_ppm(value),
        spread,
        tuple(a.verifier for a in weighted),
    )


# ---------------------------------------------------------------------------- bands and split


def band(quality_ppm: int) -> Band:
    """The band of a quality (thresholds `REVISION_FLOOR_PPM`, `ACCEPT_FLOOR_PPM`)."""
    _check_ppm("quality", quality_ppm)
    if quality_ppm >= ACCEPT_FLOOR_PPM:
        return Band.ACCEPT
    if quality_ppm >= REVISION_FLOOR_PPM:
        return Band.REVISION
    return Band.REJECT


def cap(quality_ppm: int, schema_ok: bool) -> int:
    """Schema first: output that violates the terms' schema is held below the accept band."""
    _check_ppm("quality", quality_ppm)
    return quality_ppm if schema_ok else min(quality_ppm, ACCEPT_FLOOR_PPM - 1)


def agent_share_bps(quality_ppm: int, schema_ok: bool = True) -> int:
    """The agent's share of the reward for `resolveDispute`, in basis points.

    reject → 0; revision → ⌊quality × 10 000⌋ (4 000..6 999); accept → 10 000. The quality is
    capped first (`cap`), so a schema violation never earns more than 6 999.
    """
    quality = cap(quality_ppm, schema_ok)
    match band(quality):
        case Band.REJECT:
            return 0
        case Band.REVISION:
            return quality * BPS // PPM
        case Band.ACCEPT:
            return BPS


def schema_violations(output: Any, schema: Mapping[str, Any], limit: int = 10) -> list[str]:
    """Deterministic JSON Schema (2020-12) check of the output; empty when it conforms.

    Messages are sorted so the same output always yields the same list.
    """
    import jsonschema  # imported lazily: only the service and the CLI need it

    validator = jsonschema.Draft202012Validator(dict(schema))
    messages = sorted(
        f"{'/'.join(str(p) for p in error.absolute_path) or '$'}: {error.message[:200]}"
        for error in validator.iter_errors(output)
    )
    return messages[:limit]


# ---------------------------------------------------------------------------- calibration


def _move(calibration_ppm: int, score: Fraction) -> int:
    current = Fraction(calibration_ppm, PPM)
    moved = round_ppm(current + CALIBRATION_RATE * (score - current))
    return max(MIN_CALIBRATION_PPM, min(PPM, moved))


def window_ppm(quality_ppm: int) -> int:
    """Width of the window an attestation claims: [q − 0.1, q + 0.1] within [0, 1]."""
    _check_ppm("quality", quality_ppm)
    return min(PPM, quality_ppm + HIT_TOLERANCE_PPM) - max(0, quality_ppm - HIT_TOLERANCE_PPM)


def hit(quality_ppm: int, reference_ppm: int) -> bool:
    """The reference consensus lies in the attestation's window (|q − reference| ≤ 0.1)."""
    _check_ppm("quality", quality_ppm)
    _check_ppm("reference", reference_ppm)
    return abs(quality_ppm - reference_ppm) <= HIT_TOLERANCE_PPM


def accuracy_score(quality_ppm: int, confidence_ppm: int, reference_ppm: int) -> Fraction:
    """The quadratic score of the forecast an attestation states, at the reference consensus.

    `{q, c}` states: "with probability c the consensus lies in my window [q ± 0.1] (width w),
    otherwise I know nothing (uniform on [0, 1])", the density f = c·1_W/w + (1 − c). Its
    quadratic score 2·f(x) − ∫f², strictly proper, mapped affinely so that c = 0 scores ½:

        hit   ½ + c − c²/2
        miss  ½ − c·w/(1 − w) − c²/2

    For fixed q the expected score is maximal exactly at c = (p − w)/(1 − w), p the
    verifier's own probability of a hit: the chance it is better than blind. A blind or
    junk quality (p = w) does best by declining, and any confidence then scores below ½.
    """
    _check_ppm("confidence", confidence_ppm)
    c = Fraction(confidence_ppm, PPM)
    base = Fraction(1, 2) - c * c / 2
    if hit(quality_ppm, reference_ppm):
        return base + c
    width = window_ppm(quality_ppm)
    return base - c * Fraction(width, PPM - width)


def update_verifier(
    attestation: Attestation, reference_ppm: int | None, min_confidence_ppm: int = MIN_CONFIDENCE_PPM
) -> int:
    """A verifier's calibration after a round that reached consensus.

    cal ← clamp(cal + η·(score − cal), 0.01, 1), η = 1/10: score = `accuracy_score` against
    the reference consensus (the other seats', or the fresh panel's for a rerun first panel);
    a timeout scores 0. A decline (confidence below the minimum, in time) leaves calibration
    unchanged, and so does a missing reference: nobody to be judged against.
    """
    if attestation.timed_out:
        return _move(attestation.calibration_ppm, Fraction(0))
    if not counts(attestation, min_confidence_ppm) or reference_ppm is None:
        return attestation.calibration_ppm
    score = accuracy_score(attestation.quality_ppm, attestation.confidence_ppm, reference_ppm)
    return _move(attestation.calibration_ppm, score)


def claim_quality_ppm(approved: bool) -> int:
    """A poster's manual review as a claim: approve claims quality 1, reject claims 0."""
    return PPM if approved else 0


def update_poster(calibration_ppm: int, approved: bool, consensus_ppm: int) -> int:
    """A poster's calibration after a sampled review: the Brier score of a certain claim,
    1 − (claim − consensus)², with the same rate and bounds as verifiers."""
    _check_ppm("calibration", calibration_ppm)
    _check_ppm("consensus", consensus_ppm)
    gap = Fraction(claim_quality_ppm(approved) - consensus_ppm, PPM)
    return _move(calibration_ppm, 1 - gap * gap)


def drifted(approved: bool, consensus_ppm: int) -> bool:
    """The review's claim lies more than 0.5 from the panel's consensus."""
    return abs(claim_quality_ppm(approved) - consensus_ppm) > DRIFT_THRESHOLD_PPM


def next_pair_streak(streak: int, approved: bool, consensus_ppm: int) -> int:
    """Drifting reviews in a row of one poster–agent pair; an agreeing review resets it."""
    return streak + 1 if drifted(approved, consensus_ppm) else 0


# ---------------------------------------------------------------------------- review sampling


def review_sample_rate_ppm(poster_calibration_ppm: int, pair_streak: int) -> int:
    """The probability (ppm) that a manual review goes to a panel.

    10 % for a fully calibrated poster, rising linearly to 50 % as its calibration falls to
    0; 100 % for a pair with `PAIR_DRIFT_LIMIT` drifting reviews in a row.
    """
    _check_ppm("calibration", poster_calibration_ppm)
    if pair_streak >= PAIR_DRIFT_LIMIT:
        return PPM
    boost = (MAX_POSTER_SAMPLE_PPM - BASE_REVIEW_SAMPLE_PPM) * (PPM - poster_calibration_ppm)
    return BASE_REVIEW_SAMPLE_PPM + boost // PPM


def sample_review(secret: bytes, task_key: str, attempt: int, rate_ppm: int) -> bool:
    """Whether this review is sampled: HMAC(secret, "escrowd-review-sample|<key>|<attempt>")
    mod 10⁶ < rate. Reproducible by the operator, unpredictable to the parties."""
    if not secret:
        raise ValueError("the sampling secret is empty")
    _check_ppm("rate", rate_ppm)
    r = _hmac_int(secret, f"escrowd-review-sample|{task_key}|{attempt}") % PPM
    return r < rate_ppm


# ---------------------------------------------------------------------------- fees


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One signed movement in the off-chain fee ledger, in integer token units."""

    account: str
    delta: int
    reason: str


def losing_side(agent_share: int) -> str:
    """"poster" when the agent gets at least half of the reward, else "agent"."""
    if not 0 <= agent_share <= BPS:
        raise ValueError(f"share {agent_share} outside 0..{BPS} bps")
    return "poster" if agent_share * 2 >= BPS else "agent"


def fee_entries(
    weighted_verifiers: Sequence[str], fee_units: int, loser_account: str
) -> list[LedgerEntry]:
    """Every weighted attestation earns `fee_units`, charged to the loser; the entries sum to
    zero. Unweighted seats (declined, failed, timed out) earn nothing."""
    if fee_units < 0:
        raise ValueError("negative fee")
    if len({v.lower() for v in weighted_verifiers}) != len(weighted_verifiers):
        raise ValueError("a verifier is paid at most once per round")
    if not weighted_verifiers or fee_units == 0:
        return []
    entries = [LedgerEntry(v, fee_units, "attestation_fee") for v in weighted_verifiers]
    entries.append(LedgerEntry(loser_account, -fee_units * len(weighted_verifiers), "panel_fee"))
    return entries
