"""A fault-injecting JSON-RPC proxy in front of anvil (aiohttp server on 127.0.0.1).

Real providers fail in ways anvil never does: they answer 5xx or 429, time out, are slow,
refuse `eth_getLogs` ranges that return too many logs or span too many blocks, and drop
WebSocket subscriptions. `Faults` says how often each happens; the proxy counts what it
injected so a test can prove the faults really occurred. Decisions come from a seeded
`random.Random`, so a failing run can be replayed from its seed.

The proxy runs in its own thread and event loop, so synchronous test code (the devnet
driver) does not stall it. `Faults` can be changed at any time from any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections import Counter
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import aiohttp
import orjson
from aiohttp import web

TOO_MANY_RESULTS = "query returned more than 10000 results"


@dataclass
class Faults:
    """What to inject; rates are probabilities per HTTP request (a batch is one request)."""

    error_rate: float = 0.0
    """HTTP 503 / 429, a JSON-RPC internal error, or a body that is not JSON."""
    timeout_rate: float = 0.0
    """Hold the request for `hang_seconds` (longer than the client's timeout), then drop it."""
    hang_seconds: float = 3.0
    slow_rate: float = 0.0
    """Answer correctly after `slow_seconds`."""
    slow_seconds: float = 0.3
    max_logs: int | None = None
    """An `eth_getLogs` whose reply holds more logs than this fails with "too many results"."""
    max_block_range: int | None = None
    """An `eth_getLogs` spanning more blocks than this fails before reaching anvil."""
    strip_block_timestamp: bool = False
    """Remove `blockTimestamp` from logs, as providers that predate that field do."""
    reverse_logs: bool = False
    """Answer `eth_getLogs` newest log first (nothing in the protocol makes a reply's order
    trustworthy; some providers merge per-address results)."""
    first: tuple[str, ...] = ()
    """Faults forced on the first eligible requests, in order, so each kind surely happens:
    "http503", "http429", "rpc_internal", "garbage", "timeout", "slow"."""
    hostile_logs: int = 0
    """The first this many `eth_getLogs` replies holding logs get one log with a field of the
    wrong type (a number where JSON-RPC promises a hex string), as a hostile node might."""
    receipt_lag: int = 0
    """Answer null to the first `receipt_lag` `eth_getTransactionReceipt` requests of each
    transaction hash, as a node whose receipt index lags its state does (anvil under load
    for a moment after mining; a load-balanced provider whose nodes are a block apart)."""
    empty_calls: frozenset[str] = frozenset()
    """Selectors (`0x` + 8 hex digits, lower case) whose `eth_call`s are answered "0x" (no
    bytes), as a node that does not have the contract yet (behind, or a fresh deployment) does."""
    stale_calls: frozenset[str] = frozenset()
    """Selectors (`0x` + 8 hex digits, lower case) whose `eth_call`s are answered at
    `stale_block` whatever block they ask for, as a node some blocks behind another does."""
    stale_block: int = 0
    hostile_receipt_logs: int = 0
    """The first this many `eth_getTransactionReceipt` answers holding logs get, in every log
    with three topics or more, a third topic that is not hex (as a hostile node might answer)."""
    strip_receipt_status: bool = False
    """Remove `status` from receipts, as nodes of chains from before EIP-658 answer (a receipt
    without it is read as a success)."""
    null_in_batches: frozenset[str] = frozenset()
    """Methods answered with a null result when they come inside a batch request, as a
    provider that mishandles batches does (the same request alone is answered properly)."""
    methods: frozenset[str] | None = None
    """Only requests containing one of these methods get error/timeout/slow faults (None: all)."""
    seed: int = 0


@dataclass
class ProxyStats:
    """What the proxy saw and did."""

    requests: int = 0
    injected: Counter[str] = field(default_factory=Counter)
    get_logs_spans: list[int] = field(default_factory=list)
    """Block span of every `eth_getLogs` that reached anvil, in arrival order."""
    ws_connections: int = 0
    ws_dropped: int = 0
    eth_calls: Counter[str] = field(default_factory=Counter)
    """`eth_call`s by the selector of their calldata (`0x` + 8 hex digits, lower case)."""


class RpcFaultProxy:
    """HTTP JSON-RPC (and WebSocket) proxy to `upstream_url`, injecting `faults`."""

    def __init__(self, upstream_url: str, faults: Faults | None = None, *, port: int = 0) -> None:
        self.upstream_url = upstream_url
        self.upstream_ws = upstream_url.replace("http://", "ws://", 1).replace(
            "https://", "wss://", 1
        )
        self.faults = faults or Faults()
        self.port = port
        self.stats = ProxyStats()
        self._rng = random.Random(self.faults.seed)
        self._forced = list(self.faults.first)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._websockets: set[web.WebSocketResponse] = set()
        self._receipt_reads: Counter[str] = Counter()

    @property
    def url(self) -> str:
        """HTTP URL of the proxy."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        """WebSocket URL of the proxy."""
        return f"ws://127.0.0.1:{self.port}"

    def set_faults(self, faults: Faults) -> None:
        """Replace the fault plan (reseeds the random source)."""
        with self._lock:
            self.faults = faults
            self._rng = random.Random(faults.seed)
            self._forced = list(faults.first)

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> RpcFaultProxy:
        """Serve in a background thread; `port` is known afterwards."""
        if self._thread is not None:
            return self
        ready = threading.Event()
        failure: list[BaseException] = []

        def main() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._serve())
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._close())
            loop.close()

        self._thread = threading.Thread(target=main, name="rpc-fault-proxy", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        """Stop serving and end the thread."""
        if self._thread is None or self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._thread = None

    def __enter__(self) -> RpcFaultProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def drop_websockets(self) -> int:
        """Close every proxied WebSocket connection now; returns how many."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(self._drop_ws(), self._loop).result(timeout=10)

    # -- serving --------------------------------------------------------------------

    async def _serve(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=64), timeout=aiohttp.ClientTimeout(total=60)
        )
        app = web.Application(client_max_size=2**30)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=1.0
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def _close(self) -> None:
        await self._drop_ws()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _drop_ws(self) -> int:
        sockets = list(self._websockets)
        for ws in sockets:
            with contextlib.suppress(Exception):
                await ws.close(code=1011, message=b"dropped by the fault proxy")
        self.stats.ws_dropped += len(sockets)
        return len(sockets)

    def _draw(self) -> float:
        with self._lock:
            return self._rng.random()

    def _choice(self, options: list[str]) -> str:
        with self._lock:
            return self._rng.choice(options)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return await self._websocket(request)
        body = await request.read()
        self.stats.requests += 1
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            return web.Response(status=400, text="bad JSON")
        calls = payload if isinstance(payload, list) else [payload]
        for call in calls:
            if isinstance(call, dict) and call.get("method") == "eth_call":
                params = call.get("params")
                tx = params[0] if isinstance(params, list) and params and isinstance(params[0], dict) else {}
                self.stats.eth_calls[str(tx.get("data") or tx.get("input") or "")[:10].lower()] += 1
        faults = self.faults
        methods = {c.get("method") for c in calls if isinstance(c, dict)}
        eligible = faults.methods is None or bool(methods & faults.methods)
        forced = None
        if eligible:
            with self._lock:
                forced = self._forced.pop(0) if self._forced else None
        if forced in {"timeout", "slow"}:
            self.stats.injected[forced] += 1
            await asyncio.sleep(faults.hang_seconds if forced == "timeout" else faults.slow_seconds)
            if forced == "timeout":
                return web.Response(status=504, text="gateway timeout")
        elif forced is not None:
            return self._error_reply(calls, payload, forced)
        elif eligible:
            roll = self._draw()
            if roll < faults.error_rate:
                return self._error_reply(calls, payload)
            roll -= faults.error_rate
            if roll < faults.timeout_rate:
                self.stats.injected["timeout"] += 1
                await asyncio.sleep(faults.hang_seconds)
                return web.Response(status=504, text="gateway timeout")
            roll -= faults.timeout_rate
            if roll < faults.slow_rate:
                self.stats.injected["slow"] += 1
                await asyncio.sleep(faults.slow_seconds)
        if faults.max_block_range is not None:
            for call in calls:
                span = _get_logs_span(call)
                if span is not None and span > faults.max_block_range:
                    self.stats.injected["block_range"] += 1
                    return self._json(
                        _replace_with_error(
                            payload,
                            call,
                            -32005,
                            f"exceed maximum block range: {faults.max_block_range}",
                        )
                    )
        for call in calls:
            span = _get_logs_span(call)
            if span is not None:
                self.stats.get_logs_spans.append(span)
        if faults.stale_calls and any(c.get("method") == "eth_call" for c in calls):
            body = self._stale_calls(payload, calls, faults.stale_calls, faults.stale_block)
        assert self._session is not None
        async with self._session.post(
            self.upstream_url, data=body, headers={"Content-Type": "application/json"}
        ) as upstream:
            status = upstream.status
            raw = await upstream.read()
        if faults.strip_block_timestamp and any(c.get("method") == "eth_getLogs" for c in calls):
            reply = orjson.loads(raw)
            for answer in reply if isinstance(reply, list) else [reply]:
                result = answer.get("result") if isinstance(answer, dict) else None
                if isinstance(result, list):
                    for log in result:
                        if isinstance(log, dict) and log.pop("blockTimestamp", None) is not None:
                            self.stats.injected["stripped_timestamp"] += 1
            raw = orjson.dumps(reply)
        if faults.reverse_logs and any(c.get("method") == "eth_getLogs" for c in calls):
            reply = orjson.loads(raw)
            for answer in reply if isinstance(reply, list) else [reply]:
                result = answer.get("result") if isinstance(answer, dict) else None
                if isinstance(result, list) and len(result) > 1:
                    result.reverse()
                    self.stats.injected["reversed_logs"] += 1
            raw = orjson.dumps(reply)
        if faults.hostile_logs and any(c.get("method") == "eth_getLogs" for c in calls):
            reply = orjson.loads(raw)
            for answer in reply if isinstance(reply, list) else [reply]:
                result = answer.get("result") if isinstance(answer, dict) else None
                if isinstance(result, list) and result and self.stats.injected["hostile_log"] < faults.hostile_logs:
                    result[-1]["data"] = 0
                    self.stats.injected["hostile_log"] += 1
            raw = orjson.dumps(reply)
        if faults.strip_receipt_status and any(c.get("method") == "eth_getTransactionReceipt" for c in calls):
            reply = orjson.loads(raw)
            for answer in reply if isinstance(reply, list) else [reply]:
                result = answer.get("result") if isinstance(answer, dict) else None
                if isinstance(result, dict) and result.pop("status", None) is not None:
                    self.stats.injected["stripped_status"] += 1
            raw = orjson.dumps(reply)
        if faults.hostile_receipt_logs and any(c.get("method") == "eth_getTransactionReceipt" for c in calls):
            raw = self._hostile_receipt_logs(raw, faults.hostile_receipt_logs)
        if faults.null_in_batches and isinstance(payload, list):
            raw = self._null_results(calls, raw, faults.null_in_batches)
        if faults.empty_calls and any(c.get("method") == "eth_call" for c in calls):
            raw = self._empty_calls(calls, raw, faults.empty_calls)
        if faults.receipt_lag and any(c.get("method") == "eth_getTransactionReceipt" for c in calls):
            raw = self._lag_receipts(calls, raw, faults.receipt_lag)
        if faults.max_logs is not None and any(c.get("method") == "eth_getLogs" for c in calls):
            reply, by_id = _replies_by_id(raw)
            for call in calls:
                if call.get("method") != "eth_getLogs":
                    continue
                answer = by_id.get(call.get("id"))
                result = answer.get("result") if answer else None
                if isinstance(result, list) and len(result) > faults.max_logs:
                    self.stats.injected["too_many_results"] += 1
                    return self._json(
                        _replace_with_error(payload, call, -32005, TOO_MANY_RESULTS, reply)
                    )
        return web.Response(status=status, body=raw, content_type="application/json")

    def _hostile_receipt_logs(self, raw: bytes, limit: int) -> bytes:
        reply = orjson.loads(raw)
        for answer in reply if isinstance(reply, list) else [reply]:
            result = answer.get("result") if isinstance(answer, dict) else None
            logs = result.get("logs") if isinstance(result, dict) else None
            garbled = [log for log in logs or [] if isinstance(log, dict) and len(log.get("topics") or []) >= 3]
            if not garbled:
                continue
            with self._lock:
                if self.stats.injected["hostile_receipt_log"] >= limit:
                    break
                self.stats.injected["hostile_receipt_log"] += 1
            for log in garbled:
                log["topics"][2] = "0x" + "zz" * 32
        return orjson.dumps(reply)

    def _null_results(self, calls: list[Any], raw: bytes, methods: frozenset[str]) -> bytes:
        reply, by_id = _replies_by_id(raw, batches_only=True)
        for call in calls:
            answer = by_id.get(call.get("id")) if call.get("method") in methods else None
            if answer is not None and "result" in answer:
                answer["result"] = None
                self.stats.injected["null_in_batch"] += 1
        return orjson.dumps(reply)

    def _stale_calls(self, payload: Any, calls: list[Any], selectors: frozenset[str], block: int) -> bytes:
        for call in calls:
            params = call.get("params") if call.get("method") == "eth_call" else None
            tx = params[0] if isinstance(params, list) and params and isinstance(params[0], dict) else None
            if tx is not None and str(tx.get("data") or tx.get("input") or "")[:10].lower() in selectors:
                call["params"] = [tx, hex(block)]
                self.stats.injected["stale_call"] += 1
        return orjson.dumps(payload)

    def _empty_calls(self, calls: list[Any], raw: bytes, selectors: frozenset[str]) -> bytes:
        reply, by_id = _replies_by_id(raw)
        for call in calls:
            if call.get("method") != "eth_call":
                continue
            params = call.get("params")
            tx = params[0] if isinstance(params, list) and params and isinstance(params[0], dict) else {}
            answer = by_id.get(call.get("id"))
            if str(tx.get("data") or tx.get("input") or "")[:10].lower() in selectors and answer and "result" in answer:
                answer["result"] = "0x"
                self.stats.injected["empty_call"] += 1
        return orjson.dumps(reply)

    def _lag_receipts(self, calls: list[Any], raw: bytes, lag: int) -> bytes:
        reply, by_id = _replies_by_id(raw)
        for call in calls:
            if call.get("method") != "eth_getTransactionReceipt" or not call.get("params"):
                continue
            tx_hash = str(call["params"][0]).lower()
            answer = by_id.get(call.get("id"))
            with self._lock:
                self._receipt_reads[tx_hash] += 1
                held = self._receipt_reads[tx_hash] <= lag
            if held and answer is not None and answer.get("result") is not None:
                answer["result"] = None
                self.stats.injected["receipt_lag"] += 1
        return orjson.dumps(reply)

    def _error_reply(self, calls: list[Any], payload: Any, kind: str | None = None) -> web.Response:
        kind = kind or self._choice(["http503", "http429", "rpc_internal", "garbage"])
        self.stats.injected[kind] += 1
        if kind == "http503":
            return web.Response(status=503, text="service unavailable")
        if kind == "http429":
            return web.Response(status=429, text="rate limited")
        if kind == "garbage":
            return web.Response(
                status=200, body=b'{"jsonrpc": "2.0", "resu', content_type="application/json"
            )
        return self._json(_replace_with_error(payload, calls[0], -32603, "internal error"))

    @staticmethod
    def _json(obj: Any) -> web.Response:
        return web.Response(status=200, body=orjson.dumps(obj), content_type="application/json")

    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        client = web.WebSocketResponse(max_msg_size=2**24)
        await client.prepare(request)
        self.stats.ws_connections += 1
        self._websockets.add(client)
        assert self._session is not None
        try:
            async with self._session.ws_connect(self.upstream_ws, max_msg_size=2**24) as upstream:

                async def up() -> None:
                    async for msg in client:
                        if msg.type == aiohttp.WSMsgType.TEXT:
                            await upstream.send_str(msg.data)
                        elif msg.type == aiohttp.WSMsgType.BINARY:
                            await upstream.send_bytes(msg.data)

                async def down() -> None:
                    async for msg in upstream:
                        if msg.type == aiohttp.WSMsgType.TEXT:
                            await client.send_str(msg.data)
                        elif msg.type == aiohttp.WSMsgType.BINARY:
                            await client.send_bytes(msg.data)

                tasks = [asyncio.ensure_future(up()), asyncio.ensure_future(down())]
                await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for task in tasks:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
        except (aiohttp.ClientError, OSError):
            pass
        finally:
            self._websockets.discard(client)
            with contextlib.suppress(Exception):
                await client.close()
        return client


