"""`runtime.httpbody.read_bounded` against a real local HTTP server: a body in pieces is read
whole; a body over the bound is refused whether its length is declared or streamed, and
nothing past the bound is taken as the body."""

from __future__ import annotations

import asyncio
import functools
import gzip
import tracemalloc
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from runtime.httpbody import read_bounded

LIMIT = 1000


async def _pieces(request: web.Request) -> web.StreamResponse:
    size = int(request.query["size"])
    response = web.StreamResponse()  # chunked: no Content-Length
    await response.prepare(request)
    sent = 0
    while sent < size:
        piece = min(97, size - sent)
        await response.write(b"x" * piece)
        await asyncio.sleep(0.001)  # each piece its own arrival
        sent += piece
    await response.write_eof()
    return response


async def _whole(request: web.Request) -> web.Response:
    return web.Response(body=b"y" * int(request.query["size"]))


@pytest.fixture
async def server() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_get("/pieces", _pieces)
    app.router.add_get("/whole", _whole)
    app.router.add_get("/gzip", _gzip)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


@pytest.mark.parametrize("path", ["pieces", "whole"])
@pytest.mark.parametrize(("size", "read"), [(0, True), (1, True), (LIMIT, True), (LIMIT + 1, False), (50 * LIMIT, False)])
async def test_read_bounded(server: str, path: str, size: int, read: bool) -> None:
    async with aiohttp.ClientSession() as session, session.get(f"{server}/{path}?size={size}") as response:
        body = await read_bounded(response, LIMIT)
    if read:
        assert body is not None and len(body) == size
    else:
        assert body is None


@functools.cache
def _bomb() -> bytes:
    """64 MiB of body in about 64 KB on the wire (built once, when a test first asks)."""
    return gzip.compress(b"z" * (64 * 1024 * 1024), 9)


async def _gzip(request: web.Request) -> web.StreamResponse:
    if request.query.get("chunked"):
        response = web.StreamResponse(headers={"Content-Encoding": "gzip"})
        await response.prepare(request)
        await response.write(_bomb())
        await response.write_eof()
        return response
    return web.Response(body=_bomb(), headers={"Content-Encoding": "gzip"})  # Content-Length: the compressed size


@pytest.mark.parametrize("chunked", ["", "1"])
async def test_a_compressed_body_is_bounded_as_it_inflates(server: str, chunked: str) -> None:
    """A Content-Length under the bound counts compressed bytes: the body it inflates to is
    refused as soon as it passes the bound, never inflated whole into memory first."""
    limit = 128 * 1024
    assert len(_bomb()) < limit
    tracemalloc.start()
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{server}/gzip?chunked={chunked}") as response,
        ):
            body = await read_bounded(response, limit)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert body is None
    assert peak < 16 * 1024 * 1024, f"{peak} bytes held to refuse a body over {limit}"
