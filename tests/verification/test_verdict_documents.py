"""The verdict and proof documents a record is signed over: the typed data is built only
when the signer reads it (a remote signer), never for a key that signs the digest, and the
signatures are the ones the vectors pin either way."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from chain.keys import SecretKey
from chain.signers import SignerSpec, open_signer
from runtime.services.localsigner import RemoteSignerProcess
from schemas.proof import Proof, sign_proof
from schemas.verdict import sign_verdict
from tests.unit.test_signature_vectors import ESCROW, KEY, SIGNER, VERDICT_SIGNATURE, verdict
from verification.consumer import _documents
from verification.signing import Document, VerdictSigning


def proof() -> Proof:
    return Proof(chain_id=31337, escrow=ESCROW, task_id=7, attempt=1, agent=SIGNER, evidence_hash="0x" + "ab" * 32,
                 criteria_hash="0x" + "cd" * 32, passed=True, score=88, verifier_id="auto-check",
                 verifier_version="1")  # fmt: skip


def no_key() -> SecretKey:
    raise AssertionError("a remote signer loads no key in this process")


def counted(documents: list[Document]) -> tuple[list[Document], list[int]]:
    """The documents again, each counting how often its typed data is built."""
    builds = [0] * len(documents)

    def builder(i: int, build: Callable[[], Mapping[str, Any]]) -> Callable[[], Mapping[str, Any]]:
        def counting() -> Mapping[str, Any]:
            builds[i] += 1
            return build()

        return counting

    return [Document(d.digest, builder(i, d.build_typed_data)) for i, d in enumerate(documents)], builds


async def test_a_keystore_key_signs_the_digests_without_building_the_typed_data() -> None:
    documents, builds = counted(_documents(verdict(), proof()))
    signing = VerdictSigning.from_key(KEY)
    signatures = await signing.signatures(documents)
    assert signatures == [VERDICT_SIGNATURE, sign_proof(proof(), KEY).signature]
    assert signatures[0] == sign_verdict(verdict(), KEY).signature
    assert builds == [0, 0]


async def test_a_remote_signer_reads_each_typed_data_once_and_signs_the_same() -> None:
    documents, builds = counted(_documents(verdict(), proof()))
    local = RemoteSignerProcess(KEY).start()
    try:
        spec = SignerSpec(kind="remote", remote_url=local.url, address=SIGNER, timeout=5)
        signer = await open_signer(spec, "verification", no_key)
        signing = VerdictSigning(signer)
        try:
            await signing.sign_ahead(documents)
            assert builds == [1, 1]
            assert await signing.signatures(documents) == [VERDICT_SIGNATURE, sign_proof(proof(), KEY).signature]
            assert builds == [1, 1]  # the signatures made ahead are found by digest
        finally:
            await signing.aclose()
    finally:
        local.stop()


def test_the_typed_data_read_is_the_document_built() -> None:
    (document, _) = _documents(verdict(), proof())
    assert dict(document.typed_data) == dict(document.build_typed_data())
    assert document.typed_data["primaryType"] == "Verdict"
