"""Request signatures: EIP-712 typed data signed by the acting address, with expiry and nonce.

Every authenticated request carries four headers:

    X-Escrowd-Signer      the acting address (0x…)
    X-Escrowd-Nonce       8–100 characters of [A-Za-z0-9_-], never reused by that signer
    X-Escrowd-Expires-At  unix seconds; the signature is refused at or after it, and when
                          it lies more than `max_ttl` seconds ahead
    X-Escrowd-Signature   65-byte r‖s‖v signature, 0x hex

over the EIP-712 message

    EIP712Domain(string name,string version)          name "escrowd-api", version "1"
    Request(string method,string path,bytes32 bodyHash,address signer,string nonce,uint64 expiresAt)

where `path` is the request path with its query string and `bodyHash` is keccak256 of the
raw body bytes (of the empty string for a GET). A nonce is remembered until its signature
expires, so a captured request cannot be replayed: the second use is `409 NONCE_REPLAYED`.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import Any

import asyncpg
from eth_account import Account
from eth_account.messages import encode_typed_data
from eth_utils.address import to_checksum_address
from eth_utils.crypto import keccak
from fastapi import Request

from relayer.api.errors import ApiProblem

SIGNER_HEADER = "x-escrowd-signer"
NONCE_HEADER = "x-escrowd-nonce"
EXPIRES_HEADER = "x-escrowd-expires-at"
SIGNATURE_HEADER = "x-escrowd-signature"
AUTH_HEADERS = (SIGNER_HEADER, NONCE_HEADER, EXPIRES_HEADER, SIGNATURE_HEADER)

DOMAIN = {"name": "escrowd-api", "version": "1"}
_TYPES = {
    "EIP712Domain": [{"name": "name", "type": "string"}, {"name": "version", "type": "string"}],
    "Request": [
        {"name": "method", "type": "string"},
        {"name": "path", "type": "string"},
        {"name": "bodyHash", "type": "bytes32"},
        {"name": "signer", "type": "address"},
        {"name": "nonce", "type": "string"},
        {"name": "expiresAt", "type": "uint64"},
    ],
}
_NONCE = re.compile(r"^[A-Za-z0-9_-]{8,100}$")
_ADDRESS = re.compile(r"^0x[0-9a-fA-F]{40}$")
_SIGNATURE = re.compile(r"^0x[0-9a-fA-F]{130}$")


@dataclass(frozen=True)
class Caller:
    """An authenticated caller: the signer, and the nonce it spent on this request."""

    address: str
    nonce: str
    expires_at: int


def typed_request(method: str, path: str, body: bytes, signer: str, nonce: str, expires_at: int) -> dict[str, Any]:
    """The full EIP-712 message a client signs for one request."""
    return {
        "types": _TYPES,
        "primaryType": "Request",
        "domain": DOMAIN,
        "message": {
            "method": method.upper(),
            "path": path,
            "bodyHash": bytes(keccak(body)),
            "signer": to_checksum_address(signer),
            "nonce": nonce,
            "expiresAt": expires_at,
        },
    }


def sign_request(
    private_key: str,
    method: str,
    path: str,
    body: bytes = b"",
    *,
    expires_at: int,
    nonce: str | None = None,
) -> dict[str, str]:
    """Client side: the four auth headers for one request (for SDKs, tests and scripts)."""
    account = Account.from_key(private_key)
    nonce = nonce or secrets.token_urlsafe(16)
    message = encode_typed_data(full_message=typed_request(method, path, body, account.address, nonce, expires_at))
    signed = account.sign_message(message)
    return {
        "X-Escrowd-Signer": account.address,
        "X-Escrowd-Nonce": nonce,
        "X-Escrowd-Expires-At": str(expires_at),
        "X-Escrowd-Signature": "0x" + bytes(signed.signature).hex(),
    }


def request_path(request: Request) -> str:
    """The path a client signs: the URL path plus `?query` when there is one."""
    query = request.url.query
    return request.url.path + (f"?{query}" if query else "")


def has_auth(request: Request) -> bool:
    """True when the request carries any of the auth headers."""
    return any(request.headers.get(h) for h in AUTH_HEADERS)


async def verify_signature(request: Request, *, now: int, max_ttl: int) -> Caller:
    """Check the headers and the signature over this request (no database: see `spend_nonce`)."""
    values = {h: request.headers.get(h) for h in AUTH_HEADERS}
    missing = [h for h, v in values.items() if not v]
    if missing:
        raise ApiProblem(401, "AUTH_REQUIRED", f"signed request headers missing: {', '.join(missing)}")
    signer = str(values[SIGNER_HEADER])
    nonce = str(values[NONCE_HEADER])
    signature = str(values[SIGNATURE_HEADER])
    if not _ADDRESS.match(signer):
        raise ApiProblem(401, "SIGNATURE_INVALID", "X-Escrowd-Signer is not an address")
    if not _NONCE.match(nonce):
        raise ApiProblem(401, "SIGNATURE_INVALID", "X-Escrowd-Nonce must be 8-100 characters of [A-Za-z0-9_-]")
    if not _SIGNATURE.match(signature):
        raise ApiProblem(401, "SIGNATURE_INVALID", "X-Escrowd-Signature must be 65 bytes of 0x hex")
    try:
        expires_at = int(str(values[EXPIRES_HEADER]))
    except ValueError:
        raise ApiProblem(401, "SIGNATURE_INVALID", "X-Escrowd-Expires-At must be unix seconds") from None
    if expires_at <= now:
        raise ApiProblem(401, "SIGNATURE_EXPIRED", "the signature has expired")
    if expires_at > now + max_ttl:
        raise ApiProblem(401, "SIGNATURE_EXPIRY_TOO_FAR", f"X-Escrowd-Expires-At may be at most {max_ttl} s ahead")
    body = await request.body()
    message = encode_typed_data(
        full_message=typed_request(request.method, request_path(request), body, signer, nonce, expires_at)
    )
    try:
        recovered = Account.recover_message(message, signature=bytes.fromhex(signature[2:]))
    except Exception:
        raise ApiProblem(401, "SIGNATURE_INVALID", "the signature does not recover a key") from None
    if str(recovered).lower() != signer.lower():
        raise ApiProblem(401, "SIGNATURE_INVALID", "the signature is not the signer's over this request")
    return Caller(address=str(to_checksum_address(signer)), nonce=nonce, expires_at=expires_at)


async def spend_nonce(conn: asyncpg.Connection, caller: Caller) -> None:
    """Record the caller's nonce (inside the request's transaction); a reuse is 409 NONCE_REPLAYED."""
    inserted = await conn.fetchval(
        "INSERT INTO api_nonces (signer, nonce, expires_at) VALUES ($1, $2, to_timestamp($3))"
        " ON CONFLICT DO NOTHING RETURNING 1",
        caller.address.lower(),
        caller.nonce,
        caller.expires_at,
    )
    if inserted is None:
        raise ApiProblem(409, "NONCE_REPLAYED", "this nonce was already used by this signer")


async def forget_expired_nonces(conn: asyncpg.Connection) -> int:
    """Delete nonces whose signatures have expired (they can no longer be replayed anyway)."""
    status = await conn.execute("DELETE FROM api_nonces WHERE expires_at < now() - interval '1 minute'")
    return int(status.split()[-1])
