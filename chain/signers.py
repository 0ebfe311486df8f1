"""Signers: the one way every key of the system signs, whatever holds the key.

A `Signer` signs an EIP-1559 transaction (`chain.txs.UnsignedTx`), signs EIP-712 typed data
(the digest from `schemas.eip712`, the document for a signer that wants to show it) and says
its address. Three kinds, chosen per key in configuration (`SignerSpec`):

- `keystore`: the key in this process (`chain.keys`: an encrypted keystore or, on a devnet,
  a raw key);
- `aws-kms`: an AWS KMS `ECC_SECG_P256K1` key. The key never leaves KMS: `Sign` with
  `MessageType=DIGEST` over the keccak digest returns a DER signature; r and s are parsed
  strictly, s is folded into the low half (EIP-2) and the recovery id is the one that
  recovers the public key `GetPublicKey` gave at start;
- `remote`: a JSON-RPC signer process (`eth_signTransaction`, `eth_signTypedData_v4`, the
  interface of the common self-hosted signers). Its replies are hostile bytes: bounded,
  parsed strictly, and only (y, r, s) is taken from them; the transaction is assembled here
  from our own fields and must recover to the configured address.

The address is derived once, when the signer is opened (`open_signer`), and every signature
is checked to recover to it before it is used: a signer that answers for another key, or not
at all, raises `SignerError` (never key material in the message). Callers fail closed on it
(nothing is sent) and never fall back to another key; `SIGNER_FAILURES` and `SIGNER_UP` are
the alert's metrics. Signing over the network is slow: callers sign before they open a
database transaction, never inside one.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal, Protocol

import aiohttp
from coincurve import PublicKey
from prometheus_client import Counter, Gauge
from pydantic import BaseModel, ConfigDict, Field, model_validator

from chain.keys import SecretKey
from chain.txs import SignedTx, UnsignedTx, signature_of
from runtime.httpbody import read_bounded
from schemas import eip712, jsonbounds

SignerKind = Literal["keystore", "aws-kms", "remote"]
SIGNER_KINDS: tuple[SignerKind, ...] = ("keystore", "aws-kms", "remote")

MAX_REPLY_BYTES = 256 * 1024  # a remote signer's reply: a signed transaction, bounded by its calldata
_N = eip712.SECP256K1_N
_HALF_N = eip712.HALF_N

SIGNER_FAILURES = Counter(
    "escrowd_signer_failures_total",
    "Signing requests that failed (signer unreachable, refused, or answered for another key)",
    ["key", "kind"],
)
SIGNER_UP = Gauge(
    "escrowd_signer_up", "1 when the key's signer answered its last request, 0 when it failed", ["key", "kind"]
)


class SignerError(Exception):
    """The signer could not sign (unreachable, refused, wrong key); nothing was signed.

    The message names the signer kind and what failed, never key material or a password.
    """


class Signer(Protocol):
    """One key, wherever it is held."""

    kind: SignerKind
    address: str  # checksummed, derived once when the signer was opened

    async def sign_transaction(self, tx: UnsignedTx) -> SignedTx:
        """The signed transaction; SignerError when the signer cannot sign it."""
        ...

    async def sign_typed_data(self, typed_data: Mapping[str, Any], digest: bytes) -> str:
        """The canonical 0x signature (r || s || v, low s, v 27/28) of an EIP-712 message:
        `digest` is `schemas.eip712.digest` of the document `typed_data`."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...


# ---------------------------------------------------------------------------- pure pieces


def low_s(y_parity: int, r: int, s: int) -> tuple[int, int, int]:
    """(y, r, s) with s in the low half (EIP-2): a high s is replaced by n - s, parity flipped."""
    if not (0 < r < _N and 0 < s < _N) or y_parity not in (0, 1):
        raise SignerError("signature out of range")
    if s > _HALF_N:
        return 1 - y_parity, r, _N - s
    return y_parity, r, s


