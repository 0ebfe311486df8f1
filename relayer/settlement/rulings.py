"""The ruling path of the settlement relayer: signed panel rulings in, `resolveDispute` out,
from the arbiter key. Kept apart from the verdict send loop (`sender.py`); it reuses its
primitives: the RPC client, fee pricing, EIP-1559 signing, revert decoding, the key type and
the persisted nonce counter (`settlement_nonces` through `chain.txstore`, the one nonce-row
module: a row of its own for the arbiter address).

Same rules as verdicts:

- **accept only trusted signers**: the ruling's EIP-712 signature (`schemas.panels`) must
  recover the claimed signer, and that signer must be a configured panel key; anything else
  is dead-lettered with the reason;
- **idempotent**: one row per (chain, escrow, task) in `settlement_rulings`, written before
  anything is signed; a second ruling for the task is never sent;
- **nonces**: the transaction is signed by the arbiter key's `chain.signers.Signer`
  (`ruling_signer`) at the next nonce (the larger of the stored counter and the chain's
  pending count) *before* any database transaction; then, under the row locks, the counter
  is checked unchanged (else the signature is dropped and made again), the signed raw
  transaction stored (`settlement_ruling_txs`, version 1) and the counter advanced in one
  transaction; only then is it broadcast. A crash re-broadcasts the stored raw transaction,
  never signs one at another nonce;
- **stuck → replaced**: an unmined ruling that cannot pay the base fee, or waited
  `replace_after` seconds, gets a new version with the same nonce and both fee fields bumped
  (`fees.bump`, capped by the policy's `fee_cap`; at the cap the live version stays); every
  version is stored before it is broadcast, and a receipt for any of them counts;
- **watched until final**: a confirmed ruling is checked every pass until `finality_depth`
  blocks deep; a receipt that disappears (or moves to a shallower block) sends it back to
  `sent` and the same nonce's transaction is broadcast again;
- **one nonce at a time**: a ruling is queued again for a fresh nonce only when the arbiter's
  count `confirmations` blocks below the head has passed its nonce and none of its versions
  was mined, in two passes in a row, the count read before the receipts (`chain.taken`:
  another transaction of the key took the nonce); the preflight then decides
  whether it is still needed. The database refuses a version at any other nonce;
- **fail closed**: nothing is signed or sent while the escrow's `arbiter()` is not our key
  (`arbiter_matches`, also reported by `/health/bridge` as `arbiter.arbiterMatches`);
- a preflight `eth_call` turns a refusal into a recorded outcome (`already_resolved` when
  the task is no longer disputed, `reverted` with the decoded error otherwise) without
  spending a nonce; one that reverts on chain is recorded with its reason, not retried.

The rules, with the reasoning about reorgs and nonces: docs/panels.md, "Sending a ruling".
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import asyncpg
import structlog
from prometheus_client import Counter, Gauge
from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator

from chain import txstore
from chain.eth_rpc import EthRpc, Head, RetryableRpcError, RpcCallError, RpcError
from chain.fees import (
    BPS,
    GWEI,
    NODE_MIN_BUMP_BPS,
    FeePolicy,
    Fees,
    price,
)
from chain.keys import KeyLoadError, SecretKey, load_keystore
from chain.receipts import INT64 as _INT64
from chain.receipts import BadReply, Receipt, quantity
from chain.sender import NODE_HAS_IT, broadcast_raw, classify_send_error
from chain.signers import KeystoreSigner, Signer, SignerError, SignerSpec, open_signer
from chain.stuck import stuck_action as stuck_action  # re-exported: the ruling rules' tests
from chain.taken import TakenWatch
from chain.txs import SignedTx, UnsignedTx, _word, decode_revert, selector
from runtime.aio import wait_event
from runtime.consumer import IdempotentConsumer, InboundMessage, PermanentError
from runtime.db import create_pool
from runtime.settings import PostgresUrl, ServiceSettings, one_key_source
from schemas import panels as msg
from schemas.topics import DEAD_LETTERS, PANEL_RULINGS
from schemas.verdict import InvalidSignature

log = structlog.get_logger(__name__)

STATUS_RESOLVED = 9
GAS_HEADROOM_BPS = 12_000
DEFAULT_GAS = 200_000

RULING_CONSUMER_GROUP = "escrowd-relayer-rulings"
SENDER_PART = "ruling-sender"
"""Readiness parts of `escrowd relay rulings` (`/readyz`)."""

MINED = ("confirmed", "reverted", "already_resolved")
"""Statuses a receipt gave the ruling: watched until `finality_depth` deep, then final."""

MALFORMED_REPLY = "malformed reply"
"""How the JSON-RPC client (`chain.rpc`) begins the error of a reply it refused for its shape."""

MAX_NONCE_JUMP = 1_024
"""How far the arbiter's pending count may run ahead of what we know before nothing is signed."""

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


