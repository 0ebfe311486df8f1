"""Text handling for the auto check: normalisation, words, folding, the disclosure section.

* :func:`canonical` is the spec's normalisation with line structure kept: NFKC, CR/CRLF
  to LF, curly apostrophes straight, invisible characters dropped (format characters
  such as zero-width spaces, soft hyphens, bidi marks and BOM, variation selectors, and
  control characters that are not whitespace). Collapsing each run of horizontal
  whitespace to one space is left to the consumers, which either flatten the text or
  match any run where the collapsed text has one space: the result is the same and one
  pass over the text is saved. :func:`flatten` collapses every whitespace run, newlines
  included, to one space and trims: that is the "deliverable" the floor counts.
* Whitespace means JavaScript's ``\\s`` set throughout, so ``\\x1c``-``\\x1f`` and
  ``\\x85`` (whitespace to Python, not to JavaScript) are dropped as control characters.
* A word is a run of letters and digits, optionally joined by an apostrophe or a hyphen
  ("don't", "end-to-end"); each Han, Hiragana or Katakana character is a word of its
  own, since those scripts have no spaces. Words are compared lowercased.
* :func:`fold` is how forbidden phrases are compared: lowercase, accents removed (NFKD,
  combining marks dropped) and Cyrillic/Greek look-alike letters mapped to Latin.
* Lengths are counted in code points (the spec's "characters").

Pure ASCII text takes fast paths that give the same result as the general ones.
"""

from __future__ import annotations

import re
import unicodedata
from typing import cast

import regex

from verification.unicode_tables import FORMAT_CHARACTERS, MARKS, split_class

# JavaScript's \s: what JSON/JS tooling on the other side of the API calls whitespace.
JS_WHITESPACE = (
    "\t\n\v\f\r \u00a0\u1680"
    + "".join(chr(c) for c in range(0x2000, 0x200B))
    + "\u2028\u2029\u202f\u205f\u3000\ufeff"
)
# Horizontal whitespace as the normalised text has it: every JS whitespace but "\n".
HSPACE = "[" + re.escape(JS_WHITESPACE.replace("\n", "")) + "]"
# Control characters JavaScript does not count as whitespace, and format characters.
_ASCII_INVISIBLE = bytes([*range(0x09), *range(0x0E, 0x20), 0x7F])
_INVISIBLE_BMP, _INVISIBLE_ASTRAL = split_class(
    (*FORMAT_CHARACTERS, (0x00, 0x08), (0x0E, 0x1F), (0x7F, 0x9F), (0xFE00, 0xFE0F),
     (0xE0100, 0xE01EF)),
    "",
)  # fmt: skip
_APOSTROPHES = ("\u2018", "\u2019", "\u02bc")

_ASCII_WORD = re.compile(r"[a-z0-9]+(?:['-][a-z0-9]+)*")
_WORD_SOURCE = (
    r"[\p{Script=Han}\p{Script=Hiragana}\p{Script=Katakana}]|[\p{L}\p{N}]+(?:['-][\p{L}\p{N}]+)*"
)
_WORD = regex.compile(_WORD_SOURCE)
_ASCII_ANSWER_WORD = re.compile(r"[0-9]+(?:[.,][0-9]+)+(?![a-z0-9])|[a-z0-9]+(?:['-][a-z0-9]+)*")
# Maximal runs of letters and digits joined by any separator: every answer word lies
# inside one, and only runs holding "." or "," need the two-branch pattern above.
_ASCII_JOINED_RUN = re.compile(r"[a-z0-9]+(?:[.,'-][a-z0-9]+)*")
_ASCII_NUMBER = re.compile(r"[0-9]+(?:[.,][0-9]+)*")
_ANSWER_WORD = regex.compile(r"\p{N}+(?:[.,]\p{N}+)+(?![\p{L}\p{N}])|" + _WORD_SOURCE)
_NUMBER = regex.compile(r"\p{N}+(?:[.,]\p{N}+)*")

_MARKS_BMP, _MARKS_ASTRAL = split_class(MARKS, "+")
# Cyrillic and Greek letters that render like Latin ones (lowercase: fold lowercases first).
_HOMOGLYPHS = tuple(
    {
        "\u0430": "a", "\u0435": "e", "\u043e": "o", "\u0440": "p", "\u0441": "c",
        "\u0445": "x", "\u0443": "y", "\u0456": "i", "\u0455": "s", "\u0458": "j",
        "\u051b": "q", "\u051d": "w", "\u04bb": "h", "\u0501": "d", "\u0261": "g",
        "\u03b1": "a", "\u03bf": "o", "\u03b9": "i", "\u03bd": "v", "\u03c1": "p",
        "\u03b5": "e", "\u03ba": "k", "\u03c4": "t", "\u03c5": "u", "\u03c7": "x",
    }.items()
)  # fmt: skip


def js_trim(text: str) -> str:
    """`String.prototype.trim`: strip JavaScript whitespace from both ends."""
    return text.strip(JS_WHITESPACE)


def _remove(text: str, bmp: re.Pattern[str], astral: re.Pattern[str]) -> str:
    """Delete what a code-point table matches; the astral half only runs when needed."""
    if bmp.search(text) is not None:
        text = bmp.sub("", text)
    if max(text, default="\0") > "\uffff" and astral.search(text) is not None:
        text = astral.sub("", text)
    return text


