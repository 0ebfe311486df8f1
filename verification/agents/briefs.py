"""Private briefs: AES-256-GCM under a fresh key, the key wrapped to each reader by ECIES.

The poster encrypts the brief once (`seal_brief`) and wraps the content key to every agent
allowed to read it (`wrap_key`, to that agent's directory encryption key). The service
stores the ciphertext and the wrapped keys only; the terms commit to the ciphertext
(`instructionsDigest = keccak256(ciphertext)`), so what the agents decrypt is what was
posted.

Formats (all bytes, base64 on the wire):

    ciphertext   = version(1) ‖ nonce(12) ‖ AES-GCM(key, brief UTF-8, aad="escrowd-brief-v1")
    wrapped key  = version(1) ‖ ephemeral secp256k1 public key(33) ‖ nonce(12)
                   ‖ AES-GCM(kek, content key(32), aad="escrowd-brief-key-v1" ‖ recipient public key(33))
    kek          = HKDF-SHA256(ECDH x-coordinate, salt=ephemeral public key, info="escrowd-brief-kek-v1")

ECDH and keys come from coincurve (libsecp256k1), AES-GCM and HKDF from `cryptography`.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass

from coincurve import PrivateKey, PublicKey
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from eth_utils.crypto import keccak

VERSION = 1
MAX_BRIEF_BYTES = 256 * 1024
MAX_CIPHERTEXT_BYTES = MAX_BRIEF_BYTES + 64
WRAPPED_KEY_BYTES = 1 + 33 + 12 + 32 + 16
_BRIEF_AAD = b"escrowd-brief-v1"
_KEY_AAD = b"escrowd-brief-key-v1"
_KEK_INFO = b"escrowd-brief-kek-v1"


class BriefError(ValueError):
    """A brief or a wrapped key that cannot be opened (wrong key, tampered, malformed)."""


@dataclass(frozen=True)
class SealedBrief:
    """The ciphertext and the content key (the key never leaves the poster unwrapped)."""

    ciphertext: bytes
    key: bytes

    @property
    def digest(self) -> str:
        """What the terms commit to: keccak256 of the ciphertext."""
        return ciphertext_digest(self.ciphertext)


def ciphertext_digest(ciphertext: bytes) -> str:
    """keccak256 of the ciphertext, 0x hex."""
    return "0x" + keccak(ciphertext).hex()


def b64(data: bytes) -> str:
    """Standard base64 text."""
    return base64.b64encode(data).decode("ascii")


def unb64(text: str, limit: int) -> bytes:
    """Strict base64 with a size bound checked before decoding."""
    if len(text) > (limit * 4) // 3 + 8:
        raise BriefError("too large")
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise BriefError("not base64") from None


def seal_brief(brief: str, key: bytes | None = None) -> SealedBrief:
    """Encrypt a brief under a fresh 256-bit key."""
    content_key = key or AESGCM.generate_key(bit_length=256)
    nonce = os.urandom(12)
    data = brief.encode("utf-8")
    if len(data) > MAX_BRIEF_BYTES:
        raise BriefError(f"a brief holds at most {MAX_BRIEF_BYTES} bytes")
    sealed = bytes([VERSION]) + nonce + AESGCM(content_key).encrypt(nonce, data, _BRIEF_AAD)
    return SealedBrief(sealed, content_key)


def open_brief(ciphertext: bytes, key: bytes) -> str:
    """Decrypt a brief (BriefError when the key is wrong or the ciphertext was altered)."""
    if len(ciphertext) < 1 + 12 + 16 or ciphertext[0] != VERSION or len(key) != 32:
        raise BriefError("malformed ciphertext")
    try:
        return AESGCM(key).decrypt(ciphertext[1:13], ciphertext[13:], _BRIEF_AAD).decode("utf-8")
    except (InvalidTag, UnicodeDecodeError):
        raise BriefError("the brief does not open with this key") from None


def _kek(shared_x: bytes, ephemeral: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=ephemeral, info=_KEK_INFO).derive(shared_x)


def _shared_x(private: PrivateKey, public: PublicKey) -> bytes:
    # The x-coordinate of the shared point (no library-specific hashing of it).
    point = public.multiply(private.secret).format(compressed=True)
    return point[1:]


def wrap_key(content_key: bytes, recipient_public_key: str) -> bytes:
    """The content key, readable only with the recipient's private key (ECIES, secp256k1)."""
    recipient = PublicKey(bytes.fromhex(recipient_public_key.removeprefix("0x")))
    ephemeral = PrivateKey()
    ephemeral_public = ephemeral.public_key.format(compressed=True)
    kek = _kek(_shared_x(ephemeral, recipient), ephemeral_public)
    nonce = os.urandom(12)
    aad = _KEY_AAD + recipient.format(compressed=True)
    return bytes([VERSION]) + ephemeral_public + nonce + AESGCM(kek).encrypt(nonce, content_key, aad)


def unwrap_key(wrapped: bytes, private_key: bytes) -> bytes:
    """The content key (BriefError when it was wrapped to someone else or altered)."""
    if len(wrapped) != WRAPPED_KEY_BYTES or wrapped[0] != VERSION:
        raise BriefError("malformed wrapped key")
    try:
        ephemeral = PublicKey(wrapped[1:34])
        mine = PrivateKey(private_key)
    except ValueError:
        raise BriefError("malformed wrapped key") from None
    kek = _kek(_shared_x(mine, ephemeral), wrapped[1:34])
    aad = _KEY_AAD + mine.public_key.format(compressed=True)
    try:
        return AESGCM(kek).decrypt(wrapped[34:46], wrapped[46:], aad)
    except InvalidTag:
        raise BriefError("the key is not wrapped to this recipient") from None


def encryption_public_key(private_key: bytes) -> str:
    """The compressed public key (0x hex) a reader registers in the directory."""
    return "0x" + PrivateKey(private_key).public_key.format(compressed=True).hex()
