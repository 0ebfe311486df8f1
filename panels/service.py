"""The panel service: opens a round for every disputed task, closes it at the deadline (or
when every seat attested), reruns a colluding panel once, and issues the signed ruling.

Group `escrowd-panels`, topic `escrow.events.v1`, on the shared idempotent runtime: each
event's effects and outbox rows commit with its inbox row. Rounds close in the runtime's
idle hook (`close_due_rounds`), inside one transaction per call; open rounds are locked
`FOR UPDATE SKIP LOCKED`, so several members never close the same round twice. The rules
are `panels.rules`; docs/panels.md states them.

Sampled manual reviews open rounds of their own (`maybe_sample_review`). The ruling is sent
on chain by `escrowd relay rulings` (`relayer/settlement/rulings.py`), not here: rulings wait
in `panel_rulings` and on `escrow.panel-rulings.v1`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any, Literal

import asyncpg
import structlog
from prometheus_client import Counter, Histogram

from panels import rules
from runtime.consumer import IdempotentConsumer, InboundMessage
from runtime.kafka import cloudevent_headers
from runtime.outbox import OutboxMessage, enqueue
from schemas import jsoncodec
from schemas import panels as msg
from schemas.events import EscrowEventMessage
from schemas.topics import (
    DEAD_LETTERS,
    ESCROW_EVENTS,
    PANEL_ATTESTATIONS,
    PANEL_CALIBRATION,
    PANEL_CONSENSUS,
    PANEL_FEES,
    PANEL_ROUNDS,
    PANEL_RULINGS,
)
from schemas.verdict import checksum_address

log = structlog.get_logger(__name__)

GROUP = "escrowd-panels"
ROUNDS = Counter("escrowd_panel_rounds_total", "Panel rounds by event", ["event"])
CALIBRATION_CHANGE = Histogram(
    "escrowd_panel_calibration_change_ppm",
    "How far one round moved one verifier's calibration (ppm, signed)",
    buckets=(-100_000, -50_000, -20_000, -5_000, 0, 5_000, 20_000, 50_000, 100_000),
)

MAX_SCHEMA_OUTPUT_BYTES = 1_000_000


Admission = Literal["open", "allowlist"]


@dataclass(frozen=True)
class PanelConfig:
    """What the service needs; the secret and key never leave this object (no repr).

    `admission` is the deployment's sybil resistance: `open` draws every registered verifier
    under its self-declared operator id; `allowlist` draws only the addresses of `allowlist`
    (address lower case → operator identity), under the operator the list names, and the
    list also names the operators of parties who are not verifiers (workers, posters).
    """

    secret: bytes
    secret_version: str
    ruling_key: str
    attestation_seconds: int = 3600
    fee_units: int = 50_000
    min_confidence_ppm: int = rules.MIN_CONFIDENCE_PPM
    operator_cap_ppm: int = rules.OPERATOR_WEIGHT_CAP_PPM
    admission: Admission = "open"
    allowlist: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowlist", MappingProxyType({k.lower(): v for k, v in self.allowlist.items()}))
        if self.admission == "allowlist" and not self.allowlist:
            raise ValueError("admission 'allowlist' needs a non-empty allow-list")

    def __repr__(self) -> str:
        return (
            f"PanelConfig(secret_version={self.secret_version!r}, attestation_seconds={self.attestation_seconds},"
            f" admission={self.admission!r})"
        )


def round_id(chain_id: int, escrow: str, task_id: int, reason: str, round_no: int) -> str:
    """`<chain>:<escrow lower>:<task>:<reason>:<round>`."""
    return f"{chain_id}:{escrow.lower()}:{task_id}:{reason}:{round_no}"


def task_key(chain_id: int, escrow: str, task_id: int) -> str:
    """The draw's task key `CHAIN:ESCROW:TASK` (escrow lower case)."""
    return f"{chain_id}:{escrow.lower()}:{task_id}"


def escrow_spellings(escrow: str) -> list[str]:
    """The escrow as the verification tables may hold it: EIP-55 (how the API and the
    verification consumer write it) and lower case (how this service does)."""
    return [checksum_address(escrow), escrow.lower()]


