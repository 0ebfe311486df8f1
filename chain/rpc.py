"""The one JSON-RPC client: pooled HTTP, batches, failover across URLs, timeouts, one
node-error taxonomy, and replies treated as hostile.

The indexer (bulk `eth_getLogs`, header batches) and every sender (calls, gas estimates,
raw transactions, receipts) use it; web3.py stays the source of ABI and typing truth, but
its provider is an order of magnitude too slow for bulk logs.

**Errors.** Every failure is an `RpcError` with a `kind`, decided in one place
(`node_error_kind`, the only code that reads node error texts):

- transient (`RetryableRpcError`, retried with jittered backoff, moving to the next
  healthy URL): `transport` (connection, timeout, HTTP 5xx, a reply that is not what
  JSON-RPC promises, a node that is busy or behind) and `rate_limited` (HTTP 429, a
  provider's quota);
- `range_too_large` (`RpcRangeTooLarge`): an `eth_getLogs` range the provider refused as
  too large or too slow, or a reply over the size bound; the caller shrinks the range;
- refusals (`RpcCallError`: the node answered, repeating the request cannot help):
  `reverted` (`Reverted`, with the revert data), `already_known` (`AlreadyKnown`),
  `nonce_too_low` (`NonceTooLow`), `underpriced` (`Underpriced`), `nonce_too_high`,
  `below_base_fee`, `insufficient_funds`, and `permanent` for anything else.

**Replies are hostile**: a reply's size is bounded before it is parsed, its id must be
ours, an error object must have an integer code and a string message, and the typed
helpers (`quantity`, `header_reply`, `logs_reply`, ...) check every field they hand on.

URLs may carry credentials, so metrics and logs name an endpoint by its position (`rpc0`,
`rpc1`, ...), never by its URL (`safe_url` gives scheme, host and port where one is needed).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson
import structlog
from prometheus_client import Counter, Histogram

from runtime.httpbody import read_bounded
from schemas import jsonbounds

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
RELAYER_RPC_ERRORS = Counter(
    "escrowd_relayer_rpc_errors_total",
    "JSON-RPC failures, by method and kind (transient, refused)",
    ["chain_id", "method", "kind"],
)

MAX_REPLY_BYTES = 256 * 1024 * 1024
"""Default bound of one HTTP reply (anvil answers 200k logs with 139 MB)."""

# ------------------------------------------------------------------------- the taxonomy


class RpcError(Exception):
    """Any failure talking to a node."""

    retryable = False
    kind = "permanent"


class RetryableRpcError(RpcError):
    """A transient fault: the same request may succeed later or on another URL."""

    retryable = True
    kind = "transport"


class RpcTransportError(RetryableRpcError):
    """The endpoint did not answer properly (connection, timeout, HTTP 5xx, a malformed
    reply) or said it cannot serve the request now (busy, behind the chain)."""


class RpcRateLimited(RetryableRpcError):
    """HTTP 429 or a provider's rate limit or quota."""

    kind = "rate_limited"


class RpcRangeTooLarge(RpcError):
    """The provider refused an `eth_getLogs` range as too large or too slow: shrink it."""

    kind = "range_too_large"


class RpcCallError(RpcError):
    """The node answered with an error object: repeating the request will not help."""

    def __init__(self, method: str, code: int, message: str, data: Any = None, kind: str = "permanent") -> None:
        super().__init__(f"{method}: {message} (code {code})")
        self.method = method
        self.code = code
        self.message = message
        self.data = data
        self.kind = kind


class Reverted(RpcCallError):
    """An `eth_call` (or gas estimate) reverted; `revert_data` holds the raw error bytes."""

    def __init__(self, method: str, code: int, message: str, revert_data: bytes) -> None:
        super().__init__(method, code, message, "0x" + revert_data.hex(), "reverted")
        self.revert_data = revert_data


class AlreadyKnown(RpcCallError):
    """The pool already holds this exact transaction."""


class NonceTooLow(RpcCallError):
    """The nonce is used: by this transaction (mined), or by another one."""


class Underpriced(RpcCallError):
    """A replacement below the pool's bump rule, or a fee under the pool's minimum."""


_REFUSALS: dict[str, type[RpcCallError]] = {
    "already_known": AlreadyKnown,
    "nonce_too_low": NonceTooLow,
    "underpriced": Underpriced,
}

