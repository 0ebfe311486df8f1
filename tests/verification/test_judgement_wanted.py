"""`routing.judgement_wanted`: the judging stage's check, before it judges and before it commits."""

from __future__ import annotations

import dataclasses

from verification.routing import (
    RemoveEvent,
    SaveRequest,
    StoreEvent,
    TaskState,
    apply,
    judgement_wanted,
)

from .test_routing import H1, H2, accepted, completed, created, request, state, submitted

FINALIZE = request("finalize", 1, H1, result="text")
EVIDENCE = submitted(1, H1)


def queued() -> TaskState:
    """The task as the consumer commits it: the finalize saved, its judgement queued, not made."""
    return apply(state(created(), accepted(), EVIDENCE), SaveRequest(dataclasses.replace(FINALIZE, state="pending")))


def test_the_queued_judgement_is_wanted_for_its_own_request_and_try_only() -> None:
    wanted = judgement_wanted(queued(), FINALIZE.request_id, 0)
    assert wanted is not None and (wanted.attempt, wanted.evidence_hash, wanted.result) == (1, H1, "text")
    assert judgement_wanted(queued(), FINALIZE.request_id, 1) is None  # a later try of it
    assert judgement_wanted(queued(), "finalize:another", 0) is None


def test_a_superseded_attempt_is_not_wanted() -> None:
    """Judged on chain and a second attempt submitted while the judgement was being made."""
    moved = apply(apply(queued(), StoreEvent(completed(1, H1, False, 0))), StoreEvent(submitted(2, H2)))
    assert judgement_wanted(moved, FINALIZE.request_id, 0) is None


def test_a_retracted_submission_is_not_wanted_until_it_returns() -> None:
    gone = apply(queued(), RemoveEvent(EVIDENCE.event_id))
    assert judgement_wanted(gone, FINALIZE.request_id, 0) is None
    assert judgement_wanted(apply(gone, StoreEvent(EVIDENCE)), FINALIZE.request_id, 0) is not None
