"""The one fold of a task's escrow events (`chain.view.fold_task`) against the two folds it
replaced: verification routing's `fold_chain` and the settlement relayer's
`fold_indexed_task`, copied here as they were, as oracles. (The lifecycle machine's
agreement is a stateful invariant in `test_lifecycle_machine.py`.)"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from chain.view import ChainEvent, ChainTask, ChainVerdict, fold_task
from relayer.settlement.store import IndexedTask, fold_indexed_task
from schemas.task_state import ZERO_ADDRESS
from verification.routing import fold_chain

# ------------------------------------------------------------------ the replaced folds


def _address(value: Any) -> str | None:
    text = str(value) if value is not None else ""
    return None if not text or text.lower() == ZERO_ADDRESS else text


def old_fold_chain(events: Iterable[ChainEvent]) -> ChainTask:
    """verification/routing.py's fold, as it was."""
    task = ChainTask()
    attempts: dict[int, str] = {}
    verdicts: dict[int, ChainVerdict] = {}
    values: dict[str, Any] = {}
    for event in sorted(events, key=lambda e: (e.block_number, e.log_index)):
        args = event.args
        if "status" in args:
            values["status"] = int(args["status"])
        if event.name == "TaskCreated":
            values.update(
                task_hash=str(args["taskHash"]).lower(),
                poster=_address(args.get("poster")),
                verifier=_address(args.get("verifier")),
                deadline=int(args["deadline"]),
            )
        elif event.name == "TaskAccepted":
            values["agent"] = _address(args.get("agent"))
        elif event.name == "EvidenceSubmitted":
            attempts[int(args["attempt"])] = str(args["evidenceHash"]).lower()
        elif event.name == "VerificationCompleted":
            attempt = int(args["attempt"])
            verdicts[attempt] = ChainVerdict(
                attempt=attempt,
                evidence_hash=str(args["evidenceHash"]).lower(),
                passed=bool(args["passed"]),
                score=int(args["score"]),
                verifier=str(args["verifier"]),
                tx_hash=event.tx_hash,
                block_number=event.block_number,
            )
    return dataclasses.replace(task, attempts=attempts, verdicts=verdicts, **values)


def old_fold_indexed_task(rows: Sequence[tuple[str, Any]]) -> IndexedTask | None:
    """relayer/settlement/store.py's fold, as it was (rows in chain order)."""
    if not rows:
        return None
    verifier: str | None = None
    attempt = 0
    evidence: str | None = None
    judged: set[int] = set()
    for name, args in rows:
        if name == "TaskCreated":
            named = str(args.get("verifier") or ZERO_ADDRESS)
            verifier = None if int(named, 16) == 0 else named
        elif name == "EvidenceSubmitted":
            attempt = int(args["attempt"])
            evidence = str(args["evidenceHash"]).lower()
        elif name == "VerificationCompleted":
            judged.add(int(args["attempt"]))
    return IndexedTask(verifier, attempt, evidence, frozenset(judged))


# ------------------------------------------------------------------ random histories

ADDRESSES = ["0x" + c * 40 for c in "1234abcd"] + [ZERO_ADDRESS, "0xAbCdEf0123456789abcdef0123456789ABCDEF01"]
HASHES = ["0x" + c * 64 for c in "0159aF"]
NAMES = [
    "TaskCreated",
    "TaskAccepted",
    "EvidenceSubmitted",
    "VerificationCompleted",
    "DisputeRaised",
    "DisputeResolved",
    "TaskEscalated",
    "TaskRefunded",
]


@st.composite
def event_args(draw: st.DrawFn, name: str) -> dict[str, Any]:
    args: dict[str, Any] = {"taskId": 1}
    if draw(st.booleans()):
        args["status"] = draw(st.integers(0, 9))
    address = st.sampled_from(ADDRESSES)
    if name == "TaskCreated":
        args.update(
            taskHash=draw(st.sampled_from(HASHES)),
            poster=draw(address),
            verifier=draw(address),
            deadline=draw(st.integers(0, 2**40)),
            token=draw(address),
            reward=draw(st.integers(1, 10**24)),
        )
    elif name == "TaskAccepted":
        args["agent"] = draw(address)
    elif name == "EvidenceSubmitted":
        args.update(agent=draw(address), attempt=draw(st.integers(1, 3)), evidenceHash=draw(st.sampled_from(HASHES)))
    elif name == "VerificationCompleted":
        args.update(
            verifier=draw(address),
            attempt=draw(st.integers(1, 3)),
            evidenceHash=draw(st.sampled_from(HASHES)),
            passed=draw(st.booleans()),
            score=draw(st.integers(0, 100)),
            agent=draw(address),
            failedAt=draw(st.integers(0, 2**40)),
        )
    elif name == "DisputeRaised":
        args.update(by=draw(address), previousStatus=2, attempt=draw(st.integers(0, 3)))
    elif name == "DisputeResolved":
        args["agentShareBps"] = draw(st.integers(0, 10_000))
    elif name == "TaskEscalated":
        at = draw(st.integers(0, 2**40))
        args.update(escalatedAt=at, collectibleAt=at + 14 * 86_400)
    return args


