"""The published vectors of private briefs, format 2 (`schemas/vectors/briefs-v2.json`).

`python -m tests.agents.brief_vectors` rewrites the file; `tests/agents/test_briefs.py` checks
that the file is what this builds and that every vector opens (or is refused) as it says.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eth_utils.crypto import keccak

from verification.agents import briefs

VECTORS = Path(__file__).resolve().parents[2] / "schemas" / "vectors" / "briefs-v2.json"


def _secret(label: str) -> bytes:
    return bytes(keccak(b"escrowd brief vector " + label.encode()))


def _address(label: str) -> str:
    return "0x" + keccak(b"address " + label.encode())[-20:].hex()


CASES: tuple[tuple[str, str], ...] = (
    ("ascii", "Review the payments refactor at commit 9f1c and list every risk."),
    ("empty", ""),
    ("unicode", "Übersetze: « le café » → 咖啡, and keep the emoji 🧾."),
)


def build_vectors() -> dict[str, Any]:
    """Every vector, from fixed secrets."""
    content: list[dict[str, Any]] = []
    wrapped: list[dict[str, Any]] = []
    for name, text in CASES:
        key, nonce = _secret(f"content key {name}"), _secret(f"nonce {name}")[:12]
        sealed = briefs.seal_brief(text, key, nonce=nonce)
        enc_key, commitment = briefs.content_keys(key)
        content.append({
            "name": name, "brief": text, "contentKey": key.hex(), "nonce": nonce.hex(),
            "encKey": enc_key.hex(), "commitment": commitment.hex(), "ciphertext": sealed.ciphertext.hex(),
            "instructionsDigest": sealed.digest,
        })  # fmt: skip
        recipient_secret, ephemeral_secret = _secret(f"recipient {name}"), _secret(f"ephemeral {name}")
        context = briefs.KeyContext(
            chain_id=31337 if name != "unicode" else 8453, escrow=_address(f"escrow {name}"),
            task_hash="0x" + keccak(sealed.ciphertext).hex(), recipient=_address(f"recipient {name}"),
        )  # fmt: skip
        public = briefs.encryption_public_key(recipient_secret)
        wrapped.append({
            "name": name, "contentKey": key.hex(), "recipientSecret": recipient_secret.hex(), "recipientPublicKey": public,
            "ephemeralSecret": ephemeral_secret.hex(),
            "context": {"chainId": context.chain_id, "escrow": context.escrow, "taskHash": context.task_hash,
                        "recipient": context.recipient},
            "contextBytes": context.encode().hex(),
            "wrappedKey": briefs.wrap_key(key, public, context, ephemeral_secret=ephemeral_secret).hex(),
        })  # fmt: skip
    return {
        "format": briefs.VERSION,
        "description": "Private briefs, format 2: key-committing content and wrapped keys bound to chain, "
        "escrow, task hash and recipient. Formats in verification/agents/briefs.py and docs/agents.md. "
        "Every hex field is lower-case, without 0x unless it is an address, a hash or a public key.",
        "content": content,
        "wrappedKeys": wrapped,
    }


def main() -> None:
    VECTORS.write_text(json.dumps(build_vectors(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
