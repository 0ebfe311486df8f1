"""One configuration scheme for every service: a YAML file, `${VAR}` in it, the environment on top.

Layout (the same for every service): top-level keys are shared by every service that has a
setting of that name (`database_url`, `kafka_bootstrap`, `chains`, `log_json`, ...); a section
named after the service (`indexer:`, `relayer:`, `api:`, `verification:`, `consumers:`)
holds its own keys and wins over the shared ones. Keys starting with `x-` are YAML anchors.

Precedence, highest first: explicit keyword arguments, `ESCROWD_*` environment variables, the
section, the shared top-level keys, the defaults. `${VAR}` and `${VAR:-default}` in string
values are replaced from the environment after parsing (so a value can never add YAML
structure); an unset variable without a default is a start-up error naming it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, TypeVar

from runtime.errors import StartupError

SECTIONS = ("indexer", "relayer", "api", "verification", "consumers")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")

S = TypeVar("S")


def expand(value: Any, *, where: str = "") -> Any:
    """Replace `${VAR}` / `${VAR:-default}` in every string of `value` (recursively)."""
    if isinstance(value, str):

        def substitute(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if name in os.environ:
                return os.environ[name]
            if default is not None:
                return default
            raise StartupError(f"configuration {where or 'value'} uses ${{{name}}}, which is not set")

        return _VAR.sub(substitute, value)
    if isinstance(value, dict):
        return {k: expand(v, where=f"{where}.{k}" if where else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [expand(v, where=f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def read_config(path: Path) -> dict[str, Any]:
    """The file as a mapping, `${VAR}` expanded (YAML, or JSON, which is YAML)."""
    import yaml

    loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise StartupError(f"{path}: expected a mapping at the top level")
    expanded: dict[str, Any] = expand(loaded)
    return expanded


def section(data: dict[str, Any], name: str, fields: set[str]) -> dict[str, Any]:
    """The keys service `name` reads: shared top-level keys it knows, then its own section."""
    shared = {k: v for k, v in data.items() if k in fields and k not in SECTIONS and not k.startswith("x-")}
    own = data.get(name) or {}
    if not isinstance(own, dict):
        raise StartupError(f"configuration section {name}: expected a mapping")
    return {**shared, **own}


def set_in_environment(prefix: str, field: str) -> bool:
    """True when `ESCROWD_<FIELD>` (or a nested `ESCROWD_<FIELD>__...`) is set."""
    key = (prefix + field).upper()
    return any(name.upper() == key or name.upper().startswith(key + "__") for name in os.environ)


def config_path(config_file: Path | None) -> Path | None:
    """`config_file`, else `$ESCROWD_CONFIG` when set; a missing file is a start-up error."""
    path = config_file
    if path is None and os.environ.get("ESCROWD_CONFIG"):
        path = Path(os.environ["ESCROWD_CONFIG"])
    if path is not None and not path.is_file():
        raise StartupError(f"configuration file {path} not found")
    return path


def load(cls: type[S], name: str, config_file: Path | None = None, **overrides: Any) -> S:
    """Build settings class `cls` for service `name` under the scheme above."""
    path = config_path(config_file)
    values: dict[str, Any] = {}
    if path is not None:
        fields = set(cls.model_fields)  # type: ignore[attr-defined]
        prefix = str(cls.model_config.get("env_prefix", "ESCROWD_"))  # type: ignore[attr-defined]
        values = {
            k: v for k, v in section(read_config(path), name, fields).items() if not set_in_environment(prefix, k)
        }
    values.update({k: v for k, v in overrides.items() if v is not None})
    return cls(**values)