def recovered_address(digest: bytes, y_parity: int, r: int, s: int) -> str | None:
    """The address that (y, r, s) recovers over `digest`, or None when no key does."""
    try:
        public = PublicKey.from_signature_and_message(
            r.to_bytes(32, "big") + s.to_bytes(32, "big") + bytes([y_parity]), digest, hasher=None
        )
    except Exception:  # coincurve raises ValueError or its own errors for a bad point
        return None
    return eip712.address_of(public)


def with_recovery_id(digest: bytes, r: int, s: int, address: str) -> tuple[int, int, int]:
    """(y, r, s), low s, with the parity that recovers `address`: a KMS signature carries no
    recovery id. SignerError when neither parity does (the signer used another key)."""
    _, r, s = low_s(0, r, s)
    for y in (0, 1):
        if recovered_address(digest, y, r, s) == address:
            return y, r, s
    raise SignerError("the signature does not recover to the key's address")


def parse_der_signature(der: bytes) -> tuple[int, int]:
    """(r, s) of a DER `ECDSA-Sig-Value` (KMS's encoding), strictly: one SEQUENCE of two
    positive minimal INTEGERs of at most 33 bytes, spanning the input exactly."""

    def integer(at: int) -> tuple[int, int]:
        if at + 2 > len(der) or der[at] != 0x02:
            raise SignerError("DER signature: INTEGER expected")
        size = der[at + 1]
        body = der[at + 2 : at + 2 + size]
        if not 0 < size <= 33 or len(body) != size:
            raise SignerError("DER signature: bad INTEGER length")
        if body[0] & 0x80 or (size > 1 and body[0] == 0 and not body[1] & 0x80):
            raise SignerError("DER signature: negative or non-minimal INTEGER")
        return int.from_bytes(body, "big"), at + 2 + size

    if len(der) < 8 or len(der) > 72 or der[0] != 0x30 or der[1] != len(der) - 2:
        raise SignerError("DER signature: not one SEQUENCE")
    r, at = integer(2)
    s, at = integer(at)
    if at != len(der):
        raise SignerError("DER signature: trailing bytes")
    return r, s


def address_of_spki(der: bytes) -> str:
    """The address of a DER SubjectPublicKeyInfo holding a secp256k1 key (KMS `GetPublicKey`)."""
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        PublicFormat,
        load_der_public_key,
    )

    try:
        public = load_der_public_key(der)
    except ValueError:
        raise SignerError("GetPublicKey: not a DER public key") from None
    if not isinstance(public, ec.EllipticCurvePublicKey) or not isinstance(public.curve, ec.SECP256K1):
        raise SignerError("GetPublicKey: not a secp256k1 key (need key spec ECC_SECG_P256K1)")
    point = public.public_bytes(Encoding.X962, PublicFormat.UncompressedPoint)
    return eip712.address_of(PublicKey(point))


# ---------------------------------------------------------------------------- digest signers


class _DigestSigner:
    """A signer that signs 32-byte digests: transactions and typed data are built here."""

    kind: SignerKind
    address: str

    async def _sign_digest(self, digest: bytes) -> tuple[int, int, int]:
        raise NotImplementedError

    async def sign_transaction(self, tx: UnsignedTx) -> SignedTx:
        """Sign `tx.digest()` and assemble the raw transaction."""
        return tx.assemble(*await self._sign_digest(tx.digest()))

    async def sign_typed_data(self, typed_data: Mapping[str, Any], digest: bytes) -> str:
        """Sign the EIP-712 digest."""
        return eip712.signature_hex(*await self._sign_digest(digest))

    async def aclose(self) -> None:
        """Nothing to release."""


class KeystoreSigner(_DigestSigner):
    """A key held in this process (`chain.keys.SecretKey`)."""

    kind: SignerKind = "keystore"

    def __init__(self, key: SecretKey) -> None:
        self._key = key
        self.address = key.address

    async def _sign_digest(self, digest: bytes) -> tuple[int, int, int]:
        return self._key.sign_digest(digest)

    def __repr__(self) -> str:
        return f"KeystoreSigner(address={self.address})"


