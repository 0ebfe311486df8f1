"""Relayer throughput: verdicts relayed per second vs the raw rate of presigned transactions.

`python -m bench.bench_relayer [--verdicts N]` prints one JSON object.

On one fresh anvil (automine, as the devnet runs), in the same run:

- raw: N presigned `completeVerification` transactions from the verifier key, sent with
  16 requests in flight over one HTTP session, timed until the last one is mined (the
  account's mined count reaches the end). Measured twice, before and after the relayer,
  because anvil slows as the chain grows; the relayer's run sits between the two.
- relayer: N signed verdicts published to Kafka at once, timed from the first one on the
  broker until the chain shows every one of them settled (the escrow's
  `VerificationCompleted` logs, polled at the raw figure's rate: the raw figure's end point,
  the chain's count): consume, signature and indexed-state checks, idempotency row,
  simulation, signing, pipelined sends. `relayer_db_confirmed_verdicts_per_s` keeps the
  first end point, every verdict confirmed in the relayer's database (its receipts read by
  new heads and written), which the raw sends have no counterpart of. The consumer group
  is joined and warm before the clock starts (one warm-up verdict); the indexer indexes the
  tasks first and is then stopped, so the relayer is measured alone.

- raw_batched: the same, but sent as JSON-RPC batches of 16 (16 in flight), as the
  relayer itself sends; on anvil's automine this packs many more transactions per block.

- raw_settle_batch: the same verdicts presigned as `completeVerificationBatch` transactions
  of `--settle-batch` items each (JSON-RPC batches of 16, 16 in flight): what packing verdicts
  into one transaction gives on this chain, next to the single sends, with the gas per
  verdict of both (from the receipts, after the clock stops): the ceiling of a packing
  sender. The relayer packs by default (`relayer_settle_batch_size` 100, from 2 verdicts in a
  round); `--variant single:relayer_settle_batch_size=0` measures one transaction per verdict.

- restart: the relayer CLI as a subprocess relays one verdict, is killed with SIGKILL, a
  new verdict is published, and the relayer is started again: the figure is the time from
  the new start to that verdict being consumed (its row in `settlement_verdicts`), start-up
  included. Measured for both `relayer_consumer_assignment` modes: `group` (a Kafka consumer
  group, which must wait out the dead member's session) and `direct` (the default).

Targets: relayer >= 0.75 x raw, and (issue 26, packing on) > 1.0 x raw batched single sends
(`ratio_vs_raw_batched`). Both ratios are printed: see docs/relayer.md for why they differ
so much.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from typing import Any

import aiohttp
import asyncpg
import orjson

from bench.agent_send import agent_send_figure
from bench.services import on_services
from bench.verdict_publisher import encode_burst
from chain.abi import event_topic
from chain.fees import Fees
from chain.keys import SecretKey
from chain.txs import (
    complete_verification_batch_data,
    complete_verification_data,
    sign_eip1559,
)
from escrowd.devnet import Devnet, deploy_devnet, text_hash
from relayer.settlement.config import ChainSettings, RelayerSettings
from relayer.settlement.service import Relayer
from runtime.logging import configure_logging
from runtime.services.anvil import AnvilProcess
from runtime.services.ports import free_port
from schemas.verdict import Verdict, sign_verdict, verdict_headers, verdict_key, verdict_payload

POLL = 0.02  # both measurements poll for completion at the same rate
OVERRIDES: dict[str, Any] = {}  # relayer settings from --set name=value (experiments only)
RESTART_MODES = ["group", "direct"]  # --restart-modes
VARIANTS: dict[str, dict[str, Any]] = {"relayer": {}}  # --variant name:k=v,k=v (A/B in one run)
SETTLE_BATCH = [100]  # --settle-batch: items per completeVerificationBatch in raw_settle_batch (0: skip)
AGENT_VERDICTS = [30]  # --agent-verdicts: the verifier agent's send path figure (0: skip)
TASK_CHUNK = 600  # tasks per set-up batch: larger ones fill blocks and drive the base fee up until sends fail


def _encode(fn: str, types: list[str], args: list[Any]) -> str:
    from eth_abi.abi import encode

    from chain.txs import selector

    return "0x" + (selector(fn) + encode(types, args)).hex()


def _send_all(devnet: Devnet, txs: list[tuple[str, str]]) -> None:
    """eth_sendTransaction each (sender, calldata) to the escrow, then mine them all."""
    for sender, data in txs:
        devnet.rpc("eth_sendTransaction", {"from": sender, "to": devnet.escrow_address, "data": data, "gas": hex(1_000_000)})
    while int(devnet.rpc("txpool_status")["pending"], 16) > 0:
        devnet.mine()


def make_tasks(devnet: Devnet, count: int, tag: str) -> list[tuple[int, str]]:
    """`count` tasks with evidence submitted, built in three mined batches (a short chain:
    anvil mines slower as the chain grows, and the set-up must not skew the measurement)."""
    devnet.rpc("evm_setAutomine", False)
    try:
        first = devnet.task_count() + 1
        deadline = devnet.now() + 7 * 86_400
        posters = [devnet.posters[i % len(devnet.posters)].address for i in range(count)]
        _send_all(
            devnet,
            [
                (posters[i], _encode("createTask", ["bytes32", "uint256", "uint64"], [text_hash(f"{tag}:task:{i}"), 10**6, deadline]))
                for i in range(count)
            ],
        )
        ids = list(range(first, first + count))
        assert devnet.task_count() == first + count - 1, "some createTask failed"
        agents = [devnet.agents[i % len(devnet.agents)].address for i in range(count)]
        _send_all(devnet, [(agents[i], _encode("acceptTask", ["uint256"], [ids[i]])) for i in range(count)])
        evidence = [text_hash(f"{tag}:evidence:{i}") for i in range(count)]
        _send_all(
            devnet,
            [(agents[i], _encode("submitEvidence", ["uint256", "bytes32"], [ids[i], evidence[i]])) for i in range(count)],
        )
    finally:
        devnet.rpc("evm_setAutomine", True)
    for task_id in (ids[0], ids[-1]):
        assert devnet.get_task(task_id).attempts == 1, "set-up failed"
    return [(task_id, "0x" + e.hex()) for task_id, e in zip(ids, evidence, strict=True)]


GAS_USED: dict[str, list[float]] = {}  # kind -> gas per verdict of each raw run


async def raw_rate(
    devnet: Devnet, key: SecretKey, tasks: list[tuple[int, str]], *, batched: bool, settle_batch: int = 0
) -> float:
    """Verdicts per second of presigned sends: one `completeVerification` per transaction, or
    (`settle_batch` > 0) `completeVerificationBatch` transactions of that many items."""
    rpc = devnet.rpc_url
    start_nonce = int(devnet.rpc("eth_getTransactionCount", key.address, "latest"), 16)
    base = int(devnet.rpc("eth_getBlockByNumber", "latest", False)["baseFeePerGas"], 16)
    fees = Fees(max_fee_per_gas=4 * base + 10**9, max_priority_fee_per_gas=10**9)
    if settle_batch:
        groups = [tasks[i : i + settle_batch] for i in range(0, len(tasks), settle_batch)]
        payloads = [
            (complete_verification_batch_data([(t, 1, e, True, 90) for t, e in group]), 60_000 * len(group) + 100_000)
            for group in groups
        ]
    else:
        payloads = [(complete_verification_data(t, 1, e, True, 90), 300_000) for t, e in tasks]
    signed = [
        sign_eip1559(
            key,
            chain_id=devnet.chain_id,
            nonce=start_nonce + i,
            to=devnet.escrow_address,
            data=data,
            gas_limit=gas,
            fees=fees,
        )
        for i, (data, gas) in enumerate(payloads)
    ]
    raws = [tx.raw_hex for tx in signed]
    end_nonce = start_nonce + len(raws)
    async with aiohttp.ClientSession() as session:
        gate = asyncio.Semaphore(16)

        async def send(i: int, raw: str) -> None:
            async with gate:
                body = {"jsonrpc": "2.0", "id": i, "method": "eth_sendRawTransaction", "params": [raw]}
                async with session.post(rpc, json=body) as response:
                    reply = await response.json()
                    if "error" in reply:
                        raise RuntimeError(f"raw send refused: {reply['error']}")

        async def mined_count() -> int:
            body = {"jsonrpc": "2.0", "id": 0, "method": "eth_getTransactionCount", "params": [key.address, "latest"]}
            async with session.post(rpc, json=body) as response:
                return int((await response.json())["result"], 16)

        async def send_batch(i: int, chunk: list[str]) -> None:
            async with gate:
                body = [
                    {"jsonrpc": "2.0", "id": i + j, "method": "eth_sendRawTransaction", "params": [raw]}
                    for j, raw in enumerate(chunk)
                ]
                async with session.post(rpc, json=body) as response:
                    for reply in await response.json():
                        if "error" in reply:
                            raise RuntimeError(f"raw send refused: {reply['error']}")

        started = time.perf_counter()
        if batched:
            chunks = [raws[i : i + 16] for i in range(0, len(raws), 16)]
            await asyncio.gather(*(send_batch(16 * i, c) for i, c in enumerate(chunks)))
        else:
            await asyncio.gather(*(send(i, raw) for i, raw in enumerate(raws)))
        while await mined_count() < end_nonce:  # noqa: ASYNC110 -- polling the node is the measurement
            await asyncio.sleep(POLL)
        elapsed = time.perf_counter() - started
    receipts = [_receipt(devnet, tx.tx_hash) for tx in signed]
    assert all(int(r["status"], 16) == 1 for r in receipts), "a raw transaction reverted"
    judged = [devnet.is_judged(t, 1) for t, _ in (tasks[0], tasks[-1])]
    assert all(judged), "raw verdicts not settled"
    kind = f"settle_batch_{settle_batch}" if settle_batch else ("raw_batched" if batched else "raw")
    GAS_USED.setdefault(kind, []).append(sum(int(r["gasUsed"], 16) for r in receipts) / len(tasks))
    return len(tasks) / elapsed


def _receipt(devnet: Devnet, tx_hash: str) -> dict[str, Any]:
    """A mined transaction's receipt, after the clock stopped. Anvil may answer the mined
    count before the receipt is readable (seen under load: a None receipt failed the run)."""
    for _ in range(100):
        receipt = devnet.rpc("eth_getTransactionReceipt", tx_hash)
        if receipt is not None:
            return dict(receipt)
        time.sleep(0.05)
    raise RuntimeError(f"no receipt for {tx_hash}")


async def index(devnet: Devnet, database_url: str) -> None:
    from indexer.config import ChainConfig
    from indexer.service import ChainIndexer

    config = ChainConfig(
        chain_id=devnet.chain_id,
        rpc_urls=[devnet.rpc_url],
        ws_url=devnet.ws_url,
        escrow_addresses=[devnet.escrow_address],
        start_block=devnet.deploy_block,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(ChainIndexer(config, database_url=database_url, topic="bench.events").run(stop))
    target = devnet.block_number()
    conn = await asyncpg.connect(database_url)
    try:
        while True:
            cursor = await conn.fetchval("SELECT block_number FROM chain_cursor WHERE chain_id = $1", devnet.chain_id)
            if cursor is not None and cursor >= target:
                break
            if task.done():
                task.result()
            await asyncio.sleep(0.05)
    finally:
        await conn.close()
        stop.set()
        await asyncio.wait_for(task, 10)


async def publish(producer: Any, topic: str, verdicts: list[Any]) -> None:
    from runtime.kafka import encode_headers

    futures = [
        await producer.send(
            topic,
            value=verdict_payload(s),
            key=verdict_key(s.verdict),
            headers=encode_headers(verdict_headers(s)),
        )
        for s in verdicts
    ]
    await asyncio.gather(*futures)


class Publisher:
    """`bench.verdict_publisher` as a subprocess: verdicts produced outside the relayer's process."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc

    @classmethod
    async def start(cls, bootstrap: str, topic: str) -> Publisher:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.verdict_publisher", bootstrap, topic,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )  # fmt: skip
        publisher = cls(proc)
        if not json.loads(await publisher._line()).get("ready"):
            raise RuntimeError("the verdict publisher did not start")
        return publisher

    async def _line(self) -> bytes:
        assert self._proc.stdout is not None
        line = await self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the verdict publisher exited ({await self._proc.wait()})")
        return line

    async def publish(self, verdicts: list[Any]) -> tuple[float, float]:
        """Publish a burst; (first, last) acknowledgement, `time.monotonic()`."""
        from runtime.kafka import encode_headers

        assert self._proc.stdin is not None
        self._proc.stdin.write(
            encode_burst(
                [
                    (verdict_payload(s), verdict_key(s.verdict), list(encode_headers(verdict_headers(s))))
                    for s in verdicts
                ]
            )
        )
        await self._proc.stdin.drain()
        reply = json.loads(await self._line())
        return float(reply["first_ack"]), float(reply["last_ack"])

    async def stop(self) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        try:
            async with asyncio.timeout(10):
                await self._proc.wait()
        except TimeoutError:
            self._proc.kill()
            await self._proc.wait()


