"""The relayer's JSON-RPC adapter: HTTP with failover and batches, WebSocket `newHeads`.

Library and node errors are translated here, at the edge, into two roots:

- `RetryableRpcError`: the transport failed (connection refused, timeout, HTTP 5xx/429, a
  provider's rate limit); tenacity retries it with jittered backoff and the client moves
  on to the next URL;
- `RpcCallError`: the node answered and refused (nonce too low, reverted call...); a retry
  of the same request cannot help. `Reverted` carries the revert data of an `eth_call`.

URLs are logged and reported by scheme, host and port only: providers put API keys in
paths and query strings.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import structlog
from prometheus_client import Counter
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

from schemas import jsonbounds

log = structlog.get_logger(__name__)

RPC_ERRORS = Counter(
    "escrowd_relayer_rpc_errors_total",
    "JSON-RPC failures, by method and kind (transient, refused)",
    ["chain_id", "method", "kind"],
)


class RpcError(Exception):
    """Any failure talking to a node."""


class RetryableRpcError(RpcError):
    """A transient fault: the same request may succeed later or on another URL."""


class RpcCallError(RpcError):
    """The node answered with an error object: repeating the request will not help."""

    def __init__(self, method: str, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{method}: {message} (code {code})")
        self.method = method
        self.code = code
        self.message = message
        self.data = data


class Reverted(RpcCallError):
    """An `eth_call` (or gas estimate) reverted; `revert_data` holds the raw error bytes."""

    def __init__(self, method: str, code: int, message: str, revert_data: bytes) -> None:
        super().__init__(method, code, message, "0x" + revert_data.hex())
        self.revert_data = revert_data


def safe_url(url: str) -> str:
    """scheme://host:port of a URL, without path or query (where API keys hide)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")


_RETRYABLE_CODES = {-32005, -32603, 429}  # limit exceeded, internal error, rate limited


def _translate(method: str, error: dict[str, Any]) -> RpcError:
    code = int(error.get("code", 0))
    message = str(error.get("message", ""))
    data = error.get("data")
    if code in _RETRYABLE_CODES and "revert" not in message.lower():
        return RetryableRpcError(f"{method}: {message} (code {code})")
    if isinstance(data, str) and data.startswith("0x") and (code == 3 or "revert" in message.lower()):
        return Reverted(method, code, message, bytes.fromhex(data[2:]))
    if code == 3 or "execution reverted" in message.lower():
        return Reverted(method, code, message, b"")
    return RpcCallError(method, code, message, data)


@dataclass(frozen=True)
class Head:
    """A block header as far as the relayer cares."""

    number: int
    hash: str
    parent_hash: str
    timestamp: int
    base_fee: int

    @classmethod
    def from_json(cls, block: dict[str, Any]) -> Head:
        """From an `eth_getBlockByNumber` result or a `newHeads` notification."""
        return cls(
            number=int(block["number"], 16),
            hash=str(block["hash"]),
            parent_hash=str(block["parentHash"]),
            timestamp=int(block["timestamp"], 16),
            base_fee=int(block.get("baseFeePerGas") or "0x0", 16),
        )