# Markers are matched against the message folded to lower-case letters and digits, so
# "already known", "AlreadyKnown" and "already-known" are one marker.
_ALREADY_KNOWN = ("alreadyknown", "alreadyimported", "knowntransaction")  # geth/erigon, anvil, besu
_NONCE_TOO_LOW = ("noncetoolow", "nonceistoolow", "oldnonce")  # geth, parity, nethermind
_NONCE_TOO_HIGH = ("noncetoohigh", "noncegap")
_BELOW_BASE_FEE = ("basefee", "feecaplessthan")
_RATE_LIMITED = ("ratelimit", "toomanyrequests", "requestrate", "quota", "creditsexceeded", "capacityexceeded")
_RANGE_TOO_LARGE = (
    "toomanyresults",
    "queryreturnedmorethan",
    "responsesize",
    "blockrange",
    "rangetoolarge",
    "limitexceeded",
    "exceedmaximumblockrange",
    "querytimeout",
)
_BEHIND = ("headernotfound", "notsynced", "syncing", "timeout", "busy", "overload", "tryagain", "temporar", "unavailable")
# Reads of blocks and logs that a load-balanced provider may serve from a node that has
# not caught up yet: a server error on them is worth a retry or another URL.
_RETRIED_READS = frozenset({"eth_getLogs", "eth_getBlockByNumber", "eth_blockNumber", "eth_chainId", "batch"})


def _fold(message: str) -> str:
    return "".join(ch for ch in message.lower() if ch.isalnum())


def node_error_kind(method: str, code: int, message: str) -> str:
    """The kind of a node's error object (the one place that reads node error texts)."""
    folded = _fold(message)
    if code == 3 or "revert" in folded:
        return "reverted"
    if any(m in folded for m in _ALREADY_KNOWN) and "unknowntransaction" not in folded:
        return "already_known"
    if any(m in folded for m in _NONCE_TOO_LOW):
        return "nonce_too_low"
    if any(m in folded for m in _NONCE_TOO_HIGH):
        return "nonce_too_high"
    if any(m in folded for m in _BELOW_BASE_FEE):
        return "below_base_fee"
    if "underpriced" in folded:
        return "underpriced"
    if "insufficientfunds" in folded:
        return "insufficient_funds"
    if code == 429 or any(m in folded for m in _RATE_LIMITED):
        return "rate_limited"
    if method in ("eth_getLogs", "batch") and (code == -32005 or any(m in folded for m in _RANGE_TOO_LARGE)):
        return "range_too_large"
    if code in (-32005, -32603) or any(m in folded for m in _BEHIND):
        return "rate_limited" if code == -32005 else "transport"
    if -32099 <= code <= -32000 and method in _RETRIED_READS:
        return "transport"
    return "permanent"


def node_error(method: str, error: Any) -> RpcError:
    """The exception for a JSON-RPC error object (checked: it comes from outside)."""
    if not isinstance(error, dict):
        return RpcTransportError(f"{method}: malformed error object")
    code, message, data = error.get("code"), error.get("message", ""), error.get("data")
    if not isinstance(code, int) or isinstance(code, bool) or not isinstance(message, str):
        return RpcTransportError(f"{method}: malformed error object")
    message = message[:500]  # an error text is logged and stored: bounded
    kind = node_error_kind(method, code, message)
    if kind == "reverted":
        return Reverted(method, code, message, _revert_bytes(data))
    if kind == "transport":
        return RpcTransportError(f"{method}: {message} (code {code})")
    if kind == "rate_limited":
        return RpcRateLimited(f"{method}: {message} (code {code})")
    if kind == "range_too_large":
        return RpcRangeTooLarge(f"{method}: {message} (code {code})")
    return _REFUSALS.get(kind, RpcCallError)(method, code, message, data if isinstance(data, str) else None, kind)


def _revert_bytes(data: Any) -> bytes:
    if isinstance(data, dict):  # some nodes nest it: {"data": "0x..."}
        data = data.get("data")
    if isinstance(data, str) and data.startswith("0x") and len(data) % 2 == 0:
        try:
            return bytes.fromhex(data[2:])
        except ValueError:
            return b""
    return b""


_SEND_OUTCOMES = {"already_known": "known", "permanent": "refused", "reverted": "refused"}


def classify_send_error(message: str) -> str:
    """What a node's refusal of `eth_sendRawTransaction` means for a sender.

    known: the pool has this exact transaction; nonce_too_low: the nonce is used (by this
    transaction, mined, or by another); nonce_too_high: a gap below it; underpriced: a
    replacement below the pool's bump rule; below_base_fee: max fee under the base fee;
    insufficient_funds; refused: anything else.
    """
    kind = node_error_kind("eth_sendRawTransaction", 0, message)
    if kind in ("rate_limited", "transport", "range_too_large"):
        return "refused"
    return _SEND_OUTCOMES.get(kind, kind)