async def settled_on_chain(
    session: aiohttp.ClientSession, devnet: Devnet, from_block: int, task_ids: set[int], verifier: str
) -> float:
    """`time.monotonic()` when the chain shows every task of `task_ids` judged by `verifier`
    (its `VerificationCompleted` logs after block `from_block`), polled every POLL seconds
    like the raw figure's mined count: the head's number, and the logs of each new block
    once (this runs on the relayer's event loop: it must cost it little)."""
    topic = event_topic("VerificationCompleted")
    verifier_topic = "0x" + verifier.lower().removeprefix("0x").rjust(64, "0")
    settled: set[int] = set()
    checked = from_block

    async def call(method: str, params: list[Any]) -> Any:
        body = {"jsonrpc": "2.0", "id": 0, "method": method, "params": params}
        async with session.post(devnet.rpc_url, json=body) as response:
            reply = await response.json(loads=orjson.loads)
        if "result" not in reply:
            raise RuntimeError(f"{method} refused: {reply.get('error')}")
        return reply["result"]

    while True:
        head = int(await call("eth_blockNumber", []), 16)
        if head > checked:
            query = {
                "address": devnet.escrow_address,
                "fromBlock": hex(checked + 1),
                "toBlock": hex(head),
                "topics": [topic, None, verifier_topic],
            }
            settled.update(int(entry["topics"][1], 16) for entry in await call("eth_getLogs", [query]))
            checked = head
            if task_ids <= settled:
                return time.monotonic()
        await asyncio.sleep(POLL)


