"""The verification consumer's pure core: what to do about one task after one message.

`decide(state, message)` takes everything the consumer knows about one task (its escrow
events, its registered terms, the finalize / review / verifier-report requests, the
verdicts already recorded, the verifier's failures) and one incoming message, and returns
the effects to apply, in order. Nothing here reads a clock or does I/O; the shell
(`verification.consumer`) loads the state, runs the effects, and — for the one
effect that needs I/O, `Judge` (the auto-check plus a registry verifier) — feeds the
outcome back through `conclude`.

The decision is a reconciliation, so every arrival order converges to the same place:
after the message is observed, each pending request is compared with the task's chain
view (the fold of its non-retracted events):

* **auto**: a finalize whose evidence is the current, unjudged, Submitted attempt is
  judged (`Judge`); the verdict is recorded and signed once per attempt;
* **manual**: the poster's review of the current Submitted attempt is recorded and signed;
* **agent**: the named verifier's on-chain `VerificationCompleted` is recorded as the
  attempt's verdict; a verifier's report is attached only if it matches the chain, and is
  rejected otherwise; a verifier's failure reports are counted, and after
  `MAX_VERIFIER_FAILURES` the attempt is "delivered but never judged".

Invariants (tested exhaustively in tests/verification/test_routing.py): at most one
verdict per attempt; a recorded auto/manual verdict names evidence the chain holds for its
attempt, otherwise it is marked retracted (and restored if the same evidence returns);
a duplicate message changes nothing.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from chain.view import ChainEvent as ChainEvent
from chain.view import ChainTask as ChainTask
from chain.view import ChainVerdict as ChainVerdict
from chain.view import TaskKey as TaskKey
from chain.view import fold_task
from schemas.verification import ALL_CRITERIA_MET, BreakdownItem, VerificationResult

MAX_VERIFIER_FAILURES = 5
Mode = Literal["auto", "manual", "agent"]
Source = Literal["auto", "manual", "agent", "chain"]
RequestKind = Literal["finalize", "review", "verifier_verdict", "verifier_error", "retry"]
RequestState = Literal[
    "accepted", "pending", "applied", "stored", "rejected", "superseded", "waiting_retry", "retry_queued"
]
_OPEN_STATES = ("accepted", "pending")


# ---------------------------------------------------------------------------- the chain view

# The chain view is the one fold of a task's escrow events (`chain.view`); routing reads
# `ChainTask` as the fold gives it.
fold_chain = fold_task


# ---------------------------------------------------------------------------- terms


@dataclass(frozen=True)
class TermsView:
    """The registered terms the consumer needs (from `task_terms`)."""

    task_hash: str
    chain_id: int
    escrow: str
    poster: str
    mode: Mode
    verifier_address: str | None
    private: bool
    criteria: Mapping[str, Any] | None
    verifier: Mapping[str, Any] | None
    instructions_digest: str


def terms_problem(key: TaskKey, chain: ChainTask, terms: TermsView | None) -> str | None:
    """Why the terms do not govern this task (None when they do)."""
    if chain.task_hash is None:
        return "the task's TaskCreated is not indexed yet"
    if terms is None:
        return "no terms are registered for the task's taskHash"
    if terms.chain_id != key.chain_id or terms.escrow.lower() != key.escrow.lower():
        return "the terms name another chain or escrow"
    if chain.poster is None or terms.poster.lower() != chain.poster.lower():
        return "the terms name another poster"
    on_chain = (chain.verifier or "").lower()
    if terms.mode == "agent":
        if on_chain != (terms.verifier_address or "").lower():
            return "the verifier on chain differs from the verifier in the terms"
    elif on_chain:
        return f"the task names a verifier on chain but its terms say {terms.mode}"
    return None


# ---------------------------------------------------------------------------- requests and results


@dataclass(frozen=True)
class RequestRecord:
    """A finalize, review or verifier report (payload as received)."""

    request_id: str
    kind: RequestKind
    attempt: int
    evidence_hash: str
    actor: str
    payload: Mapping[str, Any]
    state: RequestState = "pending"
    retry_count: int = 0


@dataclass(frozen=True)
class ResultRecord:
    """The verdict recorded for one attempt."""

    attempt: int
    evidence_hash: str
    source: Source
    passed: bool
    score: int
    status: Literal["final", "retracted"] = "final"
    reported: bool = False
    request_id: str | None = None
    settled_tx: str | None = None


@dataclass(frozen=True)
class FailureRecord:
    """A verifier agent's failed tries on one attempt."""

    failures: int
    never_judged: bool