def output_schema(terms: dict[str, Any] | None) -> dict[str, Any] | None:
    """The output schema of the terms: the JSON Schema of a `schema_validation` verifier."""
    if not isinstance(terms, dict):
        return None
    verifier = terms.get("verifier")
    if isinstance(verifier, dict) and verifier.get("kind") == "schema_validation":
        config = verifier.get("config")
        # `schema`, as documented; `json_schema`, the field's own name, which the verifier takes too.
        for name in ("schema", "json_schema"):
            if isinstance(config, dict) and isinstance(config.get(name), dict):
                return dict(config[name])
    return None


def _outbox(message_id: str, topic: str, key: str, body: Any, event_type: str, subject: str) -> OutboxMessage:
    return OutboxMessage(
        message_id=message_id,
        topic=topic,
        key=key.encode(),
        payload=jsoncodec.dumps(body),
        headers=cloudevent_headers(
            id=message_id, source="escrowd/panels", type=event_type, subject=subject, time=None
        ),
    )


class PanelHandler:
    """Consumes escrow events: keeps the parties of each task, opens rounds on disputes.

    The runtime's idle hook closes due rounds only when the partitions are quiet; under a
    steady stream of events the handler sweeps too, at most once per `sweep_seconds`, so a
    busy topic never holds a round open past its deadline.
    """

    def __init__(self, config: PanelConfig, sweep_seconds: float = 1.0) -> None:
        self.config = config
        self.sweep_seconds = sweep_seconds
        self._last_sweep = time.monotonic()

    async def __call__(self, conn: asyncpg.Connection, message: InboundMessage) -> None:
        await self._handle(conn, message)
        if time.monotonic() - self._last_sweep >= self.sweep_seconds:
            self._last_sweep = time.monotonic()
            await close_due_rounds(conn, self.config)

    async def _handle(self, conn: asyncpg.Connection, message: InboundMessage) -> None:
        event = EscrowEventMessage.model_validate(message.json())
        if event.task_id is None:
            return
        chain, escrow, task = event.chain_id, event.escrow_address.lower(), event.task_id
        args = event.args
        await conn.execute(
            "INSERT INTO panel_tasks (chain_id, escrow, task_id) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
            chain, escrow, task,
        )
        if event.removed:
            if event.event == "DisputeRaised":
                await retract_round(conn, chain, escrow, task, "dispute")
            elif event.event == "VerificationCompleted":
                await retract_round(conn, chain, escrow, task, "review_sample")
            return
        match event.event:
            case "TaskCreated":
                await conn.execute(
                    "UPDATE panel_tasks SET poster = $4, task_hash = $5 WHERE chain_id = $1 AND escrow = $2"
                    " AND task_id = $3", chain, escrow, task, str(args["poster"]).lower(),
                    _hex(args["taskHash"]),
                )
            case "TaskAccepted":
                await conn.execute(
                    "UPDATE panel_tasks SET agent = $4 WHERE chain_id = $1 AND escrow = $2 AND task_id = $3",
                    chain, escrow, task, str(args["agent"]).lower(),
                )
            case "EvidenceSubmitted":
                # The latest attempt and its evidence hash (attempts only grow on chain).
                await conn.execute(
                    "UPDATE panel_tasks SET attempt = $4, evidence_hash = $5 WHERE chain_id = $1"
                    " AND escrow = $2 AND task_id = $3 AND attempt <= $4", chain, escrow, task,
                    int(args["attempt"]), _hex(args["evidenceHash"]),
                )
            case "DisputeRaised":
                attempt = int(args["attempt"])
                evidence = await conn.fetchval(
                    "SELECT evidence_hash FROM panel_tasks WHERE chain_id = $1 AND escrow = $2 AND task_id = $3"
                    " AND attempt = $4", chain, escrow, task, attempt,
                )
                await open_round(conn, self.config, chain, escrow, task, 1,
                                 judged=None if evidence is None else (attempt, evidence))
            case "DisputeResolved":
                # The human arbiter (or an earlier ruling) settled it: an open round stops here.
                closed = await conn.execute(
                    "UPDATE panel_rounds SET status = 'closed', outcome = 'superseded', closed_at = now()"
                    " WHERE chain_id = $1 AND escrow = $2 AND task_id = $3 AND reason = 'dispute'"
                    " AND status = 'open'", chain, escrow, task,
                )
                if closed != "UPDATE 0":
                    ROUNDS.labels("superseded").inc()
            case "VerificationCompleted":
                await maybe_sample_review(conn, self.config, chain, escrow, task, args)
            case _:
                return


