"""The services of the pipeline beyond the indexer: consumers, relayer, API, the retention pruner.

Kept apart from `pipeline.py` so each service's wiring reads in one place. Keys: the
relayer sends from the devnet's marketplace verifier key; the verification service signs
verdicts with a key made for this run, which the relayer is told to trust.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
from typing import TYPE_CHECKING, Any

import httpx
import uvicorn
from eth_account import Account

from escrowd.pipeline_config import Component, PipelineConfig
from runtime.retention import Pruner, RetentionConfig

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from chain.signers import Signer
    from escrowd.devnet import Devnet
    from escrowd.traffic import OffChain


class _RelayerHealth:
    """`/health/bridge` on the API server, answered by the in-process relayer's monitor."""

    def __init__(self, relayer: Any) -> None:
        self._relayer = relayer

    async def report(self) -> Any:
        monitor = self._relayer.monitor
        if monitor is None:
            raise RuntimeError("relayer starting")
        return await monitor.report()


class _Server(uvicorn.Server):
    def install_signal_handlers(self) -> None:  # the pipeline owns the signals
        return


async def components(config: PipelineConfig, stop: asyncio.Event) -> list[Component]:
    """Every downstream service, ready to run."""
    from api.app import create_app
    from api.settings import ApiSettings
    from chain.signers import SignerSpec, open_signer
    from lifecycle.consumer import build_consumer as lifecycle_consumer
    from lifecycle.reputation.consumer import build_consumer as reputation_consumer
    from relayer.settlement.config import ChainSettings, RelayerSettings
    from relayer.settlement.service import Relayer, load_relayer_key
    from verification.service import (
        RetryScheduler,
        VerificationSettings,
        build_handler,
        build_judging_pool,
        open_verification_signer,
    )
    from verification.service import build_consumer as verification_consumer

    dn = config.devnet
    parts: list[Component] = []

    verification = VerificationSettings(
        database_url=config.database_url,
        kafka_bootstrap=config.kafka_bootstrap,
        verification_signer=config.verification_signer or SignerSpec(),
        verification_signing_key=config.verification_key if config.verification_signer is None else None,
        run_publisher=False,
        retry_base_seconds=1.0,
        retry_max_seconds=10.0,
    )
    verification_key = await open_verification_signer(verification)
    signer = verification_key.address
    vhandler = build_handler(verification, signer=verification_key)
    vconsumer = verification_consumer(verification, vhandler)
    parts.append(Component("verification-consumer", vconsumer.run, vconsumer.stop))
    judging = build_judging_pool(verification, vhandler)
    parts.append(Component("verification-judging", _closing(judging.run, verification_key), judging.stop))
    scheduler = RetryScheduler(config.database_url, verification.topics().requests, poll_seconds=1.0)
    parts.append(Component("verification-retries", scheduler.run))

    for member in (
        lifecycle_consumer(bootstrap=config.kafka_bootstrap, database_url=config.database_url),
        reputation_consumer(bootstrap=config.kafka_bootstrap, database_url=config.database_url),
    ):
        parts.append(Component(member.name, member.run, member.stop))

    relayer_settings = RelayerSettings(
        database_url=config.database_url,
        kafka_bootstrap=config.kafka_bootstrap,
        chains=[
            ChainSettings(
                chain_id=dn.chain_id, name="devnet", rpc_urls=[dn.rpc_url], ws_url=dn.ws_url,
                escrow_addresses=[dn.escrow_address], confirmations=1,
            )
        ],
        relayer_signer=config.relayer_signer or SignerSpec(),
        relayer_key=dn.marketplace_verifier.private_key if config.relayer_signer is None else None,
        relayer_trusted_signers=[signer],
        relayer_port=None,
        relayer_poll_interval=1.0,
        log_json=False,
    )  # fmt: skip
    relayer_key = await open_signer(relayer_settings.relayer_signer, "relayer", lambda: load_relayer_key(relayer_settings))
    relayer = Relayer(relayer_settings, relayer_key)
    parts.append(Component("relayer", _closing(relayer.run, relayer_key)))

    parts += _panel_components(config, stop)

    api_settings = ApiSettings(
        database_url=config.database_url,
        kafka_bootstrap=None,
        api_port=config.api_port,
        marketplace_verifier_address=dn.marketplace_verifier.address,
        deployments=[{"chain_id": dn.chain_id, "escrow": dn.escrow_address}],
        evidence_wait_seconds=10.0,
        finalize_wait_seconds=5.0,
    )
    app = create_app(api_settings)
    app.state.bridge_health = _RelayerHealth(relayer)
    server = _Server(
        uvicorn.Config(app, host="127.0.0.1", port=config.api_port, log_config=None, access_log=False)
    )

    def stop_server() -> None:
        server.should_exit = True

    parts.append(Component("api", server.serve, stop_server))

    # Retention as `escrowd index run` has it (defaults: a week past the broker's retention):
    # a long `escrowd run` keeps its tables bounded too.
    pruner = Pruner(config.database_url, RetentionConfig())
    parts.append(Component("retention", pruner.run, pruner.stop))
    return parts


