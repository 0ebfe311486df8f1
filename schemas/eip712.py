"""EIP-712 typed data: the one encoder, signer and recoverer of every signature the project uses.

Verdicts (`schemas.verdict`), proofs (`schemas.proof`), panel attestations and rulings
(`schemas.panels`), API request signatures and the service proofs of relayed requests
(`schemas.request_auth`) are all a `Struct` hashed under a `Domain` here, signed with `sign`
and checked with `recover`. Their vectors are committed in `schemas/vectors/eip712.json`
(written by `escrowd schemas export`) and pinned against eth_account by the tests.

Every domain of the project has the same four fields, so a signature is bound to one chain
and one contract (the escrow):

    EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)

A struct is declared by its EIP-712 type string, e.g. `Ruling(uint256 chainId,...)`, with
atomic member types only (`uint8`..`uint256`, `address`, `bool`, `bytes1`..`bytes32`,
`bytes`, `string`). Values are strict: integers are `int` (never `bool`) within the type's
range, `bool` is `bool`, addresses are 0x + 40 hex digits, fixed bytes are `bytes` of the
exact length or 0x hex of it, `bytes` is `bytes` or 0x hex, strings are `str`.

Signatures are 65 bytes `r || s || v` in exactly one accepted encoding: `v` is 27 or 28
(never the bare recovery id 0/1), `0 < r < n` and `0 < s <= n/2` (EIP-2's low s; the
high-s twin of a valid signature is refused). One signature therefore has one byte string,
so nothing keyed on signature bytes (deduplication, logs, audit) can be sidestepped by
re-encoding. `sign` produces that encoding (RFC 6979, as eth_account does, so both give
the same bytes for the same key and digest).

Pure, no project imports; coincurve does the curve arithmetic (about a hundred times
faster than eth_account's generic encoder on the verdict path).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Generic, Protocol, TypeVar

from coincurve import PrivateKey, PublicKey
from eth_hash.auto import keccak as _keccak256
from eth_utils.address import to_checksum_address
from eth_utils.crypto import keccak

SECP256K1_N: Final = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
HALF_N: Final = SECP256K1_N // 2

DOMAIN_TYPE: Final = "EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)"
DOMAIN_FIELDS: Final = (
    ("name", "string"),
    ("version", "string"),
    ("chainId", "uint256"),
    ("verifyingContract", "address"),
)
_DOMAIN_TYPEHASH: Final = keccak(text=DOMAIN_TYPE)

_ADDRESS = re.compile(r"^0x[0-9a-fA-F]{40}$")
_SIGNATURE = re.compile(r"^0x[0-9a-fA-F]{130}$")
_TYPE_STRING = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\(([^()]*)\)$")
_MEMBER = re.compile(r"^([a-z0-9]+) ([A-Za-z_][A-Za-z0-9_]*)$")
_UINT = re.compile(r"^uint([0-9]{1,3})$")
_FIXED_BYTES = re.compile(r"^bytes([0-9]{1,2})$")


class InvalidSignature(ValueError):
    """The signature is malformed, not in its one canonical encoding, or recovers no key."""


def checksum_address(value: str) -> str:
    """EIP-55 form of a 0x address; ValueError for anything else."""
    if not isinstance(value, str) or not _ADDRESS.match(value):
        raise ValueError("must be a 0x-prefixed 20-byte hex address")
    return _checksum(value.lower())


@functools.lru_cache(maxsize=1024)
def _checksum(lower: str) -> str:
    # Cached (bounded): the same few escrows and signers are in nearly every message a
    # service checks, and EIP-55 costs a keccak and a 40-step loop each time (a third of the
    # relayer's CPU per verdict before this cache).
    return str(to_checksum_address(lower))


# ---------------------------------------------------------------------------- encoding


def _uint_encoder(bits: int) -> Callable[[Any], bytes]:
    bound = 1 << bits

    def encode(value: Any) -> bytes:
        if type(value) is not int or not 0 <= value < bound:
            raise ValueError(f"must be an integer in [0, 2**{bits})")
        return value.to_bytes(32, "big")

    return encode


def _hex_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str) and value[:2] == "0x" and len(value) % 2 == 0:
        try:
            raw = bytes.fromhex(value[2:])
        except ValueError:
            raise ValueError("must be bytes or 0x hex") from None
        # fromhex skips whitespace: a text with any has fewer bytes than digits / 2.
        if 2 * len(raw) + 2 == len(value):
            return raw
    raise ValueError("must be bytes or 0x hex")


def _fixed_bytes_encoder(size: int) -> Callable[[Any], bytes]:
    def encode(value: Any) -> bytes:
        raw = _hex_bytes(value)
        if len(raw) != size:
            raise ValueError(f"must be exactly {size} bytes")
        return raw + bytes(32 - size)

    return encode


def _encode_address(value: Any) -> bytes:
    if isinstance(value, str) and len(value) == 42:
        try:
            return bytes(12) + _hex_bytes(value)
        except ValueError:
            pass
    raise ValueError("must be a 0x-prefixed 20-byte hex address")


def _encode_bool(value: Any) -> bytes:
    if type(value) is not bool:
        raise ValueError("must be a boolean")
    return bytes(31) + (b"\x01" if value else b"\x00")


def _encode_string(value: Any) -> bytes:
    if not isinstance(value, str):
        raise ValueError("must be a string")
    try:
        return bytes(keccak(value.encode("utf-8")))
    except UnicodeEncodeError:
        raise ValueError("must not hold a lone surrogate") from None


def _encode_dynamic_bytes(value: Any) -> bytes:
    return bytes(keccak(_hex_bytes(value)))


def _encoder(type_name: str) -> Callable[[Any], bytes]:
    """The 32-byte `encodeData` word of one atomic member type."""
    if type_name == "address":
        return _encode_address
    if type_name == "bool":
        return _encode_bool
    if type_name == "string":
        return _encode_string
    if type_name == "bytes":
        return _encode_dynamic_bytes
    uint = _UINT.match(type_name)
    if uint is not None and 8 <= int(uint.group(1)) <= 256 and int(uint.group(1)) % 8 == 0:
        return _uint_encoder(int(uint.group(1)))
    fixed = _FIXED_BYTES.match(type_name)
    if fixed is not None and 1 <= int(fixed.group(1)) <= 32:
        return _fixed_bytes_encoder(int(fixed.group(1)))
    raise ValueError(f"unsupported EIP-712 member type {type_name!r}")


def _json_value(value: Any) -> Any:
    """A member value as JSON for a wallet (bytes as 0x hex, everything else as it is)."""
    if isinstance(value, bytes):
        return "0x" + value.hex()
    return value


@dataclass(frozen=True)
class Struct:
    """One EIP-712 struct type of atomic members, declared by its type string."""

    name: str
    fields: tuple[tuple[str, str], ...]
    typehash: bytes = field(init=False, repr=False, compare=False)
    _encoders: tuple[tuple[str, Callable[[Any], bytes]], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.fields or self.name == "EIP712Domain":
            raise ValueError("a struct has at least one member and is not the domain")
        names = [name for name, _ in self.fields]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name} declares a member twice")
        object.__setattr__(self, "typehash", bytes(keccak(text=self.encode_type)))
        object.__setattr__(self, "_encoders", tuple((name, _encoder(kind)) for name, kind in self.fields))

    @classmethod
    def parse(cls, type_string: str) -> Struct:
        """The struct of a type string such as `Ruling(uint256 chainId,uint16 agentShareBps)`."""
        match = _TYPE_STRING.match(type_string)
        if match is None:
            raise ValueError(f"not an EIP-712 type string: {type_string!r}")
        members = []
        for member in match.group(2).split(","):
            parsed = _MEMBER.match(member)
            if parsed is None:
                raise ValueError(f"not a member declaration: {member!r}")
            members.append((parsed.group(2), parsed.group(1)))
        return cls(match.group(1), tuple(members))

    @property
    def encode_type(self) -> str:
        """`encodeType`: `Name(type1 name1,type2 name2,...)`."""
        return f"{self.name}({','.join(f'{kind} {name}' for name, kind in self.fields)})"

    def hash(self, message: Mapping[str, Any]) -> bytes:
        """`hashStruct(message)`; ValueError naming the member for a missing, extra or bad value."""
        try:
            if len(message) == len(self._encoders):
                # eth_hash directly: eth_utils' `keccak` converts its argument first (bytes here).
                return _keccak256(self.typehash + b"".join([encode(message[name]) for name, encode in self._encoders]))
        except (KeyError, ValueError):
            pass
        raise self._refusal(message)

    def _refusal(self, message: Mapping[str, Any]) -> ValueError:
        """The first thing wrong with `message` (the slow path of `hash`, for its error)."""
        for name, encode in self._encoders:
            if name not in message:
                return ValueError(f"{self.name}.{name} is missing")
            try:
                encode(message[name])
            except ValueError as exc:
                return ValueError(f"{self.name}.{name} {exc}")
        extra = sorted(set(message) - {name for name, _ in self.fields})
        return ValueError(f"{self.name} has no member {extra[0]!r}")

    def types_json(self) -> list[dict[str, str]]:
        """The member list of this struct as a typed-data document's `types` holds it."""
        return [{"name": name, "type": kind} for name, kind in self.fields]

    def message_of(self, source: Any, **attributes: str) -> dict[str, Any]:
        """The message of `source`: member `evidenceHash` from its attribute `evidence_hash`
        (camelCase to snake_case), or from the attribute `attributes` names for it."""
        return {name: getattr(source, attributes.get(name) or _snake(name)) for name, _ in self.fields}