def _profiler() -> Any:
    """A running cProfile of the measured burst when BENCH_PROFILE names a directory
    (profiling only: it slows the relayer several times; its stats go there)."""
    if not os.environ.get("BENCH_PROFILE"):
        return None
    import cProfile

    profiler = cProfile.Profile()
    profiler.enable()
    return profiler


async def relayer_rate(
    devnet: Devnet,
    database_url: str,
    bootstrap: str,
    tasks: list[tuple[int, str]],
    warmup: tuple[int, str],
    run_no: int,
    overrides: dict[str, Any] | None = None,
) -> dict[str, float]:
    signer = devnet.spare[0]

    def signed(task: tuple[int, str]) -> Any:
        return sign_verdict(
            Verdict(
                chain_id=devnet.chain_id,
                escrow=devnet.escrow_address,
                task_id=task[0],
                attempt=1,
                evidence_hash=task[1],
                passed=True,
                score=90,
                issued_at=datetime.now(UTC),
            ),
            signer.private_key,
        )

    settings = RelayerSettings(
        database_url=database_url,
        kafka_bootstrap=bootstrap,
        chains=[
            ChainSettings(
                chain_id=devnet.chain_id,
                rpc_urls=[devnet.rpc_url],
                ws_url=devnet.ws_url,
                escrow_addresses=[devnet.escrow_address],
                confirmations=1,
            )
        ],
        verdicts_topic="bench.verdicts",
        dlq_topic="bench.dlq",
        relayer_consumer_group="bench-relayer",
        relayer_key=devnet.marketplace_verifier.private_key,
        relayer_trusted_signers=[signer.address],
        relayer_poll_interval=1.0,
        relayer_port=free_port(),
        **{**OVERRIDES, **(overrides or {})},
    )
    relayer = Relayer(settings, SecretKey.from_hex(devnet.marketplace_verifier.private_key))
    run = asyncio.create_task(relayer.run())
    conn = await asyncpg.connect(database_url)
    # Started (connected, metadata fetched) before the clock runs, in a process of its own
    # (the verification service's place): we time the relayer, not the producer's CPU.
    producer = await Publisher.start(bootstrap, settings.verdicts_topic)

    async def confirmed() -> int:
        return int(
            await conn.fetchval(
                "SELECT count(*) FROM settlement_verdicts WHERE status = 'confirmed' AND task_id >= $1", warmup[0]
            )
        )

    try:
        await producer.publish([signed(warmup)])
        while await confirmed() < 1:
            if run.done():
                run.result()
            await asyncio.sleep(0.01)
        batch = [signed(t) for t in tasks]
        first_nonce = int(devnet.rpc("eth_getTransactionCount", devnet.marketplace_verifier.address, "latest"), 16)
        from_block = devnet.block_number()
        db_start = await conn.fetchval("SELECT clock_timestamp()")
        profiler = _profiler()
        cpu_start = time.process_time()
        sent = asyncio.create_task(producer.publish(batch))

        async def db_confirmed() -> tuple[float, float]:
            # The relayer's own end point: every verdict confirmed in its database (the
            # receipts read, the rows written), the figure this benchmark reported first.
            while await confirmed() < len(tasks) + 1:
                if run.done():
                    run.result()
                await asyncio.sleep(POLL)
            return time.monotonic(), time.process_time() - cpu_start

        async with aiohttp.ClientSession() as session:
            verifier = devnet.marketplace_verifier.address
            chain_done, (finished, cpu) = await asyncio.gather(
                settled_on_chain(session, devnet, from_block, {t for t, _ in tasks}, verifier), db_confirmed()
            )
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(f"{os.environ['BENCH_PROFILE']}/relayer-{run_no}.prof")
        # From the first verdict on the broker (its acknowledgement: the relayer can fetch it)
        # to the chain's count of settled verdicts reaching the burst, as raw sends run from
        # the first transaction sent to the chain's count reaching the end: the same end
        # point, polled at the same rate. CLOCK_MONOTONIC, the clock of the publisher's
        # process too (and of `time.perf_counter`, the raw figure's clock, on Linux).
        first_ack, last_ack = await sent
        elapsed = chain_done - first_ack
        db_elapsed = finished - first_ack
        latencies = [
            float(r[0])
            for r in await conn.fetch(
                "SELECT extract(epoch FROM confirmed_at - received_at) FROM settlement_verdicts"
                " WHERE task_id > $1 AND task_id <= $2",
                warmup[0],
                tasks[-1][0],
            )
        ]
        stages = await conn.fetchrow(
            "SELECT extract(epoch FROM max(received_at) - $1) AS consumed,"
            " extract(epoch FROM max(sent_at) - $1) AS signed,"
            " extract(epoch FROM max(confirmed_at) - $1) AS confirmed"
            " FROM settlement_verdicts WHERE task_id > $2 AND task_id <= $3",
            db_start,
            warmup[0],
            tasks[-1][0],
        )
        mined = await conn.fetch(
            "SELECT mined_hash FROM settlement_transactions WHERE nonce >= $1 AND mined_hash IS NOT NULL", first_nonce
        )
        gas = sum(int(devnet.rpc("eth_getTransactionReceipt", r["mined_hash"])["gasUsed"], 16) for r in mined)
        return {
            "gas_per_verdict": gas / len(tasks),
            "transactions": float(len(mined)),
            "cpu_ms_per_verdict": 1000 * cpu / len(tasks),
            "stage_consumed_s": float(stages["consumed"]),
            "stage_signed_s": float(stages["signed"]),
            "stage_confirmed_s": float(stages["confirmed"]),
            "rate": len(tasks) / elapsed,
            "seconds": elapsed,
            "db_rate": len(tasks) / db_elapsed,
            "publish_s": last_ack - first_ack,
            "latency_p50_ms": 1000 * statistics.median(latencies),
            "latency_p99_ms": 1000 * sorted(latencies)[int(0.99 * (len(latencies) - 1))],
        }
    finally:
        await producer.stop()
        await conn.close()
        run.cancel()
        # asyncio.wait, not wait_for: a loop slow to honour the cancellation (seen once in a
        # sender's newHeads WebSocket close) must not hang the benchmark; it is reported.
        done, _ = await asyncio.wait({run}, timeout=10)
        if not done:
            print("[bench_relayer] relayer did not stop within 10 s of its cancellation", file=sys.stderr)
        elif not run.cancelled() and run.exception() is not None:
            raise run.exception()  # type: ignore[misc]