@dataclass(frozen=True)
class TaskState:
    """Everything the consumer knows about one task."""

    key: TaskKey
    events: tuple[ChainEvent, ...] = ()
    terms: TermsView | None = None
    requests: Mapping[str, RequestRecord] = field(default_factory=dict)
    results: Mapping[int, ResultRecord] = field(default_factory=dict)
    failures: Mapping[int, FailureRecord] = field(default_factory=dict)

    @functools.cached_property
    def chain(self) -> ChainTask:
        """The fold of the task's events."""
        return fold_chain(self.events)

    @property
    def mode(self) -> Mode | None:
        """The verification mode, when registered terms govern the task."""
        if self.terms is None or terms_problem(self.key, self.chain, self.terms) is not None:
            return None
        return self.terms.mode


# ---------------------------------------------------------------------------- messages


@dataclass(frozen=True)
class EventObserved:
    """An escrow event arrived."""

    event: ChainEvent


@dataclass(frozen=True)
class EventRetracted:
    """A reorg removed an event (`removed: true`)."""

    event_id: str


@dataclass(frozen=True)
class RequestObserved:
    """A finalize, review or verifier report arrived."""

    request: RequestRecord


@dataclass(frozen=True)
class RetryDueObserved:
    """A finalize whose verifier could not answer is due again."""

    target_request_id: str
    retry_count: int


Message = EventObserved | EventRetracted | RequestObserved | RetryDueObserved


# ---------------------------------------------------------------------------- effects


@dataclass(frozen=True)
class StoreEvent:
    event: ChainEvent


@dataclass(frozen=True)
class RemoveEvent:
    event_id: str


@dataclass(frozen=True)
class SaveRequest:
    request: RequestRecord


@dataclass(frozen=True)
class SetRequestState:
    request_id: str
    state: RequestState
    reason: str | None = None


@dataclass(frozen=True)
class Judge:
    """Run the auto-check (and the terms' registry verifier) on a finalized result."""

    request_id: str
    attempt: int
    evidence_hash: str
    result: Any
    retry_count: int


@dataclass(frozen=True)
class RecordResult:
    """Record the attempt's verdict; `sign` publishes a signed verdict for settlement."""

    attempt: int
    evidence_hash: str
    mode: Mode
    source: Source
    passed: bool
    score: int
    verification_result: Mapping[str, Any]
    verifier_kind: str
    sign: bool
    reported: bool = False
    request_id: str | None = None
    proof_fields: Mapping[str, str] = field(default_factory=dict)
    """What the verifier found beyond the score (seed 002's publicTests, hiddenTests, resourceLimits)."""


@dataclass(frozen=True)
class AttachReport:
    """A verifier's report matched the chain: keep its reasons with the verdict."""

    attempt: int
    verification_result: Mapping[str, Any]
    request_id: str


@dataclass(frozen=True)
class RetractResult:
    attempt: int
    reason: str


@dataclass(frozen=True)
class RestoreResult:
    attempt: int


@dataclass(frozen=True)
class MarkSettled:
    """Our verdict for `attempt` landed on chain (or, with None, the landing was retracted)."""

    attempt: int
    tx_hash: str | None
    block_number: int | None


@dataclass(frozen=True)
class RecordFailure:
    attempt: int
    verifier: str
    failures: int
    never_judged: bool
    error: str


@dataclass(frozen=True)
class ScheduleRetry:
    request_id: str
    retry_count: int
    delay_seconds: float
    error: str


_RECORDED = ("attempt", "evidence_hash", "source", "passed", "score", "reported", "request_id")
"""The fields of a `RecordResult` its `ResultRecord` keeps (same names)."""

Effect = (
    StoreEvent
    | RemoveEvent
    | SaveRequest
    | SetRequestState
    | Judge
    | RecordResult
    | AttachReport
    | RetractResult
    | RestoreResult
    | MarkSettled
    | RecordFailure
    | ScheduleRetry
)