@dataclass(frozen=True)
class Version:
    """One signed version of a ruling's transaction (`settlement_ruling_txs`)."""

    nonce: int
    version: int
    tx_hash: str
    raw_tx: str
    gas_limit: int
    fees: Fees


def node_has_it(message: str) -> bool:
    """True when a node's refusal of a raw transaction means it has it, or mined its nonce
    (geth/erigon "already known", anvil "already imported", besu "Known transaction",
    "nonce too low" / nethermind "OldNonce"): not a problem to report."""
    return classify_send_error(message) in NODE_HAS_IT


def mined_status(
    *, depth: int, confirmations: int, finality_depth: int, outcome: str = "confirmed"
) -> tuple[str, bool]:
    """(status, final) of a ruling whose transaction is mined `depth` blocks deep (pure).

    `outcome` (`confirmed`, or `reverted` / `already_resolved` for a receipt with status 0)
    from `confirmations` deep; final (no longer watched) from `finality_depth`. Until final a
    reorg can take a reverted transaction away as well as a successful one: both are watched.
    A ruling mined shallower than `confirmations` (re-mined after a reorg) is `sent` again.
    """
    if depth >= confirmations:
        return outcome, depth >= finality_depth
    return "sent", False


@dataclass
class RulingSender:
    """Sends the queued rulings of one chain and escrow from the arbiter key (`key`: its
    `chain.signers.Signer`, or a key in this process, signed through a `KeystoreSigner`)."""

    rpc: EthRpc
    key: Signer | SecretKey
    chain_id: int
    escrow: str
    confirmations: int = 1
    policy: FeePolicy = field(default_factory=FeePolicy)
    arbiter_matches: bool | None = None
    escrow_arbiter: str | None = None
    finality_depth: int = 64
    replace_after: float = 30.0

    _taken: TakenWatch = field(default_factory=TakenWatch, init=False, repr=False)
    _signer: Signer = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._signer = KeystoreSigner(self.key) if isinstance(self.key, SecretKey) else self.key
        if self.confirmations < 1 or self.finality_depth < self.confirmations:
            raise ValueError("need 1 <= confirmations <= finality_depth")

    @property
    def address(self) -> str:
        """The arbiter key's address."""
        return self._signer.address

    async def check_arbiter(self) -> bool:
        """Read `arbiter()` from the escrow; the gate is open only when it is our key."""
        raw = await self.rpc.eth_call(self.escrow, arbiter_data())
        self.escrow_arbiter = "0x" + raw[-20:].hex()
        self.arbiter_matches = self.escrow_arbiter.lower() == self.address.lower()
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
            await self.rpc.eth_call(self.escrow, data, sender=self.address)
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
            gas = quantity(await self.rpc.call("eth_estimateGas", {
                "from": self.address, "to": self.escrow, "data": "0x" + data.hex()}), "eth_estimateGas",
                limit=30_000_000)
            gas = gas * GAS_HEADROOM_BPS // 10_000
        except RpcCallError:
            gas = DEFAULT_GAS
        head = await self._head()
        fees = price(head.base_fee, await self.rpc.max_priority_fee(), self.policy)
        latest = await self._count("latest")  # read first: the pending count only grows after it
        pending = await self._count("pending")
        if not latest <= pending <= latest + MAX_NONCE_JUMP:
            raise BadReply("eth_getTransactionCount: pending count out of line with the mined count")
        address = self.address.lower()
        while True:
            # Signed before the database transaction, at the nonce the counter gives now: a
            # slow signer (KMS, a remote one) never holds the ruling's row or the nonce row.
            # When the counter moved meanwhile, the signature is dropped, never stored or sent.
            async with pool.acquire() as conn:
                stored = await txstore.next_nonce(conn, self.chain_id, address)
            nonce = self._nonce(pending, stored)
            tx = await self._sign(nonce, data, gas, fees)
            async with pool.acquire() as conn, conn.transaction():
                status = await conn.fetchval(
                    "SELECT status FROM settlement_rulings WHERE chain_id = $1 AND escrow = $2 AND task_id = $3"
                    " FOR UPDATE", self.chain_id, self.escrow.lower(), task_id,
                )
                if status != "queued":
                    return
                locked = self._nonce(pending, await txstore.lock_nonce_row(conn, self.chain_id, address, pending))
                if locked != nonce:
                    log.info("nonce_moved_while_signing", chain_id=self.chain_id, signed_at=nonce, now=locked)
                    continue
                await conn.execute(
                    "UPDATE settlement_rulings SET status = 'sent', nonce = $4, raw_tx = $5, tx_hash = $6,"
                    " sent_at = now(), broadcast_at = now(), block_number = NULL, block_hash = NULL,"
                    " updated_at = now() WHERE chain_id = $1 AND escrow = $2 AND task_id = $3",
                    self.chain_id, self.escrow.lower(), task_id, nonce, tx.raw_hex, tx.tx_hash,
                )
                await self._store_version(conn, task_id, tx, 1)
                await txstore.set_next_nonce(conn, self.chain_id, address, nonce + 1)
            break
        await self._broadcast(tx.raw_hex, tx.tx_hash)
        RULINGS.labels("sent").inc()

    @staticmethod
    def _nonce(pending: int, stored: int | None) -> int:
        """The ruling's nonce: the larger of the chain's pending count and the stored counter."""
        if stored is not None and pending > stored + MAX_NONCE_JUMP:
            # A node inflating the count would burn the counter: every later ruling would
            # wait behind a gap. Refuse to sign; the operator sees the pass fail.
            raise BadReply("eth_getTransactionCount: pending count far above the stored counter")
        return pending if stored is None else max(stored, pending)

    async def _sign(self, nonce: int, data: bytes, gas: int, fees: Fees) -> SignedTx:
        """`resolveDispute` calldata signed by the arbiter's signer (SignerError: nothing signed)."""
        return await self._signer.sign_transaction(
            UnsignedTx(chain_id=self.chain_id, nonce=nonce, to=self.escrow, data=data, gas_limit=gas, fees=fees)
        )

    async def _store_version(self, conn: asyncpg.Connection, task_id: int, tx: SignedTx, version: int) -> None:
        await conn.execute(
            "INSERT INTO settlement_ruling_txs (chain_id, escrow, task_id, nonce, version, tx_hash, raw_tx,"
            " gas_limit, max_fee_per_gas, max_priority_fee_per_gas) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            self.chain_id, self.escrow.lower(), task_id, tx.nonce, version, tx.tx_hash, tx.raw_hex, tx.gas_limit,
            tx.fees.max_fee_per_gas, tx.fees.max_priority_fee_per_gas,
        )

    async def _broadcast(self, raw_hex: str, tx_hash: str) -> None:
        (outcome,) = await broadcast_raw(self.rpc, [raw_hex])
        if outcome == "ok":
            return
        if outcome in NODE_HAS_IT:
            # The node has it or mined it (or its nonce): the receipt decides.
            log.debug("ruling_broadcast_known", tx_hash=tx_hash)
            return
        if outcome == "transient":
            raise RetryableRpcError("eth_sendRawTransaction: no answer")  # the pass fails; retried
        # A real refusal (no gas money, underpriced next to another transaction at the
        # nonce, a gas limit the node refuses): retried every pass, counted, alerted on.
        RULINGS.labels("broadcast_refused").inc()
        log.warning("ruling_broadcast_refused", tx_hash=tx_hash, outcome=outcome)

    async def _follow(self, pool: asyncpg.Pool) -> int:
        """Follow every ruling that was sent, and every confirmed one that is not final yet."""
        async with pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT task_id, agent_share_bps, nonce, status, tx_hash, block_hash, error,"
                " EXTRACT(EPOCH FROM now() - broadcast_at)::float8 AS waited FROM settlement_rulings"
                " WHERE chain_id = $1 AND escrow = $2 AND (status = 'sent' OR (status = ANY($3::text[])"
                " AND final_at IS NULL AND tx_hash IS NOT NULL)) ORDER BY nonce",
                self.chain_id, self.escrow.lower(), list(MINED),
            )
        if not rows:
            return 0
        head = await self._head()
        changed = 0
        for row in rows:
            changed += await self._follow_one(pool, row, head)
        return changed

    async def _versions(self, pool: asyncpg.Pool, task_id: int) -> list[Version]:
        async with pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT nonce, version, tx_hash, raw_tx, gas_limit, max_fee_per_gas, max_priority_fee_per_gas"
                " FROM settlement_ruling_txs WHERE chain_id = $1 AND escrow = $2 AND task_id = $3"
                " ORDER BY nonce, version", self.chain_id, self.escrow.lower(), task_id,
            )
        return [
            Version(int(r["nonce"]), int(r["version"]), r["tx_hash"], r["raw_tx"], int(r["gas_limit"]),
                    Fees(int(r["max_fee_per_gas"]), int(r["max_priority_fee_per_gas"])))
            for r in rows
        ]

    async def _head(self) -> Head:
        try:
            head = await self.rpc.head()
        except (KeyError, TypeError, ValueError, AttributeError):
            raise BadReply("eth_getBlockByNumber: not a block header") from None
        if head.number > _INT64 or head.base_fee > _INT64 * _INT64:
            raise BadReply("eth_getBlockByNumber: header out of range")
        return head

    async def _count(self, tag: str) -> int:
        return quantity(await self.rpc.call("eth_getTransactionCount", self.address, tag),
                        "eth_getTransactionCount")

    async def _mined_version(self, versions: list[Version]) -> tuple[Version, Receipt] | None:
        """The version with a receipt in a canonical block (a receipt for any version counts).

        Every field used is checked for type and range (`Receipt.parse`): a node's reply is
        outside input like any other.
        """
        for version in reversed(versions):
            raw = await self.rpc.call("eth_getTransactionReceipt", version.tx_hash)
            if raw is None:
                continue
            receipt = Receipt.parse(raw, version.tx_hash)
            if receipt is None:
                continue
            try:
                canonical = await self.rpc.block_hash(receipt.block_number)
            except (KeyError, TypeError, AttributeError):
                raise BadReply("eth_getBlockByNumber: not a block") from None
            if canonical is None or canonical.lower() != receipt.block_hash:
                continue  # a stale receipt of a block a reorg replaced
            return version, receipt
        return None

    async def _follow_one(self, pool: asyncpg.Pool, row: asyncpg.Record, head: Head) -> int:
        task_id = int(row["task_id"])
        versions = await self._versions(pool, task_id)
        # The count is read before the receipts: a transaction of ours mined between the two
        # reads then shows up in the receipts, never as a count past the nonce alone.
        taken = row["status"] == "sent" and row["nonce"] is not None and await self._nonce_taken(
            head, int(row["nonce"]))
        mined = await self._mined_version(versions)
        if mined is not None:
            self._taken.look((task_id, int(row["nonce"] or 0)), count_passed=taken, own_receipt=True)
            return await self._record_mined(pool, row, head, *mined)
        changed = 0
        waited = float(row["waited"] or 0.0)
        if row["status"] in MINED:
            # Its block was reorged away: the ruling is pending again, with the same nonce.
            # A reverted one too: its nonce is free again, and left unused it would be a gap
            # that every later ruling of the key waits behind.
            async with pool.acquire() as conn:
                done = await conn.fetchval(
                    "UPDATE settlement_rulings SET status = 'sent', error = NULL, block_number = NULL,"
                    " block_hash = NULL, reorgs = reorgs + 1, broadcast_at = now(), updated_at = now()"
                    " WHERE chain_id = $1 AND escrow = $2 AND task_id = $3 AND status = $4 AND final_at IS NULL"
                    " RETURNING 1",
                    self.chain_id, self.escrow.lower(), task_id, row["status"],
                )
            if not done:
                return 0
            RULINGS.labels("reorged").inc()
            log.warning("ruling_reorged", task_id=task_id, tx_hash=row["tx_hash"], nonce=row["nonce"])
            changed, waited = 1, 0.0  # broadcast it again first; replaced only if it then waits
        nonce = int(row["nonce"])
        live = [v for v in versions if v.nonce == nonce]
        if not live:
            return changed
        if self._taken.look((task_id, nonce), count_passed=taken, own_receipt=False):
            # Another transaction of the arbiter key took this nonce (none of ours was mined,
            # two passes in a row): no version can be mined any more. Queue the ruling again;
            # the preflight sees whether it is still needed, and only then does it get a
            # fresh nonce.
            await self._requeue(pool, task_id, nonce)
            return 1
        action, fees = stuck_action(
            live[-1].fees, base_fee=head.base_fee, suggested_priority=await self.rpc.max_priority_fee(),
            policy=self.policy, waited=waited, replace_after=self.replace_after,
        )
        if action == "bump" and fees is not None:
            return changed + await self._replace(pool, task_id, int(row["agent_share_bps"]), live[-1], fees)
        if action == "capped":
            RULINGS.labels("fee_capped").inc()
            log.warning("ruling_fee_capped", task_id=task_id, nonce=nonce, fee_cap=self.policy.fee_cap,
                        base_fee=head.base_fee)
        await self._broadcast(live[-1].raw_tx, live[-1].tx_hash)  # dropped, reorged out, or still waiting
        return changed

    async def _nonce_taken(self, head: Head, nonce: int) -> bool:
        """True when the arbiter key's count, `confirmations` deep, is past `nonce`.

        Read at that depth rather than at the head, so a shallow reorg that takes the other
        transaction away again cannot leave the ruling with two live nonces.
        """
        safe = head.number - self.confirmations + 1
        if safe < 0:
            return False
        try:
            count = await self._count(hex(safe))
        except RpcCallError:  # a node without that block's state: the head's count
            count = await self._count("latest")
        return count > nonce

    async def _record_mined(
        self, pool: asyncpg.Pool, row: asyncpg.Record, head: Head, version: Version, receipt: Receipt
    ) -> int:
        task_id = int(row["task_id"])
        block, block_hash = receipt.block_number, receipt.block_hash
        depth = max(head.number, block) - block + 1
        if receipt.failed:
            if row["status"] in ("reverted", "already_resolved") and row["block_hash"] == block_hash \
                    and row["tx_hash"] == version.tx_hash:
                outcome, err = str(row["status"]), row["error"]  # the same revert, already decoded
            else:
                data = await self.rpc.revert_data(version.tx_hash)
                error = decode_revert(data or b"")
                outcome = "already_resolved" if preflight_outcome(error.name, error.args) == "already_resolved" \
                    else "reverted"
                err = str(error)
        else:
            outcome, err = "confirmed", None
        # A reverted transaction is watched like a confirmed one: a reorg can take it away.
        status, final = mined_status(depth=depth, confirmations=self.confirmations,
                                     finality_depth=self.finality_depth, outcome=outcome)
        moved = row["status"] in MINED and (row["block_hash"] != block_hash or status != row["status"])
        unchanged = (status == row["status"] and not final and not moved and row["tx_hash"] == version.tx_hash
                     and row["block_hash"] == block_hash)
        if unchanged:
            return 0
        async with pool.acquire() as conn:
            done = await conn.fetchval(
                "UPDATE settlement_rulings SET status = $4, error = $5, block_number = $6, block_hash = $7,"
                " nonce = $8, tx_hash = $9, raw_tx = $10, reorgs = reorgs + $11,"
                " final_at = CASE WHEN $12 THEN now() END, updated_at = now()"
                " WHERE chain_id = $1 AND escrow = $2 AND task_id = $3 AND status = $13 RETURNING 1",
                self.chain_id, self.escrow.lower(), task_id, status, err, block, block_hash, version.nonce,
                version.tx_hash, version.raw_tx, 1 if moved else 0, final, row["status"],
            )
        if not done:
            return 0
        if moved:
            RULINGS.labels("reorged").inc()
            log.warning("ruling_reorged", task_id=task_id, tx_hash=version.tx_hash, block=block)
        if status != row["status"] or final:
            RULINGS.labels("final" if final else status).inc()
        return 1

    async def _replace(self, pool: asyncpg.Pool, task_id: int, share: int, latest: Version, fees: Fees) -> int:
        """Sign a replacement of `latest` (same nonce, bumped fees), store it, then broadcast it."""
        tx = await self._sign(latest.nonce, resolve_dispute_data(task_id, share), latest.gas_limit, fees)
        async with pool.acquire() as conn, conn.transaction():
            current = await conn.fetchrow(
                "SELECT status, nonce FROM settlement_rulings WHERE chain_id = $1 AND escrow = $2"
                " AND task_id = $3 FOR UPDATE", self.chain_id, self.escrow.lower(), task_id,
            )
            newest = await conn.fetchval(
                "SELECT max(version) FROM settlement_ruling_txs WHERE chain_id = $1 AND escrow = $2"
                " AND task_id = $3 AND nonce = $4", self.chain_id, self.escrow.lower(), task_id, latest.nonce,
            )
            if current is None or (current["status"], current["nonce"], newest) != (
                "sent", latest.nonce, latest.version
            ):
                return 0  # something else moved the ruling on meanwhile
            await self._store_version(conn, task_id, tx, latest.version + 1)
            await conn.execute(
                "UPDATE settlement_rulings SET raw_tx = $4, tx_hash = $5, broadcast_at = now(), updated_at = now()"
                " WHERE chain_id = $1 AND escrow = $2 AND task_id = $3",
                self.chain_id, self.escrow.lower(), task_id, tx.raw_hex, tx.tx_hash,
            )
        RULINGS.labels("replaced").inc()
        log.info("ruling_replaced", task_id=task_id, nonce=latest.nonce, version=latest.version + 1,
                 max_fee=fees.max_fee_per_gas, tip=fees.max_priority_fee_per_gas, old_tx=latest.tx_hash,
                 tx_hash=tx.tx_hash)
        await self._broadcast(tx.raw_hex, tx.tx_hash)
        return 1

    async def _requeue(self, pool: asyncpg.Pool, task_id: int, nonce: int) -> None:
        async with pool.acquire() as conn:
            await conn.execute(
                "UPDATE settlement_rulings SET status = 'queued', nonce = NULL, raw_tx = NULL, tx_hash = NULL,"
                " sent_at = NULL, broadcast_at = NULL, block_number = NULL, block_hash = NULL, updated_at = now()"
                " WHERE chain_id = $1 AND escrow = $2 AND task_id = $3 AND status = 'sent' AND nonce = $4",
                self.chain_id, self.escrow.lower(), task_id, nonce,
            )
        RULINGS.labels("nonce_lost").inc()
        log.warning("ruling_nonce_lost", task_id=task_id)

    async def run(self, pool: asyncpg.Pool, stop: asyncio.Event, interval: float = 1.0) -> None:
        """Step until stopped; RPC faults are logged and retried on the next pass."""
        from runtime import health

        while not stop.is_set():
            try:
                await self.step(pool)
                health.mark(SENDER_PART, True)
            except BadReply as exc:
                # A node's reply of the wrong type or out of range: nothing was signed from it.
                health.mark(SENDER_PART, False)
                RULINGS.labels("bad_reply").inc()
                log.warning("ruling_bad_reply", error=str(exc))
            except SignerError as exc:
                # The signer cannot answer: nothing was stored or sent for the ruling it was
                # signing (still queued); tried again next pass, never with another key.
                health.mark(SENDER_PART, False)
                RULINGS.labels("signer_unavailable").inc()
                log.warning("ruling_signer_unavailable", error=str(exc)[:200])
            except (RpcError, OSError, asyncpg.PostgresConnectionError) as exc:
                health.mark(SENDER_PART, False)
                if isinstance(exc, RpcError) and str(exc).startswith(MALFORMED_REPLY):
                    # The JSON-RPC client refused the reply's shape: the node lies, as above.
                    RULINGS.labels("bad_reply").inc()
                    log.warning("ruling_bad_reply", error=str(exc)[:200])
                else:
                    log.warning("ruling_step_failed", error_type=type(exc).__name__)
            except Exception as exc:  # the sending task must outlive any one pass
                # Anything else (a database refusal, a bug) failed this pass only: the sender
                # stays not ready (alerting) and tries again, rather than dying silently while
                # the process and its consumer stay up. The message may quote query arguments:
                # only the type is logged.
                health.mark(SENDER_PART, False)
                RULINGS.labels("step_crashed").inc()
                log.error("ruling_step_crashed", error_type=type(exc).__name__)
            await wait_event(stop, interval)


