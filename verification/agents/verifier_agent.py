"""`escrowd verifier-agent`: the hosted verifier of seed 000's agent review.

Every poll it:

1. registers (first poll) or heartbeats through its queue read, so the directory lists it
   as running;
2. reads its queue (`GET /v1/verifiers/me/queue`, signed): listed agent-review tasks that
   name it, delivered on chain, finalized by their agent, not judged yet;
3. per item, checks what the API showed it against the chain (`verification.agents.grounds`):
   the terms hash to the on-chain `taskHash` and name it, the attempt is the one delivered,
   the result hashes to the on-chain evidence hash; then reads the brief (`GET
   /v1/briefs/{taskHash}`), checks it against the terms' `instructionsDigest` and, when
   private, unwraps the key for this task and decrypts it. A mismatch, or no brief, is a
   refusal: reported as a failed try, never a verdict;
4. asks the model (brief and result each cut to 12,000 characters with their original
   lengths and a cut flag, plus the terms' `acceptance` note, as data; fail when in doubt)
   for pass/fail and up to 10 reasons;
5. sends `completeVerification(task, attempt, evidenceHash, passed, score)` from its own
   wallet and pays the gas (score 100 on pass, 0 on fail) through the chain toolkit's
   transaction sender (`chain.sender.CallSender`: its own nonce row in PostgreSQL, EIP-1559
   fees, a stuck transaction replaced with a fee bump, receipts, confirmations, reorgs), and
   waits until it is confirmed;
6. reports the verdict with its reasons (`POST …/verifier-report`); the service records
   it only once it matches the indexed on-chain verdict.

A model error (timeout, 5xx, malformed answer) posts no verdict: it reports an `error`
try instead and the item comes back on a later poll. The service counts the tries; after
5 the attempt is "delivered but never judged" and leaves the queue, so the agent stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import structlog
from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from chain.abi import decode_task, get_task_data
from chain.eth_rpc import EthRpc, RpcError
from chain.fees import GWEI, NODE_MIN_BUMP_BPS, FeePolicy
from chain.gate import SendGate
from chain.keys import SecretKey
from chain.sender import CallFailed, CallSender, SenderMetrics, SenderOptions
from chain.signers import KeystoreSigner, Metered, Signer, SignerError, SignerSpec, open_signer
from chain.txs import complete_verification_data, is_judged_data
from runtime.aio import wait_event
from runtime.logging import register_secret
from runtime.options import ConfigOption
from runtime.settings import PostgresUrl, ServiceSettings, one_key_source, secrets_required
from runtime.web.auth import Deployment, UnsignedRequest, signed_request_headers
from schemas import jsonbounds
from verification.agents import briefs
from verification.agents.grounds import (
    Grounds,
    Refusal,
    check_item,
    open_checked_brief,
    parse_entry,
    trusted_api_url,
)
from verification.agents.judging import VerifierAnswer, verifier_messages
from verification.agents.model import ModelClient, ModelError, ModelSettings

log = structlog.get_logger(__name__)

MAX_FAILED_TRIES = 5
# Served on `metrics_port` with `/healthz` and `/readyz` (runtime/health.py), like every service.
SENDER_METRICS = SenderMetrics.create("escrowd_verifier_agent", "the hosted verifier agent")
QUEUE_PAGE = 20
MAX_QUEUE_BYTES = QUEUE_PAGE * 2 * 1024 * 1024
"""Largest queue reply read: a page of items, each a result (≤ 512 KiB) and its terms."""
MAX_BRIEF_REPLY_BYTES = 4 * 1024 * 1024
"""Largest brief reply read: a 256 KiB brief JSON-escaped, or its ciphertext in base64."""


class ReplyTooLarge(Exception):
    """The API answered more bytes than such a reply can hold."""
_TASK_ROUTE = re.compile(r"^/v1/tasks/(?P<chain>[0-9]+)/(?P<escrow>0x[0-9a-fA-F]{40})/")


class VerifierAgentSettings(ServiceSettings):
    """The hosted verifier's settings (`ESCROWD_VERIFIER_*` over the file's `verifier_agent:` section;
    the model's are `ESCROWD_MODEL_*` over its `verifier_agent.model:` mapping)."""

    model_config = SettingsConfigDict(env_prefix="ESCROWD_VERIFIER_", extra="ignore", populate_by_name=True)

    api_url: str = Field(description="Base URL of the escrowd API: https://, or http:// to a loopback address only")
    rpc_url: str = Field(description="JSON-RPC URL of the chain it settles on")
    chain_id: int = Field(gt=0, description="The chain it settles on")
    escrow_address: str = Field(
        pattern=r"^0x[0-9a-fA-F]{40}$",
        description="The escrow of the API's deployment its directory and queue requests are signed for",
    )
    wallet_signer: SignerSpec = Field(
        default_factory=SignerSpec,
        description=(
            "Who holds its wallet key: kind keystore (wallet_key or wallet_key_file), aws-kms (kms_key_id,"
            " kms_region, kms_endpoint_url) or remote (remote_url, address); a key outside this process"
            " cannot derive the brief key, so encryption_key is then required"
        ),
    )
    wallet_key: SecretStr | None = Field(
        default=None, description="0x key of its wallet: signs requests and completeVerification"
    )
    wallet_key_file: Path | None = Field(
        default=None, description="File holding that key (a mounted secret), instead of wallet_key"
    )
    encryption_key: SecretStr | None = Field(
        default=None, description="0x secp256k1 key private briefs are wrapped to (default: a key derived from the wallet key)"
    )
    poll_seconds: float = Field(default=2.0, gt=0, description="Seconds between queue reads")
    capabilities: list[str] = Field(default_factory=lambda: ["text"], description="Capabilities it registers")
    database_url: PostgresUrl = Field(
        validation_alias=AliasChoices("ESCROWD_VERIFIER_DATABASE_URL", "ESCROWD_DATABASE_URL"),
        description="PostgreSQL URL (or ESCROWD_DATABASE_URL): the wallet's nonce row and every transaction it signed",
    )
    gas_limit: int = Field(default=400_000, gt=21_000, le=30_000_000, description="Gas limit of completeVerification (as the relayer's: two pushed payouts under the escrow's per-transfer stipend fit)")
    receipt_timeout_seconds: float = Field(
        default=120.0, gt=0, description="Longest wait for a verdict's confirmation in one poll (it is followed on after)"
    )
    confirmations: int = Field(default=1, ge=1, le=1_000, description="Blocks deep before a verdict counts as sent")
    fee_cap_wei: int = Field(default=500 * GWEI, gt=0, description="max_fee_per_gas never above this")
    max_priority_fee_wei: int = Field(default=50 * GWEI, ge=1, description="Highest tip")
    fee_bump_bps: int = Field(
        default=1_250, ge=NODE_MIN_BUMP_BPS, le=10_000, description="Tip and max fee raise of a replacement (1000 = 10%)"
    )
    replace_after_seconds: float = Field(
        default=30.0, gt=0, le=86_400, description="An unmined transaction broadcast this long ago is replaced"
    )
    judge_concurrency: int = Field(
        default=4, ge=1, le=QUEUE_PAGE,
        description="Items judged at once (model calls in flight): a slow answer holds up no other item",
    )  # fmt: skip
    request_ttl_seconds: int = Field(default=120, ge=10, le=900, description="Lifetime of its API signatures")
    metrics_port: int | None = Field(
        default=None, ge=0, le=65535, description="Port of /metrics, /healthz and /readyz; none to disable"
    )

    @model_validator(mode="after")
    def _one_wallet_key(self) -> VerifierAgentSettings:
        if self.wallet_signer.kind == "keystore":
            one_key_source(("wallet_key", self.wallet_key), ("wallet_key_file", self.wallet_key_file))
            return self
        kind = self.wallet_signer.kind
        if self.wallet_key is not None or self.wallet_key_file is not None:
            raise ValueError(f"wallet_signer is {kind}: a wallet key in this process is not used, remove it")
        if self.encryption_key is None and secrets_required():
            # Private briefs are wrapped to a key derived from the wallet key: a KMS or remote
            # key never leaves its signer, so the brief key must be its own secret.
            raise ValueError(f"wallet_signer is {kind}: set encryption_key (the brief key cannot be derived)")
        return self

    def wallet(self) -> str:
        """The wallet's 0x hex key (from the file, whitespace removed); ValueError without echoing it."""
        from runtime.config_file import key_or_file

        return key_or_file(self.wallet_key, self.wallet_key_file, "wallet_key_file")

    @field_validator("api_url", "rpc_url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http(s):// URL")
        return value.rstrip("/")

    @field_validator("api_url")
    @classmethod
    def _api_over_tls(cls, value: str) -> str:
        # The queue and the briefs come from the API: over plain HTTP anyone on the path could
        # answer them (the checks against the chain would refuse, but it could starve the queue).
        return trusted_api_url(value)


