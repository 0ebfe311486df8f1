"""`GET /healthz` and `GET /readyz` for the FastAPI processes (the API and the relayer's port).

`/healthz`: the process answers HTTP. `/readyz`: the database answers (when the app holds a
pool) and every part registered in `runtime.health` (the relayer's verdict consumer) is
ready; 503 naming what is not, otherwise.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from runtime import health

router = APIRouter(tags=["probes"])


@router.get("/healthz", summary="Liveness: the process serves HTTP", responses={200: {"description": "alive"}})
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    summary="Readiness: database reachable and every consumer joined",
    responses={200: {"description": "ready"}, 503: {"description": "not ready, with the parts that are not"}},
)
async def readyz(request: Request) -> JSONResponse:
    parts: dict[str, Any] = {}
    pool = getattr(request.app.state, "pool", None)
    if pool is not None:
        try:
            async with asyncio.timeout(2):
                await pool.fetchval("SELECT 1")
            parts["database"] = True
        except Exception:
            parts["database"] = False
    registered_ok, registered = health.readiness()
    parts.update(registered)
    ok = all(parts.values()) and (registered_ok or not registered)
    return JSONResponse({"status": "ready" if ok else "not ready", "parts": parts}, status_code=200 if ok else 503)
