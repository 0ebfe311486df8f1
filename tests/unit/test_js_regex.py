"""`regex_pattern` with JavaScript semantics: matching, refusals, and the ReDoS suite."""

from __future__ import annotations

import threading
import time

import pytest

from verification.auto_check import (
    REASON_REGEX_TIMEOUT,
    REASON_REGEX_UNSAFE,
    auto_check,
)
from verification.js_regex import (
    INPUT_CAP,
    JsRegexSyntaxError,
    JsRegexTimeout,
    JsRegexUnsafeError,
    compile_js_regex,
)

# ── JavaScript semantics ──────────────────────────────────────────────────────

SEMANTICS = [
    # ^ and $ anchor the whole text; $ does not match before a trailing newline.
    (r"^\d{3}-\d{4}$", "555-1234", True),
    (r"^\d{3}-\d{4}$", "555-1234\n", False),
    (r"^b", "a\nb", False),
    (r"abc$", "xabc", True),
    # Case-sensitive, no flags.
    (r"Paris", "paris", False),
    # . excludes \n, \r, U+2028 and U+2029.
    (r"^a.c$", "abc", True),
    (r"^a.c$", "a\nc", False),
    (r"^a.c$", "a\rc", False),
    (r"^a.c$", "a\u2028c", False),
    (r"(.|\n)+", "a\nb", True),
    # \d, \w, \b are ASCII; \s is JavaScript's whitespace set.
    (r"\d", "٣", False),
    (r"\w", "é", False),
    (r"\bfoo\b", "éfooé", True),
    (r"\s", "\u00a0", True),
    (r"\s", "\ufeff", True),
    (r"\s", "\x1c", False),
    (r"[^\D]", "5", True),
    (r"[^\D]", "x", False),
    (r"[\S\s]", "q", True),
    # Backreferences: an unset group matches the empty string.
    (r"(a)?\1b", "b", True),
    (r"\1(a)", "a", True),
    (r"(?<year>\d{4})-\k<year>", "2020-2020", True),
    (r"(?<year>\d{4})-\k<year>", "2020-2021", False),
    # Lookarounds, including variable-length lookbehind.
    (r"(?<=\$)\d+", "cost $42", True),
    (r"(?<=\$|USD )\d+", "USD 42", True),
    (r"(?=a)*b", "b", True),
    # Annex B leniencies.
    (r"a{,5}", "a{,5}", True),
    (r"x}", "x}", True),
    (r"]", "]", True),
    (r"\p{L}", "p{L}", True),
    (r"\A", "A", True),
    (r"\u{41}", "u" * 41, True),
    (r"\8", "8", True),
    (r"\012", "\n", True),
    (r"\cJ", "\n", True),
    (r"\c1", "\\c1", True),
    (r"[\d-z]", "-", True),
    (r"[\b]", "\b", True),
    (r"[^]", "x", True),
    (r"[]", "x", False),
    (r"\uD83D\uDE00", "😀", True),
    # Counted repeats.
    (r"(\d{3}-){2}\d", "123-456-7", True),
    (r"x{100000}", "x" * 10, False),
    (r"(?:ab){0,99999}c", "ababc", True),
]


@pytest.mark.parametrize(("pattern", "subject", "expected"), SEMANTICS)
def test_javascript_semantics(pattern: str, subject: str, expected: bool) -> None:
    assert compile_js_regex(pattern).test(subject) is expected


def test_only_the_first_20000_characters_are_tested() -> None:
    regex = compile_js_regex("needle")
    assert not regex.test("x" * INPUT_CAP + "needle")
    assert regex.test("x" * (INPUT_CAP - 6) + "needle")
    assert compile_js_regex("x$").test("x" * INPUT_CAP + "y")


@pytest.mark.parametrize(
    "pattern",
    [
        "(unclosed",
        "closed)",
        "*a",
        "a**",
        "a{2}{3}",
        "{2}",
        "a{2,1}",
        "[z-a]",
        "[a",
        "\\",
        "(?<=a)+",
        "^*",
        r"\b+",
        # Python-only constructs JavaScript refuses:
        "(?i)abc",
        "(?P<name>a)",
        "(?>a)",
        "a*+",
        "(?#comment)",
        r"\k<x>(?<y>a)",
        "(?<a>x)(?<a>y)",
        "(?<1a>x)",
    ],
)
def test_patterns_javascript_does_not_compile(pattern: str) -> None:
    with pytest.raises(JsRegexSyntaxError):
        compile_js_regex(pattern)