def _hex(value: Any) -> str:
    if isinstance(value, bytes | bytearray):
        return "0x" + bytes(value).hex()
    return str(value).lower()


async def retract_round(conn: asyncpg.Connection, chain: int, escrow: str, task: int, reason: str) -> None:
    """A reorg removed the dispute (or the sampled verdict): an open round closes as
    `retracted` (it reopens if the event comes back, with the same seats and attestations)."""
    await conn.execute(
        "UPDATE panel_rounds SET status = 'closed', outcome = 'retracted', closed_at = now()"
        " WHERE chain_id = $1 AND escrow = $2 AND task_id = $3 AND reason = $4 AND status = 'open'",
        chain, escrow, task, reason,
    )
    ROUNDS.labels("retracted").inc()


async def maybe_sample_review(
    conn: asyncpg.Connection, config: PanelConfig, chain: int, escrow: str, task: int, args: dict[str, Any]
) -> str | None:
    """A manual review's verdict (the poster's claim) goes to a panel with the poster's rate.

    Only tasks whose registered terms say `manual` are sampled; the first sampled review of a
    task is the one panelled (one `review_sample` series per task).
    """
    row = await conn.fetchrow(
        "SELECT t.poster, m.verification_mode FROM panel_tasks t JOIN task_terms m ON m.task_hash = t.task_hash"
        " WHERE t.chain_id = $1 AND t.escrow = $2 AND t.task_id = $3", chain, escrow, task,
    )
    if row is None or row["verification_mode"] != "manual" or row["poster"] is None:
        return None
    agent = str(args["agent"]).lower()
    calibration = await conn.fetchval(
        "SELECT calibration_ppm FROM panel_posters WHERE address = $1", row["poster"]
    )
    streak = await conn.fetchval(
        "SELECT streak FROM panel_pair_drift WHERE poster = $1 AND agent = $2", row["poster"], agent
    )
    rate = rules.review_sample_rate_ppm(
        rules.POSTER_START_CALIBRATION_PPM if calibration is None else calibration, streak or 0
    )
    if not rules.sample_review(config.secret, task_key(chain, escrow, task), int(args["attempt"]), rate):
        return None
    return await open_round(conn, config, chain, escrow, task, 1, reason="review_sample",
                            claim_passed=bool(args["passed"]),
                            judged=(int(args["attempt"]), _hex(args["evidenceHash"])))


async def _party_operators(conn: asyncpg.Connection, config: PanelConfig, parties: list[str]) -> set[str]:
    """The operators of the parties, whatever their roles: from the allow-list and from the
    verifier directory (current and pending operator ids alike), lower case."""
    found = {config.allowlist[p].lower() for p in parties if p in config.allowlist}
    for r in await conn.fetch(
        "SELECT operator, pending_operator FROM panel_verifiers WHERE address = ANY($1::text[])", parties
    ):
        found |= {o.lower() for o in (r["operator"], r["pending_operator"]) if o}
    return found


async def drawable_pool(
    conn: asyncpg.Connection, config: PanelConfig, chain: int, exclude_operators: set[str]
) -> tuple[list[rules.Candidate], list[str]]:
    """The candidates of `chain` under the deployment's admission, and the ids to leave out
    because an operator id they are moving to or from is excluded.

    A pending operator change counts from its `operator_effective_at`; until then the old id
    is the verifier's operator in the draw. Under `allowlist` the list's operator is the
    verifier's identity, whatever the verifier declared.
    """
    rows = await conn.fetch(
        "SELECT address, calibration_ppm,"
        " CASE WHEN operator_effective_at <= now() THEN pending_operator ELSE operator END AS operator,"
        " CASE WHEN operator_effective_at > now() THEN pending_operator END AS moving_to"
        " FROM panel_verifiers WHERE active AND $1 = ANY(chains)",
        chain,
    )
    pool: list[rules.Candidate] = []
    held: list[str] = []
    for r in rows:
        address = r["address"]
        if config.admission == "allowlist":
            if address not in config.allowlist:
                continue
            operator = config.allowlist[address]
        else:
            operator = r["operator"]
            if r["moving_to"] is not None and r["moving_to"].lower() in exclude_operators:
                held.append(address)
        pool.append(rules.Candidate(address, operator, r["calibration_ppm"]))
    return pool, held


