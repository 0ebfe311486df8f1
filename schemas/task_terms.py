"""Off-chain task terms, their canonical hash, and the verification API's bodies and messages.

A poster registers the task's terms before posting; `task_hash(terms)` is the `taskHash`
the escrow commits to, so the mode, the criteria and the named verifier cannot change
after posting (SPEC 6.1).

Canonical form
--------------
`canonical_json(value)` follows RFC 8785 (JSON Canonicalization Scheme):

* object keys sorted by their UTF-16 code units, no insignificant whitespace;
* strings as UTF-8, escaping only `"`, `\\` and control characters below U+0020
  (`\\b \\t \\n \\f \\r`, else `\\u00xx` in lower-case hex); lone surrogates are refused;
* numbers as ECMAScript prints them (`1.0` → `1`, `1e21`, `1e-7`); NaN and infinities are
  refused; one deliberate difference: integers are written exactly, whatever their size
  (JSON numbers from JavaScript would lose digits above 2**53; ours never do).

The terms are canonicalised *after* validation, so equivalent inputs hash alike: absent
mode becomes `"manual"`, addresses are EIP-55 checksummed, `null` fields are left out,
and the criteria are the parsed model (misspelled fields dropped, defaults filled in).
`task_hash(terms) = keccak256(canonical_json(terms.canonical_dict()))`.

The result an agent delivers is any JSON value; its hash, the `evidenceHash` the agent
passes to `submitEvidence`, is `result_hash(result)`: keccak256 of the UTF-8 text when the
result is a string, else of its canonical JSON.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, ClassVar, Literal

from eth_utils.address import to_checksum_address
from eth_utils.crypto import keccak
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from schemas.criteria import VerificationCriteria
from schemas.panels import integral_fields
from schemas.request_auth import RequesterProof, ServiceProof
from schemas.task_state import Address, Hash32
from schemas.verification import VerificationResult

VerificationMode = Literal["auto", "manual", "agent"]
SUPPORTED_MODES: tuple[str, ...] = ("auto", "manual", "agent")
DEFAULT_MODE: VerificationMode = "manual"
MAX_REVIEW_REASONS = 20
MAX_VERIFIER_REASONS = 10
MAX_REASON_CHARS = 2_000
MAX_RESULT_BYTES = 512 * 1024
"""Largest accepted result (canonical JSON bytes): it travels in one Kafka message."""

VerifierKind = Literal[
    "rubric",
    "plugin",
    "endpoint",
    "exact_match",
    "schema_validation",
    "numerical_range",
    "test_suite",
    "execution_result",
    "optimization_score",
    "multi_verifier",
    "keyword_rubric",
]

_CAMEL = ConfigDict(populate_by_name=True, frozen=True, extra="forbid")


# ---------------------------------------------------------------------------- canonical JSON


class CanonicalJsonError(ValueError):
    """The value has no canonical JSON form (NaN, infinity, lone surrogate, non-JSON type)."""


def _es_number(value: float) -> str:
    """A finite float as ECMAScript's Number::toString prints it (RFC 8785 section 3.2.2.3)."""
    if not math.isfinite(value):
        raise CanonicalJsonError("NaN and infinities have no JSON form")
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    mantissa, _, exp_text = repr(abs(value)).partition("e")
    int_part, _, frac_part = mantissa.partition(".")
    digits = (int_part + frac_part).lstrip("0")
    # Decimal exponent n such that value = 0.d1d2... x 10**n (ECMAScript's notation).
    lead_zeros = len(int_part + frac_part) - len((int_part + frac_part).lstrip("0"))
    n = len(int_part) - lead_zeros + (int(exp_text) if exp_text else 0)
    digits = digits.rstrip("0") or "0"
    k = len(digits)
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return sign + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * (-n) + digits
    exponent = n - 1
    exp_sign = "+" if exponent >= 0 else "-"
    head = digits[0] + ("." + digits[1:] if k > 1 else "")
    return f"{sign}{head}e{exp_sign}{abs(exponent)}"


def _canonical_parts(value: Any, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, float):
        out.append(_es_number(value))
    elif isinstance(value, str):
        out.append(_canonical_string(value))
    elif isinstance(value, list | tuple):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _canonical_parts(item, out)
        out.append("]")
    elif isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise CanonicalJsonError(f"object keys must be strings, not {type(key).__name__}")
        out.append("{")
        for i, key in enumerate(sorted(value, key=_utf16_key)):
            if i:
                out.append(",")
            out.append(_canonical_string(key))
            out.append(":")
            _canonical_parts(value[key], out)
        out.append("}")
    else:
        raise CanonicalJsonError(f"{type(value).__name__} is not a JSON type")


