"""Private briefs, format 2: key-committing AES-256-GCM content, ECIES-wrapped keys bound to their task.

The poster encrypts the brief once (`seal_brief`) under a fresh 256-bit content key and
wraps that key to every agent allowed to read it (`wrap_key`, to the agent's directory
encryption key, for one task). The service stores the ciphertext and the wrapped keys only;
the terms commit to the ciphertext (`instructionsDigest = keccak256(ciphertext)`).

Two properties plain AES-GCM and a bare ECIES wrap lack:

* **Key commitment.** AES-GCM is not key-committing: one ciphertext can be built so that it
  authenticates under two keys (the "invisible salamanders" construction), which would let a
  poster wrap one key to the worker and another to the verifier, both opening the one
  `instructionsDigest`, to different briefs. Format 2 puts a commitment to the content key in
  the ciphertext, so the digest covers it, and `open_brief` refuses any key whose commitment
  differs before it decrypts: only one key (up to a SHA-256 collision) opens a ciphertext.
* **Bound wrapped keys.** A wrapped key authenticates its context (chain id, escrow, task
  hash, recipient address and keys): a key wrapped for agent A on task X does not unwrap as
  A's key on task Y, nor as anybody else's.

Formats (bytes; base64 on the wire; all integers big-endian):

    K            content key, 32 random bytes
    enc_key      = HKDF-SHA256(ikm=K, salt="escrowd-brief-v2", info="content key", L=32)
    commitment   = HKDF-SHA256(ikm=K, salt="escrowd-brief-v2", info="key commitment", L=32)
    header       = 0x02 ‖ nonce(12, random) ‖ commitment(32)
    ciphertext   = header ‖ AES-256-GCM(enc_key, nonce, brief UTF-8, aad=header)     (ct ‖ tag(16))

    context      = "escrowd-brief-key-v2" ‖ chainId(32) ‖ escrow(20) ‖ taskHash(32) ‖ recipient address(20)
    E, R         the ephemeral and the recipient's secp256k1 public keys, compressed (33 each)
    shared       = x-coordinate(32) of ECDH(ephemeral secret, R)
    kek ‖ nonce  = HKDF-SHA256(ikm=shared, salt=E ‖ R, info=context, L=44)          (32 ‖ 12)
    wrapped key  = 0x02 ‖ E ‖ AES-256-GCM(kek, nonce, K, aad=0x02 ‖ E ‖ R ‖ context)    (82 bytes)

The kek is fresh for every wrap (a fresh ephemeral key), so its derived nonce is never reused.
Vectors other clients can test against: `schemas/vectors/briefs-v2.json` (checked by
`tests/agents/test_briefs.py`). ECDH and keys come from coincurve (libsecp256k1), AES-GCM and
HKDF from `cryptography`. Format 1 (no commitment, unbound keys) is refused everywhere.
"""

from __future__ import annotations

import base64
import hmac
import os
from dataclasses import dataclass

from coincurve import PrivateKey, PublicKey
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from eth_utils.crypto import keccak

VERSION = 2
MAX_BRIEF_BYTES = 256 * 1024
NONCE_BYTES = 12
COMMITMENT_BYTES = 32
TAG_BYTES = 16
HEADER_BYTES = 1 + NONCE_BYTES + COMMITMENT_BYTES
MIN_CIPHERTEXT_BYTES = HEADER_BYTES + TAG_BYTES
MAX_CIPHERTEXT_BYTES = MAX_BRIEF_BYTES + MIN_CIPHERTEXT_BYTES
POINT_BYTES = 33
WRAPPED_KEY_BYTES = 1 + POINT_BYTES + 32 + TAG_BYTES
MAX_WRAPPED_KEY_TEXT = 200
"""Longest base64 text of a wrapped key accepted before decoding."""

_CONTENT_SALT = b"escrowd-brief-v2"
_ENC_INFO = b"content key"
_COMMIT_INFO = b"key commitment"
_CONTEXT_TAG = b"escrowd-brief-key-v2"


