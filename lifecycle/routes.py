"""HTTP routes of the lifecycle and reputation consumers' state (included by the API app).

- `GET /v1/tasks/{chain_id}/{escrow}/{task_id}/state`: the task's state and "what can whom
  do now" at the chain time of the confirmed, applied events the state is folded from
  (the timers' clock, `allowed.as_of`), or at `?at=<unix seconds>`, with the escrow's
  current marketplace verifier and arbiter (lifecycle/roles.py);
- `GET /v1/agents/{address}/reputation`: the agent's reputation and matching score.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict

from lifecycle import clock, roles
from lifecycle.machine import allowed_actions_view
from lifecycle.reputation.rules import initial
from runtime.web.errors import ApiProblem
from runtime.web.params import AddressPath, ChainPath, EscrowPath, TaskPath
from schemas.task_state import AllowedActions, Reputation, TaskState
from schemas.task_terms import ApiError

router = APIRouter(prefix="/v1", tags=["lifecycle"])


class TaskStateView(BaseModel):
    """A task's folded state with what each party may do at `allowed.as_of`."""

    model_config = ConfigDict(frozen=True)
    state: TaskState
    allowed: AllowedActions


@router.get(
    "/tasks/{chain_id}/{escrow}/{task_id}/state",
    response_model=TaskStateView,
    responses={404: {"model": ApiError, "description": "The task is not indexed (yet)"}},
    summary="Task state and what can whom do now (chain time)",
)
async def task_state(
    # Bounded like the columns they are compared with (bigint, numeric(78)): no 500 on 2**64.
    chain_id: ChainPath,
    escrow: EscrowPath,
    task_id: TaskPath,
    request: Request,
    at: Annotated[
        int | None,
        Query(ge=0, le=2**63 - 1, description="Chain time to answer for (default: the time of the newest confirmed block, the clock task state and timers use)"),
    ] = None,
) -> TaskStateView:
    async with request.app.state.pool.acquire() as conn:
        escrow_roles = await roles.load(conn, chain_id, escrow)
        raw = await conn.fetchval(
            "SELECT state FROM task_states WHERE chain_id = $1 AND escrow = $2 AND task_id = $3",
            chain_id,
            escrow.lower(),
            task_id,
        )
        confirmed = await clock.task_time(conn, chain_id, escrow, task_id) if raw is not None and at is None else None
    if raw is None:
        raise ApiProblem(404, "TASK_NOT_FOUND", f"task {task_id} on chain {chain_id} is not indexed (yet)")
    state = TaskState.model_validate(raw)
    # The state holds the events up to the confirmation line, so the answer is given at that
    # line's time (the clock timers use), never at the head's: see lifecycle/clock.py.
    now = at if at is not None else max(confirmed or 0, state.last_block_timestamp)
    return TaskStateView(state=state, allowed=allowed_actions_view(state, now, escrow_roles))


@router.get(
    "/agents/{address}/reputation",
    response_model=Reputation,
    summary="An agent's 0–100 reputation, dispute count and matching score",
)
async def agent_reputation(
    address: AddressPath, request: Request
) -> Reputation:
    async with request.app.state.pool.acquire() as conn:
        row = await conn.fetchrow(
            "SELECT agent, score, dispute_count, passes, failures, matching_score FROM agent_reputation"
            " WHERE agent = $1",
            address.lower(),
        )
    if row is None:
        return initial(address.lower())
    return Reputation(**dict(row))
