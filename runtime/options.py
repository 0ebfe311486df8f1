"""The command-line options every service command shares (typer), defined once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", envvar="ESCROWD_CONFIG", help="YAML/JSON settings file (the command reads its own section)"),
]
"""`--config FILE` (or `ESCROWD_CONFIG`): the configuration file (`runtime.config_file`)."""

LogJsonOption = Annotated[bool, typer.Option("--log-json/--log-console", help="JSON log lines")]
"""`--log-json/--log-console`: one JSON object per log line, or console lines."""
