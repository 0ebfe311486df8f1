"""End to end on anvil, PostgreSQL and Kafka: a task is disputed on chain; the indexer, the
lifecycle and reputation consumers, the panel service, the relayer's ruling path and the API
run; six `escrowd verifier-bot` processes with a deterministic scorer plugin attest. The
first panel agrees to within 0.02 (what collusion looks like), so exactly one rerun draws
three fresh verifiers; its consensus is sent as `resolveDispute` from the arbiter key, lands
on chain, the lifecycle consumer sees the task resolved, and calibrations move."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import uvicorn

from api.app import create_app
from chain.eth_rpc import EthRpc
from chain.keys import SecretKey
from escrowd.devnet import Devnet, anvil_key
from escrowd.pipeline_parts import ApiClient
from panels import rules
from panels.service import PanelConfig
from panels.service import build_consumer as build_panel_consumer
from relayer.settlement.rulings import RulingSender, build_ruling_consumer
from runtime.db import connect, create_pool
from runtime.kafka import TopicSpec, ensure_topics
from schemas import panels as msg
from schemas import topics
from schemas.task_state import TaskStatus
from schemas.task_terms import keccak_hex, result_hash
from tests.integration.test_lifecycle_consumers import pipeline
from tests.support.indexer_harness import wait_for
from tests.verification.conftest import api_settings

ROOT = Path(__file__).resolve().parents[2]
PANEL_KEY = "0x" + "5e" * 32
PANEL_SIGNER = msg.sign_ruling(
    msg.Ruling(chain_id=1, escrow="0x" + "00" * 20, task_id=1, round=1, agent_share_bps=0), PANEL_KEY
).signer.lower()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def served_api(database_url: str, devnet: Devnet) -> AsyncIterator[str]:
    port = _free_port()
    settings = api_settings(database_url, deployments=[{"chain_id": devnet.chain_id, "escrow": devnet.escrow_address}])
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve())
    await wait_for(lambda: server.started, timeout=60, interval=0.05, what="the API to listen")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)


BRIEF = "Summarise the escrow flow in one paragraph."
RESULT = {"output": "The poster funds, the agent delivers, a verifier judges, the escrow pays."}


async def _disputed(devnet: Devnet, api_url: str) -> int:
    """Registered terms with a public brief, a delivered result, a failed verdict, a dispute:
    what the bots check against the chain before they judge."""
    poster, agent = devnet.posters[0], devnet.agents[0]
    client = ApiClient(api_url, devnet)
    try:
        # Auto mode: a manual review could be sampled for a panel of its own and take seats.
        task_hash = await client.register_terms(poster.private_key, {
            "verificationMode": "auto", "instructionsDigest": keccak_hex(BRIEF.encode()),
            "verificationCriteria": {"min_length": 10, "pass_threshold": 60}})
        await client.put_brief(poster.private_key, task_hash, BRIEF)
        task_id = await asyncio.to_thread(devnet.post_task, poster, task_hash=task_hash)
        await asyncio.to_thread(devnet.accept_task, task_id, sender=agent)
        evidence = bytes.fromhex(result_hash(RESULT)[2:])
        await asyncio.to_thread(devnet.submit_evidence, task_id, evidence, sender=agent)

        async def finalized() -> bool:
            try:
                await client.finalize(agent.private_key, task_id, RESULT)
            except RuntimeError:  # the submission is not indexed yet
                return False
            return True

        await wait_for(finalized, timeout=120, interval=0.5, what="the delivery to be finalized")
        await asyncio.to_thread(devnet.complete_verification, task_id, 1, evidence, False, 10,
                                sender=devnet.marketplace_verifier)
        await asyncio.to_thread(devnet.raise_dispute, task_id, sender=agent)
        return task_id
    finally:
        await client.close()


async def test_dispute_decided_by_bot_panels_lands_on_chain(
    devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    await ensure_topics(kafka_bootstrap, [
        TopicSpec(t, 1) for t in (topics.PANEL_ROUNDS, topics.PANEL_ATTESTATIONS, topics.PANEL_CONSENSUS,
                                  topics.PANEL_RULINGS, topics.PANEL_FEES)
    ] + [TopicSpec(topics.PANEL_CALIBRATION, 1, compacted=True)])
    bots = [anvil_key(60 + i) for i in range(6)]
    conn = await connect(database_url)
    pool = await create_pool(database_url, max_size=4)
    rpc = EthRpc([devnet.rpc_url], chain_id=devnet.chain_id)
    processes: list[subprocess.Popen[bytes]] = []
    stop = asyncio.Event()
    async with pipeline(devnet, database_url, kafka_bootstrap, topic_prefix) as consumers, \
            served_api(database_url, devnet) as api_url:
        config = PanelConfig(secret=b"e2e-panel-secret-0123456789abcdef", secret_version="e2e",
                             ruling_key=PANEL_KEY, attestation_seconds=300, fee_units=50_000)
        panel = build_panel_consumer(bootstrap=kafka_bootstrap, database_url=database_url, config=config,
                                     events_topic=consumers.events_topic, group=f"{topic_prefix}panels",
                                     dlq_topic=consumers.topic("dlq"), idle_interval=0.2)
        admit = build_ruling_consumer(bootstrap=kafka_bootstrap, database_url=database_url,
                                      chain_id=devnet.chain_id, escrow=devnet.escrow_address,
                                      trusted_signers=frozenset({PANEL_SIGNER}), group=f"{topic_prefix}rulings",
                                      dlq_topic=consumers.topic("dlq"))
        sender = RulingSender(rpc, SecretKey.from_hex(devnet.arbiter.private_key), devnet.chain_id,
                              devnet.escrow_address)
        running = [asyncio.create_task(panel.run()), asyncio.create_task(admit.run()),
                   asyncio.create_task(sender.serve(pool, stop, 0.3))]
        try:
            for index, (_, key) in enumerate(bots):
                env = {**os.environ, "ESCROWD_API_URL": api_url, "ESCROWD_RPC_URL": devnet.rpc_url, "ESCROWD_VERIFIER_KEY": key,
                       "ESCROWD_OPERATOR_ID": f"bot-op-{index}", "ESCROWD_VERIFIER_CHAINS": f"[{devnet.chain_id}]",
                       "ESCROWD_SCORER": "plugin:tests.panels.plugins.scorer:fixed",
                       "ESCROWD_POLL_SECONDS": "0.5", "PYTHONPATH": str(ROOT), "PANEL_TEST_QUALITY": "0.8", "PANEL_TEST_CONFIDENCE": "0.9"}
                log = (tmp_path / f"bot{index}.log").open("wb")
                processes.append(subprocess.Popen([str(Path(sys.executable).with_name("escrowd")), "verifier-bot"],
                                                  env=env, stdout=log, stderr=subprocess.STDOUT))

            async def registered() -> bool:
                return int(await conn.fetchval("SELECT count(*) FROM panel_verifiers")) == 6

            await wait_for(registered, timeout=120, interval=0.2, what="six bots registered")
            task_id = await _disputed(devnet, api_url)

            async def resolved() -> bool:
                view = await asyncio.to_thread(devnet.get_task, task_id)
                return view.status == TaskStatus.RESOLVED

            await wait_for(resolved, timeout=240, interval=0.5, what="the panel ruling on chain")
            rounds = await conn.fetch(
                "SELECT round, outcome, consensus_ppm, agent_share_bps FROM panel_rounds WHERE task_id = $1"
                " ORDER BY round", task_id)
            assert [(r["round"], r["outcome"]) for r in rounds] == [(1, "rerun"), (2, "ruling")]
            assert (rounds[1]["consensus_ppm"], rounds[1]["agent_share_bps"]) == (800_000, 10_000)
            seats = await conn.fetch("SELECT round_id, verifier FROM panel_seats WHERE task_id = $1", task_id)
            first = {s["verifier"] for s in seats if s["round_id"].endswith(":1")}
            second = {s["verifier"] for s in seats if s["round_id"].endswith(":2")}
            assert len(first) == len(second) == 3 and not first & second
            ruling = await conn.fetchrow("SELECT status, agent_share_bps FROM settlement_rulings WHERE task_id = $1",
                                         task_id)
            assert (ruling["status"], ruling["agent_share_bps"]) in {("confirmed", 10_000), ("sent", 10_000)}
            # Every verifier agreed with the ruling consensus with confidence 0.9: calibration rose.
            expected = rules.update_verifier(rules.Attestation("x", 800_000, 900_000, 500_000), 800_000)
            calibrations = [r["calibration_ppm"] for r in await conn.fetch("SELECT calibration_ppm FROM panel_verifiers")]
            assert calibrations == [expected] * 6 and expected > rules.START_CALIBRATION_PPM
            # Every attestation signed the attempt and the evidence hash the chain holds.
            bound = await conn.fetch("SELECT attempt, evidence_hash FROM panel_rounds WHERE task_id = $1", task_id)
            assert {(r["attempt"], r["evidence_hash"]) for r in bound} == {(1, result_hash(RESULT))}

            async def lifecycle_resolved() -> bool:
                state = await conn.fetchval(
                    "SELECT state FROM task_states WHERE task_id = $1", task_id)
                return state is not None and int(state["status"]) == int(TaskStatus.RESOLVED)

            await wait_for(lifecycle_resolved, timeout=120, interval=0.3, what="the lifecycle consumer to see it")
            reputation = await conn.fetchrow("SELECT score, dispute_count FROM agent_reputation WHERE agent = $1",
                                             devnet.agents[0].address.lower())
            assert reputation is not None and reputation["dispute_count"] == 1
        finally:
            for process in processes:
                process.send_signal(signal.SIGTERM)
            for process in processes:
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            stop.set()
            panel.stop()
            admit.stop()
            for task in running:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(task, 30)
            await rpc.close()
            await pool.close()
            await conn.close()