# ------------------------------------------------------------------ reply validation


def _bad(what: str) -> RpcTransportError:
    return RpcTransportError(f"malformed reply: {what}")


def quantity(value: Any, what: str = "quantity") -> int:
    """A JSON-RPC quantity ("0x" hex, at most 256 bits) as an int."""
    if not isinstance(value, str) or not value.startswith("0x") or not 3 <= len(value) <= 66:
        raise _bad(what)
    try:
        return int(value, 16)
    except ValueError:
        raise _bad(what) from None


def _hex_data(value: Any, size: int | None, what: str) -> str:
    """0x hex of `size` bytes (any even length when None); the digits are checked by whoever decodes."""
    if not isinstance(value, str) or not value.startswith("0x"):
        raise _bad(what)
    if (size is not None and len(value) != 2 + 2 * size) or len(value) % 2:
        raise _bad(what)
    return value


def hash32(value: Any, what: str = "hash") -> str:
    """A 32-byte hash as 0x hex."""
    _hex_data(value, 32, what)
    try:
        int(value, 16)
    except ValueError:
        raise _bad(what) from None
    return str(value)


def header_reply(value: Any) -> dict[str, Any] | None:
    """An `eth_getBlockByNumber` result: None (no such block) or a header whose number,
    hash, parent hash, timestamp and base fee are well-formed."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _bad("header is not an object")
    quantity(value.get("number"), "header number")
    hash32(value.get("hash"), "header hash")
    hash32(value.get("parentHash"), "header parentHash")
    quantity(value.get("timestamp"), "header timestamp")
    if value.get("baseFeePerGas") is not None:
        quantity(value["baseFeePerGas"], "header baseFeePerGas")
    return value


def _quantity_text(value: Any) -> bool:
    return type(value) is str and 3 <= len(value) <= 18 and value[:2] == "0x"


def logs_reply(value: Any) -> list[dict[str, Any]]:
    """An `eth_getLogs` result: a list of logs whose fields have the types and sizes the
    decoder and the store rely on. Hex digits are checked where they are decoded (a log
    that does not decode is reported by the indexer, never stored). On the hot path of the
    backfill, hence `type(...) is` rather than isinstance."""
    if type(value) is not list:
        raise _bad("logs are not a list")
    for entry in value:
        if type(entry) is not dict:
            raise _bad("log is not an object")
        get = entry.get
        if not (
            _quantity_text(get("blockNumber"))
            and _quantity_text(get("logIndex"))
            and _quantity_text(get("transactionIndex"))
        ):
            raise _bad("log quantities")
        block_hash, tx_hash, address, data = get("blockHash"), get("transactionHash"), get("address"), get("data")
        if not (
            type(block_hash) is str
            and len(block_hash) == 66
            and type(tx_hash) is str
            and len(tx_hash) == 66
            and type(address) is str
            and len(address) == 42
            and type(data) is str
            and data[:2] == "0x"
            and not len(data) % 2
        ):
            raise _bad("log hashes, address or data")
        topics = get("topics")
        if type(topics) is not list or len(topics) > 4:
            raise _bad("log topics")
        for topic in topics:
            if type(topic) is not str or len(topic) != 66:
                raise _bad("log topic")
        stamp = get("blockTimestamp")
        if stamp is not None and not _quantity_text(stamp):
            raise _bad("log blockTimestamp")
        if type(get("removed", False)) is not bool:
            raise _bad("log removed")
    return value


def safe_url(url: str) -> str:
    """scheme://host:port of a URL, without path or query (where API keys hide)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")


@dataclass(frozen=True)
class Head:
    """A block header as the senders care about it."""

    number: int
    hash: str
    parent_hash: str
    timestamp: int
    base_fee: int

    @classmethod
    def from_json(cls, block: Any) -> Head:
        """From an `eth_getBlockByNumber` result or a `newHeads` notification (checked)."""
        header = header_reply(block)
        if header is None:
            raise _bad("no header")
        return cls(
            number=int(header["number"], 16),
            hash=str(header["hash"]),
            parent_hash=str(header["parentHash"]),
            timestamp=int(header["timestamp"], 16),
            base_fee=int(header.get("baseFeePerGas") or "0x0", 16),
        )


# ------------------------------------------------------------------------- the client


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


Parse = Callable[[Any], Any]


