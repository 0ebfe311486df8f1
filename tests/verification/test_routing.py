"""The consumer's pure core: every route of `decide`, `conclude`, and properties over message sequences."""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.verification import VerificationResult
from verification.routing import (
    MAX_VERIFIER_FAILURES,
    AttachReport,
    ChainEvent,
    CouldNotJudge,
    Effect,
    EventObserved,
    EventRetracted,
    Judge,
    Judged,
    MarkSettled,
    Message,
    RecordFailure,
    RecordResult,
    RequestObserved,
    RequestRecord,
    RestoreResult,
    RetractResult,
    RetryDueObserved,
    RetryPolicy,
    ScheduleRetry,
    SetRequestState,
    TaskKey,
    TaskState,
    TermsView,
    apply,
    combine,
    conclude,
    decide,
    fold_chain,
    terms_problem,
)

KEY = TaskKey(31337, "0x5FbDB2315678afecb367f032d93F642f64180aa3", 1)
POSTER = "0x" + "11" * 20
AGENT = "0x" + "22" * 20
VERIFIER = "0x" + "33" * 20
MARKET = "0x" + "44" * 20
ZERO = "0x" + "00" * 20
TASK_HASH = "0x" + "aa" * 32
H1, H2, H3 = ("0x" + c * 64 for c in "123")
POLICY = RetryPolicy(base_seconds=5, max_seconds=60)


def terms(mode: str = "auto", **extra: Any) -> TermsView:
    values: dict[str, Any] = {
        "task_hash": TASK_HASH, "chain_id": KEY.chain_id, "escrow": KEY.escrow, "poster": POSTER, "mode": mode,
        "verifier_address": VERIFIER if mode == "agent" else None, "private": False,
        "criteria": {"min_length": 1}, "verifier": None, "instructions_digest": "0x" + "00" * 32,
    }  # fmt: skip
    values.update(extra)
    return TermsView(**values)


_block = iter(range(10, 10_000_000))


def ev(name: str, block: int | None = None, **args: Any) -> ChainEvent:
    number = block if block is not None else next(_block)
    return ChainEvent(f"e{number}", number, 0, f"0xtx{number}", name, args)


def created(verifier: str = ZERO) -> ChainEvent:
    return ev("TaskCreated", 1, taskId=1, poster=POSTER, verifier=verifier, taskHash=TASK_HASH, deadline=10**10, status=0)


def accepted() -> ChainEvent:
    return ev("TaskAccepted", 2, taskId=1, agent=AGENT, status=1)


def submitted(attempt: int, evidence: str, block: int | None = None) -> ChainEvent:
    return ev("EvidenceSubmitted", block, taskId=1, agent=AGENT, attempt=attempt, evidenceHash=evidence, status=2)


def completed(attempt: int, evidence: str, passed: bool, score: int, by: str = MARKET, block: int | None = None) -> ChainEvent:
    return ev("VerificationCompleted", block, taskId=1, verifier=by, attempt=attempt, evidenceHash=evidence,
              passed=passed, score=score, agent=AGENT, status=4 if passed else 3)  # fmt: skip


def request(kind: str, attempt: int, evidence: str, actor: str = AGENT, **payload: Any) -> RequestRecord:
    rid = f"{kind}:{attempt}:{evidence}:{payload.get('n', '')}"
    return RequestRecord(rid, kind, attempt, evidence, actor, payload)  # type: ignore[arg-type]


def state(*events: ChainEvent, mode: str | None = "auto", **terms_extra: Any) -> TaskState:
    return TaskState(key=KEY, events=tuple(events), terms=terms(mode, **terms_extra) if mode else None)


def run(state_: TaskState, message: Message, judge: Any = None) -> tuple[TaskState, list[Effect]]:
    """The shell in miniature: apply effects in order, judging with `judge(effect)`."""
    done: list[Effect] = []
    for effect in decide(state_, message):
        if isinstance(effect, Judge):
            outcome = judge(effect) if judge else Judged(passing(), "auto-check")
            done.append(effect)
            for follow_up in conclude(state_, effect, outcome, POLICY):
                state_ = apply(state_, follow_up)
                done.append(follow_up)
        else:
            state_ = apply(state_, effect)
            done.append(effect)
    return state_, done


def passing(score: int = 100) -> VerificationResult:
    return VerificationResult(passed=True, score=score, reasons=("All verification criteria met",))


def kinds(effects: list[Effect]) -> list[str]:
    return [type(e).__name__ for e in effects]


# ---------------------------------------------------------------------------- the chain view and the terms


