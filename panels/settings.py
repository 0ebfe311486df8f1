"""Settings of the panel service (`ESCROWD_*` over the configuration file's `panels:` section)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, model_validator

from runtime.settings import PostgresUrl, ServiceSettings
from schemas.topics import DEAD_LETTERS, ESCROW_EVENTS

MIN_SECRET_BYTES = 16
MAX_SECRET_BYTES = 4096
MAX_KEY_FILE_BYTES = 256


class PanelSettings(ServiceSettings):
    """What `escrowd consume panels` needs. The secret and the key are never logged."""

    database_url: PostgresUrl = Field(description="PostgreSQL URL")
    kafka_bootstrap: str = Field(description="Kafka bootstrap servers")
    events_topic: str = Field(default=ESCROW_EVENTS, description="Indexed escrow events")
    dead_letter_topic: str = Field(default=DEAD_LETTERS, description="Poison messages, with the reason")
    panel_secret_file: Path = Field(description="File holding the draw and sampling secret (at least 16 bytes)")
    panel_secret_version: str = Field(
        default="1", max_length=64, description="Recorded with every round, so audits know which secret drew it"
    )
    panel_signing_key: SecretStr | None = Field(
        default=None, description="0x hex secp256k1 key that signs rulings for the relayer"
    )
    panel_signing_key_file: Path | None = Field(
        default=None, description="File holding that key (a mounted secret), instead of panel_signing_key"
    )
    panel_attestation_seconds: int = Field(
        default=3600, ge=1, le=7 * 86_400, description="Attestation deadline after the draw"
    )
    panel_fee_units: int = Field(default=50_000, ge=0, description="Per weighted attestation, in token units")
    panel_idle_interval: float = Field(default=1.0, gt=0, le=60, description="Seconds between deadline sweeps")
    metrics_port: int | None = Field(default=None, ge=0, le=65535, description="Prometheus port; none to disable")

    @model_validator(mode="after")
    def _one_key(self) -> PanelSettings:
        if (self.panel_signing_key is None) == (self.panel_signing_key_file is None):
            raise ValueError("set exactly one of panel_signing_key and panel_signing_key_file")
        return self

    def signing_key(self) -> str:
        """The ruling key's 0x hex (from the file, whitespace removed); ValueError without echoing it."""
        if self.panel_signing_key is not None:
            return self.panel_signing_key.get_secret_value()
        assert self.panel_signing_key_file is not None
        with self.panel_signing_key_file.open("rb") as handle:
            raw = handle.read(MAX_KEY_FILE_BYTES + 1).strip()
        if not re.fullmatch(rb"(0x)?[0-9a-fA-F]{64}", raw):
            raise ValueError("panel_signing_key_file must hold one 32-byte hex key")
        text = raw.decode()
        return text if text.startswith("0x") else "0x" + text

    def read_secret(self) -> bytes:
        """The secret's bytes (surrounding whitespace removed); ValueError without echoing it."""
        with self.panel_secret_file.open("rb") as handle:
            raw = handle.read(MAX_SECRET_BYTES + 1).strip()
        if not MIN_SECRET_BYTES <= len(raw) <= MAX_SECRET_BYTES:
            raise ValueError(f"the panel secret must hold {MIN_SECRET_BYTES}–{MAX_SECRET_BYTES} bytes")
        return raw


PANELS_SECTION = "panels"
"""Section of the configuration file read by `escrowd consume panels`."""


def load_panel_settings(config_file: Path | None = None, **overrides: Any) -> PanelSettings:
    """The settings of `escrowd consume panels`: `ESCROWD_*` over the file's `panels:` section."""
    from runtime.config_file import load

    return load(PanelSettings, PANELS_SECTION, config_file, **overrides)
