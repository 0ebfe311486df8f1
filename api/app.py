"""The HTTP API: `create_app(settings)` builds the FastAPI application.

OpenAPI is published at `/openapi.json` (Swagger UI at `/docs`). The services' routers are
imported, not looked up by name: `relayer.settlement.routes` (`GET /health/bridge`,
`/metrics`), `lifecycle.routes` (task state, what can whom do now, reputation),
`verification.agents.routes` and `panels.routes`. They find the shared resources on `request.app.state`: `settings`
(ApiSettings), `pool` (asyncpg pool with the project's JSON codecs) and `clock`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import structlog
from eth_account import Account
from fastapi import APIRouter, FastAPI
from pydantic import BaseModel

from api.settings import ApiSettings
from api.tasks import router as tasks_router
from lifecycle.routes import router as lifecycle_router
from panels.routes import router as panels_router
from relayer.settlement.routes import metrics_router
from relayer.settlement.routes import router as bridge_router
from runtime.db import create_pool, migrate_url
from runtime.logging import register_secret
from runtime.web.auth import forget_expired_nonces
from runtime.web.bodies import BodyGuard
from runtime.web.errors import GUARD_RESPONSES, SIGNED_RESPONSES, install_error_handlers
from runtime.web.probes import router as probes_router
from verification.agents.routes import router as agents_router
from verification.verifiers import default_registry

log = structlog.get_logger(__name__)

async def _forget_nonces_forever(app: FastAPI) -> None:
    while True:
        await asyncio.sleep(60)
        try:
            async with app.state.pool.acquire() as conn:
                await forget_expired_nonces(conn)
        except Exception as exc:
            log.warning("nonce_cleanup_failed", error_type=type(exc).__name__)


def _bridge_health(app: FastAPI, settings: ApiSettings) -> list[Any]:
    """Serve /health/bridge from the relayer's published reports (table `bridge_health`).

    The API computes no answer of its own: the relayer's key, gate and indexer view are the
    relayer's. `bridge_chains` lists the chains that must have a report; with
    `bridge_arbiter_address` the API adds the ruling key's check against each escrow.
    Returns the RPC clients to close. A source set beforehand (e.g. by `escrowd run`, whose
    relayer runs in the same process) is kept.
    """
    if getattr(app.state, "bridge_health", None) is not None:
        return []
    from relayer.settlement.config import ChainSettings
    from relayer.settlement.health import PublishedHealth

    chains = [ChainSettings.model_validate(c) for c in settings.bridge_chains]
    arbiter = None
    rpcs: list[Any] = []
    if settings.bridge_arbiter_address and chains:
        from chain.eth_rpc import EthRpc

        targets = {
            c.chain_id: (EthRpc(c.rpc_urls, chain_id=c.chain_id, timeout=c.rpc_timeout), c.escrow_addresses[0])
            for c in chains
        }
        arbiter = (settings.bridge_arbiter_address, targets)
        rpcs = [rpc for rpc, _ in targets.values()]
    app.state.bridge_health = PublishedHealth(
        app.state.pool, chain_ids=[c.chain_id for c in chains], arbiter=arbiter
    )
    return rpcs


def create_app(settings: ApiSettings, *, clock: Callable[[], float] = time.time) -> FastAPI:
    """The API application; resources open in its lifespan."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Like every service, the API brings the schema up to date before serving.
        await migrate_url(settings.database_url)
        app.state.pool = await create_pool(settings.database_url, max_size=settings.db_pool_size)
        bridge_rpcs = _bridge_health(app, settings)
        background: list[asyncio.Task[None]] = [asyncio.create_task(_forget_nonces_forever(app))]
        producer = None
        publisher = None
        if settings.kafka_bootstrap and settings.api_run_publisher:
            from runtime.kafka import make_producer
            from runtime.outbox import OutboxPublisher

            producer = make_producer(settings.kafka_bootstrap, client_id="escrowd-api")
            await producer.start()
            publisher = OutboxPublisher(settings.database_url, producer)
            background.append(asyncio.create_task(publisher.run()))
        log.info("api_ready", host=settings.api_host, port=settings.api_port, publisher=publisher is not None)
        try:
            yield
        finally:
            log.info("api_stopping")
            if publisher is not None:
                publisher.stop()
            for task in background:
                task.cancel()
            for task in background:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            if producer is not None:
                with contextlib.suppress(Exception):
                    await producer.stop()
            for rpc in bridge_rpcs:
                with contextlib.suppress(Exception):
                    await rpc.close()
            await app.state.pool.close()

    app = FastAPI(
        title="escrowd API",
        version="1",
        description="Task terms, finalize, review and verification results of the agent-work escrow.",
        lifespan=lifespan,
    )
    if settings.api_service_key is not None:
        # Never let the service key reach a log line, even inside an error.
        register_secret(settings.api_service_key.get_secret_value())
        try:
            Account.from_key(settings.api_service_key.get_secret_value())
        except Exception:
            raise ValueError("api_service_key is not a valid secp256k1 private key") from None
    if not settings.served_deployments():
        log.warning("api_serves_no_deployment", hint="set ESCROWD_DEPLOYMENTS: every signed request is refused")
    app.state.settings = settings
    app.state.clock = clock
    app.state.registry = default_registry(
        allowed_plugin_packages=settings.plugin_packages, allowed_endpoint_hosts=settings.endpoint_hosts
    )
    install_error_handlers(app)
    # Outermost of the user middleware: no body reaches a parser unbounded.
    app.add_middleware(BodyGuard, max_body_bytes=settings.api_max_body_bytes)
    app.include_router(probes_router, responses=GUARD_RESPONSES)
    app.include_router(tasks_router, responses=GUARD_RESPONSES)
    app.include_router(metrics_router)
    routers: list[tuple[APIRouter, dict[int | str, dict[str, Any]]]] = [
        (bridge_router, {503: {"model": BridgeUnavailable, "description": "No report: not configured, or the check failed"}}),
        (lifecycle_router, {}),
        (agents_router, SIGNED_RESPONSES),
        (panels_router, SIGNED_RESPONSES),
    ]
    for router, extra in routers:
        app.include_router(router, responses={**GUARD_RESPONSES, **extra})
    return app


class BridgeUnavailable(BaseModel):
    """`/health/bridge` when no report can be produced (not configured, or the check failed)."""

    status: str
    error: str


