"""Versioned rubrics (seed 001's `rubric` kind) and the judge that scores against them.

A rubric is a written standard, published through the API as `owner/name`; each
publication is a new immutable version (1, 2, …). A reference `owner/name@3` names one
version, a bare `owner/name` the latest at judging time; the judge's outcome names the
version it used (`rubric:owner/name@3`), and that name is what the verdict records.

The judge is the project's model client: it receives the rubric text, the task's prompt,
the flattened trajectory and the reference (the verifier config's `prompt` and
`reference`, committed in the terms), and returns a reward in [0, 1]. A rubric that is gone,
or a model that cannot answer, is a `VerificationError` — never a reward of 0.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import asyncpg
from eth_utils.crypto import keccak

from verification.agents.judging import RubricAnswer, rubric_messages
from verification.agents.model import ModelClient, ModelError, ModelSettings, prompts
from verification.registry import VerificationError, VerifierOutcome, flatten_trajectory

OWNER_PATTERN = r"[A-Za-z0-9_.-]{1,64}"
NAME_PATTERN = r"[A-Za-z0-9_.-]{1,100}"
_REF = re.compile(rf"^({OWNER_PATTERN})/({NAME_PATTERN})(?:@([1-9][0-9]{{0,8}}))?$")
MAX_RUBRIC_CHARS = 20_000


@dataclass(frozen=True)
class RubricName:
    """A parsed reference: owner, name and the version (None: the latest)."""

    owner: str
    name: str
    version: int | None


def parse_ref(ref: str) -> RubricName | None:
    """`owner/name` or `owner/name@version`, else None."""
    match = _REF.match(ref)
    if match is None or ".." in ref:
        return None
    owner, name, version = match.groups()
    return RubricName(owner, name, int(version) if version else None)


@dataclass(frozen=True)
class RubricDoc:
    """One published rubric version."""

    owner: str
    name: str
    version: int
    body: str
    digest: str

    @property
    def pinned(self) -> str:
        """`owner/name@version`."""
        return f"{self.owner}/{self.name}@{self.version}"


def rubric_digest(body: str) -> str:
    """keccak256 of the rubric text."""
    return "0x" + keccak(body.encode("utf-8")).hex()


# ---------------------------------------------------------------------------- storage


def _doc(row: Any) -> RubricDoc:
    return RubricDoc(row["owner"], row["name"], int(row["version"]), row["body"], row["digest"])


async def load_rubric(conn: asyncpg.Connection, ref: RubricName) -> RubricDoc | None:
    """The named version, or the latest one."""
    if ref.version is None:
        row = await conn.fetchrow(
            "SELECT * FROM rubrics WHERE owner = $1 AND name = $2 ORDER BY version DESC LIMIT 1", ref.owner, ref.name
        )
    else:
        row = await conn.fetchrow(
            "SELECT * FROM rubrics WHERE owner = $1 AND name = $2 AND version = $3", ref.owner, ref.name, ref.version
        )
    return _doc(row) if row is not None else None


class OwnerTaken(Exception):
    """The owner name belongs to another address."""


async def publish_rubric(
    conn: asyncpg.Connection, owner: str, name: str, body: str, author: str
) -> tuple[RubricDoc, bool]:
    """Publish a version (call inside a transaction); the same text as the latest is not a new one."""
    author = author.lower()
    await conn.execute(
        "INSERT INTO rubric_owners (owner, address) VALUES ($1, $2) ON CONFLICT DO NOTHING", owner, author
    )
    holder = await conn.fetchval("SELECT address FROM rubric_owners WHERE owner = $1 FOR UPDATE", owner)
    if holder != author:
        raise OwnerTaken(owner)
    latest = await load_rubric(conn, RubricName(owner, name, None))
    digest = rubric_digest(body)
    if latest is not None and latest.digest == digest:
        return latest, False
    version = 1 if latest is None else latest.version + 1
    row = await conn.fetchrow(
        "INSERT INTO rubrics (owner, name, version, body, digest, author) VALUES ($1, $2, $3, $4, $5, $6) RETURNING *",
        owner, name, version, body, digest, author,
    )  # fmt: skip
    return _doc(row), True


async def list_rubrics(conn: asyncpg.Connection, owner: str | None, limit: int) -> list[Any]:
    """Every rubric's latest version (optionally of one owner)."""
    return list(
        await conn.fetch(
            "SELECT DISTINCT ON (owner, name) owner, name, version, digest, created_at FROM rubrics"
            " WHERE ($1::text IS NULL OR owner = $1) ORDER BY owner, name, version DESC LIMIT $2",
            owner,
            limit,
        )
    )


async def rubric_versions(conn: asyncpg.Connection, owner: str, name: str) -> list[Any]:
    """Every version of one rubric, oldest first."""
    return list(
        await conn.fetch(
            "SELECT version, digest, created_at FROM rubrics WHERE owner = $1 AND name = $2 ORDER BY version",
            owner,
            name,
        )
    )


# ---------------------------------------------------------------------------- the judge


class RubricSource(Protocol):
    """Where the judge finds rubrics."""

    async def resolve(self, ref: RubricName) -> RubricDoc | None: ...

    async def close(self) -> None: ...


class PgRubricSource:
    """Rubrics from the project's database (a small pool opened on first use)."""

    def __init__(self, database_url: str) -> None:
        self._url = database_url
        self._pool: asyncpg.Pool | None = None

    async def resolve(self, ref: RubricName) -> RubricDoc | None:
        if self._pool is None:
            self._pool = await asyncpg.create_pool(self._url, min_size=0, max_size=2)
        async with self._pool.acquire() as conn:
            return await load_rubric(conn, ref)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None


class RubricJudge:
    """Scores a trajectory against a rubric version with the judge model."""

    def __init__(self, source: RubricSource, client: ModelClient) -> None:
        self.source = source
        self.client = client

    async def __call__(self, ref: str, task: Mapping[str, Any], trajectory: Any) -> VerifierOutcome:
        name = f"rubric:{ref}"
        parsed = parse_ref(ref)
        if parsed is None:
            raise VerificationError(name, "a rubric reference is <owner>/<name>[@version]")
        try:
            doc = await self.source.resolve(parsed)
        except (OSError, asyncpg.PostgresError) as exc:
            raise VerificationError(name, f"rubric store unavailable: {type(exc).__name__}") from None
        if doc is None:
            raise VerificationError(name, "rubric not found")
        prompt = task.get("prompt")
        messages = rubric_messages(
            doc.body, prompt if isinstance(prompt, str) else None, flatten_trajectory(trajectory), task.get("reference")
        )
        try:
            answer = await self.client.ask(messages, RubricAnswer)
        except ModelError as exc:
            raise VerificationError(f"rubric:{doc.pinned}", f"judge model: {exc.reason}") from None
        return VerifierOutcome(
            reward=answer.reward,
            detail={
                "resolvedAs": f"rubric:{doc.pinned}",
                "rubricDigest": doc.digest,
                "promptVersion": prompts().version,
                "model": self.client.model,
            },
            reasons=tuple(answer.reasons),
        )

    async def close(self) -> None:
        """Release the model session and the rubric store."""
        await self.client.close()
        await self.source.close()


def rubric_judge_from_env(database_url: str) -> RubricJudge | None:
    """The judge of `ESCROWD_MODEL_*` over the database's rubrics; None when no model URL is set."""
    settings = ModelSettings()
    if settings.url is None:
        return None
    return RubricJudge(PgRubricSource(database_url), ModelClient(settings))
