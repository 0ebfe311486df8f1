"""The transaction sender: the one module that sends raw transactions, for every key.

One `TxSender` per (chain, key). It owns the key's nonce row and its slots (one per nonce
we hold, `chain.txstore`; the database is the truth, memory a cache rebuilt at start-up)
and runs three loops over them:

- **heads**: follows `newHeads` over WebSocket (polling without one) and notices reorgs by
  block number and parent hash;
- **track**: on each new head, the account's mined count says which nonces were consumed,
  then their receipts (one batched round trip) say by which version; mined transactions
  become confirmed at the chain's depth; after a reorg (and periodically) the receipts of
  recently mined ones are read again, and one no longer on chain goes back to pending and is
  sent again. A nonce the count passed with no receipt of ours, twice in a row, was taken by
  someone else (`chain.taken`): the slot is `lost`;
- **maintain**: resends what this process never broadcast (restart, reorg, a transient
  failure), replaces stuck transactions with a fee bump under the cap (`chain.stuck`,
  `chain.fees`), cancels with a 0-value filler what a user says is no longer needed, and
  reconciles the nonce row with the chain (`chain.nonces`) when the node says "nonce too
  low/high" or a nonce was lost.

Nothing is broadcast while the gate is closed (`chain.gate`, fail closed). Every signature
comes from the key's `chain.signers.Signer` (a keystore, KMS or a remote signer) and is made
before any database transaction opens: a slow signer never holds the nonce row. New
transactions are signed at the nonces the counter gives, then stored in one database
transaction that locks the counter row and finds it unchanged (else they are discarded,
never broadcast, and signed again at the new nonces), and broadcast only after the commit.
A signer that cannot answer (`SignerError`) leaves everything as it was: nothing is stored
or sent, the loop backs off and tries again, never with another key.

Send policy: transactions go only to the configured destinations (`SenderOptions.allowed_to`,
the escrows; the key's own address for fillers): anything else is refused before signing.

Users: the relayer's verdict send loop (`relayer.settlement.sender.ChainSender`, a subclass
that adds its dispatch loop, single and packed verdicts, and what a verdict's outcome means),
the ruling path (`relayer.settlement.rulings.RulingSender`, a subclass that sends panel
rulings from the arbiter key and records what each became), and the hosted verifier agent
(`CallSender`: plain calls from its own wallet, each awaited until confirmed).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import structlog
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from chain import taken, txstore
from chain.eth_rpc import (
    EthRpc,
    Head,
    RetryableRpcError,
    RpcCallError,
    RpcError,
    classify_send_error,
    new_heads,
    sleep_backoff,
)
from chain.fees import FeePolicy, Fees, bump, includable, over_cap, price
from chain.gate import SendGate
from chain.keys import SecretKey
from chain.nonces import reconcile
from chain.receipts import Receipt, depth, fetch_receipts, quantity
from chain.signers import KeystoreSigner, Signer, SignerError
from chain.stuck import is_due
from chain.txs import FILLER_GAS, SignedTx, UnsignedTx, signed_call
from chain.txstore import MinedUpdate, NewSlot, TxVersion, version_of
from runtime.aio import wait_event
from runtime.db import is_connection_error

log = structlog.get_logger(__name__)

BROADCAST_CHUNK = 16  # raw transactions per JSON-RPC batch request
PRIORITY_FEE_TTL = 2.0  # seconds a suggested tip is reused

__all__ = [
    "BROADCAST_CHUNK",
    "CallFailed",
    "CallSender",
    "DestinationRefused",
    "SendGate",
    "SenderMetrics",
    "SenderOptions",
    "Slot",
    "TxSender",
    "broadcast_raw",
    "classify_send_error",
]


# ---------------------------------------------------------------------------- pure decisions


NODE_HAS_IT = frozenset({"known", "nonce_too_low"})
"""Refusals that mean the node has the transaction or mined its nonce: the receipt decides."""


async def broadcast_raw(rpc: EthRpc, raw_hexes: Sequence[str]) -> list[str]:
    """Send signed transactions in one JSON-RPC batch; the outcome of each: `ok`, `transient`
    (no answer: send again), or a `classify_send_error` class. Never raises for a refusal."""
    try:
        replies = await rpc.batch([("eth_sendRawTransaction", [raw]) for raw in raw_hexes])
    except RpcError:
        replies = [RetryableRpcError("broadcast batch failed")] * len(raw_hexes)
    outcomes = []
    for reply in replies:
        if isinstance(reply, RpcCallError):
            outcomes.append(classify_send_error(reply.message))
        elif isinstance(reply, RpcError | Exception):
            outcomes.append("transient")
        else:
            outcomes.append("ok")
    return outcomes


class DestinationRefused(ValueError):
    """A transaction to an address the send policy does not allow: refused before signing."""


class NonceMoved(Exception):
    """The counter moved while a round was being signed: its signatures are discarded."""


# ---------------------------------------------------------------------------- state


@dataclass
class Slot:
    """One nonce we hold, in memory."""

    nonce: int
    kind: str
    versions: list[TxVersion]
    state: str = "pending"
    to: str | None = None  # a `call` slot's target and calldata (re-signed by a replacement)
    data: bytes | None = None
    last_broadcast: float | None = None  # monotonic; None: not sent by this process yet
    resend_reason: str = "restart"
    needs_bump: bool = False
    in_flight: bool = False
    misses: int = 0  # looks in a row with the count past the nonce and no receipt of ours
    mined_hash: str | None = None
    block_number: int | None = None
    block_hash: str | None = None
    receipt_status: int | None = None
    reverted_handled: bool = False

    @property
    def latest(self) -> TxVersion:
        """The newest signed version."""
        return self.versions[-1]


@dataclass(frozen=True)
class SenderOptions:
    """Tuning of one sender."""

    policy: FeePolicy = field(default_factory=FeePolicy)
    gas_limit: int = 400_000
    max_in_flight: int = 512
    batch_size: int = 128
    broadcast_concurrency: int = 16
    replace_after: float = 30.0
    watch_blocks: int = 64
    recheck_interval: float = 5.0
    track_interval: float = 0.02  # at most one receipts round per this many seconds
    simulate: bool = True  # eth_call each verdict before spending a nonce on it
    dispatch_coalesce: float = 0.005  # seconds to let queued verdicts accumulate
    settle_batch: int = 100  # verdicts per completeVerificationBatch transaction (0 or 1: one per tx)
    settle_batch_min: int = 2  # pack only rounds with at least this many verdicts ready
    batch_gas_per_item: int = 60_000
    batch_gas_base: int = 360_000  # the escrow's BATCH_ITEM_GAS (313k) for the last item, the intrinsic gas
    allowed_to: frozenset[str] | None = None  # lower-case destinations allowed (None: any)
    revert_reason_patience: float = 300.0  # seconds a revert's reason may stay unreadable before it is recorded without


RESEND_REASONS = ("reorg", "transient", "nonce_lost", "nonce_too_low", "nonce_too_high")
"""The `reason` labels of `tx_resent`."""
RECONCILE_TRIGGERS = ("startup", "nonce_lost", "nonce_too_low", "nonce_too_high")
"""The `trigger` labels of `reconciliations`."""


@dataclass(frozen=True)
class SenderMetrics:
    """The metrics one kind of sender keeps; the first label of each is the chain id."""

    tx_sent: Counter
    tx_replaced: Counter
    tx_resent: Counter
    reorgs: Counter
    reconciliations: Counter
    gaps_filled: Counter
    fee_cap_reached: Counter
    fee_cap_held: Gauge
    pending: Gauge
    next_nonce: Gauge
    head_block: Gauge

    @classmethod
    def create(cls, prefix: str, who: str, registry: CollectorRegistry = REGISTRY) -> SenderMetrics:
        """Register the set under `prefix` (`escrowd_relayer`: the names dashboards use) in
        `registry` (the process's, which `/metrics` serves, by default)."""
        return cls(
            tx_sent=Counter(f"{prefix}_tx_sent_total", f"Transactions {who} broadcast for the first time",
                            ["chain_id", "kind"], registry=registry),
            tx_replaced=Counter(f"{prefix}_tx_replaced_total", "Fee-bumped replacements broadcast", ["chain_id"], registry=registry),
            tx_resent=Counter(f"{prefix}_tx_resent_total",
                              "Unchanged transactions broadcast again (restart, reorg, dropped)", ["chain_id", "reason"], registry=registry),
            reorgs=Counter(f"{prefix}_reorgs_detected_total", f"Reorgs that removed one of {who}'s mined transactions",
                           ["chain_id"], registry=registry),
            reconciliations=Counter(f"{prefix}_nonce_reconciliations_total",
                                    "Nonce reconciliations with the chain, by trigger", ["chain_id", "trigger"], registry=registry),
            gaps_filled=Counter(f"{prefix}_nonce_gaps_filled_total", "Nonce gaps closed with a filler", ["chain_id"], registry=registry),
            fee_cap_reached=Counter(f"{prefix}_fee_cap_reached_total",
                                    "Replacements skipped because the fee cap left no valid bump", ["chain_id"], registry=registry),
            fee_cap_held=Gauge(f"{prefix}_fee_cap_held",
                               "1 while the base fee is above the fee cap: new transactions are held", ["chain_id"],
                               registry=registry),
            pending=Gauge(f"{prefix}_pending_transactions", f"{who}'s transactions not yet mined", ["chain_id"], registry=registry),
            next_nonce=Gauge(f"{prefix}_nonce", f"The next nonce {who} will use", ["chain_id"], registry=registry),
            head_block=Gauge(f"{prefix}_head_block", f"Latest block {who} saw", ["chain_id"], registry=registry),
        )

    def at_start(self, chain_ids: Iterable[int | str], kinds: Iterable[str]) -> None:
        """Every counter's series whose labels are known, at 0, so an alert on any of them
        fires on its first event (`kinds`: the slot kinds this sender sends)."""
        from runtime.metrics import at_zero

        ids = [str(c) for c in chain_ids]
        at_zero(self.tx_sent, ids, kinds)
        at_zero(self.tx_resent, ids, RESEND_REASONS)
        at_zero(self.reconciliations, ids, RECONCILE_TRIGGERS)
        for counter in (self.tx_replaced, self.reorgs, self.gaps_filled, self.fee_cap_reached):
            at_zero(counter, ids)



def transient_fault(exc: BaseException) -> bool:
    """A fault a sender's loop waits out: the node or the network, a signer that cannot answer,
    or the database gone away, restarting or shutting down (`CannotConnectNowError` and
    `AdminShutdownError` are not `PostgresConnectionError`s: a failover ended the sender)."""
    return isinstance(exc, (RpcError, SignerError, asyncpg.PostgresConnectionError)) or is_connection_error(exc)

class TxSender:
    """Sends one chain's transactions from one key: nonces, fees, replacement, receipts,
    confirmations, reorgs, lost nonces. Subclasses say what their slots carry (the hooks
    below); every database write of a hook runs in the sender's own transaction."""

    def __init__(
        self,
        *,
        chain_id: int,
        key: Signer | SecretKey,
        rpc: EthRpc,
        pool: asyncpg.Pool,
        gate: SendGate,
        options: SenderOptions,
        metrics: SenderMetrics,
        confirmations: int = 1,
        ws_url: str | None = None,
        poll_interval: float = 1.0,
        crash: Callable[[str], None] | None = None,
    ) -> None:
        self.chain_id = chain_id
        self._signer: Signer = KeystoreSigner(key) if isinstance(key, SecretKey) else key
        self.address = self._signer.address
        self._rpc = rpc
        self._pool = pool
        self.gate = gate
        self._opt = options
        self._m = metrics
        self._depth = confirmations
        self._ws_url = ws_url
        self._poll_interval = poll_interval
        self._crash_at = crash or (lambda point: None)
        self._label = str(chain_id)
        self._m.fee_cap_held.labels(self._label).set(0)
        self.slots: dict[int, Slot] = {}
        self.head: Head | None = None
        self._seen: dict[int, str] = {}
        self._reorg_suspected = False
        self._chain_latest = 0
        self._last_progress = time.monotonic()
        self._reconcile_requested: str | None = None
        self._wake = asyncio.Event()
        self._head_event = asyncio.Event()
        self._send_sem = asyncio.Semaphore(options.broadcast_concurrency)
        self._background: set[asyncio.Task[None]] = set()
        self._priority: tuple[float, int] | None = None  # (monotonic time read, suggested tip)
        self._lock_conn: asyncpg.Connection | None = None
        self.last_error: str | None = None
        self.started = asyncio.Event()
        self._tracking = False
        # The nonce counter as this process's last `_sign_new` left it (None: read it).
        self._counter_hint: int | None = None

    # ------------------------------------------------------------------ hooks

    def _loops(self) -> list[tuple[str, Callable[[], Any]]]:
        """The loops to run besides heads, track and maintain."""
        return []

    async def _load(self, conn: asyncpg.Connection, watch_from_block: int) -> list[Slot]:
        """The open slots, as stored, with what they carry."""
        return [
            Slot(nonce=r.nonce, kind=r.kind, versions=r.versions, state=r.state, to=r.to, data=r.data,
                 mined_hash=r.mined_hash, block_number=r.block_number, block_hash=r.block_hash,
                 receipt_status=r.receipt_status, reverted_handled=r.receipt_status == 0)
            for r in await txstore.open_slots(conn, self.chain_id, self.address, watch_from_block)
            if r.versions
        ]

    def _call(self, slot: Slot) -> tuple[str, bytes, int]:
        """(to, calldata, gas limit) a replacement of `slot` signs: the calldata first signed
        for this nonce, read back from that signed version, whatever the slot carries since.
        One nonce never stands for two different calls: both could be mined in turn after a
        reorg, and anyone may broadcast an old version."""
        first = next((v for v in slot.versions if v.kind == slot.kind and v.kind != "filler"), None)
        if first is None:
            return self.address, b"", FILLER_GAS
        to, data = signed_call(bytes.fromhex(first.raw_hex.removeprefix("0x")))
        return to, data, slot.latest.gas_limit

    async def _screen(self, due: list[Slot]) -> tuple[list[Slot], set[int]]:
        """Before anything due is sent again: (what may be sent, nonces to cancel with a filler)."""
        return due, set()

    async def _record_replacement(self, conn: asyncpg.Connection, slot: Slot, kind: str) -> None:
        """Inside the replacement's transaction (a filler replacing what `slot` carried)."""

    async def _record_version(self, conn: asyncpg.Connection, slot: Slot, tx: SignedTx, kind: str) -> None:
        """Inside the transaction that stores any replacement of `slot` (a bump or a filler)."""

    def _replaced(self, slot: Slot, kind: str) -> None:
        """After a replacement was stored."""

    def _fee_capped(self, slot: Slot) -> None:
        """A due slot's bump would pass the fee cap: its live version is sent again unchanged."""

    def _on_mined(self, slot: Slot, receipt: dict[str, Any]) -> None:
        """A receipt of the slot was just read (newly mined, or re-included elsewhere)."""

    def _on_recheck(self, slot: Slot, receipt: dict[str, Any]) -> None:
        """A mined slot's receipt was read again, unchanged."""

    def _confirmable(self, slot: Slot) -> bool:
        """Whether a mined slot deep enough may be confirmed now."""
        return True

    def _on_reorged(self, slot: Slot) -> None:
        """A reorg took the slot's transaction away (back to pending)."""

    async def _record_tracked(self, conn: asyncpg.Connection, confirmed: list[Slot], reorged: list[Slot]) -> None:
        """Inside the transaction that writes the tracked slot states."""

    def _tracked(self, confirmed: list[Slot], reorged: list[Slot]) -> None:
        """After the tracked states were committed."""

    async def _handle_reverted(self, slots: Sequence[Slot]) -> None:
        """Mined transactions whose receipt says reverted (fillers excluded), not handled yet:
        set `reverted_handled` once a slot's outcome is recorded (a fault before that: the
        next tracking round passes it again)."""
        for slot in slots:
            slot.reverted_handled = True

    async def _record_lost(self, conn: asyncpg.Connection, slots: Sequence[Slot]) -> None:
        """Inside the transaction that marks slots lost (another transaction took the nonce)."""

    async def _after_track(self) -> None:
        """At the end of every tracking round."""

    # ------------------------------------------------------------------ public

    def wake(self) -> None:
        """Work to do: look now rather than at the next idle tick."""
        self._wake.set()

    async def run(self) -> None:
        """Start (reconcile with the chain) and run the loops until cancelled."""
        try:
            await self._start()
            self.started.set()
            async with asyncio.TaskGroup() as group:
                group.create_task(self._guard("heads", self._watch_heads))
                group.create_task(self._guard("track", self._track_loop))
                group.create_task(self._guard("maintain", self._maintain_loop))
                for name, loop in self._loops():
                    group.create_task(self._guard(name, loop))
        finally:
            for task in list(self._background):
                task.cancel()
            if self._lock_conn is not None:
                with contextlib.suppress(Exception):
                    await self._lock_conn.close(timeout=2)

    # ------------------------------------------------------------------ start-up

    async def _start(self) -> None:
        chain_id = await self._rpc.chain_id()
        if chain_id != self.chain_id:
            raise RuntimeError(f"RPC of chain {self.chain_id} answers for chain {chain_id}")
        # One sending process per (chain, key): a second one waits here as a standby.
        conn: asyncpg.Connection = await self._pool.acquire()
        self._lock_conn = conn
        lock_id = txstore.advisory_lock_key(self.chain_id, self.address)
        if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", lock_id):
            log.warning("sender_standby", chain_id=self.chain_id, reason="another process holds this key")
            await conn.execute("SELECT pg_advisory_lock($1)", lock_id)
        head = await self._rpc.head()
        self._on_head(head)
        async with self._pool.acquire() as db:
            for slot in await self._load(db, head.number - self._opt.watch_blocks):
                self.slots[slot.nonce] = slot
        await self._reconcile("startup")
        log.info("sender_started", chain_id=self.chain_id, address=self.address, head=head.number,
                 open_slots=len(self.slots))

    async def _reconcile(self, trigger: str) -> None:
        self._m.reconciliations.labels(self._label, trigger).inc()
        latest, pending = await self._rpc.batch(
            [
                ("eth_getTransactionCount", [self.address, "latest"]),
                ("eth_getTransactionCount", [self.address, "pending"]),
            ]
        )
        for value in (latest, pending):
            if isinstance(value, Exception):
                raise value
        # Checked like every reply (BadReply, an RpcError: the loop retries), never int() on it.
        chain_latest = quantity(latest, "eth_getTransactionCount latest")
        chain_pending = quantity(pending, "eth_getTransactionCount pending")
        async with self._pool.acquire() as conn:
            local = await txstore.next_nonce(conn, self.chain_id, self.address)
        held = [n for n, s in self.slots.items() if s.state == "pending"]
        plan = reconcile(local, chain_latest, chain_pending, held)
        self._note_chain_count(chain_latest)
        if plan.check_mined:
            # Held nonces below the chain's count: the track loop reads their receipts. It
            # is the only caller of `_track`: two rounds at once would both count a missing
            # receipt (a nonce called lost after one look) and both handle the same slots.
            self._head_event.set()
        for nonce in plan.rebroadcast:
            slot = self.slots.get(nonce)
            if slot is not None and not slot.in_flight:
                slot.last_broadcast = None
        self._counter_hint = None
        async with self._pool.acquire() as conn:
            await txstore.set_next_nonce(conn, self.chain_id, self.address, plan.next_nonce)
        # A nonce with a slot mined or confirmed at or above the chain's count is one a reorg
        # took away: the track round sends its transaction again; a filler would collide.
        fill = [n for n in plan.fill if n not in self.slots]
        if fill:
            await self._fill(fill, plan.next_nonce)
        self._m.next_nonce.labels(self._label).set(plan.next_nonce)
        (log.warning if plan.drifted else log.info)(
            "nonces_reconciled",
            chain_id=self.chain_id,
            trigger=trigger,
            local_next=local,
            chain_latest=chain_latest,
            chain_pending=chain_pending,
            next_nonce=plan.next_nonce,
            rebroadcast=len(plan.rebroadcast),
            filled=fill,
            foreign_pending=plan.foreign_pending,
        )

    async def _fill(self, nonces: Sequence[int], next_nonce: int) -> None:
        fees = await self._fees_now()
        signed = await self._sign_all([(n, self.address, b"", FILLER_GAS) for n in nonces], fees)
        self._counter_hint = None
        async with self._pool.acquire() as conn, conn.transaction():
            await txstore.insert_slots(conn, self.chain_id, self.address, [NewSlot(tx, "filler") for tx in signed])
            await txstore.set_next_nonce(conn, self.chain_id, self.address, next_nonce)
        for tx in signed:
            # Broadcast by the maintain loop, behind the send gate like everything else.
            slot = Slot(nonce=tx.nonce, kind="filler", versions=[version_of(tx, 0, "filler")])
            slot.resend_reason = "new"
            self.slots[tx.nonce] = slot
        self._m.gaps_filled.labels(self._label).inc(len(signed))

    # ------------------------------------------------------------------ helpers

    async def _guard(self, name: str, loop: Callable[[], Any]) -> None:
        # A loop survives transient faults; anything else ends the sender (and the process).
        failures = 0
        while True:
            try:
                await loop()
                return
            except Exception as exc:
                if not transient_fault(exc):
                    raise
                # A signer that cannot answer: nothing was stored or sent; try again later.
                failures += 1
                self.last_error = f"{name}: {type(exc).__name__}: {exc}"
                log.warning("sender_loop_retry", chain_id=self.chain_id, loop=name, error=self.last_error)
                await sleep_backoff(failures)

    @staticmethod
    async def _wait(event: asyncio.Event, seconds: float) -> None:
        # Not `asyncio.wait_for`: on 3.11 it can drop a cancellation (see runtime/aio.py).
        await wait_event(event, seconds)
        event.clear()

    def allowed(self, to: str) -> bool:
        """The send policy: `to` is a configured destination (or the key itself: a filler)."""
        allowed = self._opt.allowed_to
        return allowed is None or to.lower() in allowed or to.lower() == self.address.lower()

    async def _sign(self, nonce: int, to: str, data: bytes, gas_limit: int, fees: Fees) -> SignedTx:
        if not self.allowed(to):
            raise DestinationRefused(f"{to} is not a configured destination of this key")
        return await self._signer.sign_transaction(
            UnsignedTx(chain_id=self.chain_id, nonce=nonce, to=to, data=data, gas_limit=gas_limit, fees=fees)
        )

    async def _sign_all(self, calls: Sequence[tuple[int, str, bytes, int]], fees: Fees) -> list[SignedTx]:
        """(nonce, to, data, gas) each signed, concurrently (a remote signer's round trips
        overlap); never inside a database transaction."""
        return list(await asyncio.gather(*(self._sign(n, to, data, gas, fees) for n, to, data, gas in calls)))

    async def _sign_new(
        self,
        calls: Sequence[tuple[str, bytes, int]],
        store: Callable[[asyncpg.Connection, list[SignedTx]], Any],
        floor: int = 0,
    ) -> list[SignedTx]:
        """Sign `calls` (to, data, gas) at the next consecutive nonces and store them with
        `store(conn, signed)` (which advances the counter) in one transaction that finds the
        counter where the signing read it. The signing happens before that transaction, so
        the counter row is never locked while a signer answers; when the counter moved in
        between, the signatures are dropped (never stored or broadcast) and made again.
        `floor`: a lowest nonce the caller read from the chain (its pending count: another
        holder of the key may have transactions in the pool)."""
        fees = await self._fees_now()
        while True:
            low = max(self._chain_latest, floor)
            # The counter as this process's last round left it, else as stored: a hint only,
            # the locked read below decides (a stale one costs signatures made again).
            stored = self._counter_hint
            if stored is None:
                async with self._pool.acquire() as conn:
                    stored = await txstore.next_nonce(conn, self.chain_id, self.address)
            first = max(stored or 0, low)
            signed = await self._sign_all([(first + i, to, data, gas) for i, (to, data, gas) in enumerate(calls)], fees)
            self._crash_at("after_sign")
            self._counter_hint = None  # unknown until this round's transaction commits
            try:
                async with self._pool.acquire() as conn, conn.transaction():
                    locked = await txstore.lock_next_nonce(conn, self.chain_id, self.address, floor=low)
                    if locked != first:
                        raise NonceMoved
                    await store(conn, signed)
            except NonceMoved:
                log.info("nonce_moved_while_signing", chain_id=self.chain_id, signed_at=first)
                continue
            self._counter_hint = first + len(signed)  # what `store` advanced the counter to
            return signed

    def _note_chain_count(self, chain_latest: int) -> None:
        if chain_latest > self._chain_latest:
            self._last_progress = time.monotonic()
        self._chain_latest = chain_latest

    async def _fees_now(self) -> Fees:
        head = self.head or await self._rpc.head()
        # The suggested tip moves slowly; asking per block would cost a round trip per batch
        # on a chain that mines a block per transaction.
        if self._priority is None or time.monotonic() - self._priority[0] > PRIORITY_FEE_TTL:
            self._priority = (time.monotonic(), await self._rpc.max_priority_fee())
        return price(head.base_fee, self._priority[1], self._opt.policy)

    def _pending(self) -> list[Slot]:
        return [s for s in self.slots.values() if s.state == "pending"]

    def _update_gauges(self) -> None:
        self._m.pending.labels(self._label).set(len(self._pending()))

    def _adopt(self, slots: Sequence[Slot]) -> None:
        """Slots just stored: in memory as broadcasting, then broadcast."""
        now = time.monotonic()
        for slot in slots:
            slot.last_broadcast = now
            slot.in_flight = True
            self.slots[slot.nonce] = slot
        self._update_gauges()
        self._spawn_broadcast(slots, "new")

    # ------------------------------------------------------------------ heads

    def _on_head(self, head: Head) -> None:
        previous = self.head
        if previous is not None and head.hash == previous.hash:
            return
        known_parent = self._seen.get(head.number - 1)
        if previous is not None and (
            head.number <= previous.number or (known_parent is not None and known_parent != head.parent_hash)
        ):
            self._reorg_suspected = True
            log.info("reorg_suspected", chain_id=self.chain_id, head=head.number, previous=previous.number)
        self._seen[head.number] = head.hash
        for number in [n for n in self._seen if n > head.number or n < head.number - self._opt.watch_blocks]:
            if number != head.number:
                del self._seen[number]
        self.head = head
        self._m.head_block.labels(self._label).set(head.number)
        self._check_fee_hold(head.base_fee)
        self._head_event.set()

    def _check_fee_hold(self, base_fee: int) -> None:
        """Hold new sends while no transaction under the cap could be mined; lift the hold
        by itself when the base fee falls back. Nothing queued is dropped, no nonce is taken
        while held, so none is left stuck at a hopeless price."""
        cap = self._opt.policy.fee_cap
        if over_cap(base_fee, self._opt.policy):
            if self.gate.fee_hold is None:
                log.warning("fee_cap_hold", chain_id=self.chain_id, base_fee=base_fee, fee_cap=cap)
                self._m.fee_cap_held.labels(self._label).set(1)
            self.gate.hold_fees(f"base fee {base_fee} wei is above the fee cap {cap} wei: new transactions held")
        elif self.gate.fee_hold is not None:
            log.info("fee_cap_released", chain_id=self.chain_id, base_fee=base_fee, fee_cap=cap)
            self._m.fee_cap_held.labels(self._label).set(0)
            self.gate.release_fees()
            self._wake.set()

    async def _watch_heads(self) -> None:
        if self._ws_url is None:
            while True:
                self._on_head(await self._rpc.head())
                await asyncio.sleep(self._poll_interval)
        failures = 0
        while True:
            try:
                async for head in new_heads(self._ws_url):
                    failures = 0
                    self._on_head(head)
            except (RpcError, OSError, ValueError) as exc:
                log.warning("new_heads_disconnected", chain_id=self.chain_id, error=type(exc).__name__)
            except Exception as exc:  # aiohttp's WS errors have no common root worth naming
                log.warning("new_heads_disconnected", chain_id=self.chain_id, error=type(exc).__name__)
            failures += 1
            # Do not miss blocks while reconnecting.
            with contextlib.suppress(RpcError):
                self._on_head(await self._rpc.head())
            await sleep_backoff(failures)

    # ------------------------------------------------------------------ broadcast

    def _spawn_broadcast(self, slots: Sequence[Slot], reason: str) -> None:
        task = asyncio.create_task(self._broadcast(slots, reason))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _broadcast(self, slots: Sequence[Slot], reason: str) -> None:
        for slot in slots:
            slot.in_flight = True

        async def chunk(part: Sequence[Slot]) -> list[str]:
            # One JSON-RPC batch per chunk (in nonce order): far fewer HTTP requests for
            # the node to parse than one per transaction; each item is judged on its own.
            async with self._send_sem:
                versions = [slot.latest for slot in part]
                outcomes = await broadcast_raw(self._rpc, [v.raw_hex for v in versions])
                sent = []
                for slot, version, outcome in zip(part, versions, outcomes, strict=True):
                    self._after_send(slot, version, outcome, reason)
                    if outcome in ("ok", "known"):
                        sent.append(version.tx_hash)
                return sent

        ordered = sorted(slots, key=lambda s: s.nonce)
        parts = [ordered[i : i + BROADCAST_CHUNK] for i in range(0, len(ordered), BROADCAST_CHUNK)]
        try:
            sent = [h for hashes in await asyncio.gather(*(chunk(p) for p in parts)) for h in hashes]
        finally:
            for slot in slots:
                slot.in_flight = False
        self._crash_at("after_broadcast")
        if sent:
            with contextlib.suppress(asyncpg.PostgresError, OSError):
                async with self._pool.acquire() as conn:
                    await txstore.mark_broadcast(conn, sent)

    def _after_send(self, slot: Slot, version: TxVersion, outcome: str, reason: str) -> None:
        now = time.monotonic()
        if outcome in ("ok", "known"):
            slot.last_broadcast = now
            slot.needs_bump = False
            if reason == "new":
                self._m.tx_sent.labels(self._label, slot.kind).inc()
            elif reason == "replace":
                self._m.tx_replaced.labels(self._label).inc()
            else:
                self._m.tx_resent.labels(self._label, reason).inc()
            return
        bound = log.bind(chain_id=self.chain_id, nonce=slot.nonce, tx_hash=version.tx_hash, outcome=outcome)
        if outcome == "nonce_too_low":
            # Mined already (ours: the tracker will see it) or taken by someone else.
            slot.last_broadcast = now
            self._reconcile_requested = "nonce_too_low"
        elif outcome == "nonce_too_high":
            slot.last_broadcast = now
            self._reconcile_requested = "nonce_too_high"
            bound.warning("send_nonce_too_high")
        elif outcome in ("underpriced", "below_base_fee"):
            slot.last_broadcast = now
            slot.needs_bump = True
            bound.info("send_needs_higher_fee")
        elif outcome == "transient":
            slot.last_broadcast = None
            slot.resend_reason = "transient"
            bound.warning("send_transient_failure")
        else:
            slot.last_broadcast = now
            self.last_error = f"send refused: {outcome}"
            bound.error("send_refused")

    # ------------------------------------------------------------------ tracking

    async def _track_loop(self) -> None:
        last_full = 0.0  # the first round re-reads everything: the chain moved while we were down
        while True:
            await self._wait(self._head_event, self._opt.recheck_interval)
            now = time.monotonic()
            full = self._reorg_suspected or now - last_full >= self._opt.recheck_interval
            if full:
                self._reorg_suspected = False
                last_full = now
            await self._track(full=full)
            # Coalesce: on a fast chain (anvil mines a block per transaction) one round per
            # head would spend the node's time on our receipts instead of on mining.
            await asyncio.sleep(max(0.0, self._opt.track_interval - (time.monotonic() - now)))

    async def _receipts(self, hashes: Sequence[str]) -> dict[str, dict[str, Any]]:
        return await fetch_receipts(self._rpc, hashes)

    async def _track(self, *, full: bool) -> None:
        # One round at a time, from the track loop only: two rounds at once would both count
        # a missing receipt and both handle the same lost, reverted or refused slots.
        if self._tracking:
            raise RuntimeError("two track rounds at once")
        self._tracking = True
        try:
            await self._track_round(full=full)
        finally:
            self._tracking = False

    async def _track_round(self, *, full: bool) -> None:
        head = self.head
        if head is None:
            return
        # The count first, then the receipts: an own transaction mined between the two
        # reads then shows in the receipts, never as a count past the nonce alone.
        chain_latest = await self._rpc.transaction_count(self.address, "latest")
        self._note_chain_count(chain_latest)
        below = [s for s in self._pending() if s.nonce < chain_latest]
        recheck = [s for s in self.slots.values() if s.state in ("mined", "confirmed")] if full else []
        if not below and not recheck and not any(s.state == "mined" for s in self.slots.values()):
            self._update_gauges()
            return
        hashes = [v.tx_hash for s in below for v in s.versions] + [
            s.mined_hash for s in recheck if s.mined_hash is not None
        ]
        receipts = await self._receipts(hashes)
        newly_mined: list[Slot] = []
        lost: list[Slot] = []
        reorged: list[Slot] = []
        for slot in below:
            receipt = next((receipts[v.tx_hash] for v in reversed(slot.versions) if v.tx_hash in receipts), None)
            slot.misses, is_lost = taken.verdict(slot.misses, True, receipt is not None)
            if is_lost:
                lost.append(slot)
            elif receipt is not None:
                self._set_mined(slot, receipt)
                newly_mined.append(slot)
        for slot in recheck:
            receipt = receipts.get(slot.mined_hash or "")
            if receipt is None:
                reorged.append(slot)
            elif receipt["blockHash"] != slot.block_hash:
                self._set_mined(slot, receipt)  # re-included in another block: count depth again
                newly_mined.append(slot)
            else:
                self._on_recheck(slot, receipt)
        current = self.head or head
        confirmed = [
            s
            for s in self.slots.values()
            if s.state == "mined"
            and s.block_number is not None
            and depth(current.number, s.block_number) >= self._depth
            and self._confirmable(s)
        ]
        if newly_mined:
            self._crash_at("after_mined")
        # Confirmed and reorged in memory only once the database has it: a round cut short
        # (a dropped connection) is retried from the same states and writes them then.
        confirming = {id(s) for s in confirmed}
        updates = [
            MinedUpdate(s.nonce, "confirmed" if id(s) in confirming else s.state, s.mined_hash, s.block_number,
                        s.block_hash, s.receipt_status)
            for s in {id(s): s for s in [*newly_mined, *confirmed]}.values()
        ] + [MinedUpdate(s.nonce, "pending", None, None, None, None) for s in reorged]
        async with self._pool.acquire() as conn, conn.transaction():
            await txstore.update_slots(conn, self.chain_id, self.address, updates)
            await self._record_tracked(conn, confirmed, reorged)
        for slot in confirmed:
            slot.state = "confirmed"
        for slot in reorged:
            slot.state = "pending"
            slot.mined_hash = slot.block_hash = None
            slot.block_number = slot.receipt_status = None
            slot.last_broadcast = None
            slot.resend_reason = "reorg"
            slot.reverted_handled = False
            self._on_reorged(slot)
        self._tracked(confirmed, reorged)
        # Every mined revert not handled yet, not only this round's: a round (or a handler) cut
        # short by a transient fault leaves them to the next one.
        reverted = [
            s
            for s in self.slots.values()
            if s.state in ("mined", "confirmed") and s.receipt_status == 0 and s.kind != "filler"
            and not s.reverted_handled
        ]
        if reorged:
            self._m.reorgs.labels(self._label).inc()
            log.warning("reorg_dropped_transactions", chain_id=self.chain_id, nonces=[s.nonce for s in reorged])
        if reverted:
            try:
                await self._handle_reverted(reverted)
            except Exception as exc:
                if not transient_fault(exc):
                    raise
                # The node could not say why (its trace refused) or the database blinked: the
                # reverts wait for the next round; the rest of this one (lost nonces, refused
                # items, pruning, gauges) goes on at its own pace, without the loop's backoff.
                self.last_error = f"reverts: {type(exc).__name__}: {exc}"[:300]
                log.warning("reverts_handling_deferred", chain_id=self.chain_id, count=len(reverted),
                            error=self.last_error)  # fmt: skip
        if lost:
            await self._handle_lost(lost)
        await self._after_track()
        self._prune(current)
        self._update_gauges()

    def _set_mined(self, slot: Slot, receipt: dict[str, Any]) -> None:
        parsed = Receipt.parse(receipt, str(receipt.get("transactionHash")))
        assert parsed is not None  # fetch_receipts keeps mined receipts only
        slot.state = "mined"
        slot.misses = 0
        slot.mined_hash = str(receipt["transactionHash"])
        slot.block_number = parsed.block_number
        slot.block_hash = str(receipt["blockHash"])
        slot.receipt_status = 0 if parsed.failed else 1
        # The mined version tells what the slot became: a filler cancels what it carried.
        mined = next((v for v in slot.versions if v.tx_hash == slot.mined_hash), None)
        if mined is not None:
            slot.kind = mined.kind
        self._on_mined(slot, receipt)

    def _prune(self, head: Head) -> None:
        horizon = head.number - self._opt.watch_blocks
        for nonce in [
            n
            for n, s in self.slots.items()
            if s.state == "confirmed" and s.block_number is not None and s.block_number < horizon
            and (s.receipt_status != 0 or s.reverted_handled or s.kind == "filler")  # a revert waits for its handling
        ]:
            del self.slots[nonce]

    async def _handle_lost(self, slots: Sequence[Slot]) -> None:
        async with self._pool.acquire() as conn, conn.transaction():
            await txstore.update_slots(
                conn,
                self.chain_id,
                self.address,
                [MinedUpdate(s.nonce, "lost", None, None, None, None) for s in slots],
            )
            await self._record_lost(conn, slots)
        for slot in slots:
            slot.state = "lost"
            if self.slots.get(slot.nonce) is slot:  # not a slot stored at that nonce since
                del self.slots[slot.nonce]
        log.warning("nonces_lost", chain_id=self.chain_id, nonces=[s.nonce for s in slots])
        self._reconcile_requested = "nonce_lost"
        self._wake.set()

    # ------------------------------------------------------------------ maintenance

    async def _maintain_loop(self) -> None:
        tick = min(0.5, self._opt.replace_after / 4)
        last_poll = time.monotonic()
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            if now - last_poll >= self._opt.recheck_interval:
                # Backstop for missed notifications and silent rollbacks.
                last_poll = now
                self._on_head(await self._rpc.head())
            if self._reconcile_requested is not None:
                trigger, self._reconcile_requested = self._reconcile_requested, None
                try:
                    await self._reconcile(trigger)
                except BaseException:
                    # Not done: asked again when the loop comes back (`_guard` retries it).
                    self._reconcile_requested = self._reconcile_requested or trigger
                    raise
            if self.gate.is_open:
                await self._maintain()

    def _due(self, now: float) -> list[Slot]:
        stalled = now - self._last_progress >= self._opt.replace_after
        base_fee = self.head.base_fee if self.head else 0
        due = [
            slot
            for slot in self._pending()
            if not slot.in_flight
            and is_due(
                broadcast=slot.last_broadcast is not None,
                needs_bump=slot.needs_bump,
                fees=slot.latest.fees,
                base_fee=base_fee,
                waited=now - (slot.last_broadcast or now),
                stalled=stalled,
                replace_after=self._opt.replace_after,
            )
        ]
        return sorted(due, key=lambda s: s.nonce)

    async def _maintain(self) -> None:
        due = self._due(time.monotonic())
        if not due:
            return
        due, cancel = await self._screen(due)
        if not due:
            return
        fees_now = await self._fees_now()
        base_fee = self.head.base_fee if self.head else 0
        resend: list[Slot] = []
        for slot in due:
            if slot.state != "pending":
                continue
            if slot.nonce in cancel:
                if not await self._cancel(slot, fees_now, base_fee):
                    # No room under the cap to outbid it: let the transaction itself use the
                    # nonce (its user records what it does) rather than leave a gap.
                    resend.append(slot)
                continue
            if slot.last_broadcast is None and not slot.needs_bump and includable(slot.latest.fees, base_fee):
                resend.append(slot)
                continue
            new_fees = bump(slot.latest.fees, base_fee, fees_now.max_priority_fee_per_gas, self._opt.policy)
            if new_fees is None:
                self._m.fee_cap_reached.labels(self._label).inc()
                log.warning("fee_cap_reached", chain_id=self.chain_id, nonce=slot.nonce)
                self._fee_capped(slot)
                slot.needs_bump = False
                resend.append(slot)
                continue
            await self._replace(slot, new_fees, kind=slot.kind)
        for reason in {s.resend_reason for s in resend}:
            self._spawn_broadcast([s for s in resend if s.resend_reason == reason], reason)

    async def _replace(self, slot: Slot, fees: Fees, *, kind: str) -> None:
        to, data, gas = (self.address, b"", FILLER_GAS) if kind == "filler" else self._call(slot)
        tx = await self._sign(slot.nonce, to, data, gas, fees)
        version = slot.latest.version + 1
        async with self._pool.acquire() as conn, conn.transaction():
            await txstore.record_version(conn, self.chain_id, self.address, tx, version, kind)
            await self._record_version(conn, slot, tx, kind)
            if kind == "filler" and slot.kind != "filler":
                await txstore.convert_to_filler(conn, self.chain_id, self.address, slot.nonce)
                await self._record_replacement(conn, slot, kind)
        slot.versions.append(version_of(tx, version, kind))
        self._replaced(slot, kind)
        slot.kind = kind
        slot.needs_bump = False
        log.info(
            "tx_replaced",
            chain_id=self.chain_id,
            nonce=slot.nonce,
            tx_hash=tx.tx_hash,
            max_fee_per_gas=fees.max_fee_per_gas,
            max_priority_fee_per_gas=fees.max_priority_fee_per_gas,
        )
        self._spawn_broadcast([slot], "replace")

    async def _cancel(self, slot: Slot, fees_now: Fees, base_fee: int) -> bool:
        # A filler at the same nonce keeps the nonce sequence whole; it must outbid our own
        # pending transaction.
        new_fees = bump(slot.latest.fees, base_fee, fees_now.max_priority_fee_per_gas, self._opt.policy)
        if new_fees is None:
            self._m.fee_cap_reached.labels(self._label).inc()
            log.warning("cancel_fee_cap_reached", chain_id=self.chain_id, nonce=slot.nonce)
            return False
        await self._replace(slot, new_fees, kind="filler")
        return True


# ---------------------------------------------------------------------------- plain calls


class CallFailed(Exception):
    """A call's transaction was mined and reverted, or its nonce went to another transaction."""


class CallSender(TxSender):
    """A `TxSender` for plain contract calls: `send(to, data, gas)` stores and broadcasts one
    at the key's next nonce and returns the nonce; `confirmed(nonce)` waits until its
    transaction (any version) is confirmed and returns its hash, or raises `CallFailed`."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._waiters: dict[int, list[asyncio.Future[str]]] = {}
        self._outcomes: dict[int, str | CallFailed] = {}

    async def send(self, to: str, data: bytes, gas_limit: int) -> int:
        """Sign, store and broadcast a call at the next nonce (behind the gate and the fee
        hold); its nonce."""
        await self.gate.wait_sendable()
        if not self.allowed(to):
            raise DestinationRefused(f"{to} is not a configured destination of this key")

        async def store(conn: asyncpg.Connection, signed: list[SignedTx]) -> None:
            await txstore.insert_slots(conn, self.chain_id, self.address, [NewSlot(signed[0], "call", to=to, data=data)])
            await txstore.set_next_nonce(conn, self.chain_id, self.address, signed[0].nonce + 1)

        (tx,) = await self._sign_new([(to, data, gas_limit)], store)
        nonce = tx.nonce
        self._m.next_nonce.labels(self._label).set(nonce + 1)
        self._adopt([Slot(nonce=nonce, kind="call", versions=[version_of(tx, 0, "call")], to=to.lower(), data=data)])
        return nonce

    async def confirmed(self, nonce: int) -> str:
        """The hash of the call's confirmed transaction; CallFailed when it reverted or its
        nonce was lost."""
        slot = self.slots.get(nonce)
        if slot is not None and slot.state == "confirmed" and slot.receipt_status == 1 and slot.mined_hash:
            return slot.mined_hash
        if nonce in self._outcomes:
            return self._settle(self._outcomes.pop(nonce))
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(nonce, []).append(future)
        return await future

    @staticmethod
    def _settle(outcome: str | CallFailed) -> str:
        if isinstance(outcome, CallFailed):
            raise outcome
        return outcome

    def held_call(self, to: str, prefix: bytes) -> int | None:
        """The nonce of a call to `to` whose calldata starts with `prefix` that may still land
        (pending or mined, not reverted): after a restart, the call sent before the crash is
        still ours to follow, not one to send a second time."""
        for slot in self.slots.values():
            if (
                slot.kind == "call"
                and slot.to == to.lower()
                and slot.data is not None
                and slot.data.startswith(prefix)
                and slot.receipt_status != 0
            ):
                return slot.nonce
        return None

    def _resolve(self, nonce: int, outcome: str | CallFailed) -> None:
        waiters = [f for f in self._waiters.pop(nonce, []) if not f.done()]
        if not waiters:
            self._outcomes[nonce] = outcome  # kept until asked for (`confirmed` pops it)
        for future in waiters:
            if isinstance(outcome, CallFailed):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    def _tracked(self, confirmed: list[Slot], reorged: list[Slot]) -> None:
        for slot in confirmed:
            if slot.kind == "call" and slot.receipt_status == 1 and slot.mined_hash:
                self._resolve(slot.nonce, slot.mined_hash)
        for slot in reorged:
            self._outcomes.pop(slot.nonce, None)  # not final: a waiter arriving now waits again

    async def _handle_reverted(self, slots: Sequence[Slot]) -> None:
        for slot in slots:
            slot.reverted_handled = True
            self._resolve(slot.nonce, CallFailed(f"the transaction at nonce {slot.nonce} reverted"))

    async def _record_lost(self, conn: asyncpg.Connection, slots: Sequence[Slot]) -> None:
        for slot in slots:
            self._resolve(slot.nonce, CallFailed(f"nonce {slot.nonce} was taken by another transaction"))
