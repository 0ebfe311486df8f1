"""The base every service's settings class builds on: one prefix, one database-URL rule.

Each service reads `ESCROWD_*` environment variables over its section of the configuration
file (`runtime.config_file.load`); a subclass adds its fields and may narrow the model
configuration (`extra="forbid"`, another prefix for a nested section).

`escrowd config check --no-secrets` lints a file where no secret is at hand: inside
`without_secrets()` a settings class does not demand a key source (`one_key_source`), and
the loader drops a secret whose `${VAR}` is unset instead of failing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Annotated, TypedDict

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.eip712 import checksum_address
from schemas.topics import DEAD_LETTERS, ESCROW_EVENTS


def postgres_url(url: str) -> str:
    """`url` if it is a PostgreSQL URL (the message never quotes it: it may hold a password)."""
    if not url.startswith(("postgres://", "postgresql://")):
        raise ValueError("database_url must be a postgresql:// URL")
    return url


PostgresUrl = Annotated[str, AfterValidator(postgres_url)]
"""A `postgresql://` (or `postgres://`) URL."""

_SECRETS_REQUIRED: ContextVar[bool] = ContextVar("escrowd_secrets_required", default=True)


def secrets_required() -> bool:
    """False inside `without_secrets()`: settings are validated without their secrets."""
    return _SECRETS_REQUIRED.get()


@contextlib.contextmanager
def without_secrets() -> Iterator[None]:
    """Validate settings with their secrets absent (a missing key source is no error)."""
    token = _SECRETS_REQUIRED.set(False)
    try:
        yield
    finally:
        _SECRETS_REQUIRED.reset(token)


def one_key_source(first: tuple[str, object], second: tuple[str, object]) -> None:
    """Exactly one of two settings (name, value) is set, else ValueError naming both.

    Without secrets at hand (`without_secrets()`) neither set is accepted.
    """
    (first_name, first_value), (second_name, second_value) = first, second
    given = (first_value is not None) + (second_value is not None)
    if given == 2 or (given == 0 and secrets_required()):
        raise ValueError(f"set exactly one of {first_name} and {second_name}")


class ChainEndpoints(BaseModel):
    """One chain in a service's `chains`: its id, nodes and escrows.

    The indexer's and the relayer's chain entries build on this one shape, so one
    `ESCROWD_CHAINS` value serves both (each ignores or forbids the other's extra keys)."""

    model_config = ConfigDict(frozen=True)

    chain_id: int = Field(gt=0, description="EIP-155 chain id; checked against the RPC at start-up")
    name: str = Field(default="", description="Label for logs and dashboards")
    rpc_urls: list[str] = Field(min_length=1, description="HTTP JSON-RPC URLs, tried in order with failover")
    ws_url: str | None = Field(default=None, description="WebSocket URL for newHeads; polling when absent")
    escrow_addresses: list[str] = Field(min_length=1, description="Escrow contracts served on this chain")
    poll_interval: float = Field(default=0.5, gt=0, description="Seconds between head polls without WebSocket")
    rpc_timeout: float = Field(default=10.0, gt=0, description="Seconds before an RPC request times out")

    @field_validator("rpc_urls")
    @classmethod
    def _http_urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError("each RPC URL must start with http:// or https://")
        return urls

    @field_validator("ws_url")
    @classmethod
    def _ws_url(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("ws://", "wss://")):
            raise ValueError("ws_url must start with ws:// or wss://")
        return url

    @field_validator("escrow_addresses")
    @classmethod
    def _addresses(cls, addresses: list[str]) -> list[str]:
        return [checksum_address(a) for a in addresses]


class ServiceSettings(BaseSettings):
    """`ESCROWD_*` environment variables over the file's section (unknown keys are refused by the loader)."""

    model_config = SettingsConfigDict(env_prefix="ESCROWD_", extra="ignore")


class EventServiceSettings(ServiceSettings):
    """What every process on the escrow events has: the database, the broker, the events topic, probes."""

    database_url: PostgresUrl = Field(description="PostgreSQL URL")
    kafka_bootstrap: str = Field(description="Kafka bootstrap servers, host:port[,host:port]")
    events_topic: str = Field(default=ESCROW_EVENTS, description="Topic of the indexed escrow events")
    metrics_port: int | None = Field(
        default=None, ge=0, le=65535, description="Port of /metrics, /healthz and /readyz; none to disable"
    )


class ConsumerSettings(EventServiceSettings):
    """What every consumer of the escrow events has: the above and where poison messages go."""

    dead_letter_topic: str = Field(default=DEAD_LETTERS, description="Poison messages, with the reason")
    kafka_session_timeout_ms: int = Field(
        default=10_000, ge=1_000, le=300_000,
        description="The consumer group's session timeout: how long the group waits for a member that"
        " stopped heartbeating before it moves the member's partitions (a broker may also hold each"
        " join for part of it)",
    )  # fmt: skip

    def consumer_args(self) -> ConsumerArgs:
        """What every consumer builder takes from these settings (`build_consumer(**args, ...)`)."""
        return ConsumerArgs(bootstrap=self.kafka_bootstrap, database_url=self.database_url,
                            events_topic=self.events_topic, dlq_topic=self.dead_letter_topic,
                            session_timeout_ms=self.kafka_session_timeout_ms)  # fmt: skip


class ConsumerArgs(TypedDict):
    """The keyword arguments of a consumer group member's builder that come from `ConsumerSettings`."""

    bootstrap: str
    database_url: str
    events_topic: str
    dlq_topic: str
    session_timeout_ms: int
