"""The panel service on a real database, with the real API in process: a dispute opens a
drawn round, verifiers attest through the API, the round closes into a signed ruling,
calibrations move and fees are booked; a colluding panel reruns exactly once; a silent
verifier times out with no weight and no fee."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from escrowd.devnet import anvil_key
from indexer.decode import DecodedLog
from indexer.store import event_message
from panels import rules
from panels.service import PanelConfig, PanelHandler, close_due_rounds
from runtime.consumer import IdempotentConsumer, InboundMessage
from runtime.db import connect
from schemas import panels as msg
from schemas.events import event_id
from schemas.jsonbounds import cap_recursion_limit
from tests.verification.conftest import Api, Who, api_settings, running_api

CHAIN = 31337
ESCROW = "0x5fbdb2315678afecb367f032d93f642f64180aa3"
SECRET = b"panel-service-secret-0123456789abcdef"
SERVICE_KEY = "0x" + "5e" * 32
ZERO = "0x" + "0" * 40
EVIDENCE = "0x" + "22" * 32


def _who(index: int, name: str) -> Who:
    address, key = anvil_key(index)
    return Who(name, address, key)


POSTER = _who(40, "poster")
AGENT = _who(41, "agent")
VERIFIERS = [_who(42 + i, f"v{i}") for i in range(8)]
# v7 shares the agent's operator; the agent is itself registered as a verifier of "op-agent".
OPERATORS = {v.address: f"op{i}" for i, v in enumerate(VERIFIERS)} | {VERIFIERS[7].address: "op-agent"}


class Harness:
    """The panel handler behind the shared idempotent runtime, plus the API."""

    def __init__(self, conn: asyncpg.Connection, api: Api, config: PanelConfig) -> None:
        self.conn = conn
        self.api = api
        self.config = config
        self.consumer = IdempotentConsumer(
            name="escrowd-panels", topics=["escrow.events.v1"], bootstrap="unused:9092",
            database_url="unused", handler=PanelHandler(config),
        )
        self.block = 100

    async def event(self, task_id: int, name: str, args: dict[str, Any], *, removed: bool = False) -> str:
        self.block += 1
        block_hash = "0x" + f"{self.block:064x}"
        log = DecodedLog(
            id=event_id(CHAIN, block_hash, 0), chain_id=CHAIN, escrow_address=ESCROW, block_number=self.block,
            block_hash=block_hash, block_timestamp=int(time.time()), tx_hash=block_hash, tx_index=0, log_index=0,
            event=name, task_id=task_id, args=args,
        )
        out = event_message(log, "escrow.events.v1", removed=removed)
        message = InboundMessage(topic=out.topic, partition=0, offset=self.block, key=out.key,
                                 headers=dict(out.headers), value=out.payload, timestamp_ms=0)
        async with self.conn.transaction():
            return await self.consumer.handle_one(self.conn, message)

    async def dispute(self, task_id: int) -> str:
        await self.event(task_id, "TaskCreated", {
            "taskId": task_id, "poster": POSTER.address, "verifier": ZERO, "token": ZERO, "reward": 10**7,
            "deadline": int(time.time()) + 86_400, "taskHash": "0x" + "ab" * 32, "status": 0})
        await self.event(task_id, "TaskAccepted", {"taskId": task_id, "agent": AGENT.address, "status": 1})
        await self.event(task_id, "EvidenceSubmitted", {
            "taskId": task_id, "agent": AGENT.address, "attempt": 1, "evidenceHash": EVIDENCE, "status": 2})
        await self.event(task_id, "DisputeRaised", {
            "taskId": task_id, "by": AGENT.address, "previousStatus": 3, "attempt": 1, "status": 5})
        return f"{CHAIN}:{ESCROW}:{task_id}:dispute:1"

    async def seats(self, rid: str) -> list[str]:
        rows = await self.conn.fetch("SELECT verifier FROM panel_seats WHERE round_id = $1 ORDER BY seat", rid)
        return [r["verifier"] for r in rows]

    async def attest(
        self, rid: str, verifier: str, quality: float, confidence: float, *,
        attempt: int | None = None, evidence: str | None = None,
    ) -> Any:
        """Sign and post an attestation bound to what the round judges (or to `attempt` /
        `evidence`, to try another)."""
        who = next(v for v in VERIFIERS if v.address.lower() == verifier)
        chain, escrow, task, _, round_no = rid.split(":")
        bound = await self.conn.fetchrow("SELECT attempt, evidence_hash FROM panel_rounds WHERE round_id = $1", rid)
        a = msg.Attestation(chain_id=int(chain), escrow=escrow, task_id=int(task), round=int(round_no),
                            attempt=attempt or bound["attempt"], evidence_hash=evidence or bound["evidence_hash"],
                            verifier=who.address, quality_ppm=rules.to_ppm(quality),
                            confidence_ppm=rules.to_ppm(confidence))
        signed = msg.sign_attestation(a, who.key)
        return await self.api.call("POST", "/panels/attestations", signed.model_dump(mode="json"))

    async def close(self) -> list[str]:
        async with self.conn.transaction():
            return await close_due_rounds(self.conn, self.config)

    async def calibration(self, verifier: str) -> int:
        value = await self.conn.fetchval("SELECT calibration_ppm FROM panel_verifiers WHERE address = $1", verifier)
        return int(value)


async def _harness(database_url: str, attestation_seconds: int, **options: Any) -> AsyncIterator[Harness]:
    config = PanelConfig(secret=SECRET, secret_version="k1", ruling_key=SERVICE_KEY,
                         attestation_seconds=attestation_seconds, fee_units=50_000, **options)
    conn = await connect(database_url)
    try:
        async with running_api(api_settings(database_url)) as api:
            for who in [*VERIFIERS, AGENT]:
                operator = "op-agent" if who is AGENT else OPERATORS[who.address]
                body = {"address": who.address, "operator": operator, "chains": [CHAIN]}
                response = await api.call("POST", "/panels/verifiers", body, as_=who)
                assert response.status_code == 201, response.text
            yield Harness(conn, api, config)
    finally:
        await conn.close()


@pytest.fixture
async def panel(database_url: str) -> AsyncIterator[Harness]:
    async for h in _harness(database_url, 3600):
        yield h


@pytest.fixture
async def quick_panel(database_url: str) -> AsyncIterator[Harness]:
    async for h in _harness(database_url, 2):
        yield h


async def test_registration_is_signed_by_the_verifier_itself(panel: Harness) -> None:
    body = {"address": VERIFIERS[0].address, "operator": "evil", "chains": [CHAIN]}
    assert (await panel.api.call("POST", "/panels/verifiers", body, as_=VERIFIERS[1])).status_code == 403
    assert (await panel.api.call("POST", "/panels/verifiers", body)).status_code == 401
    cal = await panel.api.call("GET", f"/panels/calibration/{VERIFIERS[0].address}")
    assert cal.json()["verifier"] == {"calibration_ppm": rules.START_CALIBRATION_PPM, "rounds": 0}


async def test_dispute_to_signed_ruling_with_calibration_and_fees(panel: Harness) -> None:
    rid = await panel.dispute(7)
    seats = await panel.seats(rid)
    assert len(seats) == 3
    assert AGENT.address.lower() not in seats and VERIFIERS[7].address.lower() not in seats
    # The recorded draw is the one an auditor reproduces offline.
    pool = [rules.Candidate(v.address.lower(), OPERATORS[v.address], rules.START_CALIBRATION_PPM) for v in VERIFIERS]
    pool.append(rules.Candidate(AGENT.address.lower(), "op-agent", rules.START_CALIBRATION_PPM))
    expected = rules.draw(SECRET, f"{CHAIN}:{ESCROW}:7", 1, pool, exclude_operators=["op-agent"],
                          exclude_ids=[POSTER.address.lower(), AGENT.address.lower()])
    assert seats == [c.id for c in expected]

    # Each seat sees its assignment (terms, output, report) and nothing of the poster's claim.
    seat_who = next(v for v in VERIFIERS if v.address.lower() == seats[0])
    listed = (await panel.api.call("GET", "/panels/assignments", as_=seat_who)).json()
    assert [a["round_id"] for a in listed] == [rid]
    assert set(listed[0]) == {"round_id", "chain_id", "escrow", "task_id", "round", "attempt", "evidence_hash",
                              "deadline", "terms", "brief", "output_schema", "output", "compute_report"}
    assert (listed[0]["attempt"], listed[0]["evidence_hash"]) == (1, EVIDENCE)
    outsider = next(v for v in VERIFIERS if v.address.lower() not in seats)
    assert (await panel.api.call("GET", "/panels/assignments", as_=outsider)).json() == []

    assert (await panel.api.call("GET", f"/panels/rounds/{rid}")).status_code == 409  # open: unreadable
    qualities = {seats[0]: 0.9, seats[1]: 0.8, seats[2]: 0.2}
    confidences = {seats[0]: 1.0, seats[1]: 0.5, seats[2]: 0.9}
    before = {s: await panel.calibration(s) for s in seats}
    for s in seats:
        response = await panel.attest(rid, s, qualities[s], confidences[s])
        assert response.status_code == 201, response.text
    assert (await panel.attest(rid, seats[0], 0.1, 1)).status_code == 409  # one attestation per seat
    assert (await panel.attest(rid, outsider.address.lower(), 0.5, 1)).status_code == 404

    assert await panel.close() == [rid]
    assert await panel.close() == []  # closed exactly once
    seated = [rules.Attestation(s, rules.to_ppm(qualities[s]), rules.to_ppm(confidences[s]), before[s]) for s in seats]
    consensus_ppm = rules.decide(1, seated).consensus_ppm
    assert consensus_ppm is not None
    share = rules.agent_share_bps(consensus_ppm)
    body = (await panel.api.call("GET", f"/panels/rounds/{rid}")).json()
    assert (body["outcome"], body["consensus_ppm"], body["agent_share_bps"]) == ("ruling", consensus_ppm, share)

    ruling = await panel.conn.fetchrow("SELECT * FROM panel_rulings WHERE round_id = $1", rid)
    signed = msg.SignedRuling(
        ruling=msg.Ruling(chain_id=CHAIN, escrow=ESCROW, task_id=7, round=1, agent_share_bps=share),
        signature=ruling["signature"], signer=ruling["signer"],
    )
    assert msg.ruling_signer(signed).lower() == ruling["signer"]
    for s in seats:  # each scored against the other two seats' consensus
        assert await panel.calibration(s) == rules.update_verifier(
            rules.Attestation(s, rules.to_ppm(qualities[s]), rules.to_ppm(confidences[s]), before[s]),
            rules.peer_consensus_ppm(seated, s))
    assert await panel.calibration(seats[2]) < before[seats[2]]  # a confident miss costs

    fees = await panel.conn.fetch("SELECT account, delta_units FROM panel_fee_ledger WHERE round_id = $1", rid)
    loser = POSTER if rules.losing_side(share) == "poster" else AGENT
    assert {r["account"]: int(r["delta_units"]) for r in fees} == {
        **dict.fromkeys(seats, 50000), loser.address.lower(): -150_000}
    outbox = {r["topic"] for r in await panel.conn.fetch("SELECT topic FROM outbox")}
    assert {"escrow.panel-rounds.v1", "escrow.panel-consensus.v1", "escrow.panel-rulings.v1",
            "escrow.panel-calibration.v1", "escrow.panel-fees.v1", "escrow.panel-attestations.v1"} <= outbox


async def test_colluding_panel_reruns_exactly_once_with_fresh_verifiers(panel: Harness) -> None:
    rid = await panel.dispute(8)
    first = await panel.seats(rid)
    for s, q in zip(first, (0.50, 0.51, 0.52), strict=True):
        assert (await panel.attest(rid, s, q, 0.9)).status_code == 201
    assert await panel.close() == [rid]
    rerun = rid[:-1] + "2"
    second = await panel.seats(rerun)
    assert len(second) == 3 and not set(first) & set(second)
    for s, q in zip(second, (0.70, 0.70, 0.71), strict=True):  # the same pattern again
        assert (await panel.attest(rerun, s, q, 0.9)).status_code == 201
    assert await panel.close() == [rerun]
    rows = await panel.conn.fetch(
        "SELECT round, outcome FROM panel_rounds WHERE task_id = 8 ORDER BY round")
    assert [(r["round"], r["outcome"]) for r in rows] == [(1, "rerun"), (2, "ruling")]
    assert await panel.conn.fetchval("SELECT agent_share_bps FROM panel_rulings WHERE task_id = 8") == 10_000
    # The colluders were measured against the fresh panel (0.70): 0.5 is a confident miss.
    for s in first:
        assert await panel.calibration(s) < rules.START_CALIBRATION_PPM


async def test_a_silent_verifier_times_out_with_no_weight_and_no_fee(quick_panel: Harness) -> None:
    panel = quick_panel
    rid = await panel.dispute(9)
    seats = await panel.seats(rid)
    assert (await panel.attest(rid, seats[0], 0.9, 1.0)).status_code == 201
    assert (await panel.attest(rid, seats[1], 0.3, 0.6)).status_code == 201
    deadline = asyncio.get_running_loop().time() + 120
    while not await panel.close():
        assert asyncio.get_running_loop().time() < deadline, "the round never closed at its deadline"
        await asyncio.sleep(0.2)
    assert (await panel.attest(rid, seats[2], 0.5, 1.0)).status_code == 409  # too late
    seat = await panel.conn.fetchrow("SELECT * FROM panel_seats WHERE round_id = $1 AND seat = 2", rid)
    assert seat["timed_out"] and seat["quality_ppm"] is None
    body = (await panel.api.call("GET", f"/panels/rounds/{rid}")).json()
    assert body["outcome"] == "ruling"
    fees = {r["account"] for r in await panel.conn.fetch(
        "SELECT account FROM panel_fee_ledger WHERE round_id = $1 AND delta_units > 0", rid)}
    assert fees == {seats[0], seats[1]}
    assert await panel.calibration(seats[2]) == 450_000  # a timeout scores 0: 0.5 → 0.45


async def test_a_forged_attestation_is_refused(panel: Harness) -> None:
    rid = await panel.dispute(10)
    seat = (await panel.seats(rid))[0]
    who = next(v for v in VERIFIERS if v.address.lower() == seat)
    a = msg.Attestation(chain_id=CHAIN, escrow=ESCROW, task_id=10, round=1, attempt=1, evidence_hash=EVIDENCE,
                        verifier=who.address, quality_ppm=900_000, confidence_ppm=900_000)
    forged = msg.SignedAttestation(attestation=a, signature=msg.sign_attestation(
        a.model_copy(update={"chain_id": 1}), who.key).signature)
    response = await panel.api.call("POST", "/panels/attestations", forged.model_dump(mode="json"))
    assert response.status_code == 401


async def test_an_attestation_has_one_signature_encoding(panel: Harness) -> None:
    """The v = 0/1 form and the high-s twin of a verifier's valid signature are 401; the signature itself is taken."""
    rid = await panel.dispute(12)
    seat = (await panel.seats(rid))[0]
    who = next(v for v in VERIFIERS if v.address.lower() == seat)
    a = msg.Attestation(chain_id=CHAIN, escrow=ESCROW, task_id=12, round=1, attempt=1, evidence_hash=EVIDENCE,
                        verifier=who.address, quality_ppm=800_000, confidence_ppm=900_000)
    signed = msg.sign_attestation(a, who.key)
    raw = bytes.fromhex(signed.signature[2:])
    s = int.from_bytes(raw[32:64], "big")
    n = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
    for other in (raw[:64] + bytes([raw[64] - 27]), raw[:32] + (n - s).to_bytes(32, "big") + bytes([55 - raw[64]])):
        body = signed.model_copy(update={"signature": "0x" + other.hex()}).model_dump(mode="json")
        response = await panel.api.call("POST", "/panels/attestations", body)
        assert response.status_code == 401, response.text
    accepted = await panel.api.call("POST", "/panels/attestations", signed.model_dump(mode="json"))
    assert accepted.status_code == 201, accepted.text


