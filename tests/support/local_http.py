"""A local HTTP server on 127.0.0.1 answering POSTs with handlers: a stand-in node or endpoint."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.Response]]


@contextlib.asynccontextmanager
async def serve_post(routes: Handler | Mapping[str, Handler]) -> AsyncIterator[str]:
    """Serve a handler at POST / (or each path of `routes`) on a free port; yields `http://127.0.0.1:<port>`."""
    app = web.Application()
    for path, handler in (routes.items() if isinstance(routes, Mapping) else [("/", routes)]):
        app.router.add_post(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
