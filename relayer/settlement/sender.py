"""The verdict send loop of one chain: queued verdicts in, confirmed `completeVerification` out.

`ChainSender` is the chain toolkit's transaction sender (`chain.sender.TxSender`: nonce
row, fees and bumps under the cap, stuck replacement, receipts, confirmations, reorg
re-send, lost nonces, the fail-closed gate) with what is the relayer's own on top:

- **dispatch**: takes queued verdicts in batches and simulates the round exactly as it will
  be signed, in one JSON-RPC batch: each single send on its own, each packed
  `completeVerificationBatch` once as a whole (its reply names each item's refusal; a packed
  verdict costs no simulation of its own). A refusal is recorded with its decoded error and
  costs no nonce (an item a batch refused is first simulated alone: recorded if the single
  call refuses it too, else left queued; `GasTooLow` stays queued; a batch that would revert
  goes out as single sends that passed their own simulation). Then in ONE database
  transaction it locks the nonce counter, signs the round with consecutive nonces, stores
  the raw transactions and advances the counter; only after the commit are they broadcast,
  many in flight (pipelined nonces);
- **what a slot's outcome means for its verdicts**: confirmed → the verdicts confirmed; a
  reorg → back to `sent`; a lost nonce → queued again; a mined revert decoded and recorded
  (`AlreadyJudged` → `already_judged`; `NotVerifier` re-checked against the escrow's key);
  a mined batch's items its logs do not show settled, and every item of a reverted batch →
  looked at one by one once the batch is confirmed, recorded or queued again;
- **before every resend** an on-chain read of `isJudged`: an attempt someone else judged
  meanwhile is cancelled with a 0-value filler at the same nonce.
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

from chain.eth_rpc import EthRpc, Reverted, RpcError
from chain.keys import SecretKey
from chain.receipts import BadReply
from chain.sender import (
    BROADCAST_CHUNK,
    SenderOptions,
    SendGate,
    Slot,
    TxSender,
    classify_send_error,
)
from chain.signers import Signer
from chain.txs import (
    DecodedError,
    SignedTx,
    complete_verification_batch_data,
    complete_verification_data,
    decode_batch_refusals,
    decode_revert,
    is_judged_data,
    marketplace_verifier_data,
    settled_attempts,
)
from chain.txstore import version_of
from relayer.settlement import metrics, store
from relayer.settlement.config import ChainSettings
from relayer.settlement.crash import CrashPoints
from relayer.settlement.store import VerdictRow

log = structlog.get_logger(__name__)

__all__ = [
    "BROADCAST_CHUNK",
    "ChainSender",
    "SendGate",
    "SenderOptions",
    "VerdictSlot",
    "classify_send_error",
    "judged_answer",
    "revert_outcome",
]


def revert_outcome(error: DecodedError) -> str:
    """What a refused verdict means: already_judged, key_refused (may pass later) or reverted."""
    if error.name == "AlreadyJudged":
        return "already_judged"
    if error.name == "NotVerifier":
        return "key_refused"
    return "reverted"


def judged_answer(reply: object) -> bool | None:
    """An `isJudged` reply from a batch: whether the attempt is judged, or None when the reply
    tells nothing (an error, or not one 32-byte word: a node without the escrow's code yet
    answers "0x"). A node's reply is hostile: never an exception out of the send loops."""
    if not isinstance(reply, str) or len(reply) != 66 or not reply.startswith("0x"):
        return None
    try:
        return int(reply[2:], 16) != 0
    except ValueError:
        return None


@dataclass
class VerdictSlot(Slot):
    """A nonce holding a verdict, a batch of verdicts, or a filler."""

    verdict: VerdictRow | None = None
    items: list[VerdictRow] = field(default_factory=list)  # a batch slot's verdicts, in calldata order
    settled: set[int] | None = None  # a mined batch: ids of the items its logs show settled
    revert_unread_since: float | None = None  # monotonic time the first read of why it reverted failed


