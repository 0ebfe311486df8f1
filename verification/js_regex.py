"""`regex_pattern` with JavaScript semantics, refused when unsafe, bounded in time.

A pattern is parsed as JavaScript parses `new RegExp(source)` (no flags, non-Unicode
mode with the web-compatibility grammar of ECMAScript Annex B) and re-emitted for the
`regex` module, whose matcher takes a timeout that interrupts the match itself:

* case-sensitive; ``^``/``$`` anchor the whole text only (Python's ``$`` would also
  match before a trailing newline: it is emitted as ``\\Z``);
* ``.`` matches anything but ``\\n``, ``\\r``, U+2028 and U+2029;
* ``\\d``, ``\\w``, ``\\b`` are ASCII (``[0-9]``, ``[A-Za-z0-9_]``); ``\\s`` is
  JavaScript's whitespace set;
* a backreference to a group that has not matched (yet) matches the empty string;
* Annex B leniencies: ``{``/``}``/``]`` are literals when they are not quantifier or
  class syntax, an unknown escape is the character itself (``\\A`` is the letter "A",
  reported as a warning), ``\\8`` is "8", ``\\012`` is an octal escape.

What JavaScript refuses is refused here too (:class:`JsRegexSyntaxError`): an unmatched
parenthesis, a quantifier with nothing to repeat, ``{2,1}``, a reversed class range, a
quantified lookbehind, and every Python-only construct — ``(?i)``, ``(?P<n>…)``,
``(?>…)``, possessive ``a*+``, ``(?#…)``.

Refused as unsafe (:class:`JsRegexUnsafeError`), before anything runs:

* more than 200 characters;
* a nested quantifier: a group repeated more than once (``*``, ``+``, ``{n,}``, ``{n,m}``
  with m >= 2) containing a quantifier whose count varies (``*``, ``+``, ``?``,
  ``{n,m}``): ``(a+)+``, ``(a*)*``, ``(a?)+``, ``(a|a?)+``. Fixed counts do not nest
  ambiguously and are allowed: ``(\\d{3}-){2}``;
* a repeated group whose alternatives overlap where that is decidable: identical
  alternatives (``(a|a)+``) or two single-character alternatives sharing a character
  (``(\\d|\\w)+``, ``(.|\\s)*``); ``(.|\\n)*`` is fine;
* counted repeats whose expansion exceeds 20,000 positions (the matcher expands fixed
  counts when compiling).

A repeat that cannot fit in the 20,000 characters the check reads never matches and an
upper bound past them is no bound: both are rewritten so that huge counts cost nothing.
Other catastrophic patterns (``(a|aa)*b``, ``.*.*.*=``) are stopped by the 100 ms bound.

Not reproduced: JavaScript counts UTF-16 code units, this matcher code points (``.``
matches one emoji here, half of one there); captures inside a repeated group are not
reset at each iteration for backreferences.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from functools import lru_cache

import regex

MAX_PATTERN_CHARS = 200
INPUT_CAP = 20_000
TIMEOUT_SECONDS = 0.1
INLINE_SLICE_SECONDS = 0.005  # most patterns finish in microseconds: no thread for them
WORKER_CPU_FACTOR = 2  # the abandoned match stops after twice the bound in process CPU time
MAX_EXPANSION = 20_000
_INFINITE = math.inf
_MAX_CODE_POINT = 0x10FFFF

_JS_WHITESPACE_RANGES: tuple[tuple[int, int], ...] = (
    (0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
    (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF),
)  # fmt: skip
_DIGIT_RANGES: tuple[tuple[int, int], ...] = ((0x30, 0x39),)
_WORD_RANGES: tuple[tuple[int, int], ...] = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
_LINE_TERMINATOR_RANGES: tuple[tuple[int, int], ...] = (
    (0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029),
)  # fmt: skip
_CONTROL_ESCAPES = {"f": 0x0C, "n": 0x0A, "r": 0x0D, "t": 0x09, "v": 0x0B}
_HEX = "0123456789abcdefABCDEF"


class JsRegexError(ValueError):
    """A `regex_pattern` that cannot be applied."""


class JsRegexSyntaxError(JsRegexError):
    """JavaScript would not compile the pattern."""


class JsRegexUnsafeError(JsRegexError):
    """The pattern is refused before it runs: too long, nested quantifiers, too large."""


class JsRegexTimeout(Exception):
    """The match did not finish within its time bound."""


# ── character sets (for overlap analysis) ─────────────────────────────────────────

Ranges = tuple[tuple[int, int], ...]


def _normalise(ranges: list[tuple[int, int]]) -> Ranges:
    merged: list[tuple[int, int]] = []
    for low, high in sorted(ranges):
        if merged and low <= merged[-1][1] + 1:
            if high > merged[-1][1]:
                merged[-1] = (merged[-1][0], high)
        else:
            merged.append((low, high))
    return tuple(merged)


def _complement(ranges: Ranges) -> Ranges:
    result: list[tuple[int, int]] = []
    next_low = 0
    for low, high in ranges:
        if low > next_low:
            result.append((next_low, low - 1))
        next_low = high + 1
    if next_low <= _MAX_CODE_POINT:
        result.append((next_low, _MAX_CODE_POINT))
    return tuple(result)


def _intersects(left: Ranges, right: Ranges) -> bool:
    i = j = 0
    while i < len(left) and j < len(right):
        if left[i][1] < right[j][0]:
            i += 1
        elif right[j][1] < left[i][0]:
            j += 1
        else:
            return True
    return False


def _emit_char(code: int) -> str:
    char = chr(code)
    if char.isascii() and char.isalnum():
        return char
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _emit_ranges(ranges: Ranges) -> str:
    parts = []
    for low, high in ranges:
        if low == high:
            parts.append(_emit_char(low))
        else:
            parts.append(f"{_emit_char(low)}-{_emit_char(high)}")
    return "".join(parts)


def _emit_class(ranges: Ranges) -> str:
    if not ranges:
        return "(?!)"
    return f"[{_emit_ranges(ranges)}]"


# ── parse tree summary ───────────────────────────────────────────────────────────


@dataclass(slots=True)
class _Node:
    """What the emitter and the safety analysis need to know about a piece of pattern."""

    python: str
    min_width: int = 0
    size: int = 1
    variable: bool = False  # holds a quantifier whose count varies
    charset: Ranges | None = None  # a single-character atom: the characters it matches
    kind: str = "atom"  # atom | group | lookahead | lookbehind | assertion | backref | seq
    alternatives: tuple[_Node, ...] = ()  # for groups: the top-level alternatives
    single: bool = True  # emitted as one regex atom (no wrapping needed to quantify)


def _cap(width: float) -> int:
    return int(min(width, INPUT_CAP + 1))


@dataclass
class _Parser:
    source: str
    total_groups: int
    group_names: dict[str, int]
    has_named_groups: bool
    position: int = 0
    warnings: list[str] = field(default_factory=list)

    # -- helpers --

    def error(self, message: str) -> JsRegexSyntaxError:
        return JsRegexSyntaxError(f"{message} (at character {self.position + 1})")

    def peek(self, offset: int = 0) -> str:
        index = self.position + offset
        return self.source[index] if index < len(self.source) else ""

    def at_end(self) -> bool:
        return self.position >= len(self.source)

    def braced_quantifier(self, at: int) -> tuple[int, int, float] | None:
        """`{n}`, `{n,}` or `{n,m}` at `at`: (end index, min, max), else None."""
        source = self.source
        if at >= len(source) or source[at] != "{":
            return None
        index = at + 1
        start = index
        while index < len(source) and source[index].isdigit():
            index += 1
        if index == start:
            return None
        minimum = int(source[start:index])
        maximum: float = minimum
        if index < len(source) and source[index] == ",":
            index += 1
            start = index
            while index < len(source) and source[index].isdigit():
                index += 1
            maximum = int(source[start:index]) if index > start else _INFINITE
        if index >= len(source) or source[index] != "}":
            return None
        return index + 1, minimum, maximum

    # -- grammar --

    def parse(self) -> _Node:
        node = self.disjunction()
        if not self.at_end():
            raise self.error("Unmatched ')'")
        return node

    def disjunction(self) -> _Node:
        alternatives = [self.alternative()]
        while self.peek() == "|":
            self.position += 1
            alternatives.append(self.alternative())
        if len(alternatives) == 1:
            return alternatives[0]
        return _Node(
            python="|".join(alt.python for alt in alternatives),
            min_width=min(alt.min_width for alt in alternatives),
            size=sum(alt.size for alt in alternatives),
            variable=any(alt.variable for alt in alternatives),
            kind="seq",
            alternatives=tuple(alternatives),
            single=False,
        )

    def alternative(self) -> _Node:
        terms: list[_Node] = []
        while not self.at_end() and self.peek() not in "|)":
            terms.append(self.term())
        if len(terms) == 1:
            return terms[0]
        return _Node(
            python="".join(term.python for term in terms),
            min_width=_cap(sum(term.min_width for term in terms)),
            size=sum(term.size for term in terms),
            variable=any(term.variable for term in terms),
            kind="seq",
            single=False,
        )

    def term(self) -> _Node:
        char = self.peek()
        if char == "^":
            self.position += 1
            return self.no_quantifier(_Node(python=r"\A", kind="assertion"))
        if char == "$":
            self.position += 1
            return self.no_quantifier(_Node(python=r"\Z", kind="assertion"))
        if char == "\\" and self.peek(1) in ("b", "B"):
            assertion = _Node(python="\\" + self.peek(1), kind="assertion")
            self.position += 2
            return self.no_quantifier(assertion)
        if char in "*+?":
            raise self.error("Nothing to repeat")
        if char == "{" and self.braced_quantifier(self.position) is not None:
            raise self.error("Nothing to repeat")
        if char == "(":
            atom = self.group()
        elif char == "[":
            atom = self.character_class()
        elif char == ".":
            self.position += 1
            ranges = _complement(_LINE_TERMINATOR_RANGES)
            atom = _Node(python=_emit_class(ranges), min_width=1, charset=ranges)
        elif char == "\\":
            atom = self.atom_escape()
        else:
            self.position += 1
            atom = _literal(ord(char))
        if atom.kind == "lookbehind":
            return self.no_quantifier(atom)
        return self.quantified(atom)

    def no_quantifier(self, node: _Node) -> _Node:
        if self.peek() in ("*", "+", "?") or self.braced_quantifier(self.position) is not None:
            raise self.error("Nothing to repeat")
        return node

    def quantified(self, atom: _Node) -> _Node:
        char = self.peek()
        minimum: int
        maximum: float
        if char == "*":
            minimum, maximum, end = 0, _INFINITE, self.position + 1
        elif char == "+":
            minimum, maximum, end = 1, _INFINITE, self.position + 1
        elif char == "?":
            minimum, maximum, end = 0, 1, self.position + 1
        else:
            braced = self.braced_quantifier(self.position)
            if braced is None:
                return atom
            end, minimum, maximum = braced
            if maximum < minimum:
                raise self.error("numbers out of order in {} quantifier")
        self.position = end
        lazy = ""
        if self.peek() == "?":
            lazy = "?"
            self.position += 1
        return self.repeat(atom, minimum, maximum, lazy)

    def repeat(self, atom: _Node, minimum: int, maximum: float, lazy: str) -> _Node:
        if maximum >= 2:
            self.check_nesting(atom)
        body = atom.python if atom.single else f"(?:{atom.python})"
        if atom.kind == "lookahead":
            body = f"(?:{atom.python})"
        if atom.min_width >= 1:
            if minimum * atom.min_width > INPUT_CAP:
                # Needs more characters than the check reads: never matches.
                return _Node(python=f"(?!){body}", min_width=INPUT_CAP + 1, size=atom.size,
                             variable=atom.variable, kind="seq", single=False)  # fmt: skip
            if maximum > INPUT_CAP:
                maximum = _INFINITE
        if maximum == _INFINITE:
            quantifier = {0: "*", 1: "+"}.get(minimum, f"{{{minimum},}}")
        elif minimum == maximum:
            quantifier = f"{{{minimum}}}"
        elif minimum == 0 and maximum == 1:
            quantifier = "?"
        else:
            quantifier = f"{{{minimum},{int(maximum)}}}"
        copies = max(minimum, 1) + (0 if maximum == minimum else 1)
        return _Node(
            python=body + quantifier + lazy,
            min_width=_cap(atom.min_width * minimum),
            size=atom.size * copies,
            variable=atom.variable or maximum != minimum,
            kind="seq",
            single=False,
        )

    def check_nesting(self, atom: _Node) -> None:
        if atom.kind not in ("group", "lookahead"):
            return
        if atom.variable:
            raise JsRegexUnsafeError("nested quantifier: a repeated group contains a quantifier")
        alternatives = _flat_alternatives(atom)
        seen: set[str] = set()
        sets: list[Ranges] = []
        for alternative in alternatives:
            if alternative.python in seen:
                raise JsRegexUnsafeError("a repeated group has identical alternatives")
            seen.add(alternative.python)
            if alternative.charset is not None:
                if any(_intersects(alternative.charset, other) for other in sets):
                    raise JsRegexUnsafeError(
                        "a repeated group has alternatives that match the same character"
                    )
                sets.append(alternative.charset)

    def group(self) -> _Node:
        self.position += 1  # "("
        kind, prefix = "group", "("  # named groups become plain (numbered) groups
        if self.peek() == "?":
            marker = self.peek(1)
            if marker == ":":
                prefix = "(?:"
                self.position += 2
            elif marker in ("=", "!"):
                kind, prefix = "lookahead", f"(?{marker}"
                self.position += 2
            elif marker == "<" and self.peek(2) in ("=", "!"):
                kind, prefix = "lookbehind", f"(?<{self.peek(2)}"
                self.position += 3
            elif marker == "<":
                end = self.source.find(">", self.position)
                if end == -1:
                    raise self.error("Invalid capture group name")
                self.position = end + 1
            else:
                raise self.error("Invalid group")
        inner = self.disjunction()
        if self.peek() != ")":
            raise self.error("Unterminated group")
        self.position += 1
        alternatives = inner.alternatives if inner.alternatives else (inner,)
        return _Node(
            python=f"{prefix}{inner.python})",
            min_width=0 if kind in ("lookahead", "lookbehind") else inner.min_width,
            size=inner.size + 1,
            variable=inner.variable,
            kind=kind,
            alternatives=alternatives,
        )

    def escape_start(self) -> tuple[str, Ranges | None]:
        """Step over a `\\`: the escaped character, and its class when it names one (then consumed too)."""
        self.position += 1
        if self.at_end():
            raise self.error("\\ at end of pattern")
        char = self.peek()
        sets = _class_escape(char)
        if sets is not None:
            self.position += 1
        return char, sets

    def atom_escape(self) -> _Node:
        char, sets = self.escape_start()
        if sets is not None:
            return _Node(python=_emit_class(sets), min_width=1, charset=sets)
        if char in "123456789":
            start = self.position
            while self.peek().isdigit():
                self.position += 1
            number = int(self.source[start : self.position])
            if number <= self.total_groups:
                return _Node(python=f"(?({number})\\{number})", kind="backref", single=False)
            self.position = start
            return _literal(self.legacy_escape())
        if char == "k" and self.has_named_groups:
            if self.peek(1) != "<":
                raise self.error("Invalid named reference")
            end = self.source.find(">", self.position)
            name = self.source[self.position + 2 : end] if end != -1 else ""
            if name not in self.group_names:
                raise self.error("Invalid named capture referenced")
            self.position = end + 1
            number = self.group_names[name]
            return _Node(python=f"(?({number})\\{number})", kind="backref", single=False)
        if char == "c" and not ("a" <= self.peek(1).lower() <= "z" and self.peek(1).isascii()):
            # "\c" without a control letter is a literal backslash; "c" follows as itself.
            return _literal(ord("\\"))
        return _literal(self.character_escape())

    def character_escape(self) -> int:
        """An escape that stands for one character; the position is just after the "\\"."""
        char = self.peek()
        if char in _CONTROL_ESCAPES:
            self.position += 1
            return _CONTROL_ESCAPES[char]
        if char == "c":
            letter = self.peek(1)
            self.position += 2
            return ord(letter) % 32
        if char == "0" and not self.peek(1).isdigit():
            self.position += 1
            return 0
        if char.isdigit():
            return self.legacy_escape()
        if char == "x" and _is_hex(self.peek(1)) and _is_hex(self.peek(2)):
            value = int(self.source[self.position + 1 : self.position + 3], 16)
            self.position += 3
            return value
        if char == "u" and all(_is_hex(self.peek(i)) for i in range(1, 5)):
            value = int(self.source[self.position + 1 : self.position + 5], 16)
            self.position += 5
            if 0xD800 <= value <= 0xDBFF and self.source.startswith("\\u", self.position):
                low_hex = self.source[self.position + 2 : self.position + 6]
                if len(low_hex) == 4 and all(_is_hex(c) for c in low_hex):
                    low = int(low_hex, 16)
                    if 0xDC00 <= low <= 0xDFFF:
                        # A surrogate pair is one character in the text this reads.
                        self.position += 6
                        return 0x10000 + ((value - 0xD800) << 10) + (low - 0xDC00)
            return value
        if char == "k" and self.has_named_groups:
            raise self.error("Invalid escape")
        # Identity escape: the character itself.
        self.position += 1
        if char.isascii() and char.isalpha() and char not in "xu":
            self.warnings.append(
                f"\\{char} is read by JavaScript as the letter {char!r}, not as an escape"
            )
        return ord(char)

    def legacy_escape(self) -> int:
        """Annex B: `\\8`/`\\9` are the digits themselves, else up to three octal digits."""
        first = self.peek()
        if first in "89":
            self.position += 1
            return ord(first)
        digits = first
        self.position += 1
        limit = 3 if first in "0123" else 2
        while len(digits) < limit and self.peek() and self.peek() in "01234567":
            digits += self.peek()
            self.position += 1
        return int(digits, 8)

    def character_class(self) -> _Node:
        self.position += 1  # "["
        negated = self.peek() == "^"
        if negated:
            self.position += 1
        ranges: list[tuple[int, int]] = []
        while True:
            if self.at_end():
                raise self.error("Unterminated character class")
            if self.peek() == "]":
                self.position += 1
                break
            left = self.class_atom()
            if self.peek() == "-" and self.peek(1) not in ("]", ""):
                self.position += 1
                right = self.class_atom()
                if isinstance(left, int) and isinstance(right, int):
                    if left > right:
                        raise self.error("Range out of order in character class")
                    ranges.append((left, right))
                    continue
                # Annex B: a class escape at either end makes the "-" a literal.
                ranges.append((ord("-"), ord("-")))
                ranges.extend(_as_ranges(left))
                ranges.extend(_as_ranges(right))
                continue
            ranges.extend(_as_ranges(left))
        matched = _normalise(ranges)
        if negated:
            matched = _complement(matched)
        return _Node(
            python=_emit_class(matched), min_width=1, charset=matched, single=bool(matched)
        )

    def class_atom(self) -> int | Ranges:
        char = self.peek()
        if char != "\\":
            self.position += 1
            return ord(char)
        char, sets = self.escape_start()
        if sets is not None:
            return sets
        if char == "b":
            self.position += 1
            return 0x08
        if char == "-":
            self.position += 1
            return ord("-")
        if char == "c":
            letter = self.peek(1)
            if letter and letter.isascii() and (letter.isalnum() or letter == "_"):
                self.position += 2
                return ord(letter) % 32
            return ord("\\")  # the "c" is read next, as itself
        if char.isdigit():
            if char == "0" and not self.peek(1).isdigit():
                self.position += 1
                return 0
            return self.legacy_escape()
        return self.character_escape()


def _is_hex(char: str) -> bool:
    return char != "" and char in _HEX


def _literal(code: int) -> _Node:
    return _Node(python=_emit_char(code), min_width=1, charset=((code, code),))


def _as_ranges(atom: int | Ranges) -> Ranges:
    return ((atom, atom),) if isinstance(atom, int) else atom


def _class_escape(char: str) -> Ranges | None:
    if char == "d":
        return _DIGIT_RANGES
    if char == "D":
        return _complement(_DIGIT_RANGES)
    if char == "w":
        return _WORD_RANGES
    if char == "W":
        return _complement(_WORD_RANGES)
    if char == "s":
        return _JS_WHITESPACE_RANGES
    if char == "S":
        return _complement(_JS_WHITESPACE_RANGES)
    return None


def _flat_alternatives(group: _Node) -> tuple[_Node, ...]:
    """A group's alternatives, looking through alternatives that are plain groups."""
    flat: list[_Node] = []
    for alternative in group.alternatives:
        if alternative.kind == "group" and alternative is not group:
            flat.extend(_flat_alternatives(alternative))
        else:
            flat.append(alternative)
    return tuple(flat)


