"""One configuration scheme: `ESCROWD_*` over the file, `${VAR}` in it, sections, `config check`."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from escrowd.harness import escrowd_command
from indexer.config import load_settings
from relayer.settlement.config import RelayerSettings
from runtime.errors import StartupError

ROOT = Path(__file__).resolve().parents[2]
KEY = "0x" + "ab" * 32
CHAIN = {"chain_id": 31337, "rpc_urls": ["http://127.0.0.1:8545"], "escrow_addresses": ["0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512"]}


@pytest.fixture(autouse=True)
def _no_escrowd_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("ESCROWD_"):
            monkeypatch.delenv(name)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_environment_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = _write(tmp_path, f"""
database_url: postgresql://file@db/escrowd
kafka_bootstrap: file:9092
chains: [{{chain_id: 31337, rpc_urls: ["http://127.0.0.1:8545"], escrow_addresses: ["{CHAIN['escrow_addresses'][0]}"]}}]
indexer:
  topic_partitions: 3
  metrics_port: 9100
relayer:
  relayer_key: "{KEY}"
  relayer_trusted_signers: ["0x0000000000000000000000000000000000000001"]
  relayer_poll_interval: 0.75
""")
    monkeypatch.setenv("ESCROWD_DATABASE_URL", "postgresql://env@db/escrowd")
    monkeypatch.setenv("ESCROWD_METRICS_PORT", "9200")
    monkeypatch.setenv("ESCROWD_RELAYER_POLL_INTERVAL", "2.5")
    indexer = load_settings(config)
    assert indexer.database_url == "postgresql://env@db/escrowd"  # env over the shared key
    assert indexer.metrics_port == 9200  # env over the section
    assert indexer.topic_partitions == 3 and indexer.kafka_bootstrap == "file:9092"  # file where env is silent
    relayer = RelayerSettings.load(config)
    assert relayer.database_url == "postgresql://env@db/escrowd"
    assert relayer.relayer_poll_interval == 2.5
    assert relayer.kafka_bootstrap == "file:9092" and relayer.chains[0].chain_id == 31337
    assert RelayerSettings.load(config, relayer_poll_interval=9.0).relayer_poll_interval == 9.0  # arguments win


def test_variables_are_expanded_after_parsing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = _write(tmp_path, """
database_url: postgresql://escrowd:${PGPASSWORD}@${PGHOST:-localhost}/escrowd
kafka_bootstrap: "${BROKER}"
indexer:
  chains: [{chain_id: 31337, rpc_urls: ["${RPC_URL}"], escrow_addresses: ["0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512"]}]
""")
    monkeypatch.setenv("PGPASSWORD", "pw")
    monkeypatch.setenv("BROKER", "kafka:9092\nextra: injected")  # stays one string value
    monkeypatch.setenv("RPC_URL", "http://rpc:8545")
    settings = load_settings(config)
    assert settings.database_url == "postgresql://escrowd:pw@localhost/escrowd"
    assert settings.kafka_bootstrap == "kafka:9092\nextra: injected"
    assert settings.chains[0].rpc_urls == ["http://rpc:8545"]
    monkeypatch.delenv("RPC_URL")
    with pytest.raises(StartupError, match=r"indexer\.chains\[0\]\.rpc_urls\[0\].*\$\{RPC_URL\}"):
        load_settings(config)


def _check(config: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("ESCROWD_")}
    # The secrets it names are mounted files in a deployment, absent here: lint without them.
    return subprocess.run([*escrowd_command(), "config", "check", "--no-secrets", "--config", str(config)],
                          capture_output=True, text=True, env={**base, **env}, timeout=120)  # fmt: skip


SERVICE_ENV = {
    "ESCROWD_DATABASE_URL": "postgresql://escrowd@postgres:5432/escrowd",
    "ESCROWD_KAFKA_BOOTSTRAP": "kafka:9092",
    "ESCROWD_RELAYER_KEYSTORE": "/run/secrets/relayer-keystore.json",
    "ESCROWD_RELAYER_KEYSTORE_PASSWORD_FILE": "/run/secrets/relayer-keystore-password",
}


def test_config_check_accepts_the_shipped_example() -> None:
    proc = _check(ROOT / "deploy" / "config.example.yaml", SERVICE_ENV)
    assert proc.returncode == 0, proc.stderr
    assert "indexer: ok" in proc.stdout and "relayer: ok" in proc.stdout


@pytest.mark.parametrize(
    "text,field",
    [("indexer:\n  chains: []\n", "chains"),
     ("indexer:\n  topic_partitions: zero\n", "topic_partitions"),
     ("relayer_fee_bump_bps: -5\n", "relayer_fee_bump_bps"),
     ("indexer: [unclosed\n", "YAML"),
     ("indexer:\n  database_url: ${NOT_SET_ANYWHERE}\n", "NOT_SET_ANYWHERE")],
    ids=["empty-chains", "wrong-type", "out-of-range", "bad-yaml", "unset-variable"],
)  # fmt: skip
def test_config_check_names_the_bad_field(text: str, field: str, tmp_path: Path) -> None:
    base = (ROOT / "deploy" / "config.example.yaml").read_text(encoding="utf-8")
    config = _write(tmp_path, text if field == "YAML" else base + "\n" + text if not text.startswith("indexer") else text)
    proc = _check(config, SERVICE_ENV)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert field in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 5  # at most one line per section
