"""Where each agent-review refusal sits (seed 000, "Who can be a verifier" and "How it works").

| step | code | decided by |
| --- | --- | --- |
| terms registration (before funding) | `409 VERIFIER_NOT_OPTED_IN` | `named_verifier_check` |
| terms registration | `409 SELF_VERIFICATION` (poster names itself) | `api.tasks.register_terms` |
| listing (after funding) | `409 VERIFIER_MISMATCH` | `listing_check` |
| listing | `409 VERIFIER_CHAIN_UNSUPPORTED` | `listing_check` |
| listing | `400 VERIFIER_NOT_WRAPPED` (private task) | `listing_check` |
| finalize | `403 IS_VERIFIER` | `api.tasks.finalize_check` |
| verifier report | `409 SELF_VERIFICATION` (the agent judges itself) | `api.tasks.report_check` |

Listing is the poster's step after `createTask…` is indexed: only a listed task is shown to
agents (`GET /v1/listings`) and only a listed task's brief is served to them.
"""

from __future__ import annotations

from dataclasses import dataclass

from verification.agents.directory import Executor
from verification.routing import ChainTask, TaskKey, TermsView, terms_problem


@dataclass(frozen=True)
class Refused:
    """A refusal: status, code, one sentence."""

    status: int
    code: str
    message: str


def _same(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and a.lower() == b.lower()


def named_verifier_check(verifier: Executor | None) -> Refused | None:
    """At terms registration: a hosted (registered) verifier must have opted in to verify others."""
    if verifier is None:
        return None  # any address may be named; an unregistered one is checked at listing
    if "verifier" not in verifier.roles or not verifier.verify_others:
        return Refused(409, "VERIFIER_NOT_OPTED_IN", "the named verifier does not take other posters' tasks")
    return None


@dataclass(frozen=True)
class BriefState:
    """What is stored of the task's brief: whether it exists, and to whom its key is wrapped."""

    stored: bool
    private: bool
    recipients: frozenset[str]


def listing_check(
    key: TaskKey,
    chain: ChainTask,
    terms: TermsView | None,
    signer: str,
    verifier: Executor | None,
    brief: BriefState,
) -> Refused | None:
    """May `signer` list this funded task now? (None: yes.)"""
    if chain.task_hash is None:
        return Refused(404, "TASK_NOT_FOUND", "the task is not indexed (yet)")
    if not _same(signer, chain.poster):
        return Refused(403, "NOT_POSTER", "only the poster lists the task")
    if terms is None:
        return Refused(409, "TERMS_NOT_REGISTERED", "no terms are registered for the task's taskHash")
    on_chain = chain.verifier or None
    named = terms.verifier_address if terms.mode == "agent" else None
    if (on_chain or named) and not _same(on_chain, named):
        return Refused(
            409, "VERIFIER_MISMATCH", "the verifier given to createTaskWithVerifier is not the one the terms name"
        )
    issue = terms_problem(key, chain, terms)
    if issue is not None:
        return Refused(409, "TERMS_MISMATCH", f"the registered terms do not govern this task: {issue}")
    if terms.mode == "agent" and verifier is not None and key.chain_id not in verifier.chains:
        return Refused(409, "VERIFIER_CHAIN_UNSUPPORTED", f"the verifier does not settle on chain {key.chain_id}")
    if terms.private:
        if not brief.stored:
            return Refused(409, "BRIEF_REQUIRED", "a private task is listed with its encrypted brief")
        if not brief.private:
            return Refused(400, "BRIEF_NOT_ENCRYPTED", "a private task's brief must be encrypted")
        if terms.mode == "agent" and (named or "").lower() not in brief.recipients:
            return Refused(400, "VERIFIER_NOT_WRAPPED", "the brief's key is not wrapped to the verifier")
    return None
