"""Shared steps of the agents tests: directory entries, encryption keys of the test actors."""

from __future__ import annotations

from typing import Any

from eth_utils.crypto import keccak

from tests.verification.conftest import Api, Who
from verification.agents.briefs import encryption_public_key


def enc_secret(who: Who) -> bytes:
    """A test actor's encryption key (separate from its wallet key)."""
    return bytes(keccak(b"enc:" + who.address.encode()))


def entry(who: Who, *, roles: tuple[str, ...] = ("verifier",), chains: tuple[int, ...] = (31337,), opt_in: bool = True, **extra: Any) -> dict[str, Any]:
    """A registration body."""
    body: dict[str, Any] = {
        "roles": list(roles),
        "chains": list(chains),
        "verifyOthers": opt_in,
        "capabilities": ["text"],
        "encryptionPublicKey": encryption_public_key(enc_secret(who)),
    }
    body.update(extra)
    return body


async def register_executor(api: Api, who: Who, **kwargs: Any) -> Any:
    response = await api.call("PUT", "/v1/executors/me", entry(who, **kwargs), as_=who)
    assert response.status_code in (200, 201), response.text
    return response.json()


def wrap_for(key: bytes, public_key: str, task_hash: str, reader: str, *, chain_id: int = 31337, escrow: str | None = None) -> str:
    """A content key wrapped (base64) to `reader`'s encryption key for the task `task_hash`."""
    from tests.verification.conftest import ESCROW
    from verification.agents.briefs import KeyContext, b64, wrap_key

    return b64(wrap_key(key, public_key, KeyContext(chain_id, escrow or ESCROW, task_hash, reader)))


def context_for(task_hash: str, reader: str, *, chain_id: int = 31337, escrow: str | None = None) -> Any:
    """The key context of `reader` on the task `task_hash`."""
    from tests.verification.conftest import ESCROW
    from verification.agents.briefs import KeyContext

    return KeyContext(chain_id, escrow or ESCROW, task_hash, reader)
