"""Where each agent-review refusal sits (seed 000, "Who can be a verifier" and "How it works").

| step | code | decided by |
| --- | --- | --- |
| terms registration (before funding) | `409 VERIFIER_NOT_OPTED_IN` | `named_verifier_check` |
| terms registration | `409 SELF_VERIFICATION` (poster names itself) | `api.tasks.register_terms` |
| listing (after funding) | `409 VERIFIER_MISMATCH` | `listing_check` |
| listing | `409 VERIFIER_NOT_OPTED_IN` (opted out or no verifier role since the terms) | `verifier_check` |
| listing | `409 VERIFIER_CHAIN_UNSUPPORTED` | `verifier_check` |
| listing | `409 VERIFIER_NOT_RUNNING` (not seen within the staleness window) | `verifier_check` |
| listing | `400 VERIFIER_NOT_WRAPPED` (private task) | `listing_check` |
| listing | `400 VERIFIER_KEY_MALFORMED` (private task: its wrapped key is not a format-2 key) | `listing_check` |
| finalize | `403 IS_VERIFIER` | `api.tasks.finalize_check` |
| verifier report | `409 SELF_VERIFICATION` (the agent judges itself) | `api.tasks.report_check` |

Listing is the poster's step after `createTask…` is indexed: only a listed task is shown to
agents (`GET /v1/listings`) and only a listed task's brief is served to them. A registered
verifier is checked again at listing, whatever it was at terms registration: it may have
opted out, dropped the role or the chain, or stopped running since. An unregistered address
(a self-run verifier) has no entry to check; its wrapped key still must be well-formed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

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
    malformed: frozenset[str] = field(default_factory=frozenset)
    """Recipients whose stored wrapped key is not well-formed (wrong format, length or point)."""


def verifier_check(verifier: Executor, chain_id: int, now: datetime, stale_seconds: float) -> Refused | None:
    """At listing: the registered named verifier has the role, opted in, settles on the chain and is running."""
    if "verifier" not in verifier.roles or not verifier.verify_others:
        return Refused(409, "VERIFIER_NOT_OPTED_IN", "the named verifier no longer takes other posters' tasks")
    if chain_id not in verifier.chains:
        return Refused(409, "VERIFIER_CHAIN_UNSUPPORTED", f"the verifier does not settle on chain {chain_id}")
    age = (now - verifier.last_seen).total_seconds()
    if age > stale_seconds:
        return Refused(
            409, "VERIFIER_NOT_RUNNING", f"the verifier was last seen {int(age)} s ago (more than {int(stale_seconds)} s)"
        )
    return None


def listing_check(
    key: TaskKey,
    chain: ChainTask,
    terms: TermsView | None,
    signer: str,
    verifier: Executor | None,
    brief: BriefState,
    now: datetime,
    stale_seconds: float,
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
    if terms.mode == "agent" and verifier is not None:
        refused = verifier_check(verifier, key.chain_id, now, stale_seconds)
        if refused is not None:
            return refused
    if terms.private:
        if not brief.stored:
            return Refused(409, "BRIEF_REQUIRED", "a private task is listed with its encrypted brief")
        if not brief.private:
            return Refused(400, "BRIEF_NOT_ENCRYPTED", "a private task's brief must be encrypted")
        if terms.mode == "agent" and (named or "").lower() not in brief.recipients:
            return Refused(400, "VERIFIER_NOT_WRAPPED", "the brief's key is not wrapped to the verifier")
        if terms.mode == "agent" and (named or "").lower() in brief.malformed:
            return Refused(400, "VERIFIER_KEY_MALFORMED", "the key wrapped to the verifier is not a well-formed wrapped key")
    return None