def test_fold_follows_chain_order_not_arrival_order() -> None:
    """Events fold by (block, log index); the latest status wins."""
    events = [completed(1, H1, False, 10, block=5), submitted(1, H1, block=4), accepted(), created(), submitted(2, H2, block=6)]
    chain = fold_chain(events)
    assert (chain.poster, chain.agent, chain.verifier, chain.task_hash) == (POSTER, AGENT, None, TASK_HASH)
    assert chain.attempts == {1: H1, 2: H2} and chain.current_attempt == 2 and chain.submitted
    assert chain.verdicts[1].passed is False and chain.is_pending(2, H2) and not chain.is_pending(1, H1)


def test_terms_govern_only_a_matching_task() -> None:
    """Another poster, escrow, or verifier setting means the terms do not apply."""
    chain = fold_chain([created()])
    assert terms_problem(KEY, chain, terms()) is None
    assert terms_problem(KEY, fold_chain([]), terms()) is not None
    assert terms_problem(KEY, chain, None) is not None
    assert terms_problem(KEY, chain, terms(poster=AGENT)) == "the terms name another poster"
    assert terms_problem(KEY, chain, terms(escrow=ZERO)) == "the terms name another chain or escrow"
    assert terms_problem(KEY, chain, terms("agent")) is not None  # the chain names no verifier
    assert terms_problem(KEY, fold_chain([created(VERIFIER)]), terms("agent")) is None
    assert terms_problem(KEY, fold_chain([created(VERIFIER)]), terms("manual")) is not None


# ---------------------------------------------------------------------------- auto


def test_auto_judges_when_finalize_and_evidence_have_both_arrived_in_either_order() -> None:
    """Finalize first waits for the evidence; evidence first waits for the finalize."""
    finalize = request("finalize", 1, H1, result="text")
    s, effects = run(state(created(), accepted()), RequestObserved(finalize))
    assert kinds(effects) == ["SaveRequest"]
    s, effects = run(s, EventObserved(submitted(1, H1)))
    assert kinds(effects) == ["StoreEvent", "Judge", "RecordResult", "SetRequestState"]
    record = effects[2]
    assert isinstance(record, RecordResult) and record.sign and record.source == "auto" and record.attempt == 1

    s2, effects = run(state(created(), accepted(), submitted(1, H1)), RequestObserved(finalize))
    assert kinds(effects) == ["SaveRequest", "Judge", "RecordResult", "SetRequestState"]
    assert s2.results[1].evidence_hash == H1


def test_auto_never_judges_a_wrong_hash_an_old_attempt_or_twice() -> None:
    """A finalize whose hash is not the current submission waits; once superseded it is closed."""
    s = state(created(), accepted(), submitted(1, H1))
    s, effects = run(s, RequestObserved(request("finalize", 1, H2)))
    assert kinds(effects) == ["SaveRequest"]  # waits: the indexed evidence may still change
    s, effects = run(s, RequestObserved(request("finalize", 1, H1)))
    # Judged; the earlier finalize with the wrong hash is closed in the same step.
    assert kinds(effects) == ["SaveRequest", "Judge", "RecordResult", "SetRequestState", "SetRequestState"]
    assert s.requests[request("finalize", 1, H2).request_id].state == "superseded"
    s, effects = run(s, RequestObserved(request("finalize", 1, H1, n="again")))
    assert kinds(effects) == ["SaveRequest", "SetRequestState"]
    assert isinstance(effects[1], SetRequestState) and effects[1].state == "superseded"
    s, effects = run(s, EventObserved(completed(1, H1, True, 100)))
    assert not [e for e in effects if isinstance(e, RecordResult | Judge)]


def test_what_the_verifier_found_reaches_the_recorded_verdict() -> None:
    """publicTests, hiddenTests and resourceLimits travel from the judgement to the signed record."""
    found = {"publicTests": "12/12", "hiddenTests": "30/31", "resourceLimits": "PASS"}
    s = state(created(), accepted(), submitted(1, H1))
    _, effects = run(s, RequestObserved(request("finalize", 1, H1)), judge=lambda _: Judged(passing(), "test_suite:V1", found))
    record = next(e for e in effects if isinstance(e, RecordResult))
    assert record.proof_fields == found and record.verifier_kind == "test_suite:V1"


def test_a_duplicate_message_changes_nothing() -> None:
    """The same request or event again: no new effect that changes the state."""
    finalize = request("finalize", 1, H1)
    s, _ = run(state(created(), accepted(), submitted(1, H1)), RequestObserved(finalize))
    assert run(s, RequestObserved(finalize))[1] == []
    event = s.events[-1]
    after, effects = run(s, EventObserved(event))
    assert after == s and kinds(effects) == ["StoreEvent"]