def _vs(slot: Slot) -> VerdictSlot:
    assert isinstance(slot, VerdictSlot)
    return slot


class ChainSender(TxSender):
    """Sends one chain's verdicts from the marketplace verifier key."""

    def __init__(
        self,
        *,
        chain: ChainSettings,
        key: Signer | SecretKey,
        rpc: EthRpc,
        pool: asyncpg.Pool,
        gate: SendGate,
        options: SenderOptions,
        crash: CrashPoints | None = None,
        on_key_refused: Callable[[], None] | None = None,
    ) -> None:
        self._crash = crash or CrashPoints(None)
        super().__init__(
            chain_id=chain.chain_id,
            key=key,
            rpc=rpc,
            pool=pool,
            gate=gate,
            options=options,
            metrics=metrics.SENDER,
            confirmations=chain.depth,
            ws_url=chain.ws_url,
            poll_interval=chain.poll_interval,
            crash=self._crash.maybe_crash,
        )
        self.chain = chain
        self._on_key_refused = on_key_refused or (lambda: None)
        self._refusals: dict[int, tuple[int, VerdictRow]] = {}  # verdict id -> (nonce, item) to record
        self._group_ready = False  # a wake-up that brought a whole group: no pause to gather more

    def queued(self, count: int) -> None:
        """`count` verdicts were just queued (committed) in this process: look now, and when
        they make a whole group (a packed batch, or a full round of single sends), without
        the pause that lets small commits pile up."""
        full = self._opt.settle_batch if self._opt.settle_batch > 1 else self._opt.batch_size
        if count >= full:
            self._group_ready = True
        self.wake()

    # ------------------------------------------------------------------ the core's hooks

    def _loops(self) -> list[tuple[str, Callable[[], Any]]]:
        return [("dispatch", self._dispatch_loop)]

    async def _load(self, conn: asyncpg.Connection, watch_from_block: int) -> list[Slot]:
        return [
            VerdictSlot(
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
            for row in await store.open_slots(conn, self.chain_id, self.address, watch_from_block)
            if row.versions
        ]

    async def _screen(self, due: list[Slot]) -> tuple[list[Slot], set[int]]:
        # Before every resend: is the attempt judged already? Then cancel rather than send.
        verdict_slots = [_vs(s) for s in due if s.kind == "verdict" and _vs(s).verdict is not None]
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
                answer = judged_answer(reply)
                if answer is None:
                    due.remove(slot)  # cannot tell: do not send blind
                elif answer:
                    judged.add(slot.nonce)
        if judged:
            # By the slots screened, not `self.slots`: the tracker may have dropped one meanwhile.
            by_nonce = {s.nonce: s for s in verdict_slots}
            receipts = await self._receipts([v.tx_hash for n in judged for v in by_nonce[n].versions])
            # Judged by our own transaction, just mined: the tracker takes it from here.
            judged = {n for n in judged if not any(v.tx_hash in receipts for v in by_nonce[n].versions)}
        return due, judged

    async def _record_replacement(self, conn: asyncpg.Connection, slot: Slot, kind: str) -> None:
        verdict = _vs(slot).verdict
        if kind == "filler" and slot.kind == "verdict" and verdict is not None:
            await store.set_verdict_outcome(conn, verdict.id, "already_judged")

    def _replaced(self, slot: Slot, kind: str) -> None:
        if kind == "filler" and slot.kind == "verdict":
            verdict = _vs(slot).verdict
            metrics.ALREADY_JUDGED.labels(self._label).inc()
            log.info(
                "verdict_cancelled_already_judged",
                chain_id=self.chain_id,
                nonce=slot.nonce,
                task_id=verdict.task_id if verdict else None,
            )

    def _on_mined(self, slot: Slot, receipt: dict[str, Any]) -> None:
        if slot.kind == "batch":
            self._set_settled(_vs(slot), receipt)

    def _on_recheck(self, slot: Slot, receipt: dict[str, Any]) -> None:
        if slot.kind == "batch" and _vs(slot).settled is None:
            self._set_settled(_vs(slot), receipt)  # loaded at start-up: read which items settled

    def _confirmable(self, slot: Slot) -> bool:
        return slot.kind != "batch" or _vs(slot).settled is not None

    def _on_reorged(self, slot: Slot) -> None:
        vs = _vs(slot)
        vs.settled = None
        for item in vs.items:  # refused by the block that is gone: decided again
            self._refusals.pop(item.id, None)

    def _confirmations(self, confirmed: list[Slot]) -> list[tuple[int, VerdictSlot, VerdictRow]]:
        out = []
        for slot in map(_vs, confirmed):
            if slot.receipt_status != 1:
                continue
            if slot.kind == "verdict" and slot.verdict is not None:
                out.append((slot.verdict.id, slot, slot.verdict))
            elif slot.kind == "batch":
                out += [(v.id, slot, v) for v in slot.items if v.id in (slot.settled or set())]
        return out

    async def _record_tracked(self, conn: asyncpg.Connection, confirmed: list[Slot], reorged: list[Slot]) -> None:
        confirmations = [
            (vid, s.mined_hash or "", s.block_number or 0, s.block_hash or "")
            for vid, s, _ in self._confirmations(confirmed)
        ]
        if confirmations:
            await store.confirm_verdicts(conn, confirmations)
        reorged_verdicts = [
            v.id
            for s in map(_vs, reorged)
            for v in ([s.verdict] if s.kind == "verdict" and s.verdict is not None else s.items if s.kind == "batch" else [])
        ]
        if reorged_verdicts:
            await store.reorged_verdicts(conn, reorged_verdicts)

    def _tracked(self, confirmed: list[Slot], reorged: list[Slot]) -> None:
        now = datetime.now(UTC)
        for _, _, verdict in self._confirmations(confirmed):
            metrics.TX_CONFIRMED.labels(self._label).inc()
            metrics.CONFIRMATION_SECONDS.labels(self._label).observe(max(0.0, (now - verdict.received_at).total_seconds()))
        if reorged:
            log.warning(
                "reorg_dropped_verdicts",
                chain_id=self.chain_id,
                nonces=[s.nonce for s in reorged],
                tasks=[v.task_id for s in map(_vs, reorged) for v in ([s.verdict] if s.verdict else s.items)],
            )

    async def _record_lost(self, conn: asyncpg.Connection, slots: Sequence[Slot]) -> None:
        for slot in map(_vs, slots):
            if slot.verdict is not None and slot.kind == "verdict":
                await store.requeue_verdict(conn, slot.verdict.id, "nonce used by another transaction")
            for item in slot.items if slot.kind == "batch" else []:
                await store.requeue_verdict(conn, item.id, "nonce used by another transaction")

    async def _after_track(self) -> None:
        if self._refusals:
            await self._handle_refused_items()

    # ------------------------------------------------------------------ dispatch

    async def _dispatch_loop(self) -> None:
        while True:
            await self._wait(self._wake, 1.0)
            await self.gate.wait_sendable()
            # Verdicts arrive in many small consumer commits, each with its notification:
            # a short pause lets them pile up into one round (one preflight round trip, one
            # database transaction) instead of one round per commit. Not when a commit of
            # this process brought a whole group: nothing is gained by waiting.
            if not self._group_ready:
                await asyncio.sleep(self._opt.dispatch_coalesce)
            self._group_ready = False
            while self.gate.is_open and self.gate.fee_hold is None:
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
        slots = [_vs(s) for s in self.slots.values()]
        live = {
            s.verdict.id for s in slots if s.verdict is not None and s.kind == "verdict" and s.receipt_status != 0
        } | {v.id for s in slots if s.kind == "batch" and s.receipt_status != 0 for v in s.items}
        rows = [r for r in rows if r.id not in live]
        outside = [r for r in rows if not self.allowed(r.escrow)]
        if outside:
            # Only after the configuration dropped an escrow (the consumer admits none other):
            # left queued, never signed, until it is configured again.
            log.warning("verdicts_for_unconfigured_escrow", chain_id=self.chain_id, count=len(outside),
                        escrows=sorted({r.escrow for r in outside}))
            rows = [r for r in rows if self.allowed(r.escrow)]
        if not rows:
            return 0
        if not self._opt.simulate:
            return await self._dispatch_unsimulated(rows)
        # One JSON-RPC batch simulates the round as it will be signed: each single send on
        # its own, each batch once as a whole (its reply says, per item, what the escrow
        # would refuse). A verdict packed in a batch costs no simulation of its own.
        groups = self._groups(rows)
        replies = await self._rpc.batch([self._simulation(*self._group_call(group)) for group in groups])
        ready: list[list[VerdictRow]] = []
        outcomes: list[tuple[VerdictRow, str, DecodedError | None]] = []
        # Looked at alone below: (verdict, whether it may go out alone if the single call
        # would settle it). Not one its batch refused behind another item (two verdicts of
        # one attempt): the next round's simulation decides it, as before packing.
        check: list[tuple[VerdictRow, bool]] = []
        left = 0
        key_refused = False
        for group, reply in zip(groups, replies, strict=True):
            if len(group) == 1:
                key_refused |= self._read_simulation(group[0], reply, ready, outcomes)
                continue
            kept, refused, skipped, whole = self._screen_batch(group, reply)
            left += skipped
            check += [(row, whole) for row in refused]
            if len(kept) > 1:
                ready.append(kept)
            elif kept:
                check.append((kept[0], True))  # what is left is a single send: simulated as one
        if check:
            # What a single call says about each (rare: a refusal costs a round trip, a
            # verdict a batch would settle costs none), recorded like any preflight refusal.
            singles = await self._rpc.batch([self._simulation(*self._group_call([row])) for row, _ in check])
            for (row, alone), reply in zip(check, singles, strict=True):
                key_refused |= self._read_simulation(row, reply, ready if alone else [], outcomes)
        if left:
            # Still queued: the dispatch loop goes round again at once if this round made
            # progress, else at its next wake-up (no tight loop on a failing node).
            log.info("batch_items_left_queued", chain_id=self.chain_id, count=left)
        if outcomes:
            await self._record_outcomes(outcomes, stage="preflight")
        if key_refused:
            self.gate.close("the escrow refused our key (NotVerifier)")
            self._on_key_refused()
            return len(outcomes)
        signed = await self._sign_and_send(ready) if ready else 0
        return len(outcomes) + signed

    async def _dispatch_unsimulated(self, rows: Sequence[VerdictRow]) -> int:
        """A round without simulation: `isJudged` of each attempt, then sent as grouped."""
        calls = [
            ("eth_call", [{"to": row.escrow, "data": "0x" + is_judged_data(row.task_id, row.attempt).hex()}, "latest"])
            for row in rows
        ]
        results = await self._rpc.batch(calls)
        ready: list[VerdictRow] = []
        outcomes: list[tuple[VerdictRow, str, DecodedError | None]] = []
        for row, result in zip(rows, results, strict=True):
            answer = judged_answer(result)
            if answer is None:
                continue  # transient or malformed: stays queued for the next round
            if answer:
                outcomes.append((row, "already_judged", None))
            else:
                ready.append(row)
        if outcomes:
            await self._record_outcomes(outcomes, stage="preflight")
        signed = await self._sign_and_send(self._groups(ready)) if ready else 0
        return len(outcomes) + signed

    @staticmethod
    def _read_simulation(
        row: VerdictRow,
        reply: object,
        ready: list[list[VerdictRow]],
        outcomes: list[tuple[VerdictRow, str, DecodedError | None]],
    ) -> bool:
        """File a single send's simulation: ready, a refusal to record, or (transient)
        nothing, the verdict stays queued. True when the escrow refused our key."""
        if isinstance(reply, Reverted):
            error = decode_revert(reply.revert_data)
            kind = revert_outcome(error)
            if kind == "key_refused":
                return True
            outcomes.append((row, kind, error))
        elif not isinstance(reply, Exception):
            ready.append([row])
        return False

    def _simulation(self, to: str, data: bytes, gas: int) -> tuple[str, list[Any]]:
        """The `eth_call` of a transaction exactly as it would be signed (sender, gas, calldata)."""
        return ("eth_call", [{"from": self.address, "to": to, "gas": hex(gas), "data": "0x" + data.hex()}, "latest"])

    def _screen_batch(
        self, group: list[VerdictRow], reply: object
    ) -> tuple[list[VerdictRow], list[VerdictRow], int, bool]:
        """A batch's simulation read: (items it would settle, items it refused for their own
        reason, how many stay queued untouched, whether the batch would revert as a whole).
        `GasTooLow`: the items before it used the gas, so it stays queued; a batch that would
        revert as a whole: each item is looked at alone (and sent alone if it passes); a
        transient or malformed reply: nothing packed blind, all stay queued."""
        if isinstance(reply, Reverted):
            log.warning("batch_would_revert", chain_id=self.chain_id, items=len(group), error=str(decode_revert(reply.revert_data)))
            return [], list(group), 0, True
        refusals: list[DecodedError | None] | None = None
        if not isinstance(reply, Exception):
            with contextlib.suppress(ValueError, TypeError, OverflowError):  # a node's reply: hostile
                refusals = decode_batch_refusals(bytes.fromhex(str(reply).removeprefix("0x")))
        if refusals is None or len(refusals) != len(group):
            return [], [], len(group), False
        kept = [row for row, why in zip(group, refusals, strict=True) if why is None]
        refused = [row for row, why in zip(group, refusals, strict=True) if why is not None and why.name != "GasTooLow"]
        return kept, refused, len(group) - len(kept) - len(refused), False

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

    def _group_call(self, items: Sequence[VerdictRow]) -> tuple[str, bytes, int]:
        """(to, calldata, gas limit) of one group's transaction: a single send, or a batch."""
        if len(items) == 1:
            return items[0].escrow, self._calldata(items[0]), self._opt.gas_limit
        data = complete_verification_batch_data(
            [(v.task_id, v.attempt, v.evidence_hash, v.passed, v.score) for v in items]
        )
        return items[0].escrow, data, self._opt.batch_gas_base + self._opt.batch_gas_per_item * len(items)

    async def _sign_and_send(self, groups: Sequence[list[VerdictRow]]) -> int:
        """Sign one transaction per group, store them in one database transaction, then
        broadcast; the number of verdicts signed."""
        self._crash.maybe_crash("before_sign")
        calls = [self._group_call(group) for group in groups]

        async def persist(conn: asyncpg.Connection, txs: list[SignedTx]) -> None:
            await store.record_new_slots(
                conn,
                self.chain_id,
                self.address,
                [(tx, g[0].id if len(g) == 1 else None, "verdict" if len(g) == 1 else "batch") for tx, g in zip(txs, groups, strict=True)],
                txs[0].nonce + len(txs),
                batch_items=[(tx.nonce, [v.id for v in g]) for tx, g in zip(txs, groups, strict=True) if len(g) > 1],
            )

        # Signed before the database transaction opens (a KMS or remote signer is slow).
        signed = list(zip(await self._sign_new(calls, persist), groups, strict=True))
        first = signed[0][0].nonce
        self._crash.maybe_crash("after_persist")
        metrics.NEXT_NONCE.labels(self._label).set(first + len(signed))
        slots: list[Slot] = []
        for tx, group in signed:
            kind = "verdict" if len(group) == 1 else "batch"
            slots.append(
                VerdictSlot(
                    nonce=tx.nonce,
                    kind=kind,
                    verdict=group[0] if kind == "verdict" else None,
                    versions=[version_of(tx, 0, kind)],
                    items=list(group) if kind == "batch" else [],
                )
            )
        self._adopt(slots)
        return sum(len(group) for _, group in signed)

    # ------------------------------------------------------------------ outcomes

    def _set_settled(self, slot: VerdictSlot, receipt: dict[str, Any]) -> None:
        """Which items of a mined batch its logs show settled; the others are refusals to
        record (`_handle_refused_items`)."""
        # The status as `_set_mined` read it from the checked receipt (one without `status` is
        # a success there): the raw reply may lack the field.
        if slot.receipt_status != 1:
            # A reverted batch settled nothing: each item is checked on its own, like the
            # items a mined batch refused (never all recorded `reverted` for the batch's fault).
            slot.settled = set()
            for item in slot.items:
                self._refusals[item.id] = (slot.nonce, item)
            return
        try:
            done = settled_attempts(list(receipt.get("logs") or []), slot.items[0].escrow, self.address) if slot.items else set()
        except (ValueError, TypeError, AttributeError):
            # A node's reply is hostile: logs that do not read are a malformed reply (the round
            # fails, the receipt is read again), never an exception that ends the track loop.
            raise BadReply("eth_getTransactionReceipt: logs that do not decode") from None
        slot.settled = {v.id for v in slot.items if (v.task_id, v.attempt) in done}
        for item in slot.items:
            if item.id not in slot.settled:
                self._refusals[item.id] = (slot.nonce, item)

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
        replies = await self._rpc.batch([self._simulation(*self._group_call([item])) for _, item in pending])
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
            if kind in ("key_refused", "requeue") and isinstance(slot, VerdictSlot):
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
        for slot in (_vs(s) for s in slots if s.kind == "batch"):
            # A whole batch reverted: nothing settled, and the cause may be the batch's (its
            # gas) rather than any item's: `_set_settled` put every item among the refusals,
            # each checked alone and recorded or queued again (`_handle_refused_items`).
            error = await self._revert_error(slot)
            slot.reverted_handled = True
            metrics.TX_REVERTED.labels(self._label, f"batch:{error.name}").inc()
            log.warning("batch_reverted", chain_id=self.chain_id, nonce=slot.nonce, items=len(slot.items), error=str(error))
        slots = [s for s in slots if s.kind != "batch"]
        outcomes: list[tuple[VerdictRow, str, DecodedError | None]] = []
        requeue: list[VerdictSlot] = []
        # Each slot is marked handled only once its outcome is stored: an RPC or database fault
        # on the way leaves them all to the next tracking round (recording again is idempotent).
        for slot in map(_vs, slots):
            error = await self._revert_error(slot)
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
        for done in slots:
            done.reverted_handled = True
        if requeue:
            self.gate.close("the escrow refused our key (NotVerifier)")
            self._on_key_refused()
            log.warning("verdicts_requeued_key_refused", chain_id=self.chain_id, count=len(requeue))

    async def _revert_error(self, slot: VerdictSlot) -> DecodedError:
        """Why the slot's transaction reverted, from the node's trace; a plain `Reverted` when the
        node cannot trace, or has failed to for `revert_reason_patience` seconds (a provider that
        refuses its debug namespace, a trace it garbles): the outcome is then recorded without
        its reason rather than waiting for it forever."""
        try:
            data = await self._rpc.revert_data(slot.mined_hash or "")
        except RpcError as exc:
            now = time.monotonic()
            if slot.revert_unread_since is None:
                slot.revert_unread_since = now
            if now - slot.revert_unread_since < self._opt.revert_reason_patience:
                raise
            log.warning("revert_reason_unavailable", chain_id=self.chain_id, nonce=slot.nonce,
                        seconds=round(now - slot.revert_unread_since, 1), error=str(exc)[:200])  # fmt: skip
            data = None
        return decode_revert(data) if data is not None else DecodedError("Reverted")

    async def _key_trusted(self, escrow: str) -> bool:
        raw = await self._rpc.eth_call(escrow, marketplace_verifier_data())
        return "0x" + raw[-20:].hex() == self.address.lower()
