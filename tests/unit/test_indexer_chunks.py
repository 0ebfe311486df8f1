"""Commits of a window are cut at block boundaries, each with the right cursor block."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from indexer.decode import DecodedLog
from indexer.reorg import BlockRef
from indexer.service import _chunks


def _event(block: int, log_index: int) -> DecodedLog:
    return DecodedLog(
        id=f"1:0x{block:064x}:{log_index}", chain_id=1, escrow_address="0x" + "e" * 40, block_number=block,
        block_hash=f"0x{block:064x}", block_timestamp=1000 + block, tx_hash="0x" + "1" * 64, tx_index=0,
        log_index=log_index, event="TaskAccepted", task_id=1, args={},
    )


@given(
    st.lists(st.integers(min_value=1, max_value=6), min_size=0, max_size=30),
    st.integers(min_value=1, max_value=10),
)
def test_chunks_keep_blocks_whole_and_order(per_block: list[int], limit: int) -> None:
    """Every event once, in order; no block split; intermediate tips are the chunk's last block."""
    events = [_event(b, i) for b, n in enumerate(per_block, start=10) for i in range(n)]
    last = BlockRef(10 + len(per_block) + 5, "0xlast", "0xparent", 9999)
    chunks = _chunks(events, last, {}, limit)
    assert [e for chunk, _ in chunks for e in chunk] == events
    assert chunks[-1][1] == last
    seen_blocks: set[int] = set()
    for chunk, tip in chunks[:-1]:
        assert chunk, "no empty intermediate commit"
        assert tip.number == chunk[-1].block_number
        assert tip.hash == chunk[-1].block_hash
        blocks = {e.block_number for e in chunk}
        assert not blocks & seen_blocks, "a block split across commits"
        seen_blocks |= blocks
        assert len(chunk) >= limit


def test_known_headers_are_used_as_tips() -> None:
    """In head mode the window's own header is the cursor of an intermediate commit."""
    events = [_event(1, 0), _event(1, 1), _event(2, 0)]
    header = BlockRef(1, "0x" + "0" * 63 + "1", "0xparent-of-1", 1001)
    chunks = _chunks(events, BlockRef(2, "0x2", "0x1", 1002), {1: header}, 2)
    assert [tip for _, tip in chunks] == [header, BlockRef(2, "0x2", "0x1", 1002)]
