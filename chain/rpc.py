"""JSON-RPC over a pooled HTTP client, with several URLs per chain, failover and health.

web3.py stays the source of ABI and typing truth, but its provider is too slow for bulk
`eth_getLogs`; this client speaks JSON-RPC directly with aiohttp, batches requests, and
classifies every failure as retryable (try again or another URL), range-too-large (shrink
the `eth_getLogs` range) or permanent. URLs may carry credentials, so metrics and logs name
an endpoint by its position (`rpc0`, `rpc1`, …), never by its URL.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import structlog
from prometheus_client import Counter, Histogram

log = structlog.get_logger(__name__)

RPC_LATENCY = Histogram(
    "escrowd_rpc_request_seconds",
    "JSON-RPC request latency",
    ["chain_id", "endpoint", "method"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
RPC_ERRORS = Counter(
    "escrowd_rpc_errors_total", "JSON-RPC failures", ["chain_id", "endpoint", "method", "kind"]
)

_TOO_LARGE_MARKERS = (
    "too many results",
    "query returned more than",
    "response size",
    "block range",
    "range too large",
    "limit exceeded",
    "exceed maximum block range",
    "log response size exceeded",
    "query timeout",
)


class RpcError(Exception):
    """Base of every failure of this client."""

    retryable = False


class RpcTransportError(RpcError):
    """The endpoint did not answer properly (connection, timeout, HTTP 5xx, bad JSON)."""

    retryable = True


class RpcRangeTooLarge(RpcError):
    """The provider refused an `eth_getLogs` range as too large or too slow: shrink it."""

    retryable = True


class RpcResponseError(RpcError):
    """The node answered with a JSON-RPC error."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"JSON-RPC error {code}: {message}")
        self.code = code
        self.message = message
        self.data = data
        # -32000..-32099 are server errors: usually transient (overload, not synced yet).
        self.retryable = -32099 <= code <= -32000 or code == -32603


@dataclass
class EndpointHealth:
    """What this process knows about one URL."""

    name: str
    url: str
    failures: int = 0
    unhealthy_until: float = 0.0
    last_latency: float = 0.0

    @property
    def healthy(self) -> bool:
        return time.monotonic() >= self.unhealthy_until

    def record_failure(self) -> None:
        self.failures += 1
        # Back off 0.5 s, 1 s, 2 s, … up to 30 s: a flapping URL is not hammered.
        self.unhealthy_until = time.monotonic() + min(30.0, 0.5 * 2 ** min(self.failures - 1, 6))

    def record_success(self, latency: float) -> None:
        self.failures = 0
        self.unhealthy_until = 0.0
        self.last_latency = latency


def _classify(error: dict[str, Any]) -> RpcError:
    message = str(error.get("message", ""))
    lowered = message.lower()
    if any(marker in lowered for marker in _TOO_LARGE_MARKERS) or error.get("code") == -32005:
        return RpcRangeTooLarge(message)
    return RpcResponseError(int(error.get("code", 0)), message, error.get("data"))