def _prescan(source: str) -> tuple[int, dict[str, int], bool]:
    """Capture groups in the whole pattern (backreferences may point forward) and names."""
    count = 0
    names: dict[str, int] = {}
    named = False
    index = 0
    in_class = False
    while index < len(source):
        char = source[index]
        if char == "\\":
            index += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        elif char == "(":
            if not source.startswith("?", index + 1):
                count += 1
            elif source.startswith("?<", index + 1) and source[index + 3 : index + 4] not in "=!":
                count += 1
                named = True
                end = source.find(">", index + 3)
                name = source[index + 3 : end] if end != -1 else ""
                if not _valid_group_name(name):
                    raise JsRegexSyntaxError(f"Invalid capture group name {name!r}")
                if name in names:
                    raise JsRegexSyntaxError(f"Duplicate capture group name {name!r}")
                names[name] = count
        index += 1
    return count, names, named


def _valid_group_name(name: str) -> bool:
    if not name:
        return False
    return (name[0] == "$" or name[0] == "_" or name[0].isidentifier()) and all(
        c == "$" or ("a" + c).isidentifier() for c in name[1:]
    )


@dataclass(frozen=True)
class JsRegex:
    """A compiled `regex_pattern`."""

    source: str
    python_source: str
    warnings: tuple[str, ...]
    _compiled: regex.Pattern[str]

    def test(self, text: str, timeout: float = TIMEOUT_SECONDS) -> bool:
        """`RegExp.prototype.test` on the first 20,000 characters, bounded in time.

        Raises :class:`JsRegexTimeout` when no result is known within `timeout` seconds
        of wall-clock time. The matcher's own timeout counts the process's CPU time, so
        on a busy machine it alone could keep the caller waiting well past the bound. A
        match that is not over after a short inline slice therefore runs again on a
        worker thread (with the GIL released) while the caller waits on the wall clock.
        The worker's CPU timeout stops the abandoned work; it is twice the bound because
        other threads' CPU time counts too, and must not end the match before the
        caller's deadline.
        """
        subject = text[:INPUT_CAP]
        started = time.monotonic()
        try:
            return (
                self._compiled.search(subject, timeout=min(INLINE_SLICE_SECONDS, timeout))
                is not None
            )
        except TimeoutError:
            pass
        remaining = timeout - (time.monotonic() - started)
        outcome: list[bool] = []
        finished = threading.Event()

        def run() -> None:
            try:
                found = self._compiled.search(
                    subject, timeout=timeout * WORKER_CPU_FACTOR, concurrent=True
                )
                outcome.append(found is not None)
            except TimeoutError:
                pass
            finally:
                finished.set()

        if remaining > 0:
            threading.Thread(target=run, name="regex-pattern", daemon=True).start()
            finished.wait(remaining)
        if not outcome:
            raise JsRegexTimeout(f"no result within {timeout * 1000:.0f} ms")
        return outcome[0]


@lru_cache(maxsize=1024)
def compile_js_regex(source: str) -> JsRegex:
    """Compile a JavaScript pattern, or raise :class:`JsRegexSyntaxError` /
    :class:`JsRegexUnsafeError` (a pattern over 200 characters is refused unread)."""
    if len(source) > MAX_PATTERN_CHARS:
        raise JsRegexUnsafeError(f"longer than {MAX_PATTERN_CHARS} characters")
    total_groups, names, has_named = _prescan(source)
    parser = _Parser(source, total_groups, names, has_named)
    tree = parser.parse()
    if tree.size > MAX_EXPANSION:
        raise JsRegexUnsafeError(f"counted repeats expand to more than {MAX_EXPANSION} positions")
    try:
        compiled = regex.compile(tree.python, flags=regex.VERSION1 | regex.ASCII)
    except (regex.error, OverflowError, MemoryError, RecursionError) as exc:
        raise JsRegexSyntaxError(f"cannot be compiled: {exc}") from exc
    return JsRegex(source, tree.python, tuple(parser.warnings), compiled)
