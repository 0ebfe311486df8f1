"""The base every service's settings class builds on: one prefix, one database-URL rule.

Each service reads `ESCROWD_*` environment variables over its section of the configuration
file (`runtime.config_file.load`); a subclass adds its fields and may narrow the model
configuration (`extra="forbid"`, another prefix for a nested section).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator
from pydantic_settings import BaseSettings, SettingsConfigDict


def postgres_url(url: str) -> str:
    """`url` if it is a PostgreSQL URL (the message never quotes it: it may hold a password)."""
    if not url.startswith(("postgres://", "postgresql://")):
        raise ValueError("database_url must be a postgresql:// URL")
    return url


PostgresUrl = Annotated[str, AfterValidator(postgres_url)]
"""A `postgresql://` (or `postgres://`) URL."""


class ServiceSettings(BaseSettings):
    """`ESCROWD_*` environment variables over the file's section; keys no field names are ignored."""

    model_config = SettingsConfigDict(env_prefix="ESCROWD_", extra="ignore")
