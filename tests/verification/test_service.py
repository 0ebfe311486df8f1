"""The service shell: settings, the signing key (never shown), the CLI entry points, the retry scheduler."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account
from structlog.testing import capture_logs
from typer.testing import CliRunner

from escrowd import verification_cli as consumer_cli
from runtime.db import connect
from schemas import topics
from schemas.task_terms import result_hash
from verification.routing import RetryPolicy
from verification.service import (
    RetryScheduler,
    SigningKeyError,
    VerificationSettings,
    load_signing_key,
)

from .conftest import CHAIN_ID, ESCROW, Api, IndexedChain, Who, drain, finalized_task, make_handler

KEY = "0x" + "4c" * 32
ADDRESS = Account.from_key(KEY).address


def settings(**extra: Any) -> VerificationSettings:
    values: dict[str, Any] = {"database_url": "postgresql://u@h/d", "kafka_bootstrap": "127.0.0.1:9092"}
    values.update(extra)
    return VerificationSettings(**values)


def test_signing_key_from_raw_setting_or_keystore(tmp_path: Path) -> None:
    """Raw key for the devnet; an encrypted keystore with its password otherwise."""
    assert load_signing_key(settings(verification_signing_key=KEY)) == KEY
    keystore = tmp_path / "key.json"
    keystore.write_text(json.dumps(Account.encrypt(bytes.fromhex(KEY[2:]), "pw", iterations=2)))
    loaded = load_signing_key(settings(verification_keystore=keystore, verification_keystore_password="pw"))
    assert loaded == KEY


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({}, "set verification_keystore"),
        ({"verification_signing_key": "0x1234"}, "not a valid secp256k1 private key"),
        ({"verification_keystore": "/nonexistent/key.json"}, "password is not"),
    ],
)
def test_signing_key_errors_never_show_the_key(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(SigningKeyError, match=message) as caught:
        load_signing_key(settings(**extra))
    assert "1234" not in str(caught.value)


def test_keystore_password_from_a_file(tmp_path: Path) -> None:
    """`verification_keystore_password_file`, like the relayer's and the arbiter's: whitespace trimmed, one of the two forms."""
    keystore = tmp_path / "key.json"
    keystore.write_text(json.dumps(Account.encrypt(bytes.fromhex(KEY[2:]), "from-a-file", iterations=2)))
    password = tmp_path / "password"
    password.write_text("from-a-file\n")
    loaded = load_signing_key(settings(verification_keystore=keystore, verification_keystore_password_file=password))
    assert loaded == KEY
    with pytest.raises(SigningKeyError, match="set one of"):
        load_signing_key(settings(verification_keystore=keystore, verification_keystore_password_file=password,
                                  verification_keystore_password="from-a-file"))  # fmt: skip
    with pytest.raises(SigningKeyError, match="cannot read") as caught:
        load_signing_key(settings(verification_keystore=keystore, verification_keystore_password_file=tmp_path / "absent"))
    assert "from-a-file" not in str(caught.value)
    password.write_text("wrong-password-in-file")
    with pytest.raises(SigningKeyError, match="cannot decrypt") as caught:
        load_signing_key(settings(verification_keystore=keystore, verification_keystore_password_file=password))
    assert "wrong-password-in-file" not in str(caught.value)


def test_wrong_keystore_password_is_an_error_without_the_password(tmp_path: Path) -> None:
    keystore = tmp_path / "key.json"
    keystore.write_text(json.dumps(Account.encrypt(bytes.fromhex(KEY[2:]), "right", iterations=2)))
    with pytest.raises(SigningKeyError, match="cannot decrypt") as caught:
        load_signing_key(settings(verification_keystore=keystore, verification_keystore_password="wrong-password"))
    assert "wrong-password" not in str(caught.value)


def test_settings_build_the_registry_topics_and_policy(tmp_path: Path) -> None:
    s = settings(plugin_packages=["p"], endpoint_hosts=["h"], endpoint_timeout=5, rubric_dir=tmp_path, events_topic="x.events")
    registry = s.registry()
    assert (registry.allowed_plugin_packages, registry.allowed_endpoint_hosts, registry.endpoint_timeout) == (("p",), ("h",), 5)
    assert s.topics().events == "x.events" and s.topics().verdicts == topics.VERDICTS
    assert RetryPolicy(s.retry_base_seconds, s.retry_max_seconds).delay(1) == 5
    with pytest.raises(ValueError, match="postgresql"):
        settings(database_url="mysql://x")


def test_cli_check_prints_the_signer_and_never_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ESCROWD_DATABASE_URL", "postgresql://u@h/d")
    monkeypatch.setenv("ESCROWD_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    monkeypatch.setenv("ESCROWD_VERIFICATION_SIGNING_KEY", KEY)
    result = CliRunner().invoke(consumer_cli.app, ["check"])
    assert result.exit_code == 0 and ADDRESS in result.output and KEY[2:] not in result.output
    monkeypatch.setenv("ESCROWD_VERIFICATION_SIGNING_KEY", "0xnothex")
    result = CliRunner().invoke(consumer_cli.app, ["check"])
    assert result.exit_code == 2 and "signing key" in result.output


async def test_signing_key_never_reaches_the_logs(api: Api, chain: IndexedChain, who: dict[str, Who], database_url: str) -> None:
    """A judged and signed verdict logs its effects, never the service's key."""
    from .conftest import SIGNING_KEY

    body = {"chainId": CHAIN_ID, "escrow": ESCROW, "poster": who["poster"].address, "instructionsDigest": "0x" + "ab" * 32,
            "verificationMode": "auto", "verificationCriteria": {"min_length": 5}}  # fmt: skip
    task_hash = (await api.call("POST", "/v1/terms", body, as_=who["poster"])).json()["taskHash"]
    await chain.created(3, who["poster"].address, task_hash)
    await chain.accepted(3, who["agent"].address)
    await chain.submitted(3, who["agent"].address, 1, result_hash("a long enough answer with words"))
    path = f"/v1/tasks/{CHAIN_ID}/{ESCROW}/3/finalize"
    assert (await api.call("POST", path, {"result": "a long enough answer with words"}, as_=who["agent"])).status_code == 202
    with capture_logs() as logs:
        await drain(database_url, make_handler())
    assert any(entry["event"] == "verification_effect" and entry["effect"] == "RecordResult" for entry in logs)
    text = json.dumps(logs, default=str).lower()
    assert SIGNING_KEY[2:].lower() not in text


