"""The service shell (`runtime.shell`) on its own: drain, hand back, the stop line, the exit code.

Each case is a small process running `run_service` with a main coroutine that behaves one
way on stop; the signal is real (sent to the child), the assertions are on its exit code and
its one `service_stopped` line.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

SCRIPT = """
import asyncio, sys
from runtime.shell import run_service

mode = sys.argv[1]

async def main(stop):
    print("ready", flush=True)
    if mode == "drains":
        await stop.wait()
        await asyncio.sleep(0.2)            # the batch in flight ends
    elif mode == "ignores":
        try:
            await asyncio.sleep(3600)       # never looks at stop: the drain deadline hands it back
        except asyncio.CancelledError:
            print("handed back", flush=True)
            raise
    elif mode == "fails":
        raise RuntimeError("boom")

run_service("probe", main, drain_seconds=float(sys.argv[2]))
"""


def _run(mode: str, *signals: signal.Signals, drain_seconds: float = 60.0) -> tuple[int, str, str]:
    child = subprocess.Popen([sys.executable, "-c", SCRIPT, mode, str(drain_seconds)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert child.stdout is not None
    if signals:
        assert child.stdout.readline().strip() == "ready"
        for sig in signals:
            child.send_signal(sig)
            time.sleep(0.3)
    out, err = child.communicate(timeout=120)
    return child.returncode, out, err


def _stop_line(err: str) -> dict[str, object]:
    (line,) = [json.loads(x) for x in err.splitlines() if '"service_stopped"' in x]
    return line


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_drained_service_exits_0_with_one_stop_line(sig: signal.Signals) -> None:
    code, _, err = _run("drains", sig)
    assert code == 0, err
    line = _stop_line(err)
    assert (line["service"], line["signal"], line["outcome"], line["exit_code"]) == ("probe", sig.name, "drained", 0)
    assert '"service_stopping"' in err


def test_a_drain_past_its_deadline_is_handed_back_with_the_signal_status() -> None:
    code, out, err = _run("ignores", signal.SIGTERM, drain_seconds=0.5)
    assert code == 128 + signal.SIGTERM, err
    assert "handed back" in out  # the main coroutine was cancelled: its transaction rolls back
    line = _stop_line(err)
    assert (line["outcome"], line["exit_code"]) == ("handed_back", 143)
    assert '"service_handing_back"' in err and "drain_timeout" in err


def test_a_second_signal_hands_the_batch_back_at_once() -> None:
    code, out, err = _run("ignores", signal.SIGINT, signal.SIGINT)
    assert code == 128 + signal.SIGINT, err
    assert "handed back" in out and "second_signal" in err
    assert _stop_line(err)["outcome"] == "handed_back"


def test_a_failing_service_raises_and_logs_no_stop_line() -> None:
    code, _, err = _run("fails")
    assert code == 1 and "RuntimeError: boom" in err
    assert '"service_stopped"' not in err
