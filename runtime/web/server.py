"""uvicorn inside the service shell: the shell owns the process's signals, not uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Generator
from typing import Any

import uvicorn

from runtime.errors import StartupError


class QuietServer(uvicorn.Server):
    """A uvicorn server that leaves SIGINT/SIGTERM to the service shell (`runtime.shell`)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


async def serve_asgi(app: Any, *, host: str, port: int, stop: asyncio.Event, **options: Any) -> None:
    """Serve `app` until `stop` is set, then let uvicorn finish the requests in flight and the lifespan."""
    config = uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False, **options)
    server = QuietServer(config)
    serving = asyncio.ensure_future(server.serve())
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([serving, stopper], return_when=asyncio.FIRST_COMPLETED)
        server.should_exit = True
        await serving
        if not server.started and not stop.is_set():
            # uvicorn logged why (a lifespan that failed: the database, a setting).
            raise StartupError("the HTTP server did not start (its reason is logged above)")
    finally:
        stopper.cancel()
        if not serving.done():
            serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await serving
