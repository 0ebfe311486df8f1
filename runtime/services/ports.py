"""Free TCP ports on the loopback interface, and our own modules run as local processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from typing import Self


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for_port(port: int, *, host: str = "127.0.0.1", timeout: float = 30.0) -> None:
    """Block until something accepts TCP connections on (host, port) or raise TimeoutError."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listening on {host}:{port} after {timeout:.0f}s") from None
            time.sleep(0.05)


def terminate(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 10 s; waits for the process to end."""
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class LoopbackProcess:
    """A module of ours (`python -m <module> --port N ...`) as a process on a fixed loopback
    port: started, stopped (an outage on demand) and started again on the same port."""

    module = ""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """http://127.0.0.1:<port>."""
        return f"http://127.0.0.1:{self.port}"

    def arguments(self) -> list[str]:
        """Arguments after `--port N`."""
        return []

    def environment(self) -> dict[str, str]:
        """Variables added to this process's environment (secrets go here, not in argv)."""
        return {}

    def start(self) -> Self:
        """Start the process and wait until it listens."""
        self._process = subprocess.Popen(
            [sys.executable, "-m", self.module, "--port", str(self.port), *self.arguments()],
            env={**os.environ, **self.environment()}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port, timeout=30)
        return self

    def stop(self) -> None:
        """Stop the process (idempotent)."""
        if self._process is not None:
            terminate(self._process)
            self._process = None
