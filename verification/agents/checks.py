"""The agent-review check the terms registration runs (kept apart so `api.tasks` calls one function)."""

from __future__ import annotations

import asyncpg

from runtime.web.errors import ApiProblem
from verification.agents import directory
from verification.agents.listing import named_verifier_check


async def check_named_verifier(conn: asyncpg.Connection, verifier_address: str) -> None:
    """409 VERIFIER_NOT_OPTED_IN when the named verifier is a hosted agent that has not opted in."""
    refused = named_verifier_check(await directory.load(conn, verifier_address))
    if refused is not None:
        raise ApiProblem(refused.status, refused.code, refused.message)
