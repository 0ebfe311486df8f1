"""Indexer configuration: parsed once at start-up, from a YAML/JSON file and `ESCROWD_*` env.

Bad configuration fails at start-up with the offending field named (pydantic does that).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator
from pydantic_settings import SettingsConfigDict

from runtime.config_file import load as config_file_load
from runtime.retention import RetentionConfig
from runtime.settings import ChainEndpoints, EventServiceSettings


class ChainConfig(ChainEndpoints):
    """One chain to follow."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    start_block: int = Field(default=0, ge=0, description="First block to index")
    confirmations: int = Field(default=0, ge=0, description="Publish events once this many blocks deep")
    publish_at: Literal["latest", "safe", "finalized"] | Annotated[int, Field(ge=0)] | None = Field(
        default=None,
        description=(
            "When events are published: latest, safe or finalized (the node's block tags, checked at start)"
            " or a number of confirmations; unset: `confirmations`"
        ),
    )
    fallback_confirmations: int = Field(
        default=64, ge=0, description="Confirmations used instead when the node has no safe/finalized tag"
    )
    finality_depth: int = Field(
        default=64, ge=1, description="Blocks deeper than this are fetched in ranges without per-block headers"
    )
    initial_range: int = Field(default=200, ge=1, description="First eth_getLogs range size")
    max_range: int = Field(default=5000, ge=1, description="Largest eth_getLogs range")
    ranges_in_flight: int = Field(default=4, ge=1, le=64, description="eth_getLogs requests in flight")
    head_window: int = Field(default=100, ge=1, description="Blocks fetched per step when near the head")
    keep_blocks: int = Field(default=512, ge=16, description="Recent block hashes kept for reorg walks")
    max_events_per_commit: int = Field(
        default=10_000, ge=1, description="Events per transaction (a window commits in pieces at block boundaries)"
    )

    @property
    def fixed_confirmations(self) -> int:
        """The publish depth when it is a count (`publish_at` latest or a number, else `confirmations`)."""
        if self.publish_at == "latest":
            return 0
        if isinstance(self.publish_at, int):
            return self.publish_at
        return self.confirmations

    @property
    def finality_tag(self) -> str | None:
        """`safe` or `finalized` when events wait for the node's tag."""
        return self.publish_at if self.publish_at in ("safe", "finalized") else None

    @model_validator(mode="after")
    def _ranges(self) -> ChainConfig:
        if self.initial_range > self.max_range:
            raise ValueError("initial_range must not exceed max_range")
        return self


class IndexerSettings(EventServiceSettings):
    """Everything `escrowd index` needs."""

    model_config = SettingsConfigDict(extra="forbid", env_nested_delimiter="__")

    topic_partitions: int = Field(default=4, ge=1, description="Partitions when creating topics")
    chains: list[ChainConfig] = Field(min_length=1, description="Chains to follow")
    log_json: bool = Field(default=True, description="JSON log lines (false: console)")
    run_publisher: bool = Field(default=True, description="Run the outbox publisher in this process")
    finalized_topic: str | None = Field(
        default=None,
        description=(
            "Also publish each chain's events, once finalized, to this topic (e.g. escrow.events.finalized.v1);"
            " none: no finalized-only stream"
        ),
    )
    retention: RetentionConfig = Field(
        default_factory=RetentionConfig, description="The retention pruner (one per database elects itself)"
    )


def load_settings(config_file: Path | None = None, **overrides: Any) -> IndexerSettings:
    """Settings: explicit overrides, then `ESCROWD_*`, then the file's `indexer:` section and
    shared top-level keys (`runtime.config_file`), then defaults."""
    return config_file_load(IndexerSettings, "indexer", config_file, **overrides)