def test_a_verifier_that_cannot_answer_schedules_a_retry_never_a_zero() -> None:
    """CouldNotJudge → ScheduleRetry with backoff; the retry judges again; a stale retry is ignored."""
    s = state(created(), accepted(), submitted(1, H1))
    finalize = request("finalize", 1, H1)
    s, effects = run(s, RequestObserved(finalize), judge=lambda _: CouldNotJudge("endpoint:http://x", "HTTP 503"))
    assert kinds(effects) == ["SaveRequest", "Judge", "ScheduleRetry"]
    retry = effects[2]
    assert isinstance(retry, ScheduleRetry) and retry.retry_count == 1 and retry.delay_seconds == 5
    assert "endpoint:http://x" in retry.error and 1 not in s.results
    s, effects = run(s, RetryDueObserved(finalize.request_id, 1), judge=lambda _: CouldNotJudge("v", "down"))
    assert isinstance(effects[-1], ScheduleRetry) and effects[-1].delay_seconds == 10
    assert run(s, RetryDueObserved(finalize.request_id, 1))[1] == []  # stale: retry 2 is scheduled
    s, effects = run(s, RetryDueObserved(finalize.request_id, 2))
    assert kinds(effects) == ["SetRequestState", "Judge", "RecordResult", "SetRequestState"]


def test_retry_backoff_is_capped() -> None:
    assert [POLICY.delay(n) for n in (1, 2, 3, 4, 5)] == [5, 10, 20, 40, 60]


def test_our_verdict_landing_on_chain_is_marked_settled_and_unmarked_on_retraction() -> None:
    """VerificationCompleted for our attempt marks it settled; its retraction clears the mark."""
    s, _ = run(state(created(), accepted(), submitted(1, H1)), RequestObserved(request("finalize", 1, H1)))
    landed = completed(1, H1, True, 100)
    s, effects = run(s, EventObserved(landed))
    assert effects[-1] == MarkSettled(1, landed.tx_hash, landed.block_number)
    s, effects = run(s, EventRetracted(landed.event_id))
    assert effects[-1] == MarkSettled(1, None, None)


def test_retracted_evidence_retracts_the_verdict_and_the_same_evidence_restores_it() -> None:
    """A reorg removing the judged submission retracts our verdict; its return restores it, unjudged again."""
    evidence = submitted(1, H1)
    s, _ = run(state(created(), accepted(), evidence), RequestObserved(request("finalize", 1, H1)))
    s, effects = run(s, EventRetracted(evidence.event_id))
    assert kinds(effects) == ["RemoveEvent", "RetractResult"] and s.results[1].status == "retracted"
    s, effects = run(s, EventObserved(submitted(1, H1)))  # re-mined in another block
    assert kinds(effects) == ["StoreEvent", "RestoreResult"] and s.results[1].status == "final"


def test_retracted_evidence_replaced_by_other_evidence_is_judged_on_its_own_finalize() -> None:
    """A different submission at the same attempt needs its own finalize, then gets a new verdict."""
    evidence = submitted(1, H1)
    s, _ = run(state(created(), accepted(), evidence), RequestObserved(request("finalize", 1, H1)))
    s, _ = run(s, EventRetracted(evidence.event_id))
    s, effects = run(s, EventObserved(submitted(1, H2)))
    assert not [e for e in effects if isinstance(e, RecordResult | RestoreResult)]
    s, effects = run(s, RequestObserved(request("finalize", 1, H2)))
    assert "RecordResult" in kinds(effects) and s.results[1].evidence_hash == H2


def test_a_retracted_evidence_undoes_a_pending_attempt() -> None:
    """Finalize queued, evidence indexed then retracted before judging: nothing is judged."""
    evidence = submitted(1, H1)
    s = state(created(), accepted())
    s, _ = run(s, RequestObserved(request("finalize", 1, H1)), judge=lambda _: CouldNotJudge("v", "down"))
    s, effects = run(s, EventObserved(evidence), judge=lambda _: CouldNotJudge("v", "down"))
    assert "ScheduleRetry" in kinds(effects)
    s, _ = run(s, EventRetracted(evidence.event_id))
    s, effects = run(s, RetryDueObserved(request("finalize", 1, H1).request_id, 1))
    assert kinds(effects) == ["SetRequestState"]  # back to pending, but no evidence: no Judge
    assert 1 not in s.results


