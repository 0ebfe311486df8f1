"""JSON encoding that is fast and exact for uint256 values.

orjson is fast but refuses integers beyond 64 bits on output and turns them into floats on
input; token amounts and hashes-as-numbers can exceed that. The fast path is orjson; values
it refuses go through the standard library. Parsing is `schemas.jsonbounds.loads`: nesting
bounded before any parser runs, texts with a run of 19+ digits parsed exactly.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from schemas import jsonbounds


def dumps(value: Any) -> bytes:
    """Serialise to compact JSON bytes, exactly."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def dumps_str(value: Any) -> str:
    """Serialise to a compact JSON string, exactly."""
    return dumps(value).decode()


def loads(data: bytes | str, *, max_bytes: int | None = None) -> Any:
    """Parse JSON, keeping big integers exact, nesting bounded (`jsonbounds.loads`).

    No size bound unless `max_bytes` is given: texts from outside pass one (or go through
    `jsonbounds.loads` and its default); our own database rows need none.
    """
    return jsonbounds.loads(data, max_bytes=max_bytes)