def canonical(text: str) -> str:
    """Normalised text with line structure kept (see the module docstring)."""
    if text.isascii():
        # bytes.translate deletes in one C pass; a regex scan costs ten times more.
        text = text.encode("ascii").translate(None, _ASCII_INVISIBLE).decode("ascii")
    else:
        text = unicodedata.normalize("NFKC", text)
        for apostrophe in _APOSTROPHES:
            if apostrophe in text:
                text = text.replace(apostrophe, "'")
        text = _remove(text, _INVISIBLE_BMP, _INVISIBLE_ASTRAL)
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def flatten(text: str) -> str:
    """One line: every whitespace run becomes one space, ends trimmed.

    Meant for :func:`canonical` output, whose whitespace Python and JavaScript agree on.
    """
    return " ".join(text.split())


def fold(text: str) -> str:
    """Lowercase, accents stripped, look-alike letters mapped to Latin."""
    lowered = text.lower()
    if lowered.isascii():
        return lowered
    folded = unicodedata.normalize("NFKD", lowered)
    folded = _remove(folded, _MARKS_BMP, _MARKS_ASTRAL)
    for letter, latin in _HOMOGLYPHS:
        if letter in folded:
            folded = folded.replace(letter, latin)
    return folded


def words(text: str) -> list[str]:
    """The lowercased words of `text`."""
    lowered = text.lower()
    if lowered.isascii():
        return _ASCII_WORD.findall(lowered)
    return cast(list[str], _WORD.findall(lowered))


def count_distinct_words(text: str, enough: int) -> int:
    """Distinct words in `text`, counting no further than `enough`."""
    lowered = text.lower()
    seen: set[str] = set()
    for match in word_finder(lowered).finditer(lowered):
        seen.add(match.group())
        if len(seen) >= enough:
            break
    return len(seen)


def word_finder(lowered: str) -> re.Pattern[str] | regex.Pattern[str]:
    """The word pattern to use on already lowercased text."""
    return _ASCII_WORD if lowered.isascii() else _WORD


def answer_words(text: str) -> list[str]:
    """Words as `expected_answer` compares them: numbers like 443.21 or 1,204 stay whole."""
    lowered = text.lower()
    if not lowered.isascii():
        return cast(list[str], _ANSWER_WORD.findall(lowered))
    found: list[str] = []
    for run in _ASCII_JOINED_RUN.findall(lowered):
        if "." in run or "," in run:
            found.extend(_ASCII_ANSWER_WORD.findall(run))
        else:
            found.append(run)
    return found


def is_number(word: str) -> bool:
    """True for a number token such as `42`, `443.21` or `1,204`."""
    if word.isascii():
        return word[:1].isdigit() and _ASCII_NUMBER.fullmatch(word) is not None
    return _NUMBER.fullmatch(word) is not None


# "Not done", "Assumptions" or "Not done / assumptions" (joined by /, &, "and" or a comma)
# at the start of a line: plain, as a heading, as a list item, or bold; then a colon or
# the end of the line. "Assumptions about growth..." is a sentence, not a section.
# Where the spec's normalised text has one space, any run of horizontal whitespace
# matches (see the module docstring).
_H = HSPACE
_DISCLOSURE_HEADING = re.compile(
    rf"{_H}*(#{{1,6}})?{_H}*(?:[-*+]{_H}+|\d{{1,3}}[.)]{_H}+)?(?:\*\*|__)?{_H}*"
    rf"(?:not{_H}+done(?:{_H}*(?:/|&|and|,){_H}*assumptions)?|assumptions)"
    rf"{_H}*(?:\*\*|__)?{_H}*(?::|$)",
    re.IGNORECASE | re.MULTILINE,
)
_DISCLOSURE_WORDS = ("done", "assumptions")
_MARKDOWN_HEADING = re.compile(rf"{_H}*(#{{1,6}}){_H}+\S")
_PLAIN_LABEL_LEVEL = 6  # a label that is not a heading ends at any heading


def _line_start(text: str, position: int) -> int:
    return text.rfind("\n", 0, position) + 1


def _heading_lines(text: str) -> list[int]:
    """Starts of the lines that may hold a disclosure heading, in order."""
    lowered = text.lower()
    if len(lowered) != len(text):  # a few letters lowercase to two: index the slow way
        return sorted({_line_start(text, m.start()) for m in _DISCLOSURE_HEADING.finditer(text)})
    starts: set[int] = set()
    for word in _DISCLOSURE_WORDS:
        found = lowered.find(word)
        while found != -1:
            line = _line_start(text, found)
            starts.add(line)
            line_end = text.find("\n", found)
            if line_end == -1:
                break
            found = lowered.find(word, line_end)
    return sorted(starts)


def _section_end(text: str, after: int, level: int) -> int:
    """Start of the first Markdown heading of `level` or higher after `after`, or the end."""
    found = text.find("#", after)
    while found != -1:
        line = _line_start(text, found)
        if line > after and not text[line:found].strip(JS_WHITESPACE):
            heading = _MARKDOWN_HEADING.match(text, line)
            if heading is not None and len(heading.group(1)) <= level:
                return line
        line_end = text.find("\n", found)
        if line_end == -1:
            break
        found = text.find("#", line_end)
    return len(text)


def split_disclosure(text: str) -> tuple[str, bool]:
    """Remove "Not done / assumptions" sections from canonical text.

    A section runs from its heading to the next Markdown heading of the same or a higher
    level, or to the end. Returns the deliverable and whether a section was removed.
    """
    kept: list[str] = []
    position = 0
    for line in _heading_lines(text):
        if line < position:
            continue  # inside a section already removed
        heading = _DISCLOSURE_HEADING.match(text, line)
        if heading is None:
            continue
        level = len(heading.group(1)) if heading.group(1) else _PLAIN_LABEL_LEVEL
        end = _section_end(text, heading.end(), level)
        kept.append(text[position:line])
        position = end
        if end >= len(text):
            break
    if not kept:
        return text, False
    kept.append(text[position:])
    return "".join(kept), True