# ---------------------------------------------------------------------------- applying effects


def apply(state: TaskState, effect: Effect) -> TaskState:
    """The state after `effect` (what the store will hold once the shell applies it)."""
    if isinstance(effect, StoreEvent):
        if any(e.event_id == effect.event.event_id for e in state.events):
            return state
        return dataclasses.replace(state, events=(*state.events, effect.event))
    if isinstance(effect, RemoveEvent):
        return dataclasses.replace(state, events=tuple(e for e in state.events if e.event_id != effect.event_id))
    if isinstance(effect, SaveRequest):
        return dataclasses.replace(state, requests={**state.requests, effect.request.request_id: effect.request})
    if isinstance(effect, SetRequestState):
        current = state.requests.get(effect.request_id)
        if current is None:
            return state
        updated = dataclasses.replace(current, state=effect.state)
        return dataclasses.replace(state, requests={**state.requests, effect.request_id: updated})
    if isinstance(effect, ScheduleRetry):
        current = state.requests.get(effect.request_id)
        if current is None:
            return state
        updated = dataclasses.replace(current, state="waiting_retry", retry_count=effect.retry_count)
        return dataclasses.replace(state, requests={**state.requests, effect.request_id: updated})
    if isinstance(effect, RecordResult):
        record = ResultRecord(**{name: getattr(effect, name) for name in _RECORDED})
        return dataclasses.replace(state, results={**state.results, effect.attempt: record})
    if isinstance(effect, AttachReport):
        current_result = state.results[effect.attempt]
        updated_result = dataclasses.replace(current_result, reported=True, source="agent", request_id=effect.request_id)
        return dataclasses.replace(state, results={**state.results, effect.attempt: updated_result})
    if isinstance(effect, RetractResult | RestoreResult):
        status: Literal["final", "retracted"] = "retracted" if isinstance(effect, RetractResult) else "final"
        updated_result = dataclasses.replace(state.results[effect.attempt], status=status)
        return dataclasses.replace(state, results={**state.results, effect.attempt: updated_result})
    if isinstance(effect, MarkSettled):
        updated_result = dataclasses.replace(state.results[effect.attempt], settled_tx=effect.tx_hash)
        return dataclasses.replace(state, results={**state.results, effect.attempt: updated_result})
    if isinstance(effect, RecordFailure):
        failure = FailureRecord(failures=effect.failures, never_judged=effect.never_judged)
        return dataclasses.replace(state, failures={**state.failures, effect.attempt: failure})
    return state  # Judge changes nothing by itself: `conclude` does


def apply_all(state: TaskState, effects: Iterable[Effect]) -> TaskState:
    """The state after every effect in order."""
    for effect in effects:
        state = apply(state, effect)
    return state


# ---------------------------------------------------------------------------- the decision


@dataclass
class _Plan:
    """Effects accumulated with the state they lead to."""

    state: TaskState
    effects: list[Effect] = field(default_factory=list)

    def add(self, effect: Effect) -> None:
        self.effects.append(effect)
        self.state = apply(self.state, effect)


def decide(state: TaskState, message: Message) -> list[Effect]:
    """The effects of `message` on the task, in the order the shell must apply them."""
    plan = _Plan(state)
    if isinstance(message, EventObserved):
        plan.add(StoreEvent(message.event))
    elif isinstance(message, EventRetracted):
        if any(e.event_id == message.event_id for e in state.events):
            plan.add(RemoveEvent(message.event_id))
    elif isinstance(message, RequestObserved):
        request = message.request
        if request.kind == "retry":
            return []
        existing = state.requests.get(request.request_id)
        if existing is not None and existing.state not in ("accepted",):
            return []  # the same request again: nothing new
        plan.add(SaveRequest(dataclasses.replace(request, state="pending")))
    elif isinstance(message, RetryDueObserved):
        target = state.requests.get(message.target_request_id)
        if target is None or target.state not in ("waiting_retry", "retry_queued"):
            return []
        if message.retry_count != target.retry_count:
            return []  # a stale retry: a later one is scheduled
        plan.add(SetRequestState(target.request_id, "pending"))
    _reconcile(plan)
    return plan.effects


