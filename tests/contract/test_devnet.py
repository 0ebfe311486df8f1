"""The devnet library and the anvil process wrapper that every other test builds on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from escrowd.devnet import (
    ANVIL_MNEMONIC,
    DAY,
    USDC,
    Devnet,
    DevnetError,
    EscrowRevert,
    TaskStatus,
    anvil_key,
    text_hash,
)
from runtime.services.anvil import AnvilError, AnvilProcess

ROOT = Path(__file__).resolve().parents[2]


def test_anvil_process_lifecycle() -> None:
    anvil = AnvilProcess(chain_id=4242)
    with anvil:
        assert anvil.running
        assert anvil.rpc_url.startswith("http://127.0.0.1:")
        assert anvil.ws_url == anvil.rpc_url.replace("http://", "ws://")
        home = anvil._home
        assert home is not None and home.is_dir()
        assert anvil._rpc("eth_chainId") == hex(4242)
    assert not anvil.running
    assert not home.exists()  # its private ~/.foundry (anvil/tmp included) is gone


def test_anvil_dies_with_a_killed_owner_and_its_home_is_swept() -> None:
    code = (
        "from runtime.services.anvil import AnvilProcess; import sys, time;"
        "a = AnvilProcess().start(); print(a.port, a._home, flush=True); time.sleep(60)"
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout is not None
        port_text, home_text = owner.stdout.readline().split()
        probe = AnvilProcess(port=int(port_text))
        assert probe._rpc("eth_chainId") == hex(31337)
        owner.kill()  # SIGKILL: no cleanup code runs in the owner
        owner.wait(timeout=10)
        deadline = time.monotonic() + 60  # generous (loaded CI): ends as soon as anvil is gone
        while True:
            try:
                probe._rpc("eth_chainId", timeout=0.5)
            except OSError:
                break
            assert time.monotonic() < deadline, "anvil outlived its owner"
            time.sleep(0.05)
        assert Path(home_text).exists()
        with AnvilProcess():  # the next start removes the orphaned home
            assert not Path(home_text).exists()
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()


def test_anvil_binary_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ANVIL_BIN", str(tmp_path / "missing-anvil"))
    with pytest.raises(AnvilError, match="missing-anvil"):
        AnvilProcess().start()


def test_actors_come_from_the_anvil_mnemonic(dn: Devnet) -> None:
    # Account 0 of the well-known test mnemonic.
    assert anvil_key(0)[0] == "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"
    assert dn.owner.address == anvil_key(0)[0]
    addresses = [a.address for a in dn.actors]
    assert len(set(addresses)) == len(addresses)
    for poster in dn.posters:
        assert dn.balance_of(poster) == 1_000_000 * USDC
    desc = dn.describe()
    assert desc["contracts"]["escrow"] == dn.escrow_address
    assert (
        desc["actors"]["marketplace_verifier"]["private_key"] == dn.marketplace_verifier.private_key
    )
    assert desc["mnemonic"] == ANVIL_MNEMONIC


def test_increase_time_is_exact(dn: Devnet) -> None:
    before = dn.now()
    assert dn.increase_time(3 * DAY) == before + 3 * DAY
    assert dn.now() == before + 3 * DAY
    dn.set_next_timestamp(before + 4 * DAY)
    dn.mine()
    assert dn.now() == before + 4 * DAY
    n = dn.block_number()
    dn.mine(5, interval=10)
    assert dn.block_number() == n + 5
    assert dn.now() >= before + 4 * DAY + 40


def test_snapshot_revert(dn: Devnet) -> None:
    snap = dn.snapshot()
    tid = dn.post_task(dn.posters[0])
    assert dn.task_count() == tid
    dn.revert(snap)
    assert dn.task_count() == tid - 1
    with pytest.raises(DevnetError):  # anvil snapshots are single-use
        dn.revert(snap)


def test_reorg_replaces_blocks_with_given_transactions(dn: Devnet) -> None:
    poster, agent = dn.posters[0], dn.agents[0]
    tid = dn.post_task(poster)
    accept_block = dn.accept_task(tid, sender=agent)["blockNumber"]
    old_hash = dn.rpc("eth_getBlockByNumber", hex(accept_block), False)["hash"]
    # Replace the acceptance block by one where another agent takes the task.
    raw = dn.sign_escrow_call(dn.agents[1], "acceptTask", tid)
    dn.reorg(1, [(raw, 0)])
    new_block = dn.rpc("eth_getBlockByNumber", hex(accept_block), False)
    assert new_block["hash"] != old_hash
    assert len(new_block["transactions"]) == 1
    assert dn.get_task(tid).agent == dn.agents[1].address
    events = [e.name for e in dn.logs(from_block=accept_block)]
    assert events == ["TaskAccepted"]


def test_revert_carries_error_and_transaction(dn: Devnet) -> None:
    tid = dn.post_task(dn.posters[0])
    with pytest.raises(EscrowRevert) as info:
        dn.complete_verification(tid, 1, text_hash("x"), True, 100, sender=dn.marketplace_verifier)
    assert info.value.name == "WrongStatus"
    assert info.value.error_args == (TaskStatus.OPEN,)
    assert info.value.tx_hash and info.value.tx_hash.startswith("0x")
    assert str(info.value) == "WrongStatus(0,)"


def test_devnet_command_prints_json_and_stops_anvil_on_interrupt() -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from escrowd.devnet_cli import devnet; import typer; typer.run(devnet)",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ},
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        for line in proc.stdout:
            lines.append(line)
            if line.rstrip() == "}":
                break
        doc = json.loads("".join(lines))
        assert doc["chain_id"] == 31337
        assert doc["rpc_url"].startswith("http://127.0.0.1:")
        assert len(doc["actors"]["posters"]) == 3
        port = int(doc["rpc_url"].rsplit(":", 1)[1])
        ping = AnvilProcess(port=port)
        assert ping._rpc("eth_chainId") == hex(31337)
        escrow_code = ping._rpc("eth_getCode", [doc["contracts"]["escrow"], "latest"])
        assert isinstance(escrow_code, str) and len(escrow_code) > 1000
        proc.send_signal(2)  # SIGINT, as Ctrl-C
        assert proc.wait(timeout=120) == 0  # generous (loaded CI): returns as soon as it exits
        with pytest.raises(OSError):
            ping._rpc("eth_chainId")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