def _get_logs_span(call: Any) -> int | None:
    if not isinstance(call, dict) or call.get("method") != "eth_getLogs":
        return None
    params = call.get("params") or [{}]
    flt = params[0] if params else {}
    start, end = flt.get("fromBlock"), flt.get("toBlock")
    if not (
        isinstance(start, str)
        and isinstance(end, str)
        and start.startswith("0x")
        and end.startswith("0x")
    ):
        return None
    return int(end, 16) - int(start, 16) + 1


def _replace_with_error(
    payload: Any, call: dict[str, Any], code: int, message: str, reply: Any = None
) -> Any:
    """The reply to `payload` with `call` answered by a JSON-RPC error (others kept or nulled)."""
    error = {"jsonrpc": "2.0", "id": call.get("id"), "error": {"code": code, "message": message}}
    if not isinstance(payload, list):
        return error
    answered = {r.get("id"): r for r in (reply or []) if isinstance(r, dict)}
    out = []
    for item in payload:
        if item is call:
            out.append(error)
        else:
            out.append(
                answered.get(
                    item.get("id"), {"jsonrpc": "2.0", "id": item.get("id"), "result": None}
                )
            )
    return out


def _replies_by_id(raw: bytes, *, batches_only: bool = False) -> tuple[Any, dict[Any, dict[str, Any]]]:
    """A reply as sent (to edit and re-encode) and its answers by request id (none for a
    single reply when `batches_only`)."""
    reply = orjson.loads(raw)
    replies = reply if isinstance(reply, list) else [] if batches_only else [reply]
    return reply, {r.get("id"): r for r in replies if isinstance(r, dict)}
