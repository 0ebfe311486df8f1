"""Bridge health: is each chain reachable, is the indexer keeping up, and does the escrow
trust the key the relayer signs with (`chains[].verifier.verifierMatches`, seed 000)?

`BridgeHealthChecker` computes a report from the chain (head, balance, the escrow's
`marketplaceVerifier()`) and the database (indexer cursor, pending transactions); it
needs no key, only the relayer's address, so the API server can serve it too.
`HealthMonitor` runs it every poll interval inside the relayer and drives the send gates:
when the escrow trusts another address, or the check cannot be made, sending stops (fail
closed), the report says why, `escrowd_relayer_verifier_key_match` drops to 0 and the
mismatch counter fires; when the key matches again sending resumes by itself. After each
check it publishes the report (table `bridge_health`), and `PublishedHealth` serves that
report on the API server: one answer, the relayer's, which follows a key rotation without
any setting of the API's and turns failing when the relayer stops reporting.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Literal, Protocol

import asyncpg
import structlog
from eth_abi.exceptions import DecodingError
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from chain import txstore
from chain.abi import escrow_codec
from chain.eth_rpc import EthRpc, RpcError
from chain.rpc import quantity
from chain.txs import marketplace_verifier_data, selector
from relayer.settlement import metrics, store
from relayer.settlement.config import ChainSettings
from runtime.aio import wait_event
from schemas.verdict import checksum_address

log = structlog.get_logger(__name__)


def _address_word(reply: object) -> str | None:
    """The address a `marketplaceVerifier()` call returned, decoded by the escrow's codec
    (strict: padding checked), or None when the reply is an error or does not decode."""
    if not isinstance(reply, str) or not reply.startswith("0x"):
        return None
    try:
        (address,) = escrow_codec().decode_output("marketplaceVerifier", bytes.fromhex(reply[2:]))
    except (ValueError, DecodingError):
        return None
    return checksum_address(str(address))


MAX_REPORT_BYTES = 256 * 1024
"""A published chain report larger than this is unreadable (a relayer's is a few KiB)."""
MAX_STALE_AFTER_SECONDS = 600.0
"""No published report is fresh for longer than this, whatever its row's `stale_after_seconds`
says (the column only refuses values <= 0: `Infinity` passes it)."""
FUTURE_TOLERANCE_SECONDS = 5.0
"""A row stamped further than this ahead of the database's clock is not trusted as fresh."""


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)


class RpcHealth(_Model):
    """The chain's RPC as seen now."""

    reachable: bool
    head: int | None = None
    error: str | None = None


class IndexerHealth(_Model):
    """How far the indexer is behind the head, and whether it still moves."""

    cursor_block: int | None = None
    lag_blocks: int | None = None
    seconds_since_update: float | None = Field(default=None, description="Since the cursor last moved")
    live: bool | None = Field(default=None, description="false: behind the head and not moving; null: unknown")
    reason: str | None = None


class RelayerHealth(_Model):
    """The sending side."""

    address: str
    balance_wei: str | None = Field(default=None, description="Decimal string (exceeds 2^53)")
    runway_verdicts: int | None = Field(
        default=None, description="Verdict transactions the balance pays for at the current gas price (worst-case gas)"
    )
    pending_transactions: int = 0
    next_nonce: int | None = None
    sending: bool = False
    paused_reason: str | None = None


class EscrowVerifier(_Model):
    """One escrow's trusted marketplace verifier."""

    escrow: str
    marketplace_verifier: str | None = None
    verifier_matches: bool | None = None


class VerifierHealth(_Model):
    """Whether the escrow(s) trust our key; `verifierMatches` is the field to alert on."""

    escrow: str
    marketplace_verifier: str | None = None
    relayer_address: str
    verifier_matches: bool = False
    reason: str | None = None
    escrows: list[EscrowVerifier] = Field(default_factory=list)


class ArbiterHealth(_Model):
    """Whether the escrow's arbiter is the key that sends panel rulings (`arbiterMatches`)."""

    escrow: str
    arbiter: str | None = None
    relayer_arbiter_address: str
    arbiter_matches: bool = False


class ChainHealth(_Model):
    """Everything about one chain."""

    chain_id: int
    name: str = ""
    rpc: RpcHealth
    indexer: IndexerHealth
    relayer: RelayerHealth
    verifier: VerifierHealth
    arbiter: ArbiterHealth | None = None
    stale: bool = Field(default=False, description="The relayer's last report is too old to trust")


