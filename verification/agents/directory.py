"""The executor directory (seed 000, "Who can be a verifier"): who works, who verifies, where.

An executor registers itself — the registration is signed by its own key, so the signer
is the address — with its roles (`worker`, `verifier`), the chains it settles on, whether
it verifies other posters' tasks (opt-in), its capabilities and an encryption public key
(compressed secp256k1, for private briefs). Registering again replaces the entry; every
registration and heartbeat marks it seen. A verifier *qualifies* for a chain when it has
the verifier role, opted in, settles on that chain and was seen within the staleness
window (it is running).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

import asyncpg
from coincurve import PublicKey
from pydantic import (
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
)

from schemas.panels import ChainListed

Role = Literal["worker", "verifier"]
DEFAULT_STALE_SECONDS = 300
Capability = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_.:-]{0,63}$")]


class ExecutorRegistration(ChainListed):
    """What an executor says about itself (signed by its own key)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    roles: list[Role] = Field(min_length=1, max_length=2)
    chains: list[Annotated[int, Field(gt=0, le=2**53 - 1, strict=True)]] = Field(
        min_length=1, max_length=32
    )  # JSON-exact
    verify_others: bool = Field(alias="verifyOthers", strict=True, description="Verify other posters' tasks (opt-in)")
    capabilities: list[Capability] = Field(default_factory=list, max_length=50)
    encryption_public_key: str = Field(
        alias="encryptionPublicKey", pattern=r"^0x(02|03)[0-9a-fA-F]{64}$", description="Compressed secp256k1 key"
    )

    # Strict types: no `0` for false (strict=True above), no `"1"` for a chain (ChainListed).
    @field_validator("encryption_public_key")
    @classmethod
    def _lower(cls, value: str) -> str:
        return value.lower()

    def key_is_on_curve(self) -> bool:
        """Whether the encryption key is a point of secp256k1 (checked by the route after the
        signature: the schema can say "33 bytes", not "on the curve")."""
        try:
            PublicKey(bytes.fromhex(self.encryption_public_key[2:]))
        except ValueError:
            return False
        return True

    @field_validator("roles", "chains", "capabilities")
    @classmethod
    def _distinct(cls, value: list[Any]) -> list[Any]:
        return sorted(set(value))


@dataclass(frozen=True)
class Executor:
    """A directory entry."""

    address: str
    roles: tuple[str, ...]
    chains: tuple[int, ...]
    verify_others: bool
    capabilities: tuple[str, ...]
    encryption_public_key: str
    last_seen: datetime


def qualifies(executor: Executor, role: Role, chain_id: int | None, now: datetime, stale_seconds: float) -> bool:
    """Listed under `role` (and `chain_id`): has the role, is running, settles there; verifiers opted in."""
    if role not in executor.roles:
        return False
    if role == "verifier" and not executor.verify_others:
        return False
    if chain_id is not None and chain_id not in executor.chains:
        return False
    return (now - executor.last_seen).total_seconds() <= stale_seconds


# ---------------------------------------------------------------------------- storage


def _executor(row: Any) -> Executor:
    return Executor(
        address=row["address"], roles=tuple(row["roles"]), chains=tuple(int(c) for c in row["chains"]),
        verify_others=row["verify_others"], capabilities=tuple(row["capabilities"]),
        encryption_public_key=row["encryption_key"], last_seen=row["last_seen"],
    )  # fmt: skip


async def register(conn: asyncpg.Connection, address: str, body: ExecutorRegistration) -> bool:
    """Insert or replace the signer's entry and mark it seen; True when it is new."""
    return bool(
        await conn.fetchval(
            "INSERT INTO executors (address, roles, chains, verify_others, capabilities, encryption_key)"
            " VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (address) DO UPDATE SET roles = $2, chains = $3,"
            " verify_others = $4, capabilities = $5, encryption_key = $6, updated_at = now(), last_seen = now()"
            " RETURNING (xmax = 0)",
            address.lower(), list(body.roles), list(body.chains), body.verify_others, list(body.capabilities),
            body.encryption_public_key,
        )
    )


async def heartbeat(conn: asyncpg.Connection, address: str) -> bool:
    """Mark the executor seen now; False when it is not registered."""
    status = await conn.execute("UPDATE executors SET last_seen = now() WHERE address = $1", address.lower())
    return str(status).endswith(" 1")


async def load(conn: asyncpg.Connection, address: str) -> Executor | None:
    """One entry."""
    row = await conn.fetchrow("SELECT * FROM executors WHERE address = $1", address.lower())
    return _executor(row) if row is not None else None


async def db_now(conn: asyncpg.Connection) -> datetime:
    """The database's clock (last_seen is written with it)."""
    now: datetime = await conn.fetchval("SELECT now()")
    return now


async def listed(
    conn: asyncpg.Connection, role: Role, chain_id: int | None, stale_seconds: float, limit: int
) -> Sequence[Executor]:
    """The executors that qualify, most recently seen first."""
    rows = await conn.fetch(
        "SELECT * FROM executors WHERE $1 = ANY(roles) AND ($2::bigint IS NULL OR $2 = ANY(chains))"
        " AND ($1 <> 'verifier' OR verify_others) ORDER BY last_seen DESC, address LIMIT $3",
        role, chain_id, limit,
    )  # fmt: skip
    now = await db_now(conn)
    return [e for e in map(_executor, rows) if qualifies(e, role, chain_id, now, stale_seconds)]