def _reconcile(plan: _Plan) -> None:
    _reconcile_results(plan)
    _reconcile_chain_verdicts(plan)
    ordered = sorted(
        (r for r in plan.state.requests.values() if r.state in _OPEN_STATES),
        key=lambda r: (r.attempt, r.kind, r.request_id),
    )
    for request in ordered:
        # Re-read: an earlier request of this pass may have judged the attempt.
        current = plan.state.requests[request.request_id]
        if current.state in _OPEN_STATES:
            _route(plan, current)


def _supported(result: ResultRecord, chain: ChainTask) -> bool:
    if result.source in ("auto", "manual"):
        return chain.attempts.get(result.attempt) == result.evidence_hash
    verdict = chain.verdicts.get(result.attempt)
    return (
        verdict is not None
        and verdict.evidence_hash == result.evidence_hash
        and verdict.passed == result.passed
        and verdict.score == result.score
    )


def _reconcile_results(plan: _Plan) -> None:
    chain = plan.state.chain
    for attempt in sorted(plan.state.results):
        result = plan.state.results[attempt]
        supported = _supported(result, chain)
        if result.status == "final" and not supported:
            plan.add(RetractResult(attempt, "the evidence or verdict it judged was removed by a reorg"))
        elif result.status == "retracted" and supported:
            plan.add(RestoreResult(attempt))


def _reconcile_chain_verdicts(plan: _Plan) -> None:
    state = plan.state
    chain = state.chain
    mode = state.mode
    for attempt in sorted(state.results):
        result = state.results[attempt]
        verdict = chain.verdicts.get(attempt)
        landed = verdict.tx_hash if verdict is not None and verdict.evidence_hash == result.evidence_hash else None
        if result.source in ("auto", "manual") and result.settled_tx != landed:
            plan.add(MarkSettled(attempt, landed, verdict.block_number if landed and verdict else None))
    if mode != "agent":
        return
    for attempt in sorted(chain.verdicts):
        verdict = chain.verdicts[attempt]
        existing = plan.state.results.get(attempt)
        if existing is not None and existing.status == "final":
            continue
        if existing is not None and existing.status == "retracted" and _supported(existing, chain):
            continue
        plan.add(
            RecordResult(
                attempt=attempt,
                evidence_hash=verdict.evidence_hash,
                mode="agent",
                source="chain",
                passed=verdict.passed,
                score=verdict.score,
                verification_result=agent_result(verdict.passed, verdict.score, ()),
                verifier_kind=f"agent:{verdict.verifier}",
                sign=False,
            )
        )


def _route(plan: _Plan, request: RequestRecord) -> None:
    state = plan.state
    mode = state.mode
    chain = state.chain
    if mode is None:
        return  # terms not (yet) governing the task: wait
    result = state.results.get(request.attempt)
    judged = result is not None and result.status == "final"
    if request.kind == "finalize":
        if mode != "auto":
            plan.add(SetRequestState(request.request_id, "stored", f"{mode} task: the result waits for its judge"))
        elif judged:
            plan.add(SetRequestState(request.request_id, "superseded", "the attempt is already judged"))
        elif chain.is_pending(request.attempt, request.evidence_hash):
            plan.add(
                Judge(
                    request_id=request.request_id,
                    attempt=request.attempt,
                    evidence_hash=request.evidence_hash,
                    result=request.payload.get("result"),
                    retry_count=request.retry_count,
                )
            )
        elif chain.moved_past(request.attempt):
            plan.add(SetRequestState(request.request_id, "superseded", "the attempt can no longer be judged"))
    elif request.kind == "review":
        if mode != "manual":
            plan.add(SetRequestState(request.request_id, "rejected", "only manual tasks are reviewed by the poster"))
        elif chain.poster is None or request.actor.lower() != chain.poster.lower():
            plan.add(SetRequestState(request.request_id, "rejected", "only the poster reviews"))
        elif judged:
            plan.add(SetRequestState(request.request_id, "superseded", "the attempt is already judged"))
        elif chain.is_pending(request.attempt, request.evidence_hash):
            passed = bool(request.payload.get("passed"))
            reasons = tuple(str(r) for r in request.payload.get("reasons") or ())
            plan.add(
                RecordResult(
                    attempt=request.attempt,
                    evidence_hash=request.evidence_hash,
                    mode="manual",
                    source="manual",
                    passed=passed,
                    score=100 if passed else 0,
                    verification_result=manual_result(passed, reasons),
                    verifier_kind="manual-review",
                    sign=True,
                    request_id=request.request_id,
                )
            )
            plan.add(SetRequestState(request.request_id, "applied"))
        elif chain.moved_past(request.attempt):
            plan.add(SetRequestState(request.request_id, "superseded", "the attempt can no longer be judged"))
    elif request.kind == "verifier_verdict":
        _route_report(plan, request, mode)
    elif request.kind == "verifier_error":
        _route_failure(plan, request, mode)