async def test_duplicate_dispute_message_opens_one_round_and_a_retraction_closes_it(panel: Harness) -> None:
    rid = await panel.dispute(11)
    args = {"taskId": 11, "by": AGENT.address, "previousStatus": 3, "attempt": 1, "status": 5}
    panel.block -= 1  # the same event again (a redelivery): same id
    assert await panel.event(11, "DisputeRaised", args) == "duplicate"
    assert await panel.conn.fetchval("SELECT count(*) FROM panel_rounds WHERE task_id = 11") == 1
    panel.block -= 1
    await panel.event(11, "DisputeRaised", args, removed=True)
    assert await panel.conn.fetchval("SELECT outcome FROM panel_rounds WHERE round_id = $1", rid) == "retracted"


async def test_a_busy_event_stream_still_closes_due_rounds(panel: Harness) -> None:
    """The idle hook never runs while events keep coming: the handler sweeps as well."""
    panel.consumer._handler = PanelHandler(panel.config, sweep_seconds=0)  # sweep on every event
    rid = await panel.dispute(13)
    for s, q in zip(await panel.seats(rid), (0.9, 0.5, 0.1), strict=True):
        assert (await panel.attest(rid, s, q, 1.0)).status_code == 201
    await panel.event(14, "TaskAccepted", {"taskId": 14, "agent": AGENT.address, "status": 1})
    assert await panel.conn.fetchval("SELECT outcome FROM panel_rounds WHERE round_id = $1", rid) == "ruling"


