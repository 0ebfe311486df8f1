"""The marketplace verifier key: loaded once, held in a wrapper that never prints it.

Sources, in order of preference:

1. an encrypted keystore file (Web3 Secret Storage, as written by geth, clef, foundry's
   `cast wallet` or `eth_account.Account.encrypt`) with its password from the environment
   or from a file (a mounted secret);
2. a raw 0x hex key from the environment: for the devnet, whose keys are public anyway.

The key and the password are registered with `runtime.logging.register_secret` the moment
they are read, so a log line that somehow carries them prints `[REDACTED]`. Errors say what
failed and where, never with the value.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from coincurve import PrivateKey
from eth_utils.address import to_checksum_address
from eth_utils.crypto import keccak

from runtime.logging import register_secret

_SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141


class KeyLoadError(Exception):
    """The key could not be loaded; the message never contains key material."""


class SecretKey:
    """A secp256k1 private key that signs but never shows itself.

    `repr`, `str` and formatting show only the address; pickling and copying are refused so
    the key cannot leak through a serialiser or a crash dump of a task's arguments.
    """

    __slots__ = ("_private", "address")

    def __init__(self, key: bytes) -> None:
        if len(key) != 32 or not 0 < int.from_bytes(key, "big") < _SECP256K1_N:
            raise KeyLoadError("not a valid secp256k1 private key (need 32 bytes in range)")
        register_secret("0x" + key.hex())
        self._private = PrivateKey(key)
        point = self._private.public_key.format(compressed=False)
        self.address: str = str(to_checksum_address(keccak(point[1:])[-20:]))

    @classmethod
    def from_hex(cls, value: str) -> SecretKey:
        """From 0x hex (or bare hex); whitespace around it is ignored."""
        text = value.strip()
        register_secret(text)
        try:
            raw = bytes.fromhex(text.removeprefix("0x"))
        except ValueError:
            raise KeyLoadError("the raw key is not hex") from None
        return cls(raw)

    def sign_digest(self, digest: bytes) -> tuple[int, int, int]:
        """Sign a 32-byte hash; returns (y_parity, r, s) with a low s."""
        sig = self._private.sign_recoverable(digest, hasher=None)
        return sig[64], int.from_bytes(sig[:32], "big"), int.from_bytes(sig[32:64], "big")

    def secret_bytes(self) -> bytes:
        """The raw key, for a signer that needs it (e.g. verdict signing in tests)."""
        return bytes(self._private.secret)

    def __repr__(self) -> str:
        return f"SecretKey(address={self.address}, key=[REDACTED])"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)

    def __reduce__(self) -> str | tuple[Any, ...]:
        raise TypeError("SecretKey cannot be pickled")

    def __copy__(self) -> SecretKey:
        raise TypeError("SecretKey cannot be copied")

    def __deepcopy__(self, memo: object) -> SecretKey:
        raise TypeError("SecretKey cannot be copied")


def _read_password(password: str | None, password_file: Path | None) -> str:
    if password is not None:
        register_secret(password)
        return password
    if password_file is not None:
        try:
            text = password_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise KeyLoadError(f"cannot read the keystore password file {password_file}: {exc.strerror}") from None
        # Files written by `echo` end with a newline that is not part of the password.
        value = text.rstrip("\r\n")
        register_secret(value)
        return value
    raise KeyLoadError("a keystore needs a password (env or password file)")


def load_keystore(path: Path, password: str | None = None, password_file: Path | None = None) -> SecretKey:
    """Decrypt a Web3 Secret Storage keystore file."""
    from eth_account import Account

    secret = _read_password(password, password_file)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise KeyLoadError(f"cannot read keystore {path}: {exc.strerror}") from None
    except ValueError:
        raise KeyLoadError(f"keystore {path} is not JSON") from None
    try:
        raw = bytes(Account.decrypt(document, secret))
    except ValueError:
        # eth_account says "MAC mismatch" for a wrong password: say it plainly.
        raise KeyLoadError(f"keystore {path}: wrong password or corrupt file") from None
    except Exception as exc:
        raise KeyLoadError(f"keystore {path} cannot be decrypted ({type(exc).__name__})") from None
    key = SecretKey(raw)
    declared = document.get("address") if isinstance(document, dict) else None
    if isinstance(declared, str) and declared and declared.lower().removeprefix("0x") != key.address[2:].lower():
        raise KeyLoadError(f"keystore {path}: the key does not match its declared address")
    return key


def load_key(
    *,
    raw_key: str | None = None,
    keystore: Path | None = None,
    password: str | None = None,
    password_file: Path | None = None,
) -> SecretKey:
    """Load the relayer key from exactly one source (keystore preferred over a raw key)."""
    if keystore is not None and raw_key is not None:
        raise KeyLoadError("both a keystore and a raw key are configured: keep one")
    if keystore is not None:
        return load_keystore(keystore, password, password_file)
    if raw_key is not None:
        return SecretKey.from_hex(raw_key)
    raise KeyLoadError("no relayer key configured (keystore file or raw key)")


def write_keystore(
    key: SecretKey,
    path: Path,
    password: str,
    *,
    kdf: Literal["scrypt", "pbkdf2"] = "scrypt",
    iterations: int | None = None,
) -> None:
    """Encrypt `key` into a keystore file readable by `load_keystore` (mode 0600)."""
    from eth_account import Account

    register_secret(password)
    document = Account.encrypt(key.secret_bytes(), password, kdf=kdf, iterations=iterations)
    # Created 0600 from the start: no moment where another user could read it.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(document))
