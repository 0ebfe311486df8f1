"""`GET /health/bridge` served by the API process itself, from the relayer's address alone."""

from __future__ import annotations

import asyncio

import httpx

from api.app import create_app
from api.settings import ApiSettings
from escrowd.devnet import Devnet


async def test_api_reports_verifier_match_and_its_loss(devnet: Devnet, database_url: str) -> None:
    """verifierMatches is true while the escrow trusts the relayer's address, false after a rotation."""
    settings = ApiSettings(
        database_url=database_url,
        bridge_relayer_address=devnet.marketplace_verifier.address,
        bridge_chains=[{"chain_id": devnet.chain_id, "rpc_urls": [devnet.rpc_url],
                        "escrow_addresses": [devnet.escrow_address]}],
    )  # fmt: skip
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            response = await client.get("/health/bridge")
            assert response.status_code == 200
            chain = response.json()["chains"][0]
            assert chain["chainId"] == devnet.chain_id
            assert chain["verifier"]["verifierMatches"] is True
            assert chain["rpc"]["reachable"] is True

            await asyncio.to_thread(devnet.set_marketplace_verifier, devnet.spare[0])
            await asyncio.sleep(1.2)  # the API caches a report for one second
            rotated = (await client.get("/health/bridge")).json()["chains"][0]["verifier"]
            assert rotated["verifierMatches"] is False
            assert rotated["reason"]
            metrics = await client.get("/metrics")
            assert metrics.status_code == 200


async def test_api_without_bridge_settings_says_so(database_url: str) -> None:
    """No relayer address configured: a 503 naming the cause, never a made-up answer."""
    app = create_app(ApiSettings(database_url=database_url))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            response = await client.get("/health/bridge")
            assert response.status_code == 503
            assert "not configured" in response.json()["error"]
