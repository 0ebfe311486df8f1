"""The configuration reference, generated from the pydantic settings models.

`python -m escrowd.configref > docs/configuration.md` rewrites the reference; a test checks
that the committed file equals this module's output, so the document cannot drift from the
code.

Which models: every `pydantic_settings.BaseSettings` subclass defined in the service
packages (found by reading their source, so a new settings module is picked up without
editing this file), then every pydantic model reachable from their fields (such as the
indexer's `ChainConfig`), each once, in the order first met. One table per model: field,
environment variable, type with its constraints, default, description.
"""

from __future__ import annotations

import ast
import enum
import importlib
import inspect
import json
import sys
import types
import typing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, SecretBytes, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

PACKAGES: tuple[str, ...] = (
    "schemas", "runtime", "chain", "indexer", "relayer", "verification", "lifecycle", "panels", "api", "escrowd",
)  # fmt: skip
"""Packages searched for settings models."""

COMMAND = "python -m escrowd.configref > docs/configuration.md"

_CONSTRAINTS: tuple[tuple[str, str], ...] = (
    ("gt", ">"),
    ("ge", ">="),
    ("lt", "<"),
    ("le", "<="),
    ("multiple_of", "multiple of"),
    ("min_length", "min length"),
    ("max_length", "max length"),
    ("pattern", "pattern"),
)


@dataclass(frozen=True)
class ModelRef:
    """A model to document and how its fields are reached from the environment."""

    model: type[BaseModel]
    env_prefix: str | None
    """Prefix of its fields' variables; None when they have none of their own."""
    reached_as: str
    """Where the model sits: `ESCROWD_*` for a settings root, else the parent field path."""


def settings_modules(packages: Sequence[str] = PACKAGES) -> list[str]:
    """Modules of `packages` whose source defines a class deriving from a `*Settings` base."""
    found: list[str] = []
    for package in packages:
        try:
            module = importlib.import_module(package)
        except ModuleNotFoundError:
            continue
        for root in getattr(module, "__path__", []):
            base = Path(root)
            for path in sorted(base.rglob("*.py")):
                if "__pycache__" in path.parts or not _defines_settings(path):
                    continue
                relative = path.relative_to(base).with_suffix("")
                parts = [package, *relative.parts]
                if parts[-1] == "__init__":
                    parts.pop()
                found.append(".".join(parts))
    return sorted(set(found))


def _defines_settings(path: Path) -> bool:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
                if isinstance(name, str) and name.endswith("Settings"):
                    return True
    return False


def settings_models(modules: Sequence[str] | None = None) -> list[type[BaseSettings]]:
    """The settings classes defined in `modules` (default: every settings module found)."""
    models: list[tuple[str, int, type[BaseSettings]]] = []
    for name in settings_modules() if modules is None else modules:
        module = importlib.import_module(name)
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, BaseSettings)
                and value is not BaseSettings
                and value.__module__ == name
                and value.model_fields  # a base with no field of its own (runtime.settings) is no service's
                and not value.__module__.startswith("runtime.")  # the shared bases: documented in their services
            ):
                line = _first_line(value)
                models.append((name, line, value))
    models.sort(key=lambda item: (item[0], item[1]))
    return [model for _, _, model in models]


def _first_line(cls: type) -> int:
    try:
        return inspect.getsourcelines(cls)[1]
    except (OSError, TypeError):
        return 0


def documented_models(roots: Sequence[type[BaseSettings]]) -> list[ModelRef]:
    """The roots, then every nested pydantic model reachable from their fields, each once."""
    refs: list[ModelRef] = []
    seen: set[type[BaseModel]] = set()
    queue: list[ModelRef] = [
        ModelRef(root, str(root.model_config.get("env_prefix", "")), f"{root.__name__}")
        for root in roots
    ]
    while queue:
        ref = queue.pop(0)
        if ref.model in seen:
            continue
        seen.add(ref.model)
        refs.append(ref)
        delimiter = _nested_delimiter(ref)
        for name, field in ref.model.model_fields.items():
            for nested, in_list in _nested_models(field.annotation):
                if nested in seen:
                    continue
                prefix: str | None = None
                if ref.env_prefix is not None and delimiter and not in_list:
                    prefix = f"{_env_names(ref, name, field)[0]}{delimiter}"
                path = f"{ref.reached_as}.{name}{'[]' if in_list else ''}"
                queue.append(ModelRef(nested, prefix, path))
    return refs