class BridgeHealth(_Model):
    """The `/health/bridge` document."""

    status: Literal["ok", "degraded", "failing"]
    checked_at: datetime
    chains: list[ChainHealth]
    reason: str | None = Field(default=None, description="Why a configured chain has no report")


def key_match(trusted: Sequence[str | None], relayer: str) -> tuple[bool, str | None]:
    """(matches, reason): every escrow must name `relayer`; an unknown answer is a no."""
    if not trusted:
        return False, "no escrow configured"
    for address in trusted:
        if address is None:
            return False, "the escrow's verifier could not be read"
        if address.lower() != relayer.lower():
            return False, f"the escrow trusts {address}, the relayer signs as {relayer}"
    return True, None


def indexer_liveness(
    cursor: int | None, head: int | None, age: float | None, stale_after: float
) -> tuple[bool | None, str | None]:
    """(live, reason): an indexer behind the head whose cursor has not moved for
    `stale_after` seconds, or whose cursor is stamped in the future, is dead or stuck (or
    unknowable); a cursor at the head may rest (no new blocks)."""
    if cursor is None:
        return None, "the indexer has stored no cursor for this chain"
    if head is None or age is None:
        return None, None
    if head > cursor and age > stale_after:
        return False, f"the indexer's cursor ({cursor}) has not moved for {age:.0f} s, {head - cursor} blocks behind"
    if head > cursor and age < -FUTURE_TOLERANCE_SECONDS:
        # Stamped ahead of the database's clock: its age says nothing about whether it moves.
        return False, (
            f"the indexer's cursor ({cursor}) is stamped {-age:.0f} s in the future, {head - cursor} blocks behind"
        )
    return True, None


def runway(balance: int | None, gas_price: int | None, gas_per_send: int) -> int | None:
    """How many more sends of `gas_per_send` gas the balance pays for at `gas_price` (None:
    unknown). Worst case: the gas limit, not what a verdict usually burns."""
    if balance is None or gas_price is None:
        return None
    return balance // max(1, gas_price * gas_per_send)


def overall_status(chains: Sequence[ChainHealth]) -> Literal["ok", "degraded", "failing"]:
    """failing when any chain cannot send (key, RPC, closed gate, stale report) or its indexer
    is dead; degraded when an indexer's lag is unknown."""
    if any(
        not c.verifier.verifier_matches
        or not c.rpc.reachable
        or not c.relayer.sending
        or c.stale
        or c.indexer.live is False
        for c in chains
    ):
        return "failing"
    if any(c.indexer.lag_blocks is None for c in chains):
        return "degraded"
    return "ok"


