"""The decision that a nonce was taken by someone else's transaction (`chain.taken`)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from chain.taken import LOOKS_BEFORE_LOST, TakenWatch, verdict

looks = st.lists(st.tuples(st.booleans(), st.booleans()), max_size=40)


@given(looks)
def test_lost_only_after_enough_misses_in_a_row(sequence: list[tuple[bool, bool]]) -> None:
    watch = TakenWatch()
    run = 0
    for count_passed, own_receipt in sequence:
        run = run + 1 if count_passed and not own_receipt else 0
        lost = watch.look("n", count_passed=count_passed, own_receipt=own_receipt)
        assert lost == (run >= LOOKS_BEFORE_LOST)
        if lost:
            run = 0  # forgotten once reported
            assert "n" not in watch.misses


def test_one_look_is_never_enough() -> None:
    assert LOOKS_BEFORE_LOST >= 2
    assert verdict(0, True, False) == (1, False)
    assert verdict(1, True, False) == (2, True)


@given(st.integers(min_value=0, max_value=10), st.booleans())
def test_an_own_receipt_or_a_count_short_of_the_nonce_clears_the_misses(before: int, passed: bool) -> None:
    assert verdict(before, passed, True) == (0, False)
    assert verdict(before, False, passed) == (0, False)


def test_keys_are_watched_apart() -> None:
    watch = TakenWatch()
    assert not watch.look(("task", 1), count_passed=True, own_receipt=False)
    assert not watch.look(("task", 2), count_passed=True, own_receipt=False)
    assert watch.look(("task", 1), count_passed=True, own_receipt=False)
    assert watch.misses == {("task", 2): 1}