class KmsSigner(_DigestSigner):
    """An AWS KMS `ECC_SECG_P256K1` key through boto3 (its calls run in a worker thread)."""

    kind: SignerKind = "aws-kms"

    def __init__(self, client: Any, key_id: str, address: str) -> None:
        self._client = client
        self._key_id = key_id
        self.address = address

    @classmethod
    async def open(
        cls, key_id: str, *, region: str | None, endpoint_url: str | None, request_timeout: float
    ) -> KmsSigner:
        """Create the client and derive the address from `GetPublicKey`, once."""
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise SignerError("the aws-kms signer needs boto3: pip install 'escrowd[kms]'") from None
        config = Config(connect_timeout=request_timeout, read_timeout=request_timeout, retries={"max_attempts": 2, "mode": "standard"})
        client = boto3.client("kms", region_name=region, endpoint_url=endpoint_url, config=config)
        reply = await cls._call(client, "get_public_key", KeyId=key_id)
        spec = reply.get("KeySpec") or reply.get("CustomerMasterKeySpec")
        if spec is not None and spec != "ECC_SECG_P256K1":
            raise SignerError(f"KMS key spec is {str(spec)[:32]}, need ECC_SECG_P256K1")
        if reply.get("KeyUsage", "SIGN_VERIFY") != "SIGN_VERIFY":
            raise SignerError("KMS key usage is not SIGN_VERIFY")
        public = reply.get("PublicKey")
        if not isinstance(public, bytes) or len(public) > 1024:
            raise SignerError("GetPublicKey: no public key in the reply")
        return cls(client, key_id, address_of_spki(public))

    @staticmethod
    async def _call(client: Any, method: str, **params: Any) -> dict[str, Any]:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            reply = await asyncio.to_thread(getattr(client, method), **params)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", "error"))[:64]
            raise SignerError(f"KMS {method} refused: {code}") from None
        except BotoCoreError as exc:
            raise SignerError(f"KMS {method} failed: {type(exc).__name__}") from None
        if not isinstance(reply, dict):
            raise SignerError(f"KMS {method}: malformed reply")
        return reply

    async def _sign_digest(self, digest: bytes) -> tuple[int, int, int]:
        reply = await self._call(
            self._client, "sign", KeyId=self._key_id, Message=digest, MessageType="DIGEST",
            SigningAlgorithm="ECDSA_SHA_256",
        )
        der = reply.get("Signature")
        if not isinstance(der, bytes):
            raise SignerError("KMS sign: no signature in the reply")
        r, s = parse_der_signature(der)
        return with_recovery_id(digest, r, s, self.address)

    async def aclose(self) -> None:
        """Close the client's connection pool."""
        close = getattr(self._client, "close", None)
        if close is not None:
            await asyncio.to_thread(close)

    def __repr__(self) -> str:
        return f"KmsSigner(address={self.address})"


# ---------------------------------------------------------------------------- remote signer


