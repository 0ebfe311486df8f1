"""The one JSON decode path for bytes from outside: size and nesting bounded before parsing.

Every JSON text that crosses a trust boundary (HTTP bodies, Kafka messages, CLI files,
plugin and endpoint replies) goes through `loads`. It refuses, as `JsonRefused` (a
`ValueError` with a stable `code`):

* `JSON_TOO_LARGE`: more than `max_bytes` bytes (default `DEFAULT_MAX_BYTES`, 1 MiB);
* `JSON_TOO_DEEP`: arrays and objects nested deeper than `max_depth` (`MAX_DEPTH`, 64);
* `JSON_INVALID`: not JSON, not UTF-8, a lone surrogate (RFC 7493, I-JSON), a NUL
  character (PostgreSQL text and jsonb cannot hold one), NaN or an infinity.

The size and the depth are checked *before* any recursive parser runs: the depth by a
few linear passes over the bytes (escapes and strings cut out with `bytes.replace` and
`split`, then a running sum over the brackets that remain), so a 100,000-deep text costs one pass, never a recursion.
The parser itself is orjson, or the standard library when the text holds an integer of 19+
digits (orjson would turn it into a float): both see at most `max_depth` levels.

Pure: imports nothing of the project.
"""

from __future__ import annotations

import json
import math
import re
import sys
from itertools import accumulate
from typing import Any, Final

import orjson

MAX_DEPTH: Final = 64
"""Deepest nesting of arrays and objects accepted (the outermost value is level 1)."""

DEFAULT_MAX_BYTES: Final = 1024 * 1024
"""Largest JSON text accepted unless the caller says otherwise (1 MiB)."""

SAFE_RECURSION_LIMIT: Final = 1000
"""Python's own default: low enough that a C-level recursion cannot overflow an 8 MiB stack."""

_KEEP_QUOTES_AND_BRACKETS = bytes(b for b in range(256) if b not in b'"[]{}')
_DELTA: Final = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}
# Digits as "0", everything else as " ": a run of 19 zeros is then a plain substring search.
_DIGITS_ONLY = bytes(ord("0") if chr(b).isdigit() and b < 128 else ord(" ") for b in range(256))
_LONG_RUN = b"0" * 19
# Escapes that may decode to a NUL or a surrogate; only texts holding one need a full check.
_SUSPECT_ESCAPE = re.compile(rb"\\u(?:0000|[dD][89a-fA-F])")


class JsonRefused(ValueError):
    """A JSON text refused before or while parsing; `code` says why, the text says where."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def nesting_depth(raw: bytes, stop_above: int | None = None) -> int:
    """Deepest nesting of arrays and objects in `raw`, counted without recursion.

    Brackets inside strings do not count. For a text that is not valid JSON the figure may
    be larger than a parser would reach, never smaller before the point where it fails.
    """
    if stop_above is not None and raw.count(b"[") + raw.count(b"{") <= stop_above:
        return 0  # cannot be deeper than the limit: spare the scan
    # Escapes first, as a parser pairs them: every `\\`, then every `\"`, is no quote.
    text = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    # Only quotes and brackets matter; a string without brackets is then `""`, and dropping
    # two adjacent quotes leaves every other byte on its side of the string boundaries.
    text = text.translate(None, _KEEP_QUOTES_AND_BRACKETS).replace(b'""', b"")
    # Between quotes is inside a string (an unterminated string runs to the end).
    outside = b"".join(text.split(b'"')[::2])
    return max(accumulate(map(_DELTA.__getitem__, outside)), default=0)


def _refuse_constant(name: str) -> Any:
    raise JsonRefused("JSON_INVALID", f"{name} is not a JSON number")


def _check_values(value: Any) -> None:
    """Refuse lone surrogates and NUL in strings and keys, and infinite numbers (no recursion)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise JsonRefused("JSON_INVALID", "a number is too large for a float")
        if isinstance(item, str):
            texts: tuple[str, ...] = (item,)
        elif isinstance(item, dict):
            texts = tuple(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
            continue
        else:
            continue
        for text in texts:
            if "\x00" in text:
                raise JsonRefused("JSON_INVALID", "strings may not contain NUL (\\u0000)")
            if not text.isascii():
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:
                    raise JsonRefused("JSON_INVALID", "strings may not contain lone surrogates") from None


def loads(data: bytes | bytearray | memoryview | str, *, max_bytes: int | None = DEFAULT_MAX_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """Parse one JSON text from outside, within the bounds (see the module docstring).

    `max_bytes=None` lifts the size bound (for our own database rows); the depth bound and
    the content rules always hold. Integers keep every digit.
    """
    if isinstance(data, str):
        try:
            raw = data.encode("utf-8")
        except UnicodeEncodeError:
            raise JsonRefused("JSON_INVALID", "strings may not contain lone surrogates") from None
    else:
        raw = bytes(data)
    if max_bytes is not None and len(raw) > max_bytes:
        raise JsonRefused("JSON_TOO_LARGE", f"the JSON text is {len(raw)} bytes; at most {max_bytes}")
    depth = nesting_depth(raw, stop_above=max_depth)
    if depth > max_depth:
        raise JsonRefused("JSON_TOO_DEEP", f"the JSON text nests deeper than {max_depth} levels")
    if _LONG_RUN in raw.translate(_DIGITS_ONLY):
        try:
            text = raw.decode("utf-8")  # strict: no encoded surrogates, no invalid bytes
            value = json.loads(text, parse_constant=_refuse_constant)
        except JsonRefused:
            raise
        except (ValueError, RecursionError) as exc:
            raise JsonRefused("JSON_INVALID", f"not JSON: {exc}"[:300]) from None
        _check_values(value)
        return value
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise JsonRefused("JSON_INVALID", f"not JSON: {exc}"[:300]) from None
    if _SUSPECT_ESCAPE.search(raw):
        _check_values(value)
    return value


def cap_recursion_limit(limit: int = SAFE_RECURSION_LIMIT) -> int:
    """Lower Python's recursion limit to `limit` if a library raised it; return the limit in force.

    Some libraries (py_ecc) raise it to 100,000 at import, which lets C-level recursion
    (the standard JSON parser, `repr`) overflow the C stack and kill the process with
    SIGSEGV instead of raising RecursionError. Never raises the limit.
    """
    if sys.getrecursionlimit() > limit:
        sys.setrecursionlimit(limit)
    return sys.getrecursionlimit()
