"""`escrowd keys init`: the keystores and passwords a deployment's relayer and verifier need;
`escrowd keys new --role R --out DIR`: one fresh key for one role, for a rotation.

Writes eight files (mode 0600) into `--out`: `relayer-keystore.json`,
`relayer-keystore-password`, `verification-keystore.json`,
`verification-keystore-password`, `arbiter-keystore.json` and `arbiter-keystore-password`
(the ruling path, `escrowd relay rulings`), `panel-signing-key` (the panel service's ruling
key, hex) and `panel-secret` (the panel draw secret), the layout `deploy/docker-compose.yml`
mounts at /run/secrets and `kubectl create secret generic escrowd-secrets --from-file=...`
reads. Each service mounts only its own files.

Keys: fresh random ones by default (production: upload the files to your secret manager
and register the addresses printed); with `--devnet`, the relayer gets the devnet's
marketplace verifier account, the verifier anvil's account 9, the arbiter the devnet's
arbiter account and the panel service anvil's account 8, all derived from anvil's public
test mnemonic, so that the compose `devnet` profile comes up with no manual step. The panel
secret is always random.
Passwords: `ESCROWD_RELAYER_KEYSTORE_PASSWORD` / `ESCROWD_VERIFICATION_KEYSTORE_PASSWORD`
when set, otherwise random. Existing files are kept (re-running is harmless) unless
`--force`; a keystore without its password file (or the reverse) is refused, never
replaced. Only addresses are printed, as JSON.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="Keystores for the relayer and the verification service.", no_args_is_help=True)

DEVNET_VERIFIER_ACCOUNT = 9
"""anvil account whose key signs verdicts in the compose devnet (its address is in the example config)."""
ROLES = ("relayer", "verification", "arbiter")
"""The roles whose keys are encrypted keystores with a password file each."""
DEVNET_PANEL_ACCOUNT = 8
"""anvil account whose key signs panel rulings in the compose devnet (the ruling relay trusts it)."""


def _write_secret(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)


def _write_role_key(role: str, keystore: Path, password_file: Path, raw: str | None = None) -> str:
    """Encrypt `raw` (a fresh random key when None) into `keystore` with a password written to
    `password_file` (`ESCROWD_<ROLE>_KEYSTORE_PASSWORD` when set, else random); the address."""
    from eth_account import Account

    from chain.keys import SecretKey, write_keystore
    from runtime.logging import register_secret

    raw = raw or "0x" + bytes(Account.create().key).hex()
    register_secret(raw)
    password = os.environ.get(f"ESCROWD_{role.upper()}_KEYSTORE_PASSWORD") or secrets.token_urlsafe(24)
    register_secret(password)
    key = SecretKey.from_hex(raw)
    # scrypt at its default cost: a keystore that leaks stays expensive to attack.
    write_keystore(key, keystore, password)
    _write_secret(password_file, password)
    return key.address


@app.command("new")
def new(
    role: Annotated[str, typer.Option("--role", help=f"Whose key: one of {', '.join(ROLES)}")],
    out: Annotated[Path, typer.Option("--out", help="Directory to write the keystore and its password into")],
) -> None:
    """One fresh key for one role (a rotation): `<role>-keystore.json` and `<role>-keystore-password`.

    Refuses to overwrite: rotate into a new directory, then move the files into the Secret.
    """
    if role not in ROLES:
        typer.echo(f"--role must be one of {', '.join(ROLES)}", err=True)
        raise typer.Exit(2)
    out.mkdir(parents=True, exist_ok=True)
    keystore, password_file = out / f"{role}-keystore.json", out / f"{role}-keystore-password"
    present = [p.name for p in (keystore, password_file) if p.exists()]
    if present:
        typer.echo(f"{', '.join(present)} already in {out}: a new key goes into a new directory", err=True)
        raise typer.Exit(1)
    address = _write_role_key(role, keystore, password_file)
    typer.echo(json.dumps({"dir": str(out), role: address}))


@app.command("init")
def init(
    out: Annotated[Path, typer.Option("--out", help="Directory to write the key files into")],
    devnet: Annotated[bool, typer.Option("--devnet", help="Use the devnet's well-known test accounts")] = False,
    force: Annotated[bool, typer.Option("--force", help="Overwrite existing files")] = False,
) -> None:
    """Write the keys of the relayer, the verifier, the arbiter (rulings) and the panel service."""
    from eth_account import Account

    from chain.keys import SecretKey, load_keystore
    from runtime.logging import register_secret

    out.mkdir(parents=True, exist_ok=True)
    if not force:
        # A keystore without its password (or a password without its keystore) is a deployed
        # key half moved away: writing a fresh pair would replace a key the chain knows (the
        # escrow's arbiter, the registered verifier). Refuse before writing anything.
        for role in ROLES:
            pair = (out / f"{role}-keystore.json", out / f"{role}-keystore-password")
            present = [path.name for path in pair if path.exists()]
            if len(present) == 1:
                missing = next(path.name for path in pair if not path.exists())
                typer.echo(f"{present[0]} is in {out} but {missing} is not: put it back, or pass --force"
                           " to replace this key with a new one", err=True)
                raise typer.Exit(1)
    addresses: dict[str, str] = {}
    for role in ROLES:
        keystore = out / f"{role}-keystore.json"
        password_file = out / f"{role}-keystore-password"
        if keystore.exists() and password_file.exists() and not force:
            addresses[role] = load_keystore(keystore, password_file=password_file).address
            continue
        raw: str | None = None
        if devnet:
            from escrowd.devnet import _ARBITER, _MARKETPLACE_VERIFIER, anvil_key

            index = {"relayer": _MARKETPLACE_VERIFIER, "verification": DEVNET_VERIFIER_ACCOUNT, "arbiter": _ARBITER}
            raw = anvil_key(index[role])[1]
        addresses[role] = _write_role_key(role, keystore, password_file, raw)
    panel_key_file = out / "panel-signing-key"
    if panel_key_file.exists() and not force:
        raw = panel_key_file.read_text(encoding="utf-8").strip()
    else:
        if devnet:
            from escrowd.devnet import anvil_key

            raw = anvil_key(DEVNET_PANEL_ACCOUNT)[1]
        else:
            raw = "0x" + bytes(Account.create().key).hex()
        _write_secret(panel_key_file, raw + "\n")
    register_secret(raw)
    addresses["panel_signer"] = SecretKey.from_hex(raw).address
    panel_secret = out / "panel-secret"
    if not panel_secret.exists() or force:
        _write_secret(panel_secret, secrets.token_hex(32) + "\n")
    typer.echo(json.dumps({"dir": str(out), **addresses}))
