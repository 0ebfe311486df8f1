"""What the hosted verifier checks before it judges (pure): the chain decides, the API only delivers.

The queue item (from the API) says: this task, this attempt, this result, under these terms.
None of it is taken on the API's word. Before asking its model, the verifier checks that:

1. the terms hash (keccak256 of their canonical JSON) to the task's on-chain `taskHash`, and
   are agent-review terms of this chain and escrow naming this verifier, which the chain
   names too;
2. the task is Submitted on chain, the item's attempt is its latest, and the result hashes
   (`result_hash`) to the on-chain `lastEvidenceHash` of that attempt;
3. the brief hashes to the terms' `instructionsDigest`: a public brief its UTF-8 text, a
   private one its ciphertext, which commits to the one content key that opens it; the
   wrapped key must open for this chain, escrow, task hash and this verifier.

Anything else is a `Refusal`, which the verifier reports as a failed try and never turns
into a verdict. The acceptance note the model reads comes from the checked terms.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import urlsplit

from eth_utils.crypto import keccak
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from chain.abi import TaskOnChain
from schemas.task_terms import CanonicalJsonError, TaskTerms, canonical_json, result_hash
from verification.agents import briefs

STATUS_SUBMITTED = 2
Hex32 = Annotated[str, StringConstraints(pattern=r"^0x[0-9a-fA-F]{64}$")]
HexAddress = Annotated[str, StringConstraints(pattern=r"^0x[0-9a-fA-F]{40}$")]


class Refusal(Exception):
    """What the verifier was shown does not match the chain: it refuses to judge."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(f"{code}: {reason}")
        self.code = code
        self.reason = reason
        self.evidence_hash: str | None = None
        """The attempt's on-chain evidence hash when it was read (the report names it, not the item's)."""


class QueueEntry(BaseModel):
    """One queue item as the verifier reads it (strict types; fields it does not use are ignored)."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True, strict=True)

    chain_id: int = Field(alias="chainId", gt=0, lt=2**63)
    escrow: HexAddress
    task_id: int = Field(alias="taskId", ge=1, lt=2**256)
    task_hash: Hex32 = Field(alias="taskHash")
    attempt: int = Field(ge=1, le=3)
    evidence_hash: Hex32 = Field(alias="evidenceHash")
    result: Any = None
    terms: dict[str, Any]
    failures: int = Field(default=0, ge=0)


@dataclass(frozen=True)
class Grounds:
    """What the verifier judges, checked against the chain."""

    entry: QueueEntry
    terms: TaskTerms
    result_text: str
    acceptance: str | None


def parse_entry(item: Any) -> QueueEntry:
    """The queue item's fields, strictly typed (Refusal otherwise)."""
    try:
        return QueueEntry.model_validate(item)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "item"
        raise Refusal("QUEUE_ITEM_INVALID", f"the queue item does not fit: {where}") from None


