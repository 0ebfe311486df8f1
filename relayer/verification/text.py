"""Text handling for the auto check: normalisation, words, folding, the disclosure section.

* :func:`canonical` is the spec's normalisation with line structure kept: NFKC, CR/CRLF
  to LF, curly apostrophes straight, invisible characters dropped (format characters
  such as zero-width spaces, soft hyphens, bidi marks and BOM, variation selectors, and
  control characters that are not whitespace), and each run of horizontal whitespace
  collapsed to one space. :func:`flatten` then collapses every whitespace run, newlines
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

# JavaScript's \s: what JSON/JS tooling on the other side of the API calls whitespace.
JS_WHITESPACE = (
    "\t\n\v\f\r \u00a0\u1680"
    + "".join(chr(c) for c in range(0x2000, 0x200B))
    + "\u2028\u2029\u202f\u205f\u3000\ufeff"
)
_HSPACE = re.escape(JS_WHITESPACE.replace("\n", ""))
_HSPACE_NOT_SPACE = re.escape(JS_WHITESPACE.replace("\n", "").replace(" ", ""))
# Only the runs that change: a space followed by more whitespace, or any other whitespace.
_HSPACE_RUN = re.compile(f" [{_HSPACE}]+|[{_HSPACE_NOT_SPACE}][{_HSPACE}]*")
_ASCII_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]")
_INVISIBLE = regex.compile(
    r"[\p{Cf}\uFE00-\uFE0F\U000E0100-\U000E01EF]|(?![" + re.escape(JS_WHITESPACE) + r"])\p{Cc}"
)
_APOSTROPHES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u02bc": "'"})

_ASCII_WORD = re.compile(r"[a-z0-9]+(?:['-][a-z0-9]+)*")
_WORD_SOURCE = (
    r"[\p{Script=Han}\p{Script=Hiragana}\p{Script=Katakana}]|[\p{L}\p{N}]+(?:['-][\p{L}\p{N}]+)*"
)
_WORD = regex.compile(_WORD_SOURCE)
_ASCII_ANSWER_WORD = re.compile(r"[0-9]+(?:[.,][0-9]+)+(?![a-z0-9])|[a-z0-9]+(?:['-][a-z0-9]+)*")
_ANSWER_WORD = regex.compile(r"\p{N}+(?:[.,]\p{N}+)+(?![\p{L}\p{N}])|" + _WORD_SOURCE)
_NUMBER = regex.compile(r"\p{N}+(?:[.,]\p{N}+)*")

_MARKS = regex.compile(r"\p{M}+")
# Cyrillic and Greek letters that render like Latin ones (lowercase: fold lowercases first).
_HOMOGLYPHS = str.maketrans(
    {
        "\u0430": "a", "\u0435": "e", "\u043e": "o", "\u0440": "p", "\u0441": "c",
        "\u0445": "x", "\u0443": "y", "\u0456": "i", "\u0455": "s", "\u0458": "j",
        "\u051b": "q", "\u051d": "w", "\u04bb": "h", "\u0501": "d", "\u0261": "g",
        "\u03b1": "a", "\u03bf": "o", "\u03b9": "i", "\u03bd": "v", "\u03c1": "p",
        "\u03b5": "e", "\u03ba": "k", "\u03c4": "t", "\u03c5": "u", "\u03c7": "x",
    }
)  # fmt: skip


def js_trim(text: str) -> str:
    """`String.prototype.trim`: strip JavaScript whitespace from both ends."""
    return text.strip(JS_WHITESPACE)


def canonical(text: str) -> str:
    """Normalised text with line structure kept (see the module docstring)."""
    ascii_only = text.isascii()
    if not ascii_only:
        text = unicodedata.normalize("NFKC", text)
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if ascii_only:
        text = _ASCII_CONTROL.sub("", text)
    else:
        text = _INVISIBLE.sub("", text.translate(_APOSTROPHES))
    return _HSPACE_RUN.sub(" ", text)


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
    stripped = cast(str, _MARKS.sub("", unicodedata.normalize("NFKD", lowered)))
    return stripped.translate(_HOMOGLYPHS)


def words(text: str) -> list[str]:
    """The lowercased words of `text`."""
    lowered = text.lower()
    if lowered.isascii():
        return _ASCII_WORD.findall(lowered)
    return cast(list[str], _WORD.findall(lowered))


def word_finder(lowered: str) -> re.Pattern[str] | regex.Pattern[str]:
    """The word pattern to use on already lowercased text."""
    return _ASCII_WORD if lowered.isascii() else _WORD


def answer_words(text: str) -> list[str]:
    """Words as `expected_answer` compares them: numbers like 443.21 or 1,204 stay whole."""
    lowered = text.lower()
    if lowered.isascii():
        return _ASCII_ANSWER_WORD.findall(lowered)
    return cast(list[str], _ANSWER_WORD.findall(lowered))


def is_number(word: str) -> bool:
    """True for a number token such as `42`, `443.21` or `1,204`."""
    return _NUMBER.fullmatch(word) is not None


# "Not done", "Assumptions" or "Not done / assumptions" (joined by /, &, "and" or a comma)
# at the start of a line: plain, as a heading, as a list item, or bold; then a colon or
# the end of the line. "Assumptions about growth..." is a sentence, not a section.
_DISCLOSURE_HEADING = re.compile(
    r"^ ?(#{1,6})? ?(?:[-*+] |\d{1,3}[.)] )?(?:\*\*|__)? ?"
    r"(?:not done(?: ?(?:/|&|and|,) ?assumptions)?|assumptions)"
    r" ?(?:\*\*|__)? ?(?::|$)",
    re.IGNORECASE | re.MULTILINE,
)
_MARKDOWN_HEADING = re.compile(r"^ ?(#{1,6}) \S", re.MULTILINE)
_PLAIN_LABEL_LEVEL = 6  # a label that is not a heading ends at any heading


def split_disclosure(text: str) -> tuple[str, bool]:
    """Remove "Not done / assumptions" sections from canonical text.

    A section runs from its heading to the next Markdown heading of the same or a higher
    level, or to the end. Returns the deliverable and whether a section was removed.
    """
    lowered = text.lower()
    if "not done" not in lowered and "assumptions" not in lowered:
        return text, False
    kept: list[str] = []
    position = 0
    search_from = 0
    while True:
        heading = _DISCLOSURE_HEADING.search(text, search_from)
        if heading is None:
            break
        level = len(heading.group(1)) if heading.group(1) else _PLAIN_LABEL_LEVEL
        end = len(text)
        for following in _MARKDOWN_HEADING.finditer(text, heading.end()):
            if len(following.group(1)) <= level:
                end = following.start()
                break
        kept.append(text[position : heading.start()])
        position = end
        if end >= len(text):
            break
        search_from = end
    if not kept:
        return text, False
    kept.append(text[position:])
    return "".join(kept), True
