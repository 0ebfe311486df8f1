"""JSON encoding that is fast and exact for uint256 values.

orjson is fast but refuses integers beyond 64 bits on output and turns them into floats on
input; token amounts and hashes-as-numbers can exceed that. The fast path is orjson; texts
with a run of 19+ digits, and values it refuses, go through the standard library.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

_LONG_NUMBER = re.compile(rb"\d{19,}")


def dumps(value: Any) -> bytes:
    """Serialise to compact JSON bytes, exactly."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def dumps_str(value: Any) -> str:
    """Serialise to a compact JSON string, exactly."""
    return dumps(value).decode()


def loads(data: bytes | str) -> Any:
    """Parse JSON, keeping big integers exact."""
    raw = data.encode() if isinstance(data, str) else data
    if _LONG_NUMBER.search(raw):
        return json.loads(raw)
    return orjson.loads(raw)