class RemoteSigner:
    """A JSON-RPC signer process (`eth_signTransaction`, `eth_signTypedData_v4`)."""

    kind: SignerKind = "remote"

    def __init__(self, url: str, address: str, timeout: float) -> None:
        self._url = url
        self.address = eip712.checksum_address(address)
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None
        self._ids = 0

    @classmethod
    async def open(cls, url: str, address: str, *, request_timeout: float) -> RemoteSigner:
        """Connect and check that the signer holds `address` (`eth_accounts`)."""
        signer = cls(url, address, request_timeout)
        try:
            accounts = await signer._rpc("eth_accounts", [])
        except BaseException:
            await signer.aclose()  # its HTTP session: the caller never gets the signer to close
            raise
        if not isinstance(accounts, list) or signer.address.lower() not in {str(a).lower() for a in accounts[:1024]}:
            await signer.aclose()
            raise SignerError(f"the remote signer does not hold {signer.address}")
        return signer

    async def _rpc(self, method: str, params: list[Any]) -> Any:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        # Each call keeps its own id: concurrent calls (a batch's verdicts signed at once) move the
        # counter while this one awaits its reply.
        self._ids += 1
        request_id = self._ids
        body = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        try:
            async with self._session.post(self._url, json=body) as response:
                if response.status != 200:
                    raise SignerError(f"remote signer {method}: HTTP {response.status}")
                raw = await read_bounded(response, MAX_REPLY_BYTES)  # a long transaction's reply comes in pieces
                if raw is None:
                    raise SignerError(f"remote signer {method}: reply too large")
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise SignerError(f"remote signer {method} failed: {type(exc).__name__}") from None
        try:
            # The bounded decoder: a reply nested 100,000 deep overflowed the C stack (SIGSEGV)
            # or raised RecursionError, which no caller's fail-closed handling expects.
            reply = jsonbounds.loads(raw, max_bytes=MAX_REPLY_BYTES)
        except ValueError:
            raise SignerError(f"remote signer {method}: reply is not JSON") from None
        reply_id = reply.get("id") if isinstance(reply, dict) else None
        # `true == 1` in Python: the id must be the integer we sent, not a bool that equals it.
        if not isinstance(reply, dict) or type(reply_id) is not int or reply_id != request_id:
            raise SignerError(f"remote signer {method}: not a JSON-RPC reply")
        if "error" in reply:
            error = reply["error"]
            code = error.get("code") if isinstance(error, dict) else None
            raise SignerError(f"remote signer {method} refused (code {code if isinstance(code, int) else '?'})")
        return reply.get("result")

    async def sign_transaction(self, tx: UnsignedTx) -> SignedTx:
        """Ask for a signature; assemble the transaction from our own fields and its (y, r, s)."""
        request = {
            "from": self.address, "to": eip712.checksum_address(tx.to), "gas": hex(tx.gas_limit),
            "maxFeePerGas": hex(tx.fees.max_fee_per_gas), "maxPriorityFeePerGas": hex(tx.fees.max_priority_fee_per_gas),
            "nonce": hex(tx.nonce), "value": hex(tx.value), "data": "0x" + tx.data.hex(), "input": "0x" + tx.data.hex(),
            "chainId": hex(tx.chain_id), "type": "0x2",
        }
        result = await self._rpc("eth_signTransaction", [request])
        raw_hex = result.get("raw") if isinstance(result, dict) else result  # geth and clef wrap it
        if not isinstance(raw_hex, str) or not raw_hex.startswith("0x"):
            raise SignerError("remote signer eth_signTransaction: no raw transaction")
        try:
            y, r, s = signature_of(bytes.fromhex(raw_hex[2:]))
        except ValueError:
            raise SignerError("remote signer eth_signTransaction: malformed transaction") from None
        y, r, s = low_s(y, r, s)
        if recovered_address(tx.digest(), y, r, s) != self.address:
            raise SignerError("remote signer eth_signTransaction: signature is not over our transaction by our key")
        return tx.assemble(y, r, s)

    async def sign_typed_data(self, typed_data: Mapping[str, Any], digest: bytes) -> str:
        """Ask for an EIP-712 signature; check it recovers to our address over our digest."""
        result = await self._rpc("eth_signTypedData_v4", [self.address, json.dumps(dict(typed_data))])
        if not isinstance(result, str) or len(result) != 132 or not result.startswith("0x"):
            raise SignerError("remote signer eth_signTypedData_v4: not a 65-byte signature")
        try:
            raw = bytes.fromhex(result[2:])
        except ValueError:
            raise SignerError("remote signer eth_signTypedData_v4: not hex") from None
        v = raw[64] - 27 if raw[64] >= 27 else raw[64]
        y, r, s = low_s(v, int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:64], "big"))
        if recovered_address(digest, y, r, s) != self.address:
            raise SignerError("remote signer eth_signTypedData_v4: signature does not recover to our key")
        return eip712.signature_hex(y, r, s)

    async def aclose(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    def __repr__(self) -> str:
        return f"RemoteSigner(address={self.address})"


# ---------------------------------------------------------------------------- configuration


class SignerSpec(BaseModel):
    """Which signer holds one key: a service's `*_signer` setting (a YAML mapping, or JSON in
    its `ESCROWD_*` variable). The keystore kind reads the service's own key settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: SignerKind = Field(default="keystore", description="keystore, aws-kms or remote")
    kms_key_id: str | None = Field(default=None, max_length=2048, description="aws-kms: key id, ARN or alias")
    kms_region: str | None = Field(default=None, max_length=64, description="aws-kms: region (default us-east-1)")
    kms_endpoint_url: str | None = Field(
        default=None, max_length=2048, description="aws-kms: a KMS-compatible endpoint instead of AWS's own"
    )
    remote_url: str | None = Field(default=None, max_length=2048, description="remote: the signer's JSON-RPC URL")
    address: str | None = Field(
        default=None, description="The key's address: required for remote, checked at start for aws-kms"
    )
    timeout: float = Field(default=10.0, gt=0, le=120, description="Seconds one signing request may take")

    @model_validator(mode="after")
    def _complete(self) -> SignerSpec:
        if self.address is not None:
            object.__setattr__(self, "address", eip712.checksum_address(self.address))
        if self.kind == "aws-kms" and not self.kms_key_id:
            raise ValueError("the aws-kms signer needs kms_key_id")
        if self.kind == "remote" and (not self.remote_url or not self.address):
            raise ValueError("the remote signer needs remote_url and address")
        return self


class Metered:
    """A signer whose every request updates `SIGNER_FAILURES` and `SIGNER_UP` for its key."""

    def __init__(self, inner: Signer, role: str) -> None:
        self._inner = inner
        self.kind: SignerKind = inner.kind
        self.address = inner.address
        self._labels = (role, inner.kind)
        SIGNER_UP.labels(*self._labels).set(1)
        SIGNER_FAILURES.labels(*self._labels)  # at 0 from the start: the alert's increase() sees the first one

    async def _metered(self, call: Awaitable[Any]) -> Any:
        try:
            result = await call
        except SignerError:
            SIGNER_FAILURES.labels(*self._labels).inc()
            SIGNER_UP.labels(*self._labels).set(0)
            raise
        SIGNER_UP.labels(*self._labels).set(1)
        return result

    async def sign_transaction(self, tx: UnsignedTx) -> SignedTx:
        """The inner signer's, metered."""
        result: SignedTx = await self._metered(self._inner.sign_transaction(tx))
        return result

    async def sign_typed_data(self, typed_data: Mapping[str, Any], digest: bytes) -> str:
        """The inner signer's, metered."""
        result: str = await self._metered(self._inner.sign_typed_data(typed_data, digest))
        return result

    async def aclose(self) -> None:
        """Close the inner signer."""
        await self._inner.aclose()

    def __repr__(self) -> str:
        return f"{type(self._inner).__name__}(address={self.address})"


async def open_signer(spec: SignerSpec, role: str, load_key: Callable[[], SecretKey]) -> Signer:
    """Open the key's signer and derive its address, once (`load_key`: the keystore kind's
    key, read only for that kind). SignerError when it cannot answer or holds another key."""
    inner: Signer
    if spec.kind == "keystore":
        inner = KeystoreSigner(load_key())
    elif spec.kind == "aws-kms":
        assert spec.kms_key_id is not None  # the model's validator
        inner = await KmsSigner.open(
            spec.kms_key_id, region=spec.kms_region or "us-east-1", endpoint_url=spec.kms_endpoint_url,
            request_timeout=spec.timeout,
        )
    elif spec.kind == "remote":
        assert spec.remote_url is not None and spec.address is not None
        inner = await RemoteSigner.open(spec.remote_url, spec.address, request_timeout=spec.timeout)
    else:
        raise SignerError(f"unknown signer kind {spec.kind!r}")
    if spec.address is not None and spec.address != inner.address:
        await inner.aclose()
        raise SignerError(f"the {spec.kind} signer holds {inner.address}, not the configured {spec.address}")
    return Metered(inner, role)

