"""The one JSON-RPC client against anvil (refusals as a real node words them) and against a
hostile node (a local HTTP server answering what no honest node would)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
import pytest
from aiohttp import web
from eth_account import Account

from chain.abi import decode_revert, encode_call, selector
from chain.fees import Fees
from chain.keys import SecretKey
from chain.rpc import (
    RELAYER_RPC_ERRORS,
    RPC_ERRORS,
    AlreadyKnown,
    EthRpc,
    NonceTooLow,
    Reverted,
    RpcClient,
    RpcRangeTooLarge,
    RpcRateLimited,
    RpcTransportError,
    Underpriced,
)
from chain.txs import sign_eip1559
from escrowd.devnet import Devnet
from runtime.services.ports import free_port

Handler = Callable[[Any], web.StreamResponse | Any]


class HostileNode:
    """An HTTP server whose reply to each request is whatever `answer(request_json)` says:
    a JSON value (sent as is) or a ready aiohttp response."""

    def __init__(self, answer: Handler) -> None:
        self.answer = answer
        self.requests = 0
        self.port = free_port()
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        reply = self.answer(json.loads(await request.read()))  # exact integers, unlike orjson
        if isinstance(reply, web.StreamResponse):
            return reply
        if callable(reply):
            result: web.StreamResponse = await reply(request)
            return result
        return web.Response(body=orjson.dumps(reply), content_type="application/json")

    async def __aenter__(self) -> HostileNode:
        app = web.Application()
        app.router.add_post("/", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


@pytest.fixture
async def client(devnet: Devnet) -> AsyncIterator[EthRpc]:
    rpc = EthRpc([devnet.rpc_url], chain_id=devnet.chain_id)
    yield rpc
    await rpc.close()


def _sign(devnet: Devnet, nonce: int, fees: Fees, data: bytes = b"") -> str:
    key = SecretKey(bytes.fromhex(devnet.spare[0].private_key.removeprefix("0x")))
    signed = sign_eip1559(
        key, chain_id=devnet.chain_id, nonce=nonce, to=devnet.escrow_address, data=data, gas_limit=100_000, fees=fees
    )
    return signed.raw_hex


# -- a real node's refusals -------------------------------------------------------------


async def test_anvil_refusals_come_back_as_their_kinds(devnet: Devnet, client: EthRpc) -> None:
    """Same transaction twice, a replacement at the same fee, a used nonce: one class each."""
    sender = devnet.spare[0].address
    assert Account.from_key(devnet.spare[0].private_key).address == sender
    await client.call("evm_setAutomine", False)
    head = await client.head()
    fees = Fees(max_fee_per_gas=4 * head.base_fee + 10**9, max_priority_fee_per_gas=10**9)
    nonce = await client.transaction_count(sender, "pending")
    first = _sign(devnet, nonce, fees)
    tx_hash = await client.send_raw(first)
    with pytest.raises(AlreadyKnown) as known:
        await client.send_raw(first)
    assert known.value.kind == "already_known"
    with pytest.raises(Underpriced) as underpriced:
        await client.send_raw(_sign(devnet, nonce, fees, data=b"\x01"))
    assert underpriced.value.kind == "underpriced"
    await client.call("evm_mine")
    await client.call("evm_setAutomine", True)
    receipt = await client.receipt(tx_hash)
    assert receipt is not None and receipt["transactionHash"] == tx_hash
    with pytest.raises(NonceTooLow) as low:
        await client.send_raw(_sign(devnet, nonce, fees, data=b"\x02"))
    assert low.value.kind == "nonce_too_low"


async def test_a_reverted_call_carries_the_escrow_error(devnet: Devnet, client: EthRpc) -> None:
    """eth_call of a refused escrow call: Reverted, its data decoded by the one ABI codec."""
    data = encode_call("raiseDispute", 10**9)
    with pytest.raises(Reverted) as reverted:
        await client.eth_call(devnet.escrow_address, data, sender=devnet.spare[0].address)
    assert reverted.value.kind == "reverted"
    assert decode_revert(reverted.value.revert_data).name not in ("Reverted", "Unknown", "Malformed")
    assert data[:4] == selector("raiseDispute")


async def test_batches_answer_per_call_or_raise_the_first_error(devnet: Devnet, client: EthRpc) -> None:
    """`batch` hands each call its value or its error; `batch_strict` raises it."""
    calls: list[tuple[str, list[Any]]] = [
        ("eth_chainId", []),
        ("eth_call", [{"to": devnet.escrow_address, "data": "0x" + encode_call("raiseDispute", 10**9).hex()}, "latest"]),
    ]
    chain_id, refused = await client.batch(calls)
    assert int(chain_id, 16) == devnet.chain_id and isinstance(refused, Reverted)
    with pytest.raises(Reverted):
        await client.batch_strict(calls)
    assert await client.batch([]) == []


async def test_failover_past_a_dead_url(devnet: Devnet) -> None:
    """A dead first URL: the call is answered by the second and the first is marked."""
    rpc = RpcClient([f"http://127.0.0.1:{free_port()}", devnet.rpc_url], chain_id=devnet.chain_id, timeout=2)
    try:
        assert await rpc.chain_id() == devnet.chain_id
        assert rpc.endpoints[0].failures == 1 and rpc.endpoints[1].failures == 0
        assert rpc.url == devnet.rpc_url  # preferred from now on
    finally:
        await rpc.close()


# -- a hostile node ---------------------------------------------------------------------


def _result(value: Any) -> Handler:
    return lambda request: {"jsonrpc": "2.0", "id": request["id"], "result": value}


async def test_a_reply_to_another_request_is_not_taken(devnet: Devnet) -> None:
    """A reply whose id is not ours is a transport fault: the honest URL answers instead."""
    async with HostileNode(lambda request: {"jsonrpc": "2.0", "id": 999_999, "result": "0x1"}) as node:
        rpc = RpcClient([node.url, devnet.rpc_url], chain_id=devnet.chain_id)
        try:
            assert await rpc.chain_id() == devnet.chain_id
        finally:
            await rpc.close()
        assert node.requests == 1


@pytest.mark.parametrize(
    "answer",
    [
        lambda request: {"jsonrpc": "2.0", "id": request["id"], "error": {"code": "x", "message": 5}},
        lambda request: {"jsonrpc": "2.0", "id": request["id"]},
        lambda request: [1, 2, 3],
        lambda request: web.Response(body=b"[" * 5000 + b"]" * 5000, content_type="application/json"),
        lambda request: web.Response(body=b"not json", content_type="application/json"),
        _result({"number": 1, "hash": "0x", "parentHash": None, "timestamp": []}),
    ],
)
async def test_malformed_replies_are_transport_faults(answer: Handler) -> None:
    """Malformed error objects, missing results, deep nesting, garbage, a wrong-typed header:
    retried, then raised as RpcTransportError; nothing else escapes."""
    async with HostileNode(answer) as node:
        rpc = RpcClient([node.url], chain_id=1, attempts=2, max_backoff=0.01)
        try:
            with pytest.raises(RpcTransportError):
                await rpc.head()
        finally:
            await rpc.close()
        assert node.requests == 2


async def test_replies_over_the_size_bound_are_refused_before_parsing() -> None:
    """With or without a Content-Length: logs over the bound ask for a smaller range, anything
    else is a transport fault."""
    big = orjson.dumps({"jsonrpc": "2.0", "id": 1, "result": ["0x" + "00" * 1000] * 100})

    def sized(request: Any) -> web.Response:
        return web.Response(body=big, content_type="application/json")

    def chunked(request: Any) -> Any:
        async def send(http: web.Request) -> web.StreamResponse:
            response = web.StreamResponse()
            response.enable_chunked_encoding()
            await response.prepare(http)
            for i in range(0, len(big), 4096):
                await response.write(big[i : i + 4096])
            await response.write_eof()
            return response

        return send

    for answer in (sized, chunked):
        async with HostileNode(answer) as node:
            rpc = RpcClient([node.url], chain_id=1, attempts=1, max_reply_bytes=50_000)
            try:
                with pytest.raises(RpcRangeTooLarge):
                    await rpc.get_logs(["0x" + "11" * 20], 1, 2)
                with pytest.raises(RpcTransportError):
                    await rpc.call("eth_chainId")
            finally:
                await rpc.close()


async def test_rate_limits_are_retried_and_counted_for_the_senders() -> None:
    """HTTP 429 is rate_limited: retried, then raised; the senders' counter sees it, the
    indexer's counter sees it per endpoint."""
    async with HostileNode(lambda request: web.Response(status=429, text="slow down")) as node:
        rpc = EthRpc([node.url], chain_id=424242, attempts=3, max_backoff=0.01)
        try:
            with pytest.raises(RpcRateLimited):
                await rpc.call("eth_blockNumber")
        finally:
            await rpc.close()
        assert node.requests == 3
    per_endpoint = RPC_ERRORS.labels("424242", "rpc0", "eth_blockNumber", "rate_limited")._value.get()
    senders = RELAYER_RPC_ERRORS.labels("424242", "eth_blockNumber", "transient")._value.get()
    assert per_endpoint == 3 and senders == 3


