"""The verification service's entry point: consumer, retry scheduler and outbox publisher.

`run_verification_consumer(settings)` migrates the database, creates the topics it uses,
then runs until cancelled:

* the `IdempotentConsumer` with `VerificationHandler` over the events and requests topics,
  which queues each judgement as a job in the message's transaction;
* the `JudgingPool` (`verification.judging_stage`): claims those jobs under a lease, judges
  them concurrently outside any transaction, commits each verdict in a short one;
* `RetryScheduler`: moves finalizes whose verifier could not answer back onto the requests
  topic when their backoff is over;
* an `OutboxPublisher` (standby when another process of the database already publishes),
  which carries signed verdicts, retries and dead letters to Kafka.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import structlog
from eth_account import Account
from eth_utils.address import is_address, to_checksum_address
from pydantic import Field, SecretStr, field_validator, model_validator

from chain.keys import SecretKey
from chain.signers import Signer, SignerSpec, open_signer
from runtime.consumer import IdempotentConsumer
from runtime.db import connect, is_connection_error, migrate_url
from runtime.kafka import TopicSpec, ensure_topics, make_producer
from runtime.logging import register_secret
from runtime.outbox import OutboxPublisher, enqueue
from runtime.settings import ConsumerSettings
from schemas import topics
from schemas.task_terms import RetryDue
from verification import results_store as store
from verification.consumer import (
    CONSUMER_NAME,
    Topics,
    VerificationHandler,
    request_message,
)
from verification.judging_stage import JudgingLimits, JudgingPool
from verification.registry import RubricStore, VerifierRegistry
from verification.routing import RetryPolicy
from verification.sandbox import SandboxSettings
from verification.signing import VerdictSigning
from verification.verifiers import default_registry

log = structlog.get_logger(__name__)


class VerificationSettings(ConsumerSettings):
    """Everything the verification consumer needs (`ESCROWD_*` environment variables)."""

    verification_group: str = Field(default=CONSUMER_NAME, description="Consumer group id")
    verification_requests_topic: str = Field(
        default=topics.VERIFICATION_REQUESTS, description="Finalize / review / verifier-report requests"
    )
    verdicts_topic: str = Field(default=topics.VERDICTS, description="Signed verdicts for the settlement relayer")
    topic_partitions: int = Field(default=4, ge=1, description="Partitions when creating topics")
    verification_signer: SignerSpec = Field(
        default_factory=SignerSpec,
        description=(
            "Who holds the verdict-signing key: kind keystore (verification_keystore or"
            " verification_signing_key), aws-kms (kms_key_id, kms_region, kms_endpoint_url) or remote"
            " (remote_url, address); verdicts and proofs are signed outside every transaction"
        ),
    )
    verification_signing_key: SecretStr | None = Field(
        default=None, description="Raw 0x key the verification service signs verdicts with (devnet)"
    )
    verification_keystore: Path | None = Field(
        default=None, description="Encrypted keystore file of the signing key (preferred)"
    )
    verification_keystore_password: SecretStr | None = Field(
        default=None, description="Password of the keystore file"
    )
    verification_keystore_password_file: Path | None = Field(
        default=None, description="File holding that password (a mounted secret), instead of the password itself"
    )
    trusted_api_signers: list[str] = Field(
        default_factory=list,
        description="API service addresses whose signature vouches for a relayed request (besides the"
        " requester's own signature); never the verdict-signing key's address",
    )
    plugin_packages: list[str] = Field(
        default_factory=list, description="Packages whose modules may be plugin verifiers"
    )
    endpoint_hosts: list[str] = Field(default_factory=list, description="Hosts endpoint verifiers may be on")
    endpoint_timeout: float = Field(default=60.0, gt=0, description="Seconds an endpoint verifier may take")
    rubric_dir: Path | None = Field(default=None, description="Directory of <owner>/<name>.json rubrics")
    sandbox_url: str | None = Field(
        default=None, description="Sandbox runner service for code verifiers; none: run bwrap in this process"
    )
    retry_base_seconds: float = Field(default=5.0, gt=0, description="First delay before re-judging")
    retry_max_seconds: float = Field(default=600.0, gt=0, description="Longest delay between re-judging tries")
    retry_poll_seconds: float = Field(default=1.0, gt=0, description="How often due retries are looked for")
    max_records: int = Field(default=50, ge=1, description="Messages per consumer batch")
    judging_concurrency: int = Field(default=64, ge=1, description="Judgements this process makes at once")
    judging_per_verifier: int = Field(
        default=32, ge=1, description="Judgements this process makes at once against one verifier"
    )
    judging_lease_seconds: float = Field(
        default=90.0, gt=0, description="How long a claimed judgement is held before another process may take it"
        " (renewed while judging; longer than endpoint_timeout)",
    )
    judging_max_errors: int = Field(
        default=5, ge=1, description="Unexpected errors of one judgement before it is parked as failed (our fault)"
    )
    judging_error_backoff_seconds: float = Field(
        default=5.0, ge=0, description="First delay before a judgement that raised is tried again (doubling)"
    )
    judging_error_backoff_max_seconds: float = Field(
        default=300.0, ge=0, description="Longest delay between tries of a judgement that raised"
    )
    run_publisher: bool = Field(default=True, description="Run an outbox publisher (standby if one runs)")

    @model_validator(mode="after")
    def _one_key_source(self) -> VerificationSettings:
        in_process = self.verification_signing_key is not None or self.verification_keystore is not None
        if self.verification_signer.kind != "keystore" and in_process:
            raise ValueError(
                f"verification_signer is {self.verification_signer.kind}: a key in this process is not used, remove it"
            )
        return self

    @field_validator("trusted_api_signers")
    @classmethod
    def _addresses(cls, values: list[str]) -> list[str]:
        for value in values:
            if not is_address(value):
                raise ValueError("trusted_api_signers holds something that is not an address")
        return [str(to_checksum_address(v)) for v in values]

    def topics(self) -> Topics:
        """The topic names in use."""
        return Topics(
            events=self.events_topic,
            requests=self.verification_requests_topic,
            verdicts=self.verdicts_topic,
            dead_letters=self.dead_letter_topic,
        )

    def registry(self) -> VerifierRegistry:
        """The verifier registry this service runs (with the rubric judge when `ESCROWD_MODEL_URL` is set)."""
        from verification.agents.rubrics import rubric_judge_from_env

        return default_registry(
            allowed_plugin_packages=self.plugin_packages,
            allowed_endpoint_hosts=self.endpoint_hosts,
            endpoint_timeout=self.endpoint_timeout,
            rubrics=RubricStore(self.rubric_dir),
            sandbox_settings=SandboxSettings(remote_url=self.sandbox_url),
            rubric_judge=rubric_judge_from_env(self.database_url),
        )


class SigningKeyError(RuntimeError):
    """The signing key is missing or unreadable (the message never holds key material)."""


def _keystore_password(settings: VerificationSettings) -> str:
    given, path = settings.verification_keystore_password, settings.verification_keystore_password_file
    if given is not None and path is not None:
        raise SigningKeyError("set one of verification_keystore_password and verification_keystore_password_file")
    if path is not None:
        from runtime.config_file import read_secret_file

        try:
            return read_secret_file(path, "verification_keystore_password_file")
        except OSError as exc:
            raise SigningKeyError(f"cannot read verification_keystore_password_file: {exc.strerror}") from None
        except ValueError as exc:
            raise SigningKeyError(str(exc)) from None
    if given is None:
        raise SigningKeyError("verification_keystore is set but its password is not")
    return given.get_secret_value()


def load_signing_key(settings: VerificationSettings) -> str:
    """The signing key as 0x hex, from the keystore (preferred) or the raw setting."""
    if settings.verification_keystore is not None:
        password = _keystore_password(settings)
        register_secret(password)
        try:
            keystore = settings.verification_keystore.read_text(encoding="utf-8")
            key = "0x" + bytes(Account.decrypt(keystore, password)).hex()
        except (OSError, ValueError) as exc:
            raise SigningKeyError(f"cannot decrypt {settings.verification_keystore}: {type(exc).__name__}") from None
    elif settings.verification_signing_key is not None:
        key = settings.verification_signing_key.get_secret_value().strip()
    else:
        raise SigningKeyError("set verification_keystore (+ password) or verification_signing_key")
    register_secret(key)
    try:
        Account.from_key(key)
    except Exception:
        raise SigningKeyError("the signing key is not a valid secp256k1 private key") from None
    return key


class RetryScheduler:
    """Queues a retry message for every finalize whose backoff is over."""

    def __init__(self, database_url: str, requests_topic: str, *, poll_seconds: float = 1.0) -> None:
        self._database_url = database_url
        self._requests_topic = requests_topic
        self._poll_seconds = poll_seconds

    async def run_once(self, conn: Any) -> int:
        """Queue the due retries; return how many."""
        async with conn.transaction():
            rows = await store.claim_due_retries(conn)
            messages = [
                request_message(
                    RetryDue(
                        request_id=f"retry:{row['request_id']}:{row['retry_count']}",
                        chain_id=row["chain_id"],
                        escrow_address=row["escrow_address"],
                        task_id=int(row["task_id"]),
                        attempt=row["attempt"],
                        evidence_hash=row["evidence_hash"],
                        actor=row["actor"],
                        requested_at=int(time.time()),
                        target_request_id=row["request_id"],
                        retry_count=row["retry_count"],
                    ),
                    self._requests_topic,
                )
                for row in rows
            ]
            await enqueue(conn, messages)
        return len(messages)

    async def run(self) -> None:
        """Poll for due retries until cancelled; reconnect after database failures."""
        while True:
            try:
                conn = await connect(self._database_url)
                try:
                    while True:
                        queued = await self.run_once(conn)
                        if queued:
                            log.info("verification_retries_queued", count=queued)
                        await asyncio.sleep(self._poll_seconds)
                finally:
                    with contextlib.suppress(Exception):
                        await conn.close(timeout=2)
            except Exception as exc:
                # The database going away in any shape (a dropped session, a restart, a
                # shutdown: asyncpg's errors are not OSError) is waited out; anything else ends it.
                if not is_connection_error(exc):
                    raise
                log.warning("retry_scheduler_reconnect", error=type(exc).__name__)
                await asyncio.sleep(1.0)


def _metrics_at_start() -> None:
    """The verdict and verifier-error series at 0 (see `runtime.metrics`)."""
    from typing import get_args

    from runtime.metrics import at_zero
    from schemas.task_terms import VerifierKind
    from verification.consumer import VERDICTS, VERIFIER_ERRORS
    from verification.judging_stage import metrics_at_start as judging_metrics_at_start
    from verification.routing import Mode, Source

    at_zero(VERDICTS, get_args(Mode), get_args(Source), ("passed", "failed"))
    judging_metrics_at_start()
    at_zero(VERIFIER_ERRORS, get_args(VerifierKind))


async def open_verification_signer(settings: VerificationSettings) -> Signer:
    """The verification key's signer (`verification_signer`), its address derived once and
    checked against the configured one; SignerError when it cannot answer (fail closed)."""
    signer = await open_signer(
        settings.verification_signer, "verification", lambda: SecretKey.from_hex(load_signing_key(settings))
    )
    log.info("verification_signer_ready", kind=signer.kind, address=signer.address)
    return signer


def build_handler(
    settings: VerificationSettings,
    *,
    signing_key: str | None = None,
    signer: Signer | None = None,
    registry: VerifierRegistry | None = None,
) -> VerificationHandler:
    """The handler the consumer and the judging stage share: `signer` (from
    `open_verification_signer`), else the keystore key `signing_key` or the settings' own."""
    signing = VerdictSigning(signer) if signer is not None else VerdictSigning.from_key(signing_key or load_signing_key(settings))
    trusted = frozenset(settings.trusted_api_signers)
    if signing.address in trusted:
        # One key must not both vouch for requests and sign the verdicts they lead to.
        raise SigningKeyError("trusted_api_signers must not hold the verdict-signing key's address")
    return VerificationHandler(
        trusted_api_signers=trusted,
        registry=registry or settings.registry(),
        signing=signing,
        topics=settings.topics(),
        retry_policy=RetryPolicy(settings.retry_base_seconds, settings.retry_max_seconds),
    )