@functools.lru_cache(maxsize=256)
def _snake(name: str) -> str:
    # Cached: a regex substitution per member per message was a third of a verdict digest.
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


@dataclass(frozen=True)
class Domain:
    """An EIP-712 domain: a name and version of one kind of signature, bound to a chain and a contract."""

    name: str
    version: str
    chain_id: int
    verifying_contract: str
    separator: bytes = field(init=False, repr=False, compare=False)
    """`hashStruct(EIP712Domain)`, computed once."""

    def __post_init__(self) -> None:
        if type(self.chain_id) is not int or not 0 < self.chain_id < 2**256:
            raise ValueError("chainId must be an integer in [1, 2**256)")
        contract = checksum_address(self.verifying_contract)
        object.__setattr__(self, "verifying_contract", contract)
        words = (
            _DOMAIN_TYPEHASH
            + keccak(text=self.name)
            + keccak(text=self.version)
            + self.chain_id.to_bytes(32, "big")
            + bytes(12)
            + bytes.fromhex(contract[2:])
        )
        object.__setattr__(self, "separator", bytes(keccak(words)))

    def as_json(self) -> dict[str, Any]:
        """The domain as a typed-data document's `domain` holds it."""
        return {
            "name": self.name,
            "version": self.version,
            "chainId": self.chain_id,
            "verifyingContract": self.verifying_contract,
        }


