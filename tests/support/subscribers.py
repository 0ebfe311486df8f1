"""The example subscribers of `examples/` as processes, and the views they and our consumers hold."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

ROOT = Path(__file__).resolve().parents[2]
PYTHON_EXAMPLE = ROOT / "examples" / "python" / "subscriber.py"
TS_EXAMPLE = ROOT / "examples" / "typescript"

Views = tuple[dict[str, int], dict[str, tuple[int, int, int, int, float]]]
"""(task `<chain>:<escrow>:<task>` → status, agent → (score, dispute_count, passes, failures, matching_score))."""


def build_typescript() -> Path:
    """Compile the TypeScript example with the project's pinned `tsc`; the entry point."""
    subprocess.run(
        [str(ROOT / "node_modules" / ".bin" / "tsc"), "-p", str(TS_EXAMPLE)],
        check=True, capture_output=True, timeout=600,
    )
    return TS_EXAMPLE / "dist" / "subscriber.js"


@dataclass
class Subscriber:
    """One example subscriber process and its store."""

    language: str
    store: Path
    args: list[str]
    log: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT)

    def stop(self) -> int:
        """SIGTERM and wait; the exit code."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""

    def views(self) -> Views:
        """What the subscriber's store holds now (empty before its first commit)."""
        if not self.store.exists():
            return {}, {}
        if self.language == "python":
            db = sqlite3.connect(f"file:{self.store}?mode=ro", uri=True)
            try:
                if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'tasks'").fetchone():
                    return {}, {}
                tasks = {f"{c}:{e}:{t}": s for c, e, t, s in db.execute("SELECT * FROM tasks")}
                reputation = {a: (s, d, p, f, m) for a, s, d, p, f, m in db.execute(
                    "SELECT agent, score, dispute_count, passes, failures, matching_score FROM reputation"
                )}
            finally:
                db.close()
            return tasks, reputation
        store: dict[str, Any] = json.loads(self.store.read_text(encoding="utf-8"))
        return dict(store["tasks"]), {
            agent: (r["score"], r["dispute_count"], r["passes"], r["failures"], r["matching_score"])
            for agent, r in store["reputation"].items()
        }


def python_subscriber(bootstrap: str, folder: Path, group: str, *, topic_prefix: str = "") -> Subscriber:
    store = folder / "python-views.sqlite"
    args = [sys.executable, str(PYTHON_EXAMPLE), "--bootstrap", bootstrap, "--store", str(store), "--group", group,
            "--events-topic", f"{topic_prefix}escrow.events.v1",
            "--reputation-topic", f"{topic_prefix}escrow.reputation.v1"]
    return Subscriber("python", store, args, folder / "python-subscriber.log")


def typescript_subscriber(bootstrap: str, folder: Path, group: str, *, topic_prefix: str = "") -> Subscriber:
    entry = build_typescript()
    store = folder / "typescript-views.json"
    args = ["node", str(entry), "--bootstrap", bootstrap, "--store", str(store), "--group", group,
            "--events-topic", f"{topic_prefix}escrow.events.v1",
            "--reputation-topic", f"{topic_prefix}escrow.reputation.v1"]
    return Subscriber("typescript", store, args, folder / "typescript-subscriber.log")


async def project_views(conn: asyncpg.Connection) -> Views:
    """The same two views as our own consumers hold them (lifecycle's task_states, agent_reputation)."""
    tasks = {
        f"{r['chain_id']}:{r['escrow'].lower()}:{int(r['task_id'])}": int(r["status"])
        for r in await conn.fetch("SELECT chain_id, escrow, task_id, status FROM task_states")
    }
    reputation = {
        r["agent"].lower(): (r["score"], r["dispute_count"], r["passes"], r["failures"], r["matching_score"])
        for r in await conn.fetch(
            "SELECT agent, score, dispute_count, passes, failures, matching_score FROM agent_reputation"
        )
    }
    return tasks, reputation