async def test_retry_scheduler_queues_due_retries_once(api: Api, chain: IndexedChain, who: dict[str, Who], database_url: str) -> None:
    """A finalize waiting for its retry is queued on the requests topic when due, and only once."""
    from verification.verifiers import default_registry

    await finalized_task(api, chain, who, 4, "tests.verification.plugins.broken:score")
    registry = default_registry(allowed_plugin_packages=["tests.verification.plugins"])
    await drain(database_url, make_handler(registry=registry))
    scheduler = RetryScheduler(database_url, topics.VERIFICATION_REQUESTS)
    conn = await connect(database_url)
    try:
        assert await scheduler.run_once(conn) == 1
        assert await scheduler.run_once(conn) == 0
        row = await conn.fetchrow("SELECT state, retry_count FROM verification_requests WHERE kind = 'finalize' AND task_id = 4")
        assert (row["state"], row["retry_count"]) == ("retry_queued", 1)
        await drain(database_url, make_handler(registry=registry))  # the retry runs, and fails again
        row = await conn.fetchrow("SELECT state, retry_count FROM verification_requests WHERE kind = 'finalize' AND task_id = 4")
        assert (row["state"], row["retry_count"]) == ("waiting_retry", 2)
        assert await conn.fetchval("SELECT count(*) FROM verification_results WHERE task_id = 4") == 0
    finally:
        await conn.close()


async def test_retry_scheduler_outlives_a_database_restart(
    api: Api, chain: IndexedChain, who: dict[str, Who], database_url: str
) -> None:
    """A database restart closes the scheduler's session (as `pg_terminate_backend` does: the
    server's admin shutdown): the loop reconnects and queues the retry once it is due. It caught
    only OSError and TimeoutError, so the closed session ended the loop, and with it the
    verification service."""
    import asyncio

    from verification.verifiers import default_registry

    await finalized_task(api, chain, who, 5, "tests.verification.plugins.broken:score")
    registry = default_registry(allowed_plugin_packages=["tests.verification.plugins"])
    await drain(database_url, make_handler(registry=registry))  # could not answer: a retry, not due yet
    scheduler = asyncio.create_task(RetryScheduler(database_url, topics.VERIFICATION_REQUESTS, poll_seconds=0.05).run())
    conn = await connect(database_url)
    try:
        backend = None
        while backend is None:  # the scheduler's session, once it has polled
            assert not scheduler.done()
            backend = await conn.fetchval(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND query LIKE '%retry_queued%'"
            )
            await asyncio.sleep(0.05)
        assert await conn.fetchval("SELECT pg_terminate_backend($1)", backend)
        while True:  # until it is gone: then only a new session can queue the retry
            if not await conn.fetchval("SELECT 1 FROM pg_stat_activity WHERE pid = $1", backend):
                break
            await asyncio.sleep(0.05)
        await conn.execute("UPDATE verification_requests SET next_retry_at = now() WHERE state = 'waiting_retry'")
        state = None
        while state != "retry_queued":
            assert not scheduler.done(), scheduler.exception()
            state = await conn.fetchval("SELECT state FROM verification_requests WHERE kind = 'finalize' AND task_id = 5")
            await asyncio.sleep(0.05)
    finally:
        scheduler.cancel()
        await asyncio.gather(scheduler, return_exceptions=True)
        await conn.close()
