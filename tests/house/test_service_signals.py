"""Each service as a real process: one ready line, SIGINT/SIGTERM drain it, one stop line.

Services get a fresh *unmigrated* database: every one of them (the API included) must
migrate it at start-up. Exit codes: a service that drained after a signal exits 0, or with
the conventional status of that signal (130 / 143, or killed by it once drained, as uvicorn
does); never 1 or a crash. No child process may outlive it (each test's processes carry a marker in their environment).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from escrowd.devnet import Devnet
from escrowd.harness import chain_config, escrowd_command, write_config
from runtime.services.kafka import KafkaService
from runtime.services.ports import free_port
from runtime.services.postgres import PostgresService

DEADLINE = 240.0  # generous; every wait ends as soon as its condition holds


@pytest.fixture
def empty_database(pg_service: PostgresService) -> Iterator[str]:
    """A fresh database with no tables at all."""
    name = f"t_unmigrated_{secrets.token_hex(4)}"

    async def sql(statement: str) -> None:
        conn = await asyncpg.connect(pg_service.admin_url)
        try:
            await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(sql(f'CREATE DATABASE "{name}"'))
    parts = urlsplit(pg_service.admin_url)
    try:
        yield urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))
    finally:
        asyncio.run(sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


class Service:
    """One `escrowd ...` child process with its output in a file."""

    def __init__(self, argv: list[str], env: dict[str, str], tmp_path: Path) -> None:
        self.marker = f"ESCROWD_SERVICE_TEST_{uuid.uuid4().hex}"
        self.log = tmp_path / f"{argv[0]}-{uuid.uuid4().hex[:6]}.log"
        base = {k: v for k, v in os.environ.items() if not k.startswith("ESCROWD_")}
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [*escrowd_command(), *argv], stdout=out, stderr=subprocess.STDOUT,
                env={**base, **env, "ESCROWD_TEST_MARKER": self.marker}, cwd=tmp_path,
            )  # fmt: skip

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, predicate: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + DEADLINE
        while not predicate():
            if self.proc.poll() is not None:
                raise AssertionError(f"exited {self.proc.returncode} before {what}:\n{self.output()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what}:\n{self.output()[-3000:]}")
            time.sleep(0.2)

    def signal_and_wait(self, sig: signal.Signals) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=DEADLINE)

    def leftovers(self) -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if self.marker.encode() in (entry / "environ").read_bytes():
                        found.append(int(entry.name))
                except OSError:
                    continue
        return found

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def drained(code: int, sig: signal.Signals) -> bool:
    """The documented exit code of a drained service: 0, for either signal."""
    return code == 0


def stop_lines(output: str) -> list[dict[str, object]]:
    """The service shell's stop lines (`service_stopped`) in a JSON log."""
    lines = []
    for line in output.splitlines():
        if '"service_stopped"' in line:
            lines.append(json.loads(line))
    return lines


def assert_one_stop_line(output: str, service: str, sig: signal.Signals) -> None:
    (line,) = stop_lines(output)
    assert line["service"] == service and line["signal"] == sig.name, line
    assert line["outcome"] == "drained" and line["exit_code"] == 0, line


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, ConnectionError):
        return 0, b""  # not listening yet


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_api_migrates_an_empty_database_and_stops_on_a_signal(sig: signal.Signals, empty_database: str, tmp_path: Path) -> None:
    port = free_port()
    api = Service(["api", "serve", "--host", "127.0.0.1", "--port", str(port)], {"ESCROWD_DATABASE_URL": empty_database}, tmp_path)
    try:
        api.wait_for(lambda: '"api_ready"' in api.output(), "ready line")
        escrow = "0x" + "11" * 20
        status, body = _get(f"http://127.0.0.1:{port}/v1/tasks/31337/{escrow}/1/results")
        assert status == 404, body  # an unknown task, not a 500 on a missing table
        assert json.loads(body)
        assert _get(f"http://127.0.0.1:{port}/healthz")[0] == 200
        ready_status, ready_body = _get(f"http://127.0.0.1:{port}/readyz")
        assert ready_status == 200 and json.loads(ready_body)["parts"] == {"database": True}
        code = api.signal_and_wait(sig)
        assert drained(code, sig), api.output()[-3000:]
        assert '"api_stopping"' in api.output()
        assert_one_stop_line(api.output(), "api", sig)
        assert "Traceback" not in api.output()
        assert not api.leftovers()
    finally:
        api.kill()