def build_ruling_consumer(
    *,
    bootstrap: str,
    database_url: str,
    chain_id: int,
    escrow: str,
    trusted_signers: frozenset[str],
    rulings_topic: str = PANEL_RULINGS,
    group: str = RULING_CONSUMER_GROUP,
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


LOCAL_CHAIN_IDS = frozenset({31337, 1337})
"""Chain ids of local development chains (anvil, hardhat, ganache): the only ones where a
public test key may sign or send rulings."""

PUBLIC_TEST_ADDRESSES = frozenset(a.lower() for a in (
    # The first 20 accounts of the public test mnemonic ("test test ... junk") that anvil,
    # hardhat and the compose devnet use: their private keys are published everywhere.
    "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266", "0x70997970C51812dc3A010C7d01b50e0d17dc79C8",
    "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC", "0x90F79bf6EB2c4f870365E785982E1f101E93b906",
    "0x15d34AAf54267DB7D7c367839AAf71A00a2C6A65", "0x9965507D1a55bcC2695C58ba16FB37d819B0A4dc",
    "0x976EA74026E726554dB657fA54763abd0C3a0aa9", "0x14dC79964da2C08b23698B3D3cc7Ca32193d9955",
    "0x23618e81E3f5cdF7f54C3d65f7FBc0aBf5B21E8f", "0xa0Ee7A142d267C1f36714E4a8F75612F20a79720",
    "0xBcd4042DE499D14e55001CcbB24a551F3b954096", "0x71bE63f3384f5fb98995898A86B02Fb2426c5788",
    "0xFABB0ac9d68B0B445fB7357272Ff202C5651694a", "0x1CBd3b2770909D4e10f157cABC84C7264073C9Ec",
    "0xdF3e18d64BC6A983f673Ab319CCaE4f1a57C7097", "0xcd3B766CCDd6AE721141F452C550Ca635964ce71",
    "0x2546BcD3c84621e976D8185a91A922aE77ECEc30", "0xbDA5747bFD65F08deb54cb465eB87D40e51B197E",
    "0xdD2FD4581271e230360230F9337D5c0430Bf44C0", "0x8626f6940E2eb28930eFb4CeF49B2d1F2C9C1199",
))


def public_test_key_refused(address: str, chain_id: int) -> bool:
    """True when `address` is a well-known test account and `chain_id` is not a local devnet."""
    return chain_id not in LOCAL_CHAIN_IDS and address.lower() in PUBLIC_TEST_ADDRESSES


class RulingRelaySettings(ServiceSettings):
    """`escrowd relay rulings` (`ESCROWD_*` over the file's `rulings:` section). The key is never logged.

    The arbiter key must not be the marketplace verifier key of `escrowd relay run`: each
    path keeps its own nonce counter for its own address. Give the key as an encrypted
    keystore (+ its password or a password file; what deployments mount) or as raw hex.
    """

    database_url: PostgresUrl = Field(description="PostgreSQL URL")
    kafka_bootstrap: str = Field(description="Kafka bootstrap servers")
    ruling_chain_id: int = Field(gt=0, description="Chain whose disputes the rulings resolve")
    ruling_rpc_url: str = Field(description="HTTP JSON-RPC URL of that chain")
    ruling_escrow: str = Field(pattern=r"^0x[0-9a-fA-F]{40}$", description="The escrow whose arbiter we are")
    ruling_signer: SignerSpec = Field(
        default_factory=SignerSpec,
        description=(
            "Who holds the arbiter key: kind keystore (ruling_arbiter_keystore or ruling_arbiter_key),"
            " aws-kms (kms_key_id, kms_region, kms_endpoint_url) or remote (remote_url, address)"
        ),
    )
    ruling_arbiter_key: SecretStr | None = Field(default=None, description="0x hex key of the escrow's arbiter")
    ruling_arbiter_keystore: Path | None = Field(default=None, description="Encrypted keystore of the arbiter key")
    ruling_arbiter_keystore_password: SecretStr | None = Field(default=None, description="Keystore password")
    ruling_arbiter_keystore_password_file: Path | None = Field(
        default=None, description="File holding the keystore password"
    )
    ruling_trusted_signers: list[Annotated[str, Field(pattern=r"^0x[0-9a-fA-F]{40}$")]] = Field(
        min_length=1, max_length=64, description="Panel service addresses whose rulings we send"
    )
    ruling_confirmations: int = Field(default=1, ge=1, description="Blocks deep before a ruling is confirmed")
    ruling_finality_depth: int = Field(
        default=64, ge=1, le=10_000,
        description="Blocks deep before a confirmed ruling is final; until then a reorg sends it back to pending",
    )
    ruling_fee_cap_wei: int = Field(default=500 * GWEI, gt=0, description="max_fee_per_gas of a ruling never above this")
    ruling_max_priority_fee_wei: int = Field(default=50 * GWEI, ge=1, description="Highest tip of a ruling")
    ruling_fee_bump_bps: int = Field(
        default=1_250, ge=NODE_MIN_BUMP_BPS, le=BPS, description="Tip and max fee raise of a replacement (1000 = 10%)"
    )
    ruling_replace_after_seconds: float = Field(
        default=30.0, gt=0, le=86_400, description="An unmined ruling broadcast this long ago is replaced"
    )
    ruling_interval: float = Field(default=1.0, gt=0, le=60, description="Seconds between send passes")
    panel_rulings_topic: str = Field(default=PANEL_RULINGS, description="Topic of signed rulings")
    dead_letter_topic: str = Field(default=DEAD_LETTERS, description="Poison messages, with the reason")
    metrics_port: int | None = Field(
        default=None, ge=0, le=65535, description="Port of /metrics, /healthz and /readyz; none to disable"
    )

    @field_validator("ruling_trusted_signers")
    @classmethod
    def _no_public_signer(cls, signers: list[str], info: ValidationInfo) -> list[str]:
        # The compose defaults trust anvil's account 8: left in place on a real chain, anyone
        # who can write to the rulings topic could sign any split with its published key.
        chain_id = info.data.get("ruling_chain_id")
        if isinstance(chain_id, int) and any(public_test_key_refused(s, chain_id) for s in signers):
            raise ValueError("a public test key (anvil's mnemonic) is trusted outside a local devnet chain")
        return signers

    @model_validator(mode="after")
    def _check(self) -> RulingRelaySettings:
        keystore, raw = ("ruling_arbiter_keystore", self.ruling_arbiter_keystore), ("ruling_arbiter_key", self.ruling_arbiter_key)
        if self.ruling_signer.kind == "keystore":
            one_key_source(keystore, raw)
        elif self.ruling_arbiter_keystore is not None or self.ruling_arbiter_key is not None:
            raise ValueError(f"ruling_signer is {self.ruling_signer.kind}: a key in this process is not used, remove it")
        if self.ruling_finality_depth < self.ruling_confirmations:
            raise ValueError("ruling_finality_depth must be at least ruling_confirmations")
        return self

    def fee_policy(self) -> FeePolicy:
        """The fee policy of the ruling path."""
        return FeePolicy(fee_cap=self.ruling_fee_cap_wei, max_priority_fee=self.ruling_max_priority_fee_wei,
                         bump_bps=self.ruling_fee_bump_bps)

    def arbiter_key(self) -> SecretKey:
        """The arbiter key of the keystore signer, from the keystore or the raw hex
        (KeyLoadError names no secret)."""
        if self.ruling_signer.kind != "keystore":
            raise KeyLoadError(f"ruling_signer is {self.ruling_signer.kind}: no arbiter key in this process")
        if self.ruling_arbiter_keystore is not None:
            password = self.ruling_arbiter_keystore_password
            return load_keystore(
                self.ruling_arbiter_keystore,
                password=None if password is None else password.get_secret_value(),
                password_file=self.ruling_arbiter_keystore_password_file,
            )
        assert self.ruling_arbiter_key is not None
        return SecretKey.from_hex(self.ruling_arbiter_key.get_secret_value())


RULINGS_SECTION = "rulings"
"""Section of the configuration file read by `escrowd relay rulings`."""


def load_ruling_settings(config_file: Path | None = None, **overrides: Any) -> RulingRelaySettings:
    """The settings of `escrowd relay rulings`: `ESCROWD_*` over the file's `rulings:` section."""
    from runtime.config_file import load

    return load(RulingRelaySettings, RULINGS_SECTION, config_file, **overrides)


async def run_ruling_relay(settings: RulingRelaySettings, stop: asyncio.Event) -> None:
    """Admit rulings from Kafka and send them until `stop` is set."""
    from runtime import health
    from runtime.db import migrate_url
    from runtime.kafka import make_producer
    from runtime.outbox import OutboxPublisher

    key = await open_signer(settings.ruling_signer, "arbiter", settings.arbiter_key)
    if public_test_key_refused(key.address, settings.ruling_chain_id):
        await key.aclose()
        raise KeyLoadError("the arbiter key is a public test key (anvil's mnemonic): refused outside a local devnet chain")
    log.info("ruling_signer_ready", kind=key.kind, address=key.address)
    if settings.metrics_port is not None:
        # Ready once the consumer joined its group and the sender made a pass against the
        # chain and the database; both start out not ready.
        health.mark(RULING_CONSUMER_GROUP, False)
        health.mark(SENDER_PART, False)
        health.start_server(settings.metrics_port)
    await migrate_url(settings.database_url)
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
                          confirmations=settings.ruling_confirmations, policy=settings.fee_policy(),
                          finality_depth=settings.ruling_finality_depth,
                          replace_after=settings.ruling_replace_after_seconds)
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
        await key.aclose()