def _route_report(plan: _Plan, request: RequestRecord, mode: Mode) -> None:
    chain = plan.state.chain
    if mode != "agent":
        plan.add(SetRequestState(request.request_id, "rejected", "only agent-review tasks take verifier reports"))
        return
    if chain.verifier is None or request.actor.lower() != chain.verifier.lower():
        plan.add(SetRequestState(request.request_id, "rejected", "only the named verifier reports"))
        return
    verdict = chain.verdicts.get(request.attempt)
    if verdict is None:
        return  # its on-chain verdict is not indexed yet: wait for it
    passed = bool(request.payload.get("passed"))
    score = int(request.payload.get("score") or 0)
    if (verdict.evidence_hash, verdict.passed, verdict.score) != (request.evidence_hash, passed, score):
        plan.add(SetRequestState(request.request_id, "rejected", "the report does not match the verdict on chain"))
        return
    result = plan.state.results.get(request.attempt)
    if result is not None and result.reported:
        plan.add(SetRequestState(request.request_id, "superseded", "a report is already recorded"))
        return
    reasons = tuple(str(r) for r in request.payload.get("reasons") or ())
    plan.add(AttachReport(request.attempt, agent_result(passed, score, reasons), request.request_id))
    plan.add(SetRequestState(request.request_id, "applied"))


def _route_failure(plan: _Plan, request: RequestRecord, mode: Mode) -> None:
    state = plan.state
    chain = state.chain
    if mode != "agent":
        plan.add(SetRequestState(request.request_id, "rejected", "only agent-review tasks take verifier reports"))
        return
    if chain.verifier is None or request.actor.lower() != chain.verifier.lower():
        plan.add(SetRequestState(request.request_id, "rejected", "only the named verifier reports"))
        return
    failure = state.failures.get(request.attempt, FailureRecord(0, False))
    if request.attempt in chain.verdicts or chain.moved_past(request.attempt):
        plan.add(SetRequestState(request.request_id, "superseded", "the attempt is already judged"))
        return
    if failure.never_judged:
        plan.add(SetRequestState(request.request_id, "superseded", "the verifier already gave up on this attempt"))
        return
    if chain.attempts.get(request.attempt) != request.evidence_hash:
        return  # the submission is not indexed yet (or was retracted): wait for it
    failures = failure.failures + 1
    plan.add(
        RecordFailure(
            attempt=request.attempt,
            verifier=request.actor,
            failures=failures,
            never_judged=failures >= MAX_VERIFIER_FAILURES,
            error=str(request.payload.get("error") or "")[:500],
        )
    )
    plan.add(SetRequestState(request.request_id, "applied"))


# ---------------------------------------------------------------------------- judging