async def delivered_under_schema(panel: Harness, task_id: int, schema: Any, result: Any) -> None:
    """Terms whose schema_validation verifier names `schema`, and the task's delivered `result`."""
    import json

    terms = {"chainId": CHAIN, "escrow": ESCROW, "poster": POSTER.address, "verificationMode": "auto",
             "verifier": {"kind": "schema_validation", "ref": "label", "config": {"schema": schema}}}
    await panel.conn.execute(
        "INSERT INTO task_terms (task_hash, chain_id, escrow_address, poster, verification_mode, private, terms,"
        " canonical) VALUES ($1, $2, $3, $4, 'auto', false, $5::jsonb, $5)",
        "0x" + "ab" * 32, CHAIN, ESCROW, POSTER.address.lower(), json.dumps(terms),
    )
    await panel.conn.execute(
        "INSERT INTO verification_requests (request_id, kind, chain_id, escrow_address, task_id, attempt,"
        " evidence_hash, actor, payload, state) VALUES ($1, 'finalize', $2, $3, $4, 1, $5, $6, $7::jsonb, 'applied')",
        f"f-{task_id}", CHAIN, ESCROW, task_id, EVIDENCE, AGENT.address.lower(), json.dumps({"result": result}),
    )


async def test_the_terms_output_schema_is_checked_first_and_shown_to_the_seats(panel: Harness) -> None:
    """The output schema is where the terms keep it (`verifier.config.schema`, as documented and
    as the schema_validation verifier reads it): the seats are shown it, and output that
    violates it is capped below the accept band whatever the panel says."""
    schema = {"type": "object", "required": ["answer"]}
    await delivered_under_schema(panel, 17, schema, {"wrong": 1})
    rid = await panel.dispute(17)
    seats = await panel.seats(rid)
    seat_who = next(v for v in VERIFIERS if v.address.lower() == seats[0])
    listed = (await panel.api.call("GET", "/panels/assignments", as_=seat_who)).json()
    assert listed[0]["output_schema"] == schema
    for s, quality in zip(seats, (0.9, 0.95, 1.0), strict=True):  # the panel finds it excellent
        assert (await panel.attest(rid, s, quality, 1.0)).status_code == 201
    assert await panel.close() == [rid]
    row = await panel.conn.fetchrow(
        "SELECT outcome, schema_ok, consensus_ppm, agent_share_bps FROM panel_rounds WHERE round_id = $1", rid
    )
    assert (row["outcome"], row["schema_ok"]) == ("ruling", False)
    assert rules.band(row["consensus_ppm"]) is rules.Band.ACCEPT
    assert row["agent_share_bps"] == rules.agent_share_bps(row["consensus_ppm"], schema_ok=False) < 7_000


