"""PostgreSQL access shared by every service: pools and the forward-only migrations.

Migrations are the plain SQL files in `schemas/migrations/`, applied in file-name order,
each in its own transaction, under an advisory lock so that services starting together
do not race. Applied versions are recorded in `schema_migrations`.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import structlog

from runtime.errors import StartupError
from schemas import jsoncodec

log = structlog.get_logger(__name__)

_MIGRATION_LOCK = 0x65736372  # "escr": any constant shared by every service


def migration_files() -> list[tuple[str, str]]:
    """Return (version, sql) for every migration, in order."""
    folder = importlib.resources.files("schemas").joinpath("migrations")
    files = sorted(
        (entry.name, entry.read_text(encoding="utf-8"))
        for entry in folder.iterdir()
        if entry.name.endswith(".sql")
    )
    return [(name.removesuffix(".sql"), sql) for name, sql in files]


async def migrate(conn: asyncpg.Connection) -> list[str]:
    """Apply the migrations this database lacks; return the versions applied now."""
    applied_now: list[str] = []
    await conn.execute("SELECT pg_advisory_lock($1)", _MIGRATION_LOCK)
    try:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {row["version"] for row in await conn.fetch("SELECT version FROM schema_migrations")}
        for version, sql in migration_files():
            if version in done:
                continue
            async with conn.transaction():
                await conn.execute(sql)
                await conn.execute("INSERT INTO schema_migrations (version) VALUES ($1)", version)
            applied_now.append(version)
            log.info("migration_applied", version=version)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _MIGRATION_LOCK)
    return applied_now


def _encode_jsonb(value: Any) -> bytes:
    # A str is taken as JSON text already encoded (asyncpg's own convention for json);
    # anything else is serialised. Binary format: a version byte, then the text.
    text = value.encode() if isinstance(value, str) else jsoncodec.dumps(value)
    return b"\x01" + text


def _decode_jsonb(data: bytes) -> Any:
    return jsoncodec.loads(data[1:])


def _encode_json(value: Any) -> bytes:
    return value.encode() if isinstance(value, str) else jsoncodec.dumps(value)


async def _init_connection(conn: asyncpg.Connection) -> None:
    # Binary codecs, so that COPY (binary only) can write jsonb columns too.
    await conn.set_type_codec(
        "jsonb", encoder=_encode_jsonb, decoder=_decode_jsonb, schema="pg_catalog", format="binary"
    )
    await conn.set_type_codec(
        "json", encoder=_encode_json, decoder=jsoncodec.loads, schema="pg_catalog", format="binary"
    )


async def connect(url: str) -> asyncpg.Connection:
    """Open one connection with the project's JSON codecs."""
    conn = await asyncpg.connect(url)
    await _init_connection(conn)
    return conn


async def create_pool(url: str, *, min_size: int = 1, max_size: int = 8) -> asyncpg.Pool:
    """Open a pool with the project's JSON codecs."""
    pool = await asyncpg.create_pool(url, min_size=min_size, max_size=max_size, init=_init_connection)
    assert pool is not None
    return pool


class DatabaseUnreachable(StartupError, ConnectionError):
    """The database could not be reached at start-up (the message holds no password)."""


def _where(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname or 'localhost'}:{parts.port or 5432}{parts.path}"


async def migrate_url(url: str) -> list[str]:
    """Connect, migrate and close: for start-up and the `escrowd db migrate` command."""
    try:
        conn = await connect(url)
    except (OSError, TimeoutError, asyncpg.exceptions.CannotConnectNowError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise DatabaseUnreachable(f"cannot reach the database at {_where(url)} (database_url): {reason}") from exc
    try:
        return await migrate(conn)
    finally:
        await conn.close()


def columns(rows: Sequence[Sequence[Any]], width: int) -> list[list[Any]]:
    """`rows` as `width` column lists: the arrays of one `unnest($1::t1[], $2::t2[], ...)`, so a
    batch is one statement whatever its size."""
    return [[row[i] for row in rows] for i in range(width)]


def is_connection_error(exc: BaseException) -> bool:
    """True for errors where the database went away and a retry on a new connection can help."""
    retryable: Sequence[type[BaseException]] = (
        asyncpg.exceptions.ConnectionDoesNotExistError,
        asyncpg.exceptions.ConnectionFailureError,
        asyncpg.exceptions.CannotConnectNowError,
        asyncpg.exceptions.AdminShutdownError,
        asyncpg.exceptions.InterfaceError,
        ConnectionError,
        OSError,
        TimeoutError,
    )
    return isinstance(exc, tuple(retryable))
