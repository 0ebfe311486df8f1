"""Agent reputation as pure arithmetic over verdicts (seed 000, "After a failed verdict").

Score 0–100. Each failed round costs `FAILED_ROUND_PENALTY` (10) and adds one to the
dispute count; each passed round adds `rules.pass_increase` (configurable, default 1).
The score is clamped to 0–100 after every step, so the order of outcomes matters; `fold`
therefore applies them in one canonical chain order (`RoundOutcome.order_key`), which makes
the result independent of delivery order and makes a retraction a plain recompute.

The matching score is `score * H / (H + dispute_count)` with `H = rules.dispute_half_weight`
(default 10): no disputes leave the score as it is, H disputes halve it. Unlike the score,
the dispute count never recovers, so an agent with a history of failed rounds ranks below
one with the same score and none.

An agent is an address, matched case-insensitively (the indexer reports EIP-55 checksummed
addresses, callers may use lower case): a reputation always names its agent in lower case,
the form it is stored, keyed and published under, whatever case it was asked for in.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field

from schemas.task_state import Reputation, RoundOutcome

FAILED_ROUND_PENALTY = 10  # fixed by seed 000, not configuration
SCORE_MIN = 0
SCORE_MAX = 100


class ReputationRules(BaseModel):
    """The configurable part of the reputation rules."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    start_score: int = Field(
        default=100,
        ge=SCORE_MIN,
        le=SCORE_MAX,
        description="Score of an agent with no verdicts: nothing held against it yet",
    )
    pass_increase: int = Field(
        default=1, ge=0, le=SCORE_MAX, description="Points a passed round adds (capped at 100)"
    )
    dispute_half_weight: int = Field(
        default=10, ge=1, description="Dispute count at which the matching score is halved"
    )


DEFAULT_RULES = ReputationRules()


def matching_score(
    reputation: int, dispute_count: int, rules: ReputationRules = DEFAULT_RULES
) -> float:
    """The score matching ranks by: `reputation * H / (H + dispute_count)`.

    Equal to `reputation` with no disputes, never above it, and lower with every dispute
    while `reputation > 0`.
    """
    if not SCORE_MIN <= reputation <= SCORE_MAX:
        raise ValueError(f"reputation {reputation} outside {SCORE_MIN}–{SCORE_MAX}")
    if dispute_count < 0:
        raise ValueError(f"negative dispute count {dispute_count}")
    half = rules.dispute_half_weight
    return reputation * half / (half + dispute_count)


def initial(agent: str, rules: ReputationRules = DEFAULT_RULES) -> Reputation:
    """The reputation of an agent with no verdicts yet (named in lower case)."""
    return _reputation(agent.lower(), rules.start_score, 0, 0, 0, rules)


def apply(
    reputation: Reputation, outcome: RoundOutcome, rules: ReputationRules = DEFAULT_RULES
) -> Reputation:
    """The reputation after one more verdict on the agent's work (the same address in any case)."""
    if outcome.agent.lower() != reputation.agent.lower():
        raise ValueError(
            f"outcome {outcome.event_id} is about {outcome.agent}, not {reputation.agent}"
        )
    if outcome.passed:
        return _reputation(
            reputation.agent,
            min(SCORE_MAX, reputation.score + rules.pass_increase),
            reputation.dispute_count,
            reputation.passes + 1,
            reputation.failures,
            rules,
        )
    return _reputation(
        reputation.agent.lower(),
        max(SCORE_MIN, reputation.score - FAILED_ROUND_PENALTY),
        reputation.dispute_count + 1,
        reputation.passes,
        reputation.failures + 1,
        rules,
    )


def fold(
    agent: str, outcomes: Iterable[RoundOutcome], rules: ReputationRules = DEFAULT_RULES
) -> Reputation:
    """The agent's reputation from all its verdicts, whatever order they arrive in.

    Duplicates (same event id) count once. A retracted verdict is undone by folding the
    outcomes that remain.
    """
    unique = {outcome.event_id: outcome for outcome in outcomes}
    reputation = initial(agent, rules)
    for outcome in sorted(unique.values(), key=lambda o: (o.order_key, o.event_id)):
        reputation = apply(reputation, outcome, rules)
    return reputation


def _reputation(
    agent: str, score: int, dispute_count: int, passes: int, failures: int, rules: ReputationRules
) -> Reputation:
    return Reputation(
        agent=agent,
        score=score,
        dispute_count=dispute_count,
        passes=passes,
        failures=failures,
        matching_score=matching_score(score, dispute_count, rules),
    )
