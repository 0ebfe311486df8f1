"""Shared fixtures: real PostgreSQL, Kafka and anvil, started on demand and always stopped.

`make test` runs the suite on several pytest-xdist workers (`-n`); every worker starts its
own embedded PostgreSQL and Tansu broker (unless `DATABASE_URL` / `KAFKA_BOOTSTRAP` name
shared ones), and every test gets its own database, topic prefix, ports and temporary
directories, so tests never see each other whichever worker runs them.
"""

from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path

import pytest

pytest_plugins = ["tests.fixtures.services", "tests.fixtures.chain"]

# The files with the longest tests (whole-system runs, kill -9 campaigns, consumer processes
# across restarts, stateful runs against anvil), longest first, from `pytest --durations=80`
# summed per file (December 2026, 1,840 tests). `make test` hands out whole files (`--dist
# loadfile`, so module fixtures are set up once), in this order first: they run beside the
# many short files instead of finishing the run alone on one worker. A path that no longer
# matches only loses its place.
SLOW_FIRST = (
    "tests/simulation/test_whole_system.py",
    "tests/contract/test_escrow_stateful.py",
    "tests/integration/test_lifecycle_consumers.py",
    "tests/integration/test_example_subscribers.py",
    "tests/settlement/test_relay_crash_packed.py",
    "tests/consumers/test_poison_pill.py",
    "tests/integration/test_indexer_crash.py",
    "tests/settlement/test_relay_crash.py",
    "tests/verification/test_sandbox_corpus.py",
    "tests/unit/test_lifecycle_machine.py",
    "tests/consumers/test_drain.py",
    "tests/consumers/test_runbook_replay.py",
    "tests/settlement/test_relay_batches.py",
    "tests/api/test_bridge_health_on_api.py",
    "tests/verification/test_consumer_integration.py",
    "tests/house/test_config_check.py",
    "tests/verification/test_judging_stage.py",
    "tests/e2e/test_run_signers.py",
    "tests/verification/test_request_trust.py",
    "tests/house/test_service_signals.py",
    "tests/panels/test_ruling_relay_process.py",
    "tests/e2e/test_run_signals.py",
    "tests/integration/test_indexer_faults.py",
    "tests/e2e/test_run_exit.py",
    "tests/house/test_keys_init.py",
    "tests/verification/test_request_signatures.py",
    "tests/verification/test_sandbox_hostile.py",
    "tests/api/test_schemathesis.py",
    "tests/verification/test_verification_signers.py",
    "tests/api/test_bridge_health_rows.py",
    "tests/agents/test_verifier_checks.py",
    "tests/consumers/test_retry_paths.py",
    "tests/settlement/test_relay_revert_retry.py",
)


def _queue_place(item: pytest.Item) -> int:
    path = item.nodeid.split("::", 1)[0]
    return SLOW_FIRST.index(path) if path in SLOW_FIRST else len(SLOW_FIRST)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist, the known-slow files first (stable: everything else keeps its order)."""
    if hasattr(config, "workerinput"):
        items.sort(key=_queue_place)


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C works in the processes the tests start, however the suite itself was started.

    A shell starts a background job (`make test &`, a CI step run with `&`) with SIGINT
    ignored, and every child inherits that: the tests that press Ctrl-C on `escrowd devnet`
    would then wait for an exit that never comes. A handler of ours (unlike SIG_IGN) is reset
    to the default in every child at exec.
    """
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # The embedded PostgreSQL puts its socket under XDG_RUNTIME_DIR when the data directory's
    # path is too long for one (a test's private TMPDIR under an xdist worker's basetemp).
    # runtime.services.postgres sets it on the first start; set it before any test runs, so
    # an `escrowd run` started by the first test of a worker inherits the short one too.
    # One per worker: the embedded PostgreSQL makes the folders on its way traversable
    # (0755) when it starts, and a process that imports it while the folder is not private
    # (0700) falls back to a long path. A folder shared by workers would let one worker's
    # start race another's `escrowd run`.
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    runtime = Path(tempfile.gettempdir()) / f"escrowd-runtime-{os.getuid()}-{worker}"
    runtime.mkdir(mode=0o700, exist_ok=True)
    runtime.chmod(0o700)
    os.environ.setdefault("XDG_RUNTIME_DIR", str(runtime))

