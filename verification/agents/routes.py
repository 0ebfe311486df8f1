"""Routes of verifier agents and judges: rubrics, the executor directory, listing, briefs.

Writes are signed by the acting address (`runtime.web.auth`); reads are open except where
a brief is private. The decisions are pure functions in `verification.agents.directory` and
`verification.agents.listing`; the routes load, decide and store.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from eth_utils.address import to_checksum_address
from eth_utils.crypto import keccak
from fastapi import APIRouter, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from runtime.web.auth import authenticate, has_auth
from runtime.web.errors import ApiProblem
from runtime.web.params import ChainPath, EscrowPath, HashPath, TaskPath
from verification import results_store as vstore
from verification.agents import briefs, directory, rubrics, store
from verification.agents.listing import BriefState, listing_check
from verification.routing import TaskKey, fold_chain

router = APIRouter(prefix="/v1", tags=["agents"])

Owner = Annotated[str, Path(pattern=rf"^{rubrics.OWNER_PATTERN}$")]
Name = Annotated[str, Path(pattern=rf"^{rubrics.NAME_PATTERN}$")]


# ---------------------------------------------------------------------------- rubrics


class PublishRubric(BaseModel):
    """A rubric version: owner and name, and the written standard."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    owner: str = Field(pattern=rf"^{rubrics.OWNER_PATTERN}$")
    name: str = Field(pattern=rf"^{rubrics.NAME_PATTERN}$")
    body: str = Field(min_length=1, max_length=rubrics.MAX_RUBRIC_CHARS, description="The standard, in words")


class RubricView(BaseModel):
    """One rubric version."""

    ref: str = Field(description="owner/name@version")
    owner: str
    name: str
    version: int
    digest: str = Field(description="keccak256 of the body")
    body: str | None = None


class RubricSummary(BaseModel):
    """A rubric and its versions."""

    owner: str
    name: str
    latest: int
    versions: list[int]


class RubricList(BaseModel):
    """Rubrics with their latest version."""

    rubrics: list[RubricView]


def _view(doc: rubrics.RubricDoc, with_body: bool = True) -> RubricView:
    return RubricView(
        ref=doc.pinned, owner=doc.owner, name=doc.name, version=doc.version, digest=doc.digest,
        body=doc.body if with_body else None,
    )  # fmt: skip


@router.post(
    "/rubrics",
    status_code=201,
    response_model=RubricView,
    responses={200: {"model": RubricView, "description": "The same text as the latest version: that version"}},
    summary="Publish a rubric version (the owner name belongs to its first publisher)",
)
async def publish_rubric(body: PublishRubric, request: Request, response: Response) -> RubricView:
    """Signed by the owner's address; the same text as the latest version answers 200 with it."""
    caller = await authenticate(request)
    async with request.app.state.pool.acquire() as conn, conn.transaction():
        try:
            doc, new = await rubrics.publish_rubric(conn, body.owner, body.name, body.body, caller.address)
        except rubrics.OwnerTaken:
            raise ApiProblem(403, "RUBRIC_OWNER_TAKEN", f"owner {body.owner!r} belongs to another address") from None
    if not new:
        response.status_code = 200
    return _view(doc)