@pytest.mark.parametrize(
    "schema",
    [{"$ref": "#/$defs/gone"}, {"$ref": "#"}, {"$defs": {"a": {"anyOf": [{"$ref": "#"}]}}, "allOf": [{"$ref": "#/$defs/a"}]}],
    ids=["ref-to-nothing", "ref-to-itself", "ref-cycle"],
)
async def test_a_terms_schema_that_cannot_be_evaluated_caps_nothing_and_stops_nothing(panel: Harness, schema: Any) -> None:
    """A schema that passes the registration check but cannot be evaluated (a `$ref` to nothing)
    is the poster's: the round closes as if there were none (no cap on the agent), and the
    sweep goes on closing the other rounds. Raised out of the close, it failed every sweep, in
    the idle hook and in each event's handler, so no round closed again."""
    await delivered_under_schema(panel, 18, schema, {"answer": 42})
    rid = await panel.dispute(18)
    for s, quality in zip(await panel.seats(rid), (0.9, 0.95, 1.0), strict=True):
        assert (await panel.attest(rid, s, quality, 1.0)).status_code == 201
    # The limit every service runs under (escrowd's entry point caps it): a schema that refers
    # to itself without descending into the output recurses until RecursionError.
    limit = sys.getrecursionlimit()
    cap_recursion_limit()
    try:
        assert await panel.close() == [rid]
    finally:
        sys.setrecursionlimit(limit)
    row = await panel.conn.fetchrow(
        "SELECT outcome, schema_ok, consensus_ppm, agent_share_bps FROM panel_rounds WHERE round_id = $1", rid
    )
    assert (row["outcome"], row["schema_ok"]) == ("ruling", True)
    assert row["agent_share_bps"] == rules.agent_share_bps(row["consensus_ppm"], schema_ok=True)