@functools.lru_cache(maxsize=4096)
def domain(name: str, version: str, chain_id: int, verifying_contract: str) -> Domain:
    """The `Domain` of these four fields, cached (a service signs under a few domains, often)."""
    return Domain(name, version, chain_id, verifying_contract)


def digest(domain: Domain, struct: Struct, message: Mapping[str, Any]) -> bytes:
    """The 32 bytes that are signed: `keccak(0x19 0x01 || domainSeparator || hashStruct(message))`."""
    return _keccak256(b"\x19\x01" + domain.separator + struct.hash(message))


def typed_data(domain: Domain, struct: Struct, message: Mapping[str, Any]) -> dict[str, Any]:
    """The full typed-data document (`eth_signTypedData_v4`) of one message, JSON-ready."""
    struct.hash(message)  # the same strict checks as signing: no document for a bad value
    return {
        "types": {
            "EIP712Domain": [{"name": name, "type": kind} for name, kind in DOMAIN_FIELDS],
            struct.name: struct.types_json(),
        },
        "primaryType": struct.name,
        "domain": domain.as_json(),
        "message": {name: _json_value(message[name]) for name, _ in struct.fields},
    }


class Bound(Protocol):
    """A model signed under a domain bound to its chain and escrow."""

    @property
    def chain_id(self) -> int: ...

    @property
    def escrow(self) -> str: ...


M = TypeVar("M", bound=Bound)


@dataclass(frozen=True)
class Signing(Generic[M]):
    """One kind of signed model: its domain's name and version, its struct, and where the
    struct's members are read on the model (`Struct.message_of`; `attributes` renames)."""

    domain_name: str
    domain_version: str
    struct: Struct
    attributes: Mapping[str, str] = field(default_factory=dict)

    def domain(self, chain_id: int, escrow: str) -> Domain:
        """The domain of messages of `chain_id`'s `escrow` (cached)."""
        return domain(self.domain_name, self.domain_version, chain_id, escrow)

    def message(self, model: M) -> dict[str, Any]:
        """The signed members of `model`, as the typed data's `message`."""
        return self.struct.message_of(model, **self.attributes)

    def digest(self, model: M) -> bytes:
        """The 32-byte EIP-712 digest of `model` that is signed."""
        return digest(self.domain(model.chain_id, model.escrow), self.struct, self.message(model))

    def typed_data(self, model: M) -> dict[str, Any]:
        """The full EIP-712 document of `model` (for wallets, other languages and cross-checks)."""
        return typed_data(self.domain(model.chain_id, model.escrow), self.struct, self.message(model))


