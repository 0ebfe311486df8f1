"""Reputation maths: bounds, the seed's failed-round rule, order independence, retraction."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from lifecycle.reputation.rules import (
    DEFAULT_RULES,
    FAILED_ROUND_PENALTY,
    ReputationRules,
    apply,
    fold,
    initial,
    matching_score,
)
from schemas.task_state import RoundOutcome

AGENT = "0x" + "a1" * 20
OTHER = "0x" + "b2" * 20
ESCROW = "0x" + "e3" * 20


def outcome(
    passed: bool, block: int, *, chain_id: int = 1, log_index: int = 0, ts: int | None = None
) -> RoundOutcome:
    return RoundOutcome(
        agent=AGENT,
        passed=passed,
        chain_id=chain_id,
        escrow=ESCROW,
        task_id=1 + block % 7,
        attempt=1 + block % 3,
        event_id=f"{chain_id}:{block}:{log_index}",
        block_number=block,
        log_index=log_index,
        block_timestamp=1_000 + block * 12 if ts is None else ts,
    )


@st.composite
def outcomes(draw: st.DrawFn, min_size: int = 0, max_size: int = 40) -> list[RoundOutcome]:
    """Verdicts of one agent at distinct chain positions, in chain order."""
    positions = draw(
        st.lists(
            st.tuples(st.sampled_from([1, 10]), st.integers(0, 500), st.integers(0, 3)),
            unique=True,
            min_size=min_size,
            max_size=max_size,
        )
    )
    return sorted(
        (
            outcome(draw(st.booleans()), block, chain_id=chain, log_index=log)
            for chain, block, log in positions
        ),
        key=lambda o: o.order_key,
    )


rules_strategy = st.builds(
    ReputationRules,
    start_score=st.integers(0, 100),
    pass_increase=st.integers(0, 100),
    dispute_half_weight=st.integers(1, 50),
)


@settings(max_examples=200)
@given(outcomes(), rules_strategy)
def test_score_stays_within_0_and_100(history: list[RoundOutcome], rules: ReputationRules) -> None:
    """Whatever the verdicts and rules, every intermediate score stays in 0–100."""
    reputation = initial(AGENT, rules)
    for item in history:
        reputation = apply(reputation, item, rules)
        assert 0 <= reputation.score <= 100
        assert 0 <= reputation.matching_score <= reputation.score


@settings(max_examples=200)
@given(outcomes(max_size=15), rules_strategy)
def test_failed_round_costs_ten_and_adds_a_dispute(
    history: list[RoundOutcome], rules: ReputationRules
) -> None:
    """A failed verdict lowers the score by 10 (floor 0) and adds exactly one dispute."""
    before = fold(AGENT, history, rules)
    after = apply(before, outcome(False, 10_000), rules)
    assert after.score == max(0, before.score - FAILED_ROUND_PENALTY)
    assert after.dispute_count == before.dispute_count + 1
    assert after.failures == before.failures + 1
    assert after.passes == before.passes


@settings(max_examples=200)
@given(outcomes(max_size=15), rules_strategy)
def test_pass_raises_by_the_configured_step_capped_at_100(
    history: list[RoundOutcome], rules: ReputationRules
) -> None:
    """A pass adds `pass_increase` up to 100 and leaves the dispute count alone."""
    before = fold(AGENT, history, rules)
    after = apply(before, outcome(True, 10_000), rules)
    assert after.score == min(100, before.score + rules.pass_increase)
    assert after.dispute_count == before.dispute_count
    assert after.passes == before.passes + 1


@settings(max_examples=200)
@given(outcomes(), st.randoms(use_true_random=False), rules_strategy)
def test_fold_ignores_delivery_order_and_duplicates(history, random, rules) -> None:
    """Any permutation of the verdicts, with repeats, folds to the same reputation."""
    shuffled = history + random.sample(history, k=len(history) // 2)
    random.shuffle(shuffled)
    assert fold(AGENT, shuffled, rules) == fold(AGENT, history, rules)


@settings(max_examples=200)
@given(outcomes(), rules_strategy)
def test_fold_equals_applying_in_chain_order(
    history: list[RoundOutcome], rules: ReputationRules
) -> None:
    """fold is the step function applied in canonical order, from the start score."""
    expected = initial(AGENT, rules)
    for item in history:
        expected = apply(expected, item, rules)
    assert fold(AGENT, history, rules) == expected


@settings(max_examples=200)
@given(outcomes(min_size=1), st.data())
def test_retraction_is_a_recompute_without_the_event(
    history: list[RoundOutcome], data: st.DataObject
) -> None:
    """Retracting a verdict gives what the agent would have had had it never happened."""
    index = data.draw(st.integers(0, len(history) - 1))
    remaining = history[:index] + history[index + 1 :]
    expected = initial(AGENT)
    for item in remaining:
        expected = apply(expected, item)
    assert fold(AGENT, remaining) == expected


def test_retracting_the_last_failed_verdict_restores_the_reputation() -> None:
    """A failed verdict undone by a reorg gives back the 10 points and the dispute."""
    history = [outcome(True, 1), outcome(False, 2)]
    before = fold(AGENT, history)
    with_failure = fold(AGENT, [*history, outcome(False, 3)])
    assert (with_failure.score, with_failure.dispute_count) == (
        before.score - 10,
        before.dispute_count + 1,
    )
    assert fold(AGENT, history) == before


def test_default_rules_worked_example() -> None:
    """Defaults: start 100; fail → 90 and 1 dispute; pass → 91; matching 91·10/11."""
    reputation = initial(AGENT)
    assert (reputation.score, reputation.dispute_count, reputation.matching_score) == (
        100,
        0,
        100.0,
    )
    reputation = apply(reputation, outcome(False, 1))
    assert (reputation.score, reputation.dispute_count) == (90, 1)
    reputation = apply(reputation, outcome(True, 2))
    assert (reputation.score, reputation.dispute_count, reputation.passes, reputation.failures) == (
        91,
        1,
        1,
        1,
    )
    assert reputation.matching_score == pytest.approx(91 * 10 / 11)


def test_score_floors_at_zero() -> None:
    """Eleven failed rounds from 100 end at 0, not below, with eleven disputes."""
    reputation = fold(AGENT, [outcome(False, block) for block in range(11)])
    assert (reputation.score, reputation.dispute_count, reputation.matching_score) == (0, 11, 0.0)


def test_clamping_makes_chain_order_matter() -> None:
    """At the cap, pass-then-fail and fail-then-pass differ; fold uses the chain's order."""
    fail_first = [outcome(False, 1), outcome(True, 2)]
    pass_first = [outcome(True, 1), outcome(False, 2)]
    assert fold(AGENT, fail_first).score == 91
    assert fold(AGENT, pass_first).score == 90
    assert fold(AGENT, list(reversed(fail_first))).score == 91


