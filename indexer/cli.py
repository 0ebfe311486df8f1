"""`escrowd index`: follow the escrow's events into PostgreSQL and Kafka."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer
from pydantic import ValidationError

from runtime.heap import pace_for_bulk
from runtime.logging import configure_logging
from runtime.shell import run_service, startup_failure, wait_stopped

app = typer.Typer(help="Index escrow events into PostgreSQL and Kafka.", no_args_is_help=True)


@app.command("run")
def run(
    config: Path | None = typer.Option(None, "--config", "-c", envvar="ESCROWD_CONFIG", help="YAML/JSON config file"),
) -> None:
    """Index every configured chain until interrupted."""
    from indexer.app import run_indexer
    from indexer.config import load_settings

    try:
        settings = load_settings(config)
    except (ValidationError, OSError, ValueError) as exc:
        startup_failure("invalid configuration", exc)
    configure_logging(json=settings.log_json)
    pace_for_bulk()
    run_service("indexer", lambda stop: run_indexer(settings, stop), configure=False)


@app.command("publish")
def publish(
    database_url: str | None = typer.Option(None, envvar="ESCROWD_DATABASE_URL", help="PostgreSQL URL"),
    kafka_bootstrap: str | None = typer.Option(None, envvar="ESCROWD_KAFKA_BOOTSTRAP", help="Kafka bootstrap servers"),
    log_json: bool = typer.Option(True, "--log-json/--log-console", help="JSON log lines"),
    config: Path | None = typer.Option(None, "--config", "-c", envvar="ESCROWD_CONFIG", help="YAML/JSON config file"),
) -> None:
    """Run only the outbox publisher (pair with `run_publisher: false` on the indexers).

    A process of its own takes the per-message Kafka work off the indexer's core; several
    may run, one publishes and the others wait on the advisory lock as standbys.
    """
    import contextlib

    from runtime.config_file import config_path, read_config, section
    from runtime.db import migrate_url
    from runtime.errors import StartupError
    from runtime.kafka import make_producer, start_producer
    from runtime.outbox import OutboxPublisher

    # The same file as `index run` (shared keys, then the `indexer:` section); the options
    # and their ESCROWD_* variables win over it.
    path = config_path(config)
    if path is not None:
        values = section(read_config(path), "indexer", {"database_url", "kafka_bootstrap"})
        database_url = database_url or values.get("database_url")
        kafka_bootstrap = kafka_bootstrap or values.get("kafka_bootstrap")
    if not database_url or not kafka_bootstrap:
        missing = "database_url" if not database_url else "kafka_bootstrap"
        raise StartupError(f"invalid settings: {missing}: required (ESCROWD_{missing.upper()} or the config file)")
    db_url, bootstrap = str(database_url), str(kafka_bootstrap)
    configure_logging(json=log_json)
    pace_for_bulk()

    async def main(stop: asyncio.Event) -> None:
        await migrate_url(db_url)  # like every service: the schema before the first query
        producer = make_producer(bootstrap, client_id="escrowd-publisher")
        await start_producer(producer)
        publisher = OutboxPublisher(db_url, producer)
        publishing = asyncio.create_task(publisher.run())
        try:
            await wait_stopped(stop, publishing)
        finally:
            publisher.stop()  # ends after the batch it is sending; a standby waiting on the lock is cancelled
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(publishing, 10)
            await producer.stop()

    run_service("publisher", main, configure=False)