async def open_round(
    conn: asyncpg.Connection,
    config: PanelConfig,
    chain: int,
    escrow: str,
    task: int,
    round_no: int,
    *,
    reason: str = "dispute",
    claim_passed: bool | None = None,
    judged: tuple[int, str] | None = None,
) -> str:
    """Draw and record round `round_no` of the task's dispute (or sampled review); publish
    it. Idempotent. Nobody who already sat on this task sits again, nor anyone of an
    operator that did. `judged` is the (attempt, evidence hash) the round is bound to."""
    rid = round_id(chain, escrow, task, reason, round_no)
    existing = await conn.fetchrow("SELECT status, outcome FROM panel_rounds WHERE round_id = $1", rid)
    if existing is not None:
        if existing["outcome"] == "retracted":
            await conn.execute(
                "UPDATE panel_rounds SET status = 'open', outcome = NULL, closed_at = NULL,"
                " deadline = greatest(deadline, now() + make_interval(secs => $2)) WHERE round_id = $1",
                rid, config.attestation_seconds,
            )
        return rid
    parties = await conn.fetchrow(
        "SELECT poster, agent FROM panel_tasks WHERE chain_id = $1 AND escrow = $2 AND task_id = $3",
        chain, escrow, task,
    )
    party_ids = [p for p in (parties["poster"], parties["agent"]) if p] if parties else []
    earlier = await conn.fetch(
        "SELECT verifier, operator FROM panel_seats WHERE chain_id = $1 AND escrow = $2 AND task_id = $3",
        chain, escrow, task,
    )
    excluded_ops = await _party_operators(conn, config, party_ids)
    excluded_ops |= {r["operator"].lower() for r in earlier if r["operator"]}
    pool, held = await drawable_pool(conn, config, chain, excluded_ops)
    now = datetime.now(UTC)
    deadline = now + timedelta(seconds=config.attestation_seconds)
    rerun_of = round_id(chain, escrow, task, reason, round_no - 1) if round_no > 1 else None
    if judged is None and rerun_of is not None:
        bound = await conn.fetchrow("SELECT attempt, evidence_hash FROM panel_rounds WHERE round_id = $1", rerun_of)
        if bound is not None and bound["attempt"] is not None:
            judged = (int(bound["attempt"]), bound["evidence_hash"])
    if judged is None:
        log.warning("panel_round_unbound", round_id=rid)  # no evidence known: no attestation can bind
    try:
        seats = rules.draw(
            config.secret, task_key(chain, escrow, task), round_no, pool,
            exclude_operators=excluded_ops, exclude_ids=[*party_ids, *held, *(r["verifier"] for r in earlier)],
            operator_cap_ppm=config.operator_cap_ppm,
        )
    except rules.PoolTooSmall:
        seats = []
    closed = not seats
    await conn.execute(
        "INSERT INTO panel_rounds (round_id, chain_id, escrow, task_id, reason, round, rerun_of, secret_version,"
        " status, outcome, drawn_at, deadline, closed_at, claim_passed, attempt, evidence_hash, min_confidence_ppm)"
        " VALUES ($1, $2, $3, $4, $13, $5, $6, $7, $8, $9, $10, $11, $12, $14, $15, $16, $17)",
        rid, chain, escrow, task, round_no, rerun_of, config.secret_version,
        "closed" if closed else "open", "pool_too_small" if closed else None, now, deadline,
        now if closed else None, reason, claim_passed, None if judged is None else judged[0],
        None if judged is None else judged[1], config.min_confidence_ppm,
    )
    for index, seat in enumerate(seats):
        await conn.execute(
            "INSERT INTO panel_seats (round_id, seat, chain_id, escrow, task_id, reason, verifier, calibration_ppm,"
            " operator) VALUES ($1, $2, $3, $4, $5, $8, $6, $7, $9)",
            rid, index, chain, escrow, task, seat.id, seat.calibration_ppm, reason, seat.operator,
        )
    record = msg.PanelRound(
        round_id=rid, chain_id=chain, escrow=escrow, task_id=task, round=round_no,
        reason=msg.RoundReason(reason), verifiers=[s.id for s in seats], drawn_at=now, deadline=deadline,
        status=msg.RoundStatus.CLOSED if closed else msg.RoundStatus.OPEN,
        outcome=msg.RoundOutcome.POOL_TOO_SMALL if closed else None,
    )
    await enqueue(conn, [_outbox(f"panel-round:{rid}:drawn", PANEL_ROUNDS, f"{chain}:{task}",
                                 record.model_dump(mode="json"), msg.ROUND_EVENT_TYPE, rid)])
    ROUNDS.labels("pool_too_small" if closed else "opened").inc()
    log.info("panel_round_opened", round_id=rid, seats=len(seats))
    return rid