class BridgeHealthChecker:
    """Computes the bridge health report from the chains and the database."""

    def __init__(
        self,
        *,
        chains: Sequence[ChainSettings],
        rpcs: Mapping[int, EthRpc],
        pool: asyncpg.Pool,
        relayer_address: str,
        gates: Mapping[int, object] | None = None,
        indexer_stale_after: float = 60.0,
        gas_per_send: int = 400_000,
    ) -> None:
        self._gas_per_send = gas_per_send
        self._chains = list(chains)
        self._rpcs = rpcs
        self._pool = pool
        self.relayer_address = checksum_address(relayer_address)
        self._gates = gates or {}
        self._indexer_stale_after = indexer_stale_after

    async def check_chain(self, chain: ChainSettings) -> ChainHealth:
        """One chain's report (never raises for chain or database faults)."""
        rpc = self._rpcs[chain.chain_id]
        head: int | None = None
        error: str | None = None
        balance: int | None = None
        price: int | None = None
        trusted: list[str | None] = []
        try:
            calls: list[tuple[str, list[object]]] = [
                ("eth_blockNumber", []),
                ("eth_getBalance", [self.relayer_address, "latest"]),
            ]
            calls += [
                ("eth_call", [{"to": e, "data": "0x" + marketplace_verifier_data().hex()}, "latest"])
                for e in chain.escrow_addresses
            ]
            calls.append(("eth_gasPrice", []))
            replies = await rpc.batch(calls)
            gas_price = replies.pop()
            # Every reply checked before use (a node may answer null or garbage): a malformed
            # quantity is a failed check of this chain, never an exception out of the monitor.
            if not isinstance(gas_price, Exception):
                price = quantity(gas_price, "eth_gasPrice")
            if not isinstance(replies[0], Exception):
                head = quantity(replies[0], "eth_blockNumber")
            else:
                error = type(replies[0]).__name__
            if not isinstance(replies[1], Exception):
                balance = quantity(replies[1], "eth_getBalance")
            trusted = [_address_word(reply) for reply in replies[2:]]
        except RpcError as exc:
            error = f"{type(exc).__name__}: {exc}"[:300]
            trusted = [None for _ in chain.escrow_addresses]
        cursor: int | None = None
        cursor_age: float | None = None
        pending = 0
        next_nonce: int | None = None
        with contextlib.suppress(asyncpg.PostgresError, OSError, asyncpg.InterfaceError):
            async with self._pool.acquire() as conn:
                cursor, cursor_age = await store.indexer_cursor_state(conn, chain.chain_id)
                pending = await txstore.pending_count(conn, chain.chain_id, self.relayer_address)
                next_nonce = await txstore.next_nonce(conn, chain.chain_id, self.relayer_address)
        matches, reason = key_match(trusted, self.relayer_address)
        if head is None and reason is not None:
            reason = f"RPC unreachable ({error}); {reason}"
        gate = self._gates.get(chain.chain_id)
        hold = getattr(gate, "fee_hold", None)
        sending = bool(getattr(gate, "is_open", False)) and hold is None if gate is not None else matches
        paused = (getattr(gate, "reason", None) or hold) if gate is not None else reason
        live, indexer_reason = indexer_liveness(cursor, head, cursor_age, self._indexer_stale_after)
        return ChainHealth(
            chain_id=chain.chain_id,
            name=chain.name,
            rpc=RpcHealth(reachable=head is not None, head=head, error=error),
            indexer=IndexerHealth(
                cursor_block=cursor,
                lag_blocks=None if cursor is None or head is None else max(0, head - cursor),
                seconds_since_update=None if cursor_age is None else round(cursor_age, 1),
                live=live,
                reason=indexer_reason,
            ),
            relayer=RelayerHealth(
                address=self.relayer_address,
                balance_wei=None if balance is None else str(balance),
                runway_verdicts=runway(balance, price, self._gas_per_send),
                pending_transactions=pending,
                next_nonce=next_nonce,
                sending=sending,
                paused_reason=None if sending else paused,
            ),
            verifier=VerifierHealth(
                escrow=chain.escrow_addresses[0],
                marketplace_verifier=trusted[0] if trusted else None,
                relayer_address=self.relayer_address,
                verifier_matches=matches,
                reason=reason,
                escrows=[
                    EscrowVerifier(
                        escrow=e,
                        marketplace_verifier=t,
                        verifier_matches=None if t is None else t.lower() == self.relayer_address.lower(),
                    )
                    for e, t in zip(chain.escrow_addresses, trusted, strict=True)
                ],
            ),
        )

    async def check(self) -> BridgeHealth:
        """Every chain's report."""
        chains = list(await asyncio.gather(*(self.check_chain(c) for c in self._chains)))
        return BridgeHealth(status=overall_status(chains), checked_at=datetime.now(UTC), chains=chains)


async def arbiter_health(rpc: EthRpc, escrow: str, address: str) -> ArbiterHealth:
    """The escrow's `arbiter()` against the ruling key's address (unknown reads as no)."""
    arbiter: str | None = None
    with contextlib.suppress(RpcError):
        raw = await rpc.eth_call(escrow, selector("arbiter"))
        if len(raw) >= 20:
            arbiter = checksum_address("0x" + raw[-20:].hex())
    return ArbiterHealth(
        escrow=escrow,
        arbiter=arbiter,
        relayer_arbiter_address=checksum_address(address),
        arbiter_matches=arbiter is not None and arbiter.lower() == address.lower(),
    )


async def publish_report(pool: asyncpg.Pool, report: BridgeHealth, *, stale_after: float) -> None:
    """Store each chain's report (one transaction) for `PublishedHealth` readers."""
    async with pool.acquire() as conn, conn.transaction():
        for chain in report.chains:
            await store.publish_health(
                conn,
                chain_id=chain.chain_id,
                relayer_address=chain.relayer.address,
                report_json=chain.model_dump_json(by_alias=True),
                stale_after=stale_after,
            )


