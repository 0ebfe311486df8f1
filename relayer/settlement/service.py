"""`run_relayer(settings)`: wires the key, the database, Kafka, the chains and the HTTP port.

Tasks of one relayer process:
- the verdict consumer (`VerdictConsumer`, the shared runtime with a batch fast path, +
  `VerdictHandler`);
- an admission loop for verdicts waiting for their attempt to be indexed (woken by the
  indexer's outbox notifications, and every poll interval);
- one `ChainSender` per chain (woken by `escrowd_settlement` notifications);
- the `HealthMonitor`, which opens and closes each chain's send gate;
- `/health/bridge` and `/metrics` on `relayer_port` (when set).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from datetime import timedelta
from typing import Any

import asyncpg
import structlog
import uvicorn
from fastapi import FastAPI

from chain.eth_rpc import EthRpc
from chain.keys import SecretKey, load_key
from chain.signers import Signer, open_signer
from relayer.settlement import store
from relayer.settlement.config import RelayerSettings
from relayer.settlement.consumer import (
    VerdictConsumer,
    VerdictHandler,
)
from relayer.settlement.crash import CrashPoints
from relayer.settlement.health import (
    BridgeHealth,
    BridgeHealthChecker,
    HealthMonitor,
    Publish,
    publish_report,
)
from relayer.settlement.routes import metrics_router, router
from relayer.settlement.sender import ChainSender, SenderOptions, SendGate
from runtime.aio import wait_event
from runtime.db import connect, create_pool, is_connection_error, migrate_url
from runtime.heap import freeze_startup
from runtime.kafka import TopicSpec, ensure_topics
from runtime.outbox import NOTIFY_CHANNEL as OUTBOX_CHANNEL
from runtime.web.probes import router as probes_router
from runtime.web.server import QuietServer

log = structlog.get_logger(__name__)


def load_relayer_key(settings: RelayerSettings) -> SecretKey:
    """The relayer key from the configured source."""
    return load_key(
        raw_key=settings.relayer_key.get_secret_value() if settings.relayer_key else None,
        keystore=settings.relayer_keystore,
        password=(
            settings.relayer_keystore_password.get_secret_value() if settings.relayer_keystore_password else None
        ),
        password_file=settings.relayer_keystore_password_file,
    )


def build_app(monitor: HealthMonitor) -> FastAPI:
    """The relayer's own HTTP app: /health/bridge, /metrics, /healthz and /readyz."""
    app = FastAPI(title="escrowd relayer", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.bridge_health = monitor
    app.include_router(router)
    app.include_router(metrics_router)
    app.include_router(probes_router)
    return app


class Relayer:
    """The running parts, exposed for tests and the benchmark."""

    def __init__(self, settings: RelayerSettings, key: Signer | SecretKey) -> None:
        self.settings = settings
        self.key = key
        self.gates = {c.chain_id: SendGate() for c in settings.chains}
        self.rpcs = {
            c.chain_id: EthRpc(c.rpc_urls, chain_id=c.chain_id, timeout=c.rpc_timeout) for c in settings.chains
        }
        self.senders: dict[int, ChainSender] = {}
        self.monitor: HealthMonitor | None = None
        self.consumer: VerdictConsumer | None = None
        self.handler = VerdictHandler(
            consumer_name=settings.relayer_consumer_group,
            trusted_signers=frozenset(settings.relayer_trusted_signers),
            served={c.chain_id: frozenset(c.escrow_addresses) for c in settings.chains},
            wait_limit=timedelta(seconds=settings.relayer_evidence_wait_seconds),
        )
        self.server: uvicorn.Server | None = None
        self._admit = asyncio.Event()

    async def run(self) -> None:
        """Run until cancelled."""
        s = self.settings
        await migrate_url(s.database_url)
        pool = await create_pool(s.database_url, min_size=2, max_size=4 + 2 * len(s.chains))
        try:
            await ensure_topics(s.kafka_bootstrap, [TopicSpec(s.verdicts_topic), TopicSpec(s.dlq_topic, 1)])
            checker = BridgeHealthChecker(
                chains=s.chains, rpcs=self.rpcs, pool=pool, relayer_address=self.key.address, gates=self.gates,
                indexer_stale_after=s.relayer_indexer_stale_seconds,
                gas_per_send=s.relayer_gas_limit,
            )
            self.monitor = HealthMonitor(
                checker, self.gates, interval=s.relayer_poll_interval, publish=self._publisher(pool)
            )
            crash = CrashPoints(s.relayer_fault_injection)
            options = SenderOptions(
                policy=s.fee_policy(),
                gas_limit=s.relayer_gas_limit,
                max_in_flight=s.relayer_max_in_flight,
                batch_size=s.relayer_batch_size,
                broadcast_concurrency=s.relayer_broadcast_concurrency,
                replace_after=s.relayer_replace_after_seconds,
                watch_blocks=s.relayer_reorg_watch_blocks,
                # Reorgs announce themselves through new heads; the periodic receipt
                # re-read is a backstop for silent rollbacks and need not be frequent.
                recheck_interval=max(s.relayer_poll_interval, 5.0),
                track_interval=s.relayer_track_interval,
                simulate=s.relayer_preflight_simulation,
                settle_batch=s.relayer_settle_batch_size,
                settle_batch_min=s.relayer_settle_batch_min,
                revert_reason_patience=s.relayer_revert_reason_patience_seconds,
            )
            for chain in s.chains:
                self.senders[chain.chain_id] = ChainSender(
                    chain=chain,
                    key=self.key,
                    rpc=self.rpcs[chain.chain_id],
                    pool=pool,
                    gate=self.gates[chain.chain_id],
                    # The send policy: this chain's configured escrows, nothing else is signed.
                    options=replace(options, allowed_to=frozenset(e.lower() for e in chain.escrow_addresses)),
                    crash=crash,
                    on_key_refused=self.monitor.request_check,
                )
            self.consumer = VerdictConsumer(
                name=s.relayer_consumer_group,
                topics=[s.verdicts_topic],
                bootstrap=s.kafka_bootstrap,
                database_url=s.database_url,
                handler=self.handler,
                dlq_topic=s.dlq_topic,
                session_timeout_ms=s.relayer_kafka_session_timeout_ms,
                max_records=s.relayer_consumer_max_records,
                commit_chunk=s.relayer_consumer_commit_verdicts,
                fetch_max_wait_ms=s.relayer_consumer_fetch_max_wait_ms,
                # Verdicts are signed and only stored here; the relayer is killed at random
                # instants by design (kill -9 tests, crash points): a death in a handler is
                # far likelier to be one of those than a poison verdict, so it takes two.
                poison_after_deaths=2,
                assignment=s.relayer_consumer_assignment,
                on_queued=self._on_queued,
            )
            # One full collection over everything start-up made paused a 300-verdict burst for
            # ~100 ms in bench_relayer (whose process also holds the devnet's objects).
            freeze_startup()
            log.info(
                "relayer_starting",
                address=self.key.address,
                chains=[c.chain_id for c in s.chains],
                trusted_signers=len(s.relayer_trusted_signers),
                fault_injection=crash.enabled,
            )
            async with asyncio.TaskGroup() as group:
                group.create_task(self.monitor.run())
                for sender in self.senders.values():
                    group.create_task(sender.run())
                group.create_task(self._listen(s.database_url))
                group.create_task(self._admission_loop(pool))
                group.create_task(self.consumer.run())
                if s.relayer_port is not None:
                    group.create_task(self._serve(build_app(self.monitor)))
        finally:
            if self.consumer is not None:
                self.consumer.stop()
            for rpc in self.rpcs.values():
                with contextlib.suppress(Exception):
                    await rpc.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(pool.close(), 5)

    def _publisher(self, pool: asyncpg.Pool) -> Publish:
        """Each check's report into `bridge_health`, for the API's `/health/bridge`."""
        # A report is stale after three missed checks (the floor covers a slow check on a busy host).
        stale_after = max(3 * self.settings.relayer_poll_interval, 15.0)

        async def publish(report: BridgeHealth) -> None:
            await publish_report(pool, report, stale_after=stale_after)

        return publish

    async def _serve(self, app: FastAPI) -> None:
        config = uvicorn.Config(
            app,
            host=self.settings.relayer_host,
            port=self.settings.relayer_port or 0,
            log_config=None,
            access_log=False,
            lifespan="off",
        )
        self.server = QuietServer(config)
        await self.server.serve()

    def _on_queued(self, chain_id: int, count: int) -> None:
        sender = self.senders.get(chain_id)
        if sender is not None:
            sender.queued(count)

    def _on_notify(self, _conn: Any, _pid: int, channel: str, payload: str) -> None:
        if channel == store.NOTIFY_CHANNEL:
            with contextlib.suppress(ValueError):
                sender = self.senders.get(int(payload))
                if sender is not None:
                    sender.wake()
        else:
            self._admit.set()

    async def _listen(self, database_url: str) -> None:
        # Notifications only shorten waits: every loop also polls, so a lost one costs latency.
        while True:
            conn: asyncpg.Connection | None = None
            try:
                conn = await connect(database_url)
                closed = asyncio.Event()
                conn.add_termination_listener(lambda _conn, done=closed: done.set())
                await conn.add_listener(store.NOTIFY_CHANNEL, self._on_notify)
                await conn.add_listener(OUTBOX_CHANNEL, self._on_notify)
                await closed.wait()
            except Exception as exc:
                if not is_connection_error(exc):
                    raise
                log.warning("notify_listener_retry", error=type(exc).__name__)
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close(timeout=2)
            await asyncio.sleep(1.0)

    async def _admission_loop(self, pool: asyncpg.Pool) -> None:
        interval = min(self.settings.relayer_poll_interval, 5.0)
        while True:
            await wait_event(self._admit, interval)  # not wait_for: see runtime/aio.py
            self._admit.clear()
            try:
                async with pool.acquire() as conn:
                    await self.handler.admit_waiting(conn)
            except Exception as exc:
                if not is_connection_error(exc):
                    raise
                log.warning("admission_retry", error=type(exc).__name__)


async def run_relayer(settings: RelayerSettings) -> None:
    """Open the key's signer (its address derived once, here) and run the relayer until
    cancelled. SignerError or KeyLoadError when the key cannot be had: no fallback."""
    signer = await open_signer(settings.relayer_signer, "relayer", lambda: load_relayer_key(settings))
    log.info("relayer_signer_ready", kind=signer.kind, address=signer.address)
    try:
        await Relayer(settings, signer).run()
    finally:
        await signer.aclose()
