"""A local `anvil` devnet process for tests, the demo and `escrowd devnet`.

The binary comes from the npm package `@foundry-rs/anvil` (override with `ANVIL_BIN`). It
always listens on 127.0.0.1 on a free port and runs with `--prune-history 64`: without
pruning anvil writes per-block state files under `~/.foundry/anvil/tmp/` that are never
removed; `--prune-history` without a number breaks `anvil_reorg`.

Each process gets a private `HOME` (a temporary directory), so whatever anvil still writes
under `~/.foundry/anvil/tmp/` is its own and `stop()` deletes exactly that, never the
files of another anvil running on the same machine.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from runtime.services.ports import free_port

_REPO_ROOT = Path(__file__).resolve().parents[2]
_DEFAULT_BIN = _REPO_ROOT / "node_modules" / "@foundry-rs" / "anvil-linux-amd64" / "bin" / "anvil"

DEFAULT_CHAIN_ID = 31337
PRUNE_HISTORY = 64


class AnvilError(RuntimeError):
    """anvil could not be started or did not answer."""


_HOME_PREFIX = "escrowd-anvil-"


def _die_with_parent() -> None:
    # Runs in the child before exec: ask Linux to SIGTERM anvil when its parent dies, so a
    # test run killed with SIGKILL does not leave anvil behind. (The signal fires when the
    # thread that started it exits: start anvil from a long-lived thread.)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _sweep_stale_homes() -> None:
    """Delete private homes left by anvils whose owning process was killed hard."""
    for home in Path(tempfile.gettempdir()).glob(_HOME_PREFIX + "*"):
        try:
            owner = int((home / "owner.pid").read_text())
        except (OSError, ValueError):
            continue  # being created right now, or not ours to judge
        try:
            os.kill(owner, 0)
        except ProcessLookupError:
            shutil.rmtree(home, ignore_errors=True)
        except PermissionError:
            pass  # alive, owned by another user


def anvil_binary() -> Path:
    """The anvil executable: `$ANVIL_BIN`, else the one npm installed in the repo."""
    override = os.environ.get("ANVIL_BIN")
    path = Path(override) if override else _DEFAULT_BIN
    if not path.is_file():
        raise AnvilError(f"anvil binary not found at {path} (run `npm ci` or set ANVIL_BIN)")
    return path


@dataclass(kw_only=True, eq=False)
class AnvilProcess:
    """One anvil child process; use as a context manager or call `start()` / `stop()`.

    `port` 0 takes a free port at each start (retried if another process takes it first)."""

    port: int = 0
    block_time: float | None = None
    chain_id: int = DEFAULT_CHAIN_ID
    accounts: int = 10
    balance_eth: int = 10_000
    extra_args: tuple[str, ...] = ()
    startup_timeout: float = 30.0
    _requested_port: int = field(init=False, repr=False)
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _home: Path | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self._requested_port = self.port

    @property
    def rpc_url(self) -> str:
        """HTTP JSON-RPC endpoint."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        """WebSocket JSON-RPC endpoint (same port)."""
        return f"ws://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        """True while the child process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def _command(self) -> list[str]:
        cmd = [
            str(anvil_binary()),
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--chain-id", str(self.chain_id),
            "--accounts", str(self.accounts),
            "--balance", str(self.balance_eth),
            "--prune-history", str(PRUNE_HISTORY),
            "--silent",
        ]  # fmt: skip
        if self.block_time is not None:
            cmd += ["--block-time", f"{self.block_time:g}"]
        cmd += list(self.extra_args)
        return cmd

    def start(self) -> AnvilProcess:
        """Start anvil and block until it answers `eth_chainId`."""
        if self.running:
            return self
        _sweep_stale_homes()
        self._home = Path(tempfile.mkdtemp(prefix=_HOME_PREFIX))
        env = {**os.environ, "HOME": str(self._home)}
        # stderr goes to a file, not a pipe: nobody reads a pipe while anvil runs, and a
        # full one would block it.
        log_path = self._home / "anvil.log"
        # A free port can be taken between the probe and anvil's bind (other test
        # processes run concurrently): retry with a fresh port a few times.
        attempts = 1 if self._requested_port else 4
        last_error: Exception | None = None
        for _ in range(attempts):
            if not self._requested_port:
                self.port = free_port()
            with log_path.open("wb") as log:
                self._proc = subprocess.Popen(
                    self._command(),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                    env=env,
                    start_new_session=True,  # a Ctrl-C in the terminal reaches us, not anvil
                    preexec_fn=_die_with_parent,
                )
            (self._home / "owner.pid").write_text(str(os.getpid()))
            try:
                self._wait_ready()
                return self
            except AnvilError as exc:
                last_error = exc
                self._kill()
        self.stop()
        raise AnvilError(f"anvil did not start: {last_error}")

    def _rpc(self, method: str, params: list[object] | None = None, timeout: float = 2.0) -> object:
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params or []})
        req = urllib.request.Request(
            self.rpc_url, data=body.encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            reply = json.loads(resp.read())
        if "error" in reply:
            raise AnvilError(f"{method}: {reply['error']}")
        return reply["result"]

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if self._proc.poll() is not None:
                err = ""
                if self._home is not None:
                    with contextlib.suppress(OSError):
                        err = (self._home / "anvil.log").read_text(errors="replace")
                raise AnvilError(f"exited with {self._proc.returncode}: {err.strip()[-500:]}")
            try:
                chain_id = self._rpc("eth_chainId", timeout=1.0)
            except (OSError, urllib.error.URLError, ValueError):
                chain_id = None
            if chain_id is not None:
                if int(str(chain_id), 16) != self.chain_id:
                    raise AnvilError(f"port {self.port} answers for chain {chain_id}, not ours")
                return
            if time.monotonic() > deadline:
                raise AnvilError(f"no answer on {self.rpc_url} after {self.startup_timeout:.0f}s")
            time.sleep(0.05)  # startup only; nothing polls once the chain is up

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)

    def stop(self) -> None:
        """Stop anvil and delete its private home (and so its `~/.foundry/anvil/tmp/`)."""
        self._kill()
        home, self._home = self._home, None
        if home is not None:
            shutil.rmtree(home, ignore_errors=True)

    def __enter__(self) -> AnvilProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
