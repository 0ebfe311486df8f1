"""Fixtures for the settlement relayer tests: a devnet per test, the real indexer, the relayer.

The chain: a fresh anvil per test (`runtime.services.anvil.AnvilProcess`) with the escrow
deployed by `escrowd.devnet`. The indexed state the relayer re-reads (`escrow_events`) is
written by the real indexer (`indexer.service.ChainIndexer`) running in the test's event
loop, exactly as in production. The relayer runs either in-process (`RelayerRun`, for
tests that inspect it) or as a subprocess (the kill -9 test).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest
import pytest_asyncio
from aiokafka import AIOKafkaProducer

from chain.keys import SecretKey
from escrowd.devnet import Actor, Devnet, deploy_devnet, text_hash
from relayer.settlement.config import ChainSettings, RelayerSettings
from relayer.settlement.service import Relayer
from runtime.kafka import encode_headers
from runtime.services.anvil import AnvilProcess
from runtime.services.ports import free_port
from schemas.verdict import (
    SignedVerdict,
    Verdict,
    sign_verdict,
    verdict_headers,
    verdict_key,
    verdict_payload,
)


@pytest.fixture
def anvil() -> Iterator[AnvilProcess]:
    """A fresh anvil for one test (automine slows as the chain grows)."""
    process = AnvilProcess()
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def devnet(anvil: AnvilProcess) -> Devnet:
    """The escrow and token deployed on the test's anvil."""
    return deploy_devnet(anvil.rpc_url, ws_url=anvil.ws_url, posters=2, agents=3, spare=3)


@pytest.fixture
def service_signer(devnet: Devnet) -> Actor:
    """The registered verification service's key (a spare devnet account)."""
    return devnet.spare[0]


@pytest.fixture
def rogue_signer(devnet: Devnet) -> Actor:
    """A key nobody registered."""
    return devnet.spare[1]


@dataclass(frozen=True)
class Submitted:
    """A task with evidence submitted: what a verdict must name."""

    task_id: int
    attempt: int
    evidence_hash: str


def submit_tasks(devnet: Devnet, count: int, *, prefix: str = "r") -> list[Submitted]:
    """Post, accept and submit evidence for `count` marketplace-verified tasks."""
    out = []
    for i in range(count):
        poster = devnet.posters[i % len(devnet.posters)]
        agent = devnet.agents[i % len(devnet.agents)]
        task_id = devnet.post_task(poster)
        devnet.accept_task(task_id, sender=agent)
        evidence = text_hash(f"{prefix}:{task_id}:{i}")
        devnet.submit_evidence(task_id, evidence, sender=agent)
        out.append(Submitted(task_id, 1, "0x" + evidence.hex()))
    return out


def make_verdict(
    devnet: Devnet, item: Submitted, *, passed: bool = True, score: int = 90, **changes: Any
) -> Verdict:
    """A verdict on `item` (fields overridable)."""
    fields: dict[str, Any] = {
        "chain_id": devnet.chain_id,
        "escrow": devnet.escrow_address,
        "task_id": item.task_id,
        "attempt": item.attempt,
        "evidence_hash": item.evidence_hash,
        "passed": passed,
        "score": score,
        "reasons": ["all checks passed"] if passed else ["missing section"],
        "verifier_kind": "auto-check",
        "mode": "auto",
        "issued_at": datetime.now(UTC),
    }
    fields.update(changes)
    return Verdict(**fields)


def signed_verdicts(devnet: Devnet, items: Sequence[Submitted], signer: Actor) -> list[SignedVerdict]:
    """Verdicts on `items`, alternately passed and failed, signed by `signer`."""
    return [
        sign_verdict(make_verdict(devnet, item, passed=i % 3 != 2, score=60 + i % 40), signer.private_key)
        for i, item in enumerate(items)
    ]


async def publish(bootstrap: str, topic: str, verdicts: Sequence[SignedVerdict], **header_overrides: str) -> None:
    """Publish signed verdicts the way the verification service does (awaited)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, linger_ms=1)
    await producer.start()
    try:
        futures = []
        for signed in verdicts:
            headers = {**verdict_headers(signed), **header_overrides}
            futures.append(
                await producer.send(
                    topic, value=verdict_payload(signed), key=verdict_key(signed.verdict), headers=encode_headers(headers)
                )
            )
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def publish_raw(bootstrap: str, topic: str, value: bytes, headers: dict[str, str], key: bytes) -> None:
    """Publish one arbitrary message (for malformed-input tests)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False)
    await producer.start()
    try:
        await producer.send_and_wait(topic, value=value, key=key, headers=encode_headers(headers))
    finally:
        await producer.stop()


async def wait_until(
    predicate: Callable[[], Awaitable[bool]], *, timeout: float, interval: float = 0.1, what: str = "condition"
) -> float:
    """Poll `predicate` until true; returns the seconds it took (AssertionError on timeout)."""
    started = time.monotonic()
    while True:
        if await predicate():
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(interval)


