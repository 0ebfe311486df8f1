"""Start-up errors as one short line for operators: the problem and the field, never a value.

Used by every command's entry point (`escrowd.cli.main`). Validation messages are built from
the field path and the error type and message only: pydantic's own `str(exc)` carries
`input_value=...`, which would print a mistyped password or key. URLs lose their password
wherever they are printed.
"""

from __future__ import annotations

import errno
import re
from typing import Any

SECRET_FIELD = re.compile(r"(key|password|secret|token|passphrase|url|dsn)", re.IGNORECASE)
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<pw>[^@/\s]*)@")


class StartupError(Exception):
    """A problem an operator fixes in the configuration or the environment (exit code 2)."""


def redact_url(text: str) -> str:
    """`scheme://user:password@host` → `scheme://user:***@host`, anywhere in `text`."""
    return _URL_CREDENTIALS.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)


def _field(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(settings)"


def _input_forms(value: Any) -> list[str]:
    if value is None or isinstance(value, bool):
        return []
    forms = {str(value)}
    if isinstance(value, int):
        forms.add(hex(value))
        forms.add(hex(value)[2:])
    return [f for f in forms if len(f) >= 4]


def validation_lines(errors: list[dict[str, Any]]) -> list[str]:
    """`field: message` per error, never the offending value.

    pydantic's messages do not quote the input, but a validator's own message may: for a
    secret-looking field (key, password, token, URL) the message is kept only when no form
    of the input occurs in it, otherwise the error type alone is printed.
    """
    lines = []
    for error in errors:
        where = _field(tuple(error.get("loc", ())))
        message = redact_url(str(error.get("msg", "invalid")))
        leaks = any(form in message for form in _input_forms(error.get("input")))
        if leaks or (SECRET_FIELD.search(where) and "input" not in error):
            lines.append(f"{where}: invalid ({error.get('type', 'value_error')})")
        else:
            lines.append(f"{where}: {message}")
    return lines


def safe_message(exc: BaseException) -> str:
    """A printable one-line description of `exc` with no secret in it."""
    described = describe(exc)
    if described is not None:
        return described[0]
    from runtime.logging import redact

    lines = redact(redact_url(str(exc))).splitlines()
    return lines[0] if lines else type(exc).__name__


def describe(exc: BaseException) -> tuple[str, bool] | None:
    """A one-line description of a start-up failure and whether it is the operator's to fix.

    None when `exc` is not a recognised start-up failure (the caller then prints a generic
    line and points at `--debug`).
    """
    from pydantic import ValidationError

    if isinstance(exc, StartupError):
        return redact_url(str(exc)), True
    if isinstance(exc, ValidationError):
        lines = validation_lines(exc.errors(include_url=False))  # type: ignore[arg-type]
        return "invalid settings: " + "; ".join(lines), True
    try:
        import yaml
    except ImportError:  # pragma: no cover - pyyaml is a dependency
        yaml = None  # type: ignore[assignment]
    if yaml is not None and isinstance(exc, yaml.YAMLError):
        return _yaml_line(exc), True
    if isinstance(exc, FileNotFoundError):
        return f"file not found: {exc.filename}", True
    if isinstance(exc, IsADirectoryError | PermissionError):
        return f"cannot read {exc.filename}: {exc.strerror}", True
    if type(exc).__name__ == "ClientConfigurationError" and "DSN" in str(exc):
        # asyncpg's own check of the URL (its message names the scheme, not the password)
        return f"invalid database_url: {redact_url(str(exc))}", True
    unreachable = _unreachable(exc)
    if unreachable is not None:
        return unreachable, True
    return None


def _yaml_line(exc: Any) -> str:
    # A MarkedYAMLError's str() quotes the offending line, which may hold a secret: keep
    # the problem and the position only.
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or type(exc).__name__
    if mark is not None:
        return f"invalid YAML in {mark.name}, line {mark.line + 1}, column {mark.column + 1}: {problem}"
    return f"invalid YAML: {problem}"


def _unreachable(exc: BaseException) -> str | None:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        name = type(current).__name__
        module = type(current).__module__
        if module.startswith("aiokafka") and ("Connection" in name or "NoBrokers" in name):
            return f"cannot reach the Kafka broker ({redact_url(str(current)) or name})"
        if isinstance(current, OSError) and current.errno == errno.EADDRINUSE:
            return f"cannot listen: {current.strerror or 'address already in use'} (a port setting)"
        if isinstance(current, ConnectionError | TimeoutError) or (
            isinstance(current, OSError) and current.errno is not None
        ):
            detail = redact_url(str(current)) or name
            if module.startswith("asyncpg") or "5432" in detail or "postgres" in detail.lower():
                return f"cannot reach the database ({detail})"
            return f"cannot connect: {detail}"
        current = current.__cause__ or current.__context__
    return None
