"""No secret value in the output of a failing start-up (issue 11, item 9).

Each secret-bearing setting gets a bad value through a real `escrowd` process: the process
must exit 2 with a short line naming the field, no traceback, and none of the forms the
value could be printed in (as written, as decimal digits, as hex, the URL's password).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from escrowd.harness import escrowd_command

PASSWORD = 918273645546372819  # a numeric keystore password: YAML reads it as an int
KEY = 0x4C0883A69102937D6231471B5DBB6204FE5129617082792AE468D01A3F362318  # unquoted 0x key: an int
DB_PASSWORD = "Sup3rS3cretPw"
BAD_DB_URL = f"mysql://escrowd:{DB_PASSWORD}@db.example:5432/escrowd"
GOOD_DB_URL_WITH_PASSWORD = f"postgresql://escrowd:{DB_PASSWORD}@127.0.0.1:1/escrowd"


def forms() -> list[str]:
    """Every spelling of the secrets that must never appear."""
    key_hex = f"{KEY:064x}"
    return [str(PASSWORD), str(KEY), str(KEY)[:16], key_hex, key_hex.upper(), key_hex[-16:], DB_PASSWORD]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ESCROWD_") and k not in ("DATABASE_URL", "KAFKA_BOOTSTRAP")}
    env.update(extra)
    return env


def start(argv: list[str], env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*escrowd_command(), *argv], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=180)


def assert_clean_failure(proc: subprocess.CompletedProcess[str], field: str) -> None:
    output = proc.stdout + proc.stderr
    for secret in forms():
        assert secret not in output, f"secret printed: {output}"
    assert proc.returncode == 2, output
    assert "Traceback" not in output, output
    assert field in output, output


RELAYER_YAML = """
chains:
  - chain_id: 31337
    rpc_urls: [http://127.0.0.1:1]
    escrow_addresses: ["0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512"]
relayer_trusted_signers: ["0x0000000000000000000000000000000000000001"]
"""


CASES = {
    "relayer keystore password (number in YAML)": (
        ["relay", "run", "--config", "{config}"],
        RELAYER_YAML + f"relayer_keystore: /nonexistent.json\nrelayer_keystore_password: {PASSWORD}\n",
        {"ESCROWD_DATABASE_URL": "postgresql://x@127.0.0.1:1/x", "ESCROWD_KAFKA_BOOTSTRAP": "127.0.0.1:1"},
        "relayer_keystore_password",
    ),
    "relayer key (unquoted 0x in YAML)": (
        ["relay", "run", "--config", "{config}"],
        RELAYER_YAML + f"relayer_key: {KEY:#066x}\n",
        {"ESCROWD_DATABASE_URL": "postgresql://x@127.0.0.1:1/x", "ESCROWD_KAFKA_BOOTSTRAP": "127.0.0.1:1"},
        "relayer_key",
    ),
    "relayer database URL (password, wrong scheme)": (
        ["relay", "run", "--config", "{config}"],
        RELAYER_YAML + f"relayer_key: '{KEY:#066x}'\ndatabase_url: {BAD_DB_URL}\n",
        {"ESCROWD_KAFKA_BOOTSTRAP": "127.0.0.1:1"},
        "database_url",
    ),
    "indexer database URL (password, wrong scheme)": (
        ["index", "run", "--config", "{config}"],
        f"indexer:\n  database_url: {BAD_DB_URL}\n  kafka_bootstrap: 127.0.0.1:1\n  chains: []\n",
        {},
        "database_url",
    ),
    "YAML syntax error on a secret line": (
        ["relay", "run", "--config", "{config}"],
        RELAYER_YAML + f"relayer_keystore_password: [{PASSWORD}\n",
        {},
        "YAML",
    ),
    "config check on every bad value": (
        ["config", "check", "--config", "{config}"],
        f"indexer:\n  database_url: {BAD_DB_URL}\n  chains: []\n" + RELAYER_YAML
        + f"relayer_key: {KEY:#066x}\nrelayer_keystore_password: {PASSWORD}\ndatabase_url: {BAD_DB_URL}\n",
        {"ESCROWD_KAFKA_BOOTSTRAP": "127.0.0.1:1"},
        "relayer_key",
    ),
    "API database URL from the environment": (
        ["api", "serve"], None, {"ESCROWD_DATABASE_URL": BAD_DB_URL}, "database_url",
    ),
    "lifecycle consumer database URL": (
        ["consume", "lifecycle"], None, {"ESCROWD_DATABASE_URL": BAD_DB_URL, "ESCROWD_KAFKA_BOOTSTRAP": "127.0.0.1:1"}, "database_url",
    ),
    "verification signing key that is not a key": (
        ["consume", "verification", "check"], None,
        {"ESCROWD_DATABASE_URL": "postgresql://x@127.0.0.1:1/x", "ESCROWD_KAFKA_BOOTSTRAP": "127.0.0.1:1",
         "ESCROWD_VERIFICATION_SIGNING_KEY": f"{KEY:064x}zz"},
        "signing key",
    ),
    "verification database URL": (
        ["consume", "verification", "check"], None,
        {"ESCROWD_DATABASE_URL": BAD_DB_URL, "ESCROWD_KAFKA_BOOTSTRAP": "127.0.0.1:1"}, "database_url",
    ),
    "ruling arbiter key (unquoted 0x in the rulings section)": (
        ["relay", "rulings", "--config", "{config}"], f"rulings:\n  ruling_arbiter_key: {KEY:#066x}\n", {},
        "ruling_arbiter_key",
    ),
    "panel signing key under a misspelt name": (
        ["consume", "panels", "--config", "{config}"], f"panels:\n  panel_signing_kye: '{KEY:#066x}'\n", {},
        "panel_signing_kye",
    ),
    "verifier agent wallet key in the file": (
        ["verifier-agent", "--config", "{config}"], f"verifier_agent:\n  wallet_key: {KEY:#066x}\n", {},
        "wallet_key",
    ),
    "verifier bot key pasted as a key name": (
        ["verifier-bot", "--config", "{config}"], f"verifier_bot:\n  {KEY:#066x}: 1\n", {}, "unknown key",
    ),
    "verifier agent model URL with a password": (
        ["verifier-agent"], None,
        {"ESCROWD_VERIFIER_API_URL": "http://127.0.0.1:1", "ESCROWD_VERIFIER_RPC_URL": "http://127.0.0.1:1",
         "ESCROWD_VERIFIER_CHAIN_ID": "31337", "ESCROWD_VERIFIER_ESCROW_ADDRESS": "0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512",
         "ESCROWD_VERIFIER_WALLET_KEY": f"{KEY:#066x}", "ESCROWD_DATABASE_URL": "postgresql://escrowd@127.0.0.1:1/escrowd",
         "ESCROWD_MODEL_URL": f"ftp://judge:{DB_PASSWORD}@model.example/v1"},
        "url",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_failing_start_up_prints_no_secret(case: str, tmp_path: Path) -> None:
    argv, yaml_text, env, field = CASES[case]
    config = tmp_path / "config.yaml"
    if yaml_text is not None:
        config.write_text(yaml_text, encoding="utf-8")
    proc = start([a.format(config=config) for a in argv], clean_env(**env), tmp_path)
    assert_clean_failure(proc, field)


def test_unreachable_database_is_one_line_with_the_url_redacted(tmp_path: Path) -> None:
    """A real connection failure (nothing listens on port 1) names the database, not the password."""
    proc = start(["db", "migrate"], clean_env(ESCROWD_DATABASE_URL=GOOD_DB_URL_WITH_PASSWORD), tmp_path)
    assert_clean_failure(proc, "database")
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    proc = start(["--debug", "db", "migrate"], clean_env(ESCROWD_DATABASE_URL="postgresql://x@127.0.0.1:1/x"), tmp_path)
    assert proc.returncode != 0
    assert "Traceback" in proc.stderr