async def fetch(database_url: str, query: str, *args: Any) -> list[asyncpg.Record]:
    """Run one query on a fresh connection."""
    conn = await asyncpg.connect(database_url)
    try:
        return list(await conn.fetch(query, *args))
    finally:
        await conn.close()


async def fetchval(database_url: str, query: str, *args: Any) -> Any:
    """One value from one query."""
    rows = await fetch(database_url, query, *args)
    return rows[0][0] if rows else None


async def verdict_statuses(database_url: str) -> dict[int, str]:
    """task id -> status of every accepted verdict."""
    rows = await fetch(database_url, "SELECT task_id, status FROM settlement_verdicts")
    return {int(r["task_id"]): r["status"] for r in rows}


# ---------------------------------------------------------------------------- indexer


class IndexerRun:
    """The real indexer, following the devnet in the test's event loop."""

    def __init__(self, devnet: Devnet, database_url: str, topic: str) -> None:
        from indexer.config import ChainConfig
        from indexer.service import ChainIndexer

        config = ChainConfig(
            chain_id=devnet.chain_id,
            rpc_urls=[devnet.rpc_url],
            ws_url=devnet.ws_url,
            escrow_addresses=[devnet.escrow_address],
            start_block=devnet.deploy_block,
            poll_interval=0.2,
        )
        self.devnet = devnet
        self.database_url = database_url
        self._indexer = ChainIndexer(config, database_url=database_url, topic=topic)
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Run in the background."""
        self._task = asyncio.create_task(self._indexer.run(self._stop))

    async def stop(self) -> None:
        """Stop and wait."""
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(self._task, 10)

    async def caught_up(self, timeout: float = 30.0) -> None:
        """Wait until the cursor reaches the chain's current head."""
        target = self.devnet.block_number()

        async def reached() -> bool:
            if self._task is not None and self._task.done():
                self._task.result()  # surface the indexer's exception
            cursor = await fetchval(
                self.database_url, "SELECT block_number FROM chain_cursor WHERE chain_id = $1", self.devnet.chain_id
            )
            return cursor is not None and cursor >= target

        await wait_until(reached, timeout=timeout, what=f"indexer at block {target}")


class LogIndexer:
    """Fallback when the real indexer cannot be imported (it is developed alongside): reads
    the escrow's logs with the devnet library's `logs()` and writes the `escrow_events` rows
    the relayer reads (same columns and argument encoding), plus the cursor. No reorg
    handling: the tests never reorg below the events the relayer checks."""

    def __init__(self, devnet: Devnet, database_url: str) -> None:
        self.devnet = devnet
        self.database_url = database_url
        self._next = devnet.deploy_block
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Follow the chain in the background."""
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Stop and wait."""
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(self._task, 10)

    async def _run(self) -> None:
        conn = await asyncpg.connect(self.database_url)
        try:
            while not self._stop.is_set():
                await self.sync(conn)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), 0.2)
        finally:
            await conn.close()

    async def sync(self, conn: asyncpg.Connection) -> None:
        """Index everything up to the current head."""
        import json

        head = self.devnet.block_number()
        if head < self._next:
            return
        blocks: dict[int, dict[str, Any]] = {}
        rows = []
        for event in self.devnet.logs(self._next, head):
            block = blocks.get(event.block_number) or self.devnet.rpc("eth_getBlockByNumber", hex(event.block_number), False)
            blocks[event.block_number] = block
            args = {k: "0x" + v.hex() if isinstance(v, bytes) else v for k, v in event.args.items()}
            task_id = args.get("taskId")
            rows.append(
                (
                    f"{self.devnet.chain_id}:{block['hash']}:{event.log_index}",
                    self.devnet.chain_id,
                    event.address,
                    event.block_number,
                    block["hash"],
                    int(block["timestamp"], 16),
                    event.tx_hash,
                    0,
                    event.log_index,
                    event.name,
                    task_id,
                    json.dumps(args),
                )
            )
        tip = self.devnet.rpc("eth_getBlockByNumber", hex(head), False)
        async with conn.transaction():
            await conn.executemany(
                "INSERT INTO escrow_events (event_id, chain_id, escrow_address, block_number, block_hash,"
                " block_timestamp, tx_hash, tx_index, log_index, event_name, task_id, args, position)"
                " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12::jsonb,"
                " (SELECT COALESCE(max(position), 0) + 1 FROM escrow_events WHERE chain_id = $2))"
                " ON CONFLICT DO NOTHING",
                rows,
            )
            await conn.execute(
                "INSERT INTO chain_cursor (chain_id, block_number, block_hash) VALUES ($1, $2, $3)"
                " ON CONFLICT (chain_id) DO UPDATE SET block_number = EXCLUDED.block_number,"
                " block_hash = EXCLUDED.block_hash",
                self.devnet.chain_id,
                head,
                tip["hash"],
            )
            await conn.execute("NOTIFY escrowd_outbox")
        self._next = head + 1

    async def caught_up(self, timeout: float = 30.0) -> None:
        """Index up to the current head now."""
        conn = await asyncpg.connect(self.database_url)
        try:
            await asyncio.wait_for(self.sync(conn), timeout)
        finally:
            await conn.close()


