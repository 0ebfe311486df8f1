"""The whole pipeline in one process, for `escrowd run`: every service as an asyncio task.

In production each service runs as its own process (`escrowd index run`, `escrowd relay
run`, …) against shared PostgreSQL and Kafka; here they share one event loop, which is
enough for a laptop and proves the wiring end to end.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import structlog
from prometheus_client import start_http_server

from chain import indexed
from escrowd import pipeline_parts
from escrowd.pipeline_config import Component, PipelineConfig
from indexer.config import ChainConfig
from indexer.service import ChainIndexer
from runtime.db import connect, migrate_url
from runtime.kafka import ensure_topics, make_producer
from runtime.outbox import OutboxPublisher
from schemas.topics import ESCROW_EVENTS, all_topics

__all__ = ["Component", "Pipeline", "PipelineConfig"]

log = structlog.get_logger(__name__)

STOP_ORDER = (
    "api",
    "verification-consumer",
    "verification-judging",
    "verification-retries",
    "escrowd-lifecycle",
    "escrowd-reputation",
    "relayer",
    "outbox-publisher",
    "indexer",
)
"""Components stop in this order (any other first): downstream before upstream."""

STOP_GRACE_SECONDS = 10.0


@dataclass
class Pipeline:
    """Starts and stops every service of the pipeline."""

    config: PipelineConfig
    components: list[Component] = field(default_factory=list)
    stop_event: asyncio.Event = field(default_factory=asyncio.Event)
    _producer: Any = None
    _conn: asyncpg.Connection | None = None

    async def start(self) -> None:
        """Migrate, create topics, start every component."""
        cfg = self.config
        await migrate_url(cfg.database_url)
        await ensure_topics(cfg.kafka_bootstrap, all_topics())
        start_http_server(cfg.metrics_port, addr="127.0.0.1")
        dn = cfg.devnet
        chain = ChainConfig(
            chain_id=dn.chain_id,
            name="devnet",
            rpc_urls=[dn.rpc_url],
            ws_url=dn.ws_url,
            escrow_addresses=[dn.escrow_address],
            start_block=dn.deploy_block,
            confirmations=cfg.confirmations,
            finality_depth=64,
            poll_interval=0.5,
        )
        indexer = ChainIndexer(chain, database_url=cfg.database_url, topic=ESCROW_EVENTS)
        indexer_stop = asyncio.Event()
        self.components.append(
            Component("indexer", lambda: indexer.run(indexer_stop), indexer_stop.set)
        )
        self._producer = make_producer(cfg.kafka_bootstrap, client_id="escrowd-run")
        await self._producer.start()
        publisher = OutboxPublisher(cfg.database_url, self._producer)
        self.components.append(Component("outbox-publisher", publisher.run, publisher.stop))
        for extra in await self._optional_components():
            self.components.append(extra)
        for component in self.components:
            component.task = asyncio.create_task(self._guard(component), name=component.name)
        self._conn = await connect(cfg.database_url)

    async def _optional_components(self) -> list[Component]:
        return await pipeline_parts.components(self.config, self.stop_event)

    async def _guard(self, component: Component) -> None:
        try:
            await component.run()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("component_crashed", component=component.name)
            raise

    async def _stop_one(self, component: Component) -> None:
        task = component.task
        if task is None or task.done():
            return
        if component.stop is None:
            task.cancel()
        else:
            with contextlib.suppress(Exception):
                component.stop()
        try:
            await asyncio.wait_for(asyncio.shield(task), STOP_GRACE_SECONDS)
        except TimeoutError:
            log.warning("component_stop_timeout", component=component.name)
            task.cancel()
        except BaseException:  # its own error or cancellation: it has stopped either way
            pass
        with contextlib.suppress(BaseException):
            await task
        log.info("component_stopped", component=component.name)

    def failed(self) -> list[str]:
        """Components that stopped with an error."""
        return [
            c.name
            for c in self.components
            if c.task is not None and c.task.done() and not c.task.cancelled() and c.task.exception()
        ]

    async def stop(self) -> None:
        """Stop the components one by one, downstream first, then the producer.

        The API stops taking requests, the consumers finish their batch, the relayer stops
        sending, the publisher and then the indexer stop last: nothing upstream is cut off
        while a downstream part still needs it.
        """
        order = {name: i for i, name in enumerate(STOP_ORDER)}
        for component in sorted(self.components, key=lambda c: order.get(c.name, -1)):
            await self._stop_one(component)
        self.stop_event.set()
        if self._producer is not None:
            with contextlib.suppress(Exception):
                await self._producer.stop()
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()

    async def snapshot(self) -> dict[str, Any]:
        """Numbers for the progress display."""
        assert self._conn is not None
        indexing = await indexed.progress(self._conn)
        pending = await self._conn.fetchval(
            "SELECT (SELECT count(*) FROM outbox WHERE published_at IS NULL)"
            " + (SELECT count(*) FROM event_log_messages WHERE state <> 'published')"
        )
        # Tasks by state as the lifecycle consumer holds them (what subscribers see).
        statuses = await self._conn.fetch("SELECT status, count(*) AS n FROM task_states GROUP BY status ORDER BY status")
        relayed = await self._conn.fetchval("SELECT count(*) FROM settlement_verdicts WHERE status = 'confirmed'")
        return {
            **indexing,
            "outbox_pending": pending,
            "verdicts_relayed": relayed,
            "tasks_by_status": {r["status"]: r["n"] for r in statuses},
        }

    @property
    def conn(self) -> asyncpg.Connection:
        """The pipeline's own database connection (for progress and checks)."""
        assert self._conn is not None, "pipeline not started"
        return self._conn

    async def wait_indexed(self, block: int, timeout: float = 60.0) -> None:  # noqa: ASYNC109
        """Until the indexer's cursor reaches `block` and the outbox is drained."""
        assert self._conn is not None
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            at = await indexed.highest_cursor(self._conn)
            pending = await self._conn.fetchval(
                "SELECT (SELECT count(*) FROM outbox WHERE published_at IS NULL)"
                " + (SELECT count(*) FROM event_log_messages WHERE state <> 'published')"
            )
            if at >= block and pending == 0:
                return
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"indexer at {at} (want {block}), {pending} unpublished")
            await asyncio.sleep(0.1)

    async def indexed_event_ids(self) -> set[tuple[int, int]]:
        """(block number, log index) of every stored event."""
        assert self._conn is not None
        return await indexed.positions(self._conn)