@st.composite
def histories(draw: st.DrawFn) -> list[ChainEvent]:
    """Any events of one task, each at its own chain position, in any arrival order: the
    folds must agree even on sequences the contract could not emit."""
    count = draw(st.integers(0, 12))
    positions = draw(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 5)), min_size=count, max_size=count, unique=True))
    events: list[ChainEvent] = []
    for block, index in positions:
        name = draw(st.sampled_from(NAMES))
        events.append(
            ChainEvent(f"e{block}:{index}", block, index, f"0x{block:02x}{index:02x}", name, draw(event_args(name)))
        )
    return draw(st.permutations(events))


def _settlement_row(event: ChainEvent) -> ChainEvent:
    """What `chain.indexed.settlement_events` selects of an event (typed fields only)."""
    keep = ("verifier", "attempt", "evidenceHash", "passed", "score", "status")
    return dataclasses.replace(event, args={k: v for k, v in event.args.items() if k in keep})


@settings(max_examples=600, deadline=None)
@given(histories())
def test_the_routing_view_is_the_fold_it_replaced(events: list[ChainEvent]) -> None:
    """Every field routing reads, for any history in any arrival order."""
    new, old = fold_task(events), old_fold_chain(events)
    assert fold_chain(events) == new
    for name in ("task_hash", "poster", "verifier", "deadline", "agent", "status", "attempts", "verdicts"):
        assert getattr(new, name) == getattr(old, name), name
    assert new.current_attempt == old.current_attempt and new.submitted == old.submitted
    for attempt in range(4):
        assert new.moved_past(attempt) == old.moved_past(attempt)
        for evidence in HASHES:
            assert new.is_pending(attempt, evidence.lower()) == old.is_pending(attempt, evidence.lower())


@settings(max_examples=600, deadline=None)
@given(histories())
def test_the_settlement_projection_is_the_fold_it_replaced(events: list[ChainEvent]) -> None:
    """The relayer's verdict checks see what they saw, from the columns its SQL selects."""
    ordered = sorted(
        (e for e in events if e.name in ("TaskCreated", "EvidenceSubmitted", "VerificationCompleted")),
        key=lambda e: (e.block_number, e.log_index),
    )
    expected = old_fold_indexed_task([(e.name, e.args) for e in ordered])
    assert fold_indexed_task([_settlement_row(e) for e in ordered]) == expected
    assert fold_indexed_task(ordered) == expected


def test_a_history_without_its_creation_folds_to_what_is_known() -> None:
    """Events of a task created before the indexer's start block: no terms hash, no parties."""
    submitted = ChainEvent("e1", 5, 0, "0x01", "EvidenceSubmitted", {"attempt": 1, "evidenceHash": HASHES[0], "status": 2})
    view = fold_task([submitted])
    assert not view.created and view.task_hash is None and view.poster is None
    assert view.submitted and view.is_pending(1, HASHES[0].lower())
    assert fold_task([]) == ChainTask()


def test_the_indexers_tables_are_read_in_one_module() -> None:
    """No SQL over `escrow_events`, `chain_cursor` or `chain_blocks` in the services or the
    application outside `chain/indexed.py` (the indexer writes them, the publisher in
    `runtime/` reads them by position, `bench/` measures them)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    sql = re.compile(r"\b(FROM|JOIN|INTO|UPDATE)\s+(escrow_events|chain_cursor|chain_blocks)\b", re.IGNORECASE)
    allowed = {Path("chain/indexed.py")}
    offenders = []
    for package in ("chain", "relayer", "verification", "lifecycle", "panels", "api", "escrowd"):
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root)
            if relative not in allowed and sql.search(path.read_text("utf-8")):
                offenders.append(str(relative))
    assert offenders == []
