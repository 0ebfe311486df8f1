"""The garbage collector's pace for processes that move data in bulk (the indexer, the publisher).

CPython's default pace (a young collection every 700 net allocations) is tuned for programs
whose objects die young. The indexer holds a window of 10,000 parsed logs, decoded events and
messages while it writes and publishes them: at the default pace each young collection finds
them alive and promotes them, and the older generations re-scan them again and again (measured
at 5-12 µs per event, a fifth of the indexer's CPU). Nothing in that path builds reference
cycles, so reference counting frees the windows; the collector only has to catch the rare cycle,
and a slower pace still does that with memory bounded by one window.
"""

from __future__ import annotations

import gc

BULK_THRESHOLDS = (50_000, 10, 10)
"""A young collection every 50,000 net allocations (about one window), the older ones as usual."""


def freeze_startup() -> None:
    """Move what start-up allocated (modules, settings, codecs, clients: alive as long as the
    process, never garbage) out of the collector's reach, so its full passes walk only what the
    traffic allocates. Call it once, after start-up."""
    gc.collect()
    gc.freeze()


def pace_for_bulk() -> None:
    """`freeze_startup`, then collect at the bulk pace from here on. Call it once, after start-up."""
    freeze_startup()
    gc.set_threshold(*BULK_THRESHOLDS)