def derived_encryption_key(wallet_key: str) -> bytes:
    """A separate secp256k1 key for briefs, derived from the wallet key (so one secret suffices)."""
    from eth_utils.crypto import keccak

    return bytes(keccak(b"escrowd-brief-encryption-v1" + bytes.fromhex(wallet_key.removeprefix("0x"))))


@dataclass
class PollStats:
    """What one poll did."""

    seen: int = 0
    judged: int = 0
    model_errors: int = 0
    refused: int = 0
    skipped: list[str] = field(default_factory=list)


class VerifierAgent:
    """One hosted verifier: its wallet, its encryption key, its model, the API and the chain."""

    def __init__(
        self,
        settings: VerifierAgentSettings,
        model: ModelClient,
        *,
        signer: Signer | None = None,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        """`signer`: its wallet (`open_wallet`); None: the keystore key of `settings`."""
        self.settings = settings
        enc = settings.encryption_key.get_secret_value().strip() if settings.encryption_key else None
        # The wallet key is read only when it is in this process's keystore and needed: to sign,
        # or to derive the brief key from.
        wallet = settings.wallet() if signer is None or (not enc and settings.wallet_signer.kind == "keystore") else None
        if wallet is not None:
            register_secret(wallet)
        self.signer: Signer = signer or Metered(KeystoreSigner(SecretKey.from_hex(wallet or "")), WALLET_ROLE)
        if enc:
            self._enc_key = bytes.fromhex(enc.removeprefix("0x"))
        elif wallet is not None:
            self._enc_key = derived_encryption_key(wallet)
        else:
            raise ValueError("no encryption_key, and no wallet key in this process to derive it from")
        register_secret(self._enc_key.hex())
        self.model = model
        self.http = http or httpx.AsyncClient(base_url=settings.api_url, timeout=30.0)
        self.rpc = EthRpc([settings.rpc_url], chain_id=settings.chain_id, timeout=30.0)
        self.sender: CallSender | None = None
        self._sender_task: asyncio.Task[None] | None = None
        self._pool: Any = None
        # Judgements in flight, by (escrow, task, attempt): a later poll starts no second one.
        self._in_flight: dict[tuple[str, int, int], asyncio.Task[None]] = {}
        self._slots = asyncio.Semaphore(settings.judge_concurrency)
        # One send at a time: this attempt's is-it-sent check and the nonce it takes are one
        # step, and concurrent verdicts take consecutive nonces instead of re-signing on a race.
        self._send_lock = asyncio.Lock()
        self.registered = False
        self.chain_checked = False

    @property
    def address(self) -> str:
        """Its wallet address (the verifier named on chain), derived once when its signer opened."""
        return self.signer.address

    @property
    def encryption_public_key(self) -> str:
        """The key it registers for private briefs."""
        return briefs.encryption_public_key(self._enc_key)

    async def start_sender(self) -> CallSender:
        """Start the wallet's transaction sender (its nonce row, its slots) and wait until it has
        reconciled with the chain."""
        if self.sender is not None:
            return self.sender
        from runtime.db import create_pool, migrate_url

        s = self.settings
        if self._pool is None:  # a start that failed (chain down) keeps its pool for the next try
            await migrate_url(s.database_url)
            self._pool = await create_pool(s.database_url, max_size=4)
        policy = FeePolicy(fee_cap=s.fee_cap_wei, max_priority_fee=s.max_priority_fee_wei, bump_bps=s.fee_bump_bps)
        sender = CallSender(
            chain_id=s.chain_id, key=self.signer, rpc=self.rpc, pool=self._pool,
            # Nothing to fail closed on: the escrow takes a named verifier's verdict from its
            # wallet, whoever runs it; the gate stays open.
            gate=SendGate(open_=True),
            options=SenderOptions(policy=policy, gas_limit=s.gas_limit, replace_after=s.replace_after_seconds,
                                  recheck_interval=2.0, watch_blocks=64),
            metrics=SENDER_METRICS, confirmations=s.confirmations, poll_interval=0.2,
        )  # fmt: skip
        self.sender = sender
        self._sender_task = asyncio.create_task(sender.run())
        started = asyncio.create_task(sender.started.wait())
        done, _ = await asyncio.wait({started, self._sender_task}, return_when=asyncio.FIRST_COMPLETED)
        if self._sender_task in done:
            started.cancel()
            self.sender = None
            self._sender_task.result()  # raises what stopped it
            raise RuntimeError("the transaction sender stopped before it started")
        return sender

    async def close(self) -> None:
        """Stop the sender, release HTTP sessions and the database pool."""
        if self._sender_task is not None:
            self._sender_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._sender_task
        await self.model.close()
        await self.http.aclose()
        await self.rpc.close()
        if self._pool is not None:
            await self._pool.close()

    # ------------------------------------------------------------------ the API

    async def _request(self, method: str, path: str, body: Any = None) -> httpx.Request:
        raw = b"" if body is None else json.dumps(body).encode()
        # A task route names its deployment; the directory and the queue act on the API's own.
        task_route = _TASK_ROUTE.match(path)
        deployment = (
            Deployment(int(task_route["chain"]), task_route["escrow"])
            if task_route
            else Deployment(self.settings.chain_id, self.settings.escrow_address)
        )
        headers = await signed_request_headers(
            self.address, self.signer.sign_typed_data, UnsignedRequest(method, path, raw, deployment=deployment,
            expires_at=int(time.time()) + self.settings.request_ttl_seconds, nonce=secrets.token_urlsafe(16))
        )  # fmt: skip
        if body is not None:
            headers["content-type"] = "application/json"
        return self.http.build_request(method, path, content=raw or None, headers=headers)

    async def _call(self, method: str, path: str, body: Any = None) -> httpx.Response:
        return await self.http.send(await self._request(method, path, body))

    async def _read_json(self, path: str, limit: int) -> tuple[int, Any]:
        """A signed GET whose reply is read up to `limit` bytes (ReplyTooLarge past it) and parsed
        with the project's bounded JSON reader; (status, body or None when not JSON)."""
        response = await self.http.send(await self._request("GET", path), stream=True)
        try:
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > limit:
                    raise ReplyTooLarge(f"{path.split('?')[0]}: more than {limit} bytes")
                chunks.append(chunk)
        finally:
            await response.aclose()
        try:
            return response.status_code, jsonbounds.loads(b"".join(chunks), max_bytes=None)
        except ValueError:
            return response.status_code, None

    async def register(self) -> None:
        """Put its directory entry: a verifier on its chain, opted in, with its encryption key."""
        body = {
            "roles": ["verifier"],
            "chains": [self.settings.chain_id],
            "verifyOthers": True,
            "capabilities": list(self.settings.capabilities),
            "encryptionPublicKey": self.encryption_public_key,
        }
        response = await self._call("PUT", "/v1/executors/me", body)
        response.raise_for_status()
        self.registered = True

    async def _report(self, item: dict[str, Any], body: dict[str, Any]) -> None:
        path = f"/v1/tasks/{int(item['chainId'])}/{item['escrow']}/{int(item['taskId'])}/verifier-report"
        response = await self._call("POST", path, {"attempt": item["attempt"], "evidenceHash": item["evidenceHash"], **body})
        if response.status_code >= 400:
            log.warning("verifier_report_refused", status=response.status_code, task_id=item["taskId"])

    # ------------------------------------------------------------------ one poll

    async def poll_once(self) -> PollStats:
        """Register if needed, read the queue, judge its new items (up to `judge_concurrency` at
        a time) and wait for the judgements this poll started."""
        stats, started = await self._start_poll()
        outcomes = await asyncio.gather(*started, return_exceptions=True)
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        if failures:
            raise failures[0]  # every other item has had its turn; the next poll asks again
        return stats

    async def _start_poll(self) -> tuple[PollStats, list[asyncio.Task[None]]]:
        """Read the queue and start a judgement for each item not in flight already; the
        started tasks (each judging under a concurrency slot)."""
        if not self.chain_checked:
            # Every check below reads this node: it must be the chain the verifier settles on.
            if await self.rpc.chain_id() != self.settings.chain_id:
                raise RuntimeError("the RPC node serves another chain than chain_id")
            self.chain_checked = True
        if not self.registered:
            await self.register()
        status, queue = await self._read_json(f"/v1/verifiers/me/queue?limit={QUEUE_PAGE}", MAX_QUEUE_BYTES)
        if status != 200 or not isinstance(queue, dict) or not isinstance(queue.get("items"), list):
            raise RuntimeError(f"the queue read answered HTTP {status}")
        stats = PollStats()
        started: list[asyncio.Task[None]] = []
        for item in queue["items"][:QUEUE_PAGE]:
            stats.seen += 1
            try:
                entry = parse_entry(item)
            except Refusal as refusal:
                stats.skipped.append(refusal.reason)  # not even an address to report on
                continue
            if entry.chain_id != self.settings.chain_id:
                stats.skipped.append(f"{entry.task_id}: another chain")
                continue
            if entry.failures >= MAX_FAILED_TRIES:
                stats.skipped.append(f"{entry.task_id}: gave up")
                continue
            key = (entry.escrow.lower(), entry.task_id, entry.attempt)
            if key in self._in_flight or len(self._in_flight) >= QUEUE_PAGE:
                continue  # judged by an earlier poll's task, or a page's worth waits already
            task = asyncio.create_task(self._judge_item(item, entry.task_id, stats))
            self._in_flight[key] = task
            task.add_done_callback(functools.partial(self._landed, key))
            started.append(task)
        return stats, started

    def _landed(self, key: tuple[str, int, int], _task: asyncio.Task[None]) -> None:
        self._in_flight.pop(key, None)

    async def _judge_item(self, item: dict[str, Any], task_id: int, stats: PollStats) -> None:
        async with self._slots:
            try:
                await self._judge(item, stats)
            except (RpcError, httpx.HTTPError, ReplyTooLarge, SignerError) as exc:
                # Our side's fault (node, API or wallet signer unreachable): no try is counted, no
                # verdict made with another key, the next poll asks again.
                stats.skipped.append(f"{task_id}: {type(exc).__name__}")
                log.warning("verifier_item_deferred", task_id=task_id, error_type=type(exc).__name__)

    async def _grounds(self, item: dict[str, Any]) -> tuple[Grounds, str]:
        """The item checked against the chain, and its brief checked against the terms (Refusal otherwise)."""
        entry = parse_entry(item)
        try:
            on_chain = decode_task(await self.rpc.eth_call(entry.escrow, get_task_data(entry.task_id)))
        except ValueError:
            # Its own node answered nonsense: not the agent's fault, no try is counted.
            raise RpcError("getTask did not answer one task") from None
        if on_chain.attempts < entry.attempt:
            # Its own node has not seen the delivery the API indexed (a node some blocks behind):
            # not a mismatch to report, and no try counted; the next poll reads it again.
            raise RpcError(f"the node has not seen attempt {entry.attempt} of task {entry.task_id} yet")
        try:
            grounds = check_item(entry, on_chain, self.address)
            status, reply = await self._read_json(f"/v1/briefs/{entry.task_hash.lower()}", MAX_BRIEF_REPLY_BYTES)
            if status >= 500 or status == 429:
                raise httpx.HTTPError(f"the brief read answered HTTP {status}")
            return grounds, open_checked_brief(grounds, status, reply, self._enc_key, self.address)
        except Refusal as refusal:
            if on_chain.attempts == entry.attempt:
                refusal.evidence_hash = on_chain.last_evidence_hash  # what the service checks a report against
            raise

    async def _judge(self, item: dict[str, Any], stats: PollStats) -> None:
        task_id = int(item["taskId"])
        try:
            grounds, brief = await self._grounds(item)
        except Refusal as refusal:
            # Shown something the chain does not back: no verdict, a failed try the service counts.
            stats.refused += 1
            log.warning("verifier_refused", task_id=task_id, attempt=item["attempt"], code=refusal.code)
            report = {"outcome": "error", "error": f"refused: {refusal.code}: {refusal.reason}"[:500]}
            await self._report({**item, "evidenceHash": refusal.evidence_hash or item["evidenceHash"]}, report)
            return
        try:
            messages = verifier_messages(brief, grounds.result_text, grounds.acceptance)
            answer = await self.model.ask(messages, VerifierAnswer)
        except ModelError as exc:
            # No verdict: the attempt stays unjudged and comes back on a later poll.
            stats.model_errors += 1
            log.warning("verifier_model_error", task_id=task_id, attempt=item["attempt"], reason=exc.reason)
            await self._report(item, {"outcome": "error", "error": f"model: {exc.reason}"[:500]})
            return
        score = 100 if answer.passed else 0
        await self.complete_on_chain(item, answer.passed, score)
        await self._report(item, {"outcome": "verdict", "passed": answer.passed, "score": score, "reasons": list(answer.reasons)})
        stats.judged += 1
        log.info("verifier_judged", task_id=task_id, attempt=item["attempt"], passed=answer.passed)

    # ------------------------------------------------------------------ the chain

    async def complete_on_chain(self, item: dict[str, Any], passed: bool, score: int) -> str | None:
        """completeVerification from its wallet, waited for until confirmed: the hash of its
        transaction, or None when the attempt is judged on chain already.

        After a crash (or a poll that gave up waiting), the call sent before is still the
        sender's to follow: it is waited for again, never sent a second time.
        """
        sender = await self.start_sender()
        escrow = item["escrow"].lower()
        task_id, attempt = int(item["taskId"]), int(item["attempt"])
        data = complete_verification_data(task_id, attempt, item["evidenceHash"], passed, score)
        async with self._send_lock:  # the confirmation is waited for outside it
            judged = await self.rpc.eth_call(escrow, is_judged_data(task_id, attempt))
            held = sender.held_call(escrow, data[:68])  # selector, task id, attempt: this attempt's call
            if held is None and int.from_bytes(judged[-32:] or b"\x00", "big"):
                return None  # judged already (a crash after sending: only the report is left)
            nonce = held if held is not None else await sender.send(escrow, data, self.settings.gas_limit)
        try:
            return await asyncio.wait_for(sender.confirmed(nonce), self.settings.receipt_timeout_seconds)
        except CallFailed as exc:
            raise RuntimeError(f"completeVerification for task {task_id} attempt {attempt}: {exc}") from None

    # ------------------------------------------------------------------ the loop

    async def run(self, stop: asyncio.Event, on_poll: Callable[[bool], None] | None = None) -> None:
        """Poll until `stop` is set; a failing poll is logged and retried on the next.

        A poll does not wait for the judgements it starts: while one waits on a slow model,
        the next polls start the items listed since (up to `judge_concurrency` judged at once).
        The wallet's sender starts first (it reconciles the nonce and sets its gauges);
        `on_poll(ok)` hears each poll's outcome (the process's readiness). On `stop`, the
        judgements in flight end first."""
        try:
            while not stop.is_set():
                ok = False
                try:
                    await self.start_sender()
                    stats, started = await self._start_poll()
                    for task in started:
                        task.add_done_callback(_log_item_failure)
                    ok = True
                    if started:
                        log.info("verifier_poll", seen=stats.seen, started=len(started), in_flight=len(self._in_flight))
                except Exception as exc:
                    log.warning("verifier_poll_failed", error_type=type(exc).__name__)
                if on_poll is not None:
                    on_poll(ok)
                await wait_event(stop, self.settings.poll_seconds)
        finally:
            if self._in_flight:
                await asyncio.gather(*self._in_flight.values(), return_exceptions=True)


def _log_item_failure(task: asyncio.Task[None]) -> None:
    """An item's judgement that stopped on an unexpected error: logged, asked again next poll."""
    if not task.cancelled() and task.exception() is not None:
        log.warning("verifier_item_failed", error_type=type(task.exception()).__name__)


WALLET_ROLE = "verifier-agent"


async def open_wallet(settings: VerifierAgentSettings) -> Signer:
    """Its wallet's signer (`wallet_signer`), the address derived once and checked against the
    configured one; SignerError when it cannot answer or holds another key (fail closed)."""
    signer = await open_signer(settings.wallet_signer, WALLET_ROLE, lambda: SecretKey.from_hex(settings.wallet()))
    log.info("verifier_wallet_ready", kind=signer.kind, address=signer.address)
    return signer


async def run_verifier_agent(
    settings: VerifierAgentSettings, model_settings: ModelSettings, stop: asyncio.Event | None = None
) -> None:
    """Run until `stop` (the service shell sets it on SIGINT / SIGTERM); the poll in flight ends first."""
    from runtime import health

    signer = await open_wallet(settings)
    agent = VerifierAgent(settings, ModelClient(model_settings), signer=signer)
    stop = stop or asyncio.Event()
    SENDER_METRICS.at_start([settings.chain_id], ("call", "filler"))
    if settings.metrics_port is not None:
        health.mark("verifier_agent", False)  # ready after a poll that reached the chain, the API and its queue
        health.start_server(settings.metrics_port)
    log.info("verifier_agent_started", address=agent.address, chain_id=settings.chain_id, metrics_port=settings.metrics_port)
    try:
        await agent.run(stop, on_poll=lambda ok: health.mark("verifier_agent", ok))
    finally:
        await agent.close()
        await signer.aclose()


AGENT_SECTION = "verifier_agent"
"""Section of the configuration file read by `escrowd verifier-agent`; its model: `verifier_agent.model`."""
MODEL_KEY = "model"


def load_agent_settings(config_file: Path | None = None) -> tuple[VerifierAgentSettings, ModelSettings]:
    """`ESCROWD_VERIFIER_*` over the file's `verifier_agent:` section, `ESCROWD_MODEL_*` over its `model:`."""
    from runtime.config_file import load

    settings = load(VerifierAgentSettings, AGENT_SECTION, config_file, nested=frozenset({MODEL_KEY}))
    model_settings = load(ModelSettings, f"{AGENT_SECTION}.{MODEL_KEY}", config_file)
    return settings, model_settings


def verifier_agent(
    config: ConfigOption = None,
    log_json: bool = True,
) -> None:
    """The hosted verifier: polls its queue, asks its model, signs completeVerification, reports."""
    from runtime.logging import configure_logging
    from runtime.shell import run_service, startup_failure

    configure_logging(json=log_json)
    try:
        settings, model_settings = load_agent_settings(config)
        if settings.wallet_signer.kind == "keystore":
            settings.wallet()  # a missing or malformed key file stops here, in one line
        if model_settings.url is None:
            raise ValueError("the model url is required (verifier_agent.model.url or ESCROWD_MODEL_URL)")
    except Exception as exc:
        # One line naming the field, never a value (the wallet key, the model's key).
        startup_failure("configuration error", exc)
    run_service("verifier-agent", lambda stop: run_verifier_agent(settings, model_settings, stop), configure=False)


@dataclass
class LocalHostedVerifier:
    """A hosted verifier with the deterministic local model, inside one process (`escrowd run`)."""

    agent: VerifierAgent
    model_url: str
    _stop: asyncio.Event
    _task: asyncio.Task[None]
    _runner: Any

    @classmethod
    async def start(
        cls, *, api_url: str, rpc_url: str, chain_id: int, escrow_address: str, wallet_key: str, database_url: str,
        wallet_signer: SignerSpec | None = None,
    ) -> LocalHostedVerifier:
        """Start the local model server and the verifier's poll loop (`wallet_signer`: where the
        wallet key `wallet_key` is held, None: in process)."""
        from verification.agents.stub_model import StubModel, start_stub

        outside = wallet_signer is not None and wallet_signer.kind != "keystore"
        settings = VerifierAgentSettings(
            api_url=api_url, rpc_url=rpc_url, chain_id=chain_id, escrow_address=escrow_address,
            wallet_signer=wallet_signer or SignerSpec(), wallet_key=None if outside else SecretStr(wallet_key),
            # A devnet key outside the process: its brief key is the one it would derive.
            encryption_key=SecretStr("0x" + derived_encryption_key(wallet_key).hex()) if outside else None,
            poll_seconds=0.5, database_url=database_url,
        )  # fmt: skip
        signer = await open_wallet(settings)
        runner, model_url = await start_stub(StubModel())
        agent = VerifierAgent(settings, ModelClient(ModelSettings(url=model_url, name="local-deterministic")), signer=signer)
        stop = asyncio.Event()
        return cls(agent, model_url, stop, asyncio.create_task(agent.run(stop)), runner)

    async def stop(self) -> None:
        """Stop polling, close sessions, stop the model server."""
        self._stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._task, 30)
        await self.agent.close()
        await self.agent.signer.aclose()
        await self._runner.cleanup()
