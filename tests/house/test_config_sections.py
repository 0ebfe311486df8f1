"""The configuration scheme covers the ruling relay, the panel service, the verifier agent and
the verifier bot: a section each, `--config` on each command, the environment over the file,
unknown keys and literal secrets refused in one line that names the key and never a value,
and `escrowd config check` validating each section."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from escrowd.harness import escrowd_command
from panels.bot import load_bot_settings
from panels.settings import load_panel_settings
from relayer.settlement.rulings import load_ruling_settings
from runtime.errors import StartupError
from verification.agents.verifier_agent import load_agent_settings

ROOT = Path(__file__).resolve().parents[2]
ESCROW = "0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512"
ANVIL_8 = "0x23618e81E3f5cdF7f54C3d65f7FBc0aBf5B21E8f"  # anvil's public test account 8
SECRET_HEX = "5e" * 31 + "c7"
SECRET = "0x" + SECRET_HEX
BASE_ENV = {"ESCROWD_DATABASE_URL": "postgresql://escrowd@127.0.0.1:1/escrowd", "ESCROWD_KAFKA_BOOTSTRAP": "127.0.0.1:1"}

RULINGS = f"""
rulings:
  ruling_chain_id: 31337
  ruling_rpc_url: http://127.0.0.1:1
  ruling_escrow: "{ESCROW}"
  ruling_trusted_signers: ["{ANVIL_8}"]
  ruling_confirmations: 3
  ruling_arbiter_keystore: /nonexistent/arbiter-keystore.json
  ruling_arbiter_keystore_password_file: /nonexistent/arbiter-password
"""
PANELS = """
panels:
  panel_secret_file: /nonexistent/from-file
  panel_signing_key_file: /nonexistent/panel-signing-key
  panel_attestation_seconds: 120
"""
AGENT = f"""
verifier_agent:
  api_url: http://127.0.0.1:1/
  rpc_url: http://127.0.0.1:1
  database_url: postgresql://escrowd@127.0.0.1:1/escrowd
  chain_id: 31337
  escrow_address: "{ESCROW}"
  wallet_key: ${{AGENT_WALLET_KEY}}
  poll_seconds: 7.5
  model:
    url: http://127.0.0.1:1/v1
    name: file-model
    timeout_seconds: 12
"""
BOT = """
verifier_bot:
  api_url: http://127.0.0.1:1
  rpc_url: http://127.0.0.1:1
  verifier_key: ${BOT_KEY}
  operator_id: op-from-file
  verifier_chains: [31337]
  scorer: endpoint:http://127.0.0.1:1/score
  poll_seconds: 30
