"""A local KMS: the part of AWS KMS's JSON protocol an `aws-kms` signer uses, for the devnet
and the tests.

`CreateKey` (`ECC_SECG_P256K1`, `SIGN_VERIFY`), `GetPublicKey` and `Sign` (`ECDSA_SHA_256`;
`MessageType=DIGEST` signs the 32 bytes as given, `RAW` hashes them with SHA-256 first, as
AWS does). moto's KMS cannot stand in: it ignores `MessageType=DIGEST` and hashes the digest
again, so no Ethereum signature comes out of it. Like AWS, this server returns either half of
s (a coin flip per signature; `--high-s` always the high one), so the client's normalisation is
exercised on every run. Requests are not authenticated: it listens on the loopback only.

Run it as a process (`python -m runtime.services.localkms --port N`), keys seeded from
`$ESCROWD_LOCALKMS_KEYS` (a JSON object, key id → 0x private key: the devnet's public keys);
`LocalKms` starts, stops and restarts one (an outage on demand).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import secrets
import uuid
from typing import Any

from coincurve import PrivateKey

from runtime.services.ports import LoopbackProcess

_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
_SPKI_PREFIX = bytes.fromhex("3056301006072a8648ce3d020106052b8104000a034200")  # id-ecPublicKey, secp256k1
MAX_BODY = 64 * 1024


def spki(key: PrivateKey) -> bytes:
    """The DER SubjectPublicKeyInfo of a secp256k1 key, as `GetPublicKey` returns it."""
    return _SPKI_PREFIX + key.public_key.format(compressed=False)


def der_signature(r: int, s: int) -> bytes:
    """DER `ECDSA-Sig-Value` of (r, s): minimal positive INTEGERs."""

    def integer(value: int) -> bytes:
        body = value.to_bytes((value.bit_length() + 8) // 8, "big")  # a leading zero when the top bit is set
        return b"\x02" + bytes([len(body)]) + body

    content = integer(r) + integer(s)
    return b"\x30" + bytes([len(content)]) + content


class KmsState:
    """The keys and the signing rule of one local KMS."""

    def __init__(self, keys: dict[str, PrivateKey], *, high_s: bool = False) -> None:
        self.keys = keys
        self.high_s = high_s

    def handle(self, target: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON reply) of one request."""
        action = target.removeprefix("TrentService.")
        if action == "CreateKey":
            if body.get("KeySpec") != "ECC_SECG_P256K1" or body.get("KeyUsage") != "SIGN_VERIFY":
                return 400, _error("UnsupportedOperationException", "this KMS holds ECC_SECG_P256K1 SIGN_VERIFY keys only")
            key_id = str(uuid.uuid4())
            self.keys[key_id] = PrivateKey(secrets.token_bytes(32))
            return 200, {"KeyMetadata": {"KeyId": key_id, "KeySpec": "ECC_SECG_P256K1", "KeyUsage": "SIGN_VERIFY",
                                         "Enabled": True, "KeyState": "Enabled"}}
        key_id = str(body.get("KeyId", ""))
        key = self.keys.get(key_id)
        if action not in ("GetPublicKey", "Sign"):
            return 400, _error("UnsupportedOperationException", f"{action[:64]} is not served here")
        if key is None:
            return 400, _error("NotFoundException", "no such key")
        if action == "GetPublicKey":
            return 200, {"KeyId": key_id, "PublicKey": base64.b64encode(spki(key)).decode(), "KeySpec": "ECC_SECG_P256K1",
                         "KeyUsage": "SIGN_VERIFY", "SigningAlgorithms": ["ECDSA_SHA_256"]}
        if body.get("SigningAlgorithm") != "ECDSA_SHA_256":
            return 400, _error("InvalidKeyUsageException", "ECDSA_SHA_256 only")
        try:
            message = base64.b64decode(str(body.get("Message", "")), validate=True)
        except ValueError:
            return 400, _error("ValidationException", "Message is not base64")
        kind = body.get("MessageType", "RAW")
        if kind == "RAW":
            message = hashlib.sha256(message).digest()
        elif kind != "DIGEST" or len(message) != 32:
            return 400, _error("ValidationException", "a DIGEST message is 32 bytes")
        raw = key.sign_recoverable(message, hasher=None)
        r, s = int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:64], "big")
        if self.high_s or secrets.randbits(1):
            s = _N - s
        return 200, {"KeyId": key_id, "Signature": base64.b64encode(der_signature(r, s)).decode(),
                     "SigningAlgorithm": "ECDSA_SHA_256"}


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"__type": kind, "message": message}


def serve(port: int, state: KmsState) -> None:
    """Serve until killed."""
    from aiohttp import web

    async def endpoint(request: web.Request) -> web.Response:
        raw = await request.content.read(MAX_BODY + 1)
        if len(raw) > MAX_BODY:
            return web.json_response(_error("ValidationException", "request too large"), status=413)
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return web.json_response(_error("SerializationException", "not a JSON object"), status=400)
        status, reply = state.handle(request.headers.get("X-Amz-Target", ""), body)
        return web.Response(status=status, text=json.dumps(reply), content_type="application/x-amz-json-1.1")

    app = web.Application(client_max_size=MAX_BODY)
    app.router.add_post("/", endpoint)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


class LocalKms(LoopbackProcess):
    """A local KMS process, its keys seeded (key id -> 0x private key)."""

    module = "runtime.services.localkms"

    def __init__(self, keys: dict[str, str], *, port: int | None = None, high_s: bool = False) -> None:
        super().__init__(port)
        self.keys = dict(keys)
        self.high_s = high_s

    def arguments(self) -> list[str]:
        """`--high-s` when asked for."""
        return ["--high-s"] if self.high_s else []

    def environment(self) -> dict[str, str]:
        """The seeded keys."""
        return {"ESCROWD_LOCALKMS_KEYS": json.dumps(self.keys)}


def main() -> None:
    """`python -m runtime.services.localkms --port N [--high-s]`."""
    parser = argparse.ArgumentParser(description="A local KMS (secp256k1 Sign and GetPublicKey)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--high-s", action="store_true", help="always return the high-s signature")
    args = parser.parse_args()
    seeded = json.loads(os.environ.get("ESCROWD_LOCALKMS_KEYS", "{}"))
    keys = {str(k): PrivateKey(bytes.fromhex(str(v).removeprefix("0x"))) for k, v in seeded.items()}
    serve(args.port, KmsState(keys, high_s=args.high_s))


if __name__ == "__main__":
    main()
