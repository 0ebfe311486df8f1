"""`escrowd keys init`: eight 0600 files, loadable by the services, only addresses printed."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

from chain.keys import SecretKey, load_keystore
from escrowd.devnet import anvil_key
from escrowd.harness import escrowd_command

FILES = ("relayer-keystore.json", "relayer-keystore-password", "verification-keystore.json", "verification-keystore-password",
         "arbiter-keystore.json", "arbiter-keystore-password", "panel-signing-key", "panel-secret")


def _init(out: Path, *flags: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ESCROWD_")}
    proc = subprocess.run([*escrowd_command(), "keys", "init", "--out", str(out), *flags],
                          capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    for index in (1, 2, 8, 9):
        assert anvil_key(index)[1][2:] not in proc.stdout + proc.stderr
    result: dict[str, str] = json.loads(proc.stdout)
    return result


def test_devnet_keys_are_the_devnet_accounts_and_are_kept_on_rerun(tmp_path: Path) -> None:
    out = tmp_path / "secrets"
    first = _init(out, "--devnet")
    assert first["relayer"] == anvil_key(2)[0]  # the devnet's marketplace verifier
    assert first["verification"] == anvil_key(9)[0]
    for name in FILES:
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o600, name
    assert first["arbiter"] == anvil_key(1)[0]  # the devnet's arbiter: the ruling path's key
    assert first["panel_signer"] == anvil_key(8)[0]
    for role in ("relayer", "verification", "arbiter"):
        key = load_keystore(out / f"{role}-keystore.json", password_file=out / f"{role}-keystore-password")
        assert key.address == first[role]
    # The panel service reads its files through its own settings.
    from panels.settings import PanelSettings

    panel = PanelSettings(database_url="postgresql://x", kafka_bootstrap="k", panel_secret_file=out / "panel-secret",
                          panel_signing_key_file=out / "panel-signing-key")
    assert SecretKey.from_hex(panel.signing_key()).address == first["panel_signer"]
    assert len(panel.read_secret()) >= 32
    before = (out / "relayer-keystore-password").read_text()
    assert _init(out, "--devnet") == first
    assert (out / "relayer-keystore-password").read_text() == before  # kept, not regenerated


def test_production_keys_are_fresh(tmp_path: Path) -> None:
    a = _init(tmp_path / "a")
    b = _init(tmp_path / "b")
    assert a["relayer"] != b["relayer"] and a["verification"] != b["verification"]
    assert a["arbiter"] != b["arbiter"] and a["panel_signer"] != b["panel_signer"]
    assert (tmp_path / "a" / "panel-secret").read_text() != (tmp_path / "b" / "panel-secret").read_text()
    assert a["relayer"] not in (anvil_key(2)[0], anvil_key(9)[0])


def test_a_keystore_whose_password_file_is_missing_is_never_replaced(tmp_path: Path) -> None:
    """Re-running keys init must not swap a deployed key for a fresh one: a keystore without
    its password file (moved to a secret manager, lost) is refused, not overwritten. A fresh
    arbiter key would no longer be the escrow's arbiter, and every dispute would wait for the
    owner to rotate it."""
    out = tmp_path / "secrets"
    first = _init(out)
    keystore = (out / "arbiter-keystore.json").read_bytes()
    (out / "arbiter-keystore-password").unlink()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ESCROWD_")}
    proc = subprocess.run([*escrowd_command(), "keys", "init", "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert proc.returncode != 0
    assert "arbiter-keystore-password" in proc.stderr
    assert (out / "arbiter-keystore.json").read_bytes() == keystore  # the deployed key is still there
    assert not (out / "arbiter-keystore-password").exists()
    # The other roles' files are untouched as well.
    assert load_keystore(out / "relayer-keystore.json",
                         password_file=out / "relayer-keystore-password").address == first["relayer"]


def test_keys_new_makes_one_key_and_never_overwrites(tmp_path: Path) -> None:
    """`escrowd keys new --role relayer`: one keystore and its password, loadable; a second run refuses."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ESCROWD_")}
    command = [*escrowd_command(), "keys", "new", "--role", "relayer", "--out", str(tmp_path)]
    made = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert made.returncode == 0, made.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["relayer-keystore-password", "relayer-keystore.json"]
    key = load_keystore(tmp_path / "relayer-keystore.json", password_file=tmp_path / "relayer-keystore-password")
    assert json.loads(made.stdout)["relayer"] == key.address
    assert key.secret_bytes().hex() not in made.stdout + made.stderr
    again = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 1 and "already in" in again.stderr
    kept = load_keystore(tmp_path / "relayer-keystore.json", password_file=tmp_path / "relayer-keystore-password")
    assert kept.address == key.address