@given(st.integers(0, 100), st.integers(0, 1_000), st.integers(1, 50))
def test_matching_score_is_lowered_by_disputes(score: int, disputes: int, half: int) -> None:
    """Equal to the score without disputes, halved at H, lower with each further dispute."""
    rules = ReputationRules(dispute_half_weight=half)
    assert matching_score(score, 0, rules) == score
    assert matching_score(score, half, rules) == pytest.approx(score / 2)
    assert matching_score(score, disputes + 1, rules) <= matching_score(score, disputes, rules)
    if score > 0:
        assert matching_score(score, disputes + 1, rules) < matching_score(score, disputes, rules)


def test_matching_score_rejects_out_of_range_input() -> None:
    """Scores outside 0–100 and negative dispute counts are caller bugs."""
    with pytest.raises(ValueError, match="outside"):
        matching_score(101, 0)
    with pytest.raises(ValueError, match="negative"):
        matching_score(50, -1)


def test_apply_refuses_another_agents_verdict() -> None:
    """An outcome about another agent is never counted against this one."""
    foreign = outcome(False, 1).model_copy(update={"agent": OTHER})
    with pytest.raises(ValueError, match="not"):
        apply(initial(AGENT), foreign)
    with pytest.raises(ValueError):
        fold(AGENT, [foreign])


def test_rules_are_validated() -> None:
    """A start score outside 0–100 or a zero half weight is a configuration error."""
    with pytest.raises(ValidationError):
        ReputationRules(start_score=101)
    with pytest.raises(ValidationError):
        ReputationRules(dispute_half_weight=0)
    assert (
        ReputationRules(start_score=100, pass_increase=1, dispute_half_weight=10) == DEFAULT_RULES
    )


def _in_case(address: str, upper: list[bool]) -> str:
    """`address` with the hex letters chosen by `upper` in upper case."""
    return "0x" + "".join(c.upper() if u else c for c, u in zip(address[2:], upper, strict=True))


CHECKSUMMED = "0xA1A1a1a1A1A1A1A1A1a1a1a1a1a1A1A1a1A1a1a1"


@given(history=outcomes(max_size=12), cases=st.lists(st.lists(st.booleans(), min_size=40, max_size=40), min_size=13, max_size=13))
@settings(max_examples=100, deadline=None)
def test_an_agent_is_its_address_in_any_case(history: list[RoundOutcome], cases: list[list[bool]]) -> None:
    """Outcomes naming the agent checksummed, lower or any other case all count for it; the
    reputation names it in lower case whatever case it was asked for in."""
    mixed = [o.model_copy(update={"agent": _in_case(AGENT, case)}) for o, case in zip(history, cases[1:], strict=False)]
    expected = fold(AGENT, history)
    assert fold(_in_case(AGENT, cases[0]), mixed) == expected
    assert expected.agent == AGENT


def test_a_checksummed_agent_matches_its_lower_case_verdicts() -> None:
    from eth_utils.address import to_checksum_address

    assert to_checksum_address(AGENT) == CHECKSUMMED
    failed = outcome(False, 1).model_copy(update={"agent": CHECKSUMMED})
    assert apply(initial(CHECKSUMMED), outcome(True, 2)).agent == AGENT
    assert apply(initial(AGENT), failed) == apply(initial(CHECKSUMMED), failed) == apply(initial(AGENT), outcome(False, 1))
    assert (fold(CHECKSUMMED, [failed, outcome(True, 2)]).score, fold(CHECKSUMMED, [failed]).failures) == (91, 1)
    assert initial(CHECKSUMMED) == initial(AGENT)