class BriefError(ValueError):
    """A brief or a wrapped key that cannot be opened (wrong key, tampered, malformed, other task)."""


@dataclass(frozen=True)
class KeyContext:
    """What a wrapped key is bound to: the deployment, the task's terms and the reader."""

    chain_id: int
    escrow: str
    task_hash: str
    recipient: str

    def encode(self) -> bytes:
        """`"escrowd-brief-key-v2" ‖ chainId(32) ‖ escrow(20) ‖ taskHash(32) ‖ recipient(20)`."""
        if not 0 < self.chain_id < 2**256:
            raise BriefError("chain id out of range")
        try:
            escrow = _fixed_hex(self.escrow, 20)
            task_hash = _fixed_hex(self.task_hash, 32)
            recipient = _fixed_hex(self.recipient, 20)
        except ValueError:
            raise BriefError("malformed key context") from None
        return _CONTEXT_TAG + self.chain_id.to_bytes(32, "big") + escrow + task_hash + recipient


def _fixed_hex(text: str, size: int) -> bytes:
    raw = bytes.fromhex(text.removeprefix("0x"))
    if len(raw) != size:
        raise ValueError(f"expected {size} bytes")
    return raw


@dataclass(frozen=True)
class SealedBrief:
    """The ciphertext and the content key (the key never leaves the poster unwrapped)."""

    ciphertext: bytes
    key: bytes

    @property
    def digest(self) -> str:
        """What the terms commit to: keccak256 of the ciphertext (commitment included)."""
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


def _hkdf(ikm: bytes, salt: bytes, info: bytes, length: int) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=info).derive(ikm)


def content_keys(key: bytes) -> tuple[bytes, bytes]:
    """(AES key, key commitment) derived from a content key."""
    if len(key) != 32:
        raise BriefError("a content key is 32 bytes")
    return _hkdf(key, _CONTENT_SALT, _ENC_INFO, 32), _hkdf(key, _CONTENT_SALT, _COMMIT_INFO, COMMITMENT_BYTES)


def seal_brief(brief: str, key: bytes | None = None, *, nonce: bytes | None = None) -> SealedBrief:
    """Encrypt a brief under a fresh 256-bit key (`key` and `nonce` given only by test vectors)."""
    content_key = key if key is not None else os.urandom(32)
    data = brief.encode("utf-8")
    if len(data) > MAX_BRIEF_BYTES:
        raise BriefError(f"a brief holds at most {MAX_BRIEF_BYTES} bytes")
    nonce = nonce if nonce is not None else os.urandom(NONCE_BYTES)
    if len(nonce) != NONCE_BYTES:
        raise BriefError("a nonce is 12 bytes")
    enc_key, commitment = content_keys(content_key)
    header = bytes([VERSION]) + nonce + commitment
    return SealedBrief(header + AESGCM(enc_key).encrypt(nonce, data, header), content_key)


def ciphertext_well_formed(ciphertext: bytes) -> bool:
    """Format 2 and long enough to hold its header and tag (what the service can check without the key)."""
    return MIN_CIPHERTEXT_BYTES <= len(ciphertext) <= MAX_CIPHERTEXT_BYTES and ciphertext[0] == VERSION


def open_brief(ciphertext: bytes, key: bytes) -> str:
    """Decrypt a brief; BriefError when the key is not the one committed to, or the ciphertext was altered."""
    if not ciphertext_well_formed(ciphertext) or len(key) != 32:
        raise BriefError("malformed ciphertext (format 2 expected)")
    enc_key, commitment = content_keys(key)
    header = ciphertext[:HEADER_BYTES]
    # The commitment first: a key that is not the committed one never reaches AES-GCM, whose
    # tag alone would accept a ciphertext built to open under two keys.
    if not hmac.compare_digest(header[1 + NONCE_BYTES :], commitment):
        raise BriefError("the key is not the one the ciphertext commits to")
    try:
        return AESGCM(enc_key).decrypt(header[1 : 1 + NONCE_BYTES], ciphertext[HEADER_BYTES:], header).decode("utf-8")
    except (InvalidTag, UnicodeDecodeError):
        raise BriefError("the brief does not open with this key") from None


