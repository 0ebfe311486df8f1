"""Migration 070: the constraints hold the panel invariants whatever the code does."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from runtime.db import connect

ESCROW = "0x" + "e3" * 20
V = ["0x" + f"{i:02x}" * 20 for i in range(1, 8)]
POSTER = "0x" + "aa" * 20


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await connect(database_url)
    for i, v in enumerate(V):
        await connection.execute(
            "INSERT INTO panel_verifiers (address, operator, chains) VALUES ($1, $2, $3)",
            v, f"op{i}", [31337],
        )
    try:
        yield connection
    finally:
        await connection.close()


async def _round(conn: asyncpg.Connection, round_no: int = 1, rerun_of: str | None = None) -> str:
    round_id = f"31337:{ESCROW}:7:dispute:{round_no}"
    await conn.execute(
        "INSERT INTO panel_rounds (round_id, chain_id, escrow, task_id, reason, round, rerun_of,"
        " secret_version, status, deadline) VALUES ($1, 31337, $2, 7, 'dispute', $3, $4, 'k1',"
        " 'open', now() + interval '1 hour')",
        round_id, ESCROW, round_no, rerun_of,
    )
    return round_id


async def _seat(conn: asyncpg.Connection, round_id: str, seat: int, verifier: str) -> None:
    await conn.execute(
        "INSERT INTO panel_seats (round_id, seat, chain_id, escrow, task_id, reason, verifier,"
        " calibration_ppm) VALUES ($1, $2, 31337, $3, 7, 'dispute', $4, 500000)",
        round_id, seat, ESCROW, verifier,
    )


async def test_a_rerun_seats_only_fresh_verifiers(conn: asyncpg.Connection) -> None:
    first = await _round(conn)
    for seat in range(3):
        await _seat(conn, first, seat, V[seat])
    with pytest.raises(asyncpg.CheckViolationError):
        await conn.execute(
            "INSERT INTO panel_seats (round_id, seat, chain_id, escrow, task_id, reason, verifier,"
            " calibration_ppm) VALUES ($1, 3, 31337, $2, 7, 'dispute', $3, 500000)",
            first, ESCROW, V[3],
        )
    with pytest.raises(asyncpg.CheckViolationError):  # round 2 must name the round it reruns
        await _round(conn, 2)
    await conn.execute(
        "UPDATE panel_rounds SET status = 'closed', outcome = 'rerun', closed_at = now(),"
        " consensus_ppm = 500000 WHERE round_id = $1", first,
    )
    second = await _round(conn, 2, first)
    with pytest.raises(asyncpg.UniqueViolationError):
        await _seat(conn, second, 0, V[1])
    await _seat(conn, second, 0, V[4])
    with pytest.raises(asyncpg.CheckViolationError):  # a rerun never reruns
        await conn.execute(
            "UPDATE panel_rounds SET status = 'closed', outcome = 'rerun', closed_at = now()"
            " WHERE round_id = $1", second,
        )


async def test_round_outcomes_carry_what_they_must(conn: asyncpg.Connection) -> None:
    round_id = await _round(conn)
    for bad in (
        "status = 'closed', closed_at = now()",  # closed without outcome
        "status = 'closed', outcome = 'ruling', closed_at = now()",  # ruling without split
        "status = 'closed', outcome = 'inconclusive', closed_at = now(), agent_share_bps = 5000",
        "agent_share_bps = 10001",
    ):
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.execute(f"UPDATE panel_rounds SET {bad} WHERE round_id = $1", round_id)


async def test_attestations_are_whole_and_timeouts_never_attest(conn: asyncpg.Connection) -> None:
    round_id = await _round(conn)
    await _seat(conn, round_id, 0, V[0])
    with pytest.raises(asyncpg.CheckViolationError):
        await conn.execute("UPDATE panel_seats SET quality_ppm = 1 WHERE round_id = $1", round_id)
    sig = "0x" + "ab" * 65
    with pytest.raises(asyncpg.CheckViolationError):
        await conn.execute(
            "UPDATE panel_seats SET quality_ppm = 1, confidence_ppm = 1, signature = $2,"
            " attested_at = now(), timed_out = true WHERE round_id = $1", round_id, sig,
        )


async def test_fee_ledger_balances_and_pays_only_weighted_seats(conn: asyncpg.Connection) -> None:
    round_id = await _round(conn)
    sig = "0x" + "ab" * 65
    for seat in range(3):
        await _seat(conn, round_id, seat, V[seat])
    await conn.execute(
        "UPDATE panel_seats SET quality_ppm = 800000, confidence_ppm = 900000, signature = $2,"
        " attested_at = now() WHERE round_id = $1 AND seat < 2", round_id, sig,
    )
    await conn.execute("UPDATE panel_seats SET timed_out = true WHERE round_id = $1 AND seat = 2", round_id)

    async def entry(account: str, role: str, delta: int, reason: str) -> None:
        await conn.execute(
            "INSERT INTO panel_fee_ledger (entry_id, round_id, chain_id, account, role, delta_units,"
            " reason) VALUES ($1, $2, 31337, $3, $4, $5, $6)",
            f"{round_id}:{account}:{reason}", round_id, account, role, delta, reason,
        )

    with pytest.raises(asyncpg.CheckViolationError, match="weighted seat"):  # timed out: no fee
        await entry(V[2], "verifier", 50, "attestation_fee")
    with pytest.raises(asyncpg.CheckViolationError, match="sum to zero"):
        async with conn.transaction():
            await entry(V[0], "verifier", 50, "attestation_fee")
            await entry(POSTER, "poster", -60, "panel_fee")
    async with conn.transaction():
        await entry(V[0], "verifier", 50, "attestation_fee")
        await entry(V[1], "verifier", 50, "attestation_fee")
        await entry(POSTER, "poster", -100, "panel_fee")
    assert await conn.fetchval("SELECT sum(delta_units) FROM panel_fee_ledger") == 0


async def test_migration_170_binds_rounds_freezes_seats_and_keeps_pending_operators_whole(
    conn: asyncpg.Connection,
) -> None:
    """Migration 170: a round's binding is whole (attempt and evidence hash together, a
    well-formed hash), a seat's verifier, operator and calibration never change, and a
    pending operator change comes with its date and differs from the current id."""
    rid = await _round(conn)
    for attempt, evidence in ((1, None), (None, "0x" + "22" * 32), (1, "0x" + "22" * 31), (0, "0x" + "22" * 32)):
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.execute("UPDATE panel_rounds SET attempt = $2, evidence_hash = $3 WHERE round_id = $1",
                               rid, attempt, evidence)
    await conn.execute("UPDATE panel_rounds SET attempt = 1, evidence_hash = $2 WHERE round_id = $1", rid, "0x" + "22" * 32)
    await conn.execute(
        "INSERT INTO panel_seats (round_id, seat, chain_id, escrow, task_id, reason, verifier, calibration_ppm,"
        " operator) VALUES ($1, 0, 31337, $2, 7, 'dispute', $3, 500000, 'op0')", rid, ESCROW, V[0])
    for change in ("operator = 'op9'", "operator = NULL", f"verifier = '{V[1]}'", "calibration_ppm = 600000"):
        with pytest.raises(asyncpg.CheckViolationError, match="frozen"):
            await conn.execute(f"UPDATE panel_seats SET {change} WHERE round_id = $1", rid)
    await conn.execute("UPDATE panel_seats SET quality_ppm = 1, confidence_ppm = 1, signature = $2, attested_at = now()"
                       " WHERE round_id = $1", rid, "0x" + "ab" * 65)  # attesting is not a change of seat
    for pending, at in (("op9", None), (None, "now()"), ("op0", "now()")):
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.execute(f"UPDATE panel_verifiers SET pending_operator = $2, operator_effective_at = {at or 'NULL'}"
                               " WHERE address = $1", V[0], pending)
    with pytest.raises(asyncpg.CheckViolationError):
        await conn.execute("UPDATE panel_rounds SET min_confidence_ppm = 1000001 WHERE round_id = $1", rid)
