"""A local HTTP server on 127.0.0.1 that answers POST / with a handler: a stand-in node or endpoint."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web


@contextlib.asynccontextmanager
async def serve_post(handler: Callable[[web.Request], Awaitable[web.Response]]) -> AsyncIterator[str]:
    """Serve `handler` at POST / on a free port; yields the base URL (`http://127.0.0.1:<port>`)."""
    app = web.Application()
    app.router.add_post("/", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