@router.get("/rubrics", response_model=RubricList, summary="Rubrics with their latest version")
async def list_rubrics(
    request: Request,
    owner: Annotated[str | None, Query(pattern=rf"^{rubrics.OWNER_PATTERN}$")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> RubricList:
    async with request.app.state.pool.acquire() as conn:
        rows = await rubrics.list_rubrics(conn, owner, limit)
    return RubricList(
        rubrics=[
            RubricView(
                ref=f"{r['owner']}/{r['name']}@{r['version']}", owner=r["owner"], name=r["name"],
                version=r["version"], digest=r["digest"],
            )
            for r in rows
        ]
    )


@router.get("/rubrics/{owner}/{name}", response_model=RubricSummary, summary="A rubric's versions")
async def rubric_versions(owner: Owner, name: Name, request: Request) -> RubricSummary:
    async with request.app.state.pool.acquire() as conn:
        rows = await rubrics.rubric_versions(conn, owner, name)
    if not rows:
        raise ApiProblem(404, "RUBRIC_NOT_FOUND", "no rubric of that owner and name")
    versions = [int(r["version"]) for r in rows]
    return RubricSummary(owner=owner, name=name, latest=versions[-1], versions=versions)


@router.get("/rubrics/{owner}/{name}/{version}", response_model=RubricView, summary="One rubric version, or `latest`")
async def rubric_version(
    owner: Owner, name: Name, version: Annotated[str, Path(pattern=r"^(latest|[1-9][0-9]{0,8})$")], request: Request
) -> RubricView:
    ref = rubrics.RubricName(owner, name, None if version == "latest" else int(version))
    async with request.app.state.pool.acquire() as conn:
        doc = await rubrics.load_rubric(conn, ref)
    if doc is None:
        raise ApiProblem(404, "RUBRIC_NOT_FOUND", "no such rubric version")
    return _view(doc)




# ---------------------------------------------------------------------------- the executor directory


class ExecutorView(BaseModel):
    """A directory entry as listed."""

    address: str
    roles: list[str]
    chains: list[int]
    verify_others: bool = Field(serialization_alias="verifyOthers")
    capabilities: list[str]
    encryption_public_key: str = Field(serialization_alias="encryptionPublicKey")
    last_seen: datetime = Field(serialization_alias="lastSeen")


class ExecutorList(BaseModel):
    """The executors that qualify."""

    executors: list[ExecutorView]


def _executor_view(e: directory.Executor) -> ExecutorView:
    return ExecutorView(
        address=str(to_checksum_address(e.address)), roles=list(e.roles), chains=list(e.chains),
        verify_others=e.verify_others, capabilities=list(e.capabilities),
        encryption_public_key=e.encryption_public_key, last_seen=e.last_seen,
    )  # fmt: skip


def stale_seconds(request: Request) -> float:
    """How recently an executor must have been seen to count as running."""
    value = getattr(request.app.state, "executor_stale_seconds", None)
    return float(value) if value is not None else float(directory.DEFAULT_STALE_SECONDS)


@router.put(
    "/executors/me",
    response_model=ExecutorView,
    response_model_by_alias=True,
    responses={201: {"model": ExecutorView, "description": "A new entry (200: an existing one replaced)"}},
    summary="Register or replace the signer's directory entry (roles, chains, opt-in, capabilities, key)",
)
async def register_executor(body: directory.ExecutorRegistration, request: Request, response: Response) -> ExecutorView:
    """Signed by the executor's own key: the signer is the address registered."""
    caller = await authenticate(request)
    if not body.key_is_on_curve():
        raise ApiProblem(400, "ENCRYPTION_KEY_INVALID", "encryptionPublicKey is not a point on secp256k1")
    async with request.app.state.pool.acquire() as conn, conn.transaction():
        new = await directory.register(conn, caller.address, body)
        entry = await directory.load(conn, caller.address)
    assert entry is not None
    response.status_code = 201 if new else 200
    return _executor_view(entry)


@router.post(
    "/executors/me/heartbeat",
    status_code=204,
    summary="Mark the signer's entry as running (seen now)",
)
async def executor_heartbeat(request: Request) -> Response:
    caller = await authenticate(request)
    async with request.app.state.pool.acquire() as conn, conn.transaction():
        if not await directory.heartbeat(conn, caller.address):
            raise ApiProblem(404, "EXECUTOR_NOT_REGISTERED", "register with PUT /v1/executors/me first")
    return Response(status_code=204)


@router.get(
    "/executors",
    response_model=ExecutorList,
    response_model_by_alias=True,
    summary="Executors that qualify: the role, on the chain, seen recently; verifiers opted in",
)
async def list_executors(
    request: Request,
    role: Annotated[directory.Role, Query()] = "verifier",
    chain: Annotated[int | None, Query(gt=0, le=2**63 - 1)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> ExecutorList:
    async with request.app.state.pool.acquire() as conn:
        found = await directory.listed(conn, role, chain, stale_seconds(request), limit)
    return ExecutorList(executors=[_executor_view(e) for e in found])


# ---------------------------------------------------------------------------- listing




class TaskRefView(BaseModel):
    """Which task: its chain, escrow, id and terms hash."""

    chain_id: int = Field(serialization_alias="chainId")
    escrow: str
    task_id: int = Field(serialization_alias="taskId")
    task_hash: str = Field(serialization_alias="taskHash")


class ListingView(TaskRefView):
    """A listed task."""

    poster: str
    private: bool
    verification_mode: str = Field(serialization_alias="verificationMode")
    verifier_address: str | None = Field(default=None, serialization_alias="verifierAddress")


class ListingPage(BaseModel):
    """Listed tasks, newest first."""

    listings: list[ListingView]


def _listing_view(row: Any, private: bool, mode: str, verifier: str | None) -> ListingView:
    return ListingView(
        chain_id=row["chain_id"], escrow=row["escrow_address"], task_id=int(row["task_id"]), task_hash=row["task_hash"],
        poster=row["poster"], private=private, verification_mode=mode, verifier_address=verifier,
    )  # fmt: skip


@router.post(
    "/tasks/{chain_id}/{escrow}/{task_id}/listing",
    status_code=201,
    response_model=ListingView,
    response_model_by_alias=True,
    responses={200: {"model": ListingView, "description": "Listed already: the listing as it is"}},
    summary="List a funded task: checks the verifier against the chain, its chains and the brief's readers",
)
async def list_task(
    chain_id: ChainPath, escrow: EscrowPath, task_id: TaskPath, request: Request, response: Response
) -> ListingView:
    """Signed by the poster, after `createTask…` is indexed; a refused listing leaves cancel as the way out."""
    caller = await authenticate(request, chain_id, escrow)
    key = TaskKey(chain_id, str(to_checksum_address(escrow)), task_id)
    async with request.app.state.pool.acquire() as conn:
        chain = fold_chain(await vstore.indexed_events(conn, key))
        terms = await vstore.load_terms(conn, chain.task_hash) if chain.task_hash else None
        verifier = None
        if terms is not None and terms.mode == "agent" and terms.verifier_address:
            verifier = await directory.load(conn, terms.verifier_address)
        brief = await store.brief_state(conn, chain.task_hash) if chain.task_hash else BriefState(False, False, frozenset())
        now = await directory.db_now(conn)
        refused = listing_check(key, chain, terms, caller.address, verifier, brief, now, stale_seconds(request))
        if refused is not None:
            raise ApiProblem(refused.status, refused.code, refused.message)
        assert terms is not None and chain.task_hash is not None
        async with conn.transaction():
            new = await store.list_task(conn, key, chain.task_hash, terms.poster)
        row = await store.listing(conn, key)
    if not new:
        response.status_code = 200
    return _listing_view(row, terms.private, terms.mode, terms.verifier_address)


@router.get(
    "/listings",
    response_model=ListingPage,
    response_model_by_alias=True,
    summary="Listed tasks (a task is visible to agents only once listed)",
)
async def listings(
    request: Request,
    chain: Annotated[int | None, Query(gt=0, le=2**63 - 1)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> ListingPage:
    async with request.app.state.pool.acquire() as conn:
        rows = await store.listings(conn, chain, limit)
    return ListingPage(
        listings=[_listing_view(r, r["private"], r["verification_mode"], r["verifier_address"]) for r in rows]
    )


# ---------------------------------------------------------------------------- briefs


class BriefUpload(BaseModel):
    """A public brief in clear, or a private one as ciphertext with its key wrapped to each reader."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    brief: str | None = Field(default=None, max_length=briefs.MAX_BRIEF_BYTES)
    ciphertext: str | None = Field(default=None, max_length=(briefs.MAX_CIPHERTEXT_BYTES * 4) // 3 + 8)
    wrapped_keys: dict[Annotated[str, StringConstraints(pattern=r"^0x[0-9a-fA-F]{40}$")], Annotated[str, StringConstraints(max_length=briefs.MAX_WRAPPED_KEY_TEXT)]] = Field(
        default_factory=dict, alias="wrappedKeys", max_length=200,
        json_schema_extra={"propertyNames": {"pattern": r"^0x[0-9a-fA-F]{40}$"}},
    )


class BriefView(BaseModel):
    """A brief as its reader gets it: clear text, or the ciphertext and the reader's own wrapped key."""

    task_hash: str = Field(serialization_alias="taskHash")
    private: bool
    brief: str | None = None
    ciphertext: str | None = None
    wrapped_key: str | None = Field(default=None, serialization_alias="wrappedKey")
    readers: list[str] | None = None


@router.put(
    "/briefs/{task_hash}",
    response_model=BriefView,
    response_model_by_alias=True,
    response_model_exclude_none=True,
    summary="Store the task's brief (private: ciphertext and wrapped keys only); more readers may be added",
)
async def put_brief(task_hash: HashPath, body: BriefUpload, request: Request) -> BriefView:
    """Signed by the terms' poster; the brief must hash to the terms' instructionsDigest."""
    caller = await authenticate(request)
    async with request.app.state.pool.acquire() as conn:
        terms = await vstore.load_terms(conn, task_hash.lower())
        if terms is None:
            raise ApiProblem(404, "TERMS_NOT_FOUND", "no terms are registered under this taskHash")
        if caller.address.lower() != terms.poster.lower():
            raise ApiProblem(403, "NOT_POSTER", "only the poster stores the brief")
        ciphertext: bytes | None = None
        if terms.private:
            if body.ciphertext is None or body.brief is not None:
                raise ApiProblem(400, "BRIEF_NOT_ENCRYPTED", "a private task's brief is sent as ciphertext only")
            try:
                ciphertext = briefs.unb64(body.ciphertext, briefs.MAX_CIPHERTEXT_BYTES)
            except briefs.BriefError as exc:
                raise ApiProblem(400, "BRIEF_INVALID", f"ciphertext: {exc}") from None
            if not briefs.ciphertext_well_formed(ciphertext):
                raise ApiProblem(400, "BRIEF_INVALID", f"the ciphertext is not a format {briefs.VERSION} brief")
            for address, text in body.wrapped_keys.items():
                if not briefs.wrapped_key_text_well_formed(text):
                    raise ApiProblem(
                        400, "BRIEF_INVALID",
                        f"the wrapped key of {address} is not a format {briefs.VERSION} key ({briefs.WRAPPED_KEY_BYTES} bytes)",
                    )  # fmt: skip
            digest = briefs.ciphertext_digest(ciphertext)
        else:
            if body.brief is None or body.ciphertext is not None or body.wrapped_keys:
                raise ApiProblem(400, "BRIEF_INVALID", "a public task's brief is sent in clear, without keys")
            digest = "0x" + keccak(body.brief.encode("utf-8")).hex()
        if digest != terms.instructions_digest.lower():
            raise ApiProblem(400, "BRIEF_DIGEST_MISMATCH", "the brief does not hash to the terms' instructionsDigest")
        async with conn.transaction():
            row = await store.store_brief(conn, task_hash, brief=body.brief, ciphertext=ciphertext)
            if terms.private and bytes(row["ciphertext"]) != ciphertext:
                raise ApiProblem(409, "BRIEF_IMMUTABLE", "another brief is stored for these terms")
            if body.wrapped_keys:
                await store.add_wrapped_keys(conn, task_hash, dict(body.wrapped_keys))
        state = await store.brief_state(conn, task_hash)
    return BriefView(task_hash=task_hash.lower(), private=terms.private, readers=sorted(state.recipients) if terms.private else None)


@router.get(
    "/briefs/{task_hash}",
    response_model=BriefView,
    response_model_by_alias=True,
    response_model_exclude_none=True,
    summary="Read a listed task's brief: public in clear; private only by a reader it is wrapped to (signed)",
)
async def get_brief(task_hash: HashPath, request: Request) -> BriefView:
    caller = None
    if has_auth(request):
        caller = await authenticate(request)
    async with request.app.state.pool.acquire() as conn:
        terms = await vstore.load_terms(conn, task_hash.lower())
        row = await store.load_brief(conn, task_hash)
        if terms is None or row is None:
            raise ApiProblem(404, "BRIEF_NOT_FOUND", "no brief is stored for this taskHash")
        is_poster = caller is not None and caller.address.lower() == terms.poster.lower()
        if not is_poster and not await store.is_hash_listed(conn, task_hash):
            raise ApiProblem(404, "TASK_NOT_LISTED", "the task is not listed (yet)")
        if not row["private"]:
            return BriefView(task_hash=task_hash.lower(), private=False, brief=row["brief"])
        if caller is None:
            raise ApiProblem(401, "AUTH_REQUIRED", "a private brief is read with a signed request")
        wrapped = await store.wrapped_key(conn, task_hash, caller.address)
    if wrapped is None:
        raise ApiProblem(403, "BRIEF_NOT_WRAPPED_TO_CALLER", "the brief's key is not wrapped to the signer")
    return BriefView(task_hash=task_hash.lower(), private=True, ciphertext=briefs.b64(bytes(row["ciphertext"])), wrapped_key=wrapped)


# ---------------------------------------------------------------------------- the verifier's queue


class QueueItem(TaskRefView):
    """An attempt waiting for the signer's verdict, with what it needs to judge it."""

    attempt: int
    evidence_hash: str = Field(serialization_alias="evidenceHash")
    result: Any = None
    acceptance: str | None = None
    private: bool
    failures: int = Field(description="Failed tries reported for this attempt so far")
    terms: dict[str, Any] = Field(
        description="The registered terms (canonical form): they hash to the on-chain taskHash, which the verifier checks"
    )


class Queue(BaseModel):
    """The signer's pending verifications."""

    items: list[QueueItem]


@router.get(
    "/verifiers/me/queue",
    response_model=Queue,
    response_model_by_alias=True,
    summary="The signer's queue: listed agent-review tasks naming it, delivered, finalized and unjudged",
)
async def verifier_queue(request: Request, limit: Annotated[int, Query(ge=1, le=500)] = 100) -> Queue:
    """Signed by the verifier; attempts marked never judged (5 failed tries) are left out. Counts as a heartbeat."""
    caller = await authenticate(request)
    async with request.app.state.pool.acquire() as conn:
        async with conn.transaction():
            await directory.heartbeat(conn, caller.address)
        items: list[QueueItem] = []
        for row in await store.verifier_tasks(conn, caller.address, limit):
            key = TaskKey(row["chain_id"], row["escrow_address"], int(row["task_id"]))
            chain = fold_chain(await vstore.indexed_events(conn, key))
            attempt = chain.current_attempt
            if not chain.submitted or attempt in chain.verdicts or chain.task_hash != row["task_hash"]:
                continue
            evidence = chain.attempts[attempt]
            failure = (await vstore.task_failures(conn, key)).get(attempt)
            if failure is not None and failure["never_judged"]:
                continue
            finalized = await vstore.request_row(
                conn, f"finalize:{key.chain_id}:{key.escrow.lower()}:{key.task_id}:{attempt}:{evidence}"
            )
            if finalized is None:
                continue  # delivered on chain, but the agent has not handed over the result yet
            terms = await vstore.load_terms(conn, row["task_hash"])
            document = await vstore.load_terms_json(conn, row["task_hash"])
            assert terms is not None and document is not None
            criteria = terms.criteria or {}
            acceptance = criteria.get("acceptance")
            items.append(
                QueueItem(
                    chain_id=key.chain_id, escrow=key.escrow, task_id=key.task_id, task_hash=row["task_hash"],
                    attempt=attempt, evidence_hash=evidence, result=finalized["payload"].get("result"),
                    acceptance=acceptance if isinstance(acceptance, str) else None, private=terms.private,
                    failures=int(failure["failures"]) if failure is not None else 0, terms=document,
                )
            )
    return Queue(items=items)
