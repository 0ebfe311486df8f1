"""Pure rules of agent review: who qualifies as a verifier, listing refusals, brief sealing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from verification.agents.briefs import (
    KeyContext,
    encryption_public_key,
    open_brief,
    seal_brief,
    unwrap_key,
    wrap_key,
)
from verification.agents.directory import Executor
from verification.agents.listing import BriefState, listing_check, named_verifier_check
from verification.routing import ChainTask, TaskKey, TermsView

NOW = datetime(2026, 12, 1, tzinfo=UTC)
POSTER = "0x" + "1" * 40
VERIFIER = "0x" + "2" * 40
OTHER = "0x" + "3" * 40
KEY = TaskKey(31337, "0x" + "5" * 40, 7)


def executor(**overrides: object) -> Executor:
    values: dict[str, object] = {
        "address": VERIFIER.lower(), "roles": ("verifier",), "chains": (31337,), "verify_others": True,
        "capabilities": (), "encryption_public_key": "0x02" + "0" * 64, "last_seen": NOW,
    }  # fmt: skip
    values.update(overrides)
    return Executor(**values)  # type: ignore[arg-type]


@given(
    roles=st.sets(st.sampled_from(["worker", "verifier"]), min_size=1),
    chains=st.sets(st.integers(1, 5), min_size=1),
    opt_in=st.booleans(),
    age=st.integers(0, 1000),
    role=st.sampled_from(["worker", "verifier"]),
    chain=st.none() | st.integers(1, 5),
)
def test_qualifies_is_role_opt_in_chain_and_freshness(
    roles: set[str], chains: set[int], opt_in: bool, age: int, role: str, chain: int | None
) -> None:
    from verification.agents.directory import qualifies

    e = executor(roles=tuple(roles), chains=tuple(chains), verify_others=opt_in, last_seen=NOW - timedelta(seconds=age))
    expected = role in roles and (role != "verifier" or opt_in) and (chain is None or chain in chains) and age <= 300
    assert qualifies(e, role, chain, NOW, 300) is expected  # type: ignore[arg-type]


def test_opt_in_is_checked_only_for_registered_verifiers() -> None:
    assert named_verifier_check(None) is None
    assert named_verifier_check(executor()) is None
    refused = named_verifier_check(executor(verify_others=False))
    assert refused is not None and (refused.status, refused.code) == (409, "VERIFIER_NOT_OPTED_IN")


def terms(**overrides: object) -> TermsView:
    values: dict[str, object] = {
        "task_hash": "0x" + "a" * 64, "chain_id": KEY.chain_id, "escrow": KEY.escrow, "poster": POSTER, "mode": "agent",
        "verifier_address": VERIFIER, "private": False, "criteria": None, "verifier": None,
        "instructions_digest": "0x" + "b" * 64,
    }  # fmt: skip
    values.update(overrides)
    return TermsView(**values)  # type: ignore[arg-type]


NO_BRIEF = BriefState(stored=False, private=False, recipients=frozenset())


def check(*args: object) -> object:
    refused = listing_check(*args, NOW, 300)  # type: ignore[arg-type]
    return None if refused is None else (refused.status, refused.code)


def test_listing_refusals_in_order() -> None:
    """Mismatch before the verifier's entry before wrapping; each only where it applies."""
    chain = ChainTask(task_hash="0x" + "a" * 64, poster=POSTER, verifier=VERIFIER)
    assert check(KEY, chain, terms(), POSTER, executor(), NO_BRIEF) is None
    other = ChainTask(task_hash="0x" + "a" * 64, poster=POSTER, verifier=OTHER)
    off_chain = executor(chains=(1,))
    assert check(KEY, other, terms(), POSTER, off_chain, NO_BRIEF) == (409, "VERIFIER_MISMATCH")
    assert check(KEY, chain, terms(), POSTER, off_chain, NO_BRIEF) == (409, "VERIFIER_CHAIN_UNSUPPORTED")
    assert check(KEY, chain, terms(), POSTER, None, NO_BRIEF) is None  # unregistered: nothing to check
    private = terms(private=True)
    wrapped_to_agent = BriefState(stored=True, private=True, recipients=frozenset({OTHER}))
    assert check(KEY, chain, private, POSTER, executor(), wrapped_to_agent) == (400, "VERIFIER_NOT_WRAPPED")
    both = BriefState(stored=True, private=True, recipients=frozenset({OTHER, VERIFIER.lower()}))
    assert check(KEY, chain, private, POSTER, executor(), both) is None
    junk = BriefState(stored=True, private=True, recipients=both.recipients, malformed=frozenset({VERIFIER.lower()}))
    assert check(KEY, chain, private, POSTER, executor(), junk) == (400, "VERIFIER_KEY_MALFORMED")
    assert check(KEY, chain, private, POSTER, None, junk) == (400, "VERIFIER_KEY_MALFORMED")  # self-run: the key still
    agent_junk = BriefState(stored=True, private=True, recipients=both.recipients, malformed=frozenset({OTHER}))
    assert check(KEY, chain, private, POSTER, executor(), agent_junk) is None  # only the verifier's key decides listing
    assert check(KEY, chain, terms(), OTHER, executor(), NO_BRIEF) == (403, "NOT_POSTER")


def test_listing_rechecks_the_registered_verifier() -> None:
    """Opt-in, role, chain and liveness at listing, in that order; 300 s is still running, 301 s is not."""
    chain = ChainTask(task_hash="0x" + "a" * 64, poster=POSTER, verifier=VERIFIER)
    cases = [
        (executor(verify_others=False), (409, "VERIFIER_NOT_OPTED_IN")),
        (executor(roles=("worker",)), (409, "VERIFIER_NOT_OPTED_IN")),
        (executor(roles=("worker",), chains=(1,), last_seen=NOW - timedelta(days=365)), (409, "VERIFIER_NOT_OPTED_IN")),
        (executor(chains=(1,), last_seen=NOW - timedelta(days=365)), (409, "VERIFIER_CHAIN_UNSUPPORTED")),
        (executor(last_seen=NOW - timedelta(days=365)), (409, "VERIFIER_NOT_RUNNING")),
        (executor(last_seen=NOW - timedelta(seconds=301)), (409, "VERIFIER_NOT_RUNNING")),
        (executor(last_seen=NOW - timedelta(seconds=300)), None),
        (executor(roles=("worker", "verifier")), None),
    ]
    for entry, expected in cases:
        assert check(KEY, chain, terms(), POSTER, entry, NO_BRIEF) == expected, entry
    # Terms of another mode name no verifier: its entry is not consulted.
    manual = ChainTask(task_hash="0x" + "a" * 64, poster=POSTER, verifier=None)
    assert check(KEY, manual, terms(mode="manual", verifier_address=None), POSTER, executor(verify_others=False), NO_BRIEF) is None


@settings(max_examples=25, deadline=None)
@given(text=st.text(max_size=2000))
def test_any_brief_round_trips_through_seal_and_wrap(text: str) -> None:
    secret = b"\x07" * 32
    context = KeyContext(31337, KEY.escrow, "0x" + "a" * 64, VERIFIER)
    sealed = seal_brief(text)
    key = unwrap_key(wrap_key(sealed.key, encryption_public_key(secret), context), secret, context)
    assert open_brief(sealed.ciphertext, key) == text
