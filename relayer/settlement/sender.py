"""The send loop of one chain: queued verdicts in, confirmed `completeVerification` out.

Four cooperating loops share the in-memory slots (one per nonce we hold; the database is
the truth, memory a cache rebuilt at start-up):

- **dispatch**: takes queued verdicts in batches, reads on chain whether each attempt is
  judged already and simulates the call (a refusal is recorded with its decoded error and
  costs no nonce), then in ONE database transaction locks the nonce counter, signs the
  batch with consecutive nonces, stores the raw transactions and advances the counter;
  only after the commit are they broadcast, many in flight (pipelined nonces);
- **heads**: follows `newHeads` over WebSocket (polling without one) and notices reorgs by
  block number and parent hash;
- **track**: on each new head, our account's mined count says which nonces were consumed;
  their receipts (one batched round trip) say by which version; mined transactions
  become confirmed at the configured depth; after a reorg (and periodically) the receipts
  of recently mined ones are read again, and a transaction no longer on chain goes back
  to pending and is sent again;
- **maintain**: resends what was never broadcast by this process (restart, reorg),
  replaces stuck transactions with a fee bump, cancels with a 0-value filler a verdict
  whose attempt someone else judged meanwhile, and reconciles nonces when the node says
  "nonce too low/high". Before every resend, an on-chain read of `isJudged`.

Nothing is broadcast unless the gate is open: the health monitor closes it when the
escrow does not trust our key (fail closed).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg
import structlog

from chain.eth_rpc import (
    EthRpc,
    Head,
    RetryableRpcError,
    Reverted,
    RpcCallError,
    RpcError,
    classify_send_error,
    new_heads,
    sleep_backoff,
)
from chain.fees import FeePolicy, Fees, bump, includable, price
from chain.keys import SecretKey
from chain.nonces import reconcile
from chain.txs import (
    FILLER_GAS,
    DecodedError,
    SignedTx,
    complete_verification_batch_data,
    complete_verification_data,
    decode_batch_refusals,
    decode_revert,
    is_judged_data,
    marketplace_verifier_data,
    settled_attempts,
    sign_eip1559,
    signed_call,
)
from relayer.settlement import metrics, store
from relayer.settlement.config import ChainSettings
from relayer.settlement.crash import CrashPoints
from relayer.settlement.store import MinedUpdate, TxVersion, VerdictRow
from runtime.aio import wait_event

log = structlog.get_logger(__name__)

RECEIPT_BATCH = 500
BROADCAST_CHUNK = 16  # raw transactions per JSON-RPC batch request
PRIORITY_FEE_TTL = 2.0  # seconds a suggested tip is reused


# ---------------------------------------------------------------------------- pure decisions


def revert_outcome(error: DecodedError) -> str:
    """What a refused verdict means: already_judged, key_refused (may pass later) or reverted."""
    if error.name == "AlreadyJudged":
        return "already_judged"
    if error.name == "NotVerifier":
        return "key_refused"
    return "reverted"


# ---------------------------------------------------------------------------- state


class SendGate:
    """Open while the escrow trusts our key. Starts closed: nothing goes out unchecked."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self.reason: str | None = "waiting for the first health check"
        self._closures = 0

    @property
    def closures(self) -> int:
        """How many times the gate was closed: a health check that started before the last
        closure read the chain too early to reopen it."""
        return self._closures

    @property
    def is_open(self) -> bool:
        """True while sending is allowed."""
        return self._open.is_set()

    def open(self) -> None:
        """Allow sending."""
        self.reason = None
        self._open.set()

    def close(self, reason: str) -> None:
        """Stop sending, saying why."""
        self.reason = reason
        self._closures += 1
        self._open.clear()

    async def wait_open(self) -> None:
        """Return once sending is allowed."""
        await self._open.wait()


@dataclass
class Slot:
    """One nonce we hold, in memory."""

    nonce: int
    kind: str
    verdict: VerdictRow | None
    versions: list[TxVersion]
    state: str = "pending"
    last_broadcast: float | None = None  # monotonic; None: not sent by this process yet
    resend_reason: str = "restart"
    needs_bump: bool = False
    in_flight: bool = False
    misses: int = 0
    mined_hash: str | None = None
    block_number: int | None = None
    block_hash: str | None = None
    receipt_status: int | None = None
    reverted_handled: bool = False
    items: list[VerdictRow] = field(default_factory=list)  # a batch slot's verdicts, in calldata order
    settled: set[int] | None = None  # a mined batch: ids of the items its logs show settled

    @property
    def latest(self) -> TxVersion:
        """The newest signed version."""
        return self.versions[-1]


@dataclass(frozen=True)
class SenderOptions:
    """Tuning of one chain's sender (from the settings)."""

    policy: FeePolicy
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
    settle_batch: int = 50  # verdicts per completeVerificationBatch transaction (0 or 1: one per tx)
    settle_batch_min: int = 2  # pack only rounds with at least this many verdicts ready
    batch_gas_per_item: int = 60_000
    batch_gas_base: int = 360_000  # the escrow's BATCH_ITEM_GAS (313k) for the last item, the intrinsic gas


