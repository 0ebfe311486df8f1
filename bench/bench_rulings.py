"""Ruling path cost: the reviewed sender against the baseline one, same run, A/B pairs.

`python -m bench.bench_rulings [--rulings N] [--rounds R] [--baseline-ref REF]` prints one
JSON object.

On one fresh anvil (automine) and one database, `--rounds` pairs, each pair running the
baseline (`relayer/settlement/rulings.py` as of `--baseline-ref`, loaded from git) and the
current sender back to back on fresh disputes:

- send: N rulings admitted at once, timed from the first `step` until every one is
  `confirmed` (preflight, gas estimate, nonce transaction, signing, broadcast, receipts).
  The reviewed sender reads the mined count as well as the pending count before signing,
  and parses every reply strictly.
- follow: with those N rulings confirmed and not yet final (watched each pass), the mean
  time of one `step` over 10 passes (receipts and canonical block hashes of N rulings).

Figures are medians over the rounds; the ratio is current / baseline (1.0 = same cost).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import asyncpg

from chain.eth_rpc import EthRpc
from chain.keys import SecretKey
from escrowd.devnet import Devnet, deploy_devnet
from relayer.settlement import rulings as current
from runtime.consumer import InboundMessage
from runtime.db import create_pool
from runtime.logging import configure_logging
from runtime.services.anvil import AnvilProcess
from runtime.services.postgres import start_postgres
from schemas import panels as msg
from schemas.task_state import TaskStatus

ROOT = Path(__file__).resolve().parent.parent
FOLLOW_PASSES = 10
PANEL_KEY = "0x" + "5e" * 32


def disputed_task(devnet: Devnet) -> int:
    """A task that failed verification and whose agent disputed it."""
    poster, agent = devnet.posters[0], devnet.agents[0]
    task_id = devnet.post_task(poster)
    devnet.accept_task(task_id, sender=agent)
    evidence = b"\x11" * 32
    devnet.submit_evidence(task_id, evidence, sender=agent)
    devnet.complete_verification(task_id, 1, evidence, False, 10, sender=devnet.marketplace_verifier)
    devnet.raise_dispute(task_id, sender=agent)
    assert devnet.get_task(task_id).status == TaskStatus.DISPUTED
    return task_id


def ruling_message(devnet: Devnet, task_id: int, share: int, offset: int) -> InboundMessage:
    ruling = msg.Ruling(chain_id=devnet.chain_id, escrow=devnet.escrow_address, task_id=task_id, round=1,
                        agent_share_bps=share)
    signed = msg.sign_ruling(ruling, PANEL_KEY)
    return InboundMessage(topic="escrow.panel-rulings.v1", partition=0, offset=offset, key=None,
                          headers={"ce_id": f"{msg.ruling_message_id(ruling)}:{offset}"},
                          value=signed.model_dump_json().encode(), timestamp_ms=0)


def load_baseline(ref: str) -> ModuleType:
    """`relayer/settlement/rulings.py` at `ref`, imported under another name (own metrics)."""
    source = subprocess.run(["git", "show", f"{ref}:relayer/settlement/rulings.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    source = source.replace('"escrowd_relayer_', '"bench_baseline_relayer_')
    path = Path(tempfile.mkdtemp(prefix="bench-rulings-")) / "baseline_rulings.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("bench_baseline_rulings", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


async def admit(pool: asyncpg.Pool, devnet: Devnet, tasks: list[int], offset: int) -> None:
    trusted = frozenset({msg.sign_ruling(msg.Ruling(
        chain_id=1, escrow="0x" + "00" * 20, task_id=1, round=1, agent_share_bps=0), PANEL_KEY).signer})
    handler = current.RulingHandler(chain_id=devnet.chain_id, escrow=devnet.escrow_address, trusted_signers=trusted)
    async with pool.acquire() as conn:
        for i, task_id in enumerate(tasks):
            await handler(conn, ruling_message(devnet, task_id, 5_000, offset=offset + i))


async def confirmed(pool: asyncpg.Pool, tasks: list[int]) -> int:
    async with pool.acquire() as conn:
        return int(await conn.fetchval(
            "SELECT count(*) FROM settlement_rulings WHERE task_id = ANY($1::numeric[]) AND status = 'confirmed'",
            tasks))


async def one_round(module: ModuleType, pool: asyncpg.Pool, rpc: EthRpc, devnet: Devnet, tasks: list[int],
                    offset: int) -> dict[str, float]:
    key = SecretKey.from_hex(devnet.arbiter.private_key)
    sender = module.RulingSender(rpc, key, devnet.chain_id, devnet.escrow_address, finality_depth=10_000)
    await admit(pool, devnet, tasks, offset)
    start = time.perf_counter()
    for _ in range(10 * len(tasks) + 20):
        await sender.step(pool)
        if await confirmed(pool, tasks) == len(tasks):
            break
    else:
        raise RuntimeError("rulings never confirmed")
    send_s = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(FOLLOW_PASSES):
        await sender.step(pool)
    follow_ms = (time.perf_counter() - start) / FOLLOW_PASSES * 1000
    # Leave nothing watched for the next round: these are final for the benchmark's purpose.
    async with pool.acquire() as conn:
        await conn.execute("UPDATE settlement_rulings SET final_at = now() WHERE task_id = ANY($1::numeric[])", tasks)
    return {"send_s": send_s, "follow_pass_ms": follow_ms}


async def main(rulings: int, rounds: int, ref: str, database_url: str) -> dict[str, Any]:
    from runtime.db import migrate_url

    baseline = load_baseline(ref)
    anvil = AnvilProcess()
    try:
        anvil.start()
        devnet = deploy_devnet(anvil.rpc_url, ws_url=anvil.ws_url, spare=2)
        await migrate_url(database_url)
        tasks = [await asyncio.to_thread(disputed_task, devnet) for _ in range(2 * rounds * rulings)]
        pool = await create_pool(database_url)
        rpc = EthRpc([devnet.rpc_url], chain_id=devnet.chain_id)
        results: dict[str, list[dict[str, float]]] = {"baseline": [], "current": []}
        try:
            offset = 0
            for r in range(rounds):
                order = [("baseline", baseline), ("current", current)]
                if r % 2:
                    order.reverse()  # A/B then B/A: neither always runs on the longer chain
                for name, module in order:
                    batch, tasks = tasks[:rulings], tasks[rulings:]
                    results[name].append(await one_round(module, pool, rpc, devnet, batch, offset))
                    offset += rulings
        finally:
            await rpc.close()
            await pool.close()
    finally:
        anvil.stop()

    def median(name: str, field: str) -> float:
        return statistics.median(run[field] for run in results[name])

    summary: dict[str, Any] = {"benchmark": "rulings", "rulings": rulings, "rounds": rounds, "baseline_ref": ref}
    for field in ("send_s", "follow_pass_ms"):
        summary[f"baseline_{field}"] = round(median("baseline", field), 4)
        summary[f"current_{field}"] = round(median("current", field), 4)
        summary[f"ratio_{field}"] = round(median("current", field) / median("baseline", field), 3)
    summary["runs"] = results
    return summary


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rulings", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline-ref", default="772a742")
    args = parser.parse_args()
    configure_logging(json=True, level="WARNING")
    postgres = start_postgres(prefix="escrowd_bench")
    try:
        result = asyncio.run(main(args.rulings, args.rounds, args.baseline_ref, postgres.url))
    finally:
        postgres.stop()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    cli()