class ApiClient:
    """The traffic generator's HTTP client: signs each request as the acting party."""

    def __init__(self, base_url: str, devnet: Devnet) -> None:
        self.devnet = devnet
        self.client = httpx.AsyncClient(base_url=base_url, timeout=60)

    async def call(self, method: str, path: str, body: Any, key: str) -> httpx.Response:
        from runtime.web.auth import Deployment, UnsignedRequest, sign_request

        raw = b"" if body is None else json.dumps(body).encode()
        headers = {"content-type": "application/json"} if body is not None else {}
        deployment = Deployment(self.devnet.chain_id, self.devnet.escrow_address)
        headers.update(sign_request(key, UnsignedRequest(method, path, raw, deployment=deployment, expires_at=int(time.time()) + 300)))
        for attempt in range(50):
            try:
                return await self.client.request(method, path, content=raw, headers=headers)
            except httpx.TransportError:
                # The server may still be starting; the signed nonce is unused until it answers.
                if attempt == 49:
                    raise
                await asyncio.sleep(0.1)
        raise AssertionError("unreachable")

    async def register_terms(self, poster_key: str, terms: dict[str, Any]) -> bytes:
        poster = Account.from_key(poster_key).address
        body = {
            "chainId": self.devnet.chain_id,
            "escrow": self.devnet.escrow_address,
            "poster": poster,
            "instructionsDigest": "0x" + secrets.token_hex(32),
            **terms,
        }
        response = await self.call("POST", "/v1/terms", body, poster_key)
        if response.status_code not in (200, 201):
            raise RuntimeError(f"register terms: {response.status_code} {response.text}")
        return bytes.fromhex(response.json()["taskHash"][2:])

    def _task_path(self, task_id: int, what: str) -> str:
        return f"/v1/tasks/{self.devnet.chain_id}/{self.devnet.escrow_address}/{task_id}/{what}"

    async def finalize(self, agent_key: str, task_id: int, result: Any) -> dict[str, Any]:
        response = await self.call("POST", self._task_path(task_id, "finalize"), {"result": result}, agent_key)
        if response.status_code not in (200, 202):
            raise RuntimeError(f"finalize: {response.status_code} {response.text}")
        data: dict[str, Any] = response.json()
        return data

    async def review(
        self, poster_key: str, task_id: int, attempt: int, evidence_hash: str, passed: bool, reasons: list[str]
    ) -> dict[str, Any]:
        body = {"attempt": attempt, "evidenceHash": evidence_hash, "passed": passed, "reasons": reasons}
        response = await self.call("POST", self._task_path(task_id, "review"), body, poster_key)
        if response.status_code not in (200, 202):
            raise RuntimeError(f"review: {response.status_code} {response.text}")
        data: dict[str, Any] = response.json()
        return data

    async def list_task(self, poster_key: str, task_id: int) -> None:
        """List the task once its TaskCreated is indexed (404 TASK_NOT_FOUND until then)."""
        for _ in range(600):
            response = await self.call("POST", self._task_path(task_id, "listing"), None, poster_key)
            if response.status_code in (200, 201):
                return
            if response.status_code != 404:
                raise RuntimeError(f"listing: {response.status_code} {response.text}")
            await asyncio.sleep(0.1)
        raise RuntimeError(f"listing: task {task_id} never indexed")

    async def put_brief(self, poster_key: str, task_hash: bytes, brief: str) -> None:
        response = await self.call("PUT", f"/v1/briefs/0x{task_hash.hex()}", {"brief": brief}, poster_key)
        if response.status_code != 200:
            raise RuntimeError(f"brief: {response.status_code} {response.text}")

    async def close(self) -> None:
        await self.client.aclose()


