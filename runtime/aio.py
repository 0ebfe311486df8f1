"""asyncio helpers every long-running loop shares.

`wait_event` replaces `asyncio.wait_for(event.wait(), seconds)`: on CPython 3.11, when the
waiting task is cancelled in the same loop iteration in which the event's waiter finishes,
`wait_for` returns the result and drops the cancellation (python/cpython gh-86296, fixed
in 3.12). A loop idling on an event that is set often (a wake-up per database
notification) then survives its task group's cancellation and the group never ends: a
sibling's error is never raised and stopping hangs. `asyncio.timeout` waits in the same
task (no inner task whose completion can race the cancellation) and tells its own expiry
from a cancellation by the cancel count.
"""

from __future__ import annotations

import asyncio


async def wait_event(event: asyncio.Event, seconds: float) -> bool:
    """Wait until `event` is set or `seconds` pass; True when it was set. A cancellation is
    always raised, however it races the event."""
    if event.is_set():
        return True
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        return event.is_set()
    return True