@pytest.mark.parametrize(
    "argv,ready,stopped",
    [(["consume", "lifecycle"], "consumer_started", "consumer_stopped"),
     (["consume", "reputation"], "consumer_started", "consumer_stopped"),
     (["index", "publish"], "outbox_publisher_started", None)],
    ids=["lifecycle", "reputation", "publisher"],
)  # fmt: skip
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_consumers_drain_on_a_signal(
    argv: list[str], ready: str, stopped: str | None, sig: signal.Signals, empty_database: str,
    kafka_service: KafkaService, tmp_path: Path,
) -> None:  # fmt: skip
    port = free_port()
    env = {"ESCROWD_DATABASE_URL": empty_database, "ESCROWD_KAFKA_BOOTSTRAP": kafka_service.bootstrap,
           "ESCROWD_METRICS_PORT": str(port)}  # fmt: skip
    service = Service(argv, env, tmp_path)
    try:
        service.wait_for(lambda: ready in service.output(), "ready line")
        if argv[0] == "consume":
            # Probes and metrics on the metrics port; counters exist at 0 before any message.
            service.wait_for(lambda: _get(f"http://127.0.0.1:{port}/readyz")[0] == 200, "readiness")
            assert _get(f"http://127.0.0.1:{port}/healthz")[0] == 200
            metrics = _get(f"http://127.0.0.1:{port}/metrics")[1].decode()
            group = f"escrowd-{argv[1]}"
            assert f'escrowd_consumer_messages_total{{consumer="{group}",outcome="dead_lettered"}} 0.0' in metrics
        code = service.signal_and_wait(sig)
        assert drained(code, sig), service.output()[-3000:]
        if stopped is not None:
            assert stopped in service.output()
        assert_one_stop_line(service.output(), {"publish": "publisher"}.get(argv[-1], argv[-1]), sig)
        assert "Traceback" not in service.output()
        assert not service.leftovers()
    finally:
        service.kill()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_indexer_drains_on_a_signal(sig: signal.Signals, devnet: Devnet, empty_database: str, kafka_service: KafkaService, tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "config.yaml", database_url=empty_database, kafka_bootstrap=kafka_service.bootstrap,
        topic=f"t{uuid.uuid4().hex[:8]}.events", chains=[chain_config(devnet)],
    )  # fmt: skip
    indexer = Service(["index", "run", "--config", str(config)], {}, tmp_path)
    try:
        indexer.wait_for(lambda: "indexer_ready" in indexer.output(), "ready line")
        code = indexer.signal_and_wait(sig)
        assert drained(code, sig), indexer.output()[-3000:]
        assert "indexer_stopped" in indexer.output()
        assert_one_stop_line(indexer.output(), "indexer", sig)
        assert "Traceback" not in indexer.output()
        assert not indexer.leftovers()
    finally:
        indexer.kill()


@pytest.mark.parametrize("argv", [["consume", "lifecycle"], ["index", "publish"]], ids=["lifecycle", "publisher"])
def test_unreachable_broker_at_start_up_is_one_line_and_exit_2(argv: list[str], empty_database: str, tmp_path: Path) -> None:
    closed = free_port()  # nothing listens there
    service = Service(argv, {"ESCROWD_DATABASE_URL": empty_database, "ESCROWD_KAFKA_BOOTSTRAP": f"127.0.0.1:{closed}"}, tmp_path)
    try:
        code = service.proc.wait(timeout=DEADLINE)
    finally:
        service.kill()
    assert code == 2, service.output()[-3000:]
    assert "escrowd: cannot reach the Kafka broker" in service.output()
    assert "Traceback" not in service.output()
    assert "Unclosed" not in service.output()