def _closing(run: Callable[[], Awaitable[None]], key: Signer) -> Callable[[], Awaitable[None]]:
    """`run`, then release `key` (the signer the run uses) however the run ends."""

    async def closing() -> None:
        try:
            await run()
        finally:
            await key.aclose()

    return closing


def offchain_client(api_port: int, devnet: Devnet) -> OffChain:
    """The HTTP client the traffic generator uses for the off-chain steps."""
    return ApiClient(f"http://127.0.0.1:{api_port}", devnet)  # type: ignore[return-value]


PANEL_BOTS = (0.9, 0.75, 0.6, 0.85, 0.7, 0.5)
"""Qualities of the in-process panel bots: spread wider than 0.02, so no panel looks colluding."""


def _panel_components(config: PipelineConfig, stop: asyncio.Event) -> list[Component]:
    """The panel service, the relayer's ruling path (arbiter key) and six verifier bots."""
    import aiohttp

    from chain.eth_rpc import EthRpc
    from chain.keys import SecretKey
    from panels.bot import BotSettings, VerifierBot
    from panels.service import PanelConfig
    from panels.service import build_consumer as panel_consumer
    from relayer.settlement.rulings import RulingSender, build_ruling_consumer

    dn = config.devnet
    panel_key = "0x" + secrets.token_hex(32)
    panel = panel_consumer(
        bootstrap=config.kafka_bootstrap, database_url=config.database_url, idle_interval=0.5,
        config=PanelConfig(secret=secrets.token_bytes(32), secret_version="run", ruling_key=panel_key,
                           attestation_seconds=120, fee_units=50_000),
    )
    admit = build_ruling_consumer(
        bootstrap=config.kafka_bootstrap, database_url=config.database_url, chain_id=dn.chain_id,
        escrow=dn.escrow_address, trusted_signers=frozenset({Account.from_key(panel_key).address.lower()}),
    )
    parts = [Component(panel.name, panel.run, panel.stop), Component(admit.name, admit.run, admit.stop)]

    async def send_rulings() -> None:
        from runtime.db import create_pool

        rpc = EthRpc([dn.rpc_url], chain_id=dn.chain_id)
        pool = await create_pool(config.database_url, max_size=3)  # one holds the key's advisory lock
        try:
            sender = RulingSender(rpc, SecretKey.from_hex(dn.arbiter.private_key), dn.chain_id, dn.escrow_address)
            await sender.serve(pool, stop, 0.5)
        finally:
            await rpc.close()
            await pool.close()

    parts.append(Component("ruling-relay", send_rulings))

    async def bots() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            members = []
            for index, quality in enumerate(PANEL_BOTS):

                async def scorer(_assignment: dict[str, Any], q: float = quality) -> tuple[float, float]:
                    return q, 0.8

                settings = BotSettings(
                    api_url=f"http://127.0.0.1:{config.api_port}", rpc_url=dn.rpc_url,
                    verifier_key="0x" + secrets.token_hex(32),
                    operator_id=f"run-bot-{index}", verifier_chains=[dn.chain_id], scorer="plugin:in:process",
                    poll_seconds=1.0,
                )
                members.append(VerifierBot(settings, scorer, session))
            # The API starts with the other components (slowly on a loaded machine): retry
            # until it answers, or until the run stops first.
            while not stop.is_set():
                try:
                    for bot in members:
                        await bot.register()
                    break
                except (aiohttp.ClientError, RuntimeError):
                    await asyncio.sleep(0.2)
            if stop.is_set():
                return
            await asyncio.gather(*(bot.run(stop) for bot in members))

    parts.append(Component("verifier-bots", bots))
    return parts


