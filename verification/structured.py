"""Structured content in a result: the JSON object it holds, and labelled sections.

* :func:`extract_json_object` finds a JSON object the way agents deliver one: the whole
  text, else the first fenced code block that is an object, else the first ``{`` (of the
  first 50) where an object parses, with the text embedded around it. Only the first
  200,000 characters are searched. `NaN`/`Infinity` are not JSON and are refused, and
  a value nesting deeper than 512 levels is not parsed (it counts as no object).
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
from bisect import bisect_left
from collections.abc import Sequence
from itertools import accumulate
from typing import Any

from verification.text import js_trim

JSON_SCAN_CAP = 200_000
JSON_SCAN_MAX_STARTS = 50
LABEL_BODY_CHARS = 400
LABEL_MAX_TRIES = 20

_NEXT_HEADING = re.compile(r"\n[ \t]*#{1,6}[ \t]")
_HAS_ALNUM = re.compile(r"[^\W_]")


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


# The C decoder recurses per nesting level. Processes that raise the recursion limit
# (py_ecc sets 100,000) would overflow the C stack on hostile input instead of raising
# RecursionError, so nesting past this depth is never handed to the decoder.
MAX_JSON_DEPTH = 512
_JSON_STRING = re.compile(r'"(?:[^"\\]++|\\.)*+"')
_BRACKET = re.compile(r"[\[\]{}]")
_NOT_BRACKET = re.compile(r"[^\[\]{}]++")
_BRACKET_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}
_MAX_FRESH_SCANS = 4  # re-pairing quotes costs a scan: bounded per extraction


class _Nesting:
    """Bracket depth of a text outside JSON strings, indexed for repeated queries.

    The bound for a value starting at `start` is the deepest nesting reached anywhere
    after it: conservative, and O(log n) per query once the text is indexed.
    """

    def __init__(self, text: str) -> None:
        self._text = text
        spans = [match.span() for match in _JSON_STRING.finditer(text)]
        self._string_starts = [start for start, _ in spans]
        self._string_ends = [end for _, end in spans]
        masked = _JSON_STRING.sub(lambda match: " " * len(match.group()), text)
        self._positions = [match.start() for match in _BRACKET.finditer(masked)]
        steps = map(_BRACKET_STEP.__getitem__, _NOT_BRACKET.sub("", masked))
        self._depths = list(accumulate(steps))
        self._deepest_after = list(accumulate(reversed(self._depths), max))[::-1]
        self._fresh_scans = 0

    def exceeds(self, start: int, limit: int) -> bool:
        index = bisect_left(self._string_starts, start) - 1  # strings opened before start
        if index >= 0 and start < self._string_ends[index]:
            # Inside what reads as a string from the text's start: pair quotes afresh,
            # a bounded number of times (past that, assume the worst).
            self._fresh_scans += 1
            if self._fresh_scans > _MAX_FRESH_SCANS:
                return True
            return _Nesting(self._text[start:]).exceeds(0, limit)
        first = bisect_left(self._positions, start)
        if first == len(self._positions):
            return False
        base = self._depths[first - 1] if first > 0 else 0
        return self._deepest_after[first] - base > limit


def json_nesting_exceeds(text: str, start: int = 0, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when the JSON value at `start` may nest deeper than `limit` levels.

    Conservative (brackets outside anything that reads as a JSON string are counted up
    to the end of the text); texts with few brackets are cleared without a scan.
    """
    if text.count("{", start) + text.count("[", start) <= limit:
        return False
    return _Nesting(text).exceeds(start, limit)


def _decode_object(source: str, start: int, nesting: _Nesting | None) -> dict[str, Any] | None:
    """The object that starts at `start`, if one does (None on any failure)."""
    if nesting is not None and nesting.exceeds(start, MAX_JSON_DEPTH):
        return None
    try:
        value, _end = _DECODER.raw_decode(source, start)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _whole_object(
    source: str, start: int, end: int, nesting: _Nesting | None
) -> dict[str, Any] | None:
    """`source[start:end]`, trimmed, if it is exactly one JSON object."""
    text = source[start:end]
    trimmed = js_trim(text)
    if not trimmed.startswith("{"):
        return None
    offset = start + text.index(trimmed[0])
    if nesting is not None and nesting.exceeds(offset, MAX_JSON_DEPTH):
        return None
    try:
        value, used = _DECODER.raw_decode(trimmed)
    except (ValueError, RecursionError):
        return None
    return value if used == len(trimmed) and isinstance(value, dict) else None


def _fenced_blocks(source: str) -> list[tuple[int, int]]:
    """Bodies of ```` ``` ```` / ```` ```json ```` blocks: the fence, optional `json` (any
    case), whitespace up to the last newline of that run, then everything up to the next
    fence. Found with `str.find`: a lazy regex walks the text a character at a time."""
    blocks: list[tuple[int, int]] = []
    opener = source.find("```")
    while opener != -1:
        at = opener + 3
        if source[at : at + 4].lower() == "json":
            at += 4
        run_end = at
        while run_end < len(source) and source[run_end].isspace():
            run_end += 1
        newline = source.rfind("\n", at, run_end)
        if newline != -1:
            body_start = newline + 1
            closer = source.find("```", body_start)
            if closer != -1:
                blocks.append((body_start, closer))
                opener = source.find("```", closer + 3)
                continue
        opener = source.find("```", opener + 1)
    return blocks


def extract_json_object(text: str) -> dict[str, Any] | None:
    """The JSON object a result holds (bare, fenced or embedded), or None."""
    source = text[:JSON_SCAN_CAP]
    if "{" not in source:
        return None
    nesting = _Nesting(source) if source.count("{") + source.count("[") > MAX_JSON_DEPTH else None
    whole = _whole_object(source, 0, len(source), nesting)
    if whole is not None:
        return whole
    for body_start, body_end in _fenced_blocks(source):
        fenced = _whole_object(source, body_start, body_end, nesting)
        if fenced is not None:
            return fenced
    start = source.find("{")
    for _ in range(JSON_SCAN_MAX_STARTS):
        if start == -1:
            break
        embedded = _decode_object(source, start, nesting)
        if embedded is not None:
            return embedded
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
            label = _label_source(field)
            self._labels[field] = re.compile(
                r"(?:(?<![^\n\r\u2028\u2029])|(?<=[.!?]\s))[ \t]*(?:#{1,6}[ \t]*|[-*][ \t]+)?"
                # Seed 000: "`**Summary**` followed by text": a label in bold is a label
                # whatever follows it, text on the same line included ("**Price** 40 USD").
                r"(?:\*\*" + label + r"[ \t]*\*\*|__" + label + r"[ \t]*__)[ \t]*:?"
                # Otherwise a colon, or the end of the line, must follow the label.
                r"|(?:(?<![^\n\r\u2028\u2029])|(?<=[.!?]\s))[ \t]*(?:#{1,6}[ \t]*|[-*][ \t]+)?"
                r"(?:\*\*|__)?" + label + r"[ \t]*(?:(?:\*\*|__)[ \t]*)?"
                r"(?::|(?=[\r\n\u2028\u2029]|\Z))",
                re.IGNORECASE,
            )
        alternatives = "|".join(_label_source(field) for field in named) or "(?!)"
        # Another field's label ends this field's content ("Summary: Score: 5", or a bold
        # label "**Score** 5").
        self._any_label = re.compile(
            rf"(?:{alternatives})(?:\*\*|__)?[ \t]*:|(?:\*\*|__)(?:{alternatives})[ \t]*(?:\*\*|__)",
            re.IGNORECASE,
        )

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
