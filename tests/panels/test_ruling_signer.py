"""The ruling path signs through the arbiter key's `chain.signers.Signer`, before any
database transaction: a slow signer holds neither the ruling's row nor the nonce row; a
counter that moved while it signed drops that signature (never stored or sent) and signs
again; a remote signer that goes away leaves the ruling queued with nothing stored, and it
lands once when the signer is back. `ruling_signer` chooses the signer (keystore default)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import asyncpg
import pytest
from pydantic import ValidationError

from chain import txstore
from chain.eth_rpc import EthRpc
from chain.keys import KeyLoadError, SecretKey
from chain.signers import KeystoreSigner, SignerError, SignerSpec, open_signer
from chain.txs import SignedTx, UnsignedTx
from escrowd.devnet import Devnet
from relayer.settlement.rulings import RulingRelaySettings, RulingSender
from runtime.services.localsigner import RemoteSignerProcess
from schemas.task_state import TaskStatus
from tests.panels.rulings_support import (
    admit,
    disputed_task,
    ruling_consumer,
    ruling_message,
    until_status,
)

pytestmark = pytest.mark.timeout(240)


class _Probing:
    """A keystore signer that, while it signs, does what another process would: `during`."""

    def __init__(self, key: SecretKey, during: Any) -> None:
        self._inner = KeystoreSigner(key)
        self.kind = self._inner.kind
        self.address = self._inner.address
        self._during = during
        self.nonces: list[int] = []

    async def sign_transaction(self, tx: UnsignedTx) -> SignedTx:
        self.nonces.append(tx.nonce)
        await self._during(tx)
        return await self._inner.sign_transaction(tx)

    async def sign_typed_data(self, typed_data: Mapping[str, Any], digest: bytes) -> str:
        return await self._inner.sign_typed_data(typed_data, digest)

    async def aclose(self) -> None:
        await self._inner.aclose()


async def test_a_ruling_is_signed_while_no_row_of_it_is_locked(devnet: Devnet, pool: asyncpg.Pool, rpc: EthRpc) -> None:
    first, second = [await asyncio.to_thread(disputed_task, devnet) for _ in range(2)]
    consumer = ruling_consumer(devnet)
    await admit(pool, consumer, ruling_message(devnet, first, 4_000))
    key = SecretKey.from_hex(devnet.arbiter.private_key)
    locked_while_signing: list[tuple[int, bool, bool]] = []

    async def try_the_locks(tx: UnsignedTx) -> None:
        # Another connection takes the ruling's row and the nonce row without waiting: it
        # fails when the sender signs inside the transaction that holds them.
        async with pool.acquire() as conn, conn.transaction():
            rulings = nonces = True
            try:
                await conn.execute("SELECT 1 FROM settlement_rulings WHERE status = 'queued' FOR UPDATE NOWAIT")
            except asyncpg.LockNotAvailableError:
                rulings = False
        async with pool.acquire() as conn, conn.transaction():
            try:
                await conn.execute("SELECT 1 FROM settlement_nonces FOR UPDATE NOWAIT")
            except asyncpg.LockNotAvailableError:
                nonces = False
        locked_while_signing.append((tx.nonce, rulings, nonces))

    signer = _Probing(key, try_the_locks)
    sender = RulingSender(rpc, signer, devnet.chain_id, devnet.escrow_address)
    assert sender.key.address == key.address
    await until_status(pool, sender, first, "confirmed")
    await admit(pool, consumer, ruling_message(devnet, second, 7_000, offset=1))  # the nonce row exists now
    row = await until_status(pool, sender, second, "confirmed")
    assert [n for n, _, _ in locked_while_signing] == [row["nonce"] - 1, row["nonce"]]
    assert all(rulings and nonces for _, rulings, nonces in locked_while_signing), locked_while_signing
    for task_id in (first, second):
        assert (await asyncio.to_thread(devnet.get_task, task_id)).status == TaskStatus.RESOLVED


async def test_a_counter_moved_while_signing_drops_the_signature_and_signs_again(
    devnet: Devnet, pool: asyncpg.Pool, rpc: EthRpc
) -> None:
    task_id = await asyncio.to_thread(disputed_task, devnet)
    other = await asyncio.to_thread(disputed_task, devnet)
    await admit(pool, ruling_consumer(devnet), ruling_message(devnet, task_id, 1_500))
    key = SecretKey.from_hex(devnet.arbiter.private_key)

    async def another_process_takes_the_nonce(tx: UnsignedTx) -> None:
        if len(signer.nonces) == 1:
            # A second sender of the arbiter key uses the nonce being signed and advances the
            # stored counter past it, while our signature is still being made.
            await asyncio.to_thread(devnet.resolve_dispute, other, 5_000)
            async with pool.acquire() as conn, conn.transaction():
                await txstore.set_next_nonce(conn, devnet.chain_id, key.address, tx.nonce + 1)

    signer = _Probing(key, another_process_takes_the_nonce)
    sender = RulingSender(rpc, signer, devnet.chain_id, devnet.escrow_address)
    row = await until_status(pool, sender, task_id, "confirmed")
    taken = signer.nonces[0]
    assert signer.nonces[:2] == [taken, taken + 1] and row["nonce"] == taken + 1
    async with pool.acquire() as conn:
        versions = await conn.fetch("SELECT nonce, tx_hash FROM settlement_ruling_txs WHERE task_id = $1", task_id)
    # The signature at the nonce taken meanwhile was never stored (nor broadcast: the chain's
    # transaction at that nonce is the other process's).
    assert [(v["nonce"], v["tx_hash"]) for v in versions] == [(row["nonce"], row["tx_hash"])]
    assert (await asyncio.to_thread(devnet.get_task, task_id)).status == TaskStatus.RESOLVED
    assert (await asyncio.to_thread(devnet.get_task, other)).status == TaskStatus.RESOLVED


async def test_a_remote_signer_outage_holds_the_ruling_and_it_lands_once_after(
    devnet: Devnet, pool: asyncpg.Pool, rpc: EthRpc
) -> None:
    task_id = await asyncio.to_thread(disputed_task, devnet)
    await admit(pool, ruling_consumer(devnet), ruling_message(devnet, task_id, 8_000))
    local = RemoteSignerProcess(devnet.arbiter.private_key).start()
    spec = SignerSpec(kind="remote", remote_url=local.url, address=devnet.arbiter.address, timeout=2)
    signer = await open_signer(spec, "arbiter", lambda: pytest.fail("the remote kind reads no key"))
    try:
        sender = RulingSender(rpc, signer, devnet.chain_id, devnet.escrow_address)
        local.stop()  # gone before the ruling is signed
        async with pool.acquire() as conn:
            counter_before = await txstore.next_nonce(conn, devnet.chain_id, devnet.arbiter.address)
        count_before = await rpc.transaction_count(devnet.arbiter.address, "latest")
        for _ in range(2):
            with pytest.raises(SignerError):
                await sender.step(pool)
        async with pool.acquire() as conn:
            row = await conn.fetchrow("SELECT * FROM settlement_rulings WHERE task_id = $1", task_id)
            assert await conn.fetchval("SELECT count(*) FROM settlement_ruling_txs WHERE task_id = $1", task_id) == 0
            # No nonce spent: the counter is where it was (a key this database never used gets
            # its row at the chain's count from the sender's start-up reconciliation).
            unchanged = count_before if counter_before is None else counter_before
            assert await txstore.next_nonce(conn, devnet.chain_id, devnet.arbiter.address) == unchanged
            assert await conn.fetchval("SELECT count(*) FROM settlement_transactions WHERE sender = $1",
                                       devnet.arbiter.address.lower()) == 0
        assert (row["status"], row["nonce"], row["raw_tx"]) == ("queued", None, None)
        assert await rpc.transaction_count(devnet.arbiter.address, "latest") == count_before
        local.start()  # the same key, back on the same port
        row = await until_status(pool, sender, task_id, "confirmed")
        assert await rpc.transaction_count(devnet.arbiter.address, "latest") == count_before + 1
        assert (await asyncio.to_thread(devnet.get_task, task_id)).status == TaskStatus.RESOLVED
    finally:
        await signer.aclose()
        local.stop()


def _settings(**values: object) -> RulingRelaySettings:
    base: dict[str, object] = {
        "database_url": "postgresql://u@localhost/db", "kafka_bootstrap": "localhost:9092", "ruling_chain_id": 31337,
        "ruling_rpc_url": "http://localhost:8545", "ruling_escrow": "0x" + "11" * 20,
        "ruling_trusted_signers": ["0x" + "22" * 20],
    }
    return RulingRelaySettings(**{**base, **values})  # type: ignore[arg-type]


def test_the_ruling_signer_setting_chooses_who_holds_the_arbiter_key() -> None:
    key = "0x" + "5e" * 32
    assert _settings(ruling_arbiter_key=key).arbiter_key().address == SecretKey.from_hex(key).address
    remote = {"kind": "remote", "remote_url": "http://localhost:1", "address": SecretKey.from_hex(key).address}
    settings = _settings(ruling_signer=remote)
    assert settings.ruling_signer.kind == "remote"
    with pytest.raises(KeyLoadError):
        settings.arbiter_key()  # no key in this process for a remote signer
    with pytest.raises(ValidationError, match="not used"):
        _settings(ruling_signer=remote, ruling_arbiter_key=key)
    with pytest.raises(ValidationError, match="exactly one"):
        _settings()  # the keystore kind (the default) needs its key
