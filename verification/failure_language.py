"""Failure language: refusals and neutral failure wording in a deliverable.

Two kinds of phrase are looked for, on folded text (see :func:`text.fold`):

* **Refusals**, the agent speaking about itself or the task: "I was unable to…",
  "I cannot complete…", "As an AI…", "I don't have access…", "Sorry, but I can't…",
  "unable to complete the task", "outside my control".
* **Neutral wording**, with no speaker: "users were unable to connect", "service
  unavailable", "experiencing technical difficulties", "status: failed", "task
  incomplete". An incident report is made of these.

A phrase marks its *sentence*: back to the previous ". ", "! " or "? " and on to the next
".", "!" or "?", at most 160 characters either way (so an unpunctuated list cannot turn
the whole text into one sentence). The hard gate then weighs the words outside every
marked sentence against the rest:

* a refusal fails the result unless there are at least 40 words outside every failure
  sentence **and** the refusal sentences hold no more than half of all words;
* neutral wording alone fails only with fewer than 15 words outside those sentences
  **and** fewer than 25 distinct words in all.

Only the first and last 64,000 characters of the deliverable are read. Every pattern
is linear: gaps are bounded and stay inside one sentence, and each pattern resumes
after the sentence it has just marked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from verification.text import fold, word_finder

SCAN_WINDOW = 64_000
SENTENCE_RADIUS = 160
MIN_WORDS_BESIDE_REFUSAL = 40
MAX_REFUSAL_SHARE = 0.5
MIN_WORDS_BESIDE_NEUTRAL = 15
MIN_DISTINCT_WORDS_NEUTRAL = 25
ERROR_MARKER_WINDOW = 200

_GAP = r"[^.!?]{0,80}?"  # a bounded gap that stays inside one sentence
# Every "cannot", "can't", "couldn't", "won't", "will not"... holds "not" or "n't".
_CANT = ("not", "n't")
_TASK_VERBS = (
    "complete|finish|fulfil|fulfill|deliver|help|assist|do|provide|perform|comply|proceed"
    "|continue|access|browse|generate|produce|accomplish"
)

# (substrings one of which must be present, pattern). The substrings let a clean text
# skip the regex work entirely.
_Family = tuple[tuple[str, ...], re.Pattern[str]]
_LEADING_BOUNDARY = "\\b"


def _family(triggers: tuple[str, ...], source: str) -> _Family:
    # ASCII: \w and \b with JavaScript's meaning; folded text is mostly ASCII anyway.
    # A leading \b is checked after the match instead (see _at_word_start): without it
    # the pattern starts with a literal, and the matcher can skip ahead to it.
    if not source.startswith(_LEADING_BOUNDARY):
        raise ValueError("failure patterns start at a word boundary")
    return triggers, re.compile(source[len(_LEADING_BOUNDARY) :], re.ASCII)


def _at_word_start(text: str, position: int) -> bool:
    if position == 0:
        return True
    before = text[position - 1]
    return not (before.isascii() and (before.isalnum() or before == "_"))


_APOLOGY = (
    rf"\b{{lead}}\b{_GAP}"
    r"(?:\bunable\b|\bcannot\b|\bcan't\b|\bcan not\b|\bcouldn't\b|\bcould not\b"
    r"|n't able\b|\bnot able\b|\bnot possible\b)"
)
_TASK_UNDONE = (
    r"\b{lead} (?:complete|finish|fulfil|fulfill|deliver|do|perform)"
    r" (?:the|this|your|that) (?:task|request|job|assignment|work)\b"
)
_NOT_DELIVERED = r"\b{lead} (?:complete|fulfil|fulfill|deliver)\b"


def _by_lead(
    leads: tuple[str, ...], template: str, trigger: str | None = None
) -> tuple[_Family, ...]:
    """One family per leading phrase of an alternation: each pattern then starts with a
    literal the matcher can skip to, where `(?:a|b|c)…` is tried at every position."""
    return tuple(
        _family((trigger or lead,), template.replace("{lead}", re.escape(lead))) for lead in leads
    )


REFUSAL_FAMILIES: tuple[_Family, ...] = (
    _family(
        ("able to",),
        r"\bi(?:'m| am| was| have been|'ve been)? (?:\w+ )?(?:unable|not able) to\b",
    ),
    _family(
        ("able to",),
        r"\bi (?:wasn't|was not|am not|'m not|won't be|will not be|haven't been|have not been)"
        r" able to\b",
    ),
    _family(
        _CANT,
        r"\bi (?:cannot|can't|can not|couldn't|could not|won't|will not) (?:\w+ )?"
        rf"(?:{_TASK_VERBS})\b",
    ),
    _family(("as an ai",), r"\bas an ai\b"),
    _family(
        ("t have",),
        r"\bi (?:do not|don't|did not|didn't) have (?:the )?"
        r"(?:access|ability|tools?|capabilit(?:y|ies)|means|permissions?)\b",
    ),
    *_by_lead(("apologise", "apologize", "apologies"), _APOLOGY, trigger="apologi"),
    *_by_lead(
        ("sorry", "regret", "unfortunately"),
        _APOLOGY,
    ),
    *_by_lead(("unable to", "not able to"), _TASK_UNDONE, trigger="able to"),
    *_by_lead(("failed to",), _TASK_UNDONE, trigger="failed"),
    *_by_lead(("impossible to",), _TASK_UNDONE),
    _family(_CANT, r"\bcan(?:'t|not| not) (?:help|assist) (?:you )?with\b"),
    *_by_lead(
        ("outside", "beyond", "not within", "not in", "not"),
        r"\b{lead} my control\b",
        trigger="my control",
    ),
)

NEUTRAL_FAMILIES: tuple[_Family, ...] = (
    *_by_lead(("unable to",), _NOT_DELIVERED, trigger="able to"),
    *_by_lead(("could not", "couldn't"), _NOT_DELIVERED, trigger="could"),
    *_by_lead(("failed to",), _NOT_DELIVERED, trigger="failed"),
    *_by_lead(("was", "were"), r"\b{lead} (?:unable|not able) to\b", trigger="able to"),
    _family(
        ("service",),
        r"\bservice (?:is |was |appears to be |seems to be )?(?:currently |temporarily )?"
        r"(?:unavailable|down)\b",
    ),
    _family(("technical difficulties",), r"\bexperiencing technical difficulties\b"),
    _family(("incomplete",), rf"\bincomplete\b{_GAP}\btask\b"),
    *_by_lead(("task", "status"), rf"\b{{lead}}\b{_GAP}\bincomplete\b", trigger="incomplete"),
    _family(("failed",), rf"\bstatus\b{_GAP}\bfailed\b"),
)

_LLM_ERROR = re.compile(
    r"\berror during llm execution\b|\bllm execution (?:failed|error)\b", re.ASCII
)
_SENTENCE_END = re.compile(r"[.!?]")


@dataclass(frozen=True, slots=True)
class FailureScan:
    """What the failure-language scan found in a deliverable."""

    refusal: bool
    neutral: bool
    total_words: int = 0
    distinct_words: int = 0
    refusal_words: int = 0
    substantive_words: int = 0  # words outside every sentence with failure language

    @property
    def found(self) -> bool:
        """Any failure language at all: this costs the soft `system_failure_detection` item."""
        return self.refusal or self.neutral

    @property
    def is_excuse(self) -> bool:
        """The hard gate: the deliverable is a refusal or a bare failure message."""
        if self.refusal and (
            self.substantive_words < MIN_WORDS_BESIDE_REFUSAL
            or self.refusal_words > MAX_REFUSAL_SHARE * self.total_words
        ):
            return True
        return (
            self.neutral
            and self.substantive_words < MIN_WORDS_BESIDE_NEUTRAL
            and self.distinct_words < MIN_DISTINCT_WORDS_NEUTRAL
        )


def scan_text(deliverable: str) -> str:
    """The folded first and last 64,000 characters of a flattened deliverable.

    The two ends are joined by an ASCII " ... ": a sentence end, and it keeps ASCII text
    on the fast folding path.
    """
    if len(deliverable) > 2 * SCAN_WINDOW:
        deliverable = f"{deliverable[:SCAN_WINDOW]} ... {deliverable[-SCAN_WINDOW:]}"
    return fold(deliverable)


def has_llm_error_marker(scanned: str) -> bool:
    """The worker's own "Error during LLM execution" (or similar) near the start."""
    return _LLM_ERROR.search(scanned, 0, ERROR_MARKER_WINDOW) is not None


