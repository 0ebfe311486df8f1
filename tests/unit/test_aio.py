"""`runtime.aio.wait_event`: a cancellation is never dropped, whatever it races.

The race is driven, not hoped for: the event is set, the loop turned `turns` times, then the
waiting task cancelled. With `asyncio.wait_for(event.wait(), ...)` on CPython 3.11 one of
those orders (the inner wait finished, its callback not yet run) returned normally from a
cancelled task (python/cpython gh-86296): a loop idling there survived its task group.
"""

from __future__ import annotations

import asyncio

import pytest

from runtime.aio import wait_event


@pytest.mark.parametrize("turns", range(5))
async def test_a_cancellation_racing_the_event_is_raised(turns: int) -> None:
    event = asyncio.Event()
    task = asyncio.create_task(wait_event(event, 60))
    await asyncio.sleep(0)  # the task is waiting
    event.set()
    for _ in range(turns):
        await asyncio.sleep(0)
    if task.done():
        assert task.result() is True  # it saw the event before the cancellation came
        return
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize("turns", range(5))
async def test_a_loop_on_wait_event_ends_with_its_task_group(turns: int) -> None:
    """A sibling's error reaches the caller while the loop is woken at the same moment."""
    wake = asyncio.Event()

    async def idle_loop() -> None:
        while True:
            await wait_event(wake, 60)
            wake.clear()

    async def failing() -> None:
        for _ in range(turns):
            await asyncio.sleep(0)
        wake.set()
        raise KeyError("a loop's bug")

    with pytest.raises(ExceptionGroup) as raised:
        async with asyncio.timeout(30), asyncio.TaskGroup() as group:
            group.create_task(idle_loop())
            group.create_task(failing())
    assert raised.group_contains(KeyError)


async def test_the_timeout_and_the_event() -> None:
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    event.set()
    assert await wait_event(event, 0.01) is True
    loop = asyncio.get_running_loop()
    event.clear()
    loop.call_soon(event.set)
    assert await wait_event(event, 60) is True
