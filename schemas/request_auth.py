"""Signed requests: the EIP-712 typed data a client signs, and the proofs a request message carries.

One deployment = one escrow contract on one chain. Every signature is bound to it through
the EIP-712 domain, so a request signed for one deployment is refused by every other:

    EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)
      name "escrowd-api", version "2", verifyingContract = the escrow
    Request(string method,string path,bytes32 bodyHash,address signer,string nonce,uint64 expiresAt)

The client signs the request it sends (`path` with its query string, `bodyHash` = keccak256
of the raw body bytes). The API relays finalize, review and verifier-report requests to the
verification consumer over Kafka with a `RequesterProof` (the same signed fields plus the
raw body), so the consumer re-verifies the requester's own signature. A deployment may also
give its API a service key: the API then adds a `ServiceProof`, its signature over

    EIP712Domain(...)  name "escrowd-api-service", version "1", chainId, verifyingContract = the escrow
    ServiceRequest(string requestId,bytes32 payloadHash)

where `payloadHash` is keccak256 of the RFC 8785 canonical JSON of the message without its
proofs. The consumer trusts only the service addresses it is configured with.

The typed data, signing and recovery are `schemas.eip712`'s (one canonical signature
encoding: v 27/28, low s). Pure functions over values: the API (`runtime.web.auth`) and the consumer
(`verification.request_auth`) hold the I/O.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any

from eth_utils.crypto import keccak
from pydantic import BaseModel, ConfigDict, Field

from schemas import eip712

REQUEST_DOMAIN_NAME = "escrowd-api"
REQUEST_DOMAIN_VERSION = "2"
SERVICE_DOMAIN_NAME = "escrowd-api-service"
SERVICE_DOMAIN_VERSION = "1"

REQUEST_STRUCT = eip712.Struct.parse(
    "Request(string method,string path,bytes32 bodyHash,address signer,string nonce,uint64 expiresAt)"
)
SERVICE_STRUCT = eip712.Struct.parse("ServiceRequest(string requestId,bytes32 payloadHash)")

NONCE_PATTERN = r"^[A-Za-z0-9_-]{8,100}$"
ADDRESS_PATTERN = r"^0x[0-9a-fA-F]{40}$"
SIGNATURE_PATTERN = r"^0x[0-9a-fA-F]{130}$"


@dataclass(frozen=True)
class Deployment:
    """One escrow on one chain: what a signature is bound to."""

    chain_id: int
    escrow: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "escrow", eip712.checksum_address(self.escrow))


def request_domain(deployment: Deployment) -> eip712.Domain:
    """The EIP-712 domain of requests to `deployment`."""
    return eip712.domain(REQUEST_DOMAIN_NAME, REQUEST_DOMAIN_VERSION, deployment.chain_id, deployment.escrow)


def service_domain(deployment: Deployment) -> eip712.Domain:
    """The EIP-712 domain of the API service key's proofs for `deployment`."""
    return eip712.domain(SERVICE_DOMAIN_NAME, SERVICE_DOMAIN_VERSION, deployment.chain_id, deployment.escrow)


def request_message(method: str, path: str, body: bytes, signer: str, nonce: str, expires_at: int) -> dict[str, Any]:
    """The signed fields of one request, as the typed data's `message`."""
    return {
        "method": method.upper(),
        "path": path,
        "bodyHash": bytes(keccak(body)),
        "signer": eip712.checksum_address(signer),
        "nonce": nonce,
        "expiresAt": expires_at,
    }


def typed_request(
    deployment: Deployment, method: str, path: str, body: bytes, signer: str, nonce: str, expires_at: int
) -> dict[str, Any]:
    """The full EIP-712 message a client signs for one request to `deployment`."""
    message = request_message(method, path, body, signer, nonce, expires_at)
    return eip712.typed_data(request_domain(deployment), REQUEST_STRUCT, message)


def request_digest(
    deployment: Deployment, method: str, path: str, body: bytes, signer: str, nonce: str, expires_at: int
) -> bytes:
    """The 32-byte EIP-712 digest of one request (what the key signs)."""
    message = request_message(method, path, body, signer, nonce, expires_at)
    return eip712.digest(request_domain(deployment), REQUEST_STRUCT, message)


def typed_service_request(deployment: Deployment, request_id: str, payload_hash: bytes) -> dict[str, Any]:
    """The EIP-712 message the API service key signs for one relayed request."""
    message = {"requestId": request_id, "payloadHash": payload_hash}
    return eip712.typed_data(service_domain(deployment), SERVICE_STRUCT, message)