async def restart_to_work(
    devnet: Devnet, database_url: str, bootstrap: str, tasks: list[tuple[int, str]], mode: str, signer_key: str
) -> float:
    """Seconds from a restart after SIGKILL to the next verdict consumed (see the module doc)."""
    from aiokafka import AIOKafkaProducer

    signer = next(a for a in devnet.spare if a.private_key == signer_key)
    chains = [
        {
            "chain_id": devnet.chain_id,
            "rpc_urls": [devnet.rpc_url],
            "ws_url": devnet.ws_url,
            "escrow_addresses": [devnet.escrow_address],
            "confirmations": 1,
        }
    ]
    env = {
        **os.environ,
        "ESCROWD_DATABASE_URL": database_url,
        "ESCROWD_KAFKA_BOOTSTRAP": bootstrap,
        "ESCROWD_CHAINS": json.dumps(chains),
        "ESCROWD_VERDICTS_TOPIC": f"bench.restart.{mode}.verdicts",
        "ESCROWD_DLQ_TOPIC": "bench.dlq",
        "ESCROWD_RELAYER_CONSUMER_GROUP": f"bench-restart-{mode}",
        "ESCROWD_RELAYER_CONSUMER_ASSIGNMENT": mode,
        "ESCROWD_RELAYER_KEY": devnet.marketplace_verifier.private_key,
        "ESCROWD_RELAYER_TRUSTED_SIGNERS": signer.address,
        "ESCROWD_RELAYER_POLL_INTERVAL": "1.0",
        "ESCROWD_RELAYER_PORT": str(free_port()),
    }

    def signed(task: tuple[int, str]) -> Any:
        verdict = Verdict(
            chain_id=devnet.chain_id,
            escrow=devnet.escrow_address,
            task_id=task[0],
            attempt=1,
            evidence_hash=task[1],
            passed=True,
            score=90,
            issued_at=datetime.now(UTC),
        )
        return sign_verdict(verdict, signer.private_key)

    log_dir = os.environ.get("BENCH_LOG_DIR")  # keep the relayer's output (profiling only)

    def spawn() -> subprocess.Popen[bytes]:
        out = open(f"{log_dir}/relayer-restart-{mode}.log", "ab") if log_dir else subprocess.DEVNULL  # noqa: SIM115
        return subprocess.Popen(
            [sys.executable, "-m", "relayer.settlement.cli", "run"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    conn = await asyncpg.connect(database_url)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, linger_ms=1)
    await producer.start()

    async def consumed(task_id: int, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
        deadline = time.perf_counter() + timeout
        while not await conn.fetchval("SELECT 1 FROM settlement_verdicts WHERE task_id = $1", task_id):
            if proc.poll() is not None:
                raise RuntimeError(f"relayer exited with {proc.returncode}")
            if time.perf_counter() > deadline:
                raise RuntimeError("verdict not consumed in time")
            await asyncio.sleep(0.01)

    first = spawn()
    try:
        await publish(producer, env["ESCROWD_VERDICTS_TOPIC"], [signed(tasks[0])])
        await consumed(tasks[0][0], first)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        await publish(producer, env["ESCROWD_VERDICTS_TOPIC"], [signed(tasks[1])])
        started = time.perf_counter()
        second = spawn()
        try:
            await consumed(tasks[1][0], second)
            return time.perf_counter() - started
        finally:
            second.send_signal(signal.SIGKILL)
            second.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)
        await producer.stop()
        await conn.close()


async def main(verdicts: int, database_url: str, bootstrap: str, rounds: int) -> dict[str, Any]:
    from runtime.db import migrate_url

    anvil = AnvilProcess()
    try:
        anvil.start()
        devnet = deploy_devnet(anvil.rpc_url, ws_url=anvil.ws_url, spare=2)
        await migrate_url(database_url)
        # raw sends one request per transaction (16 in flight); raw_batched sends JSON-RPC
        # batches of 16 (16 in flight), as the relayer does: on anvil's automine that also
        # packs more transactions per block. Every relayer run sits between raw runs.
        # With several --variant, each round runs every variant back to back, then the raw pair.
        settle = ["raw_settle_batch"] if SETTLE_BATCH[0] else []
        plan = ["raw", "raw_batched"] + ([*VARIANTS, "raw", "raw_batched", *settle] * rounds) if rounds else []
        setup = time.perf_counter()
        needed = sum(verdicts + (kind in VARIANTS) for kind in plan) + 4
        tasks = []
        for start in range(0, needed, TASK_CHUNK):
            tasks += make_tasks(devnet, min(TASK_CHUNK, needed - start), f"bench{start}")
        await index(devnet, database_url)
        setup_s = time.perf_counter() - setup
        key = SecretKey.from_hex(devnet.marketplace_verifier.private_key)
        raw: list[float] = []
        raw_batched: list[float] = []
        settle_batched: list[float] = []
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in VARIANTS}
        for kind in plan:
            if kind == "raw_settle_batch":
                batch, tasks = tasks[:verdicts], tasks[verdicts:]
                settle_batched.append(await raw_rate(devnet, key, batch, batched=True, settle_batch=SETTLE_BATCH[0]))
            elif kind in ("raw", "raw_batched"):
                batch, tasks = tasks[:verdicts], tasks[verdicts:]
                rate = await raw_rate(devnet, key, batch, batched=kind == "raw_batched")
                (raw if kind == "raw" else raw_batched).append(rate)
            else:
                batch, tasks = tasks[: verdicts + 1], tasks[verdicts + 1 :]
                runs[kind].append(
                    await relayer_rate(
                        devnet, database_url, bootstrap, batch[1:], batch[0], len(runs[kind]), VARIANTS[kind]
                    )
                )
        relayed = runs[next(iter(VARIANTS))]
        restart = {}
        for mode in RESTART_MODES:
            batch, tasks = tasks[:2], tasks[2:]
            restart[mode] = await restart_to_work(
                devnet, database_url, bootstrap, batch, mode, devnet.spare[0].private_key
            )
        agent = {"agent_send": await agent_send_figure(devnet, database_url, AGENT_VERDICTS[0])} if AGENT_VERDICTS[0] else {}
        if not relayed:  # --rounds 0: the restart figure (and the agent's send path) alone
            return {"benchmark": "relayer", "restart_to_work_s": {mode: round(v, 2) for mode, v in restart.items()},
                    **agent}
        raw_median = statistics.median(raw)
        raw_batched_median = statistics.median(raw_batched)
        relay_rate = statistics.median(r["rate"] for r in relayed)
        db_rate = statistics.median(r["db_rate"] for r in relayed)
        return {
            "benchmark": "relayer",
            "verdicts_per_run": verdicts,
            "raw_presigned_tx_per_s": [round(r, 1) for r in raw],
            "raw_batched_tx_per_s": [round(r, 1) for r in raw_batched],
            "relayer_verdicts_per_s": [round(r["rate"], 1) for r in relayed],
            "raw_median": round(raw_median, 1),
            "raw_batched_median": round(raw_batched_median, 1),
            "relayer_median": round(relay_rate, 1),
            "ratio_vs_raw": round(relay_rate / raw_median, 3),
            "ratio_vs_raw_batched": round(relay_rate / raw_batched_median, 3),
            "target_ratio": 0.75,
            # The first end point: every verdict confirmed in the relayer's database.
            "relayer_db_confirmed_verdicts_per_s": [round(r["db_rate"], 1) for r in relayed],
            "relayer_db_confirmed_median": round(db_rate, 1),
            "ratio_db_confirmed_vs_raw_batched": round(db_rate / raw_batched_median, 3),
            "relayer_stages_s": [
                {k.removeprefix("stage_").removesuffix("_s"): round(v, 3) for k, v in r.items() if k.startswith("stage_")}
                for r in relayed
            ],
            "relayer_process_cpu_ms_per_verdict": [round(r["cpu_ms_per_verdict"], 2) for r in relayed],
            "relayer_gas_per_verdict": [round(r["gas_per_verdict"]) for r in relayed],
            "verdict_to_confirmation_p50_ms": [round(r["latency_p50_ms"], 1) for r in relayed],
            "verdict_to_confirmation_p99_ms": [round(r["latency_p99_ms"], 1) for r in relayed],
            "restart_to_work_s": {mode: round(v, 2) for mode, v in restart.items()},
            **({"variants": _variants(runs, raw_batched_median)} if len(VARIANTS) > 1 else {}),
            **(
                {
                    "settle_batch_items": SETTLE_BATCH[0],
                    "raw_settle_batch_verdicts_per_s": [round(r, 1) for r in settle_batched],
                    "raw_settle_batch_vs_raw_batched": round(statistics.median(settle_batched) / raw_batched_median, 2),
                }
                if settle_batched
                else {}
            ),
            "gas_per_verdict": {kind: round(statistics.median(v)) for kind, v in GAS_USED.items()},
            "setup_seconds": round(setup_s, 1),
            "chain_blocks": devnet.block_number(),
            **agent,
        }
    finally:
        anvil.stop()


