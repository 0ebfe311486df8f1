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

Pure functions over values: the API (`runtime.web.auth`) and the consumer
(`verification.request_auth`) hold the I/O.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from typing import Any

from eth_utils.address import to_checksum_address
from eth_utils.crypto import keccak
from pydantic import BaseModel, ConfigDict, Field

REQUEST_DOMAIN_NAME = "escrowd-api"
REQUEST_DOMAIN_VERSION = "2"
SERVICE_DOMAIN_NAME = "escrowd-api-service"
SERVICE_DOMAIN_VERSION = "1"

SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141

_DOMAIN_FIELDS = [
    {"name": "name", "type": "string"},
    {"name": "version", "type": "string"},
    {"name": "chainId", "type": "uint256"},
    {"name": "verifyingContract", "type": "address"},
]
REQUEST_TYPES: dict[str, list[dict[str, str]]] = {
    "EIP712Domain": _DOMAIN_FIELDS,
    "Request": [
        {"name": "method", "type": "string"},
        {"name": "path", "type": "string"},
        {"name": "bodyHash", "type": "bytes32"},
        {"name": "signer", "type": "address"},
        {"name": "nonce", "type": "string"},
        {"name": "expiresAt", "type": "uint64"},
    ],
}
SERVICE_TYPES: dict[str, list[dict[str, str]]] = {
    "EIP712Domain": _DOMAIN_FIELDS,
    "ServiceRequest": [
        {"name": "requestId", "type": "string"},
        {"name": "payloadHash", "type": "bytes32"},
    ],
}

NONCE_PATTERN = r"^[A-Za-z0-9_-]{8,100}$"
ADDRESS_PATTERN = r"^0x[0-9a-fA-F]{40}$"
SIGNATURE_PATTERN = r"^0x[0-9a-fA-F]{130}$"
_SIGNATURE = re.compile(SIGNATURE_PATTERN)


class BadSignature(ValueError):
    """The signature is malformed, not canonical (high s), or recovers no key."""


@dataclass(frozen=True)
class Deployment:
    """One escrow on one chain: what a signature is bound to."""

    chain_id: int
    escrow: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "escrow", str(to_checksum_address(self.escrow)))


def request_domain(deployment: Deployment) -> dict[str, Any]:
    """The EIP-712 domain of requests to `deployment`."""
    return {
        "name": REQUEST_DOMAIN_NAME,
        "version": REQUEST_DOMAIN_VERSION,
        "chainId": deployment.chain_id,
        "verifyingContract": deployment.escrow,
    }


def typed_request(
    deployment: Deployment, method: str, path: str, body: bytes, signer: str, nonce: str, expires_at: int
) -> dict[str, Any]:
    """The full EIP-712 message a client signs for one request to `deployment`."""
    return {
        "types": REQUEST_TYPES,
        "primaryType": "Request",
        "domain": request_domain(deployment),
        "message": {
            "method": method.upper(),
            "path": path,
            "bodyHash": bytes(keccak(body)),
            "signer": to_checksum_address(signer),
            "nonce": nonce,
            "expiresAt": expires_at,
        },
    }


def request_digest(
    deployment: Deployment, method: str, path: str, body: bytes, signer: str, nonce: str, expires_at: int
) -> bytes:
    """The 32-byte EIP-712 digest of one request (what the key signs)."""
    typed = typed_request(deployment, method, path, body, signer, nonce, expires_at)
    return _typed_digest(typed)


def typed_service_request(deployment: Deployment, request_id: str, payload_hash: bytes) -> dict[str, Any]:
    """The EIP-712 message the API service key signs for one relayed request."""
    return {
        "types": SERVICE_TYPES,
        "primaryType": "ServiceRequest",
        "domain": {
            "name": SERVICE_DOMAIN_NAME,
            "version": SERVICE_DOMAIN_VERSION,
            "chainId": deployment.chain_id,
            "verifyingContract": deployment.escrow,
        },
        "message": {"requestId": request_id, "payloadHash": payload_hash},
    }


def service_digest(deployment: Deployment, request_id: str, payload_hash: bytes) -> bytes:
    """The 32-byte EIP-712 digest the API service key signs."""
    typed = typed_service_request(deployment, request_id, payload_hash)
    return _typed_digest(typed)


def sign_digest(private_key: str, digest: bytes) -> str:
    """65-byte r‖s‖v (v = 27/28, low s) signature of a digest, 0x hex."""
    from eth_account import Account

    signed = Account.unsafe_sign_hash(digest, private_key)
    return "0x" + bytes(signed.signature).hex()


def recover_digest_signer(digest: bytes, signature: str) -> str:
    """The checksummed address that signed `digest`; BadSignature for any non-canonical form.

    Only v = 27/28, 0 < r < n and 0 < s <= n/2 are accepted: the high-s twin of a valid
    signature is refused (EIP-2), so a signature has exactly one accepted encoding.
    """
    if not isinstance(signature, str) or not _SIGNATURE.match(signature):
        raise BadSignature("a signature is 65 bytes of 0x hex")
    raw = bytes.fromhex(signature[2:])
    r = int.from_bytes(raw[:32], "big")
    s = int.from_bytes(raw[32:64], "big")
    if raw[64] not in (27, 28):
        raise BadSignature("v must be 27 or 28")
    if not (0 < r < SECP256K1_N) or not (0 < s <= SECP256K1_N // 2):
        raise BadSignature("r or s out of range (or s not canonical)")
    try:
        from eth_account import Account

        return str(Account._recover_hash(digest, signature=raw))
    except Exception:
        raise BadSignature("the signature does not recover a key") from None


def sign_request(
    private_key: str,
    method: str,
    path: str,
    body: bytes = b"",
    *,
    deployment: Deployment,
    expires_at: int,
    nonce: str | None = None,
) -> dict[str, str]:
    """Client side: the four auth headers for one request to `deployment` (SDKs, tests, scripts)."""
    import secrets

    from eth_account import Account

    account = Account.from_key(private_key)
    nonce = nonce or secrets.token_urlsafe(16)
    digest = request_digest(deployment, method, path, body, account.address, nonce, expires_at)
    return {
        "X-Escrowd-Signer": account.address,
        "X-Escrowd-Nonce": nonce,
        "X-Escrowd-Expires-At": str(expires_at),
        "X-Escrowd-Signature": sign_digest(private_key, digest),
    }


# ---------------------------------------------------------------------------- proofs on Kafka


class RequesterProof(BaseModel):
    """The requester's signed HTTP request, relayed so the consumer can verify it again."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: str = Field(pattern=r"^[A-Z]{3,7}$")
    path: str = Field(max_length=2048)
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


def _typed_digest(typed: dict[str, Any]) -> bytes:
    # eth-account is imported on use: the request models (this module) are read by light
    # paths such as `escrowd verify auto`, which never sign.
    from eth_account.messages import _hash_eip191_message, encode_typed_data

    return bytes(_hash_eip191_message(encode_typed_data(full_message=typed)))