def check_item(entry: QueueEntry, on_chain: TaskOnChain, me: str) -> Grounds:
    """Steps 1 and 2: the terms and the result against the chain."""
    me = me.lower()
    try:
        digest = "0x" + keccak(canonical_json(entry.terms).encode("utf-8")).hex()
    except CanonicalJsonError:
        raise Refusal("TERMS_MISMATCH", "the terms have no canonical form") from None
    if digest != on_chain.task_hash or entry.task_hash.lower() != on_chain.task_hash:
        raise Refusal("TERMS_MISMATCH", "the terms do not hash to the task's on-chain taskHash")
    try:
        terms = TaskTerms.model_validate(entry.terms)
    except ValidationError:
        raise Refusal("TERMS_MISMATCH", "the terms committed on chain are not valid terms") from None
    if terms.chain_id != entry.chain_id or terms.escrow.lower() != entry.escrow.lower():
        raise Refusal("TERMS_MISMATCH", "the terms name another chain or escrow")
    if terms.verification_mode != "agent" or (terms.verifier_address or "").lower() != me:
        raise Refusal("NOT_MY_TASK", "the terms do not name this verifier for agent review")
    if on_chain.verifier != me:
        raise Refusal("NOT_MY_TASK", "the escrow does not name this verifier for the task")
    if on_chain.status != STATUS_SUBMITTED or on_chain.attempts != entry.attempt:
        raise Refusal("ATTEMPT_MISMATCH", f"attempt {entry.attempt} is not the task's delivered attempt on chain")
    try:
        evidence = result_hash(entry.result)
    except (CanonicalJsonError, TypeError, ValueError):
        raise Refusal("EVIDENCE_MISMATCH", "the result has no canonical form") from None
    if evidence != on_chain.last_evidence_hash or entry.evidence_hash.lower() != on_chain.last_evidence_hash:
        raise Refusal("EVIDENCE_MISMATCH", "the result does not hash to the attempt's on-chain evidence hash")
    criteria = terms.verification_criteria
    acceptance = getattr(criteria, "acceptance", None) if criteria is not None else None
    text = entry.result if isinstance(entry.result, str) else canonical_json(entry.result)
    return Grounds(entry, terms, text, acceptance if isinstance(acceptance, str) else None)


def open_checked_brief(grounds: Grounds, status: int, reply: Any, enc_key: bytes, me: str) -> str:
    """Step 3: the brief the API answered (`status`, parsed body) against the checked terms."""
    terms, entry = grounds.terms, grounds.entry
    if status == 404:
        raise Refusal("BRIEF_MISSING", "no brief is stored for the task: nothing to judge the result against")
    if status in (401, 403):
        raise Refusal("BRIEF_NOT_READABLE", "the brief is not readable by this verifier")
    if status != 200 or not isinstance(reply, dict):
        raise Refusal("BRIEF_INVALID", f"the brief could not be read (HTTP {status})")
    digest = terms.instructions_digest.lower()
    if bool(reply.get("private")) != terms.private:
        raise Refusal("BRIEF_MISMATCH", "the brief's privacy is not the terms'")
    if not terms.private:
        brief = reply.get("brief")
        if not isinstance(brief, str) or "0x" + keccak(brief.encode("utf-8", "surrogatepass")).hex() != digest:
            raise Refusal("BRIEF_MISMATCH", "the brief does not hash to the terms' instructionsDigest")
        return brief
    ciphertext_text, wrapped_text = reply.get("ciphertext"), reply.get("wrappedKey")
    if not isinstance(ciphertext_text, str) or not isinstance(wrapped_text, str):
        raise Refusal("BRIEF_INVALID", "a private brief comes as ciphertext and a wrapped key")
    try:
        ciphertext = briefs.unb64(ciphertext_text, briefs.MAX_CIPHERTEXT_BYTES)
        wrapped = briefs.unb64(wrapped_text, briefs.WRAPPED_KEY_BYTES)
    except briefs.BriefError as exc:
        raise Refusal("BRIEF_INVALID", f"the brief is malformed ({exc})") from None
    if briefs.ciphertext_digest(ciphertext) != digest:
        raise Refusal("BRIEF_MISMATCH", "the ciphertext does not hash to the terms' instructionsDigest")
    context = briefs.KeyContext(entry.chain_id, entry.escrow, entry.task_hash.lower(), me)
    try:
        return briefs.open_brief(ciphertext, briefs.unwrap_key(wrapped, enc_key, context))
    except briefs.BriefError as exc:
        raise Refusal("BRIEF_UNOPENABLE", f"the brief does not open with this verifier's key ({exc})") from None


def trusted_api_url(url: str) -> str:
    """An HTTPS URL, or plain HTTP only to a loopback host (ValueError otherwise)."""
    parts = urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return url
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError("must be an https:// URL")
    host = parts.hostname
    if host == "localhost":
        return url
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError("must be https:// (plain http:// only to a loopback address)")
    return url