def _shared_x(private: PrivateKey, public: PublicKey) -> bytes:
    # The x-coordinate of the shared point (no library-specific hashing of it).
    return public.multiply(private.secret).format(compressed=True)[1:]


def _kek(shared_x: bytes, ephemeral: bytes, recipient: bytes, context: bytes) -> tuple[bytes, bytes]:
    okm = _hkdf(shared_x, ephemeral + recipient, context, 32 + NONCE_BYTES)
    return okm[:32], okm[32:]


def _point(raw: bytes) -> PublicKey:
    if len(raw) != POINT_BYTES or raw[0] not in (2, 3):
        raise BriefError("not a compressed secp256k1 point")
    try:
        return PublicKey(raw)
    except ValueError:
        raise BriefError("not a point of secp256k1") from None


def wrap_key(
    content_key: bytes, recipient_public_key: str, context: KeyContext, *, ephemeral_secret: bytes | None = None
) -> bytes:
    """The content key, readable only with the recipient's private key, only for `context`
    (`ephemeral_secret` is given only by test vectors)."""
    try:
        recipient = _point(bytes.fromhex(recipient_public_key.removeprefix("0x")))
    except ValueError as exc:
        raise BriefError(f"recipient key: {exc}") from None
    if len(content_key) != 32:
        raise BriefError("a content key is 32 bytes")
    ephemeral = PrivateKey(ephemeral_secret) if ephemeral_secret is not None else PrivateKey()
    e = ephemeral.public_key.format(compressed=True)
    r = recipient.format(compressed=True)
    info = context.encode()
    kek, nonce = _kek(_shared_x(ephemeral, recipient), e, r, info)
    head = bytes([VERSION]) + e
    return head + AESGCM(kek).encrypt(nonce, content_key, head + r + info)


def wrapped_key_well_formed(wrapped: bytes) -> bool:
    """Format 2, the right length, an ephemeral key on the curve (what the service can check)."""
    if len(wrapped) != WRAPPED_KEY_BYTES or wrapped[0] != VERSION:
        return False
    try:
        _point(wrapped[1 : 1 + POINT_BYTES])
    except BriefError:
        return False
    return True


def wrapped_key_text_well_formed(text: str) -> bool:
    """`wrapped_key_well_formed` of a base64 text."""
    try:
        return wrapped_key_well_formed(unb64(text, WRAPPED_KEY_BYTES))
    except BriefError:
        return False


def unwrap_key(wrapped: bytes, private_key: bytes, context: KeyContext) -> bytes:
    """The content key; BriefError when it was wrapped to someone else, for another task, or altered."""
    if not wrapped_key_well_formed(wrapped):
        raise BriefError("malformed wrapped key (format 2 expected)")
    try:
        mine = PrivateKey(private_key)
    except ValueError:
        raise BriefError("malformed private key") from None
    e = wrapped[1 : 1 + POINT_BYTES]
    r = mine.public_key.format(compressed=True)
    info = context.encode()
    kek, nonce = _kek(_shared_x(mine, _point(e)), e, r, info)
    try:
        return AESGCM(kek).decrypt(nonce, wrapped[1 + POINT_BYTES :], bytes([VERSION]) + e + r + info)
    except InvalidTag:
        raise BriefError("the key is not wrapped to this recipient for this task") from None


def encryption_public_key(private_key: bytes) -> str:
    """The compressed public key (0x hex) a reader registers in the directory."""
    return "0x" + PrivateKey(private_key).public_key.format(compressed=True).hex()