class RpcClient:
    """A JSON-RPC client over one or more URLs of the same chain.

    `call` and the typed helpers raise; `batch` answers each call with its value or its
    `RpcError` (the senders decide per transaction); `batch_strict` raises the first error
    and retries the whole batch on a transient one (the indexer's windows)."""

    relayer_metrics = False
    """Also count failures into `escrowd_relayer_rpc_errors_total` (the senders' dashboards)."""
    default_attempts = 6
    default_connections = 16

    def __init__(
        self,
        urls: Sequence[str],
        *,
        chain_id: int | None = None,
        timeout: float = 10.0,
        attempts: int | None = None,
        max_backoff: float = 2.0,
        connections: int | None = None,
        max_reply_bytes: int = MAX_REPLY_BYTES,
    ) -> None:
        attempts = self.default_attempts if attempts is None else attempts
        connections = self.default_connections if connections is None else connections
        if not urls:
            raise ValueError("at least one RPC URL is required")
        if attempts < 1:
            raise ValueError("attempts must be at least 1")
        self.endpoints = [EndpointHealth(name=f"rpc{i}", url=url) for i, url in enumerate(urls)]
        self._chain_label = str(chain_id) if chain_id is not None else "?"
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._attempts = attempts
        self._max_backoff = max_backoff
        self._connections = connections
        self._max_reply = max_reply_bytes
        self._session: aiohttp.ClientSession | None = None
        self._ids = itertools.count(1)
        self._preferred = 0

    async def __aenter__(self) -> RpcClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    @property
    def url(self) -> str:
        """The URL preferred now (log it through `safe_url`)."""
        return self.endpoints[self._preferred % len(self.endpoints)].url

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._connections, ttl_dns_cache=300, keepalive_timeout=30),
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

    def _count(self, endpoint: EndpointHealth, label: str, error: RpcError) -> None:
        RPC_ERRORS.labels(self._chain_label, endpoint.name, label, error.kind).inc()
        if self.relayer_metrics:
            RELAYER_RPC_ERRORS.labels(self._chain_label, label, "transient" if error.retryable else "refused").inc()

    async def _post(self, endpoint: EndpointHealth, body: bytes, label: str, logs: bool) -> Any:
        """One HTTP exchange: the decoded JSON reply, its size bounded before parsing."""
        started = time.perf_counter()
        # A reply over the bound is a range to shrink when it holds logs, else a bad reply.
        too_large: type[RpcError] = RpcRangeTooLarge if logs else RpcTransportError
        try:
            async with self._get_session().post(
                endpoint.url, data=body, headers={"Content-Type": "application/json"}, timeout=self._timeout
            ) as response:
                if response.status == 429:
                    raise RpcRateLimited(f"{label}: HTTP 429 from {endpoint.name}")
                if response.status >= 400:
                    raise RpcTransportError(f"{label}: HTTP {response.status} from {endpoint.name}")
                raw = await read_bounded(response, self._max_reply)
                if raw is None:
                    raise too_large(f"{label}: reply over {self._max_reply} bytes from {endpoint.name}")
            try:
                # orjson refuses nesting deeper than 1,024 levels without recursing in C.
                return orjson.loads(raw)
            except orjson.JSONDecodeError:
                raise RpcTransportError(f"{label}: invalid JSON from {endpoint.name}") from None
        except TimeoutError:
            raise RpcTransportError(f"{label}: timeout from {endpoint.name}") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise RpcTransportError(f"{label}: {type(exc).__name__} from {endpoint.name}") from None
        finally:
            RPC_LATENCY.labels(self._chain_label, endpoint.name, label).observe(time.perf_counter() - started)

    async def _exchange(self, body: Any, label: str, parse: Parse, *, logs: bool = False) -> Any:
        """POST `body` and `parse` the reply, retrying transient failures across URLs."""
        try:
            encoded = orjson.dumps(body)
        except TypeError:  # an integer beyond 64 bits in the params: the standard encoder is exact
            encoded = json.dumps(body, separators=(",", ":")).encode()
        for attempt in range(self._attempts):
            endpoint = self._pick(attempt)
            started = time.perf_counter()
            try:
                result = parse(await self._post(endpoint, encoded, label, logs))
            except RpcError as exc:
                self._count(endpoint, label, exc)
                if not exc.retryable:
                    raise
                endpoint.record_failure()
                if attempt + 1 == self._attempts:
                    raise
                if len(self.endpoints) > 1:
                    self._preferred = (self._preferred + 1) % len(self.endpoints)
                log.warning("rpc_retry", endpoint=endpoint.name, method=label, error=str(exc), attempt=attempt)
                backoff = min(self._max_backoff, 0.05 * 2**attempt)
                await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
                continue
            endpoint.record_success(time.perf_counter() - started)
            return result
        raise AssertionError("unreachable")  # pragma: no cover

    async def call(self, method: str, *params: Any) -> Any:
        """One request: its result; RetryableRpcError after the retries, else the node's refusal."""
        return await self._call(method, params, None)

    async def _call(self, method: str, params: Sequence[Any], check: Parse | None) -> Any:
        """One request whose result `check` validates inside the retries (a malformed answer
        from one URL is a transport fault: the next URL is asked)."""
        request_id = next(self._ids)
        body = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": list(params)}

        def parse(reply: Any) -> Any:
            if not isinstance(reply, dict) or reply.get("id") != request_id:
                raise _bad(f"{method}: not the answer to this request")
            if "error" in reply:
                raise node_error(method, reply["error"])
            if "result" not in reply:
                raise _bad(f"{method}: neither result nor error")
            return reply["result"] if check is None else check(reply["result"])

        return await self._exchange(body, method, parse, logs=method == "eth_getLogs")

    def _batch_body(self, calls: Sequence[tuple[str, Sequence[Any]]]) -> tuple[list[dict[str, Any]], list[int], str]:
        ids = [next(self._ids) for _ in calls]
        body = [
            {"jsonrpc": "2.0", "id": i, "method": m, "params": list(p)} for i, (m, p) in zip(ids, calls, strict=True)
        ]
        label = calls[0][0] if len({m for m, _ in calls}) == 1 else "batch"
        return body, ids, label

    @staticmethod
    def _answers(reply: Any, ids: list[int], calls: Sequence[tuple[str, Sequence[Any]]]) -> list[Any]:
        """Each call's result or its `RpcError`, matched by id (a malformed batch raises)."""
        if not isinstance(reply, list):
            if isinstance(reply, dict) and "error" in reply:
                raise node_error("batch", reply["error"])  # some nodes refuse a whole batch at once
            raise _bad("batch reply is not a list")
        wanted = set(ids)
        by_id: dict[int, dict[str, Any]] = {}
        for item in reply:
            if isinstance(item, dict):
                key = item.get("id")
                if isinstance(key, int) and key in wanted:
                    if key in by_id:
                        raise _bad("batch reply answers one request twice")
                    by_id[key] = item
        out: list[Any] = []
        for i, (method, _) in zip(ids, calls, strict=True):
            item = by_id.get(i)
            if item is None:
                out.append(_bad(f"{method}: missing from the batch reply"))
            elif "error" in item:
                out.append(node_error(method, item["error"]))
            elif "result" not in item:
                out.append(_bad(f"{method}: neither result nor error"))
            else:
                out.append(item["result"])
        return out

    async def batch(self, calls: Sequence[tuple[str, Sequence[Any]]]) -> list[Any]:
        """Many requests in one round trip; each result is a value or an `RpcError` instance.

        Only a failure of the whole exchange is retried (and raised after the retries)."""
        if not calls:
            return []
        body, ids, label = self._batch_body(calls)
        logs = any(m == "eth_getLogs" for m, _ in calls)
        result: list[Any] = await self._exchange(body, label, lambda reply: self._answers(reply, ids, calls), logs=logs)
        return result

    async def batch_strict(
        self,
        calls: Sequence[tuple[str, Sequence[Any]]],
        check: Callable[[list[Any]], list[Any]] | None = None,
    ) -> list[Any]:
        """Several requests in one round trip; results in call order. The first error is
        raised; a transient one (or a reply `check` refuses) retries the whole batch."""
        if not calls:
            return []
        body, ids, label = self._batch_body(calls)
        logs = any(m == "eth_getLogs" for m, _ in calls)

        def parse(reply: Any) -> list[Any]:
            results = self._answers(reply, ids, calls)
            for result in results:
                if isinstance(result, RpcError):
                    raise result
            return check(results) if check is not None else results

        result: list[Any] = await self._exchange(body, label, parse, logs=logs)
        return result

    # ------------------------------------------------------------------ typed helpers

    async def chain_id(self) -> int:
        """eth_chainId."""
        result: int = await self._call("eth_chainId", (), lambda v: quantity(v, "chain id"))
        return result

    async def block_number(self) -> int:
        """eth_blockNumber."""
        result: int = await self._call("eth_blockNumber", (), lambda v: quantity(v, "block number"))
        return result

    async def headers(self, numbers: Sequence[int]) -> list[dict[str, Any] | None]:
        """Block headers (no transactions) for `numbers`, in one batch (checked)."""
        return await self.batch_strict(
            [("eth_getBlockByNumber", [hex(n), False]) for n in numbers],
            lambda replies: [header_reply(h) for h in replies],
        )

    async def get_logs(self, addresses: Sequence[str], from_block: int, to_block: int) -> list[dict[str, Any]]:
        """eth_getLogs of the given contracts over an inclusive block range (checked)."""
        (logs,) = await self.batch_strict(
            [("eth_getLogs", [{"address": list(addresses), "fromBlock": hex(from_block), "toBlock": hex(to_block)}])],
            lambda replies: [logs_reply(replies[0])],
        )
        return list(logs)

    async def head(self) -> Head:
        """The latest block header."""
        result: Head = await self._call("eth_getBlockByNumber", ("latest", False), Head.from_json)
        return result

    async def tagged_number(self, tag: str) -> int | None:
        """The number of the block a tag names (`safe`, `finalized`); None when the node names none yet.

        A node without the tag answers with an error (`RpcCallError`).
        """
        header = await self._call("eth_getBlockByNumber", (tag, False), header_reply)
        return None if header is None else quantity(header["number"], "header number")

    async def block_hash(self, number: int) -> str | None:
        """Hash of the canonical block at `number` (None above the head)."""
        header = await self._call("eth_getBlockByNumber", (hex(number), False), header_reply)
        return None if header is None else str(header["hash"])

    async def transaction_count(self, address: str, tag: str = "latest") -> int:
        """eth_getTransactionCount."""
        result: int = await self._call(
            "eth_getTransactionCount", (address, tag), lambda v: quantity(v, "transaction count")
        )
        return result

    async def balance(self, address: str) -> int:
        """eth_getBalance at latest, in wei."""
        result: int = await self._call("eth_getBalance", (address, "latest"), lambda v: quantity(v, "balance"))
        return result

    async def max_priority_fee(self) -> int:
        """eth_maxPriorityFeePerGas (0 when the node does not offer it)."""
        try:
            result: int = await self._call("eth_maxPriorityFeePerGas", (), lambda v: quantity(v, "priority fee"))
            return result
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
        result: bytes = await self._call("eth_call", (tx, block), _call_bytes)
        return result

    async def send_raw(self, raw_hex: str) -> str:
        """eth_sendRawTransaction; the node's refusal comes back as an RpcCallError."""
        result: str = await self._call("eth_sendRawTransaction", (raw_hex,), lambda v: hash32(v, "transaction hash"))
        return result

    async def receipt(self, tx_hash: str) -> dict[str, Any] | None:
        """eth_getTransactionReceipt (None while unknown or not mined)."""
        result: dict[str, Any] | None = await self._call("eth_getTransactionReceipt", (tx_hash,), _receipt)
        return result

    async def revert_data(self, tx_hash: str) -> bytes | None:
        """The revert data of a mined, failed transaction (debug trace; None if unsupported)."""
        try:
            trace = await self.call("debug_traceTransaction", tx_hash, {"tracer": "callTracer"})
        except RpcCallError:
            return None
        if trace is not None and not isinstance(trace, dict):
            raise _bad("trace is not an object")
        return _call_bytes((trace or {}).get("output") or "0x")


def _receipt(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _bad("receipt is not an object")
    return dict(value)


def _call_bytes(value: Any) -> bytes:
    if not isinstance(value, str) or not value.startswith("0x") or len(value) % 2:
        raise _bad("call output")
    try:
        return bytes.fromhex(value[2:])
    except ValueError:
        raise _bad("call output") from None


class EthRpc(RpcClient):
    """The client as the senders build it: the same client, with the senders' defaults
    (fewer attempts, a larger pool) and their error counter as well."""

    relayer_metrics = True
    default_attempts = 5
    default_connections = 64


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
                params = data.get("params")
                if not isinstance(params, dict):
                    raise _bad("newHeads notification")
                yield Head.from_json(params.get("result"))
            elif "error" in data:
                raise RpcTransportError("eth_subscribe refused")


async def sleep_backoff(attempt: int, base: float = 0.2, cap: float = 5.0) -> None:
    """Sleep before reconnecting a long-lived stream (exponential, capped)."""
    await asyncio.sleep(min(cap, base * (2 ** min(attempt, 8))))
