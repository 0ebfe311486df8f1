"""The relayer key (and keystore password) never reach logs, metrics or error bodies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
from fastapi import FastAPI

from chain.keys import SecretKey, write_keystore
from relayer.settlement.routes import metrics_router, router
from runtime.logging import register_secret

REPO = Path(__file__).resolve().parents[2]
# anvil's public test key #2 (the devnet's marketplace verifier)
KEY = "0x5de4111afa1a4b94908f83103eb1f1706367c2e68ca870fc3fb9a804cdab365a"


def base_env(**extra: str) -> dict[str, str]:
    chains = [{"chain_id": 31337, "rpc_urls": ["http://127.0.0.1:9"], "escrow_addresses": ["0x" + "11" * 20]}]
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("ESCROWD_")
    }
    env.update(
        {
            "ESCROWD_DATABASE_URL": "postgresql://nobody@127.0.0.1:9/none",
            "ESCROWD_KAFKA_BOOTSTRAP": "127.0.0.1:9",
            "ESCROWD_CHAINS": json.dumps(chains),
            "ESCROWD_RELAYER_TRUSTED_SIGNERS": "0x" + "22" * 20,
        }
    )
    env.update(extra)
    return env


def run_cli(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "relayer.settlement.cli", "run"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def assert_clean(text: str, *secrets: str) -> None:
    lowered = text.lower()
    for secret in secrets:
        bare = secret.lower().removeprefix("0x")
        assert bare not in lowered, f"secret leaked into: {text[:500]}"


def test_invalid_settings_error_does_not_echo_the_key() -> None:
    """A settings error names the bad field, never the key set next to it."""
    result = run_cli(base_env(ESCROWD_RELAYER_KEY=KEY, ESCROWD_RELAYER_TRUSTED_SIGNERS="not-an-address"))
    assert result.returncode == 2
    assert "relayer_trusted_signers" in result.stderr
    assert_clean(result.stdout + result.stderr, KEY)


def test_wrong_keystore_password_error_is_clean(tmp_path: Path) -> None:
    """A keystore that will not open says so, without the password or the key."""
    keystore = tmp_path / "relayer.json"
    write_keystore(SecretKey.from_hex(KEY), keystore, "the-right-password", kdf="pbkdf2", iterations=1000)
    password = "a-wrong-password-123"
    result = run_cli(
        base_env(ESCROWD_RELAYER_KEYSTORE=str(keystore), ESCROWD_RELAYER_KEYSTORE_PASSWORD=password)
    )
    assert result.returncode == 2
    assert "wrong password" in result.stderr
    assert_clean(result.stdout + result.stderr, KEY, password, "the-right-password")


async def test_health_error_body_is_redacted() -> None:
    """When producing the report fails, the body is a short error without secrets."""
    register_secret(KEY)

    class Failing:
        async def report(self) -> object:
            raise RuntimeError(f"boom with {KEY}")

    app = FastAPI()
    app.state.bridge_health = Failing()
    app.include_router(router)
    app.include_router(metrics_router)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://relayer") as client:
        response = await client.get("/health/bridge")
        assert response.status_code == 503
        assert response.json() == {"status": "failing", "error": "RuntimeError"}
        assert_clean(response.text, KEY)
        missing = await client.get("/nowhere")
        assert missing.status_code == 404
        assert_clean(missing.text, KEY)
        metrics_text = (await client.get("/metrics")).text
        assert "escrowd_relayer_verifier_key_match" in metrics_text
        assert_clean(metrics_text, KEY)


async def test_unconfigured_health_answers_503() -> None:
    """Without a source the endpoint says so rather than crashing."""
    app = FastAPI()
    app.include_router(router)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as client:
        response = await client.get("/health/bridge")
    assert response.status_code == 503 and response.json()["status"] == "failing"