async def settle(pipeline: Any) -> None:
    """Wait until the consumers have caught up with every indexed event and the relays have
    seen the receipt of everything they sent: a ruling or verdict mined in the last block is
    on chain before its sender has tracked it, and the checks compare both sides."""
    from chain import indexed

    conn = pipeline.conn
    deadline = asyncio.get_running_loop().time() + 60
    while asyncio.get_running_loop().time() < deadline:
        behind = await indexed.task_events_not(
            conn, "EXISTS (SELECT 1 FROM lifecycle_events l WHERE l.event_id = e.event_id)"
        )
        in_flight = await conn.fetchval(
            "SELECT (SELECT count(*) FROM settlement_rulings WHERE status IN ('queued', 'sent'))"
            " + (SELECT count(*) FROM settlement_verdicts WHERE status IN ('queued', 'sent'))"
        )
        if behind == 0 and in_flight == 0:
            return
        await asyncio.sleep(0.2)


async def checks(pipeline: Any, planned: Any, events: Any) -> list[tuple[str, bool, str]]:
    """Pipeline-side invariants: lifecycle states and reputations equal what the chain implies."""
    from escrowd.invariants import verdict_counts

    conn = pipeline.conn
    results: list[tuple[str, bool, str]] = []
    states = {
        int(r["task_id"]): r["status"]
        for r in await conn.fetch("SELECT task_id, status FROM task_states")
    }
    wrong = [f"task {p.task_id}: {states.get(p.task_id)} != {p.final_status}" for p in planned
             if states.get(p.task_id) != p.final_status]  # fmt: skip
    results.append(("lifecycle state of every task equals its final chain status", not wrong, "; ".join(wrong[:10])))

    expected: dict[str, int] = {}
    for event in (e for e in events if e.name == "VerificationCompleted"):  # chain order
        agent = str(event.args["agent"]).lower()
        score = expected.get(agent, 100)
        expected[agent] = min(100, score + 1) if event.args["passed"] else max(0, score - 10)
    disputes = {agent: fails for agent, (fails, _) in verdict_counts(events).items()}
    rows = {r["agent"]: (r["score"], r["dispute_count"]) for r in await conn.fetch(
        "SELECT agent, score, dispute_count FROM agent_reputation")}  # fmt: skip
    mismatched = [
        f"{agent}: has {rows.get(agent)}, rules say {(score, disputes.get(agent, 0))}"
        for agent, score in expected.items()
        if rows.get(agent) != (score, disputes.get(agent, 0))
    ]
    results.append(("reputation of every agent as the rules dictate", not mismatched, "; ".join(mismatched[:5])))

    # The relayer: every attempt the marketplace key judged on chain went out exactly once.
    marketplace = pipeline.config.devnet.marketplace_verifier.address.lower()
    judged_by_us = {
        (int(e.args["taskId"]), int(e.args["attempt"]))
        for e in events
        if e.name == "VerificationCompleted" and str(e.args["verifier"]).lower() == marketplace
    }
    # A verdict's transactions: its own (kind 'verdict'), or the batch that carries it.
    rows = await conn.fetch(
        "SELECT v.task_id, v.attempt, v.status, count(t.nonce) FILTER (WHERE t.receipt_status = 1) AS mined_ok,"
        " count(t.nonce) AS nonces FROM settlement_verdicts v"
        " LEFT JOIN (SELECT verdict_id, chain_id, sender, nonce FROM settlement_transactions WHERE kind = 'verdict'"
        "   UNION ALL SELECT verdict_id, chain_id, sender, nonce FROM settlement_batch_items) s ON s.verdict_id = v.id"
        " LEFT JOIN settlement_transactions t ON (t.chain_id, t.sender, t.nonce) = (s.chain_id, s.sender, s.nonce)"
        " GROUP BY v.id"
    )
    relayed = {(int(r["task_id"]), r["attempt"]): r for r in rows}
    problems = [f"{key}: not relayed" for key in judged_by_us if key not in relayed]
    problems += [
        f"{key}: status {r['status']}, {r['mined_ok']} successful txs, {r['nonces']} nonces"
        for key, r in relayed.items()
        if r["status"] != "confirmed" or r["mined_ok"] != 1 or r["nonces"] != 1
    ]
    results.append(("relayer: one transaction per judged attempt, each confirmed", not problems, "; ".join(problems[:5])))

    # Panels: every dispute the panel decided was resolved on chain once, with the panel's split.
    resolved = {int(e.args["taskId"]): int(e.args["agentShareBps"]) for e in events if e.name == "DisputeResolved"}
    panel_paths = {p.task_id for p in planned if p.path == "panel_dispute"}
    rulings = {int(r["task_id"]): r for r in await conn.fetch(
        "SELECT p.task_id, p.agent_share_bps, s.status, s.nonce FROM panel_rulings p"
        " LEFT JOIN settlement_rulings s USING (chain_id, escrow, task_id)")}  # fmt: skip
    wrong_rulings = [f"task {t}: no panel ruling" for t in panel_paths if t not in rulings]
    wrong_rulings += [
        f"task {t}: chain {resolved.get(t)} bps, panel {r['agent_share_bps']} bps, relay {r['status']}"
        for t, r in rulings.items()
        if t in panel_paths and (resolved.get(t) != r["agent_share_bps"] or r["status"] != "confirmed")
    ]
    results.append(("panels: each panel dispute resolved on chain once, with the panel's split",
                    not wrong_rulings, "; ".join(wrong_rulings[:5])))
    unbalanced = await conn.fetchval(
        "SELECT count(*) FROM (SELECT round_id FROM panel_fee_ledger GROUP BY round_id"
        " HAVING sum(delta_units) <> 0) u")
    results.append(("panels: the fee ledger of every round sums to zero", unbalanced == 0, f"{unbalanced} rounds"))
    return results


