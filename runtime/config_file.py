"""One configuration scheme for every service: a YAML file, `${VAR}` in it, the environment on top.

Layout (the same for every service): top-level keys are shared by every service that has a
setting of that name (`database_url`, `kafka_bootstrap`, `chains`, `log_json`, ...); a section
named after the service (`indexer:`, `relayer:`, `api:`, `verification:`, `lifecycle:`,
`reputation:`, `rulings:`, `panels:`, `verifier_agent:`, `verifier_bot:`)
holds its own keys and wins over the shared ones. Keys starting with `x-` are YAML anchors.
A dotted name (`verifier_agent.model`) is a mapping inside a section; it shares no top-level key.

In every section a key the service does not know is refused (with a note where the key or
section was renamed or moved: `MOVED`). Strict sections (`rulings`, `panels`,
`verifier_agent`, `verifier_bot`) also refuse a secret (a `SecretStr` setting) written as a
literal: it may be only `${VAR}` (or the path of its `*_file` setting). Both errors name the
key, never its value.

Precedence, highest first: explicit keyword arguments, `ESCROWD_*` environment variables, the
section, the shared top-level keys, the defaults. `${VAR}` and `${VAR:-default}` in string
values are replaced from the environment after parsing (so a value can never add YAML
structure), in the values the service reads only; an unset variable without a default is a
start-up error naming it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, TypeVar

from runtime.errors import StartupError

SECTIONS = ("indexer", "relayer", "api", "verification", "lifecycle", "reputation", "rulings", "panels",
            "verifier_agent", "verifier_bot")  # fmt: skip
STRICT_SECTIONS = ("rulings", "panels", "verifier_agent", "verifier_bot")
"""Sections whose literal secrets are refused (unknown keys are refused in every section)."""
MOVED: dict[str, str] = {
    "consumers": "the `consumers:` section is split into `lifecycle:` and `reputation:`, one per process"
    " (each its own metrics_port)",
}
"""Sections and `section.key` names that changed, with what replaces them (docs/configuration.md)."""
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


MAX_CONFIG_BYTES = 1_000_000
"""A configuration file larger than this is refused before it is parsed."""

_KEY_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
_ONLY_VARIABLE = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::-)?\}")


def read_raw(path: Path) -> dict[str, Any]:
    """The file as a mapping, `${VAR}` not yet expanded (YAML, or JSON, which is YAML)."""
    import yaml

    with path.open("rb") as handle:
        data = handle.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise StartupError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes")
    loaded = yaml.safe_load(data.decode("utf-8"))
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise StartupError(f"{path}: expected a mapping at the top level")
    return loaded


def read_config(path: Path) -> dict[str, Any]:
    """The file as a mapping, `${VAR}` expanded (YAML, or JSON, which is YAML)."""
    expanded: dict[str, Any] = expand(read_raw(path))
    return expanded


def key_name(key: object) -> str:
    """`key` when it looks like a setting name, else a placeholder (a key may be a pasted secret)."""
    return key if isinstance(key, str) and _KEY_NAME.fullmatch(key) else "(a key that is not a setting name)"


def own_section(data: dict[str, Any], name: str) -> dict[str, Any]:
    """The mapping at section `name` (dotted for a mapping inside a section), {} when absent."""
    current: Any = data
    walked: list[str] = []
    for part in name.split("."):
        walked.append(part)
        current = current.get(part) if isinstance(current, dict) else None
        if current is None:
            return {}
        if not isinstance(current, dict):
            raise StartupError(f"configuration section {'.'.join(walked)}: expected a mapping")
    found: dict[str, Any] = current
    return found


def section(data: dict[str, Any], name: str, fields: set[str]) -> dict[str, Any]:
    """The keys service `name` reads: shared top-level keys it knows, then its own section."""
    shared: dict[str, Any] = {}
    if "." not in name:
        shared = {k: v for k, v in data.items() if k in fields and k not in SECTIONS and not k.startswith("x-")}
    return {**shared, **own_section(data, name)}


def _is_secret(annotation: Any) -> bool:
    from typing import get_args

    from pydantic import SecretBytes, SecretStr

    if isinstance(annotation, type) and issubclass(annotation, SecretStr | SecretBytes):
        return True
    return any(_is_secret(arg) for arg in get_args(annotation))


def check_moved(raw: dict[str, Any]) -> None:
    """Refuse a section that was renamed or split, saying what replaces it."""
    for key in raw:
        if isinstance(key, str) and key in MOVED:
            raise StartupError(f"configuration section {key}: {MOVED[key]}")


def check_known(raw: dict[str, Any], name: str, cls: type, nested: frozenset[str] = frozenset()) -> None:
    """Refuse keys of section `name` that `cls` does not read (`raw`: the file before `${VAR}`)."""
    fields: dict[str, Any] = cls.model_fields  # type: ignore[attr-defined]
    own = own_section(raw, name)
    unknown = sorted(
        (key_name(k) for k in own if k not in fields and k not in nested and not str(k).startswith("x-")),
    )
    if unknown:
        shown = ", ".join(dict.fromkeys(unknown))
        notes = [MOVED[f"{name}.{k}"] for k in unknown if f"{name}.{k}" in MOVED]
        raise StartupError(f"configuration section {name}: unknown key {shown}" + "".join(f" ({n})" for n in notes))


def check_strict(raw: dict[str, Any], name: str, cls: type, nested: frozenset[str] = frozenset()) -> None:
    """Refuse unknown keys in section `name` and literal secrets (`raw`: the file before `${VAR}`)."""
    fields: dict[str, Any] = cls.model_fields  # type: ignore[attr-defined]
    check_known(raw, name, cls, nested)
    for key, value in section(raw, name, set(fields)).items():
        literal = not (isinstance(value, str) and _ONLY_VARIABLE.fullmatch(value.strip()))
        if key in fields and _is_secret(fields[key].annotation) and value is not None and literal:
            raise StartupError(
                f"configuration section {name}: {key} is a secret; write it as ${{VAR}}"
                " (or use its file setting), never as a value in the file"
            )


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


def load(
    cls: type[S], name: str, config_file: Path | None = None, *, nested: frozenset[str] = frozenset(), **overrides: Any
) -> S:
    """Build settings class `cls` for service `name` under the scheme above.

    `nested`: keys of the section that are mappings read by another settings class (the
    verifier agent's `model`), not refused as unknown and not passed to `cls`.
    """
    path = config_path(config_file)
    values: dict[str, Any] = {}
    if path is not None:
        fields = set(cls.model_fields)  # type: ignore[attr-defined]
        prefix = str(cls.model_config.get("env_prefix", "ESCROWD_"))  # type: ignore[attr-defined]
        raw = read_raw(path)
        check_moved(raw)
        if name.split(".")[0] in STRICT_SECTIONS:
            check_strict(raw, name, cls, nested)
        else:
            check_known(raw, name, cls, nested)
        own = own_section(raw, name)
        # Only what this service reads is expanded: a `${VAR}` of another section need not be
        # set for this one to start (one of its own must, even where the environment wins).
        expanded = _expand_section(section(raw, name, fields), own, name, cls.model_fields)  # type: ignore[attr-defined]
        values = {k: v for k, v in expanded.items() if k not in nested and not set_in_environment(prefix, k)}
    values.update({k: v for k, v in overrides.items() if v is not None})
    return cls(**values)


def _expand_section(values: dict[str, Any], own: dict[str, Any], name: str, fields: dict[str, Any]) -> dict[str, Any]:
    """`${VAR}` expanded in `values`; without secrets at hand a secret whose variable is unset is left out."""
    from runtime.settings import secrets_required

    out: dict[str, Any] = {}
    for key, value in values.items():
        try:
            out[key] = expand(value, where=f"{name}.{key}" if key in own else str(key))
        except StartupError:
            if secrets_required() or key not in fields or not _is_secret(fields[key].annotation):
                raise
    return out


MAX_SECRET_FILE_BYTES = 4096
"""A secret file (a key, a bearer token) larger than this is refused unread."""


def read_secret_file(path: Path, what: str) -> str:
    """The one secret in file `path`, surrounding whitespace removed; ValueError naming `what`,
    never a byte of the file."""
    with path.open("rb") as handle:
        raw = handle.read(MAX_SECRET_FILE_BYTES + 1).strip()
    if not raw or len(raw) > MAX_SECRET_FILE_BYTES:
        raise ValueError(f"{what} must hold one secret of 1 to {MAX_SECRET_FILE_BYTES} bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{what} is not UTF-8 text") from None


def read_key_file(path: Path, what: str) -> str:
    """One 32-byte hex key from file `path`, as 0x hex; ValueError naming `what`, never a byte of it."""
    text = read_secret_file(path, what)
    if not re.fullmatch(r"(0x)?[0-9a-fA-F]{64}", text):
        raise ValueError(f"{what} must hold one 32-byte hex key")
    return text if text.startswith("0x") else "0x" + text


def key_or_file(value: Any, path: Path | None, what: str) -> str:
    """A 0x hex key given as a secret setting (`value`, a SecretStr) or, in `what`, as a file."""
    if value is not None:
        return str(value.get_secret_value()).strip()
    if path is None:
        raise ValueError(f"no key: set {what.removesuffix('_file')} or {what}")
    return read_key_file(path, what)
