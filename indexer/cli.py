"""`escrowd index`: follow the escrow's events into PostgreSQL and Kafka."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import typer
from pydantic import ValidationError

from escrowd.errors import safe_message
from escrowd.logging import configure_logging

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
        typer.echo(f"invalid configuration: {safe_message(exc)}", err=True)
        raise typer.Exit(2) from None
    configure_logging(json=settings.log_json)
    try:
        asyncio.run(run_indexer(settings))
    except KeyboardInterrupt:
        sys.exit(130)


@app.command("publish")
def publish(
    database_url: str = typer.Option(..., envvar="ESCROWD_DATABASE_URL", help="PostgreSQL URL"),
    kafka_bootstrap: str = typer.Option(..., envvar="ESCROWD_KAFKA_BOOTSTRAP", help="Kafka bootstrap servers"),
    log_json: bool = typer.Option(True, "--log-json/--log-console", help="JSON log lines"),
) -> None:
    """Run only the outbox publisher (pair with `run_publisher: false` on the indexers).

    A process of its own takes the per-message Kafka work off the indexer's core; several
    may run, one publishes and the others wait on the advisory lock as standbys.
    """
    import contextlib
    import signal

    from escrowd.kafka import make_producer, start_producer
    from escrowd.outbox import OutboxPublisher

    configure_logging(json=log_json)

    async def main() -> None:
        producer = make_producer(kafka_bootstrap, client_id="escrowd-publisher")
        await start_producer(producer)
        publisher = OutboxPublisher(database_url, producer)
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signum, publisher.stop)
        try:
            await publisher.run()
        finally:
            await producer.stop()

    asyncio.run(main())
