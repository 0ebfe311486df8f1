"""Routes of verifier agents and judges: rubrics, the executor directory, listing, briefs.

Writes are signed by the acting address (`relayer.api.auth`); reads are open except where
a brief is private. The decisions are pure functions in `relayer.agents.directory` and
`relayer.agents.listing`; the routes load, decide and store.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from relayer.agents import rubrics
from relayer.api.auth import Caller, spend_nonce, verify_signature
from relayer.api.errors import ApiProblem

router = APIRouter(prefix="/v1", tags=["agents"])

Owner = Annotated[str, Path(pattern=rf"^{rubrics.OWNER_PATTERN}$")]
Name = Annotated[str, Path(pattern=rf"^{rubrics.NAME_PATTERN}$")]


async def caller_of(request: Request) -> Caller:
    """The signed caller of this request (401 when the signature does not hold)."""
    state = request.app.state
    return await verify_signature(
        request, now=int(state.clock()), max_ttl=state.settings.signature_max_ttl_seconds
    )


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
    summary="Publish a rubric version (the owner name belongs to its first publisher)",
)
async def publish_rubric(body: PublishRubric, request: Request, response: Response) -> RubricView:
    """Signed by the owner's address; the same text as the latest version answers 200 with it."""
    caller = await caller_of(request)
    async with request.app.state.pool.acquire() as conn, conn.transaction():
        await spend_nonce(conn, caller)
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


