"""`escrowd consume panels` as a real process on PostgreSQL and Kafka: indexed dispute events
reach it through the outbox and the broker; it opens the round (under the allow-list and the
minimum confidence its settings name), and closes it into a ruling once the seats attested
through the API."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from panels import rules
from runtime.db import connect
from runtime.kafka import TopicSpec, ensure_topics
from schemas import panels as msg
from schemas import topics
from tests.panels.test_panel_service import AGENT, CHAIN, POSTER, VERIFIERS
from tests.verification.conftest import ESCROW, IndexedChain, api_settings, running_api

SERVICE_KEY = "0x" + "5e" * 32


async def _wait(condition, what: str, timeout: float = 180.0):  # type: ignore[no-untyped-def,unused-ignore]
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await condition()
        if value:
            return value
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.3)


async def test_escrowd_consume_panels_process(
    database_url: str, kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    events = f"{topic_prefix}events"
    panel_topics = [topics.PANEL_ROUNDS, topics.PANEL_ATTESTATIONS, topics.PANEL_CONSENSUS,
                    topics.PANEL_RULINGS, topics.PANEL_FEES]
    await ensure_topics(kafka_bootstrap, [TopicSpec(events, 1), TopicSpec(f"{topic_prefix}dlq", 1),
                                          TopicSpec(topics.PANEL_CALIBRATION, 1, compacted=True),
                                          *(TopicSpec(t, 1) for t in panel_topics)])
    conn = await connect(database_url)
    for i, v in enumerate(VERIFIERS[:5]):
        await conn.execute("INSERT INTO panel_verifiers (address, operator, chains) VALUES ($1, $2, $3)",
                           v.address.lower(), f"op{i}", [CHAIN])
    secret = tmp_path / "secret"
    secret.write_text("process-secret-0123456789abcdef\n")
    # v4 registered but not admitted; v3 admitted under the agent's operator, so never drawn.
    allowlist = tmp_path / "allowlist.json"
    listed = [{"address": v.address, "operator": f"op{i}"} for i, v in enumerate(VERIFIERS[:3])]
    listed += [{"address": VERIFIERS[3].address, "operator": "agent-co"}, {"address": AGENT.address, "operator": "agent-co"}]
    allowlist.write_text(json.dumps(listed))
    env = {
        **os.environ,
        "ESCROWD_DATABASE_URL": database_url,
        "ESCROWD_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "ESCROWD_EVENTS_TOPIC": events,
        "ESCROWD_DEAD_LETTER_TOPIC": f"{topic_prefix}dlq",
        "ESCROWD_PANEL_SECRET_FILE": str(secret),
        "ESCROWD_PANEL_SIGNING_KEY": SERVICE_KEY,
        "ESCROWD_PANEL_IDLE_INTERVAL": "0.2",
        "ESCROWD_PANEL_ADMISSION": "allowlist",
        "ESCROWD_PANEL_ALLOWLIST_FILE": str(allowlist),
        "ESCROWD_PANEL_MIN_CONFIDENCE": "0.25",
    }
    escrowd = Path(sys.executable).with_name("escrowd")
    log = (tmp_path / "panels.log").open("wb")
    process = subprocess.Popen([str(escrowd), "consume", "panels"], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        chain = IndexedChain(database_url, topic=events)
        await chain.created(12, POSTER.address, "0x" + "ab" * 32)
        await chain.accepted(12, AGENT.address)
        await chain.write(12, "EvidenceSubmitted", {"taskId": 12, "agent": AGENT.address, "attempt": 1,
                                                    "evidenceHash": "0x" + "22" * 32, "status": 2})
        await chain.write(12, "DisputeRaised", {"taskId": 12, "by": AGENT.address, "previousStatus": 3,
                                                "attempt": 1, "status": 5})
        rid = f"{CHAIN}:{ESCROW.lower()}:12:dispute:1"

        async def seats() -> list[str]:
            rows = await conn.fetch("SELECT verifier FROM panel_seats WHERE round_id = $1 ORDER BY seat", rid)
            return [r["verifier"] for r in rows]

        drawn = await _wait(seats, "the round to open")
        assert sorted(drawn) == sorted(v.address.lower() for v in VERIFIERS[:3])
        assert await conn.fetchval("SELECT min_confidence_ppm FROM panel_rounds WHERE round_id = $1", rid) == 250_000
        async with running_api(api_settings(database_url)) as api:
            for s in drawn:
                who = next(v for v in VERIFIERS if v.address.lower() == s)
                a = msg.Attestation(chain_id=CHAIN, escrow=ESCROW, task_id=12, round=1, attempt=1,
                                    evidence_hash="0x" + "22" * 32, verifier=who.address,
                                    quality_ppm=900_000 - 100_000 * drawn.index(s), confidence_ppm=800_000)
                response = await api.call("POST", "/panels/attestations",
                                          msg.sign_attestation(a, who.key).model_dump(mode="json"))
                assert response.status_code == 201, response.text

        async def ruled() -> int | None:
            value = await conn.fetchval("SELECT agent_share_bps FROM panel_rulings WHERE task_id = 12")
            return None if value is None else int(value) + 1  # 0 bps is a ruling too

        share = await _wait(ruled, "the ruling") - 1
        assert share == rules.agent_share_bps(800_000)  # (0.9 + 0.8 + 0.7) / 3 with equal weights
        published = await _wait(lambda: conn.fetchval(
            "SELECT count(*) FROM outbox WHERE topic = $1 AND published_at IS NOT NULL", topics.PANEL_RULINGS),
            "the ruling to be published")
        assert published == 1
        assert process.poll() is None
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
        await conn.close()
    assert "process-secret" not in (tmp_path / "panels.log").read_text(errors="replace")



def test_a_bad_allowlist_stops_the_service_in_one_line(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("process-secret-0123456789abcdef\n")
    allowlist = tmp_path / "allowlist.json"
    hidden = "0x" + "ab" * 20
    allowlist.write_text(json.dumps([{"address": hidden, "operator": "a"}, {"address": hidden, "operator": "b"}]))
    env = {**os.environ, "ESCROWD_DATABASE_URL": "postgresql://127.0.0.1:1/x", "ESCROWD_KAFKA_BOOTSTRAP": "127.0.0.1:1",
           "ESCROWD_PANEL_SECRET_FILE": str(secret), "ESCROWD_PANEL_SIGNING_KEY": SERVICE_KEY,
           "ESCROWD_PANEL_ADMISSION": "allowlist", "ESCROWD_PANEL_ALLOWLIST_FILE": str(allowlist)}
    escrowd = Path(sys.executable).with_name("escrowd")
    done = subprocess.run([str(escrowd), "consume", "panels"], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "two operators" in done.stderr
    assert hidden not in done.stderr
    del env["ESCROWD_PANEL_ALLOWLIST_FILE"]
    missing = subprocess.run([str(escrowd), "consume", "panels"], env=env, capture_output=True, text=True,
                             timeout=120, check=False)
    assert missing.returncode == 2 and "panel_allowlist_file" in missing.stderr