@dataclass(frozen=True)
class Judged:
    """The judgement of a finalized result."""

    result: VerificationResult
    verifier_kind: str
    proof_fields: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CouldNotJudge:
    """A verifier could not answer: retry later, never a zero."""

    verifier: str
    reason: str


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff between judging tries of one finalize."""

    base_seconds: float = 5.0
    max_seconds: float = 600.0

    def delay(self, retry_count: int) -> float:
        """Seconds to wait before try number `retry_count + 1`."""
        return min(self.max_seconds, self.base_seconds * 2.0 ** max(0, retry_count - 1))


def judgement_wanted(state: TaskState, request_id: str, retry_count: int) -> Judge | None:
    """The `Judge` the task's state still asks for this request's try, or None when it no longer does.

    The judging stage asks before it judges and again, under the task's lock, before it
    commits: a superseded attempt, a request already settled by another verdict, a newer
    try or a retracted submission all mean the judgement must leave no effect.
    """
    plan = _Plan(state)
    _reconcile(plan)
    for effect in plan.effects:
        if isinstance(effect, Judge) and effect.request_id == request_id and effect.retry_count == retry_count:
            return effect
    return None


def conclude(state: TaskState, judge: Judge, outcome: Judged | CouldNotJudge, policy: RetryPolicy) -> list[Effect]:
    """The effects of a judgement — a signed verdict, or a retry later — then what follows from it.

    `state` is the task's state when the `Judge` effect ran. Reconciling again afterwards
    closes the requests the verdict settled, so one message always reaches a fixed point.
    """
    plan = _Plan(state)
    if isinstance(outcome, CouldNotJudge):
        count = judge.retry_count + 1
        plan.add(
            ScheduleRetry(
                request_id=judge.request_id,
                retry_count=count,
                delay_seconds=policy.delay(count),
                error=f"verifier {outcome.verifier} could not answer: {outcome.reason}"[:500],
            )
        )
    else:
        result = outcome.result
        plan.add(
            RecordResult(
                attempt=judge.attempt,
                evidence_hash=judge.evidence_hash,
                mode="auto",
                source="auto",
                passed=result.passed,
                score=result.score,
                verification_result=result.to_json_dict(),
                verifier_kind=outcome.verifier_kind,
                sign=True,
                request_id=judge.request_id,
                proof_fields=dict(outcome.proof_fields),
            )
        )
        plan.add(SetRequestState(judge.request_id, "applied"))
    _reconcile(plan)
    return plan.effects


def combine(
    auto: VerificationResult | None,
    verifier_name: str | None,
    reward: float | None,
    pass_reward: float,
    verifier_reasons: Sequence[str] = (),
) -> VerificationResult:
    """The verdict of the auto-check and a registry verifier together.

    The registry verifier is a gate appended to the breakdown: it runs only when the
    auto-check passed (or there are no criteria) and does not enter the weighted average;
    when it fails, the score is capped at its reward (as a percentage). What the verifier
    found beyond its reward (test counts, resource limits) travels next to this result in
    `Judged.proof_fields`, into the signed proof.
    """
    if reward is None or verifier_name is None:
        if auto is None:
            raise ValueError("nothing was checked")
        return auto
    clamped = min(1.0, max(0.0, reward))
    percent = _round_half_up(100 * clamped)
    gate_passed = reward >= pass_reward
    item = BreakdownItem(name=f"verifier:{verifier_name}", score=clamped, weight=1, reason="")
    if auto is not None and not auto.passed:
        return auto
    if gate_passed:
        if auto is None:
            return VerificationResult(passed=True, score=percent, reasons=(ALL_CRITERIA_MET,), breakdown=(item,))
        return VerificationResult(
            passed=True, score=auto.score, reasons=auto.reasons, breakdown=(*auto.breakdown, item), errors=auto.errors
        )
    why = tuple(verifier_reasons) or (f"verifier:{verifier_name}: reward {reward:g}, below {pass_reward:g}",)
    breakdown = (item,) if auto is None else (*auto.breakdown, item)
    score = percent if auto is None else min(auto.score, percent)
    errors = {} if auto is None else dict(auto.errors)
    return VerificationResult(passed=False, score=score, reasons=why, breakdown=breakdown, errors=errors)


def _round_half_up(value: float) -> int:
    return int(value + 0.5)


def manual_result(passed: bool, reasons: Sequence[str]) -> dict[str, Any]:
    """The `verificationResult` of a poster's review: 100 on approval, 0 on rejection."""
    default = "Approved by the poster" if passed else "Rejected by the poster"
    return VerificationResult(
        passed=passed, score=100 if passed else 0, reasons=tuple(reasons) or (default,)
    ).to_json_dict()


def agent_result(passed: bool, score: int, reasons: Sequence[str]) -> dict[str, Any]:
    """The `verificationResult` of a verifier agent's on-chain verdict (reasons from its report)."""
    return VerificationResult(passed=passed, score=score, reasons=tuple(reasons)).to_json_dict()

