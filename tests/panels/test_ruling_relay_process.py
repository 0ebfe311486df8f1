"""`escrowd relay rulings` as a real process, the way deploy/ runs it: the arbiter key from an
encrypted keystore and a password file (or held by a remote signer), probes on ESCROWD_METRICS_PORT, a signed ruling from
Kafka resolved on anvil, a clean stop on SIGTERM; and a bad configuration refused in one line
that names the field and never the key."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from aiokafka import AIOKafkaProducer

from chain.keys import SecretKey, write_keystore
from escrowd.devnet import Devnet
from runtime.kafka import TopicSpec, encode_headers, ensure_topics
from runtime.services.localkms import LocalKms
from runtime.services.localsigner import RemoteSignerProcess
from runtime.services.ports import free_port
from schemas import panels as msg
from schemas.task_state import TaskStatus
from tests.panels.rulings_support import PANEL_KEY, disputed_task

ESCROWD = Path(sys.executable).with_name("escrowd")


def _env(devnet: Devnet, database_url: str, kafka_bootstrap: str, topic: str, dlq: str) -> dict[str, str]:
    panel_signer = msg.sign_ruling(msg.Ruling(chain_id=1, escrow="0x" + "00" * 20, task_id=1, round=1,
                                              agent_share_bps=0), PANEL_KEY).signer
    return {
        **os.environ,
        "ESCROWD_DATABASE_URL": database_url,
        "ESCROWD_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "ESCROWD_RULING_CHAIN_ID": str(devnet.chain_id),
        "ESCROWD_RULING_RPC_URL": devnet.rpc_url,
        "ESCROWD_RULING_ESCROW": devnet.escrow_address,
        "ESCROWD_RULING_TRUSTED_SIGNERS": f'["{panel_signer}"]',
        "ESCROWD_RULING_INTERVAL": "0.2",
        "ESCROWD_PANEL_RULINGS_TOPIC": topic,
        "ESCROWD_DEAD_LETTER_TOPIC": dlq,
    }


@pytest.mark.parametrize("signer", ["keystore", "aws-kms", "remote"])
async def test_relay_rulings_process_with_a_keystore_and_probes(
    devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, signer: str
) -> None:
    """The arbiter key in an encrypted keystore, or held by a KMS key (the local KMS process)
    or a remote signer process (`ruling_signer`): no key in the relay's process or
    environment at all."""
    topic, dlq = f"{topic_prefix}rulings", f"{topic_prefix}dlq"
    await ensure_topics(kafka_bootstrap, [TopicSpec(topic, 1), TopicSpec(dlq, 1)])
    task_id = await asyncio.to_thread(disputed_task, devnet)
    port = free_port()
    env = {**_env(devnet, database_url, kafka_bootstrap, topic, dlq), "ESCROWD_METRICS_PORT": str(port)}
    remote: RemoteSignerProcess | LocalKms | None = None
    if signer == "keystore":
        keystore, password = tmp_path / "arbiter-keystore.json", tmp_path / "arbiter-keystore-password"
        password.write_text("correct horse battery staple\n")
        write_keystore(SecretKey.from_hex(devnet.arbiter.private_key), keystore, "correct horse battery staple",
                       kdf="pbkdf2", iterations=1_000)
        env["ESCROWD_RULING_ARBITER_KEYSTORE"] = str(keystore)
        env["ESCROWD_RULING_ARBITER_KEYSTORE_PASSWORD_FILE"] = str(password)
    elif signer == "aws-kms":
        remote = LocalKms({"arbiter": devnet.arbiter.private_key}).start()
        env |= {"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local"}
        env["ESCROWD_RULING_SIGNER"] = json.dumps(
            {"kind": "aws-kms", "kms_key_id": "arbiter", "kms_endpoint_url": remote.url,
             "address": devnet.arbiter.address, "timeout": 5})
    else:
        remote = RemoteSignerProcess(devnet.arbiter.private_key).start()
        env["ESCROWD_RULING_SIGNER"] = json.dumps(
            {"kind": "remote", "remote_url": remote.url, "address": devnet.arbiter.address, "timeout": 5})
    log = (tmp_path / "rulings.log").open("wb")
    process = subprocess.Popen([str(ESCROWD), "relay", "rulings"], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:

            async def ready() -> bool:
                assert process.poll() is None, (tmp_path / "rulings.log").read_text()[-2000:]
                try:
                    return (await client.get("/readyz")).status_code == 200
                except httpx.TransportError:
                    return False

            for _ in range(600):
                if await ready():
                    break
                await asyncio.sleep(0.2)
            else:
                raise AssertionError("/readyz never answered 200")
            assert (await client.get("/healthz")).status_code == 200
            parts = (await client.get("/readyz")).json()["parts"]
            assert parts["ruling-sender"] is True and parts["escrowd-relayer-rulings"] is True

            ruling = msg.Ruling(chain_id=devnet.chain_id, escrow=devnet.escrow_address, task_id=task_id, round=1,
                                agent_share_bps=8_000)
            signed = msg.sign_ruling(ruling, PANEL_KEY)
            producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=False)
            await producer.start()
            try:
                await producer.send_and_wait(
                    topic, value=signed.model_dump_json().encode(), key=f"{devnet.chain_id}:{task_id}".encode(),
                    headers=encode_headers({"ce_id": msg.ruling_message_id(ruling), "ce_type": msg.RULING_EVENT_TYPE}),
                )
            finally:
                await producer.stop()
            for _ in range(600):
                assert process.poll() is None, (tmp_path / "rulings.log").read_text()[-2000:]
                view = await asyncio.to_thread(devnet.get_task, task_id)
                if view.status == TaskStatus.RESOLVED:
                    break
                await asyncio.sleep(0.2)
            else:
                raise AssertionError("the ruling was never sent")
            metrics = (await client.get("/metrics")).text
            assert 'escrowd_relayer_rulings_total{outcome="sent"}' in metrics
            assert f'escrowd_signer_up{{key="arbiter",kind="{signer}"}} 1.0' in metrics
            assert f'escrowd_relayer_arbiter_matches{{chain_id="{devnet.chain_id}"}} 1.0' in metrics
        process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(process.wait, 60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if remote is not None:
            remote.stop()
    text = (tmp_path / "rulings.log").read_text()
    assert devnet.arbiter.private_key[2:].lower() not in text.lower()
    assert "correct horse" not in text


def test_relay_rulings_refuses_two_keys_in_one_line_without_the_key(
    devnet: Devnet, database_url: str, tmp_path: Path
) -> None:
    env = {
        **_env(devnet, database_url, "127.0.0.1:1", "t", "d"),
        "ESCROWD_RULING_ARBITER_KEY": devnet.arbiter.private_key,
        "ESCROWD_RULING_ARBITER_KEYSTORE": str(tmp_path / "arbiter-keystore.json"),
    }
    done = subprocess.run([str(ESCROWD), "relay", "rulings"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "ruling_arbiter_keystore" in lines[0]
    assert devnet.arbiter.private_key[2:].lower() not in (done.stderr + done.stdout).lower()


def test_relay_rulings_refuses_a_public_test_key_on_a_real_chain(
    devnet: Devnet, database_url: str, tmp_path: Path
) -> None:
    """The compose defaults trust anvil's account 8 as the panel signer, whose private key is
    public. Deployed against a real chain with that default left in place, anyone able to
    write to the rulings topic could sign a ruling with any split and the arbiter key would
    send it. Outside a local devnet chain a well-known test key is refused, as signer or arbiter."""
    from escrowd.devnet import anvil_key

    public_signer = anvil_key(8)[0]
    env = {
        **_env(devnet, database_url, "127.0.0.1:1", "t", "d"),
        "ESCROWD_RULING_CHAIN_ID": "11155111",
        "ESCROWD_RULING_TRUSTED_SIGNERS": f'["{public_signer}"]',
        "ESCROWD_RULING_ARBITER_KEY": "0x" + "7a" * 32,
    }
    done = subprocess.run([str(ESCROWD), "relay", "rulings"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "ruling_trusted_signers" in lines[0] and "public test key" in lines[0]

    env["ESCROWD_RULING_TRUSTED_SIGNERS"] = f'["{SecretKey.from_hex("0x" + "7b" * 32).address}"]'
    env["ESCROWD_RULING_ARBITER_KEY"] = anvil_key(1)[1]
    done = subprocess.run([str(ESCROWD), "relay", "rulings"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "public test key" in lines[0]
    assert anvil_key(1)[1][2:].lower() not in (done.stderr + done.stdout).lower()


def test_relay_rulings_with_an_unreachable_signer_stops_in_one_line(devnet: Devnet, database_url: str) -> None:
    """The arbiter's remote signer does not answer at start: exit 2 with one line, nothing
    left open behind it, and no fallback to a key in the environment (there is none)."""
    env = {
        **_env(devnet, database_url, "127.0.0.1:1", "t", "d"),
        "ESCROWD_RULING_SIGNER": json.dumps(
            {"kind": "remote", "remote_url": f"http://127.0.0.1:{free_port()}", "address": devnet.arbiter.address,
             "timeout": 2}),
    }
    done = subprocess.run([str(ESCROWD), "relay", "rulings"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("arbiter key:"), done.stderr