def _nested_delimiter(ref: ModelRef) -> str | None:
    config = ref.model.model_config
    value = config.get("env_nested_delimiter")
    return value if isinstance(value, str) and value else None


def _nested_models(
    annotation: Any, in_list: bool = False
) -> Iterator[tuple[type[BaseModel], bool]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if not issubclass(annotation, BaseSettings):
            yield annotation, in_list
        return
    origin = typing.get_origin(annotation)
    listy = origin in (list, tuple, set, frozenset, dict) or (
        isinstance(origin, type) and issubclass(origin, Sequence | dict)
    )
    for arg in typing.get_args(annotation):
        yield from _nested_models(arg, in_list or listy)


def _env_names(ref: ModelRef, name: str, field: FieldInfo) -> list[str]:
    if ref.env_prefix is None:
        return []
    case_sensitive = bool(ref.model.model_config.get("case_sensitive", False))
    aliases: list[str] = []
    validation_alias = field.validation_alias
    if isinstance(validation_alias, str):
        aliases.append(validation_alias)
    elif validation_alias is not None:
        choices = getattr(validation_alias, "choices", [])
        aliases.extend(choice for choice in choices if isinstance(choice, str))
    elif field.alias:
        aliases.append(field.alias)
    names = aliases or [f"{ref.env_prefix}{name}"]
    return names if case_sensitive else [n.upper() for n in names]


def type_name(annotation: Any) -> str:
    """A short, readable name for a field's annotation (`int | None`, `list[ChainConfig]`)."""
    if annotation is None or annotation is type(None):
        return "None"
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Union or origin is types.UnionType:
        return " | ".join(type_name(arg) for arg in args)
    if origin is Literal:
        return "one of " + ", ".join(json.dumps(_plain(arg)) for arg in args)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is not None:
        origin_name = getattr(origin, "__name__", str(origin))
        if not args:
            return str(origin_name)
        return f"{origin_name}[{', '.join(type_name(arg) for arg in args)}]"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _constraints(field: FieldInfo) -> list[str]:
    found: list[str] = []
    for item in field.metadata:
        for attribute, symbol in _CONSTRAINTS:
            value = getattr(item, attribute, None)
            if value is not None:
                found.append(f"{symbol} {value}")
    return found


def _is_secret(annotation: Any) -> bool:
    if isinstance(annotation, type) and issubclass(annotation, SecretStr | SecretBytes):
        return True
    return any(_is_secret(arg) for arg in typing.get_args(annotation))


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return _plain(value.value)
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple | frozenset | set):
        return [_plain(v) for v in value]
    return value


def default_text(field: FieldInfo) -> str:
    """The default as an operator writes it, `required` when there is none."""
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        try:
            value = field.default_factory()  # type: ignore[call-arg]
        except TypeError:
            return "computed"
    else:
        value = field.default
    if value is PydanticUndefined:
        return "required"
    if _is_secret(field.annotation) and value is not None:
        return "(hidden)"
    try:
        rendered = json.dumps(_plain(value), sort_keys=True)
    except (TypeError, ValueError):
        rendered = repr(value)
    return f"`{rendered}`"


def _cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").strip()


def _code(text: str) -> str:
    return f"`{text}`" if text else ""