async def _manual_terms(panel: Harness, task_hash: str) -> None:
    await panel.conn.execute(
        "INSERT INTO task_terms (task_hash, chain_id, escrow_address, poster, verification_mode, private, terms,"
        " canonical) VALUES ($1, $2, $3, $4, 'manual', false, '{}'::jsonb, '{}') ON CONFLICT DO NOTHING",
        task_hash, CHAIN, ESCROW, POSTER.address.lower(),
    )


async def _reviewed(panel: Harness, task_id: int, passed: bool) -> str | None:
    """A manual-mode task whose poster's review landed on chain; the sample round, if any."""
    task_hash = "0x" + "cd" * 32
    await _manual_terms(panel, task_hash)
    await panel.event(task_id, "TaskCreated", {
        "taskId": task_id, "poster": POSTER.address, "verifier": ZERO, "token": ZERO, "reward": 10**7,
        "deadline": int(time.time()) + 86_400, "taskHash": task_hash, "status": 0})
    await panel.event(task_id, "TaskAccepted", {"taskId": task_id, "agent": AGENT.address, "status": 1})
    await panel.event(task_id, "VerificationCompleted", {
        "taskId": task_id, "verifier": VERIFIERS[0].address, "attempt": 1, "evidenceHash": "0x" + "ee" * 32,
        "passed": passed, "score": 100 if passed else 0, "agent": AGENT.address, "agentPayout": 0, "fee": 0,
        "failedAt": 0, "status": 4 if passed else 3})
    rid = f"{CHAIN}:{ESCROW}:{task_id}:review_sample:1"
    exists = await panel.conn.fetchval("SELECT 1 FROM panel_rounds WHERE round_id = $1", rid)
    return rid if exists else None


