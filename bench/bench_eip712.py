"""EIP-712 signing and recovery: the one module (`schemas.eip712`) against two baselines, in one run.

    python -m bench.bench_eip712 [--count N]

For N verdicts (distinct task ids, so no digest is cached) and N proofs, the rate per second of:

- `schemas.eip712`: `sign_verdict` / `recover_signer` / `sign_proof` / `recover_proof_signer`;
- the hand-rolled verdict digest the project used before (32-byte words written out for the
  one struct, coincurve), kept here as the baseline: what generality costs on the hot path;
- eth_account's generic `encode_typed_data` + `Account.sign_message` / `recover_message`
  (what proofs used before).

Each figure is the best of three rounds. One JSON object on stdout.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from coincurve import PrivateKey
from eth_utils.crypto import keccak

from schemas import proof as proof_msg
from schemas import verdict as verdict_msg

KEY = "0x" + "11" * 32
ESCROW = "0x5FbDB2315678afecb367f032d93F642f64180aa3"


def _rate(fn: Callable[[Any], Any], items: list[Any]) -> float:
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for item in items:
            fn(item)
        best = min(best, time.perf_counter() - start)
    return round(len(items) / best)


# The pre-`schemas.eip712` verdict digest, written out for the one struct (the baseline).
_DOMAIN_TYPEHASH = keccak(text="EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)")
_VERDICT_TYPEHASH = keccak(text=verdict_msg.VERDICT_STRUCT.encode_type)


@functools.lru_cache(maxsize=1024)
def _old_domain(chain_id: int, escrow: str) -> bytes:
    return keccak(
        _DOMAIN_TYPEHASH + keccak(text="escrowd-verdict") + keccak(text="1") + chain_id.to_bytes(32, "big")
        + bytes(12) + bytes.fromhex(escrow[2:])
    )  # fmt: skip


def _old_digest(v: verdict_msg.Verdict) -> bytes:
    body = keccak(
        _VERDICT_TYPEHASH + v.chain_id.to_bytes(32, "big") + bytes(12) + bytes.fromhex(v.escrow[2:])
        + v.task_id.to_bytes(32, "big") + v.attempt.to_bytes(32, "big") + bytes.fromhex(v.evidence_hash[2:])
        + int(v.passed).to_bytes(32, "big") + v.score.to_bytes(32, "big")
    )  # fmt: skip
    return keccak(b"\x19\x01" + _old_domain(v.chain_id, v.escrow) + body)


_OLD_KEY = PrivateKey(bytes.fromhex(KEY[2:]))


def _old_sign(v: verdict_msg.Verdict) -> bytes:
    return _OLD_KEY.sign_recoverable(_old_digest(v), hasher=None)


def main() -> None:
    """Measure and print the rates."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=5_000)
    count = parser.parse_args().count
    from eth_account import Account
    from eth_account.messages import encode_typed_data

    issued = datetime(2026, 1, 1, tzinfo=UTC)
    verdicts = [
        verdict_msg.Verdict(chain_id=31337, escrow=ESCROW, task_id=i + 1, attempt=1, evidence_hash="0x" + f"{i:064x}",
                            passed=i % 2 == 0, score=i % 101, issued_at=issued)
        for i in range(count)
    ]
    proofs = [
        proof_msg.Proof(chain_id=31337, escrow=ESCROW, task_id=i + 1, attempt=1, agent="0x" + "a1" * 20,
                        evidence_hash="0x" + f"{i:064x}", criteria_hash="0x" + "c0" * 32, passed=True, score=100,
                        public_tests="12/12", hidden_tests="31/31", resource_limits="PASS",
                        verifier_id="test_suite:x", verifier_version="v/1")
        for i in range(count)
    ]
    signed_verdicts = [verdict_msg.sign_verdict(v, KEY) for v in verdicts]
    signed_proofs = [proof_msg.sign_proof(p, KEY) for p in proofs]
    assert all(_old_digest(v) == verdict_msg.verdict_digest(v) for v in verdicts[:100])
    few = max(1, count // 10)  # eth_account is slow: a tenth of the items
    result = {
        "count": count,
        "verdict_sign_per_s": {
            "eip712": _rate(lambda v: verdict_msg.sign_verdict(v, KEY), verdicts),
            "hand_rolled_baseline": _rate(_old_sign, verdicts),
            "eth_account": _rate(
                lambda v: Account.sign_message(encode_typed_data(full_message=verdict_msg.verdict_typed_data(v)), KEY),
                verdicts[:few],
            ),
        },
        "verdict_recover_per_s": {
            "eip712": _rate(verdict_msg.recover_signer, signed_verdicts),
            "eth_account": _rate(
                lambda s: Account.recover_message(
                    encode_typed_data(full_message=verdict_msg.verdict_typed_data(s.verdict)), signature=s.signature
                ),
                signed_verdicts[:few],
            ),
        },
        "verdict_digest_per_s": {
            "eip712": _rate(verdict_msg.verdict_digest, verdicts),
            "hand_rolled_baseline": _rate(_old_digest, verdicts),
        },
        "proof_sign_per_s": {
            "eip712": _rate(lambda p: proof_msg.sign_proof(p, KEY), proofs),
            "eth_account_before": _rate(
                lambda p: Account.sign_message(encode_typed_data(full_message=proof_msg.typed_data(p)), KEY), proofs[:few]
            ),
        },
        "proof_recover_per_s": {
            "eip712": _rate(proof_msg.recover_proof_signer, signed_proofs),
            "eth_account_before": _rate(
                lambda s: Account.recover_message(encode_typed_data(full_message=proof_msg.typed_data(s.proof)), signature=s.signature),
                signed_proofs[:few],
            ),
        },
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
