"""The verification key's signatures: verdicts and proofs, never signed inside a transaction.

The key is a `chain.signers.Signer` (`verification_signer`: keystore, aws-kms or remote).
A keystore key signs in this process with no I/O, so it signs where it is asked
(`inline`). A key held over the network is asked ahead, outside every transaction:

- the judging stage signs the verdict and proof a judgement leads to right after judging,
  before its short commit transaction (`sign_ahead`);
- anything else that needs a signature inside a transaction (a poster's review, or a
  judgement whose task changed between judging and commit) finds none made and raises
  `SignFirst`: the transaction rolls back, the signature is made outside it
  (`runtime.consumer.PrepareFirst`), and the work is applied again.

A signer that cannot answer raises `chain.signers.SignerError` from `sign_ahead`: nothing is
signed with another key, nothing is recorded, and the message or job is tried again later.
The signatures made ahead are kept by digest (bounded): a digest covers exactly the signed
fields, so a signature found for it is the one the record needs.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from chain.keys import SecretKey
from chain.signers import KeystoreSigner, Metered, Signer
from runtime.consumer import PrepareFirst

CACHE_SIZE = 4096  # signatures made ahead and not yet recorded: a few judging rounds' worth


class _LazyTypedData(Mapping[str, Any]):
    """A typed-data document built on first read: a digest signer never reads it."""

    def __init__(self, build: Callable[[], Mapping[str, Any]]) -> None:
        self._build: Callable[[], Mapping[str, Any]] | None = build
        self._data: Mapping[str, Any] = {}

    def _document(self) -> Mapping[str, Any]:
        if self._build is not None:
            self._data, self._build = self._build(), None
        return self._data

    def __getitem__(self, key: str) -> Any:
        return self._document()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._document())

    def __len__(self) -> int:
        return len(self._document())


@dataclass(frozen=True)
class Document:
    """One EIP-712 message to sign: its digest, and its typed-data document.

    Only a signer that signs the document itself (`remote`: `eth_signTypedData_v4`) reads
    `typed_data`; a key that signs the digest (keystore, aws-kms) never does, so the document
    is built on first read (its building costs more than a keystore signature)."""

    digest: bytes
    build_typed_data: Callable[[], Mapping[str, Any]] = field(repr=False, compare=False)

    @functools.cached_property
    def typed_data(self) -> Mapping[str, Any]:
        """The typed-data document, built when a signer first reads it."""
        return _LazyTypedData(self.build_typed_data)


class SignFirst(PrepareFirst):
    """A record needs signatures not made yet: roll back, `prepare()` (sign them), apply again."""


class VerdictSigning:
    """The verification key: its address, and its signatures made ahead or in place."""

    def __init__(self, signer: Signer, cache_size: int = CACHE_SIZE) -> None:
        self.signer = signer
        self.address = signer.address
        # A key in this process signs in microseconds with no I/O: it may sign in a transaction.
        self.inline = signer.kind == "keystore"
        self._cache_size = cache_size
        self._signed: OrderedDict[bytes, str] = OrderedDict()

    @classmethod
    def from_key(cls, key: str) -> VerdictSigning:
        """A keystore signing key (0x hex), for devnets and tests."""
        return cls(Metered(KeystoreSigner(SecretKey.from_hex(key)), "verification"))

    def missing(self, documents: Sequence[Document]) -> list[Document]:
        """The documents with no signature made yet (none for an inline key)."""
        if self.inline:
            return []
        return [d for d in documents if d.digest not in self._signed]

    async def sign_ahead(self, documents: Sequence[Document]) -> None:
        """Sign the documents not signed yet; SignerError when the signer cannot (nothing kept)."""
        made = [(d.digest, await self.signer.sign_typed_data(d.typed_data, d.digest)) for d in self.missing(documents)]
        for digest, signature in made:
            self._signed[digest] = signature
            self._signed.move_to_end(digest)
        while len(self._signed) > self._cache_size:
            self._signed.popitem(last=False)

    async def signatures(self, documents: Sequence[Document]) -> list[str]:
        """The documents' signatures, in order: an inline key signs them now; otherwise the
        ones made ahead, and `SignFirst` when any is missing (call it in a transaction only)."""
        if self.inline:
            return [await self.signer.sign_typed_data(d.typed_data, d.digest) for d in documents]
        missing = self.missing(documents)
        if missing:

            async def prepare() -> None:
                await self.sign_ahead(missing)

            raise SignFirst(f"{len(missing)} signatures to make outside the transaction", prepare)
        return [self._signed[d.digest] for d in documents]

    async def aclose(self) -> None:
        """Close the signer."""
        await self.signer.aclose()
