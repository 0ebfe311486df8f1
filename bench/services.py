"""The services a benchmark runs on: an embedded PostgreSQL and a Tansu broker, always stopped."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from runtime.services.kafka import KafkaService, start_kafka
from runtime.services.postgres import PostgresService, start_postgres

T = TypeVar("T")


def with_services(main: Callable[[PostgresService, KafkaService], Coroutine[Any, Any, T]]) -> T:
    """`main(postgres, kafka)` in its own event loop, the services started before it (both
    helpers run a loop of their own) and stopped after, whatever happens."""
    postgres = start_postgres(prefix="escrowd_bench")
    try:
        kafka = start_kafka()
        try:
            return asyncio.run(main(postgres, kafka))
        finally:
            kafka.stop()
    finally:
        postgres.stop()


def on_services(main: Callable[[str, str], Coroutine[Any, Any, T]]) -> T:
    """`main(database_url, kafka_bootstrap)`, as `with_services` runs it."""
    return with_services(lambda postgres, kafka: main(postgres.url, kafka.bootstrap))