def test_index_publish_reads_the_same_config_file(empty_database: str, kafka_service: KafkaService, tmp_path: Path) -> None:
    """`index publish --config` takes database and broker from the file's shared keys."""
    config = tmp_path / "config.yaml"
    config.write_text(f"database_url: {empty_database}\nkafka_bootstrap: {kafka_service.bootstrap}\n", encoding="utf-8")
    service = Service(["index", "publish", "--config", str(config)], {}, tmp_path)
    try:
        service.wait_for(lambda: "outbox_publisher_started" in service.output(), "ready line")
        assert drained(service.signal_and_wait(signal.SIGTERM), signal.SIGTERM)
    finally:
        service.kill()
    missing = Service(["index", "publish"], {}, tmp_path)
    assert missing.proc.wait(timeout=DEADLINE) == 2
    assert "database_url" in missing.output() and "Traceback" not in missing.output()


def test_sandbox_runner_serves_probes_and_metrics_and_drains(tmp_path: Path) -> None:
    """`escrowd verify serve-sandbox`: a ready line, /healthz, /readyz, /metrics, and one stop line."""
    port = free_port()
    runner = Service(["verify", "serve-sandbox", "--port", str(port)], {}, tmp_path)
    try:
        runner.wait_for(lambda: '"sandbox_runner_ready"' in runner.output(), "ready line")
        assert _get(f"http://127.0.0.1:{port}/healthz")[0] == 200
        assert _get(f"http://127.0.0.1:{port}/readyz")[0] == 200
        status, metrics = _get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200 and b"# TYPE" in metrics
        code = runner.signal_and_wait(signal.SIGTERM)
        assert drained(code, signal.SIGTERM), runner.output()[-3000:]
        assert_one_stop_line(runner.output(), "sandbox", signal.SIGTERM)
        assert "Traceback" not in runner.output()
    finally:
        runner.kill()


def test_relayer_drains_on_sigterm_with_one_stop_line(devnet: Devnet, empty_database: str, kafka_service: KafkaService, tmp_path: Path) -> None:
    """`escrowd relay run`: its loops stop by cancellation, the process logs one stop line and exits 0."""
    from eth_account import Account

    chains = json.dumps([{"chain_id": devnet.chain_id, "rpc_urls": [devnet.rpc_url], "escrow_addresses": [devnet.escrow_address],
                          "confirmations": 0, "poll_interval": 0.2, "rpc_timeout": 3.0}])  # fmt: skip
    port = free_port()
    env = {"ESCROWD_DATABASE_URL": empty_database, "ESCROWD_KAFKA_BOOTSTRAP": kafka_service.bootstrap, "ESCROWD_CHAINS": chains,
           "ESCROWD_RELAYER_KEY": devnet.marketplace_verifier.private_key, "ESCROWD_RELAYER_PORT": str(port),
           "ESCROWD_RELAYER_TRUSTED_SIGNERS": Account.from_key("0x" + "4c" * 32).address,
           "ESCROWD_VERDICTS_TOPIC": f"t{uuid.uuid4().hex[:8]}.verdicts"}  # fmt: skip
    relayer = Service(["relay", "run"], env, tmp_path)
    try:
        relayer.wait_for(lambda: _get(f"http://127.0.0.1:{port}/readyz")[0] == 200, "readiness")
        assert '"relayer_starting"' in relayer.output()
        code = relayer.signal_and_wait(signal.SIGTERM)
        assert drained(code, signal.SIGTERM), relayer.output()[-3000:]
        assert_one_stop_line(relayer.output(), "relayer", signal.SIGTERM)
        assert '"consumer_stopped"' in relayer.output()
        assert "Traceback" not in relayer.output()
        assert not relayer.leftovers()
    finally:
        relayer.kill()