async def test_a_whole_batch_refused_at_once() -> None:
    """Some nodes answer a batch with one error object: the lenient batch raises it too."""
    async with HostileNode(lambda request: {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "batch too large"}}) as node:
        rpc = RpcClient([node.url], chain_id=1, attempts=1)
        try:
            with pytest.raises(Exception) as refused:
                await rpc.batch([("eth_chainId", []), ("eth_blockNumber", [])])
            assert refused.value.__class__.__name__ == "RpcCallError"
        finally:
            await rpc.close()


async def test_many_concurrent_calls_share_the_pool(devnet: Devnet, client: EthRpc) -> None:
    """Hundreds of concurrent calls each get their own answer (ids never cross)."""
    numbers = await asyncio.gather(*(client.call("eth_getBlockByNumber", hex(0), False) for _ in range(200)))
    assert {n["number"] for n in numbers} == {"0x0"}


async def test_params_beyond_64_bits_are_sent_exactly() -> None:
    """orjson refuses integers over 64 bits; the request still goes out, exact."""
    seen: list[Any] = []

    def answer(request: Any) -> Any:
        seen.append(request["params"])
        return {"jsonrpc": "2.0", "id": request["id"], "result": "0x1"}

    async with HostileNode(answer) as node:
        rpc = RpcClient([node.url], chain_id=1, attempts=1)
        try:
            assert await rpc.call("custom_method", 2**200 + 1) == "0x1"
        finally:
            await rpc.close()
    assert seen == [[2**200 + 1]]