def model_table(ref: ModelRef) -> str:
    """One Markdown section: the model's heading, where it lives, and its fields."""
    model = ref.model
    doc = " ".join((model.__doc__ or "").split())
    lines = [f"## `{model.__name__}`", ""]
    if doc:
        lines += [doc, ""]
    where = f"Defined in `{model.__module__}`."
    if ref.env_prefix is not None and "." not in ref.reached_as:
        where += f" Environment variables take the prefix `{ref.env_prefix.upper()}`."
    elif ref.env_prefix is not None:
        where += (
            f" Reached as `{ref.reached_as}`; environment variables take the prefix"
            f" `{ref.env_prefix.upper()}`."
        )
    else:
        where += (
            f" Reached as `{ref.reached_as}`: set it in the configuration file, or as JSON in"
            " the parent field's environment variable."
        )
    lines.append(where)
    lines += [
        "",
        "| field | env var | type | default | description |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, field in model.model_fields.items():
        env = ", ".join(_code(n) for n in _env_names(ref, name, field)) or "—"
        kind = ", ".join([_code(type_name(field.annotation)), *_constraints(field)])
        row = [_code(name), env, kind, default_text(field), field.description or ""]
        lines.append("| " + " | ".join(_cell(cell) for cell in row) + " |")
    return "\n".join(lines) + "\n"


def render(roots: Sequence[type[BaseSettings]] | None = None) -> str:
    """The whole reference as Markdown."""
    models = documented_models(settings_models() if roots is None else roots)
    head = [
        "# Configuration reference",
        "",
        f"<!-- Generated from the settings models by `{COMMAND}`; do not edit by hand. -->",
        "",
        "Every service reads its settings once, at start-up, and refuses to start with one",
        "short line naming the problem and the field (exit code 2; never a secret's value)",
        "when one is invalid. Sources, highest first: the environment (the `ESCROWD_` prefix),",
        "the configuration file (`--config`, or the `ESCROWD_CONFIG` variable; see",
        "`deploy/config.example.yaml`), the defaults. The file has the same layout for every",
        "service: top-level keys are shared by every service that has a setting of that name,",
        "and a section named after the service (`indexer`, `relayer`, `api`, `verification`,",
        "`lifecycle`, `reputation`, `rulings`, `panels`, `verifier_agent` with its model under",
        "`verifier_agent.model`, `verifier_bot`) holds its own keys and wins over the shared",
        "ones. `${VAR}` and `${VAR:-default}` in a value are read from the environment. Keep",
        "secrets and per-environment endpoints (the database URL, keys) in the environment; every",
        "password can also be given as a file (its `*_file` setting, `ESCROWD_*_FILE`). In every",
        "section a key its service does not read is refused, and so is a top-level key no",
        "service reads. In the `rulings`, `panels`, `verifier_agent` and `verifier_bot` sections",
        "a secret may only be written as `${VAR}` or given as a file. Nested models that sit in",
        "a list (such as `chains`) are written in the file, or as one JSON value in the parent's",
        "variable. Each process has its own section, so processes sharing a host can be given",
        "their own `metrics_port` (the example file does).",
        "",
        "`escrowd config check --config FILE` validates a file against every model below",
        "(`--section NAME` for some of them) and loads each service's secrets as at start-up:",
        "keystores are decrypted with their passwords and key files read, so a wrong password",
        "fails the check. `--no-secrets` lints a file where no secret is at hand (CI): a missing",
        "key, keystore or password, or an unset `${VAR}` in a secret setting, is accepted; the",
        "database URL and the broker still come from the environment (a placeholder serves).",
        "",
        "Renamed settings (a file that still has them is refused with this note):",
        "",
        "| was | now |",
        "| --- | --- |",
        "| `consumers:` section (lifecycle and reputation) | `lifecycle:` and `reputation:`, one section per process |",
        "",
        "Models: "
        + ", ".join(f"[`{r.model.__name__}`](#{r.model.__name__.lower()})" for r in models)
        + ".",
        "",
    ]
    return "\n".join(head) + "\n" + "\n".join(model_table(ref) for ref in models)


def main(argv: Sequence[str] | None = None) -> int:
    """Write the reference to standard output."""
    del argv
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
