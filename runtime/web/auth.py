"""Request signatures: EIP-712 typed data signed by the acting address, bound to one deployment.

Every authenticated request carries four headers:

    X-Escrowd-Signer      the acting address (0x…)
    X-Escrowd-Nonce       8–100 characters of [A-Za-z0-9_-], never reused by that signer
    X-Escrowd-Expires-At  unix seconds; the signature is refused at or after it, and when
                          it lies more than `max_ttl` seconds ahead
    X-Escrowd-Signature   65-byte r‖s‖v signature (low s), 0x hex

over the EIP-712 message of `schemas.request_auth`:

    EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)
      name "escrowd-api", version "2", chainId + verifyingContract = the deployment's escrow
    Request(string method,string path,bytes32 bodyHash,address signer,string nonce,uint64 expiresAt)

The deployment is the one the request acts on (the `{chain_id}/{escrow}` of a task route,
`chainId`/`escrow` of a terms body; a request naming none, such as an agent's executions,
uses the API's first deployment), and the domain is taken from the API's own configuration
of it (`ApiSettings.deployments`): a request to a deployment this API does not serve is
`404 DEPLOYMENT_UNKNOWN`, and a signature made for another deployment does not verify.

A nonce is spent, in its own transaction, as soon as the signature verifies and before the
request is judged: every authenticated request uses up its nonce whatever its outcome
(accepted, 403, 409...), so a refused request can never be replayed later. Nonces are
remembered until their signature expires; a reuse is `409 NONCE_REPLAYED`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated

import asyncpg
from eth_utils.address import to_checksum_address
from fastapi import Depends, Header, Request

from runtime.web.errors import ApiProblem
from schemas import eip712
from schemas.request_auth import (
    MAX_SIGNED_PATH_CHARS,
    Deployment,
    RequesterProof,
    UnsignedRequest,
    request_digest,
    requester_proof,
    sign_request,
    signed_request_headers,
    typed_request,
)

SIGNER_HEADER = "x-escrowd-signer"
NONCE_HEADER = "x-escrowd-nonce"
EXPIRES_HEADER = "x-escrowd-expires-at"
SIGNATURE_HEADER = "x-escrowd-signature"
AUTH_HEADERS = (SIGNER_HEADER, NONCE_HEADER, EXPIRES_HEADER, SIGNATURE_HEADER)

_NONCE = re.compile(r"^[A-Za-z0-9_-]{8,100}$")
_ADDRESS = re.compile(r"^0x[0-9a-fA-F]{40}$")
_SIGNATURE = re.compile(r"^0x[0-9a-fA-F]{130}$")


@dataclass(frozen=True)
class Caller:
    """An authenticated caller: the signer, the nonce it spent, and its request as signed."""

    address: str
    nonce: str
    expires_at: int
    deployment: Deployment
    proof: RequesterProof


def request_path(request: Request) -> str:
    """The path a client signs: the URL path plus `?query` when there is one."""
    query = request.url.query
    return request.url.path + (f"?{query}" if query else "")


def has_auth(request: Request) -> bool:
    """True when the request carries any of the auth headers."""
    return any(request.headers.get(h) for h in AUTH_HEADERS)


async def verify_signature(request: Request, deployment: Deployment, *, now: int, max_ttl: int) -> Caller:
    """Check the headers and the signature over this request to `deployment` (no database)."""
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
    path = request_path(request)
    if len(path) > MAX_SIGNED_PATH_CHARS:
        # Refused before any hashing: no proof could carry it (a 2 KiB+ query made a 500).
        raise ApiProblem(400, "PATH_TOO_LONG", f"the path with its query may be at most {MAX_SIGNED_PATH_CHARS} characters")
    body = await request.body()
    digest = request_digest(deployment, request.method, path, body, signer, nonce, expires_at)
    try:
        recovered = eip712.recover(digest, signature)
    except eip712.InvalidSignature as exc:
        raise ApiProblem(401, "SIGNATURE_INVALID", f"the signature is not usable: {exc}") from None
    if recovered.lower() != signer.lower():
        raise ApiProblem(
            401, "SIGNATURE_INVALID", "the signature is not the signer's over this request to this deployment"
        )
    address = str(to_checksum_address(signer))
    proof = requester_proof(request.method, path, body, address, nonce, expires_at, signature.lower())
    return Caller(address=address, nonce=nonce, expires_at=expires_at, deployment=deployment, proof=proof)


async def spend_nonce(conn: asyncpg.Connection, caller: Caller) -> None:
    """Record the caller's nonce (committed before the request is judged); a reuse is 409 NONCE_REPLAYED."""
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


__all__ = [
    "AUTH_HEADERS",
    "Caller",
    "Deployment",
    "UnsignedRequest",
    "forget_expired_nonces",
    "has_auth",
    "request_path",
    "sign_request",
    "signed_request_headers",
    "spend_nonce",
    "typed_request",
    "verify_signature",
]


def served_deployment(request: Request, chain_id: int | None = None, escrow: str | None = None) -> Deployment:
    """The served deployment a request acts on: the one it names, else the API's first.

    503 NO_DEPLOYMENT when the API serves none; 404 DEPLOYMENT_UNKNOWN for one it does not serve.
    """
    served: list[Deployment] = request.app.state.settings.served_deployments()
    if not served:
        raise ApiProblem(503, "NO_DEPLOYMENT", "this API is configured with no deployment to serve")
    if chain_id is None or escrow is None:
        return served[0]
    found = next((d for d in served if d.chain_id == chain_id and d.escrow.lower() == escrow.lower()), None)
    if found is None:
        raise ApiProblem(404, "DEPLOYMENT_UNKNOWN", f"this API serves no escrow {escrow} on chain {chain_id}")
    return found


async def authenticate(request: Request, chain_id: int | None = None, escrow: str | None = None) -> Caller:
    """Verify the request's signature for the deployment it acts on, then spend its nonce in a
    transaction of its own, before the request is judged: every authenticated request uses its
    nonce up whatever its outcome, so a refused request can never be replayed later."""
    state = request.app.state
    caller = await verify_signature(
        request,
        served_deployment(request, chain_id, escrow),
        now=int(state.clock()),
        max_ttl=state.settings.signature_max_ttl_seconds,
    )
    async with state.pool.acquire() as conn, conn.transaction():
        await spend_nonce(conn, caller)
    return caller


async def _signature_headers(
    signer: Annotated[str | None, Header(alias="X-Escrowd-Signer", description="Acting address")] = None,
    nonce: Annotated[str | None, Header(alias="X-Escrowd-Nonce", description="Single-use nonce")] = None,
    expires_at: Annotated[str | None, Header(alias="X-Escrowd-Expires-At", description="Unix seconds")] = None,
    signature: Annotated[str | None, Header(alias="X-Escrowd-Signature", description="EIP-712 signature")] = None,
) -> None:
    """Declares the four headers in OpenAPI; :func:`authenticate` reads and checks them."""


Signed = Annotated[None, Depends(_signature_headers)]
"""A route parameter (`_signed: Signed`) that documents the signature headers of a signed route."""
