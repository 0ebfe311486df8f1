"""The ruling path of the settlement relayer: signed panel rulings in, `resolveDispute` out,
from the arbiter key, through the project's one transaction sender (`chain.sender.TxSender`;
`RulingSender` subclasses it as the verdict sender's `ChainSender` and the verifier agent's
`CallSender` do). The nonce counter, pricing and bumps, stuck replacement, receipts,
confirmations, reorg re-sends, reconciliation and the "nonce taken by someone else" rule are
the sender's; this module adds:

- **accept only trusted signers**: the ruling's EIP-712 signature (`schemas.panels`) must
  recover the claimed signer, and that signer must be a configured panel key; anything else
  is dead-lettered with the reason;
- **idempotent**: one row per (chain, escrow, task) in `settlement_rulings`, written before
  anything is signed; a second ruling for the task is never sent;
- **dispatch**: a preflight `eth_call` turns a refusal into a recorded outcome
  (`already_resolved` when the task is no longer disputed, `reverted` with the decoded error
  otherwise) without spending a nonce; otherwise the transaction is signed by the arbiter
  key's `chain.signers.Signer` before any database transaction (`TxSender._sign_new`, at
  least at the key's pending count), then the ruling (`sent`, its nonce), its link
  (`settlement_ruling_slots`), the slot of kind `ruling` with its first version and the
  counter are stored in one transaction, and only then is it broadcast;
- **what a slot means for its ruling** (`_sync_rulings`, after every tracking round): `sent`
  while pending or mined shallower than `confirmations`; then `confirmed`, or `reverted` /
  `already_resolved` for a receipt with status 0; final (`final_at`, no longer watched) at
  `finality_depth`; `sent` again (`reorgs` + 1) when a reorg took the receipt away; `queued`
  again when the sender judged the nonce lost (two looks, `chain.taken`), so the preflight
  decides again whether it is still needed before a fresh nonce;
- **fail closed**: the sender's gate is open only while the escrow's `arbiter()` is our key
  (`arbiter_matches`, also reported by `/health/bridge` as `arbiter.arbiterMatches`);
- the database keeps the invariants (migrations 120 and 230): one live nonce per ruling,
  versions only at it while `sent`, signed versions and links append-only, final rows frozen.

The rules, with the reasoning about reorgs and nonces: docs/panels.md, "Sending a ruling".
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any, cast

import asyncpg
import structlog
from prometheus_client import Counter, Gauge
from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator

from chain import txstore
from chain.eth_rpc import EthRpc, Head, RpcCallError, RpcError
from chain.fees import BPS, GWEI, NODE_MIN_BUMP_BPS, FeePolicy, Fees
from chain.gate import SendGate
from chain.keys import KeyLoadError, SecretKey, load_keystore
from chain.receipts import INT64 as _INT64
from chain.receipts import BadReply, depth, quantity
from chain.sender import (
    NODE_HAS_IT,
    SenderMetrics,
    SenderOptions,
    Slot,
    TxSender,
    classify_send_error,
    transient_fault,
)
from chain.signers import Signer, SignerError, SignerSpec, open_signer
from chain.stuck import stuck_action as stuck_action  # re-exported: the ruling rules' tests
from chain.txs import SignedTx, _word, decode_revert, selector
from chain.txstore import NewSlot, TxVersion, version_of
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


@dataclass(eq=False)
class RulingSlot(Slot):
    """A nonce of the arbiter key carrying one ruling."""

    task_id: int = -1


SENDER_METRICS = SenderMetrics.create("escrowd_ruling_sender", "the arbiter key")
"""The arbiter key's sender metrics (the panels dashboard's last row)."""


class _NotQueued(Exception):
    """The ruling left `queued` while it was being signed: the signature is dropped."""


class RulingSender(TxSender):
    """Sends the queued rulings of one chain and escrow from the arbiter key (`key`: its
    `chain.signers.Signer`, or a key in this process, signed through a `KeystoreSigner`),
    through the project's one transaction sender: nonces, replacement, receipts, reorgs and
    lost nonces are `TxSender`'s; this class adds the dispatch (preflight, then a slot of kind
    `ruling` linked to its ruling) and what each slot's state means for `settlement_rulings`.

    Driven in rounds (`step`): a round reads the head, checks `arbiter()` (the gate), tracks
    what was sent, sends what is queued and maintains what is pending; `run` repeats rounds.
    """

    def __init__(
        self,
        rpc: EthRpc,
        key: Signer | SecretKey,
        chain_id: int,
        escrow: str,
        *,
        confirmations: int = 1,
        policy: FeePolicy | None = None,
        finality_depth: int = 64,
        replace_after: float = 30.0,
    ) -> None:
        if confirmations < 1 or finality_depth < confirmations:
            raise ValueError("need 1 <= confirmations <= finality_depth")
        self.escrow = escrow.lower()
        self.finality_depth = finality_depth
        self.arbiter_matches: bool | None = None
        self.escrow_arbiter: str | None = None
        options = SenderOptions(
            policy=policy or FeePolicy(), gas_limit=DEFAULT_GAS, replace_after=replace_after,
            watch_blocks=finality_depth, allowed_to=frozenset({self.escrow}),
        )
        # The pool is the one each round is given (`step(pool)`): set before anything reads it.
        super().__init__(chain_id=chain_id, key=key, rpc=rpc, pool=cast(asyncpg.Pool, None), gate=SendGate(),
                         options=options, metrics=SENDER_METRICS, confirmations=confirmations)
        self._begun = False
        self._moved = 0  # rulings a round moved on (its hooks count them)
        self._queued_broadcasts: list[tuple[list[Slot], str]] = []
        self._reverts: dict[str, tuple[str, str]] = {}  # mined hash -> (outcome, decoded error)

    @property
    def key(self) -> Signer:
        """The arbiter key's signer."""
        return self._signer

    @property
    def policy(self) -> FeePolicy:
        """The fee policy of the ruling path."""
        return self._opt.policy

    # ------------------------------------------------------------------ rounds

    async def check_arbiter(self) -> bool:
        """Read `arbiter()` from the escrow; the gate is open only when it is our key."""
        try:
            raw = await self._rpc.eth_call(self.escrow, arbiter_data())
        except BaseException:
            self.gate.close("the escrow's arbiter() could not be read")
            raise
        self.escrow_arbiter = "0x" + raw[-20:].hex()
        self.arbiter_matches = self.escrow_arbiter.lower() == self.address.lower()
        ARBITER_MATCH.labels(str(self.chain_id)).set(1 if self.arbiter_matches else 0)
        if self.arbiter_matches:
            self.gate.open()
        else:
            self.gate.close(f"the escrow's arbiter is {self.escrow_arbiter}, not our key")
        return self.arbiter_matches

    async def step(self, pool: asyncpg.Pool) -> int:
        """One round: follow what was sent, send what is queued (if the gate is open),
        replace or re-broadcast what is pending. The number of rulings it moved on."""
        self._pool = pool
        head = await self._read_head()
        if not self._begun:
            await self._begin(head)
        self._on_head(head)
        changed = 0
        if not await self.check_arbiter():
            log.warning("ruling_gate_closed", chain_id=self.chain_id, arbiter=self.escrow_arbiter)
        self._moved = 0
        await self._track(full=True)
        changed += self._moved
        if self._reconcile_requested is not None:
            trigger, self._reconcile_requested = self._reconcile_requested, None
            await self._reconcile(trigger)
        if self.gate.is_open:
            changed += await self._dispatch()
            await self._flush()
            await self._maintain()
            await self._flush()
        # Closed: what is queued for broadcast waits for the gate (nothing goes out unchecked).
        return changed

    async def serve(self, pool: asyncpg.Pool, stop: asyncio.Event, interval: float = 1.0) -> None:
        """Rounds until stopped, as the one process of this key (a second one waits as a
        standby); RPC faults are logged and retried on the next round."""
        from runtime import health

        lock_id = txstore.advisory_lock_key(self.chain_id, self.address)
        async with pool.acquire() as lock_conn:
            while not stop.is_set() and not await lock_conn.fetchval("SELECT pg_try_advisory_lock($1)", lock_id):
                log.warning("sender_standby", chain_id=self.chain_id, reason="another process holds this key")
                await wait_event(stop, 5.0)
            try:
                while not stop.is_set():
                    await self._round(pool, health)
                    await wait_event(stop, interval)
            finally:
                with contextlib.suppress(Exception):
                    await lock_conn.execute("SELECT pg_advisory_unlock($1)", lock_id)

    async def _round(self, pool: asyncpg.Pool, health: Any) -> None:
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
            # signing (still queued); tried again next round, never with another key.
            health.mark(SENDER_PART, False)
            RULINGS.labels("signer_unavailable").inc()
            log.warning("ruling_signer_unavailable", error=str(exc)[:200])
        except Exception as exc:  # the sending task must outlive any one round
            health.mark(SENDER_PART, False)
            if not transient_fault(exc):
                # Anything else (a database refusal, a bug) failed this round only: the sender
                # stays not ready (alerting) and tries again, rather than dying silently while
                # the process and its consumer stay up. The message may quote query arguments:
                # only the type is logged.
                RULINGS.labels("step_crashed").inc()
                log.error("ruling_step_crashed", error_type=type(exc).__name__)
            elif isinstance(exc, RpcError) and str(exc).startswith(MALFORMED_REPLY):
                # The JSON-RPC client refused the reply's shape: the node lies, as above.
                RULINGS.labels("bad_reply").inc()
                log.warning("ruling_bad_reply", error=str(exc)[:200])
            else:
                # The node, the network or the database (gone, restarting, shutting down).
                log.warning("ruling_step_failed", error_type=type(exc).__name__)

    async def _read_head(self) -> Head:
        try:
            head = await self._rpc.head()
        except (KeyError, TypeError, ValueError, AttributeError):
            raise BadReply("eth_getBlockByNumber: not a block header") from None
        if head.number > _INT64 or head.base_fee > _INT64 * _INT64:
            raise BadReply("eth_getBlockByNumber: header out of range")
        return head

    async def _begin(self, head: Head) -> None:
        """The first round: adopt the versions signed before the sender's tables held them,
        load the open slots, reconcile the nonce counter with the chain."""
        chain_id = await self._rpc.chain_id()
        if chain_id != self.chain_id:
            raise RuntimeError(f"RPC of chain {self.chain_id} answers for chain {chain_id}")
        self._on_head(head)
        async with self._pool.acquire() as conn:
            await self._adopt_legacy(conn)
            slots = await self._load(conn, head.number - self._opt.watch_blocks)
        self.slots = {s.nonce: s for s in slots}
        waited = {s.nonce: s.last_broadcast for s in slots}
        await self._reconcile("startup")
        now = time.monotonic()
        resend: list[Slot] = []
        for slot in self._pending():
            last = waited.get(slot.nonce)
            if last is None:
                continue  # never broadcast: sent by the first maintenance
            # Broadcast before the restart: how long it has waited counts towards a
            # replacement (the account made no progress since, as far as we know); sent
            # again at once, the node may have dropped it meanwhile.
            slot.last_broadcast = last
            self._last_progress = min(self._last_progress, last)
            if now - last < self._opt.replace_after:
                resend.append(slot)
        if resend:
            self._spawn_broadcast(resend, "restart")
        self._begun = True
        self.started.set()

    async def _adopt_legacy(self, conn: asyncpg.Connection) -> None:
        """Move the live nonce of every ruling still followed whose versions are only in the
        table of migrations 110/120 (`settlement_ruling_txs_before_230`) into the sender's
        tables (versions from 0 there), so the sender follows it like any other slot."""
        rows = await conn.fetch(
            "SELECT r.task_id, r.nonce FROM settlement_rulings r WHERE r.chain_id = $1 AND r.escrow = $2"
            " AND r.nonce IS NOT NULL AND r.final_at IS NULL AND r.status <> 'queued'"
            " AND NOT EXISTS (SELECT 1 FROM settlement_ruling_slots l WHERE l.chain_id = r.chain_id"
            "   AND l.sender = $3 AND l.nonce = r.nonce)"
            " AND EXISTS (SELECT 1 FROM settlement_ruling_txs_before_230 o WHERE o.chain_id = r.chain_id"
            "   AND o.escrow = r.escrow AND o.task_id = r.task_id AND o.nonce = r.nonce)",
            self.chain_id, self.escrow, self.address.lower(),
        )
        for row in rows:
            task_id, nonce = int(row["task_id"]), int(row["nonce"])
            async with conn.transaction():
                versions = await conn.fetch(
                    "SELECT tx_hash, raw_tx, gas_limit, max_fee_per_gas, max_priority_fee_per_gas"
                    " FROM settlement_ruling_txs_before_230 WHERE chain_id = $1 AND escrow = $2 AND task_id = $3"
                    " AND nonce = $4 ORDER BY version", self.chain_id, self.escrow, task_id, nonce,
                )
                # Followed again from `sent`: its receipts say what it became.
                await conn.execute(
                    "UPDATE settlement_rulings SET status = 'sent', error = NULL, updated_at = now()"
                    " WHERE chain_id = $1 AND escrow = $2 AND task_id = $3",
                    self.chain_id, self.escrow, task_id,
                )
                await self._link(conn, nonce, task_id)
                signed = [
                    SignedTx(raw=bytes.fromhex(str(v["raw_tx"]).removeprefix("0x")), tx_hash=v["tx_hash"], nonce=nonce, gas_limit=int(v["gas_limit"]),
                             fees=Fees(int(v["max_fee_per_gas"]), int(v["max_priority_fee_per_gas"])))
                    for v in versions
                ]
                await txstore.insert_slots(conn, self.chain_id, self.address, [NewSlot(signed[0], "ruling")])
                for index, tx in enumerate(signed[1:], start=1):
                    await txstore.record_version(conn, self.chain_id, self.address, tx, index, "ruling")
            log.info("ruling_adopted", task_id=task_id, nonce=nonce, versions=len(signed))

    async def _link(self, conn: asyncpg.Connection, nonce: int, task_id: int) -> None:
        await conn.execute(
            "INSERT INTO settlement_ruling_slots (chain_id, sender, nonce, escrow, task_id) VALUES ($1, $2, $3, $4, $5)",
            self.chain_id, self.address.lower(), nonce, self.escrow, task_id,
        )

    # ------------------------------------------------------------------ dispatch

    async def _dispatch(self) -> int:
        """Send what is queued: a preflight `eth_call` first (a refusal is an outcome, no
        nonce spent), then one new slot per ruling."""
        if self.gate.fee_hold is not None:
            return 0  # held while no transaction under the cap could be mined
        async with self._pool.acquire() as conn:
            queued = await conn.fetch(
                "SELECT task_id, agent_share_bps FROM settlement_rulings"
                " WHERE chain_id = $1 AND escrow = $2 AND status = 'queued' ORDER BY created_at LIMIT 50",
                self.chain_id, self.escrow,
            )
        done = 0
        for row in queued:
            await self._send(int(row["task_id"]), int(row["agent_share_bps"]))
            done += 1
        return done

    async def _send(self, task_id: int, share: int) -> None:
        data = resolve_dispute_data(task_id, share)
        try:
            await self._rpc.eth_call(self.escrow, data, sender=self.address)
        except RpcCallError as exc:
            revert = getattr(exc, "revert_data", None)
            error = decode_revert(revert if isinstance(revert, bytes) else b"")
            outcome = preflight_outcome(error.name, error.args)
            async with self._pool.acquire() as conn:
                await conn.execute(
                    "UPDATE settlement_rulings SET status = $4, error = $5, updated_at = now()"
                    " WHERE chain_id = $1 AND escrow = $2 AND task_id = $3 AND status = 'queued'",
                    self.chain_id, self.escrow, task_id, outcome, str(error),
                )
            RULINGS.labels(outcome).inc()
            return
        try:
            gas = quantity(await self._rpc.call("eth_estimateGas", {
                "from": self.address, "to": self.escrow, "data": "0x" + data.hex()}), "eth_estimateGas",
                limit=30_000_000)
            gas = gas * GAS_HEADROOM_BPS // 10_000
        except RpcCallError:
            gas = DEFAULT_GAS
        latest = await self._count("latest")  # read first: the pending count only grows after it
        pending = await self._count("pending")
        if not latest <= pending <= latest + MAX_NONCE_JUMP:
            raise BadReply("eth_getTransactionCount: pending count out of line with the mined count")
        async with self._pool.acquire() as conn:
            stored = await txstore.next_nonce(conn, self.chain_id, self.address)
        if stored is not None and pending > stored + MAX_NONCE_JUMP:
            # A node inflating the count would burn the counter: every later ruling would
            # wait behind a gap. Refuse to sign; the operator sees the round fail.
            raise BadReply("eth_getTransactionCount: pending count far above the stored counter")

        async def store(conn: asyncpg.Connection, signed: list[SignedTx]) -> None:
            (tx,) = signed
            status = await conn.fetchval(
                "SELECT status FROM settlement_rulings WHERE chain_id = $1 AND escrow = $2 AND task_id = $3"
                " FOR UPDATE", self.chain_id, self.escrow, task_id,
            )
            if status != "queued":
                raise _NotQueued
            # The ruling first (its live nonce), then the link, then the slot and its first
            # version: the database checks each against the one before it.
            await conn.execute(
                "UPDATE settlement_rulings SET status = 'sent', nonce = $4, raw_tx = $5, tx_hash = $6, error = NULL,"
                " sent_at = now(), broadcast_at = now(), block_number = NULL, block_hash = NULL,"
                " updated_at = now() WHERE chain_id = $1 AND escrow = $2 AND task_id = $3",
                self.chain_id, self.escrow, task_id, tx.nonce, tx.raw_hex, tx.tx_hash,
            )
            await self._link(conn, tx.nonce, task_id)
            await txstore.insert_slots(conn, self.chain_id, self.address, [NewSlot(tx, "ruling")])
            await txstore.set_next_nonce(conn, self.chain_id, self.address, tx.nonce + 1)

        try:
            (tx,) = await self._sign_new([(self.escrow, data, gas)], store, floor=pending)
        except _NotQueued:
            return
        self._m.next_nonce.labels(self._label).set(tx.nonce + 1)
        self._adopt([RulingSlot(nonce=tx.nonce, kind="ruling", versions=[version_of(tx, 0, "ruling")],
                                task_id=task_id)])
        RULINGS.labels("sent").inc()

    async def _count(self, tag: str) -> int:
        return quantity(await self._rpc.call("eth_getTransactionCount", self.address, tag),
                        "eth_getTransactionCount")

    # ------------------------------------------------------------------ broadcasts

    def _spawn_broadcast(self, slots: Sequence[Slot], reason: str) -> None:
        # Broadcast within the round that stored them (`_flush`), not in the background:
        # when a round ends, what it stored has been offered to the node.
        for slot in slots:
            slot.in_flight = True
        self._queued_broadcasts.append((list(slots), reason))

    async def _flush(self) -> None:
        queued, self._queued_broadcasts = self._queued_broadcasts, []
        try:
            for slots, reason in queued:
                await self._broadcast(slots, reason)
        finally:
            for slots, _ in queued:
                for slot in slots:
                    slot.in_flight = False

    def _after_send(self, slot: Slot, version: TxVersion, outcome: str, reason: str) -> None:
        super()._after_send(slot, version, outcome, reason)
        if outcome not in ("ok", "transient", "nonce_too_high", "underpriced", "below_base_fee", *NODE_HAS_IT):
            # A real refusal (no gas money, a gas limit the node refuses): counted, alerted
            # on, and offered again every round until the cause is gone.
            RULINGS.labels("broadcast_refused").inc()
            log.warning("ruling_broadcast_refused", tx_hash=version.tx_hash, outcome=outcome)
            slot.last_broadcast = None
            slot.resend_reason = "transient"

    # ------------------------------------------------------------------ hooks

    async def _load(self, conn: asyncpg.Connection, watch_from_block: int) -> list[Slot]:
        slots = await super()._load(conn, watch_from_block)
        if not slots:
            return []
        nonces = [s.nonce for s in slots]
        links = {
            int(r["nonce"]): r
            for r in await conn.fetch(
                "SELECT l.nonce, l.task_id, r.final_at, EXTRACT(EPOCH FROM now() - ("
                "   SELECT max(v.broadcast_at) FROM settlement_tx_versions v WHERE v.chain_id = l.chain_id"
                "   AND v.sender = l.sender AND v.nonce = l.nonce))::float8 AS waited"
                " FROM settlement_ruling_slots l JOIN settlement_rulings r"
                "   ON r.chain_id = l.chain_id AND r.escrow = l.escrow AND r.task_id = l.task_id"
                " WHERE l.chain_id = $1 AND l.sender = $2 AND l.nonce = ANY($3::bigint[])",
                self.chain_id, self.address.lower(), nonces,
            )
        }
        now = time.monotonic()
        out: list[Slot] = []
        for slot in slots:
            link = links.get(slot.nonce)
            if link is None:
                out.append(slot)  # a filler of the key's own
                continue
            if link["final_at"] is not None:
                continue  # final: no longer watched
            ruling = RulingSlot(**{f.name: getattr(slot, f.name) for f in fields(Slot)}, task_id=int(link["task_id"]))
            waited = link["waited"]
            ruling.last_broadcast = None if waited is None else now - max(0.0, float(waited))
            out.append(ruling)
        return out

    async def _record_version(self, conn: asyncpg.Connection, slot: Slot, tx: SignedTx, kind: str) -> None:
        if isinstance(slot, RulingSlot):
            await conn.execute(
                "UPDATE settlement_rulings SET raw_tx = $5, tx_hash = $6, broadcast_at = now(), updated_at = now()"
                " WHERE chain_id = $1 AND escrow = $2 AND task_id = $3 AND status = 'sent' AND nonce = $4",
                self.chain_id, self.escrow, slot.task_id, slot.nonce, tx.raw_hex, tx.tx_hash,
            )

    def _replaced(self, slot: Slot, kind: str) -> None:
        RULINGS.labels("replaced").inc()
        log.info("ruling_replaced", task_id=getattr(slot, "task_id", None), nonce=slot.nonce,
                 version=slot.latest.version + 1, tx_hash=slot.latest.tx_hash)

    def _fee_capped(self, slot: Slot) -> None:
        RULINGS.labels("fee_capped").inc()
        log.warning("ruling_fee_capped", task_id=getattr(slot, "task_id", None), nonce=slot.nonce,
                    fee_cap=self.policy.fee_cap, base_fee=self.head.base_fee if self.head else None)

    async def _record_lost(self, conn: asyncpg.Connection, slots: Sequence[Slot]) -> None:
        # Another transaction of the arbiter key took the nonce (none of the ruling's versions
        # was mined, two looks in a row): queued again; the preflight decides whether it is
        # still needed, and only then does it get a fresh nonce.
        for slot in slots:
            if not isinstance(slot, RulingSlot):
                continue
            await conn.execute(
                "UPDATE settlement_rulings SET status = 'queued', nonce = NULL, raw_tx = NULL, tx_hash = NULL,"
                " error = NULL, sent_at = NULL, broadcast_at = NULL, block_number = NULL, block_hash = NULL,"
                " updated_at = now() WHERE chain_id = $1 AND escrow = $2 AND task_id = $3 AND nonce = $4"
                " AND final_at IS NULL",
                self.chain_id, self.escrow, slot.task_id, slot.nonce,
            )
            RULINGS.labels("nonce_lost").inc()
            log.warning("ruling_nonce_lost", task_id=slot.task_id, nonce=slot.nonce)
            self._moved += 1

    async def _after_track(self) -> None:
        await self._sync_rulings()

    # ------------------------------------------------------------------ what the slots mean

    async def _sync_rulings(self) -> None:
        """Write what each ruling's slot says into `settlement_rulings`: `sent` while pending
        (or mined shallower than `confirmations`), then the outcome of its receipt, final at
        `finality_depth` (then no longer watched). A ruling whose receipt went away (a reorg)
        is `sent` again and counted in `reorgs`."""
        ours = [s for s in self.slots.values() if isinstance(s, RulingSlot) and s.state != "lost"]
        if not ours or self.head is None:
            return
        async with self._pool.acquire() as conn:
            rows = {
                int(r["task_id"]): r
                for r in await conn.fetch(
                    "SELECT task_id, status, nonce, tx_hash, block_hash, error, final_at FROM settlement_rulings"
                    " WHERE chain_id = $1 AND escrow = $2 AND task_id = ANY($3::numeric[])",
                    self.chain_id, self.escrow, [s.task_id for s in ours],
                )
            }
        for slot in ours:
            row = rows.get(slot.task_id)
            if row is not None and row["final_at"] is not None and self.slots.get(slot.nonce) is slot:
                del self.slots[slot.nonce]  # final (here or elsewhere): no longer watched
            if row is None or row["final_at"] is not None or row["nonce"] != slot.nonce:
                continue
            await self._sync_one(slot, row, self.head)

    async def _sync_one(self, slot: RulingSlot, row: asyncpg.Record, head: Head) -> None:
        version = slot.latest
        status, final, err = "sent", False, None
        block_number = block_hash = None
        if slot.state in ("mined", "confirmed") and slot.mined_hash is not None and slot.block_number is not None:
            version = next((v for v in slot.versions if v.tx_hash == slot.mined_hash), slot.latest)
            block_number, block_hash = slot.block_number, slot.block_hash
            outcome = "confirmed"
            if slot.receipt_status == 0:
                outcome, err = await self._revert_outcome(slot.mined_hash, row)
            status, final = mined_status(depth=depth(head.number, slot.block_number), confirmations=self._depth,
                                         finality_depth=self.finality_depth, outcome=outcome)
            if status == "sent":
                err = None
        moved = row["status"] in MINED and (status == "sent" or row["block_hash"] != block_hash)
        if (status, version.tx_hash, block_hash, err) == (row["status"], row["tx_hash"], row["block_hash"],
                                                          row["error"]) and not final:
            return
        async with self._pool.acquire() as conn:
            done = await conn.fetchval(
                "UPDATE settlement_rulings SET status = $4, error = $5, block_number = $6, block_hash = $7,"
                " tx_hash = $8, raw_tx = $9, reorgs = reorgs + $10, final_at = CASE WHEN $11 THEN now() END,"
                " updated_at = now() WHERE chain_id = $1 AND escrow = $2 AND task_id = $3 AND nonce = $12"
                " AND status = $13 AND final_at IS NULL RETURNING 1",
                self.chain_id, self.escrow, slot.task_id, status, err, block_number, block_hash, version.tx_hash,
                version.raw_hex, 1 if moved else 0, final, slot.nonce, row["status"],
            )
        if not done:
            return
        self._moved += 1
        if moved:
            RULINGS.labels("reorged").inc()
            log.warning("ruling_reorged", task_id=slot.task_id, tx_hash=version.tx_hash, nonce=slot.nonce)
        if status != row["status"] or final:
            RULINGS.labels("final" if final else status).inc()
        if final and self.slots.get(slot.nonce) is slot:
            del self.slots[slot.nonce]  # final: left alone from now on

    async def _revert_outcome(self, tx_hash: str, row: asyncpg.Record) -> tuple[str, str]:
        """(`reverted` or `already_resolved`, the decoded error) of a mined, failed version."""
        known = self._reverts.get(tx_hash)
        if known is not None:
            return known
        if row["status"] in ("reverted", "already_resolved") and row["tx_hash"] == tx_hash:
            known = (str(row["status"]), str(row["error"]))  # the same revert, decoded before
        else:
            error = decode_revert(await self._rpc.revert_data(tx_hash) or b"")
            outcome = "already_resolved" if preflight_outcome(error.name, error.args) == "already_resolved" \
                else "reverted"
            known = (outcome, str(error))
        self._reverts[tx_hash] = known
        return known


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
    SENDER_METRICS.at_start([settings.ruling_chain_id], ["ruling", "filler"])
    sender = RulingSender(rpc, key, settings.ruling_chain_id, settings.ruling_escrow,
                          confirmations=settings.ruling_confirmations, policy=settings.fee_policy(),
                          finality_depth=settings.ruling_finality_depth,
                          replace_after=settings.ruling_replace_after_seconds)
    tasks = [
        asyncio.create_task(consumer.run()),
        asyncio.create_task(publisher.run()),
        asyncio.create_task(sender.serve(pool, stop, settings.ruling_interval)),
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