def _version(tx: SignedTx, version: int, kind: str) -> TxVersion:
    return TxVersion(
        tx_hash=tx.tx_hash, raw_hex=tx.raw_hex, fees=tx.fees, gas_limit=tx.gas_limit, version=version, kind=kind
    )


class ChainSender:
    """Sends one chain's verdicts from one key."""

    def __init__(
        self,
        *,
        chain: ChainSettings,
        key: SecretKey,
        rpc: EthRpc,
        pool: asyncpg.Pool,
        gate: SendGate,
        options: SenderOptions,
        crash: CrashPoints | None = None,
        on_key_refused: Callable[[], None] | None = None,
    ) -> None:
        self.chain = chain
        self.chain_id = chain.chain_id
        self.address = key.address
        self._key = key
        self._rpc = rpc
        self._pool = pool
        self.gate = gate
        self._opt = options
        self._crash = crash or CrashPoints(None)
        self._on_key_refused = on_key_refused or (lambda: None)
        self._label = str(chain.chain_id)
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
        self._refusals: dict[int, tuple[int, VerdictRow]] = {}  # verdict id -> (nonce, item) to record
        self.last_error: str | None = None
        self.started = asyncio.Event()
        self._tracking = False

    # ------------------------------------------------------------------ public

    def wake(self) -> None:
        """New queued verdicts: look now rather than at the next idle tick."""
        self._wake.set()

    async def run(self) -> None:
        """Start (reconcile with the chain) and run the loops until cancelled."""
        try:
            await self._start()
            self.started.set()
            async with asyncio.TaskGroup() as group:
                group.create_task(self._guard("heads", self._watch_heads))
                group.create_task(self._guard("track", self._track_loop))
                group.create_task(self._guard("dispatch", self._dispatch_loop))
                group.create_task(self._guard("maintain", self._maintain_loop))
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
        lock_id = store.advisory_lock_key(self.chain_id, self.address)
        if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", lock_id):
            log.warning("sender_standby", chain_id=self.chain_id, reason="another relayer holds this key")
            await conn.execute("SELECT pg_advisory_lock($1)", lock_id)
        head = await self._rpc.head()
        self._on_head(head)
        async with self._pool.acquire() as db:
            rows = await store.open_slots(db, self.chain_id, self.address, head.number - self._opt.watch_blocks)
        for row in rows:
            if not row.versions:
                continue
            self.slots[row.nonce] = Slot(
                nonce=row.nonce,
                kind=row.kind,
                verdict=row.verdict,
                versions=row.versions,
                state=row.state,
                mined_hash=row.mined_hash,
                block_number=row.block_number,
                block_hash=row.block_hash,
                receipt_status=row.receipt_status,
                reverted_handled=row.receipt_status == 0,
                items=row.items,
            )
        await self._reconcile("startup")
        log.info(
            "sender_started",
            chain_id=self.chain_id,
            address=self.address,
            head=head.number,
            open_slots=len(self.slots),
        )

    async def _reconcile(self, trigger: str) -> None:
        metrics.NONCE_RECONCILIATIONS.labels(self._label, trigger).inc()
        latest, pending = await self._rpc.batch(
            [
                ("eth_getTransactionCount", [self.address, "latest"]),
                ("eth_getTransactionCount", [self.address, "pending"]),
            ]
        )
        for value in (latest, pending):
            if isinstance(value, Exception):
                raise value
        chain_latest, chain_pending = int(latest, 16), int(pending, 16)
        async with self._pool.acquire() as conn:
            local = await store.next_nonce(conn, self.chain_id, self.address)
        held = [n for n, s in self.slots.items() if s.state == "pending"]
        plan = reconcile(local, chain_latest, chain_pending, held)
        self._note_chain_count(chain_latest)
        if plan.check_mined:
            # Held nonces below the chain's count: the track loop reads their receipts. It
            # is the only caller of `_track`: two rounds at once would both count a missing
            # receipt (a nonce called lost after one look) and both handle the same slots.
            self._head_event.set()
        for nonce in plan.rebroadcast:
            slot = self.slots[nonce]
            if not slot.in_flight:
                slot.last_broadcast = None
        async with self._pool.acquire() as conn:
            await store.set_next_nonce(conn, self.chain_id, self.address, plan.next_nonce)
        if plan.fill:
            await self._fill(plan.fill, plan.next_nonce)
        metrics.NEXT_NONCE.labels(self._label).set(plan.next_nonce)
        (log.warning if plan.drifted else log.info)(
            "nonces_reconciled",
            chain_id=self.chain_id,
            trigger=trigger,
            local_next=local,
            chain_latest=chain_latest,
            chain_pending=chain_pending,
            next_nonce=plan.next_nonce,
            rebroadcast=len(plan.rebroadcast),
            filled=list(plan.fill),
            foreign_pending=plan.foreign_pending,
        )

    async def _fill(self, nonces: Sequence[int], next_nonce: int) -> None:
        fees = await self._fees_now()
        signed = [
            sign_eip1559(
                self._key,
                chain_id=self.chain_id,
                nonce=n,
                to=self.address,
                data=b"",
                gas_limit=FILLER_GAS,
                fees=fees,
            )
            for n in nonces
        ]
        async with self._pool.acquire() as conn, conn.transaction():
            await store.record_new_slots(
                conn, self.chain_id, self.address, [(tx, None, "filler") for tx in signed], next_nonce
            )
        for tx in signed:
            # Broadcast by the maintain loop, behind the send gate like everything else.
            slot = Slot(nonce=tx.nonce, kind="filler", verdict=None, versions=[_version(tx, 0, "filler")])
            slot.resend_reason = "new"
            self.slots[tx.nonce] = slot
        metrics.GAPS_FILLED.labels(self._label).inc(len(signed))

    # ------------------------------------------------------------------ helpers

    async def _guard(self, name: str, loop: Callable[[], Any]) -> None:
        # A loop survives transient faults; anything else ends the sender (and the process).
        failures = 0
        while True:
            try:
                await loop()
                return
            except (RpcError, OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError) as exc:
                failures += 1
                self.last_error = f"{name}: {type(exc).__name__}: {exc}"
                log.warning("sender_loop_retry", chain_id=self.chain_id, loop=name, error=self.last_error)
                await sleep_backoff(failures)

    @staticmethod
    async def _wait(event: asyncio.Event, seconds: float) -> None:
        # Not `asyncio.wait_for`: on 3.11 it can drop a cancellation (see runtime/aio.py).
        await wait_event(event, seconds)
        event.clear()

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
        metrics.PENDING_TX.labels(self._label).set(len(self._pending()))

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
        metrics.HEAD_BLOCK.labels(self._label).set(head.number)
        self._head_event.set()

    async def _watch_heads(self) -> None:
        if self.chain.ws_url is None:
            while True:
                self._on_head(await self._rpc.head())
                await asyncio.sleep(self.chain.poll_interval)
        failures = 0
        while True:
            try:
                async for head in new_heads(self.chain.ws_url):
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

    # ------------------------------------------------------------------ dispatch

    async def _dispatch_loop(self) -> None:
        while True:
            await self._wait(self._wake, 1.0)
            await self.gate.wait_open()
            # Verdicts arrive in many small consumer commits, each with its notification:
            # a short pause lets them pile up into one round (one preflight round trip, one
            # database transaction) instead of one round per commit.
            await asyncio.sleep(self._opt.dispatch_coalesce)
            while self.gate.is_open:
                capacity = self._opt.max_in_flight - len(self._pending())
                if capacity <= 0:
                    break
                if await self._dispatch_once(min(self._opt.batch_size, capacity)) == 0:
                    break

    async def _dispatch_once(self, limit: int) -> int:
        async with self._pool.acquire() as conn:
            rows = await store.queued_verdicts(conn, self.chain_id, limit)
        # A verdict whose transaction reverted may be queued again (key rotated): its old,
        # reverted slot does not make it live, exactly as in the database's unique index.
        live = {
            s.verdict.id
            for s in self.slots.values()
            if s.verdict is not None and s.kind == "verdict" and s.receipt_status != 0
        } | {v.id for s in self.slots.values() if s.kind == "batch" and s.receipt_status != 0 for v in s.items}
        rows = [r for r in rows if r.id not in live]
        if not rows:
            return 0
        # One JSON-RPC batch: with the simulation on, it alone answers (an attempt judged
        # already reverts with AlreadyJudged); without it, `isJudged` of each attempt.
        if self._opt.simulate:
            calls = [
                (
                    "eth_call",
                    [
                        {
                            "from": self.address,
                            "to": row.escrow,
                            "gas": hex(self._opt.gas_limit),
                            "data": "0x" + self._calldata(row).hex(),
                        },
                        "latest",
                    ],
                )
                for row in rows
            ]
        else:
            calls = [
                ("eth_call", [{"to": row.escrow, "data": "0x" + is_judged_data(row.task_id, row.attempt).hex()}, "latest"])
                for row in rows
            ]
        results = await self._rpc.batch(calls)
        ready: list[VerdictRow] = []
        outcomes: list[tuple[VerdictRow, str, DecodedError | None]] = []
        key_refused = False
        for row, result in zip(rows, results, strict=True):
            if isinstance(result, Reverted) and self._opt.simulate:
                error = decode_revert(result.revert_data)
                kind = revert_outcome(error)
                if kind == "key_refused":
                    key_refused = True
                else:
                    outcomes.append((row, kind, error))
            elif isinstance(result, Exception):
                continue  # transient: stays queued for the next round
            elif not self._opt.simulate and int(str(result), 16) != 0:
                outcomes.append((row, "already_judged", None))
            else:
                ready.append(row)
        if outcomes:
            await self._record_outcomes(outcomes, stage="preflight")
        if key_refused:
            self.gate.close("the escrow refused our key (NotVerifier)")
            self._on_key_refused()
            return len(outcomes)
        signed = await self._sign_and_send(ready) if ready else 0
        return len(outcomes) + signed

    def _calldata(self, row: VerdictRow) -> bytes:
        return complete_verification_data(row.task_id, row.attempt, row.evidence_hash, row.passed, row.score)

    async def _record_outcomes(
        self, outcomes: Sequence[tuple[VerdictRow, str, DecodedError | None]], *, stage: str
    ) -> None:
        async with self._pool.acquire() as conn, conn.transaction():
            for row, kind, error in outcomes:
                await store.set_verdict_outcome(
                    conn,
                    row.id,
                    kind,
                    error=error.name if error else None,
                    error_args=error.args if error else None,
                )
        for row, kind, error in outcomes:
            if kind == "already_judged":
                metrics.ALREADY_JUDGED.labels(self._label).inc()
            else:
                metrics.TX_REVERTED.labels(self._label, error.name if error else "unknown").inc()
            log.info(
                "verdict_not_sent" if stage == "preflight" else "verdict_refused_on_chain",
                chain_id=self.chain_id,
                task_id=row.task_id,
                attempt=row.attempt,
                outcome=kind,
                error=str(error) if error else None,
            )

    def _groups(self, rows: Sequence[VerdictRow]) -> list[list[VerdictRow]]:
        """One transaction per group: packed into batches when enabled and the round is deep
        enough, and only verdicts of one escrow together."""
        size = self._opt.settle_batch
        if size <= 1 or len(rows) < self._opt.settle_batch_min:
            return [[row] for row in rows]
        by_escrow: dict[str, list[VerdictRow]] = {}
        for row in rows:
            by_escrow.setdefault(row.escrow.lower(), []).append(row)
        groups = []
        for same in by_escrow.values():
            groups += [same[i : i + size] for i in range(0, len(same), size)]
        return groups

    def _batch_call(self, items: Sequence[VerdictRow]) -> tuple[str, bytes, int]:
        data = complete_verification_batch_data(
            [(v.task_id, v.attempt, v.evidence_hash, v.passed, v.score) for v in items]
        )
        return items[0].escrow, data, self._opt.batch_gas_base + self._opt.batch_gas_per_item * len(items)

    async def _simulate_batches(self, groups: list[list[VerdictRow]]) -> list[list[VerdictRow]]:
        """Each batch exactly as it would be signed (calldata and gas limit), simulated in one
        JSON-RPC batch before any nonce is spent on it. An item the batch would refuse leaves
        it and stays queued (`GasTooLow`: the items before it used the gas; anything else: the
        next round's own simulation records it); a batch that would revert as a whole goes out
        as single sends, each of which passed its own simulation."""
        batches = [g for g in groups if len(g) > 1]
        if not batches:
            return groups
        calls = []
        for group in batches:
            to, data, gas = self._batch_call(group)
            call = {"from": self.address, "to": to, "gas": hex(gas), "data": "0x" + data.hex()}
            calls.append(("eth_call", [call, "latest"]))
        replies = dict(zip(map(id, batches), await self._rpc.batch(calls), strict=True))
        out: list[list[VerdictRow]] = []
        left = 0
        for group in groups:
            if len(group) == 1:
                out.append(group)
                continue
            reply = replies[id(group)]
            if isinstance(reply, Reverted):
                log.warning("batch_would_revert", chain_id=self.chain_id, items=len(group), error=str(decode_revert(reply.revert_data)))
                out += [[row] for row in group]
                continue
            refusals: list[DecodedError | None] | None = None
            if not isinstance(reply, Exception):
                with contextlib.suppress(ValueError, TypeError, OverflowError):  # a node's reply: hostile
                    refusals = decode_batch_refusals(bytes.fromhex(str(reply).removeprefix("0x")))
            if refusals is None or len(refusals) != len(group):
                left += len(group)  # transient or malformed: nothing packed blind, next round
                continue
            keep = [row for row, why in zip(group, refusals, strict=True) if why is None]
            left += len(group) - len(keep)
            if keep:
                out.append(keep)
        if left:
            # Still queued: the dispatch loop goes round again at once if this round made
            # progress, else at its next wake-up (no tight loop on a failing node).
            log.info("batch_items_left_queued", chain_id=self.chain_id, count=left)
        return out

    async def _sign_and_send(self, rows: Sequence[VerdictRow]) -> int:
        """Sign and store the rows' transactions in one database transaction, then broadcast;
        the number of verdicts signed (a batch's simulation may leave some queued)."""
        groups = await self._simulate_batches(self._groups(rows))
        if not groups:
            return 0
        fees = await self._fees_now()
        self._crash.maybe_crash("before_sign")
        async with self._pool.acquire() as conn, conn.transaction():
            first = await store.lock_next_nonce(conn, self.chain_id, self.address, floor=self._chain_latest)
            signed: list[tuple[SignedTx, list[VerdictRow]]] = []
            for i, group in enumerate(groups):
                if len(group) == 1:
                    to, data, gas = group[0].escrow, self._calldata(group[0]), self._opt.gas_limit
                else:
                    to, data, gas = self._batch_call(group)
                tx = sign_eip1559(
                    self._key, chain_id=self.chain_id, nonce=first + i, to=to, data=data, gas_limit=gas, fees=fees
                )
                signed.append((tx, group))
            self._crash.maybe_crash("after_sign")
            await store.record_new_slots(
                conn,
                self.chain_id,
                self.address,
                [(tx, g[0].id if len(g) == 1 else None, "verdict" if len(g) == 1 else "batch") for tx, g in signed],
                first + len(signed),
                batch_items=[(tx.nonce, [v.id for v in g]) for tx, g in signed if len(g) > 1],
            )
        self._crash.maybe_crash("after_persist")
        metrics.NEXT_NONCE.labels(self._label).set(first + len(signed))
        slots = []
        now = time.monotonic()
        for tx, group in signed:
            kind = "verdict" if len(group) == 1 else "batch"
            slot = Slot(
                nonce=tx.nonce,
                kind=kind,
                verdict=group[0] if kind == "verdict" else None,
                versions=[_version(tx, 0, kind)],
                items=list(group) if kind == "batch" else [],
            )
            slot.last_broadcast = now
            slot.in_flight = True
            self.slots[tx.nonce] = slot
            slots.append(slot)
        self._update_gauges()
        self._spawn_broadcast(slots, "new")
        return sum(len(group) for _, group in signed)

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
                try:
                    replies = await self._rpc.batch([("eth_sendRawTransaction", [v.raw_hex]) for v in versions])
                except RpcError:
                    replies = [RetryableRpcError("broadcast batch failed")] * len(part)
                sent = []
                for slot, version, reply in zip(part, versions, replies, strict=True):
                    if isinstance(reply, RpcCallError):
                        outcome = classify_send_error(reply.message)
                    elif isinstance(reply, RpcError):
                        outcome = "transient"
                    else:
                        outcome = "ok"
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
        self._crash.maybe_crash("after_broadcast")
        hashes = sent
        if hashes:
            with contextlib.suppress(asyncpg.PostgresError, OSError):
                async with self._pool.acquire() as conn:
                    await store.mark_broadcast(conn, hashes)

    def _after_send(self, slot: Slot, version: TxVersion, outcome: str, reason: str) -> None:
        now = time.monotonic()
        kind = slot.kind
        if outcome in ("ok", "known"):
            slot.last_broadcast = now
            slot.needs_bump = False
            if reason == "new":
                metrics.TX_SENT.labels(self._label, kind).inc()
            elif reason == "replace":
                metrics.TX_REPLACED.labels(self._label).inc()
            else:
                metrics.TX_RESENT.labels(self._label, reason).inc()
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
        found: dict[str, dict[str, Any]] = {}
        for start in range(0, len(hashes), RECEIPT_BATCH):
            chunk = hashes[start : start + RECEIPT_BATCH]
            replies = await self._rpc.batch([("eth_getTransactionReceipt", [h]) for h in chunk])
            for tx_hash, reply in zip(chunk, replies, strict=True):
                if isinstance(reply, Exception):
                    raise reply
                if reply is not None:
                    found[tx_hash] = reply
        return found

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
        updates: list[MinedUpdate] = []
        newly_mined: list[Slot] = []
        lost: list[Slot] = []
        reorged: list[Slot] = []
        for slot in below:
            receipt = next((receipts[v.tx_hash] for v in reversed(slot.versions) if v.tx_hash in receipts), None)
            if receipt is None:
                # Counted twice before calling it lost: the count and the receipts were
                # read a moment apart and a reorg may sit between them.
                slot.misses += 1
                if slot.misses >= 2:
                    lost.append(slot)
                continue
            self._set_mined(slot, receipt)
            newly_mined.append(slot)
        for slot in recheck:
            receipt = receipts.get(slot.mined_hash or "")
            if receipt is None:
                reorged.append(slot)
            elif receipt["blockHash"] != slot.block_hash:
                self._set_mined(slot, receipt)  # re-included in another block: count depth again
                newly_mined.append(slot)
            elif slot.kind == "batch" and slot.settled is None:
                self._set_settled(slot, receipt)  # loaded at start-up: read which items settled
        current = self.head or head
        confirmed = [
            s
            for s in self.slots.values()
            if s.state == "mined"
            and s.block_number is not None
            and current.number - s.block_number + 1 >= self.chain.depth
            and (s.kind != "batch" or s.settled is not None)
        ]
        if newly_mined:
            self._crash.maybe_crash("after_mined")
        reverted = [
            s for s in newly_mined if s.receipt_status == 0 and s.kind in ("verdict", "batch") and not s.reverted_handled
        ]
        for slot in confirmed:
            slot.state = "confirmed"
        for slot in reorged:
            for item in slot.items:  # refused by the block that is gone: decided again
                self._refusals.pop(item.id, None)
            slot.state = "pending"
            slot.mined_hash = slot.block_hash = None
            slot.block_number = slot.receipt_status = None
            slot.last_broadcast = None
            slot.resend_reason = "reorg"
            slot.reverted_handled = False
            slot.settled = None
        updates = [
            MinedUpdate(s.nonce, s.state, s.mined_hash, s.block_number, s.block_hash, s.receipt_status)
            for s in {id(s): s for s in [*newly_mined, *confirmed, *reorged]}.values()
        ]
        confirmations = [
            (s.verdict.id, s.mined_hash or "", s.block_number or 0, s.block_hash or "")
            for s in confirmed
            if s.verdict is not None and s.kind == "verdict" and s.receipt_status == 1
        ] + [
            (v.id, s.mined_hash or "", s.block_number or 0, s.block_hash or "")
            for s in confirmed
            if s.kind == "batch" and s.receipt_status == 1
            for v in s.items
            if v.id in (s.settled or set())
        ]
        async with self._pool.acquire() as conn, conn.transaction():
            await store.update_slots(conn, self.chain_id, self.address, updates)
            if confirmations:
                await store.confirm_verdicts(conn, confirmations)
            reorged_verdicts = [s.verdict.id for s in reorged if s.verdict is not None and s.kind == "verdict"] + [
                v.id for s in reorged if s.kind == "batch" for v in s.items
            ]
            if reorged_verdicts:
                await store.reorged_verdicts(conn, reorged_verdicts)
        now = datetime.now(UTC)
        for slot in confirmed:
            if slot.verdict is not None and slot.kind == "verdict" and slot.receipt_status == 1:
                metrics.TX_CONFIRMED.labels(self._label).inc()
                metrics.CONFIRMATION_SECONDS.labels(self._label).observe(
                    max(0.0, (now - slot.verdict.received_at).total_seconds())
                )
            elif slot.kind == "batch" and slot.receipt_status == 1:
                for item in slot.items:
                    if item.id in (slot.settled or set()):
                        metrics.TX_CONFIRMED.labels(self._label).inc()
                        metrics.CONFIRMATION_SECONDS.labels(self._label).observe(
                            max(0.0, (now - item.received_at).total_seconds())
                        )
        if reorged:
            metrics.REORGS.labels(self._label).inc()
            log.warning(
                "reorg_dropped_transactions",
                chain_id=self.chain_id,
                nonces=[s.nonce for s in reorged],
                tasks=[s.verdict.task_id for s in reorged if s.verdict is not None],
            )
        if reverted:
            await self._handle_reverted(reverted)
        if lost:
            await self._handle_lost(lost)
        if self._refusals:
            await self._handle_refused_items()
        self._prune(current)
        self._update_gauges()

    def _set_mined(self, slot: Slot, receipt: dict[str, Any]) -> None:
        slot.state = "mined"
        slot.misses = 0
        slot.mined_hash = str(receipt["transactionHash"])
        slot.block_number = int(receipt["blockNumber"], 16)
        slot.block_hash = str(receipt["blockHash"])
        slot.receipt_status = int(receipt["status"], 16)
        # The mined version tells what the slot became: a filler cancels its verdict.
        mined = next((v for v in slot.versions if v.tx_hash == slot.mined_hash), None)
        if mined is not None:
            slot.kind = mined.kind
        if slot.kind == "batch":
            self._set_settled(slot, receipt)

    def _set_settled(self, slot: Slot, receipt: dict[str, Any]) -> None:
        """Which items of a mined batch its logs show settled; the others are refusals to
        record (`_handle_refused_items`)."""
        if int(receipt["status"], 16) != 1:
            # A reverted batch settled nothing: each item is checked on its own, like the
            # items a mined batch refused (never all recorded `reverted` for the batch's fault).
            slot.settled = set()
            for item in slot.items:
                self._refusals[item.id] = (slot.nonce, item)
            return
        done = settled_attempts(list(receipt.get("logs") or []), slot.items[0].escrow, self.address) if slot.items else set()
        slot.settled = {v.id for v in slot.items if (v.task_id, v.attempt) in done}
        for item in slot.items:
            if item.id not in slot.settled:
                self._refusals[item.id] = (slot.nonce, item)

    def _prune(self, head: Head) -> None:
        horizon = head.number - self._opt.watch_blocks
        for nonce in [
            n
            for n, s in self.slots.items()
            if s.state == "confirmed" and s.block_number is not None and s.block_number < horizon
        ]:
            del self.slots[nonce]

    async def _handle_refused_items(self) -> None:
        """Items a mined batch did not settle: what the single call says about each now (one
        JSON-RPC batch of simulations), recorded like a refused single send. Only verdicts
        still `sent` are touched (a restart reads a batch's logs again).

        Only once the batch is confirmed: until then a reorg may put the batch back in the
        pool with its signed bytes, which still carry every item; an item queued again
        meanwhile would stand in two transactions."""
        pending = [
            (nonce, item)
            for nonce, item in self._refusals.values()
            if (slot := self.slots.get(nonce)) is None or slot.state == "confirmed"
        ]
        if not pending:
            return
        replies = await self._rpc.batch(
            [
                (
                    "eth_call",
                    [
                        {
                            "from": self.address,
                            "to": item.escrow,
                            "gas": hex(self._opt.gas_limit),
                            "data": "0x" + self._calldata(item).hex(),
                        },
                        "latest",
                    ],
                )
                for _, item in pending
            ]
        )
        outcomes: list[tuple[int, VerdictRow, str, DecodedError | None]] = []
        for (nonce, item), reply in zip(pending, replies, strict=True):
            if isinstance(reply, Reverted):
                refusal = decode_revert(reply.revert_data)
                outcomes.append((nonce, item, revert_outcome(refusal), refusal))
            elif isinstance(reply, Exception):
                continue  # transient: looked at again next round
            else:
                # It would settle now (e.g. the key matches again): send it again.
                outcomes.append((nonce, item, "requeue", None))
        if not outcomes:
            return
        async with self._pool.acquire() as conn, conn.transaction():
            for nonce, item, kind, why in outcomes:
                if kind in ("key_refused", "requeue"):
                    # Out of this slot (its items are what it may still settle), queued again.
                    await store.remove_batch_item(conn, self.chain_id, self.address, nonce, item.id)
                    await store.requeue_verdict(conn, item.id, "not settled by its batch; queued again", only_if_sent=True)
                else:
                    await store.set_verdict_outcome(
                        conn, item.id, kind, error=why.name if why else None,
                        error_args=why.args if why else None, only_if_sent=True,
                    )  # fmt: skip
        for nonce, item, kind, why in outcomes:
            self._refusals.pop(item.id, None)
            slot = self.slots.get(nonce)
            if kind in ("key_refused", "requeue") and slot is not None:
                slot.items = [v for v in slot.items if v.id != item.id]
            if kind == "already_judged":
                metrics.ALREADY_JUDGED.labels(self._label).inc()
            elif kind not in ("key_refused", "requeue"):
                metrics.TX_REVERTED.labels(self._label, why.name if why else "unknown").inc()
            log.info(
                "batch_item_refused",
                chain_id=self.chain_id,
                nonce=nonce,
                task_id=item.task_id,
                attempt=item.attempt,
                outcome=kind,
                error=str(why) if why else None,
            )
        if any(kind == "key_refused" for _, _, kind, _ in outcomes):
            self.gate.close("the escrow refused our key (NotVerifier)")
            self._on_key_refused()
        if any(kind in ("key_refused", "requeue") for _, _, kind, _ in outcomes):
            self._wake.set()

    async def _handle_reverted(self, slots: Sequence[Slot]) -> None:
        batches = [s for s in slots if s.kind == "batch"]
        for slot in batches:
            # A whole batch reverted: nothing settled, and the cause may be the batch's (its
            # gas) rather than any item's: `_set_settled` put every item among the refusals,
            # each checked alone and recorded or queued again (`_handle_refused_items`).
            slot.reverted_handled = True
            data = await self._rpc.revert_data(slot.mined_hash or "")
            error = decode_revert(data) if data is not None else DecodedError("Reverted")
            metrics.TX_REVERTED.labels(self._label, f"batch:{error.name}").inc()
            log.warning("batch_reverted", chain_id=self.chain_id, nonce=slot.nonce, items=len(slot.items), error=str(error))
        slots = [s for s in slots if s.kind != "batch"]
        outcomes: list[tuple[VerdictRow, str, DecodedError | None]] = []
        requeue: list[Slot] = []
        for slot in slots:
            slot.reverted_handled = True
            data = await self._rpc.revert_data(slot.mined_hash or "")
            error = decode_revert(data) if data is not None else DecodedError("Reverted")
            kind = revert_outcome(error)
            assert slot.verdict is not None
            if kind == "key_refused" and not await self._key_trusted(slot.verdict.escrow):
                requeue.append(slot)
                continue
            outcomes.append((slot.verdict, "reverted" if kind == "key_refused" else kind, error))
        if outcomes:
            await self._record_outcomes(outcomes, stage="mined")
        if requeue:
            async with self._pool.acquire() as conn, conn.transaction():
                for slot in requeue:
                    assert slot.verdict is not None
                    await store.requeue_verdict(conn, slot.verdict.id, "NotVerifier: key rotated; queued again")
            self.gate.close("the escrow refused our key (NotVerifier)")
            self._on_key_refused()
            log.warning("verdicts_requeued_key_refused", chain_id=self.chain_id, count=len(requeue))

    async def _key_trusted(self, escrow: str) -> bool:
        raw = await self._rpc.eth_call(escrow, marketplace_verifier_data())
        return "0x" + raw[-20:].hex() == self.address.lower()

    async def _handle_lost(self, slots: Sequence[Slot]) -> None:
        async with self._pool.acquire() as conn, conn.transaction():
            await store.update_slots(
                conn,
                self.chain_id,
                self.address,
                [MinedUpdate(s.nonce, "lost", None, None, None, None) for s in slots],
            )
            for slot in slots:
                if slot.verdict is not None and slot.kind == "verdict":
                    await store.requeue_verdict(conn, slot.verdict.id, "nonce used by another transaction")
                for item in slot.items if slot.kind == "batch" else []:
                    await store.requeue_verdict(conn, item.id, "nonce used by another transaction")
        for slot in slots:
            if self.slots.get(slot.nonce) is slot:
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
                await self._reconcile(trigger)
            if self.gate.is_open:
                await self._maintain()

    def _due(self, now: float) -> list[Slot]:
        stalled = now - self._last_progress >= self._opt.replace_after
        base_fee = self.head.base_fee if self.head else 0
        due = []
        for slot in self._pending():
            if slot.in_flight:
                continue
            if (
                slot.last_broadcast is None
                or slot.needs_bump
                or not includable(slot.latest.fees, base_fee)
                or (stalled and now - slot.last_broadcast >= self._opt.replace_after)
            ):
                due.append(slot)
        return sorted(due, key=lambda s: s.nonce)

    async def _maintain(self) -> None:
        due = self._due(time.monotonic())
        if not due:
            return
        verdict_slots = [s for s in due if s.kind == "verdict" and s.verdict is not None]
        judged: set[int] = set()
        if verdict_slots:
            replies = await self._rpc.batch(
                [
                    (
                        "eth_call",
                        [
                            {
                                "to": s.verdict.escrow,  # type: ignore[union-attr]
                                "data": "0x" + is_judged_data(s.verdict.task_id, s.verdict.attempt).hex(),  # type: ignore[union-attr]
                            },
                            "latest",
                        ],
                    )
                    for s in verdict_slots
                ]
            )
            for slot, reply in zip(verdict_slots, replies, strict=True):
                if isinstance(reply, Exception):
                    due.remove(slot)  # cannot tell: do not send blind
                elif int(str(reply), 16) != 0:
                    judged.add(slot.nonce)
        if judged:
            by_nonce = {s.nonce: s for s in verdict_slots}
            receipts = await self._receipts([v.tx_hash for n in judged for v in by_nonce[n].versions])
            # Judged by our own transaction, just mined: the tracker takes it from here.
            judged = {n for n in judged if not any(v.tx_hash in receipts for v in by_nonce[n].versions)}
        fees_now = await self._fees_now()
        head = self.head
        base_fee = head.base_fee if head else 0
        resend: list[Slot] = []
        for slot in due:
            if slot.state != "pending":
                continue
            if slot.nonce in judged:
                if not await self._cancel(slot, fees_now, base_fee):
                    # No room under the cap to outbid it: let the verdict tx itself use the
                    # nonce (it reverts with AlreadyJudged, recorded) rather than leave a gap.
                    resend.append(slot)
                continue
            if slot.last_broadcast is None and not slot.needs_bump and includable(slot.latest.fees, base_fee):
                resend.append(slot)
                continue
            new_fees = bump(slot.latest.fees, base_fee, fees_now.max_priority_fee_per_gas, self._opt.policy)
            if new_fees is None:
                metrics.FEE_CAP_REACHED.labels(self._label).inc()
                log.warning("fee_cap_reached", chain_id=self.chain_id, nonce=slot.nonce)
                slot.needs_bump = False
                resend.append(slot)
                continue
            await self._replace(slot, new_fees, kind=slot.kind)
        for reason in {s.resend_reason for s in resend}:
            group = [s for s in resend if s.resend_reason == reason]
            self._spawn_broadcast(group, reason)

    async def _replace(self, slot: Slot, fees: Fees, *, kind: str) -> None:
        verdict = slot.verdict
        if kind == "verdict" and verdict is not None:
            to, data, gas = verdict.escrow, self._calldata(verdict), self._opt.gas_limit
        elif kind == "batch":
            # The calldata first signed for this nonce, whatever left the slot since: one
            # nonce never stands for two different calls (both could be mined in turn after
            # a reorg, and anyone may broadcast an old version).
            first = next(v for v in slot.versions if v.kind == "batch")
            to, data = signed_call(bytes.fromhex(first.raw_hex.removeprefix("0x")))
            gas = slot.latest.gas_limit
        else:
            to, data, gas = self.address, b"", FILLER_GAS
        tx = sign_eip1559(
            self._key, chain_id=self.chain_id, nonce=slot.nonce, to=to, data=data, gas_limit=gas, fees=fees
        )
        version = slot.latest.version + 1
        async with self._pool.acquire() as conn, conn.transaction():
            await store.record_version(conn, self.chain_id, self.address, tx, version, kind)
            if kind == "filler" and slot.kind == "verdict":
                await store.convert_to_filler(conn, self.chain_id, self.address, slot.nonce)
                if verdict is not None:
                    await store.set_verdict_outcome(conn, verdict.id, "already_judged")
        slot.versions.append(_version(tx, version, kind))
        if kind == "filler" and slot.kind == "verdict":
            metrics.ALREADY_JUDGED.labels(self._label).inc()
            log.info(
                "verdict_cancelled_already_judged",
                chain_id=self.chain_id,
                nonce=slot.nonce,
                task_id=verdict.task_id if verdict else None,
            )
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
        # Someone else judged the attempt: a filler at the same nonce keeps the nonce
        # sequence whole; it must outbid our own pending verdict transaction.
        new_fees = bump(slot.latest.fees, base_fee, fees_now.max_priority_fee_per_gas, self._opt.policy)
        if new_fees is None:
            metrics.FEE_CAP_REACHED.labels(self._label).inc()
            log.warning("cancel_fee_cap_reached", chain_id=self.chain_id, nonce=slot.nonce)
            return False
        await self._replace(slot, new_fees, kind="filler")
        return True
