"""`escrowd consume`: run one consumer group member (scale out by running more)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import typer
from pydantic import Field

from escrowd.verification_cli import app as verification_app
from runtime.options import ConfigOption, LogJsonOption
from runtime.settings import ConsumerSettings
from runtime.shell import startup_failure
from schemas.topics import REPUTATION, TASKS, TIMERS

if TYPE_CHECKING:
    from runtime.consumer import IdempotentConsumer

app = typer.Typer(help="Kafka consumers: verification, lifecycle, reputation, panels.", no_args_is_help=True)
app.add_typer(verification_app, name="verification")


class LifecycleSettings(ConsumerSettings):
    """What `escrowd consume lifecycle` needs (`ESCROWD_*` over the file's `lifecycle:` section)."""

    tasks_topic: str = Field(default=TASKS, description="Compacted task states")
    timers_topic: str = Field(default=TIMERS, description="Timer events")


class ReputationSettings(ConsumerSettings):
    """What `escrowd consume reputation` needs (`ESCROWD_*` over the file's `reputation:` section)."""

    reputation_topic: str = Field(default=REPUTATION, description="Compacted agent reputations")
    reputation_pass_increase: int = Field(default=1, ge=0, le=100, description="Points a passed round adds")
    reputation_start_score: int = Field(default=100, ge=0, le=100, description="Score of a new agent")


async def _consume(
    consumer: IdempotentConsumer, database_url: str, bootstrap: str, metrics_port: int | None, stop: asyncio.Event
) -> None:
    """Run `consumer` and an outbox publisher until `stop`; then the consumer drains first."""
    from runtime.db import migrate_url
    from runtime.kafka import make_producer, start_producer
    from runtime.outbox import OutboxPublisher
    from runtime.shell import wait_stopped

    if metrics_port is not None:
        from runtime.health import start_server

        start_server(metrics_port)
    await migrate_url(database_url)
    producer = make_producer(bootstrap, client_id=consumer.name)
    await start_producer(producer)
    publisher = OutboxPublisher(database_url, producer)
    publishing = asyncio.create_task(publisher.run())
    consuming = asyncio.create_task(consumer.run())
    try:
        await wait_stopped(stop, consuming, publishing)
        consumer.stop()
        await consuming  # the batch in flight ends and commits, the mark is cleared, the group left
    finally:
        consumer.stop()
        if not consuming.done():
            consuming.cancel()  # the drain was cut short: the batch is handed back
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await consuming
        publisher.stop()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(publishing, 10)
        await producer.stop()


def _serve(name: str, consumer: IdempotentConsumer, settings: ConsumerSettings) -> None:
    from runtime.shell import run_service

    run_service(name, lambda stop: _consume(consumer, settings.database_url, settings.kafka_bootstrap,
                                            settings.metrics_port, stop), configure=False)  # fmt: skip


S = TypeVar("S", bound=ConsumerSettings)


def _settings(cls: type[S], section: str, config: Path | None, log_json: bool) -> S:
    """The command's settings from its section (a bad one: one line, exit 2), then logging set up."""
    from runtime.config_file import load
    from runtime.logging import configure_logging

    try:
        settings = load(cls, section, config)
    except Exception as exc:
        startup_failure("invalid configuration", exc)
    configure_logging(json=log_json)
    return settings


@app.command()
def lifecycle(config: ConfigOption = None, log_json: LogJsonOption = True) -> None:
    """The lifecycle consumer: task state, timers, what can whom do now."""
    from lifecycle.consumer import build_consumer

    settings = _settings(LifecycleSettings, "lifecycle", config, log_json)
    consumer = build_consumer(**settings.consumer_args(), tasks_topic=settings.tasks_topic,
                              timers_topic=settings.timers_topic)  # fmt: skip
    _serve("lifecycle", consumer, settings)


@app.command()
def reputation(config: ConfigOption = None, log_json: LogJsonOption = True) -> None:
    """The reputation consumer: per-agent score, dispute count, matching score."""
    from lifecycle.reputation.consumer import build_consumer
    from lifecycle.reputation.rules import ReputationRules

    settings = _settings(ReputationSettings, "reputation", config, log_json)
    rules = ReputationRules(start_score=settings.reputation_start_score, pass_increase=settings.reputation_pass_increase)
    consumer = build_consumer(**settings.consumer_args(), rules=rules, reputation_topic=settings.reputation_topic)
    _serve("reputation", consumer, settings)


@app.command()
def panels(config: ConfigOption = None, log_json: LogJsonOption = True) -> None:
    """The panel service: draws a panel for every dispute, closes rounds, signs rulings."""
    from panels.rules import to_ppm
    from panels.service import PanelConfig, build_consumer
    from panels.settings import load_panel_settings
    from runtime.logging import configure_logging

    try:
        settings = load_panel_settings(config)
        secret = settings.read_secret()
        signing_key = settings.signing_key()
        allowlist = settings.read_allowlist()
    except Exception as exc:
        # One line naming the field (safe_message never prints an input value), and
        # read_secret / signing_key name no byte of what they read.
        startup_failure("invalid configuration", exc)
    configure_logging(json=log_json)
    panel_config = PanelConfig(
        secret=secret,
        secret_version=settings.panel_secret_version,
        ruling_key=signing_key,
        attestation_seconds=settings.panel_attestation_seconds,
        fee_units=settings.panel_fee_units,
        min_confidence_ppm=to_ppm(settings.panel_min_confidence),
        operator_cap_ppm=to_ppm(settings.panel_operator_cap),
        admission=settings.panel_admission,
        allowlist=allowlist,
    )
    consumer = build_consumer(**settings.consumer_args(), config=panel_config, idle_interval=settings.panel_idle_interval)
    from panels.rules import Outcome
    from panels.service import ROUNDS
    from runtime.metrics import at_zero

    events = ("opened", "pool_too_small", "superseded", "retracted", "ruled", "sample_calibrated")
    at_zero(ROUNDS, (*events, *(outcome.value for outcome in Outcome)))
    _serve("panels", consumer, settings)
