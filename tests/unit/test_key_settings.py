"""Which key settings go together: a key outside the process takes no key in it, and a hosted
agent whose wallet is outside needs its own brief key (nothing can be derived from KMS)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from verification.agents.verifier_agent import VerifierAgentSettings
from verification.service import VerificationSettings

KEY = "0x" + "11" * 32
KMS = {"kind": "aws-kms", "kms_key_id": "alias/verification"}
AGENT = {
    "api_url": "http://127.0.0.1:8000", "rpc_url": "http://127.0.0.1:8545", "chain_id": 31337,
    "escrow_address": "0x" + "ab" * 20, "database_url": "postgresql://u@127.0.0.1/db",
}  # fmt: skip


def test_the_verification_key_outside_the_process_refuses_a_key_in_it() -> None:
    base = {"database_url": "postgresql://u@127.0.0.1/db", "kafka_bootstrap": "127.0.0.1:9092"}
    assert VerificationSettings(**base, verification_signer=KMS).verification_signer.kind == "aws-kms"
    with pytest.raises(ValidationError, match="a key in this process is not used"):
        VerificationSettings(**base, verification_signer=KMS, verification_signing_key=KEY)


def test_the_verification_signer_is_read_as_json_from_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ESCROWD_VERIFICATION_SIGNER", json.dumps(KMS))
    settings = VerificationSettings(database_url="postgresql://u@127.0.0.1/db", kafka_bootstrap="127.0.0.1:9092")
    assert settings.verification_signer.kms_key_id == "alias/verification"


def test_an_agent_wallet_outside_the_process_needs_its_own_brief_key() -> None:
    with pytest.raises(ValidationError, match="set encryption_key"):
        VerifierAgentSettings(**AGENT, wallet_signer=KMS)
    with pytest.raises(ValidationError, match="a wallet key in this process is not used"):
        VerifierAgentSettings(**AGENT, wallet_signer=KMS, wallet_key=KEY, encryption_key=KEY)
    settings = VerifierAgentSettings(**AGENT, wallet_signer=KMS, encryption_key=KEY)
    assert settings.wallet_signer.kind == "aws-kms" and settings.wallet_key is None
    with pytest.raises(ValidationError, match="set exactly one of wallet_key and wallet_key_file"):
        VerifierAgentSettings(**AGENT)  # the keystore default still wants its key