async def close_due_rounds(conn: asyncpg.Connection, config: PanelConfig, limit: int = 100) -> list[str]:
    """Close every open round whose deadline passed or whose seats all attested."""
    rows = await conn.fetch(
        "SELECT round_id FROM panel_rounds r WHERE status = 'open' AND (deadline <= now() OR NOT EXISTS"
        " (SELECT 1 FROM panel_seats s WHERE s.round_id = r.round_id AND s.attested_at IS NULL))"
        " ORDER BY drawn_at, round_id LIMIT $1 FOR UPDATE SKIP LOCKED",
        limit,
    )
    closed = []
    for row in rows:
        await close_round(conn, config, row["round_id"])
        closed.append(row["round_id"])
    return closed


async def _schema_ok(conn: asyncpg.Connection, task: asyncpg.Record) -> tuple[bool, list[str]]:
    terms = await conn.fetchval("SELECT terms FROM task_terms WHERE task_hash = $1", task["task_hash"])
    schema = output_schema(terms)
    if schema is None:
        return True, []
    payload = await conn.fetchval(
        "SELECT payload FROM verification_requests WHERE kind = 'finalize' AND chain_id = $1"
        " AND escrow_address = ANY($2::text[]) AND task_id = $3 AND attempt = $4 AND state IN ('applied', 'stored')"
        " ORDER BY created_at DESC LIMIT 1",
        task["chain_id"], escrow_spellings(task["escrow"]), task["task_id"], task["attempt"],
    )
    if not isinstance(payload, dict) or "result" not in payload:
        return False, ["$: no delivered output"]
    output = payload["result"]
    if len(jsoncodec.dumps(output)) > MAX_SCHEMA_OUTPUT_BYTES:
        return False, ["$: output too large to check"]
    import jsonschema
    import referencing.exceptions

    try:
        violations = rules.schema_violations(output, schema)
    except (
        jsonschema.exceptions.SchemaError,
        jsonschema.exceptions.UnknownType,
        referencing.exceptions.Unresolvable,
        RecursionError,
    ) as exc:
        # The poster's schema passed the registration check but cannot be evaluated (a `$ref`
        # to nothing, or one back to itself that never descends into the output): its fault,
        # never the agent's, and no reason to stop closing rounds.
        log.warning("panel_schema_unusable", task_id=int(task["task_id"]), error_type=type(exc).__name__)
        return True, []
    return not violations, violations


