"""`GET /health/bridge` as a FastAPI router, for the API server and the relayer's own port.

The router reads its source from `app.state.bridge_health`: anything with an async
`report() -> BridgeHealth` (the relayer's `HealthMonitor`, or on the API server a
`PublishedHealth`, which reads what that monitor published). The body never carries key
material; errors are reported as a short type name.
"""

from __future__ import annotations

from typing import Protocol

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from relayer.settlement.health import BridgeHealth, NoReport
from runtime.logging import redact

router = APIRouter(tags=["health"])


class BridgeHealthSource(Protocol):
    """What the route asks for the report."""

    async def report(self) -> BridgeHealth: ...


@router.get(
    "/health/bridge",
    response_model=BridgeHealth,
    response_model_by_alias=True,
    summary="Per chain: RPC, indexer lag, relayer balance and pending txs, verifierMatches",
)
async def bridge_health(request: Request) -> Response:
    """The bridge health report; 503 only when the report itself cannot be produced."""
    source: BridgeHealthSource | None = getattr(request.app.state, "bridge_health", None)
    if source is None:
        return JSONResponse({"status": "failing", "error": "bridge health is not configured"}, status_code=503)
    try:
        report = await source.report()
    except NoReport as exc:
        return JSONResponse({"status": "failing", "error": str(exc)}, status_code=503)
    except Exception as exc:  # the endpoint must answer, and never with a traceback
        return JSONResponse({"status": "failing", "error": redact(type(exc).__name__)}, status_code=503)
    return Response(content=redact(report.model_dump_json(by_alias=True)), media_type="application/json")


metrics_router = APIRouter(tags=["metrics"])


@metrics_router.get("/metrics", include_in_schema=False)
async def prometheus_metrics() -> Response:
    """Prometheus exposition of this process's registry."""
    return Response(content=generate_latest(), media_type=CONTENT_TYPE_LATEST)