async def test_sampled_reviews_calibrate_the_poster_and_a_drifting_pair_is_always_sampled(panel: Harness) -> None:
    key = f"{CHAIN}:{ESCROW}"
    base = [t for t in range(100, 400) if rules.sample_review(SECRET, f"{key}:{t}", 1, rules.BASE_REVIEW_SAMPLE_PPM)]
    not_sampled = next(t for t in range(100, 400) if t not in base)
    assert 10 <= len(base) <= 60  # about 10 % of 300
    assert await _reviewed(panel, not_sampled, True) is None
    for drift, task_id in enumerate(base[:2], start=1):
        rid = await _reviewed(panel, task_id, True)  # the poster approved...
        assert rid is not None
        seats = await panel.seats(rid)
        for s in seats:  # ...the panel finds the work poor
            assert (await panel.attest(rid, s, 0.1 + 0.05 * seats.index(s), 0.9)).status_code == 201
        assert rid in await panel.close()
        assert await panel.conn.fetchval("SELECT count(*) FROM panel_rulings WHERE round_id = $1", rid) == 0
        assert await panel.conn.fetchval("SELECT count(*) FROM panel_fee_ledger WHERE round_id = $1", rid) == 0
        assert await panel.conn.fetchval(
            "SELECT streak FROM panel_pair_drift WHERE poster = $1", POSTER.address.lower()) == drift
    calibration = await panel.conn.fetchval(
        "SELECT calibration_ppm FROM panel_posters WHERE address = $1", POSTER.address.lower())
    assert calibration < rules.POSTER_START_CALIBRATION_PPM
    # Two drifting reviews in a row: this pair is now sampled every time, even a review the
    # poster's own (raised) rate would not have picked.
    rate = rules.review_sample_rate_ppm(calibration, 0)
    assert rules.BASE_REVIEW_SAMPLE_PPM < rate < rules.PPM
    unlucky = next(t for t in range(1000, 2000) if not rules.sample_review(SECRET, f"{key}:{t}", 1, rate))
    assert await _reviewed(panel, unlucky, True) is not None


async def test_an_arbiter_ruling_supersedes_the_open_round(panel: Harness) -> None:
    rid = await panel.dispute(15)
    await panel.event(15, "DisputeResolved", {
        "taskId": 15, "arbiter": ZERO, "agentShareBps": 5_000, "agent": AGENT.address, "agentAmount": 0,
        "fee": 0, "poster": POSTER.address, "posterAmount": 0, "previousStatus": 5, "status": 9})
    assert await panel.conn.fetchval("SELECT outcome FROM panel_rounds WHERE round_id = $1", rid) == "superseded"
    seat = (await panel.seats(rid))[0]
    assert (await panel.attest(rid, seat, 0.5, 1.0)).status_code == 409