@pytest.mark.parametrize(
    "pattern",
    [
        "(a+)+",
        "(a*)*",
        "(a?)+",
        "(a|a?)+",
        "^(a|a?)+$",
        r"^(\w+\s?)*$",
        "((a+))+",
        "(?:x*y*){2,}",
        "(a|a)+",
        "((a|a))*",
        r"(\d|\w)+",
        r"(.|\s)*",
        "(a|[ab])*",
        "(?=a+)+",
        "a" * 201,
        "(?:(?=a)){100000}",
    ],
)
def test_unsafe_patterns_are_refused_before_running(pattern: str) -> None:
    with pytest.raises(JsRegexUnsafeError):
        compile_js_regex(pattern)


@pytest.mark.parametrize(
    "pattern", [r"(\d{3}-){2}", "(a+)?", "(a+){1}", r"(.|\n)*", "(ab|cd)+", r"(\w|-)+", "a" * 200]
)
def test_safe_patterns_are_accepted(pattern: str) -> None:
    compile_js_regex(pattern)


def test_identity_escapes_of_letters_are_reported() -> None:
    assert compile_js_regex(r"\Afoo\Z").warnings == (
        "\\A is read by JavaScript as the letter 'A', not as an escape",
        "\\Z is read by JavaScript as the letter 'Z', not as an escape",
    )
    assert compile_js_regex(r"\d+\.\d\n").warnings == ()


def test_huge_counts_are_capped_not_expanded() -> None:
    """Counts beyond the input cap compile to a bounded quantifier, never to an expansion."""
    huge = compile_js_regex("a{4294967295}")
    nested = compile_js_regex("(?:a{1000}){1000}")
    open_ended = compile_js_regex("a{0,4294967295}b")
    for compiled in (huge, nested, open_ended):
        assert len(compiled.python_source) < 100, compiled.python_source
        assert "4294967295" not in compiled.python_source
    assert not huge.test("a" * 30_000)  # more than the 20,000 characters ever read
    assert open_ended.test("aaab")


# ── ReDoS suite ───────────────────────────────────────────────────────────────
# Patterns that pass the nested-quantifier check yet backtrack catastrophically (or
# polynomially) on the inputs beside them. What bounds them is the matcher's timeout,
# not luck: every check ends with an answer or with the timeout reason, and the guard
# demonstrably fires when it is given less time than the match needs. (How fast a check
# is belongs to bench/bench_autocheck.py, never to a test: CI machines are loaded.)