def _variants(runs: dict[str, list[dict[str, float]]], raw_batched_median: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, results in runs.items():
        median = statistics.median(r["rate"] for r in results)
        out[name] = {
            "settings": VARIANTS[name],
            "verdicts_per_s": [round(r["rate"], 1) for r in results],
            "median": round(median, 1),
            "ratio_vs_raw_batched": round(median / raw_batched_median, 3),
            "db_confirmed_verdicts_per_s": [round(r["db_rate"], 1) for r in results],
            "gas_per_verdict": [round(r["gas_per_verdict"]) for r in results],
            "transactions": [int(r["transactions"]) for r in results],
            "stages_s": [
                {k.removeprefix("stage_").removesuffix("_s"): round(v, 3) for k, v in r.items() if k.startswith("stage_")}
                for r in results
            ],
        }
    return out


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--verdicts", type=int, default=300, help="verdicts (and raw transactions) per run")
    parser.add_argument("--rounds", type=int, default=2, help="relayer runs, each between two raw runs")
    parser.add_argument("--set", action="append", default=[], help="relayer setting override name=value")
    parser.add_argument(
        "--restart-modes", default="group,direct", help="consumer modes of the restart figure ('' for none)"
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="name:setting=value,... a relayer configuration to run in each round (repeatable; A/B in one run)",
    )
    parser.add_argument(
        "--agent-verdicts", type=int, default=30,
        help="verdicts per figure of the hosted verifier agent's send path (bench/agent_send.py; 0: skip)",
    )
    parser.add_argument(
        "--settle-batch", type=int, default=100, help="items per completeVerificationBatch of the raw batch figure (0: skip)"
    )
    args = parser.parse_args()
    SETTLE_BATCH[0] = args.settle_batch
    AGENT_VERDICTS[0] = args.agent_verdicts
    if args.variant:
        VARIANTS.clear()
        for item in args.variant:
            name, _, spec = item.partition(":")
            VARIANTS[name] = dict(pair.split("=", 1) for pair in spec.split(",") if pair)
    RESTART_MODES[:] = [m for m in args.restart_modes.split(",") if m]
    for item in args.set:
        name, _, value = item.partition("=")
        OVERRIDES[name] = value
    configure_logging(json=True, level="WARNING")
    result = on_services(lambda url, bootstrap: main(args.verdicts, url, bootstrap, args.rounds))
    print(json.dumps(result), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    cli()
