"""kill -9 the relayer process over and over while it relays verdicts (issue 7's first acceptance).

The relayer runs as a subprocess (`python -m relayer.settlement.cli run`). Two kinds of kills:

- injected: a run arms one named crash point (before_sign, after_sign, after_persist,
  after_broadcast, after_mined) and SIGKILLs itself the first time it gets there, so every
  crash point of the design is hit;
- external: the test SIGKILLs the process at a random moment once it made random progress.

Then a last run without faults finishes the work, and the chain and the database are
checked: every attempt judged exactly once, no verdict transaction sent twice for an
attempt (every mined relayer transaction is a filler or carries distinct verdicts, each
verdict in exactly one, none reverted), no nonce gap (mined count = pool count = our
counter), every verdict in exactly one live slot, and the key never appeared in the logs.

It runs at full size in CI (300 verdicts, 20 kills: 1–2.5 minutes on two shared cores),
twice: one transaction per verdict here, and packed (the default, `completeVerificationBatch`)
in `test_relay_crash_packed.py`.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from eth_abi.abi import decode as abi_decode

from chain.txs import decode_complete_verification, selector
from escrowd.devnet import Devnet
from relayer.settlement.crash import POINTS
from tests.settlement.conftest import (
    IndexerRun,
    fetch,
    fetchval,
    on_chain,
    publish,
    relayer_env,
    signed_verdicts,
    submit_tasks,
    verdict_statuses,
    wait_until,
)

REPO = Path(__file__).resolve().parents[2]


def spawn(env: dict[str, str], log_file: Path) -> subprocess.Popen[bytes]:
    """Start the relayer CLI with `env`, appending its output to `log_file`."""
    handle = log_file.open("ab")
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "relayer.settlement.cli", "run"],
            cwd=REPO,
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    finally:
        handle.close()


async def progress(database_url: str) -> int:
    """A number that grows with every step the relayer takes."""
    value = await fetchval(
        database_url,
        "SELECT (SELECT count(*) FROM settlement_tx_versions)"
        " + (SELECT count(*) FROM settlement_verdicts WHERE status = 'confirmed')"
        " + (SELECT count(*) FROM settlement_verdicts)",
    )
    return int(value or 0)


async def wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """True when the process ended within `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return True
        await asyncio.sleep(0.02)
    return proc.poll() is not None


def kill9(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL, and reap."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)


def relayer_transactions(devnet: Devnet, address: str, first_block: int) -> list[dict]:
    """Every mined transaction sent from `address` since `first_block`, with its receipt status."""
    out = []
    for number in range(first_block, devnet.block_number() + 1):
        block = devnet.rpc("eth_getBlockByNumber", hex(number), True)
        for tx in block["transactions"]:
            if tx["from"].lower() == address.lower():
                receipt = devnet.rpc("eth_getTransactionReceipt", tx["hash"])
                out.append({**tx, "status": int(receipt["status"], 16)})
    return out


async def crash_campaign(
    devnet: Devnet,
    database_url: str,
    kafka_bootstrap: str,
    topic_prefix: str,
    indexer: IndexerRun,
    service_signer,
    tmp_path: Path,
    *,
    verdicts: int,
    point_cycles: int,
    external_kills: int,
    seed: int,
    packed: bool = False,
) -> dict[str, object]:
    rng = random.Random(seed)
    items = await on_chain(submit_tasks, devnet, verdicts, prefix=f"crash{seed}")
    await indexer.caught_up(timeout=120)
    signed = signed_verdicts(devnet, items, service_signer)
    env = relayer_env(
        devnet=devnet,
        database_url=database_url,
        kafka_bootstrap=kafka_bootstrap,
        topic_prefix=topic_prefix,
        trusted=[service_signer.address],
        relayer_batch_size=4,
        relayer_broadcast_concurrency=4,
        relayer_replace_after_seconds=2,
        # Packed: the default packing (verdicts of a round of 2 or more in one batch); single:
        # one completeVerification per verdict, the path every round of one verdict takes.
        **({} if packed else {"relayer_settle_batch_size": 0}),
    )
    topic = env["ESCROWD_VERDICTS_TOPIC"]
    log_file = tmp_path / "relayer.log"
    first_block = (await on_chain(devnet.block_number)) + 1
    half = len(signed) // 2
    await publish(kafka_bootstrap, topic, signed[:half])

    schedule = [("point", POINTS[i % len(POINTS)]) for i in range(point_cycles * len(POINTS))]
    schedule += [("external", "")] * external_kills
    rng.shuffle(schedule)
    kills: Counter[str] = Counter()
    for run_index, (kind, point) in enumerate(schedule):
        if run_index == 2:
            await publish(kafka_bootstrap, topic, signed[half:])
        run_env = dict(env)
        if kind == "point":
            run_env["ESCROWD_RELAYER_FAULT_INJECTION"] = f"{point}:1"
        start = await progress(database_url)
        proc = spawn(run_env, log_file)
        try:
            if kind == "point":
                ended = await wait_exit(proc, 25)
                if ended:
                    assert proc.returncode == -signal.SIGKILL, f"relayer exited with {proc.returncode}: see {log_file}"
                    kills[f"point:{point}"] += 1
                else:
                    kill9(proc)  # the point was not reached in time: still a kill at a random instant
                    kills["external"] += 1
            else:
                target = start + rng.randint(1, 8)
                deadline = time.monotonic() + 25
                # Polling an external process and database: there is no event to wait on.
                while time.monotonic() < deadline and proc.poll() is None and await progress(database_url) < target:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
                await asyncio.sleep(rng.random() * 0.2)
                assert proc.poll() is None, f"relayer died on its own ({proc.returncode}): see {log_file}"
                kill9(proc)
                kills["external"] += 1
        finally:
            if proc.poll() is None:
                kill9(proc)

    # The last run, without faults, finishes the work.
    proc = spawn(env, log_file)
    try:

        async def all_confirmed() -> bool:
            assert proc.poll() is None, f"relayer exited with {proc.returncode}: see {log_file}"
            statuses = await verdict_statuses(database_url)
            return len(statuses) == len(items) and set(statuses.values()) == {"confirmed"}

        await wait_until(all_confirmed, timeout=120, interval=0.2, what="every verdict confirmed")
        pending_rows = await fetchval(database_url, "SELECT count(*) FROM settlement_transactions WHERE state IN ('pending', 'mined')")
        proc.send_signal(signal.SIGTERM)
        assert await wait_exit(proc, 15), "relayer did not stop on SIGTERM"
    finally:
        if proc.poll() is None:
            kill9(proc)

    relayer = devnet.marketplace_verifier.address
    # 1. Every attempt judged exactly once on chain.
    for item in items:
        assert await on_chain(devnet.is_judged, item.task_id, 1)
    logs = await on_chain(lambda: list(devnet.logs()))
    events = Counter((int(e["taskId"]), int(e["attempt"])) for e in logs if e.name == "VerificationCompleted")
    assert events == Counter({(i.task_id, 1): 1 for i in items})
    # 2. No verdict transaction sent twice for an attempt: every mined relayer tx is a
    #    distinct verdict or a filler, and none reverted (a second verdict would revert).
    txs = await on_chain(relayer_transactions, devnet, relayer, first_block)
    verdict_txs = Counter()
    fillers = 0
    for tx in txs:
        assert tx["status"] == 1, f"reverted relayer tx {tx['hash']}"
        if tx["to"].lower() == relayer.lower():
            assert tx["input"] in ("0x", "") and int(tx["value"], 16) == 0
            fillers += 1
            continue
        assert tx["to"].lower() == devnet.escrow_address.lower()
        verdict_txs.update(carried_attempts(tx))
    assert verdict_txs == Counter({(i.task_id, 1): 1 for i in items})
    batches = sum(1 for tx in txs if tx["input"].startswith("0x" + selector("completeVerificationBatch").hex()))
    assert (batches > 0) == packed
    # 3. No nonce gap, no drift.
    latest = int(await on_chain(devnet.rpc, "eth_getTransactionCount", relayer, "latest"), 16)
    pending = int(await on_chain(devnet.rpc, "eth_getTransactionCount", relayer, "pending"), 16)
    counter = await fetchval(database_url, "SELECT next_nonce FROM settlement_nonces")
    assert latest == pending == counter == len(txs)
    assert sorted(int(tx["nonce"], 16) for tx in txs) == list(range(latest))
    assert pending_rows == 0
    # Every verdict in exactly one live slot (its own, or as an item of a batch).
    live = await fetch(
        database_url,
        "SELECT verdict_id, count(*) AS n FROM ("
        " SELECT verdict_id FROM settlement_transactions WHERE kind = 'verdict' AND state <> 'lost'"
        " UNION ALL SELECT b.verdict_id FROM settlement_batch_items b JOIN settlement_transactions t"
        "   USING (chain_id, sender, nonce) WHERE t.kind = 'batch' AND t.state <> 'lost') s"
        " GROUP BY verdict_id",
    )
    assert len(live) == len(items) and all(r["n"] == 1 for r in live)
    # 4. The key never reached the logs.
    text = log_file.read_text(errors="replace").lower()
    key = devnet.marketplace_verifier.private_key.lower()
    assert key not in text and key.removeprefix("0x") not in text
    assert "relayer_starting" in text
    injected = {k.removeprefix("point:") for k in kills if k.startswith("point:")}
    return {"kills": sum(kills.values()), "by_kind": dict(kills), "points_hit": injected, "fillers": fillers}


def carried_attempts(tx: dict) -> list[tuple[int, int]]:
    """(task, attempt) of each verdict a relayer transaction carries (single or batch)."""
    data = bytes.fromhex(tx["input"][2:])
    single = decode_complete_verification(data)
    if single is not None:
        return [(single[0], single[1])]
    assert data[:4] == selector("completeVerificationBatch"), tx["hash"]
    (items,) = abi_decode(["(uint256,uint8,bytes32,bool,uint8)[]"], data[4:])
    return [(int(t), int(a)) for t, a, *_ in items]


async def kill_nine_300_verdicts_20_kills(
    devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str, indexer: IndexerRun,
    service_signer: object, tmp_path: Path, *, packed: bool,
) -> None:
    """300 verdicts, 20 kills: every crash point twice plus ten random external kills."""
    result = await crash_campaign(
        devnet, database_url, kafka_bootstrap, topic_prefix, indexer, service_signer, tmp_path,
        verdicts=300, point_cycles=2, external_kills=10, seed=11, packed=packed,
    )  # fmt: skip
    assert result["kills"] >= 20
    assert result["points_hit"] == set(POINTS), result


@pytest.mark.timeout(600)
async def test_kill_nine_300_verdicts_20_kills_keeps_exactly_once(
    devnet: Devnet, database_url, kafka_bootstrap, topic_prefix, indexer: IndexerRun, service_signer, tmp_path
) -> None:
    """The campaign with one transaction per verdict (the packed campaign, the default, is
    `test_relay_crash_packed.py`: a file of its own, so the suite's workers run both at once)."""
    await kill_nine_300_verdicts_20_kills(
        devnet, database_url, kafka_bootstrap, topic_prefix, indexer, service_signer, tmp_path, packed=False
    )