def build_judging_pool(settings: VerificationSettings, handler: VerificationHandler) -> JudgingPool:
    """The judging stage over `handler` (`verification.judging_stage`), ready to `run()`."""
    limits = JudgingLimits(
        concurrency=settings.judging_concurrency,
        per_verifier=settings.judging_per_verifier,
        lease_seconds=settings.judging_lease_seconds,
        max_errors=settings.judging_max_errors,
        error_backoff_seconds=settings.judging_error_backoff_seconds,
        error_backoff_max_seconds=settings.judging_error_backoff_max_seconds,
    )
    return JudgingPool(settings.database_url, handler, limits)


def build_consumer(settings: VerificationSettings, handler: VerificationHandler) -> IdempotentConsumer:
    """The verification consumer over `handler` (`build_handler`), ready to `run()` (its
    judgements need a `build_judging_pool` over the same handler running)."""
    t = settings.topics()
    return IdempotentConsumer(
        name=settings.verification_group,
        topics=[t.events, t.requests],
        bootstrap=settings.kafka_bootstrap,
        database_url=settings.database_url,
        handler=handler,
        dlq_topic=t.dead_letters,
        max_records=settings.max_records,
        session_timeout_ms=settings.kafka_session_timeout_ms,
    )


async def run_verification_consumer(settings: VerificationSettings, stop: asyncio.Event | None = None) -> None:
    """Run the verification service until `stop` is set, then drain (see the module docstring).

    On `stop` the consumer finishes its batch, clears its mark, commits and leaves its group
    before the publisher and the scheduler end; cancelled, it hands its batch back.
    """
    from runtime.shell import wait_stopped

    stop = stop or asyncio.Event()
    signer = await open_verification_signer(settings)
    _metrics_at_start()
    if settings.metrics_port is not None:
        from runtime.health import start_server

        start_server(settings.metrics_port)
    await migrate_url(settings.database_url)
    t = settings.topics()
    await ensure_topics(
        settings.kafka_bootstrap,
        [
            TopicSpec(t.events, settings.topic_partitions),
            TopicSpec(t.requests, settings.topic_partitions),
            TopicSpec(t.verdicts, settings.topic_partitions),
            TopicSpec(t.dead_letters, 1),
        ],
    )
    registry = settings.registry()
    handler = build_handler(settings, signer=signer, registry=registry)
    consumer = build_consumer(settings, handler)
    judging = build_judging_pool(settings, handler)
    scheduler = RetryScheduler(settings.database_url, t.requests, poll_seconds=settings.retry_poll_seconds)
    producer = make_producer(settings.kafka_bootstrap, client_id="escrowd-verification")
    publisher: OutboxPublisher | None = None
    publishing: asyncio.Task[None] | None = None
    scheduling: asyncio.Task[None] | None = None
    consuming: asyncio.Task[None] | None = None
    judgements: asyncio.Task[None] | None = None
    try:
        if settings.run_publisher:
            await producer.start()
            publisher = OutboxPublisher(settings.database_url, producer)
            publishing = asyncio.create_task(publisher.run(), name="outbox-publisher")
        scheduling = asyncio.create_task(scheduler.run(), name="retry-scheduler")
        consuming = asyncio.create_task(consumer.run(), name="verification-consumer")
        judgements = asyncio.create_task(judging.run(), name="verification-judging")
        log.info("verification_service_started", group=settings.verification_group)
        await wait_stopped(stop, *(t for t in (publishing, scheduling, consuming, judgements) if t is not None))
        consumer.stop()
        judging.stop()  # claims no more; the judgements in flight commit
        await consuming  # the batch in flight ends and is committed, the mark cleared, the group left
        await judgements
    finally:
        # Cancelled (the drain was cut short): the consumer hands its batch back first, the
        # judging stage its leases.
        consumer.stop()
        judging.stop()
        for task in (consuming, judgements, scheduling):
            if task is not None and not task.done():
                task.cancel()
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if publisher is not None and publishing is not None:
            publisher.stop()  # ends after the row it is sending: the verdicts just committed go out
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(publishing, 10)
        if settings.run_publisher:
            with contextlib.suppress(Exception):
                await producer.stop()
        await registry.close()
        await signer.aclose()
