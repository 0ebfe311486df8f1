"""`escrowd config check` catches what would fail or silently misbehave at start-up.

Observation 6 of the operations issue, through the real CLI: a typo in a section that was not
checked strictly passed (metrics silently off); a wrong verification keystore password passed
(only the consumer's own check found it); the shipped example and the k8s ConfigMap could not
be linted without the relayer's secrets in the environment. Observation 7: lifecycle and
reputation shared one section, so on one host both took the same metrics port.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from pydantic import SecretStr

from chain.keys import SecretKey, write_keystore
from escrowd.harness import escrowd_command
from runtime.services.kafka import KafkaService
from runtime.services.ports import free_port
from tests.house.test_service_signals import empty_database  # noqa: F401 (fixture)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "config.example.yaml"
BASE_ENV = {"ESCROWD_DATABASE_URL": "postgresql://escrowd@127.0.0.1:1/escrowd", "ESCROWD_KAFKA_BOOTSTRAP": "127.0.0.1:1"}
PASSWORD = "correct horse battery staple"


@pytest.fixture(autouse=True)
def _no_escrowd_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("ESCROWD_"):
            monkeypatch.delenv(name)


def _check(config: Path, env: dict[str, str], cwd: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("ESCROWD_")}
    return subprocess.run([*escrowd_command(), "config", "check", "--config", str(config), *extra],
                          capture_output=True, text=True, env={**base, **env}, cwd=cwd, timeout=180)  # fmt: skip


def _configmap(tmp_path: Path) -> Path:
    doc = next(d for d in yaml.safe_load_all((ROOT / "deploy" / "k8s" / "configmap.yaml").read_text(encoding="utf-8"))
               if d and d.get("kind") == "ConfigMap")  # fmt: skip
    path = tmp_path / "configmap-config.yaml"
    path.write_text(doc["data"]["config.yaml"], encoding="utf-8")
    return path


def _keystore(tmp_path: Path, name: str, key_hex: str, password: str) -> tuple[Path, Path]:
    """A keystore of `key_hex` under `password`, and a password file holding `password`."""
    keystore, password_file = tmp_path / f"{name}-keystore.json", tmp_path / f"{name}-password"
    write_keystore(SecretKey.from_hex(key_hex), keystore, PASSWORD, kdf="pbkdf2", iterations=2)
    password_file.write_text(password + "\n", encoding="utf-8")
    return keystore, password_file


# ------------------------------------------------------------------ unknown keys, every section


@pytest.mark.parametrize("section", ["indexer", "relayer", "api", "verification", "lifecycle", "reputation"])
def test_a_typo_in_any_section_is_refused(section: str, tmp_path: Path) -> None:
    """`verification: {metrics_prt: 19101}` passed (rc 0, metrics off); every section now refuses it."""
    config = tmp_path / "config.yaml"
    config.write_text(f"{section}:\n  metrics_prt: 19101\n", encoding="utf-8")
    proc = _check(config, BASE_ENV, tmp_path, "--section", section, "--no-secrets")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{section}: configuration section {section}: unknown key metrics_prt" in proc.stderr, proc.stderr
    assert "19101" not in proc.stdout + proc.stderr


def test_the_shared_consumers_section_is_refused_with_its_migration_note(tmp_path: Path) -> None:
    """The old `consumers:` section gave lifecycle and reputation one port: refused, saying what replaces it,
    by `config check` and by the consumer at start-up."""
    config = tmp_path / "config.yaml"
    config.write_text("consumers:\n  metrics_port: 9100\n", encoding="utf-8")
    proc = _check(config, BASE_ENV, tmp_path, "--no-secrets")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "top level: unknown key consumers (the `consumers:` section is split into `lifecycle:` and `reputation:`" in proc.stderr
    base = {k: v for k, v in os.environ.items() if not k.startswith("ESCROWD_")}
    started = subprocess.run([*escrowd_command(), "consume", "reputation", "--config", str(config)], capture_output=True,
                             text=True, env={**base, **BASE_ENV}, cwd=tmp_path, timeout=180)  # fmt: skip
    assert started.returncode == 2, started.stdout + started.stderr
    assert "configuration section consumers: the `consumers:` section is split" in started.stderr
    assert "Traceback" not in started.stderr


# ------------------------------------------------------------------ secrets loaded, or skipped


def test_the_shipped_files_lint_without_secrets(tmp_path: Path) -> None:
    """The example and the ConfigMap failed (rc 2) without the relayer's secrets: `--no-secrets` lints them,
    while a check with secrets still demands them."""
    for config in (EXAMPLE, _configmap(tmp_path)):
        linted = _check(config, BASE_ENV, tmp_path, "--no-secrets")
        assert linted.returncode == 0, (config, linted.stdout, linted.stderr)
        assert "relayer: ok (secrets not checked)" in linted.stdout
        assert "verification: ok (secrets not checked)" in linted.stdout
        checked = _check(config, BASE_ENV, tmp_path)
        assert checked.returncode == 2, checked.stdout
        assert "relayer: " in checked.stderr and "verification: " in checked.stderr


def test_keystores_are_decrypted_with_their_passwords(tmp_path: Path) -> None:
    """A wrong verification (or relayer) keystore password passed `config check`; now it fails it,
    naming the section and the keystore, never the password."""
    config = tmp_path / "config.yaml"
    config.write_text(EXAMPLE.read_text(encoding="utf-8").split("\n# ------------------------------------------------------ dispute")[0],
                      encoding="utf-8")  # fmt: skip
    relayer_keystore, relayer_password = _keystore(tmp_path, "relayer", "0x" + "1d" * 32, PASSWORD)
    verifier_keystore, wrong_password = _keystore(tmp_path, "verification", "0x" + "2e" * 32, "not the password")
    env = {**BASE_ENV, "ESCROWD_RELAYER_KEYSTORE": str(relayer_keystore),
           "ESCROWD_RELAYER_KEYSTORE_PASSWORD_FILE": str(relayer_password),
           "ESCROWD_VERIFICATION_KEYSTORE": str(verifier_keystore),
           "ESCROWD_VERIFICATION_KEYSTORE_PASSWORD_FILE": str(wrong_password)}  # fmt: skip
    refused = _check(config, env, tmp_path)
    assert refused.returncode == 2, refused.stdout
    errors = refused.stderr.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("verification: cannot decrypt"), refused.stderr
    assert "relayer: ok" in refused.stdout
    assert "not the password" not in refused.stdout + refused.stderr

    wrong_password.write_text(PASSWORD + "\n", encoding="utf-8")
    passed = _check(config, env, tmp_path)
    assert passed.returncode == 0, passed.stderr
    assert "verification: ok" in passed.stdout and "relayer: ok" in passed.stdout

    relayer_password.write_text("wrong\n", encoding="utf-8")
    relayer_refused = _check(config, env, tmp_path)
    assert relayer_refused.returncode == 2
    assert "relayer: keystore" in relayer_refused.stderr and "wrong password" in relayer_refused.stderr


def test_keys_held_by_a_signer_need_no_key_in_the_configuration(tmp_path: Path) -> None:
    """With the relayer and verification keys in KMS there is no key to read: the check passes
    without one (and still refuses a keystore-held key that is missing)."""
    config = tmp_path / "config.yaml"
    config.write_text(EXAMPLE.read_text(encoding="utf-8").split("\n# ------------------------------------------------------ dispute")[0],
                      encoding="utf-8")  # fmt: skip
    kms = '{"kind": "aws-kms", "kms_key_id": "alias/%s"}'
    env = {**BASE_ENV, "ESCROWD_RELAYER_SIGNER": kms % "relayer", "ESCROWD_VERIFICATION_SIGNER": kms % "verification"}
    passed = _check(config, env, tmp_path)
    assert passed.returncode == 0, passed.stderr
    assert "verification: ok" in passed.stdout and "relayer: ok" in passed.stdout
    refused = _check(config, {**BASE_ENV, "ESCROWD_RELAYER_SIGNER": kms % "relayer"}, tmp_path)
    assert refused.returncode == 2 and "verification: " in refused.stderr and "relayer: " not in refused.stderr


def test_every_password_has_a_file_form() -> None:
    """A password can always come from a mounted file (`*_file`, `ESCROWD_*_FILE`)."""
    from escrowd.configref import settings_models

    seen = 0
    for model in settings_models():
        for name, field in model.model_fields.items():
            if "password" in name and not name.endswith("_file"):
                assert SecretStr in getattr(field.annotation, "__args__", (field.annotation,)), f"{model.__name__}.{name}"
                assert f"{name}_file" in model.model_fields, f"{model.__name__}.{name} has no {name}_file"
                seen += 1
    assert seen >= 3  # the relayer's, the verification service's and the arbiter's


# ------------------------------------------------------------------ one section, one port, per process


def test_the_shipped_example_gives_every_process_its_own_metrics_port() -> None:
    from runtime.config_file import SECTIONS

    example = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    ports = {name: example[name]["metrics_port"] for name in SECTIONS if "metrics_port" in example.get(name, {})}
    assert {"indexer", "verification", "lifecycle", "reputation", "panels", "rulings"} <= set(ports)
    assert len(set(ports.values())) == len(ports), ports
    assert example.get("relayer_port") not in ports.values()


def _healthz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as reply:
            return int(reply.status)
    except (urllib.error.URLError, ConnectionError):
        return 0


def test_lifecycle_and_reputation_on_one_host_take_their_own_ports(
    empty_database: str, kafka_service: KafkaService, tmp_path: Path  # noqa: F811
) -> None:
    """One file, one host: each consumer reads its own section and serves on its own port
    (with the shared `consumers:` section both took the same one and the second could not start)."""
    lifecycle_port, reputation_port = free_port(), free_port()
    config = tmp_path / "config.yaml"
    config.write_text(f"lifecycle:\n  metrics_port: {lifecycle_port}\nreputation:\n  metrics_port: {reputation_port}\n",
                      encoding="utf-8")  # fmt: skip
    base = {k: v for k, v in os.environ.items() if not k.startswith("ESCROWD_")}
    env = {**base, "ESCROWD_DATABASE_URL": empty_database, "ESCROWD_KAFKA_BOOTSTRAP": kafka_service.bootstrap}
    logs = {name: tmp_path / f"{name}.log" for name in ("lifecycle", "reputation")}
    procs = {}
    for name, log in logs.items():
        with log.open("wb") as out:
            procs[name] = subprocess.Popen([*escrowd_command(), "consume", name, "--config", str(config)], env=env,
                                           cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        serving: dict[str, bool] = {}
        while len(serving) < 2 and time.monotonic() < deadline:
            for name, port in (("lifecycle", lifecycle_port), ("reputation", reputation_port)):
                assert procs[name].poll() is None, f"{name} exited: {logs[name].read_text()[-3000:]}"
                if _healthz(port) == 200:
                    serving[name] = True
            time.sleep(0.2)
        assert serving == {"lifecycle": True, "reputation": True}
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()


def test_the_rulings_section_with_a_remote_signer_needs_no_key(tmp_path: Path) -> None:
    """`ruling_signer: {kind: remote}` keeps the arbiter key out of the process: the check
    passes with no key, and refuses a key left in the section (it would not be used)."""
    address = SecretKey.from_hex("0x" + "5e" * 32).address
    section = (
        "rulings:\n  ruling_chain_id: 31337\n  ruling_rpc_url: http://127.0.0.1:1\n"
        f"  ruling_escrow: \"0x{'11' * 20}\"\n  ruling_trusted_signers: [\"0x{'22' * 20}\"]\n"
        f"  ruling_signer: {{kind: remote, remote_url: \"http://127.0.0.1:1\", address: \"{address}\"}}\n"
    )
    config = tmp_path / "config.yaml"
    config.write_text(section, encoding="utf-8")
    proc = _check(config, BASE_ENV, tmp_path, "--section", "rulings")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rulings: ok" in proc.stdout
    config.write_text(section + "  ruling_arbiter_keystore: /run/secrets/arbiter-keystore.json\n", encoding="utf-8")
    proc = _check(config, BASE_ENV, tmp_path, "--section", "rulings")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "ruling_signer is remote: a key in this process is not used" in proc.stderr