def _utf16_key(key: str) -> bytes:
    try:
        return key.encode("utf-16-be")
    except UnicodeEncodeError:
        raise CanonicalJsonError("strings may not contain lone surrogates") from None


def _canonical_string(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise CanonicalJsonError("strings may not contain lone surrogates") from None
    # With ensure_ascii off, json escapes exactly the characters RFC 8785 escapes, with the
    # same short forms and lower-case \u00xx for the other control characters.
    return json.dumps(text, ensure_ascii=False)


def canonical_json(value: Any) -> str:
    """The RFC 8785 canonical JSON text of a JSON value (see the module docstring)."""
    out: list[str] = []
    _canonical_parts(value, out)
    return "".join(out)


def keccak_hex(data: bytes) -> str:
    """keccak256 of `data` as 0x-prefixed lower-case hex."""
    return "0x" + bytes(keccak(data)).hex()


def result_hash(result: Any) -> str:
    """The evidence hash of a delivered result: keccak of its text, or of its canonical JSON."""
    if isinstance(result, str):
        return keccak_hex(result.encode("utf-8"))
    return keccak_hex(canonical_json(result).encode("utf-8"))


def result_size(result: Any) -> int:
    """Size in bytes of the result as hashed (text or canonical JSON)."""
    if isinstance(result, str):
        return len(result.encode("utf-8"))
    return len(canonical_json(result).encode("utf-8"))


# ---------------------------------------------------------------------------- terms


def _checksum(value: str) -> str:
    return str(to_checksum_address(value))


class VerifierRef(BaseModel):
    """A verifier of the registry (seed 001 kinds and seed 002 types), named in the terms.

    `ref` names the thing that owns the judgement: `<owner>/<name>` of a rubric,
    `module:callable` of a plugin, the URL of an endpoint, or a label of a built-in type.
    `config` parameterises built-in types and is passed to plugins and endpoints as part of
    the task. A reward of at least `passReward` passes.
    """

    model_config = ConfigDict(populate_by_name=True, frozen=True, extra="forbid", strict=True)

    kind: VerifierKind
    ref: Annotated[str, StringConstraints(min_length=1, max_length=500)]
    config: dict[str, Any] = Field(default_factory=dict)
    pass_reward: float = Field(default=1.0, alias="passReward", ge=0.0, le=1.0)


class TaskTerms(BaseModel):
    """The validated, normalised off-chain terms of one task."""

    model_config = _CAMEL

    chain_id: int = Field(alias="chainId", gt=0)
    escrow: Address
    poster: Address
    instructions_digest: Hash32 = Field(
        alias="instructionsDigest", description="keccak256 of the brief; the brief stays private"
    )
    verification_mode: VerificationMode = Field(default=DEFAULT_MODE, alias="verificationMode")
    verification_criteria: VerificationCriteria | None = Field(default=None, alias="verificationCriteria")
    verifier_address: Address | None = Field(
        default=None, alias="verifierAddress", description="The named verifier agent (agent mode only)"
    )
    verifier: VerifierRef | None = Field(
        default=None, description="A registry verifier run with the auto-check (auto mode only)"
    )
    private: bool = False
    salt: Annotated[str, StringConstraints(max_length=66)] | None = Field(
        default=None, description="Optional: makes otherwise identical terms hash differently"
    )

    @field_validator("escrow", "poster", "verifier_address")
    @classmethod
    def _checksummed(cls, value: str | None) -> str | None:
        return None if value is None else _checksum(value)

    @field_validator("instructions_digest")
    @classmethod
    def _lower_hash(cls, value: str) -> str:
        return value.lower()

    def canonical_dict(self) -> dict[str, Any]:
        """The JSON value whose canonical form is hashed."""
        data: dict[str, Any] = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        return data

    def canonical(self) -> str:
        """The canonical JSON text of the terms."""
        return canonical_json(self.canonical_dict())


def task_hash(terms: TaskTerms) -> str:
    """The on-chain `taskHash` (bytes32, 0x hex) of the terms."""
    return keccak_hex(terms.canonical().encode("utf-8"))


# ---------------------------------------------------------------------------- API bodies


class ApiErrorDetail(BaseModel):
    """A refusal: a stable upper-case code and a sentence for people."""

    code: str
    message: str


class ApiError(BaseModel):
    """Every error response: `{"error": {"code", "message"}}`."""

    error: ApiErrorDetail


class _JsonBody(BaseModel):
    """A request body: strict types, unknown keys refused, and `INTEGERS` read as JSON reads them:
    `24.0` is the integer 24 (strings and bools stay refused), the one conversion JSON implies."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid", strict=True)
    INTEGERS: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _json_integers(cls, data: Any) -> Any:
        return integral_fields(data, cls.INTEGERS)


MAX_CHAIN_ID = 2**53 - 1
"""Largest chain id a request may name (what wallets and JavaScript clients can hold exactly)."""


class RegisterTermsRequest(_JsonBody):
    """Body of `POST /v1/terms`: the terms as the poster writes them.

    `verificationMode` is free text here so that an unsupported mode (`oracle`) gets its own
    refusal code instead of a generic validation error.
    """

    INTEGERS = ("chainId", "chain_id")

    chain_id: int = Field(alias="chainId", gt=0, le=MAX_CHAIN_ID)
    escrow: Address
    poster: Address
    instructions_digest: Hash32 = Field(alias="instructionsDigest")
    verification_mode: Annotated[str, StringConstraints(max_length=40)] | None = Field(
        default=None, alias="verificationMode"
    )
    verification_criteria: dict[str, Any] | None = Field(default=None, alias="verificationCriteria")
    verifier_address: Address | None = Field(default=None, alias="verifierAddress")
    verifier: VerifierRef | None = None
    private: bool = False
    salt: Annotated[str, StringConstraints(max_length=66)] | None = None


class _Reply(BaseModel):
    """A reply of the API: camelCase on the wire, field names in Python."""

    model_config = ConfigDict(populate_by_name=True)


class _TaskReply(_Reply):
    """A reply about one task: its chain, escrow and id (camelCase on the wire)."""

    chain_id: int = Field(alias="chainId")
    escrow: Address
    task_id: int = Field(alias="taskId")


class RegisterTermsResponse(_Reply):
    """The canonical hash to put on chain, the canonical text it hashes, and warnings."""

    task_hash: Hash32 = Field(alias="taskHash")
    canonical: str
    terms: TaskTerms
    warnings: list[str] = Field(default_factory=list)


class PublicVerifierRef(BaseModel):
    """A registry verifier as the public sees it: its config may hold hidden tests."""

    kind: VerifierKind
    ref: str


class PublicTerms(_Reply):
    """`GET /v1/terms/{taskHash}`: the public part of the terms."""

    task_hash: Hash32 = Field(alias="taskHash")
    chain_id: int = Field(alias="chainId")
    escrow: Address
    poster: Address
    verification_mode: VerificationMode = Field(alias="verificationMode")
    verification_criteria: dict[str, Any] | None = Field(alias="verificationCriteria")
    verifier_address: Address | None = Field(alias="verifierAddress")
    verifier: PublicVerifierRef | None
    private: bool


class FinalizeRequest(BaseModel):
    """Body of `POST .../finalize`: the result whose hash the agent submitted on chain."""

    model_config = ConfigDict(extra="forbid", strict=True)

    result: Any = Field(description="Any JSON value; a string `output` field is what the auto-check reads")


AttemptStatus = Literal[
    "judged",
    "pending",
    "retrying",
    "awaiting_review",
    "awaiting_verifier",
    "never_judged",
]


class ResultView(_Reply):
    """One judged (or pending) attempt as a reader may see it.

    A reader who is not a party of a private task sees `attempt`, `passed` and `score` only.
    """

    attempt: int
    passed: bool | None = None
    score: int | None = None
    status: AttemptStatus | None = None
    evidence_hash: Hash32 | None = Field(default=None, alias="evidenceHash")
    source: Literal["auto", "manual", "agent", "chain"] | None = None
    verification_result: VerificationResult | None = Field(default=None, alias="verificationResult")
    settled_tx: str | None = Field(default=None, alias="settledTx")


class FinalizeResponse(_TaskReply):
    """What the agent gets back: the full result once judged (auto mode), else the status."""

    attempt: int
    evidence_hash: Hash32 = Field(alias="evidenceHash")
    status: AttemptStatus
    verification_result: VerificationResult | None = Field(default=None, alias="verificationResult")


class ReviewRequest(_JsonBody):
    """Body of `POST .../review`: the poster's decision on the attempt it names.

    `attempt` and `evidenceHash` name what the poster judged: a review is refused unless they
    are the task's current attempt and its on-chain evidence, so a signed review can never be
    applied to an attempt its poster did not see.
    """

    INTEGERS = ("attempt",)

    attempt: int = Field(ge=1, le=3)
    evidence_hash: Hash32 = Field(alias="evidenceHash")
    passed: bool
    reasons: list[Annotated[str, StringConstraints(min_length=1, max_length=MAX_REASON_CHARS)]] = Field(
        default_factory=list, max_length=MAX_REVIEW_REASONS
    )


class VerifierReportRequest(_JsonBody):
    """Body of `POST .../verifier-report`: a verifier agent reports its verdict or a failure.

    A verdict is recorded only once it matches the verifier's own `completeVerification` on
    chain; an `error` report counts one failed try (after 5 the attempt is never judged).
    """

    INTEGERS = ("attempt", "score")

    attempt: int = Field(ge=1, le=3)
    evidence_hash: Hash32 = Field(alias="evidenceHash")
    outcome: Literal["verdict", "error"]
    passed: bool | None = None
    score: int | None = Field(default=None, ge=0, le=100)
    reasons: list[Annotated[str, StringConstraints(min_length=1, max_length=MAX_REASON_CHARS)]] = Field(
        default_factory=list, max_length=MAX_VERIFIER_REASONS
    )
    error: Annotated[str, StringConstraints(max_length=500)] | None = None


class RequestAccepted(_Reply):
    """Reply to a review or a verifier report: accepted, to be applied by the consumer."""

    request_id: str = Field(alias="requestId")
    attempt: int
    evidence_hash: Hash32 = Field(alias="evidenceHash")
    status: Literal["accepted", "duplicate"]


class TaskResults(_TaskReply):
    """`GET .../results`: every attempt's verdict as this reader may see it."""

    verification_mode: VerificationMode | None = Field(default=None, alias="verificationMode")
    private: bool
    visibility: Literal["full", "summary"]
    results: list[ResultView]


class Execution(_TaskReply):
    """One attempt in an agent's executions list."""

    private: bool
    visibility: Literal["full", "summary"]
    result: ResultView


class ExecutionsPage(BaseModel):
    """`GET /v1/agents/{address}/executions`."""

    agent: Address
    executions: list[Execution]


# ---------------------------------------------------------------------------- Kafka messages

REQUEST_EVENT_TYPE = "io.escrowd.verification.{kind}.v1"


class _RequestBase(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    request_id: str = Field(max_length=300)
    chain_id: int
    escrow_address: Address
    task_id: int = Field(ge=0)
    attempt: int = Field(ge=1, le=3)
    evidence_hash: Hash32
    actor: Address
    requested_at: int = Field(description="Unix seconds (wall clock) when the API accepted it")
    requester: RequesterProof | None = Field(
        default=None, description="The actor's signed HTTP request, re-verified by the consumer"
    )
    service: ServiceProof | None = Field(default=None, description="The API service key's signature")


class FinalizeRequested(_RequestBase):
    """The agent finalized attempt `attempt` with `result` (whose hash is `evidence_hash`).

    With `result_in_proof` the result travels once, inside the requester's signed body
    (`requester.body`), and `result` is null here: the consumer takes it from the body it
    has verified, so a large result does not fill the message twice.
    """

    kind: Literal["finalize"] = "finalize"
    result: Any
    result_in_proof: bool = False


class ReviewSubmitted(_RequestBase):
    """The poster approved or rejected attempt `attempt` of a manual task."""

    kind: Literal["review"] = "review"
    passed: bool
    reasons: list[str] = Field(default_factory=list, max_length=MAX_REVIEW_REASONS)


class VerifierVerdictReported(_RequestBase):
    """The named verifier reports the verdict it signed on chain for attempt `attempt`."""

    kind: Literal["verifier_verdict"] = "verifier_verdict"
    passed: bool
    score: int = Field(ge=0, le=100)
    reasons: list[str] = Field(default_factory=list, max_length=MAX_VERIFIER_REASONS)


class VerifierFailed(_RequestBase):
    """The named verifier could not judge attempt `attempt` this time (its model errored)."""

    kind: Literal["verifier_error"] = "verifier_error"
    error: str = Field(default="", max_length=500)


class RetryDue(_RequestBase):
    """A finalize whose verifier could not answer is due to be judged again."""

    kind: Literal["retry"] = "retry"
    target_request_id: str
    retry_count: int = Field(ge=1)


VerificationRequestMessage = Annotated[
    FinalizeRequested | ReviewSubmitted | VerifierVerdictReported | VerifierFailed | RetryDue,
    Field(discriminator="kind"),
]


class _RequestEnvelope(BaseModel):
    message: VerificationRequestMessage


def parse_request_message(data: Any) -> FinalizeRequested | ReviewSubmitted | VerifierVerdictReported | VerifierFailed | RetryDue:
    """Validate a message of the verification-requests topic (raises pydantic.ValidationError)."""
    return _RequestEnvelope.model_validate({"message": data}).message


def request_event_type(kind: str) -> str:
    """The CloudEvents type of a verification request message."""
    return REQUEST_EVENT_TYPE.format(kind=kind)