"""


@pytest.fixture(autouse=True)
def _no_escrowd_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("ESCROWD_"):
            monkeypatch.delenv(name)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _run(argv: list[str], env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("ESCROWD_")}
    return subprocess.run([*escrowd_command(), *argv], capture_output=True, text=True, env={**base, **env},
                          cwd=tmp_path, timeout=180)  # fmt: skip


def _check(config: Path, env: dict[str, str], tmp_path: Path, *sections: str) -> subprocess.CompletedProcess[str]:
    # The key files named here do not exist: the settings are checked, the secrets are not
    # (tests/house/test_config_check.py loads real ones).
    argv = ["config", "check", "--no-secrets", "--config", str(config)]
    for name in sections:
        argv += ["--section", name]
    return _run(argv, env, tmp_path)


# ------------------------------------------------------------------ file values, env on top


def test_file_values_are_read_and_the_environment_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = _write(tmp_path, "database_url: postgresql://file@db/escrowd\nkafka_bootstrap: file:9092\n"
                    + RULINGS + PANELS + AGENT + BOT)  # fmt: skip
    monkeypatch.setenv("AGENT_WALLET_KEY", SECRET)
    monkeypatch.setenv("BOT_KEY", SECRET)
    rulings = load_ruling_settings(config)
    assert rulings.ruling_confirmations == 3 and rulings.ruling_trusted_signers == [ANVIL_8]
    assert rulings.database_url == "postgresql://file@db/escrowd"  # a shared top-level key
    panels = load_panel_settings(config)
    assert panels.panel_attestation_seconds == 120 and panels.kafka_bootstrap == "file:9092"
    agent, model = load_agent_settings(config)
    assert agent.poll_seconds == 7.5 and agent.api_url == "http://127.0.0.1:1"
    assert agent.wallet_key.get_secret_value() == SECRET  # ${VAR} expanded
    assert model.name == "file-model" and model.timeout_seconds == 12
    bot = load_bot_settings(config)
    assert bot.operator_id == "op-from-file" and bot.poll_seconds == 30
    assert bot.verifier_key.get_secret_value() == SECRET

    monkeypatch.setenv("ESCROWD_RULING_CONFIRMATIONS", "5")
    monkeypatch.setenv("ESCROWD_DATABASE_URL", "postgresql://env@db/escrowd")
    monkeypatch.setenv("ESCROWD_PANEL_ATTESTATION_SECONDS", "90")
    monkeypatch.setenv("ESCROWD_VERIFIER_POLL_SECONDS", "3")
    monkeypatch.setenv("ESCROWD_MODEL_NAME", "env-model")
    monkeypatch.setenv("ESCROWD_OPERATOR_ID", "op-from-env")
    rulings = load_ruling_settings(config)
    assert rulings.ruling_confirmations == 5 and rulings.database_url == "postgresql://env@db/escrowd"
    assert rulings.ruling_escrow == ESCROW  # the file where the environment is silent
    assert load_panel_settings(config).panel_attestation_seconds == 90
    agent, model = load_agent_settings(config)
    assert agent.poll_seconds == 3 and agent.chain_id == 31337
    assert model.name == "env-model" and model.timeout_seconds == 12
    bot = load_bot_settings(config)
    assert bot.operator_id == "op-from-env" and bot.verifier_chains == [31337]


def test_the_panel_command_reads_the_file_and_the_environment_wins(tmp_path: Path) -> None:
    """`escrowd consume panels --config FILE` opens the secret file the file names; the
    variable replaces it."""
    config = _write(tmp_path, PANELS)
    from_file = _run(["consume", "panels", "--config", str(config)], BASE_ENV, tmp_path)
    assert from_file.returncode == 2, from_file.stdout + from_file.stderr
    assert "/nonexistent/from-file" in from_file.stderr and "Traceback" not in from_file.stderr
    from_env = _run(["consume", "panels", "--config", str(config)],
                    {**BASE_ENV, "ESCROWD_PANEL_SECRET_FILE": "/nonexistent/from-env"}, tmp_path)  # fmt: skip
    assert from_env.returncode == 2, from_env.stdout + from_env.stderr
    assert "/nonexistent/from-env" in from_env.stderr and "/nonexistent/from-file" not in from_env.stderr


def test_config_check_uses_the_file_and_the_environment_wins(tmp_path: Path) -> None:
    """A file value that is refused (anvil's public key trusted on chain 1) fails the check;
    the environment's chain id makes the same file pass."""
    config = _write(tmp_path, RULINGS.replace("ruling_chain_id: 31337", "ruling_chain_id: 1"))
    refused = _check(config, BASE_ENV, tmp_path, "rulings")
    assert refused.returncode == 2 and "ruling_trusted_signers" in refused.stderr, refused.stdout + refused.stderr
    passed = _check(config, {**BASE_ENV, "ESCROWD_RULING_CHAIN_ID": "31337"}, tmp_path, "rulings")
    assert passed.returncode == 0, passed.stderr
    assert "rulings: ok" in passed.stdout


# ------------------------------------------------------------ unknown keys, literal secrets

COMMANDS = {
    "rulings": (["relay", "rulings"], RULINGS),
    "panels": (["consume", "panels"], PANELS),
    "verifier_agent": (["verifier-agent"], AGENT),
    "verifier_bot": (["verifier-bot", "--once"], BOT),
}
SECRET_FIELD = {
    "rulings": "ruling_arbiter_key",
    "panels": "panel_signing_key",
    "verifier_agent": "wallet_key",
    "verifier_bot": "verifier_key",
}
VAR_ENV = {"AGENT_WALLET_KEY": SECRET, "BOT_KEY": SECRET}


def _assert_refused(proc: subprocess.CompletedProcess[str], *names: str) -> None:
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert "Traceback" not in output, output
    for name in names:
        assert name in proc.stderr, output
    for form in (SECRET, SECRET_HEX, SECRET_HEX[-16:], SECRET_HEX.upper()):
        assert form not in output, f"secret printed: {output}"
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_an_unknown_key_is_refused_naming_the_key_not_its_value(name: str, tmp_path: Path) -> None:
    argv, text = COMMANDS[name]
    # A misspelt secret: the name is printed, the value never.
    config = _write(tmp_path, text + f"  {SECRET_FIELD[name]}_typo: '{SECRET}'\n")
    proc = _run([*argv, "--config", str(config)], {**BASE_ENV, **VAR_ENV}, tmp_path)
    _assert_refused(proc, "unknown key", f"{SECRET_FIELD[name]}_typo")


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_key_that_is_a_pasted_secret_is_not_echoed(name: str, tmp_path: Path) -> None:
    argv, text = COMMANDS[name]
    config = _write(tmp_path, text + f"  '{SECRET}': 1\n")
    proc = _run([*argv, "--config", str(config)], {**BASE_ENV, **VAR_ENV}, tmp_path)
    _assert_refused(proc, "unknown key")


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_secret_written_in_the_file_is_refused(name: str, tmp_path: Path) -> None:
    """Secrets are `${VAR}` or files: a literal key in the file stops the command."""
    argv, text = COMMANDS[name]
    field = SECRET_FIELD[name]
    lines = [line for line in text.splitlines() if not line.strip().startswith(f"{field}:")]
    config = _write(tmp_path, "\n".join(lines) + f"\n  {field}: '{SECRET}'\n" if name != "panels"
                    else text + f"  {field}: '{SECRET}'\n")  # fmt: skip
    proc = _run([*argv, "--config", str(config)], {**BASE_ENV, **VAR_ENV}, tmp_path)
    _assert_refused(proc, field, "secret")


def test_a_model_key_in_the_file_is_refused_a_variable_is_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = _write(tmp_path, AGENT + f"    api_key: {SECRET}\n")
    monkeypatch.setenv("AGENT_WALLET_KEY", SECRET)
    with pytest.raises(StartupError, match=r"verifier_agent\.model: api_key is a secret") as refused:
        load_agent_settings(config)
    assert SECRET_HEX not in str(refused.value)
    config = _write(tmp_path, AGENT + "    api_key: ${MODEL_KEY}\n")
    monkeypatch.setenv("MODEL_KEY", "sk-from-the-environment")
    _, model = load_agent_settings(config)
    assert model.api_key is not None and model.api_key.get_secret_value() == "sk-from-the-environment"


def test_a_section_that_is_not_a_mapping_is_refused(tmp_path: Path) -> None:
    config = _write(tmp_path, "panels: [one, two]\n")
    with pytest.raises(StartupError, match="configuration section panels: expected a mapping"):
        load_panel_settings(config)


# ------------------------------------------------------------------------ config check

BAD = {
    "rulings": ("  ruling_confirmations: 0\n", "ruling_confirmations"),
    "panels": ("  panel_attestation_seconds: -1\n", "panel_attestation_seconds"),
    "verifier_agent": ("  rpc_url: ftp://nowhere\n", "rpc_url"),
    "verifier_bot": ("  operator_id: 'has spaces'\n", "operator_id"),
}


def test_config_check_accepts_every_new_section(tmp_path: Path) -> None:
    config = _write(tmp_path, RULINGS + PANELS + AGENT + BOT)
    proc = _check(config, {**BASE_ENV, **VAR_ENV}, tmp_path, *COMMANDS)
    assert proc.returncode == 0, proc.stderr
    for name in COMMANDS:
        assert f"{name}: ok" in proc.stdout


@pytest.mark.parametrize("name", sorted(BAD))
def test_config_check_finds_the_error_in_each_new_section(name: str, tmp_path: Path) -> None:
    bad, field = BAD[name]
    texts = {"rulings": RULINGS, "panels": PANELS, "verifier_agent": AGENT, "verifier_bot": BOT}
    texts[name] = texts[name].rstrip("\n") + "\n" + bad
    config = _write(tmp_path, "".join(texts.values()))
    proc = _check(config, {**BASE_ENV, **VAR_ENV}, tmp_path, *COMMANDS)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = proc.stderr.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith(f"{name}: ") and field in errors[0], proc.stderr
    for other in set(COMMANDS) - {name}:
        assert f"{other}: ok" in proc.stdout


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_config_check_refuses_unknown_keys_and_literal_secrets(name: str, tmp_path: Path) -> None:
    _, text = COMMANDS[name]
    config = _write(tmp_path, text + f"  {SECRET_FIELD[name]}_typo: '{SECRET}'\n")
    _assert_refused(_check(config, {**BASE_ENV, **VAR_ENV}, tmp_path, name), f"{name}: ", "unknown key")


def test_config_check_skips_absent_optional_sections_and_flags_stray_top_level_keys(tmp_path: Path) -> None:
    base = (ROOT / "deploy" / "config.example.yaml").read_text(encoding="utf-8")
    without = "\n".join(line for line in base.split("\n# ------------------------------------------------------ dispute")[0]
                        .splitlines())  # fmt: skip
    env = {**BASE_ENV, "ESCROWD_RELAYER_KEYSTORE": "/k.json", "ESCROWD_RELAYER_KEYSTORE_PASSWORD_FILE": "/p"}
    proc = _check(_write(tmp_path, without), env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "rulings: skipped" in proc.stdout and "panels: skipped" in proc.stdout
    proc = _check(_write(tmp_path, without + "\nrulings_confirmations: 3\n"), env, tmp_path)
    assert proc.returncode == 2 and "top level: unknown key rulings_confirmations" in proc.stderr, proc.stderr


def test_the_shipped_examples_pass_config_check(tmp_path: Path) -> None:
    env = {**BASE_ENV, "ESCROWD_RELAYER_KEYSTORE": "/k.json", "ESCROWD_RELAYER_KEYSTORE_PASSWORD_FILE": "/p"}
    proc = _check(ROOT / "deploy" / "config.example.yaml", env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "rulings: ok" in proc.stdout and "panels: ok" in proc.stdout
    verifier = _check(ROOT / "deploy" / "verifier.example.yaml",
                      {**BASE_ENV, "VERIFIER_WALLET_KEY": SECRET, "VERIFIER_BOT_KEY": SECRET}, tmp_path,
                      "verifier_agent", "verifier_bot")  # fmt: skip
    assert verifier.returncode == 0, verifier.stderr
    assert "verifier_agent: ok" in verifier.stdout and "verifier_bot: ok" in verifier.stdout


# ------------------------------------------------------------------------ keys as files


def test_keys_as_files_are_read_and_never_echoed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key_file = tmp_path / "verifier-key"
    key_file.write_text(SECRET_HEX + "\n", encoding="utf-8")
    config = _write(tmp_path, BOT.replace("verifier_key: ${BOT_KEY}", f"verifier_key_file: {key_file}")
                    + AGENT.replace("wallet_key: ${AGENT_WALLET_KEY}", f"wallet_key_file: {key_file}"))  # fmt: skip
    assert load_bot_settings(config).signing_key() == SECRET
    agent, _ = load_agent_settings(config)
    assert agent.wallet() == SECRET

    key_file.write_text(SECRET_HEX[:-2] + "zz\n", encoding="utf-8")  # malformed: its bytes never printed
    for argv, field in ((["verifier-bot", "--once"], "verifier_key_file"), (["verifier-agent"], "wallet_key_file")):
        proc = _run([*argv, "--config", str(config)], BASE_ENV, tmp_path)
        _assert_refused(proc, field)
        assert SECRET_HEX[:16] not in proc.stdout + proc.stderr
    missing = _run(["verifier-bot", "--once", "--config", str(config)],
                   {**BASE_ENV, "ESCROWD_VERIFIER_KEY_FILE": "/nonexistent/bot-key"}, tmp_path)  # fmt: skip
    _assert_refused(missing, "/nonexistent/bot-key")  # the environment wins over the file's path


def test_a_key_and_its_file_together_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BOT_KEY", SECRET)
    config = _write(tmp_path, BOT + "  verifier_key_file: /run/secrets/verifier-key\n")
    proc = _check(config, {**BASE_ENV, "BOT_KEY": SECRET}, tmp_path, "verifier_bot")
    _assert_refused(proc, "verifier_bot: ", "exactly one of verifier_key and verifier_key_file")