def test_nothing_happens_without_governing_terms() -> None:
    """No terms (or terms of another poster): requests wait."""
    for s in (state(created(), accepted(), submitted(1, H1), mode=None),
              state(created(), accepted(), submitted(1, H1), poster=AGENT)):  # fmt: skip
        _, effects = run(s, RequestObserved(request("finalize", 1, H1)))
        assert kinds(effects) == ["SaveRequest"]


# ---------------------------------------------------------------------------- manual


def test_manual_review_is_recorded_and_signed_once() -> None:
    """The poster's review of the current submission becomes the signed verdict; a finalize is stored."""
    s = state(created(), accepted(), submitted(1, H1), mode="manual")
    s, effects = run(s, RequestObserved(request("finalize", 1, H1)))
    assert isinstance(effects[-1], SetRequestState) and effects[-1].state == "stored"
    review = request("review", 1, H1, actor=POSTER, passed=False, reasons=["table missing"])
    s, effects = run(s, RequestObserved(review))
    record = next(e for e in effects if isinstance(e, RecordResult))
    assert (record.passed, record.score, record.sign, record.source) == (False, 0, True, "manual")
    assert record.verification_result["reasons"] == ["table missing"]
    second = request("review", 1, H1, actor=POSTER, passed=True, n=2)
    _, effects = run(s, RequestObserved(second))
    assert isinstance(effects[-1], SetRequestState) and effects[-1].state == "superseded"


def test_reviews_from_others_or_on_other_modes_are_rejected() -> None:
    s = state(created(), accepted(), submitted(1, H1), mode="manual")
    _, effects = run(s, RequestObserved(request("review", 1, H1, actor=AGENT, passed=True)))
    assert effects[-1] == SetRequestState("review:1:" + H1 + ":", "rejected", "only the poster reviews")
    _, effects = run(state(created(), accepted(), submitted(1, H1)), RequestObserved(request("review", 1, H1, actor=POSTER, passed=True)))
    assert isinstance(effects[-1], SetRequestState) and effects[-1].state == "rejected"


def test_approval_scores_100_and_default_reasons() -> None:
    s = state(created(), accepted(), submitted(1, H1), mode="manual")
    _, effects = run(s, RequestObserved(request("review", 1, H1, actor=POSTER, passed=True)))
    record = next(e for e in effects if isinstance(e, RecordResult))
    assert (record.score, record.verification_result["reasons"]) == (100, ["Approved by the poster"])


# ---------------------------------------------------------------------------- agent


def agent_state(*events: ChainEvent) -> TaskState:
    return state(created(VERIFIER), accepted(), submitted(1, H1), *events, mode="agent")


def test_agent_verdict_is_recorded_from_the_chain_and_a_matching_report_attached() -> None:
    """Report first waits; the chain verdict records it (unsigned); the report then attaches its reasons."""
    report = request("verifier_verdict", 1, H1, actor=VERIFIER, passed=True, score=90, reasons=["fine"])
    s, effects = run(agent_state(), RequestObserved(report))
    assert kinds(effects) == ["SaveRequest"]
    s, effects = run(s, EventObserved(completed(1, H1, True, 90, by=VERIFIER)))
    assert kinds(effects) == ["StoreEvent", "RecordResult", "AttachReport", "SetRequestState"]
    record = effects[1]
    assert isinstance(record, RecordResult) and not record.sign and record.source == "chain"
    attach = effects[2]
    assert isinstance(attach, AttachReport) and attach.verification_result["reasons"] == ["fine"]
    assert s.results[1].reported and s.results[1].source == "agent"


def test_agent_report_that_does_not_match_the_chain_is_rejected() -> None:
    s = agent_state(completed(1, H1, False, 20, by=VERIFIER))
    lie = request("verifier_verdict", 1, H1, actor=VERIFIER, passed=True, score=90)
    s, effects = run(s, RequestObserved(lie))
    assert effects[-1] == SetRequestState(lie.request_id, "rejected", "the report does not match the verdict on chain")
    assert s.results[1].passed is False and not s.results[1].reported


def test_verifier_failures_count_to_never_judged() -> None:
    """Five failed tries and the attempt is delivered but never judged; more are superseded."""
    s = agent_state()
    for n in range(1, MAX_VERIFIER_FAILURES + 2):
        s, effects = run(s, RequestObserved(request("verifier_error", 1, H1, actor=VERIFIER, n=n, error="model down")))
        if n <= MAX_VERIFIER_FAILURES:
            failure = next(e for e in effects if isinstance(e, RecordFailure))
            assert failure.failures == n and failure.never_judged == (n == MAX_VERIFIER_FAILURES)
        else:
            assert isinstance(effects[-1], SetRequestState) and effects[-1].state == "superseded"
    assert s.failures[1].never_judged
    _, effects = run(s, RequestObserved(request("verifier_error", 1, H1, actor=AGENT, n=99)))
    assert isinstance(effects[-1], SetRequestState) and effects[-1].state == "rejected"


