"""A TCP proxy on 127.0.0.1 that can cut its connections, refuse new ones and resume.

It stands between a client and a real server (PostgreSQL, the Kafka broker) to simulate an
outage without restarting the server, so no data is lost: Tansu keeps everything in memory
and would forget its topics on a restart. The upstream is either `(host, port)` or the path
of a unix socket (the embedded PostgreSQL listens on a unix socket only).

The proxy runs its own event loop in a daemon thread, so it keeps forwarding while the test
blocks on synchronous calls; every control method is thread-safe and returns once done.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

T = TypeVar("T")

Upstream = tuple[str, int] | str


class TcpProxy:
    """Forwards every connection on `127.0.0.1:port` to `upstream`."""

    def __init__(self, upstream: Upstream, *, port: int = 0, chunk: int = 65536) -> None:
        self.upstream = upstream
        self.port = port
        self._chunk = chunk
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.connections_total = 0
        self.cuts = 0

    # -- control (any thread) -------------------------------------------------------

    def start(self) -> TcpProxy:
        """Start the loop thread and listen; `port` is known afterwards."""
        if self._thread is not None:
            return self
        ready = threading.Event()

        def main() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=main, name="tcp-proxy", daemon=True)
        self._thread.start()
        ready.wait()
        self._call(self._listen)
        return self

    @property
    def address(self) -> str:
        """`127.0.0.1:port`, for a Kafka bootstrap string."""
        return f"127.0.0.1:{self.port}"

    @property
    def active(self) -> int:
        """Client connections open right now."""
        return len(self._writers) // 2

    @property
    def listening(self) -> bool:
        """True unless `refuse` closed the listening socket."""
        return self._server is not None

    def cut(self) -> int:
        """Close every open connection (both sides); returns how many were cut."""
        return self._call(self._cut)

    def refuse(self) -> None:
        """Stop listening (new connections are refused) and cut the open ones: an outage."""
        self._call(self._refuse)

    def resume(self) -> None:
        """Listen again on the same port: the outage is over."""
        self._call(self._listen)

    def stop(self) -> None:
        """Close everything and end the loop thread."""
        if self._thread is None or self._loop is None:
            return
        with contextlib.suppress(RuntimeError):
            self._call(self._shutdown)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._thread = None

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- loop side ------------------------------------------------------------------

    def _call(self, fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
        assert self._loop is not None, "proxy not started"
        return asyncio.run_coroutine_threadsafe(fn(), self._loop).result(timeout=10)

    async def _listen(self) -> None:
        if self._server is not None:
            return
        self._server = await asyncio.start_server(
            self._handle, "127.0.0.1", self.port, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def _refuse(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        await self._cut()
        if server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 2)

    async def _cut(self) -> int:
        writers = list(self._writers)
        for writer in writers:
            transport = writer.transport
            # abort(): no FIN handshake, the peer sees a reset as it would on a dead host.
            transport.abort()
        self._writers.clear()
        if writers:
            self.cuts += 1
        return len(writers) // 2

    async def _shutdown(self) -> None:
        await self._refuse()
        for task in list(self._tasks):
            task.cancel()

    async def _open_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if isinstance(self.upstream, str):
            return await asyncio.open_unix_connection(self.upstream)
        host, port = self.upstream
        return await asyncio.open_connection(host, port)

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections_total += 1
        try:
            up_r, up_w = await self._open_upstream()
        except OSError:
            client_w.transport.abort()
            return
        self._writers.update((client_w, up_w))
        pumps = [
            asyncio.ensure_future(self._pump(client_r, up_w)),
            asyncio.ensure_future(self._pump(up_r, client_w)),
        ]
        for pump in pumps:
            self._tasks.add(pump)
            pump.add_done_callback(self._tasks.discard)
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for writer in (client_w, up_w):
            self._writers.discard(writer)
            writer.transport.abort()
        for pump in pumps:
            pump.cancel()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, ConnectionError):
            while True:
                data = await reader.read(self._chunk)
                if not data:
                    break
                writer.write(data)
                await writer.drain()


def postgres_upstream(database_url: str) -> Upstream:
    """Where a `postgresql://` URL points: a unix socket path or `(host, port)`."""
    parts = urlsplit(database_url)
    query = parse_qs(parts.query)
    port = parts.port or int(query.get("port", ["5432"])[0])
    host = query.get("host", [parts.hostname or ""])[0]
    if not host or host.startswith("/"):
        directory = Path(host or "/var/run/postgresql")
        return str(directory / f".s.PGSQL.{port}")
    return (host, port)


def proxied_database_url(database_url: str, proxy: TcpProxy) -> str:
    """The same database reached through `proxy` over TCP."""
    parts = urlsplit(database_url)
    query = {k: v[0] for k, v in parse_qs(parts.query).items() if k not in {"host", "port"}}
    userinfo = ""
    if parts.username is not None:
        userinfo = (
            parts.username + (f":{parts.password}" if parts.password is not None else ":") + "@"
        )
    netloc = f"{userinfo}127.0.0.1:{proxy.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, urlencode(query), parts.fragment))
