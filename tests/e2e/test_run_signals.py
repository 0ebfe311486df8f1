"""Ctrl-C and `kill -TERM` on `escrowd run`: everything stops in order, nothing is left behind.

A real `escrowd run` process is started in its own session with a private TMPDIR and a
marker in its environment (inherited by every child: PostgreSQL, Tansu, anvil). Once it is
ready, SIGINT goes to its whole process group (as a terminal's Ctrl-C does) or SIGTERM to
the process alone; then the exit code is 130 / 143, no process carries the marker, the
private TMPDIR holds nothing but the reused runtime dir, and no traceback was printed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from escrowd.harness import escrowd_command
from runtime.services.postgres import PostgresService

DEADLINE = 300.0  # generous: waits end as soon as the condition holds


def _marked(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in environ:
            found.append(int(entry.name))
    return found


def _wait_for(predicate, what: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + DEADLINE
    while not predicate():
        if proc.poll() is not None and not predicate():
            raise AssertionError(f"escrowd run exited {proc.returncode} before {what}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {DEADLINE}s:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


def _run_and_signal(tmp_path: Path, env_extra: dict[str, str], sig: signal.Signals, *, group: bool) -> tuple[int, str, str]:
    marker = f"ESCROWD_SIGNAL_TEST_{uuid.uuid4().hex}"
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "KAFKA_BOOTSTRAP") and not k.startswith("ESCROWD_")}
    env.update(env_extra, TMPDIR=str(private_tmp), ESCROWD_TEST_MARKER=marker)
    log = tmp_path / "run.log"
    out = tmp_path / "run.out"
    with log.open("wb") as err, out.open("wb") as stdout:
        proc = subprocess.Popen(
            [*escrowd_command(), "run", "--no-progress", "--batch", "5"],
            stdout=stdout, stderr=err, env=env, start_new_session=True, cwd=tmp_path,
        )  # fmt: skip
    try:
        _wait_for(lambda: "escrowd run: ready" in log.read_text(errors="replace"), "ready line", proc, log)
        if group:
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
        code = proc.wait(timeout=DEADLINE)
        _wait_for(lambda: not _marked(marker), "exit of every child", proc, log)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in _marked(marker):
            os.kill(pid, signal.SIGKILL)
    leftovers = sorted(p.name for p in private_tmp.iterdir() if not p.name.startswith("escrowd-runtime-"))
    assert not leftovers, f"left behind in TMPDIR: {leftovers}"
    return code, log.read_text(errors="replace"), out.read_text(errors="replace")


@pytest.mark.timeout(900)
def test_ctrl_c_on_embedded_run_stops_everything(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT to the group): embedded PostgreSQL, Tansu and anvil all stopped, exit 130."""
    code, log, _ = _run_and_signal(tmp_path, {}, signal.SIGINT, group=True)
    assert code == 130, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    assert "stopped (exit 130)" in log


@pytest.mark.timeout(900)
def test_sigterm_on_run_stops_everything_and_drops_its_database(tmp_path: Path, pg_service: PostgresService) -> None:
    """`kill -TERM` on the process alone: exit 143, its database on the shared server dropped."""
    import asyncio

    import asyncpg

    async def databases() -> set[str]:
        conn = await asyncpg.connect(pg_service.admin_url)
        try:
            return {r["datname"] for r in await conn.fetch("SELECT datname FROM pg_database")}
        finally:
            await conn.close()

    before = asyncio.run(databases())
    code, log, _ = _run_and_signal(tmp_path, {"ESCROWD_DATABASE_URL": pg_service.admin_url}, signal.SIGTERM, group=False)
    assert code == 143, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    assert {d for d in asyncio.run(databases()) - before if d.startswith("escrowd_run")} == set()