# ---------------------------------------------------------------------------- issue 25: farming, sybils, binding


async def test_an_attestation_for_another_attempt_or_evidence_is_refused(panel: Harness) -> None:
    """Item 7: the attestation signs the attempt and the evidence hash; the service takes it
    only for the attempt and evidence the round was drawn for."""
    rid = await panel.dispute(20)
    seat = (await panel.seats(rid))[0]
    for other in ({"evidence": "0x" + "23" * 32}, {"attempt": 2}):
        response = await panel.attest(rid, seat, 0.9, 0.9, **other)  # type: ignore[arg-type]
        assert response.status_code == 409 and response.json()["error"]["code"] == "WRONG_EVIDENCE", response.text
    assert (await panel.attest(rid, seat, 0.9, 0.9)).status_code == 201
    # What is published after the round closed verifies as the verifier's signature.
    await panel.conn.execute("UPDATE panel_rounds SET deadline = now() WHERE round_id = $1", rid)
    await panel.close()
    row = await panel.conn.fetchrow(
        "SELECT payload FROM outbox WHERE topic = 'escrow.panel-attestations.v1' AND message_id LIKE $1", f"%{rid}%")
    published = msg.SignedAttestation.model_validate_json(row["payload"])
    assert (published.attestation.attempt, published.attestation.evidence_hash) == (1, EVIDENCE)
    assert msg.attestation_signer(published).lower() == seat


async def test_a_weightless_attestation_is_a_decline_everywhere(panel: Harness) -> None:
    """Item 5 through the service: quality 0 at confidence 1e-6 neither hides two colluders
    from the rerun, nor earns a fee, nor moves its calibration."""
    rid = await panel.dispute(21)
    a, b, c = await panel.seats(rid)
    assert (await panel.attest(rid, a, 0.95, 1.0)).status_code == 201
    assert (await panel.attest(rid, b, 0.95, 1.0)).status_code == 201
    assert (await panel.attest(rid, c, 0.0, 0.000001)).status_code == 201
    assert await panel.close() == [rid]
    row = await panel.conn.fetchrow("SELECT outcome, spread_ppm, min_confidence_ppm FROM panel_rounds WHERE round_id = $1", rid)
    assert (row["outcome"], row["spread_ppm"], row["min_confidence_ppm"]) == ("rerun", 0, rules.MIN_CONFIDENCE_PPM)
    rerun = rid[:-1] + "2"
    for s, q in zip(await panel.seats(rerun), (0.9, 0.8, 0.7), strict=True):
        assert (await panel.attest(rerun, s, q, 0.9)).status_code == 201
    assert await panel.close() == [rerun]
    paid = {r["account"] for r in await panel.conn.fetch(
        "SELECT account FROM panel_fee_ledger WHERE round_id = $1 AND delta_units > 0", rid)}
    assert paid == {a, b}
    assert await panel.calibration(c) == rules.START_CALIBRATION_PPM
    # The database holds the line too: no fee for a seat below its round's minimum.
    with pytest.raises(asyncpg.CheckViolationError, match="no weighted seat"):
        async with panel.conn.transaction():
            await panel.conn.execute(
                "INSERT INTO panel_fee_ledger (entry_id, round_id, chain_id, account, role, delta_units, reason)"
                " VALUES ('x', $1, $2, $3, 'verifier', 1, 'attestation_fee')", rid, CHAIN, c)


