"""What a transaction sender stores: one nonce row per (chain, key), one slot per nonce, every
signed version of it. The database is the truth; a sender's memory is a cache of it.

- `settlement_nonces`: the next nonce of an address, advanced in the same transaction that
  stores the signed transaction using it: no nonce without a stored transaction;
- `settlement_transactions`: one row per nonce we hold (kind `verdict`, `batch`, `filler`, `ruling` or
  `call`; state `pending` → `mined` → `confirmed`, or `lost` when another transaction took
  the nonce), a `call` with its target and calldata;
- `settlement_tx_versions`: every signed version (the first and each replacement), stored
  before it is broadcast; a receipt of any of them counts.

The tables keep their first users' names (the relayer's); every sender of the project uses
them, each with its own key and so its own rows.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from chain.fees import Fees
from chain.txs import SignedTx


@dataclass(frozen=True)
class TxVersion:
    """One signed version of a transaction."""

    tx_hash: str
    raw_hex: str
    fees: Fees
    gas_limit: int
    version: int
    kind: str


@dataclass(frozen=True)
class NewSlot:
    """A signed transaction to store at its nonce: what it is, and for a `call` its call."""

    tx: SignedTx
    kind: str
    verdict_id: int | None = None
    to: str | None = None
    data: bytes | None = None


@dataclass
class StoredSlot:
    """One nonce we hold, as stored (without what its users attach to it)."""

    nonce: int
    kind: str
    state: str
    verdict_id: int | None
    to: str | None
    data: bytes | None
    versions: list[TxVersion] = field(default_factory=list)
    mined_hash: str | None = None
    block_number: int | None = None
    block_hash: str | None = None
    receipt_status: int | None = None


@dataclass(frozen=True)
class MinedUpdate:
    """A slot's transaction found in a block (or, with state 'pending', found missing)."""

    nonce: int
    state: str
    mined_hash: str | None
    block_number: int | None
    block_hash: str | None
    receipt_status: int | None


def version_of(tx: SignedTx, version: int, kind: str) -> TxVersion:
    """The stored form of a signed transaction."""
    return TxVersion(
        tx_hash=tx.tx_hash, raw_hex=tx.raw_hex, fees=tx.fees, gas_limit=tx.gas_limit, version=version, kind=kind
    )


# ---------------------------------------------------------------------------- nonce rows


async def lock_next_nonce(conn: asyncpg.Connection, chain_id: int, address: str, floor: int) -> int:
    """Lock the counter row for this transaction and return the next nonce (at least `floor`)."""
    return max(await lock_nonce_row(conn, chain_id, address, floor), floor)


async def lock_nonce_row(conn: asyncpg.Connection, chain_id: int, address: str, initial: int) -> int:
    """Lock the counter row for this transaction (created at `initial` when the address has
    none) and return the stored counter as it is."""
    await conn.execute(
        "INSERT INTO settlement_nonces (chain_id, address, next_nonce) VALUES ($1, $2, $3)"
        " ON CONFLICT (chain_id, address) DO NOTHING",
        chain_id,
        address.lower(),
        initial,
    )
    value = await conn.fetchval(
        "SELECT next_nonce FROM settlement_nonces WHERE chain_id = $1 AND address = $2 FOR UPDATE",
        chain_id,
        address.lower(),
    )
    return int(value)


async def set_next_nonce(conn: asyncpg.Connection, chain_id: int, address: str, next_nonce: int) -> None:
    """Store the counter; it only ever moves forward."""
    await conn.execute(
        "INSERT INTO settlement_nonces (chain_id, address, next_nonce) VALUES ($1, $2, $3)"
        " ON CONFLICT (chain_id, address) DO UPDATE SET"
        " next_nonce = GREATEST(settlement_nonces.next_nonce, EXCLUDED.next_nonce), updated_at = now()",
        chain_id,
        address.lower(),
        next_nonce,
    )