class EthRpc:
    """A pooled JSON-RPC client over HTTP with URL failover and tenacity retries."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        chain_id: int,
        timeout: float = 10.0,
        attempts: int = 5,
        max_backoff: float = 2.0,
    ) -> None:
        if not urls:
            raise ValueError("at least one RPC URL is needed")
        self._urls = list(urls)
        self._index = 0
        self._chain = str(chain_id)
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._attempts = attempts
        self._max_backoff = max_backoff
        self._session: aiohttp.ClientSession | None = None
        self._ids = itertools.count(1)

    @property
    def url(self) -> str:
        """The URL in use now (for failover; log it through `safe_url`)."""
        return self._urls[self._index]

    async def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=64, keepalive_timeout=30)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        return self._session

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _fail_over(self) -> None:
        if len(self._urls) > 1:
            self._index = (self._index + 1) % len(self._urls)
            log.warning("rpc_failover", chain_id=self._chain, url=safe_url(self.url))

    async def _post(self, body: Any, label: str) -> Any:
        session = await self._http()
        try:
            async with session.post(self.url, json=body) as response:
                if response.status == 429 or response.status >= 500:
                    raise RetryableRpcError(f"{label}: HTTP {response.status}")
                if response.status != 200:
                    raise RpcCallError(label, response.status, f"HTTP {response.status}")
                return await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise RetryableRpcError(f"{label}: {type(exc).__name__} at {safe_url(self.url)}") from None

    def _retry(self) -> AsyncRetrying:
        return AsyncRetrying(
            retry=retry_if_exception_type(RetryableRpcError),
            wait=wait_exponential_jitter(multiplier=0.05, max=self._max_backoff),
            stop=stop_after_attempt(self._attempts),
            reraise=True,
        )

    def _transient(self, label: str) -> None:
        RPC_ERRORS.labels(self._chain, label, "transient").inc()
        self._fail_over()

    async def call(self, method: str, *params: Any) -> Any:
        """One request; RetryableRpcError after the retries, RpcCallError on a node error."""
        body = {"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": list(params)}
        async for attempt in self._retry():
            with attempt:
                try:
                    reply = await self._post(body, method)
                except RetryableRpcError:
                    self._transient(method)
                    raise
                if "error" not in reply:
                    return reply.get("result")
                error = _translate(method, reply["error"])
                if isinstance(error, RetryableRpcError):
                    self._transient(method)
                else:
                    RPC_ERRORS.labels(self._chain, method, "refused").inc()
                raise error
        raise AssertionError("unreachable")  # pragma: no cover

    async def batch(self, calls: Sequence[tuple[str, Sequence[Any]]]) -> list[Any]:
        """Many requests in one round trip; each result is a value or an RpcError instance."""
        if not calls:
            return []
        first = next(self._ids)
        ids = range(first, first + len(calls))
        for _ in range(len(calls) - 1):
            next(self._ids)
        body = [
            {"jsonrpc": "2.0", "id": i, "method": m, "params": list(p)}
            for i, (m, p) in zip(ids, calls, strict=True)
        ]
        replies: Any = None
        async for attempt in self._retry():
            with attempt:
                try:
                    replies = await self._post(body, "batch")
                except RetryableRpcError:
                    self._transient("batch")
                    raise
        if not isinstance(replies, list):
            # Some nodes answer a whole batch with one error object.
            raise RetryableRpcError(f"batch: unexpected reply {str(replies)[:200]}")
        by_id = {r.get("id"): r for r in replies}
        out: list[Any] = []
        for i, (method, _) in zip(ids, calls, strict=True):
            reply = by_id.get(i)
            if reply is None:
                out.append(RetryableRpcError(f"{method}: missing from batch reply"))
            elif "error" in reply:
                out.append(_translate(method, reply["error"]))
            else:
                out.append(reply.get("result"))
        return out

    # ------------------------------------------------------------------ typed helpers

    async def chain_id(self) -> int:
        """eth_chainId."""
        return int(await self.call("eth_chainId"), 16)

    async def head(self) -> Head:
        """The latest block header."""
        return Head.from_json(await self.call("eth_getBlockByNumber", "latest", False))

    async def block_hash(self, number: int) -> str | None:
        """Hash of the canonical block at `number` (None above the head)."""
        block = await self.call("eth_getBlockByNumber", hex(number), False)
        return None if block is None else str(block["hash"])

    async def transaction_count(self, address: str, tag: str = "latest") -> int:
        """eth_getTransactionCount."""
        return int(await self.call("eth_getTransactionCount", address, tag), 16)

    async def balance(self, address: str) -> int:
        """eth_getBalance at latest, in wei."""
        return int(await self.call("eth_getBalance", address, "latest"), 16)

    async def max_priority_fee(self) -> int:
        """eth_maxPriorityFeePerGas (0 when the node does not offer it)."""
        try:
            return int(await self.call("eth_maxPriorityFeePerGas"), 16)
        except RpcCallError:
            return 0

    async def eth_call(
        self, to: str, data: bytes, *, sender: str | None = None, gas: int | None = None, block: str = "latest"
    ) -> bytes:
        """eth_call; raises Reverted with the revert data."""
        tx: dict[str, str] = {"to": to, "data": "0x" + data.hex()}
        if sender is not None:
            tx["from"] = sender
        if gas is not None:
            tx["gas"] = hex(gas)
        result = await self.call("eth_call", tx, block)
        return bytes.fromhex(str(result)[2:])

    async def send_raw(self, raw_hex: str) -> str:
        """eth_sendRawTransaction; the node's refusal comes back as RpcCallError."""
        return str(await self.call("eth_sendRawTransaction", raw_hex))

    async def receipt(self, tx_hash: str) -> dict[str, Any] | None:
        """eth_getTransactionReceipt (None while unknown or not mined)."""
        result = await self.call("eth_getTransactionReceipt", tx_hash)
        return None if result is None else dict(result)

    async def revert_data(self, tx_hash: str) -> bytes | None:
        """The revert data of a mined, failed transaction (debug trace; None if unsupported)."""
        try:
            trace = await self.call("debug_traceTransaction", tx_hash, {"tracer": "callTracer"})
        except RpcCallError:
            return None
        output = str((trace or {}).get("output") or "0x")
        return bytes.fromhex(output[2:])


async def new_heads(ws_url: str, *, heartbeat: float = 10.0) -> AsyncIterator[Head]:
    """Yield every `newHeads` notification of one WebSocket connection until it closes.

    The subscription uses its own connection: sharing one with requests delays the
    notifications behind the replies (tens of milliseconds on anvil).
    """
    async with aiohttp.ClientSession() as session, session.ws_connect(ws_url, heartbeat=heartbeat) as ws:
        await ws.send_json({"jsonrpc": "2.0", "id": 1, "method": "eth_subscribe", "params": ["newHeads"]})
        async for message in ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                if message.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                    break
                continue
            data = jsonbounds.loads(message.data)  # an RPC node is outside too
            if not isinstance(data, dict):
                continue
            if data.get("method") == "eth_subscription":
                yield Head.from_json(data["params"]["result"])
            elif "error" in data:
                raise RetryableRpcError(f"eth_subscribe refused: {data['error']}")


async def sleep_backoff(attempt: int, base: float = 0.2, cap: float = 5.0) -> None:
    """Sleep before reconnecting a long-lived stream (exponential, capped)."""
    await asyncio.sleep(min(cap, base * (2 ** min(attempt, 8))))