def _real_indexer_available() -> bool:
    try:
        import indexer.service  # noqa: F401
    except Exception:
        return False
    return True


@pytest_asyncio.fixture
async def indexer(devnet: Devnet, database_url: str, topic_prefix: str) -> AsyncIterator[IndexerRun | LogIndexer]:
    """The indexer following the test's devnet into the test's database.

    The real `indexer.service.ChainIndexer` when it imports; otherwise `LogIndexer`, so the
    relayer's tests do not depend on the state of a package being developed in parallel.
    Set `SETTLEMENT_TESTS_REAL_INDEXER=1` to insist on the real one.
    """
    run: IndexerRun | LogIndexer
    if _real_indexer_available():
        run = IndexerRun(devnet, database_url, f"{topic_prefix}escrow.events.v1")
    else:
        if os.environ.get("SETTLEMENT_TESTS_REAL_INDEXER") == "1":
            raise RuntimeError("the real indexer does not import")
        run = LogIndexer(devnet, database_url)
    await run.start()
    try:
        yield run
    finally:
        await run.stop()


# ---------------------------------------------------------------------------- relayer


def relayer_env(
    *,
    devnet: Devnet,
    database_url: str,
    kafka_bootstrap: str,
    topic_prefix: str,
    trusted: Sequence[str],
    port: int | None = None,
    confirmations: int = 1,
    rpc_url: str | None = None,
    **extra: Any,
) -> dict[str, str]:
    """The relayer's settings as environment variables (also used for the subprocess;
    `rpc_url`: another node than the devnet's, such as a fault proxy in front of it)."""
    import json

    chains = [
        {
            "chain_id": devnet.chain_id,
            "rpc_urls": [rpc_url or devnet.rpc_url],
            "ws_url": devnet.ws_url,
            "escrow_addresses": [devnet.escrow_address],
            "confirmations": confirmations,
        }
    ]
    env = {
        "ESCROWD_DATABASE_URL": database_url,
        "ESCROWD_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "ESCROWD_CHAINS": json.dumps(chains),
        "ESCROWD_VERDICTS_TOPIC": f"{topic_prefix}escrow.verdicts.v1",
        "ESCROWD_DLQ_TOPIC": f"{topic_prefix}escrow.dlq.v1",
        "ESCROWD_RELAYER_CONSUMER_GROUP": f"{topic_prefix}settlement",
        "ESCROWD_RELAYER_KAFKA_SESSION_TIMEOUT_MS": "6000",
        "ESCROWD_RELAYER_KEY": devnet.marketplace_verifier.private_key,
        "ESCROWD_RELAYER_TRUSTED_SIGNERS": ",".join(trusted),
        "ESCROWD_RELAYER_POLL_INTERVAL": "0.5",
        "ESCROWD_RELAYER_PORT": str(port if port is not None else free_port()),
        "ESCROWD_LOG_JSON": "true",
    }
    env.update({f"ESCROWD_{k.upper()}": str(v) for k, v in extra.items()})
    return env


