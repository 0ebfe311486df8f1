"""The local stack for `escrowd run` and `escrowd devnet`: PostgreSQL, Kafka and anvil.

Embedded defaults: a throwaway PostgreSQL unless a server URL is given (`escrowd run` takes
it from `ESCROWD_DATABASE_URL`), a Tansu broker unless a bootstrap is given, and always a fresh anvil devnet with the escrow deployed.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from escrowd.devnet import Devnet, deploy_devnet
from runtime.services.anvil import AnvilProcess
from runtime.services.kafka import KafkaService, start_kafka
from runtime.services.postgres import PostgresService, start_postgres


@dataclass
class LocalStack:
    """Running local services; `stop` stops what was started here."""

    postgres: PostgresService
    kafka: KafkaService
    anvil: AnvilProcess
    devnet: Devnet

    def stop(self) -> None:
        """Stop the broker, the database and then the chain, each waited for."""
        with contextlib.suppress(Exception):
            self.kafka.stop()
        with contextlib.suppress(Exception):
            self.postgres.stop()
        with contextlib.suppress(Exception):
            self.anvil.stop()


def start_stack(
    *, database_url: str | None = None, kafka_bootstrap: str | None = None, block_time: float | None = None
) -> LocalStack:
    """Start (or attach to) PostgreSQL and Kafka, start anvil (`block_time`: interval mining) and deploy the escrow."""
    postgres = start_postgres(database_url, prefix="escrowd_run")
    try:
        kafka = start_kafka(kafka_bootstrap)
    except Exception:
        postgres.stop()
        raise
    anvil = AnvilProcess(block_time=block_time)
    try:
        anvil.start()
        devnet = deploy_devnet(anvil.rpc_url, ws_url=anvil.ws_url)
    except Exception:
        anvil.stop()
        kafka.stop()
        postgres.stop()
        raise
    return LocalStack(postgres=postgres, kafka=kafka, anvil=anvil, devnet=devnet)
