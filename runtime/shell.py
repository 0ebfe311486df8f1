"""One way to run a service process: logging, SIGTERM/SIGINT drain, the stop line, the exit code.

Every long-running command (`escrowd index run`, each consumer, the relayer, the API, the
bots, the sandbox runner) hands its main coroutine to :func:`run_service`. The coroutine
takes a stop event and returns once it has drained:

* the first SIGTERM or SIGINT sets the event (logged as `service_stopping`). A consumer
  finishes the batch in flight, clears its in-flight mark, commits and leaves its group;
  a loop ends its turn. The process then exits **0** after one `service_stopped` line;
* if the drain has not ended after `drain_seconds` (below Kubernetes' default grace period
  of 30 s), or at a second signal, the coroutine is cancelled: a consumer hands its batch
  back (its transaction rolls back, its mark is cleared on the way out, the offsets stay
  where they were and the next run re-reads the batch). The process exits 128 + the
  signal (130 / 143) after the same stop line, with `outcome` "handed_back";
* an exception from the coroutine propagates to `escrowd.cli.main`, which prints one line
  and exits 2 (a start-up problem the operator fixes) or 1.

Each line a service logs carries `service=<name>` (structlog context variables, inherited by
every task the coroutine starts); consumers add the message they handle and loops their
turn. A SIGKILL leaves the consumer's mark in place, and the next run's poison-pill check
treats it as it always has.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import structlog

from runtime.logging import configure_logging

log = structlog.get_logger(__name__)

DRAIN_SECONDS = 25.0
"""How long a drain may take before the batch in flight is handed back (k8s waits 30 s)."""

SIGNALS = (signal.SIGTERM, signal.SIGINT)

Main = Callable[[asyncio.Event], Awaitable[None]]
"""A service's main coroutine: runs until the event is set, then drains and returns."""


def run_service(
    name: str,
    main: Main,
    *,
    log_json: bool = True,
    drain_seconds: float = DRAIN_SECONDS,
    configure: bool = True,
) -> None:
    """Run `main(stop)` until it returns; SIGTERM/SIGINT set `stop` (see the module docstring).

    Returns normally after a drain (exit 0); raises SystemExit(128 + signal) when the drain
    was cut short, and lets any other exception through.
    """
    if configure:
        configure_logging(json=log_json)
    code = asyncio.run(serve(name, main, drain_seconds=drain_seconds))
    if code:
        raise SystemExit(code)


async def serve(name: str, main: Main, *, drain_seconds: float = DRAIN_SECONDS) -> int:
    """The body of :func:`run_service` inside a running loop; returns the exit code."""
    structlog.contextvars.bind_contextvars(service=name)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    received: list[signal.Signals] = []
    cut_short: list[str] = []
    started = time.monotonic()
    task: asyncio.Task[None] = asyncio.ensure_future(main(stop))
    stopping_at: list[float] = []

    def hand_back(reason: str) -> None:
        if not task.done() and not cut_short:
            cut_short.append(reason)
            log.warning("service_handing_back", reason=reason, drain_seconds=drain_seconds)
            task.cancel()

    def on_signal(sig: signal.Signals) -> None:
        received.append(sig)
        if len(received) == 1:
            stopping_at.append(time.monotonic())
            log.info("service_stopping", signal=sig.name)
            stop.set()
            loop.call_later(drain_seconds, hand_back, "drain_timeout")
        else:
            hand_back("second_signal")

    installed = []
    for sig in SIGNALS:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, on_signal, sig)
            installed.append(sig)
    try:
        try:
            await task
        except asyncio.CancelledError:
            if not cut_short:
                raise  # cancelled from outside (the loop is closing): not ours to report
    finally:
        for sig in installed:
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
    fields: dict[str, Any] = {"uptime_seconds": round(time.monotonic() - started, 3)}
    if stopping_at:
        fields["drain_seconds"] = round(time.monotonic() - stopping_at[0], 3)
    if received:
        fields["signal"] = received[0].name
    code = 0
    if cut_short:
        code = 128 + int(received[0]) if received else 1
        fields["outcome"] = "handed_back"
    else:
        fields["outcome"] = "drained" if received else "finished"
    log.info("service_stopped", exit_code=code, **fields)
    return code


async def wait_stopped(stop: asyncio.Event, *tasks: asyncio.Future[Any]) -> None:
    """Until `stop` is set or one of `tasks` ends; an ending task's exception is raised."""
    stopper = asyncio.ensure_future(stop.wait())
    try:
        done, _ = await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    for finished in done:
        if finished is not stopper and not finished.cancelled():
            finished.result()


async def cancel_on_stop(stop: asyncio.Event, work: Awaitable[None]) -> None:
    """Run `work` until it ends or `stop` is set; then cancel it and wait for its clean-up.

    For a service whose parts stop by cancellation (each loop's `finally` is its drain).
    """
    task = asyncio.ensure_future(work)
    try:
        await wait_stopped(stop, task)
    finally:
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def startup_failure(what: str, exc: BaseException) -> NoReturn:
    """Print `what: <the problem>` on one line of stderr (never a secret's value) and exit 2.

    The one start-up error block of every command: a configuration or key the operator fixes.
    """
    from runtime.errors import safe_message

    print(f"{what}: {safe_message(exc)}", file=sys.stderr, flush=True)
    raise SystemExit(2)