# ---------------------------------------------------------------------------- keys and signatures


def _key_bytes(private_key: bytes | str) -> bytes:
    if isinstance(private_key, str):
        try:
            private_key = bytes.fromhex(private_key.removeprefix("0x"))
        except ValueError:
            # Never echo the value: it is a key.
            raise ValueError("a private key is 32 bytes of hex") from None
    if len(private_key) != 32 or not 0 < int.from_bytes(private_key, "big") < SECP256K1_N:
        raise ValueError("a private key is 32 bytes, in range for secp256k1")
    return private_key


@functools.lru_cache(maxsize=8)
def _signing_key(key: bytes) -> tuple[PrivateKey, str]:
    # Deriving the public key costs as much as signing; a service signs with one key.
    private = PrivateKey(key)
    return private, address_of(private.public_key)


def signer_address(private_key: bytes | str) -> str:
    """The checksummed address of a 32-byte secp256k1 key (bytes or 0x hex)."""
    return _signing_key(_key_bytes(private_key))[1]


def sign(message_digest: bytes, private_key: bytes | str) -> str:
    """The one canonical signature of a 32-byte digest: 0x hex of `r || s || v`, low s, v 27/28."""
    if len(message_digest) != 32:
        raise ValueError("a digest is 32 bytes")
    key, _ = _signing_key(_key_bytes(private_key))
    # coincurve returns r || s || recid with a low s (libsecp256k1 normalises it).
    raw = key.sign_recoverable(message_digest, hasher=None)
    return signature_hex(raw[64], int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:64], "big"))


def signature_hex(y_parity: int, r: int, s: int) -> str:
    """The canonical encoding of a signature: 0x hex of `r || s || v`, v 27/28. A high s is
    folded into the low half (and the parity flipped), so any valid signature has one form."""
    if y_parity not in (0, 1) or not (0 < r < SECP256K1_N) or not (0 < s < SECP256K1_N):
        raise InvalidSignature("r, s or the parity out of range")
    if s > HALF_N:
        s, y_parity = SECP256K1_N - s, 1 - y_parity
    return "0x" + (r.to_bytes(32, "big") + s.to_bytes(32, "big") + bytes([27 + y_parity])).hex()


def address_of(public_key: PublicKey) -> str:
    """The checksummed Ethereum address of a secp256k1 public key."""
    return _address_of_point(public_key.format(compressed=False))


@functools.lru_cache(maxsize=256)
def _address_of_point(uncompressed: bytes) -> str:
    # Cached: the same few keys sign nearly everything a service checks.
    return str(to_checksum_address(keccak(uncompressed[1:])[-20:]))


def recover(message_digest: bytes, signature: str) -> str:
    """The checksummed address whose key signed `message_digest`.

    InvalidSignature unless `signature` is 0x + 130 hex digits in the one canonical encoding
    (v 27 or 28, 0 < r < n, 0 < s <= n/2) and a key recovers from it.
    """
    if len(message_digest) != 32:
        raise ValueError("a digest is 32 bytes")
    if not isinstance(signature, str) or not _SIGNATURE.match(signature):
        raise InvalidSignature("a signature is 65 bytes of 0x hex")
    raw = bytes.fromhex(signature[2:])
    if raw[64] not in (27, 28):
        raise InvalidSignature("v must be 27 or 28")
    r = int.from_bytes(raw[:32], "big")
    s = int.from_bytes(raw[32:64], "big")
    if not (0 < r < SECP256K1_N) or not (0 < s <= HALF_N):
        raise InvalidSignature("r or s out of range (or s not canonical)")
    try:
        public = PublicKey.from_signature_and_message(raw[:64] + bytes([raw[64] - 27]), message_digest, hasher=None)
    except Exception as exc:
        raise InvalidSignature(f"no key recovers from this signature ({type(exc).__name__})") from None
    return address_of(public)