SLIPPING_PAST = [
    (r"(a|aa)*$", "a" * 60 + "!"),
    (r"^(a|aa)+$", "a" * 60 + "!"),
    (r"(a|aa)*b", "a" * INPUT_CAP),
    (r"^(a|ab|b)*$", "ab" * 40 + "!"),
    (r"^(ab|a|b)+x$", "ab" * 40),
    (r"^(\d|\d\d)+$", "1" * INPUT_CAP + "x"),
    (r"^([a-z]|[a-z][a-z])+$", "a" * 60 + "1"),
    (r"^(?:a|a{2})+$", "a" * 60 + "b"),
    (r"^(?:[ab]|ab)+$", "ab" * 40 + "c"),
    (r"^(\w|\w\w)+!$", "a" * 60 + "?"),
    (r"^(.*)\1$", "ab" * (INPUT_CAP // 2)),
    (r"(.*)(.*)\2\1$", "ab" * (INPUT_CAP // 2)),
    (r"^(.*)\1\1$", "a" * (INPUT_CAP - 1) + "b"),
    (r".*.*.*.*.*=", "x" * INPUT_CAP),
    (r"^.*.*.*.*.*=$", "x" * INPUT_CAP),
    (r"\d+\d+\d+\d+x", "1" * INPUT_CAP),
    (r"^\d*\d*\d*\d*\d*$", "1" * INPUT_CAP + "a"),
    (r"[\s\S]*[\s\S]*[\s\S]*z", "y" * INPUT_CAP),
    (r"(?=(a+))a*b\1", "a" * INPUT_CAP),
    (r"^(?:x|xx|xxx)+$", "x" * 60 + "y"),
]

REFUSED_STATICALLY = [
    (r"^(a+)+$", "a" * 60 + "!"),
    (r"(x+x+)+y", "x" * 60),
    (r"^(\w+\s?)*$", "a" * 60 + "!"),
    (r"^(a|a?)+$", "a" * 60 + "!"),
    (r"^(([a-z])+.)+[A-Z]([a-z])+$", "a" * 60),
    (r"(a|a)*b", "a" * 60),
    (r"^(\d+)*$", "1" * 60 + "x"),
]


def _check(pattern: str, subject: str) -> tuple[str, ...]:
    return auto_check({"output": subject}, {"regex_pattern": pattern}).reasons


@pytest.mark.parametrize(("pattern", "subject"), SLIPPING_PAST)
def test_redos_patterns_past_the_static_check_are_bounded(pattern: str, subject: str) -> None:
    compile_js_regex(pattern)  # not refused statically: the time bound is what stops it
    assert _check(pattern, subject)[0] in (
        REASON_REGEX_TIMEOUT,
        "regex_pattern: 0%",
        "All verification criteria met",
    )


# The cases of SLIPPING_PAST whose backtracking is exponential in the subject: no machine
# finishes them (2^60 paths and more), so the guard is the only way they end. The others are
# polynomial, or the matcher rejects them at once because a required literal is absent (a
# few microseconds): for those, whether a 1 µs budget runs out first is a race, so they are
# held to the weaker promise below (never a wrong answer), not to "the guard fired".
EXPONENTIAL = [
    (pattern, subject)
    for pattern, subject in SLIPPING_PAST
    if pattern
    in {
        r"(a|aa)*$",
        r"^(a|aa)+$",
        r"^(a|ab|b)*$",
        r"^([a-z]|[a-z][a-z])+$",
        r"^(?:a|a{2})+$",
        r"^(?:[ab]|ab)+$",
        r"^(?:x|xx|xxx)+$",
    }
]


@pytest.mark.parametrize(("pattern", "subject"), EXPONENTIAL)
def test_the_guard_stops_redos_patterns_given_too_little_time(pattern: str, subject: str) -> None:
    """With a budget far below what the backtracking needs, the guard answers "timeout"."""
    regex = compile_js_regex(pattern)
    with pytest.raises(JsRegexTimeout, match="no result within 0 ms"):
        regex.test(subject, timeout=0.000_001)


def test_exponential_cases_are_the_ones_named() -> None:
    assert len(EXPONENTIAL) == 7


@pytest.mark.parametrize(("pattern", "subject"), SLIPPING_PAST)
def test_a_guard_with_little_time_never_answers_wrongly(pattern: str, subject: str) -> None:
    """Given 1 µs, every check ends with the timeout or with the answer the matcher gives
    when left to finish (asked only when the short check answered, so it is quick)."""
    regex = compile_js_regex(pattern)
    text = subject * 4
    try:
        answer = regex.test(text, timeout=0.000_001)
    except JsRegexTimeout:
        return
    expected = regex._compiled.search(text[:INPUT_CAP], timeout=600)
    assert answer is (expected is not None)


@pytest.mark.parametrize(("pattern", "subject"), REFUSED_STATICALLY)
def test_redos_patterns_with_nested_quantifiers_never_run(pattern: str, subject: str) -> None:
    with pytest.raises(JsRegexUnsafeError):
        compile_js_regex(pattern)
    assert _check(pattern, subject) == (REASON_REGEX_UNSAFE,)


def test_exponential_pattern_times_out_rather_than_answering() -> None:
    assert _check(r"^(a|aa)+$", "a" * 80 + "!") == (REASON_REGEX_TIMEOUT,)


def test_timeout_raises_and_abandoned_work_stops() -> None:
    regex = compile_js_regex(r"^(a|aa)+$")
    with pytest.raises(JsRegexTimeout):
        regex.test("a" * 80 + "!")
    # The worker's own CPU-time bound ends the abandoned match; on a loaded machine that
    # CPU time takes longer to accrue, so the wait is generous (it is not a speed claim).
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        if not any(t.name == "regex-pattern" for t in threading.enumerate()):
            break
        time.sleep(0.02)
    assert not any(t.name == "regex-pattern" for t in threading.enumerate())


def test_fast_patterns_do_not_start_a_thread() -> None:
    before = threading.active_count()
    assert compile_js_regex(r"\d+").test("order 42")
    assert threading.active_count() == before