def _sentence(text: str, start: int, end: int) -> tuple[int, int]:
    low = max(0, start - SENTENCE_RADIUS)
    boundary = max(text.rfind(". ", low, start), text.rfind("! ", low, start),
                   text.rfind("? ", low, start))  # fmt: skip
    sentence_start = boundary + 2 if boundary >= 0 else low
    high = min(len(text), end + SENTENCE_RADIUS)
    stop = _SENTENCE_END.search(text, max(0, end - 1), high)
    return sentence_start, stop.end() if stop is not None else high


_TRIGGERS = tuple(
    dict.fromkeys(t for triggers, _ in REFUSAL_FAMILIES + NEUTRAL_FAMILIES for t in triggers)
)


def _sentences(
    text: str, families: tuple[_Family, ...], present: frozenset[str]
) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    for triggers, pattern in families:
        if present.isdisjoint(triggers):
            continue
        position = 0
        while (match := pattern.search(text, position)) is not None:
            if not _at_word_start(text, match.start()):
                position = match.start() + 1
                continue
            span = _sentence(text, match.start(), match.end())
            spans.append(span)
            # The rest of this sentence is already marked: resume after it.
            position = max(match.end(), span[1])
    return spans


def _words_inside(text: str, spans: list[tuple[int, int]]) -> int:
    finder = word_finder(text)
    count = 0
    merged_start, merged_end = -1, -1
    for start, end in sorted(spans):
        if start > merged_end:
            if merged_end > merged_start:
                count += len(finder.findall(text, merged_start, merged_end))
            merged_start, merged_end = start, end
        elif end > merged_end:
            merged_end = end
    if merged_end > merged_start:
        count += len(finder.findall(text, merged_start, merged_end))
    return count


def scan(scanned: str) -> FailureScan:
    """Scan folded text (from :func:`scan_text`) for refusals and neutral failure wording."""
    present = frozenset(trigger for trigger in _TRIGGERS if trigger in scanned)
    if not present:
        return FailureScan(refusal=False, neutral=False)
    refusal_spans = _sentences(scanned, REFUSAL_FAMILIES, present)
    neutral_spans = _sentences(scanned, NEUTRAL_FAMILIES, present)
    if not refusal_spans and not neutral_spans:
        return FailureScan(refusal=False, neutral=False)
    all_words = word_finder(scanned).findall(scanned)
    failure_words = _words_inside(scanned, refusal_spans + neutral_spans)
    return FailureScan(
        refusal=bool(refusal_spans),
        neutral=bool(neutral_spans),
        total_words=len(all_words),
        distinct_words=len(set(all_words)),
        refusal_words=_words_inside(scanned, refusal_spans),
        substantive_words=len(all_words) - failure_words,
    )