def service_digest(deployment: Deployment, request_id: str, payload_hash: bytes) -> bytes:
    """The 32-byte EIP-712 digest the API service key signs."""
    message = {"requestId": request_id, "payloadHash": payload_hash}
    return eip712.digest(service_domain(deployment), SERVICE_STRUCT, message)


@dataclass(frozen=True)
class UnsignedRequest:
    """One request to `deployment` before its signature: what the four auth headers cover.

    `nonce` None: a fresh random one is drawn each time the request is signed."""

    method: str
    path: str
    body: bytes = b""
    _: KW_ONLY
    deployment: Deployment
    expires_at: int
    nonce: str | None = None

    def typed_data(self, signer: str, nonce: str) -> dict[str, Any]:
        """The EIP-712 message `signer` signs for this request under `nonce`."""
        return typed_request(self.deployment, self.method, self.path, self.body, signer, nonce, self.expires_at)

    def digest(self, signer: str, nonce: str) -> bytes:
        """The 32-byte EIP-712 digest of this request signed by `signer` under `nonce`."""
        return request_digest(self.deployment, self.method, self.path, self.body, signer, nonce, self.expires_at)


def sign_request(private_key: str, request: UnsignedRequest) -> dict[str, str]:
    """Client side: the four auth headers for `request` (SDKs, tests, scripts)."""
    signer = eip712.signer_address(private_key)
    nonce = request.nonce or _nonce()
    signature = eip712.sign(request.digest(signer, nonce), private_key)
    return _auth_headers(signer, nonce, request.expires_at, signature)


RequestSigner = Callable[[Mapping[str, Any], bytes], Awaitable[str]]
"""`(typed_data, digest) -> 0x signature`: a key held elsewhere (`chain.signers.Signer.sign_typed_data`)."""


async def signed_request_headers(signer: str, sign: RequestSigner, request: UnsignedRequest) -> dict[str, str]:
    """`sign_request` for a key this process does not hold: `sign` makes the signature of the
    request's typed data for `signer` (its address); whatever it raises is raised."""
    signer = eip712.checksum_address(signer)
    nonce = request.nonce or _nonce()
    signature = await sign(request.typed_data(signer, nonce), request.digest(signer, nonce))
    return _auth_headers(signer, nonce, request.expires_at, signature)


def _nonce() -> str:
    import secrets

    return secrets.token_urlsafe(16)


def _auth_headers(signer: str, nonce: str, expires_at: int, signature: str) -> dict[str, str]:
    return {
        "X-Escrowd-Signer": signer,
        "X-Escrowd-Nonce": nonce,
        "X-Escrowd-Expires-At": str(expires_at),
        "X-Escrowd-Signature": signature,
    }


# ---------------------------------------------------------------------------- proofs on Kafka


MAX_SIGNED_PATH_CHARS = 2048
"""Longest request path with its query a signature may cover: a proof carries it on Kafka."""


class RequesterProof(BaseModel):
    """The requester's signed HTTP request, relayed so the consumer can verify it again."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: str = Field(pattern=r"^[A-Z]{3,7}$")
    path: str = Field(max_length=MAX_SIGNED_PATH_CHARS)
    body: str = Field(description="The raw request body, base64")
    signer: str = Field(pattern=ADDRESS_PATTERN)
    nonce: str = Field(pattern=NONCE_PATTERN)
    expires_at: int = Field(ge=0, lt=2**64)
    signature: str = Field(pattern=SIGNATURE_PATTERN)

    def raw_body(self) -> bytes:
        """The body bytes the requester signed (ValueError when not base64)."""
        return base64.b64decode(self.body, validate=True)

    def digest(self, deployment: Deployment) -> bytes:
        """The EIP-712 digest of the relayed request for `deployment`."""
        return request_digest(
            deployment, self.method, self.path, self.raw_body(), self.signer, self.nonce, self.expires_at
        )


class ServiceProof(BaseModel):
    """The API service key's signature over a relayed request message."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    signer: str = Field(pattern=ADDRESS_PATTERN)
    signature: str = Field(pattern=SIGNATURE_PATTERN)


def requester_proof(
    method: str, path: str, body: bytes, signer: str, nonce: str, expires_at: int, signature: str
) -> RequesterProof:
    """The proof of an HTTP request whose signature the API has checked."""
    return RequesterProof(
        method=method.upper(),
        path=path,
        body=base64.b64encode(body).decode("ascii"),
        signer=signer,
        nonce=nonce,
        expires_at=expires_at,
        signature=signature,
    )
