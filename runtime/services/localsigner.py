"""A local remote signer, for the devnet (`escrowd run --signer remote`) and the tests: the
JSON-RPC methods `eth_accounts`, `eth_signTransaction` and `eth_signTypedData_v4`, as the
common self-hosted signers serve them, signing with eth_account (an implementation
independent of `chain.signers`, so the tests cross-check the two). Loopback only, no auth.

`python -m runtime.services.localsigner --port N` with the key in `$REMOTE_SIGNER_KEY`;
`--mode wrong-key` signs with another key, `--mode high-s` returns high-s signatures,
`--mode deep-reply` answers every signing call with a result nested 100,000 levels deep (a
hostile signer's reply, under the reply's size bound).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from eth_account import Account
from eth_account.messages import encode_typed_data

from runtime.services.ports import LoopbackProcess

N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141


def _tx_dict(request: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": 2,
        "chainId": int(request["chainId"], 16),
        "nonce": int(request["nonce"], 16),
        "to": request["to"],
        "value": int(request["value"], 16),
        "gas": int(request["gas"], 16),
        "maxFeePerGas": int(request["maxFeePerGas"], 16),
        "maxPriorityFeePerGas": int(request["maxPriorityFeePerGas"], 16),
        "data": request["data"],
        "accessList": [],
    }


def handle(account: Any, signing: Any, mode: str, method: str, params: list[Any]) -> Any:
    """The result of one call (signing: the account that really signs)."""
    if method == "eth_accounts":
        return [account.address]
    if method == "eth_signTransaction":
        signed = signing.sign_transaction(_tx_dict(params[0]))
        return {"raw": "0x" + bytes(signed.raw_transaction).hex(), "tx": params[0]}
    if method == "eth_signTypedData_v4":
        document = json.loads(params[1])
        signed = signing.sign_message(encode_typed_data(full_message=document))
        r, s, v = signed.r, signed.s, signed.v
        if mode == "high-s":
            s, v = N - s, 55 - v  # the other half of s, the other parity (27 <-> 28)
        return "0x" + (r.to_bytes(32, "big") + s.to_bytes(32, "big") + bytes([v])).hex()
    raise KeyError(method)


def serve(port: int, key: str, mode: str) -> None:
    """Serve until killed."""
    from aiohttp import web

    account = Account.from_key(key)
    signing = Account.create() if mode == "wrong-key" else account

    async def endpoint(request: web.Request) -> web.Response:
        body = await request.json()
        if mode == "deep-reply" and body["method"] != "eth_accounts":
            deep = "[" * 100_000 + "]" * 100_000
            return web.Response(text=f'{{"jsonrpc": "2.0", "id": {int(body["id"])}, "result": {deep}}}',
                                content_type="application/json")
        try:
            result = handle(account, signing, mode, body["method"], body.get("params", []))
        except KeyError:
            return web.json_response({"jsonrpc": "2.0", "id": body.get("id"), "error": {"code": -32601, "message": "no"}})
        return web.json_response({"jsonrpc": "2.0", "id": body.get("id"), "result": result})

    app = web.Application()
    app.router.add_post("/", endpoint)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


class RemoteSignerProcess(LoopbackProcess):
    """The signer as a process (stop it for an outage, start it again on the same port)."""

    module = "runtime.services.localsigner"

    def __init__(self, key: str, *, mode: str = "honest", port: int | None = None) -> None:
        super().__init__(port)
        self.key = key
        self.mode = mode

    def arguments(self) -> list[str]:
        """The signing mode."""
        return ["--mode", self.mode]

    def environment(self) -> dict[str, str]:
        """The key, never in argv."""
        return {"REMOTE_SIGNER_KEY": self.key}


def main() -> None:
    """`python -m runtime.services.localsigner --port N [--mode ...]`."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", default="honest", choices=["honest", "wrong-key", "high-s", "deep-reply"])
    args = parser.parse_args()
    serve(args.port, os.environ["REMOTE_SIGNER_KEY"], args.mode)


if __name__ == "__main__":
    main()
