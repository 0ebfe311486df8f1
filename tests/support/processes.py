"""Real `escrowd` processes for the trust-boundary tests: the API server and a consumer."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from runtime.services.ports import free_port


@dataclass
class ServiceProcess:
    """A running `escrowd` process, its log file and (for the API) its base URL."""

    process: subprocess.Popen[bytes]
    log_path: Path
    url: str = ""

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def rss_bytes(self) -> int:
        """Resident memory of the process, from /proc."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def stop(self) -> int | None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


TEST_CHAIN_ID = 31337
TEST_ESCROW = "0x5FbDB2315678afecb367f032d93F642f64180aa3"


def spawn(args: list[str], env: dict[str, str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    """`python -m escrowd.cli <args>`: the real entry point, as a deployment runs it."""
    return subprocess.Popen(
        [sys.executable, "-m", "escrowd.cli", *args],
        env={**os.environ, **env},
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def get(url: str, timeout: float = 10.0) -> tuple[int, bytes]:
    """A plain GET: status and body, errors included."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@contextlib.contextmanager
def api_process(database_url: str, **env: str) -> Iterator[ServiceProcess]:
    """`escrowd api serve` on a free port, ready (its OpenAPI answers), stopped afterwards.

    It serves one deployment (the tests' chain and escrow) unless `deployments=` says
    otherwise: signed requests are bound to a deployment the API serves.
    """
    env.setdefault("deployments", json.dumps([{"chain_id": TEST_CHAIN_ID, "escrow": TEST_ESCROW}]))
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        log_path = Path(tmp) / "api.log"
        with log_path.open("wb") as log:
            process = spawn(
                ["api", "serve", "--port", str(port)],
                {"ESCROWD_DATABASE_URL": database_url, **{f"ESCROWD_{k.upper()}": v for k, v in env.items()}},
                log,
            )
            service = ServiceProcess(process, log_path, f"http://127.0.0.1:{port}")
            try:
                deadline = time.monotonic() + 90
                while True:
                    if not service.alive():
                        raise RuntimeError(f"the API exited {process.returncode}:\n{service.log()}")
                    try:
                        if get(service.url + "/openapi.json", timeout=2)[0] == 200:
                            break
                    except OSError:
                        pass
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"the API did not answer:\n{service.log()}")
                    time.sleep(0.1)
                yield service
            finally:
                service.stop()


QUICK_GROUP_ENV = {"ESCROWD_KAFKA_SESSION_TIMEOUT_MS": "3000"}
"""A short group session for the tests' consumer processes: the broker holds each group join
for about half the session timeout, so every start, restart and stop of a member waits on it
(the default 10 s suits production, where a member's restart should not move its partitions)."""


@contextlib.contextmanager
def consumer_process(args: list[str], env: dict[str, str], log_path: Path) -> Iterator[ServiceProcess]:
    """A consumer process (`escrowd consume ...`), stopped afterwards; its log appended to `log_path`."""
    with log_path.open("ab") as log:
        service = ServiceProcess(spawn(args, {**QUICK_GROUP_ENV, **env}, log), log_path)
        try:
            yield service
        finally:
            if service.alive():
                service.process.kill()
                service.process.wait()
