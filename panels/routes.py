"""Panel routes: register a verifier, list my assignments, attest, read a closed round,
read a calibration.

Registration and assignments are signed requests (`runtime.web.auth`): only the verifier
itself learns where it sits, so nobody can find a panel to bribe through the API. An
attestation carries its own EIP-712 signature (`schemas.panels`), bound to chain, escrow,
task and round; a seat takes one attestation, before its deadline. A round is readable only
after it closed. An assignment shows the frozen terms, the output schema, the delivered
output and a compute report; never the poster's review nor another attestation.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Request
from prometheus_client import Histogram
from pydantic import BaseModel, ConfigDict

from panels.rules import OPERATOR_COOLDOWN_SECONDS
from panels.service import escrow_spellings, output_schema
from runtime.web.auth import authenticate
from runtime.web.errors import ApiProblem
from runtime.web.params import AddressPath
from schemas import jsonbounds
from schemas import panels as msg
from schemas.task_terms import result_hash
from schemas.verdict import InvalidSignature

router = APIRouter(tags=["panels"])

ATTESTATION_SECONDS = Histogram(
    "escrowd_panel_attestation_seconds",
    "Seconds from the draw to an accepted attestation",
    buckets=(5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200),
)

RoundPath = Annotated[str, Path(max_length=200, pattern=r"^[0-9]+:0x[0-9a-f]{40}:[0-9]+:[a-z_]+:[12]$")]


class Assignment(BaseModel):
    """One open seat of the caller, with what a verifier may see."""

    model_config = ConfigDict(extra="forbid")

    round_id: str
    chain_id: int
    escrow: str
    task_id: int
    round: int
    attempt: int | None
    evidence_hash: str | None
    deadline: datetime
    terms: dict[str, Any] | None
    brief: str | None
    output_schema: dict[str, Any] | None
    output: Any
    compute_report: dict[str, Any]


async def _caller_address(request: Request) -> str:
    """The signer, for the API's own deployment; its nonce is spent first, in a transaction of
    its own, so a refused request cannot be replayed (`runtime.web.auth.authenticate`)."""
    caller = await authenticate(request)
    return caller.address.lower()


@router.post("/panels/verifiers", status_code=201, summary="Join the verifier pool (signed by the verifier)")
async def register_verifier(request: Request, body: Annotated[msg.VerifierRegistration, Body()]) -> dict[str, Any]:
    """Register or update the caller as a verifier; calibration is kept across updates.

    A new operator id of a registered verifier takes effect only `OPERATOR_COOLDOWN_SECONDS`
    later (7 days): a verifier cannot leave a party's operator just before its dispute. A
    change already due is folded in first; asking for the current id cancels a pending one.
    """
    chains = sorted(set(body.chains))
    async with request.app.state.pool.acquire() as conn, conn.transaction():
        caller = await _caller_address(request)
        if caller != body.address.lower():
            raise ApiProblem(403, "NOT_VERIFIER", "a verifier registers only its own address")
        await conn.execute(
            "UPDATE panel_verifiers SET operator = pending_operator, pending_operator = NULL,"
            " operator_effective_at = NULL WHERE address = $1 AND operator_effective_at <= now()", caller,
        )
        row = await conn.fetchrow(
            "INSERT INTO panel_verifiers (address, operator, chains) VALUES ($1, $2, $3)"
            " ON CONFLICT (address) DO UPDATE SET chains = EXCLUDED.chains, active = true, updated_at = now(),"
            " pending_operator = CASE WHEN panel_verifiers.operator = EXCLUDED.operator THEN NULL"
            "   WHEN panel_verifiers.pending_operator = EXCLUDED.operator THEN panel_verifiers.pending_operator"
            "   ELSE EXCLUDED.operator END,"
            " operator_effective_at = CASE WHEN panel_verifiers.operator = EXCLUDED.operator THEN NULL"
            "   WHEN panel_verifiers.pending_operator = EXCLUDED.operator THEN panel_verifiers.operator_effective_at"
            "   ELSE now() + make_interval(secs => $4) END"
            " RETURNING operator, pending_operator, operator_effective_at, calibration_ppm, rounds",
            caller, body.operator, chains, OPERATOR_COOLDOWN_SECONDS,
        )
    effective_at = row["operator_effective_at"]
    return {"address": caller, "operator": row["operator"], "chains": chains,
            "pending_operator": row["pending_operator"],
            "operator_effective_at": None if effective_at is None else effective_at.isoformat(),
            "calibration_ppm": row["calibration_ppm"], "rounds": row["rounds"]}


@router.get("/panels/assignments", summary="The caller's open seats (signed by the verifier)")
async def my_assignments(request: Request) -> list[Assignment]:
    """Open rounds where the caller sits and has not attested yet."""
    async with request.app.state.pool.acquire() as conn:
        async with conn.transaction():
            caller = await _caller_address(request)
        rows = await conn.fetch(
            "SELECT r.round_id, r.chain_id, r.escrow, r.task_id, r.round, r.deadline, r.attempt, r.evidence_hash,"
            " t.task_hash"
            " FROM panel_seats s JOIN panel_rounds r USING (round_id)"
            " LEFT JOIN panel_tasks t ON t.chain_id = r.chain_id AND t.escrow = r.escrow AND t.task_id = r.task_id"
            " WHERE s.verifier = $1 AND s.attested_at IS NULL AND r.status = 'open' AND r.deadline > now()"
            " ORDER BY r.deadline, r.round_id LIMIT 100",
            caller,
        )
        out = []
        for r in rows:
            stored = await conn.fetchrow("SELECT terms, canonical FROM task_terms WHERE task_hash = $1", r["task_hash"])
            # The canonical text as registered (what taskHash commits to), not the jsonb copy,
            # so a verifier can hash exactly what it is shown.
            terms = None if stored is None else jsonbounds.loads(stored["canonical"], max_bytes=None)
            # A public brief is shown as stored; the verifier checks it against the terms'
            # instructionsDigest itself. A private brief is not wrapped to panel seats.
            brief = await conn.fetchval(
                "SELECT brief FROM task_briefs WHERE task_hash = $1 AND NOT private", r["task_hash"]
            )
            # The delivery of the judged attempt: the newest finalize whose result hashes to the
            # round's evidence hash (the bot checks it again against the chain).
            finalized = await conn.fetch(
                "SELECT payload, created_at, updated_at FROM verification_requests WHERE kind = 'finalize'"
                " AND chain_id = $1 AND escrow_address = ANY($2::text[]) AND task_id = $3 AND attempt = $4"
                " AND state <> 'rejected' ORDER BY created_at DESC LIMIT 5",
                r["chain_id"], escrow_spellings(r["escrow"]), r["task_id"], r["attempt"],
            )
            finalize = next((f for f in finalized if isinstance(f["payload"], dict) and "result" in f["payload"]
                             and result_hash(f["payload"]["result"]) == r["evidence_hash"]), None)
            output = finalize["payload"]["result"] if finalize is not None else None
            report: dict[str, Any] = {"attempt": r["attempt"]}
            if finalize is not None:
                report["finalized_at"] = finalize["created_at"].astimezone(UTC).isoformat()
                report["checked_seconds"] = (finalize["updated_at"] - finalize["created_at"]).total_seconds()
            out.append(Assignment(
                round_id=r["round_id"], chain_id=r["chain_id"], escrow=r["escrow"], task_id=int(r["task_id"]),
                round=r["round"], attempt=r["attempt"], evidence_hash=r["evidence_hash"], deadline=r["deadline"],
                terms=terms, brief=brief, output_schema=output_schema(terms),
                output=output, compute_report=report,
            ))
    return out


@router.post("/panels/attestations", status_code=201, summary="Attest quality and confidence for a seat")
async def attest(request: Request, body: Annotated[msg.SignedAttestation, Body()]) -> dict[str, Any]:
    """The attestation must be signed by its verifier's key, for an open seat, in time, and
    name the attempt and the evidence hash the round judges (409 `WRONG_EVIDENCE` otherwise)."""
    a = body.attestation
    try:
        signer = msg.attestation_signer(body)
    except InvalidSignature:
        raise ApiProblem(401, "SIGNATURE_INVALID", "the attestation signature is invalid") from None
    if signer != a.verifier:
        raise ApiProblem(401, "SIGNATURE_INVALID", "the attestation is not signed by its verifier")
    async with request.app.state.pool.acquire() as conn, conn.transaction():
        # The seat of this verifier in round N of the task; a sampled review and a dispute
        # of one task never seat the same verifier, so at most one matches.
        row = await conn.fetchrow(
            "SELECT s.round_id, r.status, r.deadline <= now() AS late, r.attempt, r.evidence_hash,"
            " extract(epoch FROM now() - r.drawn_at)::float8 AS waited, s.attested_at, s.timed_out"
            " FROM panel_seats s JOIN panel_rounds r USING (round_id)"
            " WHERE s.chain_id = $1 AND s.escrow = $2 AND s.task_id = $3 AND r.round = $4 AND s.verifier = $5"
            " ORDER BY r.status = 'open' DESC, r.drawn_at DESC LIMIT 1 FOR UPDATE OF s",
            a.chain_id, a.escrow.lower(), a.task_id, a.round, a.verifier.lower(),
        )
        if row is None:
            raise ApiProblem(404, "NO_SEAT", "this verifier holds no seat in that round")
        if row["attested_at"] is not None:
            raise ApiProblem(409, "ALREADY_ATTESTED", "this seat has attested already")
        if row["status"] != "open" or row["late"] or row["timed_out"]:
            raise ApiProblem(409, "ROUND_CLOSED", "the round is closed or its deadline has passed")
        if row["evidence_hash"] is None or (a.attempt, a.evidence_hash) != (row["attempt"], row["evidence_hash"]):
            raise ApiProblem(409, "WRONG_EVIDENCE", "the attestation is not for the attempt and evidence this round judges")
        rid = row["round_id"]
        await conn.execute(
            "UPDATE panel_seats SET quality_ppm = $3, confidence_ppm = $4, signature = $5, attested_at = now()"
            " WHERE round_id = $1 AND verifier = $2",
            rid, a.verifier.lower(), a.quality_ppm, a.confidence_ppm, body.signature,
        )
    ATTESTATION_SECONDS.observe(max(0.0, float(row["waited"])))
    return {"round_id": rid, "verifier": a.verifier.lower(), "accepted": True}


@router.get("/panels/rounds/{round_id}", summary="A closed round: seats, attestations, consensus")
async def read_round(request: Request, round_id: RoundPath) -> dict[str, Any]:
    """Refused while the round is open, so no verifier reads another's attestation."""
    async with request.app.state.pool.acquire() as conn:
        rnd = await conn.fetchrow("SELECT * FROM panel_rounds WHERE round_id = $1", round_id)
        if rnd is None:
            raise ApiProblem(404, "ROUND_UNKNOWN", "no such round")
        if rnd["status"] != "closed":
            raise ApiProblem(409, "ROUND_OPEN", "a round can be read once it has closed")
        seats = await conn.fetch("SELECT * FROM panel_seats WHERE round_id = $1 ORDER BY seat", round_id)
        ruling = await conn.fetchrow("SELECT * FROM panel_rulings WHERE round_id = $1", round_id)
    return {
        "round_id": round_id, "chain_id": rnd["chain_id"], "escrow": rnd["escrow"], "task_id": int(rnd["task_id"]),
        "round": rnd["round"], "rerun_of": rnd["rerun_of"], "outcome": rnd["outcome"],
        "attempt": rnd["attempt"], "evidence_hash": rnd["evidence_hash"], "min_confidence_ppm": rnd["min_confidence_ppm"],
        "consensus_ppm": rnd["consensus_ppm"], "spread_ppm": rnd["spread_ppm"], "schema_ok": rnd["schema_ok"],
        "agent_share_bps": rnd["agent_share_bps"], "secret_version": rnd["secret_version"],
        "drawn_at": rnd["drawn_at"].isoformat(), "deadline": rnd["deadline"].isoformat(),
        "seats": [
            {"seat": s["seat"], "verifier": s["verifier"], "operator": s["operator"],
             "calibration_ppm": s["calibration_ppm"],
             "quality_ppm": s["quality_ppm"], "confidence_ppm": s["confidence_ppm"],
             "signature": s["signature"], "timed_out": s["timed_out"]}
            for s in seats
        ],
        "ruling": None if ruling is None else {
            "agent_share_bps": ruling["agent_share_bps"], "signer": ruling["signer"],
            "signature": ruling["signature"], "status": ruling["status"],
        },
    }


@router.get("/panels/calibration/{address}", summary="A verifier's or poster's calibration")
async def read_calibration(request: Request, address: AddressPath) -> dict[str, Any]:
    """Calibration in ppm and the rounds that moved it."""
    async with request.app.state.pool.acquire() as conn:
        verifier = await conn.fetchrow(
            "SELECT calibration_ppm, rounds FROM panel_verifiers WHERE address = $1", address.lower()
        )
        poster = await conn.fetchrow(
            "SELECT calibration_ppm, rounds FROM panel_posters WHERE address = $1", address.lower()
        )
    if verifier is None and poster is None:
        raise ApiProblem(404, "CALIBRATION_UNKNOWN", "neither a registered verifier nor a calibrated poster")
    return {
        "address": address.lower(),
        "verifier": None if verifier is None else dict(verifier),
        "poster": None if poster is None else dict(poster),
    }