async def close_round(conn: asyncpg.Connection, config: PanelConfig, rid: str) -> rules.RoundResult:
    """Time out silent seats, decide, and act on the outcome (ruling, rerun, arbiter)."""
    rnd = await conn.fetchrow("SELECT * FROM panel_rounds WHERE round_id = $1", rid)
    assert rnd is not None and rnd["status"] == "open"
    chain, escrow, task_id = rnd["chain_id"], rnd["escrow"], int(rnd["task_id"])
    await conn.execute(
        "UPDATE panel_seats SET timed_out = true WHERE round_id = $1 AND attested_at IS NULL", rid
    )
    seats = await conn.fetch("SELECT * FROM panel_seats WHERE round_id = $1 ORDER BY seat", rid)
    attestations = [_attestation(s) for s in seats]
    minimum = int(rnd["min_confidence_ppm"])
    result = rules.decide(rnd["round"], attestations, minimum)
    task = await conn.fetchrow(
        "SELECT * FROM panel_tasks WHERE chain_id = $1 AND escrow = $2 AND task_id = $3", chain, escrow, task_id
    )
    schema_ok, violations = (True, []) if task is None or task["task_hash"] is None else await _schema_ok(conn, task)
    share = None
    if result.outcome is rules.Outcome.RULING and result.consensus_ppm is not None:
        share = rules.agent_share_bps(result.consensus_ppm, schema_ok)
    await conn.execute(
        "UPDATE panel_rounds SET status = 'closed', outcome = $2, consensus_ppm = $3, spread_ppm = $4,"
        " schema_ok = $5, agent_share_bps = $6, closed_at = now() WHERE round_id = $1",
        rid, result.outcome.value, result.consensus_ppm, result.spread_ppm, schema_ok, share,
    )
    key = f"{chain}:{task_id}"
    capped = None if result.consensus_ppm is None else rules.cap(result.consensus_ppm, schema_ok)
    record = msg.ConsensusRecord(
        round_id=rid, chain_id=chain, escrow=escrow, task_id=task_id, round=rnd["round"],
        outcome=msg.RoundOutcome(result.outcome.value), consensus_ppm=result.consensus_ppm,
        spread_ppm=result.spread_ppm, weighted=list(result.weighted),
        timed_out=[s["verifier"] for s in seats if s["timed_out"] or s["attested_at"] is None],
        schema_ok=schema_ok, schema_violations=violations,
        band=None if capped is None else rules.band(capped).value, agent_share_bps=share,
    )
    out = [_outbox(f"panel-consensus:{rid}", PANEL_CONSENSUS, key, record.model_dump(mode="json"),
                   msg.CONSENSUS_EVENT_TYPE, rid)]
    for s in seats:
        if s["signature"] is not None:
            signed = {
                "attestation": {
                    "chain_id": chain, "escrow": escrow, "task_id": task_id, "round": rnd["round"],
                    "attempt": rnd["attempt"], "evidence_hash": rnd["evidence_hash"], "verifier": s["verifier"], "quality_ppm": s["quality_ppm"], "confidence_ppm": s["confidence_ppm"],
                },
                "signature": s["signature"],
            }
            out.append(_outbox(f"panel-attestation:{rid}:{s['verifier']}", PANEL_ATTESTATIONS, key, signed,
                               msg.ATTESTATION_EVENT_TYPE, rid))
    await enqueue(conn, out)
    ROUNDS.labels(result.outcome.value).inc()
    log.info("panel_round_closed", round_id=rid, outcome=result.outcome.value, weighted=len(result.weighted))
    if result.outcome is rules.Outcome.RERUN:
        await open_round(conn, config, chain, escrow, task_id, rnd["round"] + 1, reason=rnd["reason"],
                         claim_passed=rnd["claim_passed"])
    elif result.outcome is rules.Outcome.RULING and result.consensus_ppm is not None:
        if rnd["reason"] == "review_sample":
            await _calibrate_sample(conn, rnd, task, result.consensus_ppm)
        elif share is not None:
            await _rule(conn, config, rnd, task, share, result.consensus_ppm)
    return result


def _attestation(seat: asyncpg.Record) -> rules.Attestation:
    return rules.Attestation(
        seat["verifier"],
        seat["quality_ppm"] or 0,
        seat["confidence_ppm"] or 0,
        seat["calibration_ppm"],
        bool(seat["timed_out"]),
    )