async def test_a_panel_seats_three_operators_and_a_rerun_none_of_theirs(panel: Harness) -> None:
    """Item 6: one seat per operator identity; the rerun excludes the first panel's operators;
    each seat keeps the operator it was drawn under."""
    # Three more addresses of op0's operator: they never sit beside op0's first verifier.
    extra = [_who(70 + i, f"op0-{i}") for i in range(3)]
    for who in extra:
        body = {"address": who.address, "operator": "op0", "chains": [CHAIN]}
        assert (await panel.api.call("POST", "/panels/verifiers", body, as_=who)).status_code == 201
    for task_id in range(30, 40):
        rid = await panel.dispute(task_id)
        operators = [r["operator"] for r in await panel.conn.fetch(
            "SELECT operator FROM panel_seats WHERE round_id = $1", rid)]
        assert len(set(operators)) == 3 and "op-agent" not in operators
    rid = f"{CHAIN}:{ESCROW}:30:dispute:1"
    for s, q in zip(await panel.seats(rid), (0.5, 0.5, 0.5), strict=True):
        assert (await panel.attest(rid, s, q, 0.9)).status_code == 201
    await panel.close()
    first = {r["operator"] for r in await panel.conn.fetch("SELECT operator FROM panel_seats WHERE round_id = $1", rid)}
    second = {r["operator"] for r in await panel.conn.fetch(
        "SELECT operator FROM panel_seats WHERE round_id = $1", rid[:-1] + "2")}
    assert len(second) == 3 and not first & second
    with pytest.raises(asyncpg.CheckViolationError, match="frozen"):
        await panel.conn.execute("UPDATE panel_seats SET operator = 'elsewhere' WHERE round_id = $1", rid)


async def test_an_operator_change_waits_for_its_cooldown(panel: Harness) -> None:
    """Item 6: a verifier of the agent's operator renames its operator; until the cool-down
    has passed it still counts as the agent's (and is never drawn for the agent)."""
    mover = VERIFIERS[7]  # op-agent, like the agent
    body = {"address": mover.address, "operator": "innocent", "chains": [CHAIN]}
    changed = (await panel.api.call("POST", "/panels/verifiers", body, as_=mover)).json()
    assert (changed["operator"], changed["pending_operator"]) == ("op-agent", "innocent")
    assert changed["operator_effective_at"] is not None
    # Make it the only drawable candidate besides two others, so the draw would have to take it.
    await panel.conn.execute(
        "UPDATE panel_verifiers SET active = false WHERE address <> ALL($1::text[])",
        [v.address.lower() for v in (mover, *VERIFIERS[:2])])
    rid = await panel.dispute(40)
    assert await panel.conn.fetchval("SELECT outcome FROM panel_rounds WHERE round_id = $1", rid) == "pool_too_small"
    # Once effective, the old id is gone, and it may sit; re-registering folds it in.
    await panel.conn.execute(
        "UPDATE panel_verifiers SET operator_effective_at = now() - interval '1 second' WHERE address = $1",
        mover.address.lower())
    rid = await panel.dispute(41)
    assert mover.address.lower() in await panel.seats(rid)
    again = (await panel.api.call("POST", "/panels/verifiers", body, as_=mover)).json()
    assert (again["operator"], again["pending_operator"]) == ("innocent", None)
    # Asking back for the current id cancels a pending change.
    back = {"address": mover.address, "operator": "op-agent", "chains": [CHAIN]}
    pending = (await panel.api.call("POST", "/panels/verifiers", back, as_=mover)).json()
    assert pending["pending_operator"] == "op-agent"
    cancelled = (await panel.api.call("POST", "/panels/verifiers", body, as_=mover)).json()
    assert (cancelled["operator"], cancelled["pending_operator"]) == ("innocent", None)


@pytest.fixture
async def listed_panel(database_url: str) -> AsyncIterator[Harness]:
    # The allow-list admits v0..v5 only, names the agent's operator (the agent is not a
    # verifier there) and puts v5 under the agent's operator whatever v5 declared.
    allow = {v.address.lower(): f"op{i}" for i, v in enumerate(VERIFIERS[:5])}
    allow |= {VERIFIERS[5].address.lower(): "agent-co", AGENT.address.lower(): "agent-co"}
    async for h in _harness(database_url, 3600, admission="allowlist", allowlist=allow):
        yield h


async def test_allowlist_admission_and_party_operators_whatever_their_roles(listed_panel: Harness) -> None:
    panel = listed_panel
    await panel.conn.execute("DELETE FROM panel_verifiers WHERE address = $1", AGENT.address.lower())
    for task_id in range(50, 60):
        rid = await panel.dispute(task_id)
        rows = await panel.conn.fetch("SELECT verifier, operator FROM panel_seats WHERE round_id = $1", rid)
        seated = {r["verifier"] for r in rows}
        assert seated <= {v.address.lower() for v in VERIFIERS[:5]}  # listed only, never agent-co's v5
        assert {r["operator"] for r in rows} <= {f"op{i}" for i in range(5)}


def test_an_allowlist_admission_needs_a_list() -> None:
    with pytest.raises(ValueError, match="allow-list"):
        PanelConfig(secret=SECRET, secret_version="k1", ruling_key=SERVICE_KEY, admission="allowlist")
