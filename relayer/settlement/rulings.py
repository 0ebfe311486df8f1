"""The ruling path of the settlement relayer: signed panel rulings in, `resolveDispute` out,
from the arbiter key. Kept apart from the verdict send loop (`sender.py`); it reuses its
primitives: the RPC client, fee pricing, EIP-1559 signing, revert decoding, the key type and
the persisted nonce counter (`settlement_nonces`, a row of its own for the arbiter address).

Same rules as verdicts:

- **accept only trusted signers**: the ruling's EIP-712 signature (`schemas.panels`) must
  recover the claimed signer, and that signer must be a configured panel key; anything else
  is dead-lettered with the reason;
- **idempotent**: one row per (chain, escrow, task) in `settlement_rulings`, written before
  anything is signed; a second ruling for the task is never sent;
- **nonces**: under a row lock the next nonce (the larger of the stored counter and the
  chain's pending count) is taken, the signed raw transaction stored and the counter
  advanced in one transaction; only then is it broadcast. A crash re-broadcasts the stored
  raw transaction, never signs a second one for the same ruling;
- **fail closed**: nothing is signed or sent while the escrow's `arbiter()` is not our key
  (`arbiter_matches`, also reported by `/health/bridge` as `arbiter.arbiterMatches`);
- a preflight `eth_call` turns a refusal into a recorded outcome (`already_resolved` when
  the task is no longer disputed, `reverted` with the decoded error otherwise) without
  spending a nonce; a transaction that is not mined is broadcast again (after a reorg too),
  one whose nonce another transaction of the arbiter key took is queued again (and signed
  anew after a fresh preflight), and one that reverts on chain is recorded with its reason,
  not retried.

Not here (yet): fee bumps of a stuck ruling (rulings are rare; a stuck one is re-broadcast
at the same price).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import structlog
from prometheus_client import Counter, Gauge
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from relayer.settlement.fees import FeePolicy, price
from relayer.settlement.keys import SecretKey
from relayer.settlement.rpc import EthRpc, RpcCallError, RpcError
from relayer.settlement.txs import _word, decode_revert, selector, sign_eip1559
from runtime.consumer import IdempotentConsumer, InboundMessage, PermanentError
from runtime.db import create_pool
from schemas import panels as msg
from schemas.topics import DEAD_LETTERS, PANEL_RULINGS
from schemas.verdict import InvalidSignature

log = structlog.get_logger(__name__)

STATUS_RESOLVED = 9
GAS_HEADROOM_BPS = 12_000
DEFAULT_GAS = 200_000

RULINGS = Counter("escrowd_relayer_rulings_total", "Panel rulings by outcome", ["outcome"])
ARBITER_MATCH = Gauge("escrowd_relayer_arbiter_matches", "1 when the escrow's arbiter is our key", ["chain_id"])


def resolve_dispute_data(task_id: int, agent_share_bps: int) -> bytes:
    """Calldata of `resolveDispute(taskId, agentShareBps)`."""
    return selector("resolveDispute") + _word(task_id) + _word(agent_share_bps)


def arbiter_data() -> bytes:
    """Calldata of `arbiter()`."""
    return selector("arbiter")


def check_ruling(signed: msg.SignedRuling, trusted: frozenset[str]) -> str | None:
    """Why a signed ruling must be refused, or None when it may be sent."""
    try:
        recovered = msg.ruling_signer(signed)
    except InvalidSignature as exc:
        return f"invalid signature: {exc}"
    if recovered.lower() != signed.signer.lower():
        return "the signature is not the claimed signer's"
    if recovered.lower() not in trusted:
        return "the signer is not a trusted panel key"
    return None


def preflight_outcome(error_name: str, args: tuple[Any, ...]) -> str:
    """What a refused preflight means: the task is resolved already, or a real revert."""
    if error_name == "WrongStatus" and args and int(args[0]) == STATUS_RESOLVED:
        return "already_resolved"
    return "reverted"


class RulingHandler:
    """Consumes `escrow.panel-rulings.v1`: checks the signer, records the ruling once."""

    def __init__(self, *, chain_id: int, escrow: str, trusted_signers: frozenset[str]) -> None:
        self.chain_id = chain_id
        self.escrow = escrow.lower()
        self.trusted = frozenset(s.lower() for s in trusted_signers)

    async def __call__(self, conn: asyncpg.Connection, message: InboundMessage) -> None:
        signed = msg.SignedRuling.model_validate(message.json())
        r = signed.ruling
        if r.chain_id != self.chain_id or r.escrow.lower() != self.escrow:
            return  # another relayer's chain or escrow
        reason = check_ruling(signed, self.trusted)
        if reason is not None:
            RULINGS.labels("rejected").inc()
            raise PermanentError(reason)
        inserted = await conn.fetchval(
            "INSERT INTO settlement_rulings (chain_id, escrow, task_id, round, agent_share_bps, message_id,"
            " signer, signed_ruling) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING RETURNING 1",
            r.chain_id, r.escrow.lower(), r.task_id, r.round, r.agent_share_bps, msg.ruling_message_id(r),
            signed.signer.lower(), signed.model_dump(mode="json"),
        )
        RULINGS.labels("accepted" if inserted else "duplicate").inc()
        if inserted:
            await conn.execute("SELECT pg_notify('escrowd_rulings', $1)", str(r.chain_id))


@dataclass
class RulingSender:
    """Sends the queued rulings of one chain and escrow from the arbiter key."""

    rpc: EthRpc
    key: SecretKey
    chain_id: int
    escrow: str
    confirmations: int = 1
    policy: FeePolicy = field(default_factory=FeePolicy)
    arbiter_matches: bool | None = None
    escrow_arbiter: str | None = None

    async def check_arbiter(self) -> bool:
        """Read `arbiter()` from the escrow; the gate is open only when it is our key."""
        raw = await self.rpc.eth_call(self.escrow, arbiter_data())
        self.escrow_arbiter = "0x" + raw[-20:].hex()
        self.arbiter_matches = self.escrow_arbiter.lower() == self.key.address.lower()
        ARBITER_MATCH.labels(str(self.chain_id)).set(1 if self.arbiter_matches else 0)
        return self.arbiter_matches

    async def step(self, pool: asyncpg.Pool) -> int:
        """One pass: send what is queued (if the gate is open), follow what was sent."""
        done = 0
        if await self.check_arbiter():
            async with pool.acquire() as conn:
                queued = await conn.fetch(
                    "SELECT chain_id, escrow, task_id, agent_share_bps FROM settlement_rulings"
                    " WHERE chain_id = $1 AND escrow = $2 AND status = 'queued' ORDER BY created_at LIMIT 50",
                    self.chain_id, self.escrow.lower(),
                )
            for row in queued:
                await self._send(pool, int(row["task_id"]), int(row["agent_share_bps"]))
                done += 1
        else:
            log.warning("ruling_gate_closed", chain_id=self.chain_id, arbiter=self.escrow_arbiter)
        done += await self._follow(pool)
        return done

    async def _send(self, pool: asyncpg.Pool, task_id: int, share: int) -> None:
        data = resolve_dispute_data(task_id, share)
        try:
            await self.rpc.eth_call(self.escrow, data, sender=self.key.address)
        except RpcCallError as exc:
            revert = getattr(exc, "revert_data", None)
            error = decode_revert(revert if isinstance(revert, bytes) else b"")
            outcome = preflight_outcome(error.name, error.args)
            async with pool.acquire() as conn:
                await conn.execute(
                    "UPDATE settlement_rulings SET status = $4, error = $5, updated_at = now()"
                    " WHERE chain_id = $1 AND escrow = $2 AND task_id = $3 AND status = 'queued'",
                    self.chain_id, self.escrow.lower(), task_id, outcome, str(error),
                )
            RULINGS.labels(outcome).inc()
            return
        try:
            gas = int(await self.rpc.call("eth_estimateGas", {
                "from": self.key.address, "to": self.escrow, "data": "0x" + data.hex()}), 16)
            gas = gas * GAS_HEADROOM_BPS // 10_000
        except RpcCallError:
            gas = DEFAULT_GAS
        head = await self.rpc.head()
        fees = price(head.base_fee, await self.rpc.max_priority_fee(), self.policy)
        pending = await self.rpc.transaction_count(self.key.address, "pending")
        address = self.key.address.lower()
        async with pool.acquire() as conn, conn.transaction():
            status = await conn.fetchval(
                "SELECT status FROM settlement_rulings WHERE chain_id = $1 AND escrow = $2 AND task_id = $3"
                " FOR UPDATE", self.chain_id, self.escrow.lower(), task_id,
            )
            if status != "queued":
                return
            await conn.execute(
                "INSERT INTO settlement_nonces (chain_id, address, next_nonce) VALUES ($1, $2, $3)"
                " ON CONFLICT DO NOTHING", self.chain_id, address, pending,
            )
            stored = await conn.fetchval(
                "SELECT next_nonce FROM settlement_nonces WHERE chain_id = $1 AND address = $2 FOR UPDATE",
                self.chain_id, address,
            )
            nonce = max(int(stored), pending)
            tx = sign_eip1559(self.key, chain_id=self.chain_id, nonce=nonce, to=self.escrow, data=data,
                              gas_limit=gas, fees=fees)
            await conn.execute(
                "UPDATE settlement_rulings SET status = 'sent', nonce = $4, raw_tx = $5, tx_hash = $6,"
                " sent_at = now(), updated_at = now() WHERE chain_id = $1 AND escrow = $2 AND task_id = $3",
                self.chain_id, self.escrow.lower(), task_id, nonce, tx.raw_hex, tx.tx_hash,
            )
            await conn.execute(
                "UPDATE settlement_nonces SET next_nonce = $3, updated_at = now() WHERE chain_id = $1"
                " AND address = $2", self.chain_id, address, nonce + 1,
            )
        await self._broadcast(tx.raw_hex, tx.tx_hash)
        RULINGS.labels("sent").inc()

    async def _broadcast(self, raw_hex: str, tx_hash: str) -> None:
        try:
            await self.rpc.send_raw(raw_hex)
        except RpcCallError as exc:
            # "already known" / "nonce too low" mean the node has it or mined it: the
            # receipt decides; anything else is logged and retried on the next pass.
            log.info("ruling_broadcast_refused", tx_hash=tx_hash, error=exc.message[:200])

    async def _follow(self, pool: asyncpg.Pool) -> int:
        async with pool.acquire() as conn:
            sent = await conn.fetch(
                "SELECT task_id, nonce, raw_tx, tx_hash FROM settlement_rulings WHERE chain_id = $1 AND escrow = $2"
                " AND status = 'sent' ORDER BY nonce", self.chain_id, self.escrow.lower(),
            )
        if not sent:
            return 0
        head = await self.rpc.head()
        changed = 0
        mined_count: int | None = None
        for row in sent:
            receipt = await self.rpc.receipt(row["tx_hash"])
            if receipt is None or receipt.get("blockNumber") is None:
                if mined_count is None:
                    mined_count = await self.rpc.transaction_count(self.key.address, "latest")
                if mined_count > int(row["nonce"]):
                    # Another transaction of the arbiter key took this nonce: ours can never be
                    # mined. Queue the ruling again; the preflight sees whether it is still needed.
                    await self._requeue(pool, int(row["task_id"]), row["tx_hash"])
                    changed += 1
                else:
                    await self._broadcast(row["raw_tx"], row["tx_hash"])  # dropped or reorged out
                continue
            block = int(receipt["blockNumber"], 16)
            if int(receipt.get("status", "0x1"), 16) == 0:
                data = await self.rpc.revert_data(row["tx_hash"])
                outcome, error = "reverted", str(decode_revert(data or b""))
            elif head.number - block + 1 >= self.confirmations:
                outcome, error = "confirmed", None
            else:
                continue
            async with pool.acquire() as conn:
                await conn.execute(
                    "UPDATE settlement_rulings SET status = $4, error = $5, block_number = $6, updated_at = now()"
                    " WHERE chain_id = $1 AND escrow = $2 AND task_id = $3 AND status = 'sent'",
                    self.chain_id, self.escrow.lower(), int(row["task_id"]), outcome, error, block,
                )
            RULINGS.labels(outcome).inc()
            changed += 1
        return changed

    async def _requeue(self, pool: asyncpg.Pool, task_id: int, tx_hash: str) -> None:
        async with pool.acquire() as conn:
            await conn.execute(
                "UPDATE settlement_rulings SET status = 'queued', nonce = NULL, raw_tx = NULL, tx_hash = NULL,"
                " sent_at = NULL, updated_at = now() WHERE chain_id = $1 AND escrow = $2 AND task_id = $3"
                " AND status = 'sent' AND tx_hash = $4",
                self.chain_id, self.escrow.lower(), task_id, tx_hash,
            )
        RULINGS.labels("nonce_lost").inc()
        log.warning("ruling_nonce_lost", task_id=task_id)

    async def run(self, pool: asyncpg.Pool, stop: asyncio.Event, interval: float = 1.0) -> None:
        """Step until stopped; RPC faults are logged and retried on the next pass."""
        while not stop.is_set():
            try:
                await self.step(pool)
            except (RpcError, OSError, asyncpg.PostgresConnectionError) as exc:
                log.warning("ruling_step_failed", error_type=type(exc).__name__)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)


def build_ruling_consumer(
    *,
    bootstrap: str,
    database_url: str,
    chain_id: int,
    escrow: str,
    trusted_signers: frozenset[str],
    rulings_topic: str = PANEL_RULINGS,
    group: str = "escrowd-relayer-rulings",
    dlq_topic: str = DEAD_LETTERS,
) -> IdempotentConsumer:
    """The consumer that admits signed rulings into `settlement_rulings`."""
    return IdempotentConsumer(
        name=group,
        topics=[rulings_topic],
        bootstrap=bootstrap,
        database_url=database_url,
        handler=RulingHandler(chain_id=chain_id, escrow=escrow, trusted_signers=trusted_signers),
        dlq_topic=dlq_topic,
    )


class RulingRelaySettings(BaseSettings):
    """`escrowd relay rulings` (`ESCROWD_*` environment variables). The key is never logged.

    The arbiter key must not be the marketplace verifier key of `escrowd relay run`: each
    path keeps its own nonce counter for its own address.
    """

    model_config = SettingsConfigDict(env_prefix="ESCROWD_", extra="ignore")

    database_url: str = Field(description="PostgreSQL URL")
    kafka_bootstrap: str = Field(description="Kafka bootstrap servers")
    ruling_chain_id: int = Field(gt=0, description="Chain whose disputes the rulings resolve")
    ruling_rpc_url: str = Field(description="HTTP JSON-RPC URL of that chain")
    ruling_escrow: str = Field(pattern=r"^0x[0-9a-fA-F]{40}$", description="The escrow whose arbiter we are")
    ruling_arbiter_key: SecretStr = Field(description="0x hex key of the escrow's arbiter")
    ruling_trusted_signers: list[str] = Field(min_length=1, description="Panel service addresses whose rulings we send")
    ruling_confirmations: int = Field(default=1, ge=1, description="Blocks deep before a ruling is confirmed")
    ruling_interval: float = Field(default=1.0, gt=0, le=60, description="Seconds between send passes")
    panel_rulings_topic: str = Field(default=PANEL_RULINGS, description="Topic of signed rulings")
    dead_letter_topic: str = Field(default=DEAD_LETTERS, description="Poison messages, with the reason")


async def run_ruling_relay(settings: RulingRelaySettings, stop: asyncio.Event) -> None:
    """Admit rulings from Kafka and send them until `stop` is set."""
    from runtime.db import migrate_url
    from runtime.kafka import make_producer
    from runtime.outbox import OutboxPublisher

    await migrate_url(settings.database_url)
    key = SecretKey.from_hex(settings.ruling_arbiter_key.get_secret_value())
    consumer = build_ruling_consumer(
        bootstrap=settings.kafka_bootstrap,
        database_url=settings.database_url,
        chain_id=settings.ruling_chain_id,
        escrow=settings.ruling_escrow,
        trusted_signers=frozenset(s.lower() for s in settings.ruling_trusted_signers),
        rulings_topic=settings.panel_rulings_topic,
        dlq_topic=settings.dead_letter_topic,
    )
    rpc = EthRpc([settings.ruling_rpc_url], chain_id=settings.ruling_chain_id)
    pool = await create_pool(settings.database_url, max_size=4)
    producer = make_producer(settings.kafka_bootstrap, client_id="escrowd-relayer-rulings")
    await producer.start()
    publisher = OutboxPublisher(settings.database_url, producer)
    sender = RulingSender(rpc, key, settings.ruling_chain_id, settings.ruling_escrow,
                          confirmations=settings.ruling_confirmations)
    tasks = [
        asyncio.create_task(consumer.run()),
        asyncio.create_task(publisher.run()),
        asyncio.create_task(sender.run(pool, stop, settings.ruling_interval)),
    ]
    log.info("ruling_relay_started", arbiter=key.address, chain_id=settings.ruling_chain_id)
    try:
        await stop.wait()
    finally:
        consumer.stop()
        publisher.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 15)
        await producer.stop()
        await rpc.close()
        await pool.close()