async def next_nonce(conn: asyncpg.Connection, chain_id: int, address: str) -> int | None:
    """The stored counter (None when this database never used the address)."""
    value = await conn.fetchval(
        "SELECT next_nonce FROM settlement_nonces WHERE chain_id = $1 AND address = $2",
        chain_id,
        address.lower(),
    )
    return None if value is None else int(value)


def advisory_lock_key(chain_id: int, address: str) -> int:
    """A 63-bit advisory lock id for one (chain, sender): one sending process per key and chain."""
    digest = hashlib.blake2b(f"relayer:{chain_id}:{address.lower()}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & 0x7FFF_FFFF_FFFF_FFFF


# ---------------------------------------------------------------------------- slots


async def insert_slots(conn: asyncpg.Connection, chain_id: int, sender: str, slots: Sequence[NewSlot]) -> None:
    """Store new slots and their first versions (one statement per table, whatever the count)."""
    address = sender.lower()
    await conn.execute(
        "INSERT INTO settlement_transactions (chain_id, sender, nonce, verdict_id, kind, state, to_address, calldata)"
        " SELECT $1, $2, n, v, k, 'pending', t, d"
        " FROM unnest($3::bigint[], $4::bigint[], $5::text[], $6::text[], $7::bytea[]) AS u(n, v, k, t, d)",
        chain_id,
        address,
        [s.tx.nonce for s in slots],
        [s.verdict_id for s in slots],
        [s.kind for s in slots],
        [None if s.to is None else s.to.lower() for s in slots],
        [s.data for s in slots],
    )
    await conn.execute(
        "INSERT INTO settlement_tx_versions (tx_hash, chain_id, sender, nonce, version, kind, raw_tx,"
        " max_fee_per_gas, max_priority_fee_per_gas, gas_limit)"
        " SELECT h, $1, $2, n, 0, k, r, mf, mp, g FROM unnest($3::text[], $4::bigint[], $5::text[], $6::text[],"
        " $7::numeric[], $8::numeric[], $9::bigint[]) AS u(h, n, k, r, mf, mp, g)",
        chain_id,
        address,
        [s.tx.tx_hash for s in slots],
        [s.tx.nonce for s in slots],
        [s.kind for s in slots],
        [s.tx.raw_hex for s in slots],
        [s.tx.fees.max_fee_per_gas for s in slots],
        [s.tx.fees.max_priority_fee_per_gas for s in slots],
        [s.tx.gas_limit for s in slots],
    )


async def record_version(
    conn: asyncpg.Connection, chain_id: int, sender: str, tx: SignedTx, version: int, kind: str
) -> None:
    """Store a replacement (same nonce, higher fees; a filler when cancelling)."""
    await conn.execute(
        "INSERT INTO settlement_tx_versions (tx_hash, chain_id, sender, nonce, version, kind, raw_tx,"
        " max_fee_per_gas, max_priority_fee_per_gas, gas_limit) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        tx.tx_hash,
        chain_id,
        sender.lower(),
        tx.nonce,
        version,
        kind,
        tx.raw_hex,
        tx.fees.max_fee_per_gas,
        tx.fees.max_priority_fee_per_gas,
        tx.gas_limit,
    )


async def convert_to_filler(conn: asyncpg.Connection, chain_id: int, sender: str, nonce: int) -> None:
    """The slot now cancels what it carried: a filler replaces its transaction."""
    await conn.execute(
        "UPDATE settlement_transactions SET kind = 'filler', updated_at = now()"
        " WHERE chain_id = $1 AND sender = $2 AND nonce = $3",
        chain_id,
        sender.lower(),
        nonce,
    )


async def mark_broadcast(conn: asyncpg.Connection, tx_hashes: Sequence[str]) -> None:
    """Note the first broadcast time of versions (informational)."""
    await conn.execute(
        "UPDATE settlement_tx_versions SET broadcast_at = now()"
        " WHERE tx_hash = ANY($1::text[]) AND broadcast_at IS NULL",
        list(tx_hashes),
    )


async def update_slots(conn: asyncpg.Connection, chain_id: int, sender: str, updates: Sequence[MinedUpdate]) -> None:
    """Write slot states after receipts were checked."""
    if not updates:
        return
    await conn.execute(
        "UPDATE settlement_transactions t SET state = u.st, mined_hash = u.h, block_number = u.bn,"
        " block_hash = u.bh, receipt_status = u.rs, updated_at = now()"
        " FROM unnest($3::bigint[], $4::text[], $5::text[], $6::bigint[], $7::text[], $8::smallint[])"
        " AS u(n, st, h, bn, bh, rs)"
        " WHERE t.chain_id = $1 AND t.sender = $2 AND t.nonce = u.n",
        chain_id,
        sender.lower(),
        [u.nonce for u in updates],
        [u.state for u in updates],
        [u.mined_hash for u in updates],
        [u.block_number for u in updates],
        [u.block_hash for u in updates],
        [u.receipt_status for u in updates],
    )


def slot_columns(r: asyncpg.Record) -> dict[str, Any]:
    """A `settlement_transactions` row (nonce, kind, state, verdict_id, to_address, calldata and
    the mined block) as the `StoredSlot` fields, without its versions (the relayer's `SlotRow`
    extends `StoredSlot` with the verdicts it carries)."""
    return {
        "nonce": r["nonce"],
        "kind": r["kind"],
        "state": r["state"],
        "verdict_id": r["verdict_id"],
        "to": r["to_address"],
        "data": None if r["calldata"] is None else bytes(r["calldata"]),
        "mined_hash": r["mined_hash"],
        "block_number": r["block_number"],
        "block_hash": r["block_hash"],
        "receipt_status": r["receipt_status"],
    }


async def open_slots(conn: asyncpg.Connection, chain_id: int, sender: str, watch_from_block: int) -> list[StoredSlot]:
    """Slots still pending or mined, and confirmed ones still inside the reorg watch window."""
    rows = await conn.fetch(
        "SELECT nonce, kind, state, verdict_id, to_address, calldata, mined_hash, block_number, block_hash,"
        " receipt_status FROM settlement_transactions WHERE chain_id = $1 AND sender = $2"
        "   AND (state IN ('pending', 'mined') OR (state = 'confirmed' AND block_number >= $3))"
        " ORDER BY nonce",
        chain_id,
        sender.lower(),
        watch_from_block,
    )
    slots = {r["nonce"]: StoredSlot(**slot_columns(r)) for r in rows}
    if not slots:
        return []
    for nonce, version in await signed_versions(conn, chain_id, sender, list(slots)):
        slots[nonce].versions.append(version)
    return list(slots.values())


async def signed_versions(
    conn: asyncpg.Connection, chain_id: int, sender: str, nonces: list[int]
) -> list[tuple[int, TxVersion]]:
    """(nonce, version) of every transaction signed for `nonces`, in nonce and version order."""
    rows = await conn.fetch(
        "SELECT nonce, tx_hash, raw_tx, max_fee_per_gas, max_priority_fee_per_gas, gas_limit, version, kind"
        " FROM settlement_tx_versions WHERE chain_id = $1 AND sender = $2 AND nonce = ANY($3::bigint[])"
        " ORDER BY nonce, version",
        chain_id,
        sender.lower(),
        nonces,
    )
    return [
        (
            v["nonce"],
            TxVersion(
                tx_hash=v["tx_hash"],
                raw_hex=v["raw_tx"],
                fees=Fees(int(v["max_fee_per_gas"]), int(v["max_priority_fee_per_gas"])),
                gas_limit=v["gas_limit"],
                version=v["version"],
                kind=v["kind"],
            ),
        )
        for v in rows
    ]


async def pending_count(conn: asyncpg.Connection, chain_id: int, sender: str | None) -> int:
    """Our transactions not yet mined on a chain."""
    if sender is None:
        value = await conn.fetchval(
            "SELECT count(*) FROM settlement_transactions WHERE chain_id = $1 AND state = 'pending'", chain_id
        )
    else:
        value = await conn.fetchval(
            "SELECT count(*) FROM settlement_transactions WHERE chain_id = $1 AND sender = $2 AND state = 'pending'",
            chain_id,
            sender.lower(),
        )
    return int(value or 0)
