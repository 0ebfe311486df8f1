"""Structured content in a result: the JSON object it holds, and labelled sections.

* :func:`extract_json_object` finds a JSON object the way agents deliver one: the whole
  text, else the first fenced code block that is an object, else the first ``{`` (of the
  first 50) where an object parses, with the text embedded around it. Only the first
  200,000 characters are searched. `NaN`/`Infinity` are not JSON and are refused.
* A value counts only when it holds something (:func:`has_content`): `""` (or only
  whitespace), `[]`, `{}` and `null` do not; `0` and `false` do. Only the object's own
  keys count.
* Without a JSON object, a required field may be a labelled section (:class:`LabelFinder`):
  `Summary:`, `## Summary`, `- Summary:` or `**Summary**` (colon inside or outside the
  bold) at the start of a line or of a sentence, followed by a colon or the end of the
  line, then text with at least one letter or digit before the next heading and before
  the label of another required field, within 400 characters. Labels match case-
  insensitively and spaces, `_` and `-` are interchangeable (`price_usd` ~ "Price USD:").
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from relayer.verification.text import js_trim

JSON_SCAN_CAP = 200_000
JSON_SCAN_MAX_STARTS = 50
LABEL_BODY_CHARS = 400
LABEL_MAX_TRIES = 20

_FENCE = re.compile(r"```(?:json)?\s*\n([\s\S]*?)```", re.IGNORECASE)
_NEXT_HEADING = re.compile(r"\n[ \t]*#{1,6}[ \t]")
_HAS_ALNUM = re.compile(r"[^\W_]")


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


def _as_object(text: str) -> dict[str, Any] | None:
    try:
        value, end = _DECODER.raw_decode(text)
    except (ValueError, RecursionError):
        return None
    if end != len(text) or not isinstance(value, dict):
        return None
    return value


def extract_json_object(text: str) -> dict[str, Any] | None:
    """The JSON object a result holds (bare, fenced or embedded), or None."""
    source = text[:JSON_SCAN_CAP]
    if "{" not in source:
        return None
    whole = _as_object(js_trim(source))
    if whole is not None:
        return whole
    if "```" in source:
        for fence in _FENCE.finditer(source):
            fenced = _as_object(js_trim(fence.group(1)))
            if fenced is not None:
                return fenced
    start = source.find("{")
    for _ in range(JSON_SCAN_MAX_STARTS):
        if start == -1:
            break
        try:
            value, _end = _DECODER.raw_decode(source, start)
        except (ValueError, RecursionError):
            value = None
        if isinstance(value, dict):
            return value
        start = source.find("{", start + 1)
    return None


def has_content(value: object) -> bool:
    """A delivered value: not null, not blank, not an empty list or object."""
    if value is None:
        return False
    if isinstance(value, str):
        return js_trim(value) != ""
    if isinstance(value, list | dict):
        return len(value) > 0
    return True


def share_present(keys: Sequence[str], obj: dict[str, Any]) -> float:
    """Share of `keys` that `obj` holds with content (1.0 for no keys)."""
    if not keys:
        return 1.0
    present = sum(1 for key in keys if key in obj and has_content(obj[key]))
    return present / len(keys)


def _label_source(field: str) -> str:
    parts = [re.escape(part) for part in re.split(r"[\s_-]+", field.strip()) if part]
    return r"[\s_-]+".join(parts)


class LabelFinder:
    """Finds required fields as labelled sections of prose."""

    def __init__(self, fields: Sequence[str]) -> None:
        named = [field for field in fields if field.strip()]
        self._labels: dict[str, re.Pattern[str]] = {}
        for field in named:
            self._labels[field] = re.compile(
                r"(?:(?<![^\n\r\u2028\u2029])|(?<=[.!?]\s))[ \t]*(?:#{1,6}[ \t]*|[-*][ \t]+)?"
                r"(?:\*\*|__)?" + _label_source(field) + r"[ \t]*(?:(?:\*\*|__)[ \t]*)?"
                r"(?::|(?=[\r\n\u2028\u2029]|\Z))",
                re.IGNORECASE,
            )
        alternatives = "|".join(_label_source(field) for field in named) or "(?!)"
        # Another field's label ends this field's content ("Summary: Score: 5").
        self._any_label = re.compile(rf"(?:{alternatives})(?:\*\*|__)?[ \t]*:", re.IGNORECASE)

    def has(self, field: str, text: str) -> bool:
        """True when `text` holds a labelled, non-empty section for `field`."""
        label = self._labels.get(field)
        if label is None:
            return False
        source = text[:JSON_SCAN_CAP]
        for tries, match in enumerate(label.finditer(source)):
            if tries >= LABEL_MAX_TRIES:
                break
            body = source[match.end() : match.end() + LABEL_BODY_CHARS]
            heading = _NEXT_HEADING.search(body)
            if heading is not None:
                body = body[: heading.start()]
            other = self._any_label.search(body)
            if other is not None:
                body = body[: other.start()]
            if _HAS_ALNUM.search(body):
                return True
        return False

    def share_present(self, fields: Sequence[str], text: str) -> float:
        """Share of `fields` present as labelled sections."""
        return sum(1 for field in fields if self.has(field, text)) / len(fields)