async def _rule(
    conn: asyncpg.Connection,
    config: PanelConfig,
    rnd: asyncpg.Record,
    task: asyncpg.Record | None,
    share: int,
    consensus_ppm: int,
) -> None:
    """Sign and queue the ruling; move calibrations; write the fee ledger."""
    chain, escrow, task_id, rid = rnd["chain_id"], rnd["escrow"], int(rnd["task_id"]), rnd["round_id"]
    key = f"{chain}:{task_id}"
    ruling = msg.Ruling(chain_id=chain, escrow=escrow, task_id=task_id, round=rnd["round"], agent_share_bps=share)
    signed = msg.sign_ruling(ruling, config.ruling_key)
    inserted = await conn.fetchval(
        "INSERT INTO panel_rulings (chain_id, escrow, task_id, round_id, agent_share_bps, signer, signature)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING RETURNING 1",
        chain, escrow, task_id, rid, share, signed.signer.lower(), signed.signature,
    )
    if inserted is None:
        return
    out = [_outbox(msg.ruling_message_id(ruling), PANEL_RULINGS, key, signed.model_dump(mode="json"),
                   msg.RULING_EVENT_TYPE, rid)]
    loser = rules.losing_side(share)
    loser_account = None if task is None else task[loser]
    for each, seats, minimum in await _move_verifiers(conn, rnd, consensus_ppm, out):
        weighted = [s["verifier"] for s in seats if rules.counts(_attestation(s), minimum)]
        if loser_account is None:
            continue
        for entry in rules.fee_entries(weighted, config.fee_units, loser_account):
            role = "verifier" if entry.reason == "attestation_fee" else loser
            entry_id = f"{each}:{entry.account}:{entry.reason}"
            await conn.execute(
                "INSERT INTO panel_fee_ledger (entry_id, round_id, chain_id, account, role, delta_units, reason)"
                " VALUES ($1, $2, $3, $4, $5, $6, $7)",
                entry_id, each, chain, entry.account, role, entry.delta, entry.reason,
            )
            fee = msg.FeeLedgerEntry(entry_id=entry_id, round_id=each, chain_id=chain, account=entry.account,
                                     role=role, delta_units=entry.delta, reason=entry.reason)
            out.append(_outbox(f"panel-fee:{entry_id}", PANEL_FEES, entry.account, fee.model_dump(mode="json"),
                               msg.FEE_EVENT_TYPE, each))
    await enqueue(conn, out)
    ROUNDS.labels("ruled").inc()


async def _move_verifiers(
    conn: asyncpg.Connection, rnd: asyncpg.Record, consensus_ppm: int, out: list[OutboxMessage]
) -> list[tuple[str, list[asyncpg.Record], int]]:
    """Move the calibration of every seat of this series; return each round's seats and
    minimum confidence.

    A seat of the ruling round is scored against the consensus of the *other* seats of that
    round (`peer_consensus_ppm`: nobody is judged against its own pull); a seat of a rerun
    first panel against the ruling consensus: a colluding first panel is scored against the
    fresh one, not against itself.
    """
    rid = rnd["round_id"]
    round_ids = [rid] if rnd["rerun_of"] is None else [rnd["rerun_of"], rid]
    result = []
    for each in round_ids:
        seats = await conn.fetch(
            "SELECT s.*, r.min_confidence_ppm FROM panel_seats s JOIN panel_rounds r USING (round_id)"
            " WHERE s.round_id = $1 ORDER BY s.seat", each,
        )
        minimum = int(seats[0]["min_confidence_ppm"]) if seats else rules.MIN_CONFIDENCE_PPM
        attestations = [_attestation(s) for s in seats]
        for seat, att in zip(seats, attestations, strict=True):
            reference = (
                rules.peer_consensus_ppm(attestations, att.verifier, minimum) if each == rid else consensus_ppm
            )
            before = await conn.fetchval(
                "SELECT calibration_ppm FROM panel_verifiers WHERE address = $1 FOR UPDATE", seat["verifier"]
            )
            after = rules.update_verifier(rules.Attestation(att.verifier, att.quality_ppm, att.confidence_ppm,
                                                            before, att.timed_out), reference, minimum)
            CALIBRATION_CHANGE.observe(after - before)
            rounds = await conn.fetchval(
                "UPDATE panel_verifiers SET calibration_ppm = $2, rounds = rounds + 1, updated_at = now()"
                " WHERE address = $1 RETURNING rounds", seat["verifier"], after,
            )
            update = msg.CalibrationUpdate(
                kind=msg.SubjectKind.VERIFIER, subject=seat["verifier"], calibration_ppm=after,
                previous_ppm=before, round_id=rid, rounds=rounds,
            )
            out.append(_outbox(f"panel-calibration:{seat['verifier']}:{rid}", PANEL_CALIBRATION,
                               f"verifier:{seat['verifier']}", update.model_dump(mode="json"),
                               msg.CALIBRATION_EVENT_TYPE, seat["verifier"]))
        result.append((each, list(seats), minimum))
    return result