def judge_published(chain: ChainHealth, *, age: float, stale_after: float) -> ChainHealth:
    """A published chain report as of now: older than `stale_after` seconds (at most
    `MAX_STALE_AFTER_SECONDS`), the relayer has stopped checking (dead, or cut off from the
    database) and nothing vouches for sending. A report stamped in the future (the database's
    clock stepped back, or the row was not written by the relayer's `now()`) has no age to
    trust: stale too, until the relayer writes it again."""
    bound = stale_after if math.isfinite(stale_after) and 0 < stale_after <= MAX_STALE_AFTER_SECONDS else (
        MAX_STALE_AFTER_SECONDS
    )
    if age < -FUTURE_TOLERANCE_SECONDS:
        why = (
            f"the relayer's last health report is stamped {-age:.0f} s in the future"
            " (did the database's clock move back?)"
        )
    elif age <= bound:
        return chain
    else:
        why = f"the relayer's last health report is {age:.0f} s old (is the relayer running?)"
    relayer = chain.relayer.model_copy(update={"sending": False, "paused_reason": why})
    return chain.model_copy(update={"stale": True, "relayer": relayer})


class PublishedHealth:
    """The API server's source: the relayer's published report per chain, judged for age now,
    at most one database read every `max_age` seconds. `chain_ids` (when given) are the chains
    that must have a report; `arbiter` adds the ruling key's check (address and an RPC per chain)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        chain_ids: Sequence[int] = (),
        arbiter: tuple[str, Mapping[int, tuple[EthRpc, str]]] | None = None,
        max_age: float = 1.0,
    ) -> None:
        self._pool = pool
        self._chain_ids = list(chain_ids)
        self._arbiter = arbiter
        self._max_age = max_age
        self._report: BridgeHealth | None = None
        self._at = 0.0
        self._lock = asyncio.Lock()

    async def report(self) -> BridgeHealth:
        """The latest report, read again when older than `max_age`."""
        async with self._lock:
            if self._report is None or time.monotonic() - self._at > self._max_age:
                self._report = await self._read()
                self._at = time.monotonic()
            return self._report

    async def _read(self) -> BridgeHealth:
        async with self._pool.acquire() as conn:
            rows = await store.published_health(conn, max_bytes=MAX_REPORT_BYTES)
        chains: list[ChainHealth] = []
        unreadable: list[int] = []
        for r in rows:
            if self._chain_ids and r.chain_id not in self._chain_ids:
                continue
            parsed = _parse_report(r.report, r.chain_id)
            if parsed is None:
                unreadable.append(r.chain_id)
                continue
            chains.append(judge_published(parsed, age=r.age_seconds, stale_after=r.stale_after))
        if self._arbiter is not None:
            address, targets = self._arbiter
            for i, chain in enumerate(chains):
                target = targets.get(chain.chain_id)
                if target is not None:
                    chains[i] = chain.model_copy(update={"arbiter": await arbiter_health(target[0], target[1], address)})
        missing = sorted(set(self._chain_ids) - {c.chain_id for c in chains} - set(unreadable))
        if not chains and not missing and not unreadable:
            raise NoReport("the relayer has published no health report yet")
        reasons = []
        if missing:
            reasons.append(f"no health report from the relayer for chain(s) {missing}")
        if unreadable:
            reasons.append(
                f"unreadable health report for chain(s) {unreadable} (too large, not a report, or another chain's)"
            )
        status = "failing" if reasons else overall_status(chains)
        return BridgeHealth(status=status, checked_at=datetime.now(UTC), chains=chains, reason="; ".join(reasons) or None)


def _parse_report(report: str | None, chain_id: int) -> ChainHealth | None:
    """A row's report, or None when it is over the size bound, is not a `ChainHealth`, or
    names another chain than its row (it cannot vouch for the chain it is filed under)."""
    if report is None:
        return None
    try:
        parsed = ChainHealth.model_validate_json(report)
    except ValueError:  # pydantic's ValidationError
        return None
    return parsed if parsed.chain_id == chain_id else None


class NoReport(Exception):
    """No relayer has published a report: the route answers 503 with this message."""


Publish = Callable[[BridgeHealth], Awaitable[None]]


class SendGateLike(Protocol):
    """The part of a SendGate the monitor drives."""

    @property
    def is_open(self) -> bool: ...

    reason: str | None
    fee_hold: str | None  # set while the base fee is above the fee cap (new sends held)

    @property
    def closures(self) -> int:
        """How many times the gate was closed so far (by anyone)."""
        ...

    def open(self) -> None: ...

    def close(self, reason: str) -> None: ...


class HealthMonitor:
    """Checks every `interval` seconds, drives the send gates, serves the latest report."""

    def __init__(
        self,
        checker: BridgeHealthChecker,
        gates: Mapping[int, SendGateLike],
        *,
        interval: float,
        publish: Publish | None = None,
    ) -> None:
        self._checker = checker
        self._gates = gates
        self._interval = interval
        self._publish = publish
        self._report: BridgeHealth | None = None
        self._wake = asyncio.Event()
        self._matched: dict[int, bool | None] = {}

    def request_check(self) -> None:
        """Check now (e.g. the escrow just refused our key)."""
        self._wake.set()

    async def report(self) -> BridgeHealth:
        """The latest report (checks once if none yet)."""
        if self._report is None:
            await self.check_once()
        assert self._report is not None
        return self._report

    async def check_once(self) -> BridgeHealth:
        """Run one check and apply it to the gates and metrics."""
        closures = {chain_id: gate.closures for chain_id, gate in self._gates.items()}
        report = await self._checker.check()
        for chain in report.chains:
            self._apply(chain, closures.get(chain.chain_id))
        # Re-read the gate state so the report shows the decision just taken.
        chains = [c.model_copy(update={"relayer": self._relayer_view(c)}) for c in report.chains]
        self._report = report.model_copy(update={"chains": chains, "status": overall_status(chains)})
        if self._publish is not None:
            try:
                await self._publish(self._report)
            except Exception as exc:  # the API then reads the report as stale: failing, as it should
                log.warning("health_publish_failed", error=type(exc).__name__)
        return self._report

    def _relayer_view(self, chain: ChainHealth) -> RelayerHealth:
        gate = self._gates.get(chain.chain_id)
        if gate is None:
            return chain.relayer
        hold = gate.fee_hold
        sending = gate.is_open and hold is None
        return chain.relayer.model_copy(
            update={"sending": sending, "paused_reason": None if sending else (gate.reason or hold)}
        )

    def _apply(self, chain: ChainHealth, closures_before: int | None) -> None:
        label = str(chain.chain_id)
        gate = self._gates.get(chain.chain_id)
        matches = chain.verifier.verifier_matches
        reachable = chain.rpc.reachable
        metrics.RPC_UP.labels(label).set(1 if reachable else 0)
        if chain.rpc.head is not None:
            metrics.HEAD_BLOCK.labels(label).set(chain.rpc.head)
        if chain.indexer.lag_blocks is not None:
            metrics.INDEXER_LAG.labels(label).set(chain.indexer.lag_blocks)
        if chain.relayer.balance_wei is not None:
            metrics.BALANCE.labels(label).set(int(chain.relayer.balance_wei))
        if chain.relayer.runway_verdicts is not None:
            metrics.RUNWAY.labels(label).set(chain.relayer.runway_verdicts)
        known = chain.verifier.marketplace_verifier is not None
        metrics.KEY_MATCH.labels(label).set(1 if matches else (0 if known else -1))
        previous = self._matched.get(chain.chain_id)
        self._matched[chain.chain_id] = matches
        if gate is None:
            return
        if matches:
            if gate.closures != closures_before:
                # The gate closed while this check was in flight (a sender saw the escrow
                # refuse our key): what the check read may predate that refusal, so it
                # cannot reopen the gate. Check again at once instead.
                log.info("health_check_outdated", chain_id=chain.chain_id, reason=gate.reason)
                self._wake.set()
                return
            if not gate.is_open:
                log.info("sending_resumed", chain_id=chain.chain_id, verifier=chain.verifier.marketplace_verifier)
                metrics.SENDING_PAUSED.labels(label, "verifier_mismatch").set(0)
                metrics.SENDING_PAUSED.labels(label, "check_failed").set(0)
            gate.open()
            return
        reason = chain.verifier.reason or "the escrow does not trust the relayer key"
        why = "verifier_mismatch" if known else "check_failed"
        if gate.is_open or previous is not False or gate.reason != reason:
            log.error(
                "sending_stopped",
                chain_id=chain.chain_id,
                reason=reason,
                verifier=chain.verifier.marketplace_verifier,
                relayer=chain.verifier.relayer_address,
            )
        if known and previous is not False:
            metrics.KEY_MISMATCH_EVENTS.labels(label).inc()
        metrics.SENDING_PAUSED.labels(label, why).set(1)
        gate.close(reason)

    async def run(self) -> None:
        """Check forever; a failing check closes the gates rather than stopping the loop."""
        while True:
            # Cleared before the check: a request made while it is in flight (the escrow
            # refused our key meanwhile) is answered by another check, not lost.
            self._wake.clear()
            try:
                await self.check_once()
            except Exception as exc:  # health must outlive any single fault
                log.error("health_check_failed", error=f"{type(exc).__name__}: {exc}"[:300])
                for gate in self._gates.values():
                    gate.close("health check failed")
            await wait_event(self._wake, self._interval)