@dataclass
class Relay:
    """What a relayer test runs against (the devnet, its database, broker, topics, indexer and
    the trusted verification signer), with the steps those tests repeat."""

    devnet: Devnet
    database_url: str
    kafka_bootstrap: str
    topic_prefix: str
    indexer: IndexerRun | LogIndexer
    service_signer: Actor

    def env(self, *, rpc_url: str | None = None, **extra: Any) -> dict[str, str]:
        """`relayer_env` for this test, trusting the service signer (`extra`: further settings)."""
        return relayer_env(
            devnet=self.devnet, database_url=self.database_url, kafka_bootstrap=self.kafka_bootstrap,
            topic_prefix=self.topic_prefix, trusted=[self.service_signer.address], rpc_url=rpc_url, **extra,
        )  # fmt: skip

    async def submitted(self, count: int, *, prefix: str = "r", timeout: float = 30.0) -> list[Submitted]:
        """`count` tasks with submitted evidence, indexed."""
        items: list[Submitted] = await on_chain(submit_tasks, self.devnet, count, prefix=prefix)
        await self.indexer.caught_up(timeout=timeout)
        return items

    def signed(self, items: Sequence[Submitted]) -> list[SignedVerdict]:
        """The service signer's passing verdicts for `items`."""
        return signed_verdicts(self.devnet, items, self.service_signer)

    async def send_verdicts(self, env: dict[str, str], items: Sequence[Submitted]) -> None:
        """`signed(items)` on the verdicts topic of `env`."""
        await publish(self.kafka_bootstrap, env["ESCROWD_VERDICTS_TOPIC"], self.signed(items))

    async def start(self, *, rpc_url: str | None = None, **extra: Any) -> tuple[RelayerRun, dict[str, str]]:
        """A relayer on `env(**extra)`, started in the test's event loop (stop it), and that env."""
        env = self.env(rpc_url=rpc_url, **extra)
        run = RelayerRun(settings_from_env(env))
        await run.start()
        return run, env

    async def all_confirmed(self, run: RelayerRun, items: Sequence[Submitted]) -> bool:
        """Mine a block; whether every verdict of `items` is confirmed (the relayer still running)."""
        run.check_alive()
        await on_chain(self.devnet.mine)
        statuses = await verdict_statuses(self.database_url)
        return len(statuses) == len(items) and set(statuses.values()) == {"confirmed"}

    async def all_sent(self, run: RelayerRun, items: Sequence[Submitted]) -> bool:
        """Whether every verdict of `items` is signed and in the pool (the relayer still running)."""
        run.check_alive()
        statuses = await verdict_statuses(self.database_url)
        return len(statuses) == len(items) and set(statuses.values()) == {"sent"}

    async def dispute_ahead(self, task_id: int, poster: Actor) -> None:
        """The poster disputes the task with a tip above the relayer's, mined in the next block
        (automine off before, back on after): the verdict for it reverts."""
        await on_chain(
            self.devnet.rpc,
            "eth_sendTransaction",
            {
                "from": poster.address,
                "to": self.devnet.escrow_address,
                "data": self.devnet._codec.encode_call("raiseDispute", [task_id]),
                "gas": hex(300_000),
                "maxPriorityFeePerGas": hex(200 * 10**9),
                "maxFeePerGas": hex(400 * 10**9),
            },
        )
        await on_chain(self.devnet.rpc, "evm_mine")
        await on_chain(self.devnet.rpc, "evm_setAutomine", True)


@pytest.fixture
def relay(
    devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str, indexer: IndexerRun | LogIndexer,
    service_signer: Actor,
) -> Relay:
    """The relayer test's surroundings (`Relay`)."""
    return Relay(devnet, database_url, kafka_bootstrap, topic_prefix, indexer, service_signer)


def settings_from_env(env: dict[str, str]) -> RelayerSettings:
    """Parse `relayer_env` output exactly as the CLI would (without touching os.environ)."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return RelayerSettings.load()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class RelayerRun:
    """The relayer running in the test's event loop."""

    def __init__(self, settings: RelayerSettings) -> None:
        assert settings.relayer_key is not None
        self.settings = settings
        self.key = SecretKey.from_hex(settings.relayer_key.get_secret_value())
        self.relayer = Relayer(settings, self.key)
        self._task: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        """The HTTP port of /health/bridge and /metrics."""
        assert self.settings.relayer_port is not None
        return self.settings.relayer_port

    async def start(self) -> None:
        """Start, and wait until every sender reconciled with its chain."""
        self._task = asyncio.create_task(self.relayer.run())

        async def started() -> bool:
            if self._task is not None and self._task.done():
                self._task.result()
            return bool(self.relayer.senders) and all(s.started.is_set() for s in self.relayer.senders.values())

        await wait_until(started, timeout=30, what="relayer start")

    def check_alive(self) -> None:
        """Raise the relayer's exception if it died."""
        if self._task is not None and self._task.done():
            self._task.result()

    async def stop(self) -> None:
        """Cancel and wait."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(self._task, 10)


def chain_chain_settings(devnet: Devnet) -> ChainSettings:
    """The relayer's view of the test chain."""
    return ChainSettings(
        chain_id=devnet.chain_id,
        rpc_urls=[devnet.rpc_url],
        ws_url=devnet.ws_url,
        escrow_addresses=[devnet.escrow_address],
    )


def verdict_events(devnet: Devnet) -> dict[tuple[int, int], int]:
    """(task, attempt) -> number of VerificationCompleted events on the canonical chain."""
    counts: dict[tuple[int, int], int] = {}
    for event in devnet.logs():
        if event.name == "VerificationCompleted":
            key = (int(event["taskId"]), int(event["attempt"]))
            counts[key] = counts.get(key, 0) + 1
    return counts


async def on_chain(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a synchronous devnet call in a worker thread.

    The relayer and the indexer share the test's event loop; a blocking HTTP call to anvil
    from the loop would stall their WebSocket readers while anvil pushes notifications to
    them, and neither side would make progress.
    """
    return await asyncio.to_thread(fn, *args, **kwargs)