async def _calibrate_sample(
    conn: asyncpg.Connection, rnd: asyncpg.Record, task: asyncpg.Record | None, consensus_ppm: int
) -> None:
    """A sampled review closed: verifiers move as in a dispute; the poster's calibration and
    the poster–agent drift streak move by the poster's claim. No fees, nothing on chain."""
    out: list[OutboxMessage] = []
    await _move_verifiers(conn, rnd, consensus_ppm, out)
    if task is not None and task["poster"] is not None and rnd["claim_passed"] is not None:
        poster, claim = task["poster"], bool(rnd["claim_passed"])
        before = await conn.fetchval(
            "SELECT calibration_ppm FROM panel_posters WHERE address = $1 FOR UPDATE", poster
        )
        before = rules.POSTER_START_CALIBRATION_PPM if before is None else int(before)
        after = rules.update_poster(before, claim, consensus_ppm)
        rounds = await conn.fetchval(
            "INSERT INTO panel_posters (address, calibration_ppm, rounds) VALUES ($1, $2, 1)"
            " ON CONFLICT (address) DO UPDATE SET calibration_ppm = EXCLUDED.calibration_ppm,"
            " rounds = panel_posters.rounds + 1, updated_at = now() RETURNING rounds",
            poster, after,
        )
        if task["agent"] is not None:
            streak = await conn.fetchval(
                "SELECT streak FROM panel_pair_drift WHERE poster = $1 AND agent = $2", poster, task["agent"]
            )
            await conn.execute(
                "INSERT INTO panel_pair_drift (poster, agent, streak) VALUES ($1, $2, $3)"
                " ON CONFLICT (poster, agent) DO UPDATE SET streak = EXCLUDED.streak",
                poster, task["agent"], rules.next_pair_streak(streak or 0, claim, consensus_ppm),
            )
        update = msg.CalibrationUpdate(kind=msg.SubjectKind.POSTER, subject=poster, calibration_ppm=after,
                                       previous_ppm=before, round_id=rnd["round_id"], rounds=rounds)
        out.append(_outbox(f"panel-calibration:poster:{poster}:{rnd['round_id']}", PANEL_CALIBRATION,
                           f"poster:{poster}", update.model_dump(mode="json"), msg.CALIBRATION_EVENT_TYPE, poster))
    await enqueue(conn, out)
    ROUNDS.labels("sample_calibrated").inc()


def build_consumer(
    *,
    bootstrap: str,
    database_url: str,
    config: PanelConfig,
    events_topic: str = ESCROW_EVENTS,
    group: str = GROUP,
    dlq_topic: str = DEAD_LETTERS,
    idle_interval: float = 1.0,
    session_timeout_ms: int = 10_000,
) -> IdempotentConsumer:
    """The panel consumer group member; its idle hook closes due rounds."""

    async def on_idle(conn: asyncpg.Connection, _assignment: object) -> None:
        await close_due_rounds(conn, config)

    return IdempotentConsumer(
        name=group,
        topics=[events_topic],
        bootstrap=bootstrap,
        database_url=database_url,
        handler=PanelHandler(config, sweep_seconds=idle_interval),
        dlq_topic=dlq_topic,
        on_idle=on_idle,
        idle_interval=idle_interval,
        session_timeout_ms=session_timeout_ms,
    )