def test_a_retracted_agent_verdict_is_retracted() -> None:
    verdict = completed(1, H1, True, 80, by=VERIFIER)
    s, _ = run(agent_state(), EventObserved(verdict))
    s, effects = run(s, EventRetracted(verdict.event_id))
    assert effects[-1] == RetractResult(1, "the evidence or verdict it judged was removed by a reorg")


# ---------------------------------------------------------------------------- combining with a registry verifier


def test_combine_registry_gate() -> None:
    """The registry verifier gates the auto-check's pass; alone it scores its reward."""
    auto = passing(90)
    assert combine(auto, "endpoint:x", 1.0, 1.0).passed
    failed = combine(auto, "endpoint:x", 0.4, 0.5)
    assert (failed.passed, failed.score) == (False, 40)
    alone = combine(None, "plugin:m:f", 0.83, 0.8)
    assert (alone.passed, alone.score, alone.reasons) == (True, 83, ("All verification criteria met",))
    auto_failed = VerificationResult(passed=False, score=0, reasons=("Empty output",))
    assert combine(auto_failed, "x", 1.0, 1.0) == auto_failed


# ---------------------------------------------------------------------------- properties


ALPHABET: list[tuple[str, Any]] = [
    ("event", created()), ("event", accepted()),
    ("event", submitted(1, H1, block=20)), ("event", completed(1, H1, False, 30, block=21)),
    ("event", submitted(2, H2, block=22)), ("event", completed(2, H2, True, 100, block=23)),
    ("retract", "e20"), ("retract", "e21"), ("retract", "e22"),
    ("event", submitted(2, H3, block=24)),
    ("request", request("finalize", 1, H1)), ("request", request("finalize", 2, H2)),
    ("request", request("finalize", 2, H3)), ("request", request("finalize", 1, H3)),
    ("retry", (request("finalize", 1, H1).request_id, 1)), ("retry", (request("finalize", 2, H2).request_id, 1)),
]  # fmt: skip


def message_of(item: tuple[str, Any]) -> Message:
    kind, value = item
    if kind == "event":
        return EventObserved(value)
    if kind == "retract":
        return EventRetracted(value)
    if kind == "request":
        return RequestObserved(value)
    return RetryDueObserved(*value)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(range(len(ALPHABET))), max_size=30), st.sets(st.sampled_from([H1, H2, H3])))
def test_any_message_sequence_keeps_the_invariants(order: list[int], unanswerable: set[str]) -> None:
    """Whatever arrives in whatever order, duplicates included:

    at most one signed verdict per (attempt, evidence); a final auto verdict always names the
    evidence the chain holds for its attempt; a verifier that cannot answer never yields a
    verdict; processing any message a second time changes nothing.
    """
    s = state()
    signed: list[tuple[int, str]] = []

    def judge(effect: Judge) -> Any:
        if effect.evidence_hash in unanswerable:
            return CouldNotJudge("endpoint:x", "down")
        return Judged(passing(), "auto-check")

    for index in order:
        message = message_of(ALPHABET[index])
        s, effects = run(s, message, judge)
        for effect in effects:
            if isinstance(effect, RecordResult):
                assert effect.evidence_hash not in unanswerable
                signed.append((effect.attempt, effect.evidence_hash))
        again, repeat = run(s, message, judge)
        assert again == s, f"repeating {message} changed the state: {repeat}"
        assert not [e for e in repeat if isinstance(e, RecordResult | Judge | ScheduleRetry)]
    assert len(signed) == len(set(signed))
    chain = s.chain
    for attempt, result in s.results.items():
        if result.status == "final":
            assert chain.attempts.get(attempt) == result.evidence_hash
    for attempt, evidence in chain.attempts.items():
        recorded = s.results.get(attempt)
        if recorded is not None and recorded.status == "final":
            assert recorded.evidence_hash == evidence


def test_apply_is_what_the_store_holds_for_each_effect_kind() -> None:
    """`apply` moves requests through their states as the store does."""
    r = request("finalize", 1, H1)
    s = dataclasses.replace(state(), requests={r.request_id: r})
    s = apply(s, ScheduleRetry(r.request_id, 3, 1.0, "x"))
    assert (s.requests[r.request_id].state, s.requests[r.request_id].retry_count) == ("waiting_retry", 3)
    assert apply(s, SetRequestState("unknown", "applied")) == s
