"""A result as JavaScript's `JSON.stringify(result)` writes it.

The check reads a result without a string `output` field as JSON, and lengths
(`min_length`, `max_length`) are counted on that text, so it is written the way the
spec's platform writes it: no spaces after `,` and `:`, non-ASCII characters as is,
numbers in JavaScript's shortest form (`1.0` is `1`, `1e-7` stays `1e-7`, `1e16` is
`10000000000000000`), `NaN`/`Infinity` as `null`, and object keys in JavaScript's
enumeration order (integer-like keys first, ascending). Python-only values are written as
their `str()`; a circular reference is written as `null`. Nesting depth is unlimited:
the encoder is iterative.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from decimal import Decimal

_encode_string = json.encoder.encode_basestring  # the C encoder where available


def js_number(value: float) -> str:
    """`Number.prototype.toString()` for a float."""
    if math.isnan(value) or math.isinf(value):
        return "null"
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    digits_tuple = Decimal(repr(abs(value))).as_tuple()
    digits = "".join(map(str, digits_tuple.digits)).rstrip("0") or "0"
    exponent = int(digits_tuple.exponent)
    # value = 0.<digits> × 10^n
    n = exponent + len("".join(map(str, digits_tuple.digits)))
    k = len(digits)
    if k <= n <= 21:
        body = digits + "0" * (n - k)
    elif 0 < n <= 21:
        body = f"{digits[:n]}.{digits[n:]}"
    elif -6 < n <= 0:
        body = "0." + "0" * (-n) + digits
    else:
        power = n - 1
        mantissa = digits if k == 1 else f"{digits[0]}.{digits[1:]}"
        body = f"{mantissa}e{'+' if power >= 0 else '-'}{abs(power)}"
    return sign + body


def _scalar(value: object) -> str | None:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return str(_encode_string(value))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return js_number(value)
    return None


def _key(key: object) -> str:
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, bool | int | float):
        return _scalar(key) or str(key)
    return str(key)


_MAX_ARRAY_INDEX = 2**32 - 2


def _array_index(key: str) -> int | None:
    if not key.isdigit() or not key.isascii() or (len(key) > 1 and key[0] == "0"):
        return None
    number = int(key)
    return number if number <= _MAX_ARRAY_INDEX else None


def _js_key_order(mapping: Mapping[object, object]) -> list[tuple[str | None, object]]:
    """JavaScript enumerates integer-like keys first, ascending, then the rest in order."""
    pairs: list[tuple[str | None, object]] = [(_key(k), v) for k, v in mapping.items()]
    indexed = [
        (index, pair) for pair in pairs if (index := _array_index(pair[0] or "")) is not None
    ]
    if not indexed:
        return pairs
    rest = [pair for pair in pairs if _array_index(pair[0] or "") is None]
    return [pair for _, pair in sorted(indexed, key=lambda item: item[0])] + rest


def _tokens(root: object) -> Iterator[str]:
    # Each stack entry: an iterator over a container's remaining children, its closing
    # bracket, and the container's id (for cycle detection).
    stack: list[tuple[Iterator[tuple[str | None, object]], str, int]] = []
    open_ids: set[int] = set()
    first = [True]

    def open_container(value: object) -> str | None:
        if id(value) in open_ids:
            return None
        if isinstance(value, Mapping):
            children: Iterator[tuple[str | None, object]] = iter(_js_key_order(value))
            stack.append((children, "}", id(value)))
            open_ids.add(id(value))
            return "{"
        if isinstance(value, list | tuple):
            stack.append((((None, v) for v in value), "]", id(value)))
            open_ids.add(id(value))
            return "["
        return None

    def emit_value(value: object) -> str:
        scalar = _scalar(value)
        if scalar is not None:
            return scalar
        opened = open_container(value)
        if opened is not None:
            first.append(True)
            return opened
        if isinstance(value, Mapping | list | tuple):
            return "null"  # circular
        return str(_encode_string(str(value)))

    yield emit_value(root)
    while stack:
        children, closing, container_id = stack[-1]
        child = next(children, None)
        if child is None:
            stack.pop()
            open_ids.discard(container_id)
            first.pop()
            yield closing
            continue
        key, value = child
        prefix = "" if first[-1] else ","
        first[-1] = False
        if key is not None:
            prefix += str(_encode_string(key)) + ":"
        yield prefix + emit_value(value)


def to_js_json(value: object) -> str:
    """`JSON.stringify(value)` for JSON-like Python values."""
    scalar = _scalar(value)
    if scalar is not None:
        return scalar
    return "".join(_tokens(value))