async def lost_nonces(pipeline: Any, dn: Any) -> list[Any]:
    """Every nonce a sender of the run judged lost, with what the chain mined at it (anvil's
    `ots_getTransactionBySenderAndNonce`). In a run the human arbiter of the
    `dispute_and_ruling` path sends `resolveDispute` from the same key as the ruling relay,
    so lost ruling nonces are expected: each must be one of those transactions."""
    from escrowd.invariants import LostNonce

    rows = await pipeline.conn.fetch(
        "SELECT t.sender, t.nonce, array_agg(lower(v.tx_hash)) AS ours FROM settlement_transactions t"
        " JOIN settlement_tx_versions v USING (chain_id, sender, nonce) WHERE t.state = 'lost'"
        " GROUP BY t.sender, t.nonce ORDER BY t.sender, t.nonce"
    )
    lost = []
    for row in rows:
        taken = await asyncio.to_thread(dn.rpc, "ots_getTransactionBySenderAndNonce", row["sender"], hex(row["nonce"]))
        lost.append(LostNonce(str(row["sender"]), int(row["nonce"]), frozenset(row["ours"]),
                              taken if isinstance(taken, str) else None))
    return lost


class LocalSigner:
    """The devnet's stand-in for where the keys live (`escrowd run --signer`): nothing for
    `keystore`; one local KMS process (`runtime.services.localkms`) holding every key for
    `aws-kms`; one local JSON-RPC signer process (`runtime.services.localsigner`) per key for
    `remote`. Started at once, holding the devnet's keys (`keys`: role -> 0x key, public
    anyway); `specs` says where each role's key is; `stop()` ends the processes."""

    def __init__(self, kind: str, keys: dict[str, str]) -> None:
        from chain.signers import SignerSpec
        from runtime.services.localkms import LocalKms
        from runtime.services.localsigner import RemoteSignerProcess

        addresses = {role: Account.from_key(key).address for role, key in keys.items()}
        self.specs: dict[str, SignerSpec] = {}
        self.urls: dict[str, str] = {}
        self._processes: list[LocalKms | RemoteSignerProcess] = []
        if kind == "aws-kms":
            kms = LocalKms({f"escrowd-{role}": key for role, key in keys.items()}).start()
            # boto3 signs every request and needs credentials to: the local KMS ignores them.
            os.environ.setdefault("AWS_ACCESS_KEY_ID", "local")
            os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "local")
            self._processes.append(kms)
            for role, address in addresses.items():
                self.urls[role] = kms.url
                self.specs[role] = SignerSpec(
                    kind="aws-kms", kms_key_id=f"escrowd-{role}", kms_endpoint_url=kms.url, address=address
                )
        elif kind == "remote":
            for role, key in keys.items():
                remote = RemoteSignerProcess(key).start()
                self._processes.append(remote)
                self.urls[role] = remote.url
                self.specs[role] = SignerSpec(kind="remote", remote_url=remote.url, address=addresses[role])

    def stop(self) -> None:
        """Stop the local processes, if any."""
        while self._processes:
            self._processes.pop().stop()