class RpcClient:
    """A JSON-RPC client over one or more URLs of the same chain."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        chain_id: int | None = None,
        timeout: float = 10.0,
        max_attempts: int = 6,
        connections: int = 16,
    ) -> None:
        if not urls:
            raise ValueError("at least one RPC URL is required")
        self.endpoints = [EndpointHealth(name=f"rpc{i}", url=url) for i, url in enumerate(urls)]
        self._chain_label = str(chain_id) if chain_id is not None else "?"
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._max_attempts = max_attempts
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None
        self._ids = itertools.count(1)
        self._preferred = 0

    async def __aenter__(self) -> RpcClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._connections, ttl_dns_cache=300),
                json_serialize=lambda obj: orjson.dumps(obj).decode(),
            )
        return self._session

    async def close(self) -> None:
        """Close the HTTP pool."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _pick(self, attempt: int) -> EndpointHealth:
        healthy = [e for e in self.endpoints if e.healthy]
        pool = healthy or self.endpoints
        return pool[(self._preferred + attempt) % len(pool)]

    async def _post(self, endpoint: EndpointHealth, body: Any, method_label: str) -> Any:
        started = time.perf_counter()
        try:
            async with self._get_session().post(
                endpoint.url,
                data=orjson.dumps(body),
                headers={"Content-Type": "application/json"},
                timeout=self._timeout,
            ) as response:
                raw = await response.read()
                if response.status >= 500 or response.status == 429:
                    raise RpcTransportError(f"HTTP {response.status} from {endpoint.name}")
                if response.status >= 400:
                    raise RpcTransportError(f"HTTP {response.status} from {endpoint.name}")
            try:
                decoded = orjson.loads(raw)
            except orjson.JSONDecodeError:
                raise RpcTransportError(f"invalid JSON from {endpoint.name}") from None
        except TimeoutError:
            raise RpcTransportError(f"timeout from {endpoint.name}") from None
        except aiohttp.ClientError as exc:
            raise RpcTransportError(f"{type(exc).__name__} from {endpoint.name}") from None
        finally:
            RPC_LATENCY.labels(self._chain_label, endpoint.name, method_label).observe(
                time.perf_counter() - started
            )
        return decoded

    async def _with_failover(self, body: Any, method_label: str, parse: Any) -> Any:
        last: RpcError | None = None
        for attempt in range(self._max_attempts):
            endpoint = self._pick(attempt)
            try:
                started = time.perf_counter()
                result = parse(await self._post(endpoint, body, method_label))
                endpoint.record_success(time.perf_counter() - started)
                return result
            except RpcRangeTooLarge:
                RPC_ERRORS.labels(self._chain_label, endpoint.name, method_label, "range_too_large").inc()
                raise
            except RpcError as exc:
                kind = "transport" if isinstance(exc, RpcTransportError) else "response"
                RPC_ERRORS.labels(self._chain_label, endpoint.name, method_label, kind).inc()
                if not exc.retryable:
                    raise
                last = exc
                endpoint.record_failure()
                if len(self.endpoints) > 1:
                    self._preferred = (self._preferred + 1) % len(self.endpoints)
                log.warning("rpc_retry", endpoint=endpoint.name, method=method_label, error=str(exc), attempt=attempt)
                await asyncio.sleep(min(2.0, 0.05 * 2**attempt))
        assert last is not None
        raise last

    async def call(self, method: str, params: list[Any] | None = None) -> Any:
        """One request; retried on transient failures, across URLs."""
        body = {"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": params or []}

        def parse(reply: Any) -> Any:
            if not isinstance(reply, dict):
                raise RpcTransportError("reply is not a JSON object")
            if "error" in reply:
                raise _classify(reply["error"])
            if "result" not in reply:
                raise RpcTransportError("reply has neither result nor error")
            return reply["result"]

        return await self._with_failover(body, method, parse)

    async def batch(self, calls: Sequence[tuple[str, list[Any]]]) -> list[Any]:
        """Several requests in one HTTP round trip; results in call order."""
        if not calls:
            return []
        first_id = next(self._ids)
        body = [
            {"jsonrpc": "2.0", "id": first_id + i, "method": method, "params": params}
            for i, (method, params) in enumerate(calls)
        ]
        for _ in range(len(calls)):
            next(self._ids)
        label = calls[0][0] if len({m for m, _ in calls}) == 1 else "batch"

        def parse(reply: Any) -> list[Any]:
            if not isinstance(reply, list):
                if isinstance(reply, dict) and "error" in reply:
                    raise _classify(reply["error"])
                raise RpcTransportError("batch reply is not a list")
            by_id = {item.get("id"): item for item in reply if isinstance(item, dict)}
            results = []
            for i in range(len(calls)):
                item = by_id.get(first_id + i)
                if item is None:
                    raise RpcTransportError("batch reply is missing an answer")
                if "error" in item:
                    raise _classify(item["error"])
                results.append(item.get("result"))
            return results

        result: list[Any] = await self._with_failover(body, label, parse)
        return result

    # -- typed helpers --------------------------------------------------------------

    async def block_number(self) -> int:
        """`eth_blockNumber`."""
        return int(await self.call("eth_blockNumber"), 16)

    async def chain_id(self) -> int:
        """`eth_chainId`."""
        return int(await self.call("eth_chainId"), 16)

    async def headers(self, numbers: Sequence[int]) -> list[dict[str, Any] | None]:
        """Block headers (no transactions) for `numbers`, in one batch."""
        return await self.batch([("eth_getBlockByNumber", [hex(n), False]) for n in numbers])

    async def get_logs(self, addresses: Sequence[str], from_block: int, to_block: int) -> list[dict[str, Any]]:
        """`eth_getLogs` of the given contracts over an inclusive block range."""
        result: list[dict[str, Any]] = await self.call(
            "eth_getLogs",
            [{"address": list(addresses), "fromBlock": hex(from_block), "toBlock": hex(to_block)}],
        )
        return result
