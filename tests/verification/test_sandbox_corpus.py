"""The hostile-submission corpus, through `escrowd verify run` (a real CLI process).

Each submission tries one way to dodge its verdict: answer differently on the two runs, kill
or starve the process running it, hide CPU in threads, grandchildren and short-lived forks,
hide memory in tmpfs and shared memory, find the hidden cases, flood the output or the disk.
Every one ends as a FAIL verdict (exit 0, `passed` false): never "could not answer" (exit 3,
which escalation would later pay), never a PASS. Each submission would pass if its attack
worked (it returns the right answers), so a FAIL at the expected stage shows the defence,
not an accident, decided. Ordinary code (stdlib imports, threads it joins) still passes.

The runner-service half drives the same CLI with `--sandbox-url` against a real
`escrowd verify serve-sandbox` process.
"""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.verification.test_sandbox_hostile import EXIT_COULD_NOT_ANSWER, run_cli, suite
from tests.verification.test_sandbox_service import free_port
from verification.sandbox import BUILTIN_ERRORS

pytestmark = pytest.mark.timeout(600)

ROOT_CLI: dict[str, Any] = {"argv": [sys.executable, "-m", "escrowd.cli"], "env": {}, "user": None}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus")
    path.chmod(0o755)
    return path


@pytest.fixture(scope="module")
def runner_url() -> Iterator[str]:
    """A real `escrowd verify serve-sandbox` process."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "escrowd.cli", "verify", "serve-sandbox", "--port", str(port)],
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    import socket

    deadline = time.monotonic() + 120
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("serve-sandbox did not start") from None
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(params=["local", "runner"])
def mode(request: pytest.FixtureRequest, runner_url: str) -> dict[str, str]:
    """Extra environment for the CLI: a local bwrap, or the sandbox runner service."""
    return {} if request.param == "local" else {"ESCROWD_SANDBOX_URL": runner_url}


@pytest.fixture(params=["cgroup", "pidns", "runner"])
def cpu_mode(request: pytest.FixtureRequest, runner_url: str) -> dict[str, str]:
    """Both accounting modes of a local run (this machine offers a cgroup v2), and the runner service."""
    if request.param == "runner":
        return {"ESCROWD_SANDBOX_URL": runner_url}
    return {"ESCROWD_SANDBOX_ACCOUNTING": request.param}


def verify(
    workdir: Path, verifier: dict[str, Any], code: str, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """`escrowd verify run`: the verdict, after checking it is one (exit 0, not "could not answer")."""
    status, out, text = run_cli(ROOT_CLI, workdir, verifier, code, env)
    assert status != EXIT_COULD_NOT_ANSWER, f"could not answer: {text}"
    assert status == 0 and "passed" in out, text
    out["_text"] = text
    return out


def assert_fail(out: dict[str, Any], stage: str) -> None:
    assert out["passed"] is False and out["reward"] == 0.0, out
    assert out["detail"]["stage"] == stage, out


ADD = suite([([1, 2], 3)], [([10, 5], 15)])


# ---------------------------------------------------------------------------- ordinary code


def test_ordinary_code_with_joined_threads_passes(workdir: Path, mode: dict[str, str]) -> None:
    """stdlib imports and a thread pool it joins pass both stages, within the limits."""
    code = (
        "import collections, concurrent.futures, functools, heapq, itertools, json, math, re, threading\n"
        "def solve(a, b):\n"
        "    with concurrent.futures.ThreadPoolExecutor(4) as pool:\n"
        "        parts = list(pool.map(lambda x: x, [a, b]))\n"
        "    t = threading.Thread(target=lambda: None); t.start(); t.join()\n"
        "    return sum(parts)\n"
    )
    out = verify(
        workdir, suite([([1, 2], 3)], [([10, 5], 15), ([7, 7], 14)], timeLimitMs=1000), code, mode
    )
    assert out["passed"] is True, out
    assert out["detail"]["publicTests"] == "1/1" and out["detail"]["hiddenTests"] == "2/2"


# ---------------------------------------------------------------------------- faults where they belong


def test_non_determinism_fails_at_determinism(workdir: Path, mode: dict[str, str]) -> None:
    """Right on one run, wrong on the other (a coin per case): FAIL at DETERMINISM with both digests."""
    code = "import os\ndef solve(a, b):\n    return a + b + os.urandom(1)[0] % 2\n"
    cases = [([i, i], 2 * i) for i in range(24)]
    out = verify(workdir, suite(cases), code, mode)
    assert_fail(out, "DETERMINISM")
    digests = out["detail"]["runDigests"]
    assert len(digests) == 2 and digests[0] != digests[1], out


def test_killing_or_throttling_the_runner_fails(workdir: Path, mode: dict[str, str]) -> None:
    """SIGKILL/SIGINT/SIGTERM/SIGSTOP to its parent, to pid 1 and to everyone, and prlimit on the
    runner: none reaches it; the code answers on and fails on its own answer."""
    code = (
        "import os, resource, signal\n"
        "hits = 0\n"
        "for target in (os.getppid(), 1, -1):\n"
        "    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGSTOP, signal.SIGKILL):\n"
        "        try:\n"
        "            os.kill(target, sig)\n"
        "        except OSError:\n"
        "            pass\n"
        "for res in (resource.RLIMIT_CPU, resource.RLIMIT_AS, resource.RLIMIT_NOFILE):\n"
        "    try:\n"
        "        resource.prlimit(1, res, (0, 0)); hits += 1\n"
        "    except OSError:\n"
        "        pass\n"
        "def solve(a, b):\n"
        "    return a + b if hits else -1\n"
    )
    out = verify(workdir, ADD, code, mode)
    assert_fail(out, "PUBLIC TESTS")
    assert out["detail"]["publicTests"] == "0/1", out


def test_no_sandbox_is_could_not_answer_but_a_killed_worker_is_a_fail(workdir: Path) -> None:
    """The two apart: a missing runner is ours (exit 3); the submission killing itself is a FAIL."""
    status, out, text = run_cli(
        ROOT_CLI, workdir, ADD, "def solve(a, b):\n    return a + b\n",
        {"ESCROWD_SANDBOX_URL": f"http://127.0.0.1:{free_port()}"},
    )  # fmt: skip
    assert status == EXIT_COULD_NOT_ANSWER and "unreachable" in out["error"], text
    code = "import os, signal\ndef solve(a, b):\n    os.kill(os.getpid(), signal.SIGKILL)\n"
    out = verify(workdir, ADD, code)
    assert_fail(out, "PUBLIC TESTS")


# ---------------------------------------------------------------------------- CPU that hides


def test_cpu_in_a_thread_of_an_orphaned_grandchild_is_counted(
    workdir: Path, cpu_mode: dict[str, str]
) -> None:
    """The issue's attack: 1.2 s of CPU in a second thread of a double-forked grandchild, timeLimitMs 300."""
    code = (
        "import os, threading, time\n"
        "def burn():\n"
        "    t = time.process_time()\n"
        "    while time.process_time() - t < 1.2:\n"
        "        pass\n"
        "    open('/tmp/done', 'w').close()\n"
        "def solve(a, b):\n"
        "    if os.fork() == 0:\n"
        "        if os.fork() == 0:\n"
        "            th = threading.Thread(target=burn); th.start(); th.join(); os._exit(0)\n"
        "        os._exit(0)\n"
        "    os.wait()\n"
        "    while not os.path.exists('/tmp/done'):\n"
        "        time.sleep(0.01)\n"
        "    return a + b\n"
    )
    out = verify(workdir, suite([([1, 2], 3)], timeLimitMs=300), code, cpu_mode)
    assert_fail(out, "RESOURCE LIMITS")
    assert "CPU time" in out["reasons"][0] and out["detail"]["measured"]["cpuMs"] > 300, out


def test_execution_result_cpu_measure_sees_the_hidden_cpu(
    workdir: Path, cpu_mode: dict[str, str]
) -> None:
    """`measure: cpu_ms` (lower is better) is the measured CPU of the whole run, not the main thread's."""
    code = (
        "import os, threading, time\n"
        "def burn():\n"
        "    t = time.process_time()\n"
        "    while time.process_time() - t < 0.6:\n"
        "        pass\n"
        "    open('/tmp/done', 'w').close()\n"
        "def solve(n):\n"
        "    if os.fork() == 0:\n"
        "        if os.fork() == 0:\n"
        "            th = threading.Thread(target=burn); th.start(); th.join(); os._exit(0)\n"
        "        os._exit(0)\n"
        "    os.wait()\n"
        "    while not os.path.exists('/tmp/done'):\n"
        "        time.sleep(0.01)\n"
        "    return n\n"
    )
    verifier = {
        "kind": "execution_result", "ref": "fast",
        "config": {"cases": [{"args": [1], "expected": 1}], "measure": "cpu_ms", "threshold": 200,
                   "direction": "min", "timeLimitMs": 5000},
    }  # fmt: skip
    out = verify(workdir, verifier, code, cpu_mode)
    assert out["passed"] is False and out["detail"]["result"] > 200, out


def test_cpu_in_short_lived_forks_is_counted(workdir: Path, cpu_mode: dict[str, str]) -> None:
    """Forty children of 30 ms each, each gone long before a poll could see much of it."""
    code = (
        "import os, time\n"
        "def solve(a, b):\n"
        "    for _ in range(40):\n"
        "        pid = os.fork()\n"
        "        if pid == 0:\n"
        "            t = time.process_time()\n"
        "            while time.process_time() - t < 0.03:\n"
        "                pass\n"
        "            os._exit(0)\n"
        "        os.waitpid(pid, 0)\n"
        "    return a + b\n"
    )
    out = verify(workdir, suite([([1, 2], 3)], timeLimitMs=300), code, cpu_mode)
    assert_fail(out, "RESOURCE LIMITS")
    assert "CPU time" in out["reasons"][0], out


def test_cpu_in_threads_is_counted(workdir: Path, cpu_mode: dict[str, str]) -> None:
    """Four threads of 0.3 s each, joined: the process's CPU, not the main thread's."""
    code = (
        "import threading, time\n"
        "def burn():\n"
        "    t = time.thread_time()\n"
        "    while time.thread_time() - t < 0.3:\n"
        "        pass\n"
        "def solve(a, b):\n"
        "    ts = [threading.Thread(target=burn) for _ in range(4)]\n"
        "    [t.start() for t in ts]; [t.join() for t in ts]\n"
        "    return a + b\n"
    )
    out = verify(workdir, suite([([1, 2], 3)], timeLimitMs=500), code, cpu_mode)
    assert_fail(out, "RESOURCE LIMITS")
    assert "CPU time" in out["reasons"][0], out


def test_cpu_in_children_nobody_reaps_is_counted(workdir: Path, cpu_mode: dict[str, str]) -> None:
    """A parent that would ignore SIGCHLD (its children then reaped by nobody, their time
    counted nowhere) is refused that; its unreaped children's CPU is counted either way."""
    code = (
        "import os, signal, time\n"
        "try:\n"
        "    signal.signal(signal.SIGCHLD, signal.SIG_IGN)\n"
        "except OSError:\n"
        "    pass\n"
        "def solve(a, b):\n"
        "    for _ in range(12):\n"
        "        if os.fork() == 0:\n"
        "            t = time.process_time()\n"
        "            while time.process_time() - t < 0.04:\n"
        "                pass\n"
        "            os._exit(0)\n"
        "        time.sleep(0.06)\n"
        "    return a + b\n"
    )
    out = verify(workdir, suite([([1, 2], 3)], timeLimitMs=300), code, cpu_mode)
    assert_fail(out, "RESOURCE LIMITS")
    assert "CPU time" in out["reasons"][0], out


def test_the_accounting_mode_is_recorded(workdir: Path) -> None:
    """The verdict's measurements say which mode counted them; `cgroup` where it cannot be had is ours."""
    for accounting in ("cgroup", "pidns"):
        out = verify(
            workdir,
            ADD,
            "def solve(a, b):\n    return a + b\n",
            {"ESCROWD_SANDBOX_ACCOUNTING": accounting},
        )
        assert out["passed"] is True and out["detail"]["measured"]["accounting"] == accounting, out


# ---------------------------------------------------------------------------- memory that hides


def test_memory_in_tmpfs_is_bounded_and_counted(workdir: Path, mode: dict[str, str]) -> None:
    """The issue's attack: 400 MiB written to /tmp under memoryMb 64."""
    code = (
        "def solve(a, b):\n"
        "    for i in range(400):\n"
        "        with open(f'/tmp/f{i}', 'wb') as f:\n"
        "            f.write(b'x' * (1024 * 1024 - 1))\n"
        "    return a + b\n"
    )
    out = verify(workdir, suite([([1, 2], 3)], memoryMb=64, timeLimitMs=10_000), code, mode)
    assert_fail(out, "RESOURCE LIMITS")
    assert "memory" in out["reasons"][0], out


def test_memory_in_shared_mappings_is_counted(workdir: Path) -> None:
    """Shared anonymous mappings spread over children (each under the address-space limit) count."""
    code = (
        "import mmap, os, time\n"
        "def solve(a, b):\n"
        "    for _ in range(4):\n"
        "        if os.fork() == 0:\n"
        "            m = mmap.mmap(-1, 30 * 1024 * 1024, flags=mmap.MAP_SHARED)\n"
        "            m.write(b'x' * len(m))\n"
        "            time.sleep(20); os._exit(0)\n"
        "    time.sleep(20)\n"
        "    return a + b\n"
    )
    out = verify(workdir, suite([([1, 2], 3)], memoryMb=64, timeLimitMs=20_000), code)
    assert_fail(out, "RESOURCE LIMITS")
    assert "memory" in out["reasons"][0], out


def test_memory_in_dev_shm_is_bounded_and_counted(workdir: Path) -> None:
    """/dev/shm (POSIX shared memory's home) is a sized tmpfs whose pages count like /tmp's."""
    code = (
        "def solve(a, b):\n"
        "    for i in range(200):\n"
        "        with open(f'/dev/shm/f{i}', 'wb') as f:\n"
        "            f.write(b'x' * (1024 * 1024 - 1))\n"
        "    return a + b\n"
    )
    out = verify(workdir, suite([([1, 2], 3)], memoryMb=64, timeLimitMs=10_000), code)
    assert_fail(out, "RESOURCE LIMITS")
    assert "memory" in out["reasons"][0], out


def test_memory_no_process_maps_is_refused(workdir: Path) -> None:
    """The root and /dev are read-only; memfd_create and SysV shmget are refused: no pages held unseen."""
    code = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "def solve(a, b):\n"
        "    held = 0\n"
        "    for path in ('/x', '/dev/x', '/usr/lib/x'):\n"
        "        try:\n"
        "            with open(path, 'wb') as f: f.write(b'x' * 4096); held += 1\n"
        "        except OSError:\n"
        "            pass\n"
        "    try:\n"
        "        fd = os.memfd_create('x'); os.write(fd, b'x' * 4096); held += 1\n"
        "    except OSError:\n"
        "        pass\n"
        "    if libc.syscall(29, 0, 1 << 20, 0o1000 | 0o600) >= 0:\n"
        "        held += 1\n"
        "    return a + b if held else -1\n"
    )
    out = verify(workdir, ADD, code)
    assert_fail(out, "PUBLIC TESTS")


# ---------------------------------------------------------------------------- flooding


def test_output_flood_on_every_descriptor_fails(workdir: Path) -> None:
    """Megabytes on stdout, stderr and every descriptor it can write, then the right answer."""
    code = (
        "import os\n"
        "def solve(a, b):\n"
        '    junk = b\'{"event": "case", "ok": true, "value": 3}\\n\' * 200000\n'
        "    for fd in range(64):\n"
        "        try:\n"
        "            os.write(fd, junk)\n"
        "        except OSError:\n"
        "            pass\n"
        "    return a + b\n"
    )
    out = verify(workdir, ADD, code)
    assert out["passed"] is False, out
    # Which case the flood breaks first depends on when its lines reach the runner (the public
    # case's answer is the flood's own spoofed value, 3, so it may stand; two runs broken at
    # different cases disagree): a FAIL at a stage that judges the code, never "could not
    # answer" (checked by `verify`) and never a PASS.
    assert out["detail"]["stage"] in ("PUBLIC TESTS", "HIDDEN TESTS", "RESOURCE LIMITS", "DETERMINISM"), out


def test_deeply_nested_lines_for_the_runner_fail(workdir: Path) -> None:
    """200,000 nested brackets on every descriptor (the runner parses the worker's lines): a FAIL."""
    code = (
        "import os\n"
        "def solve(a, b):\n"
        "    deep = b'[' * 200000 + b'\\n' + b'{\"event\": \"case\", \"ok\": true, \"value\": ' + b'[' * 100000 + b'\\n'\n"
        "    for fd in range(64):\n"
        "        try:\n"
        "            os.write(fd, deep)\n"
        "        except OSError:\n"
        "            pass\n"
        "    return -1\n"
    )
    out = verify(workdir, ADD, code)
    assert_fail(out, "PUBLIC TESTS")


def test_huge_return_value_fails(workdir: Path) -> None:
    """A 20 MB answer per case overruns the report bound: a FAIL, not a stalled or unanswered run."""
    code = "def solve(a, b):\n    return 'x' * (20 * 1024 * 1024)\n"
    out = verify(workdir, suite([([1, 2], 3)], memoryMb=256), code)
    assert_fail(out, "PUBLIC TESTS")


def test_disk_flood_fails(workdir: Path) -> None:
    """Files in /tmp until the disk is full (and one past the file-size limit): bounded, a FAIL."""
    code = (
        "import os\n"
        "def solve(a, b):\n"
        "    try:\n"
        "        open('/tmp/big', 'wb').write(b'x' * (8 << 20))\n"
        "    except OSError:\n"
        "        pass\n"
        "    i = 0\n"
        "    while True:\n"
        "        try:\n"
        "            with open(f'/tmp/small{i}', 'wb') as f:\n"
        "                f.write(b'x' * 65536)\n"
        "        except OSError:\n"
        "            return a + b\n"
        "        i += 1\n"
    )
    out = verify(workdir, suite([([1, 2], 3)], memoryMb=48, timeLimitMs=20_000), code)
    assert_fail(out, "RESOURCE LIMITS")


# ---------------------------------------------------------------------------- hidden stays hidden

SEARCH = r"""
import gc, os, re, select, sys
# The hidden input's shape, spelt so that this source itself does not match it.
MARK = re.compile("hid" + "den-[0-9a-f]{16}")
def look():
    seen = []
    f = sys._getframe()
    while f is not None:
        seen.append(repr(f.f_locals)); seen.append(repr(f.f_globals)); f = f.f_back
    for o in gc.get_objects():
        try:
            seen.append(repr(o)[:10000])
        except Exception:
            pass
    seen.append(repr(dict(os.environ)))
    for pid in ["self", "1"] + [p for p in os.listdir("/proc") if p.isdigit()]:
        for name in ("environ", "cmdline", "maps", "status", "stat", "mem", "io", "cwd", "root"):
            try:
                with open(f"/proc/{pid}/{name}", "rb") as fh:
                    seen.append(fh.read(1 << 20).decode("latin-1"))
            except OSError:
                pass
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    with open(f"/proc/{pid}/fd/{fd}", "rb") as fh:
                        os.set_blocking(fh.fileno(), False)
                        seen.append((fh.read(1 << 20) or b"").decode("latin-1"))
                except (OSError, TypeError):
                    pass
        except OSError:
            pass
    # Every descriptor it holds, read when something is waiting there (the worker's own job
    # pipe included; its blocking mode is left alone, or the worker would starve itself).
    for fd in range(64):
        try:
            if select.select([fd], [], [], 0)[0]:
                seen.append(os.read(fd, 1 << 20).decode("latin-1"))
        except (OSError, ValueError):
            pass
    for root, dirs, files in os.walk("/tmp"):
        for n in files:
            try:
                seen.append(open(os.path.join(root, n), "rb").read().decode("latin-1"))
            except OSError:
                pass
    return [m.group(0) for s in seen for m in [MARK.search(s)] if m]
FOUND = look()
if FOUND:
    raise RuntimeError("found " + " ".join(FOUND))
"""


def test_hidden_inputs_are_not_in_reach_before_the_public_stage(
    workdir: Path, mode: dict[str, str]
) -> None:
    """At import and during the public case the code searches frames, gc, /proc/self, /proc/1 (the
    runner), every descriptor, /tmp and the environment for the hidden inputs: it finds none."""
    secret = "hidden-" + secrets.token_hex(8)
    code = SEARCH + (
        "def solve(x):\n"
        "    found = look()\n"
        "    if x == 'public' and found:\n"
        "        return 'found ' + ' '.join(found)\n"
        "    return x.upper()\n"
    )
    verifier = suite([(["public"], "PUBLIC")], [([secret], secret.upper())])
    out = verify(workdir, verifier, code, mode)
    # Nothing was found at import or in the public stage; the hidden case itself then passes.
    assert out["passed"] is True, out
    assert secret not in out["_text"]


def test_hidden_stage_failures_carry_no_data_out(workdir: Path, mode: dict[str, str]) -> None:
    """In the hidden stage the code tries to carry its input out: in an exception's class name and
    message, its exit status, a signal's number, a stalled run: the verdict shows counts only."""
    secret = "hidden-" + secrets.token_hex(8)
    code = (
        "import os, signal, time\n"
        "def solve(x, how):\n"
        "    if x == 'public':\n"
        "        return 'PUBLIC'\n"
        "    if how == 'class':\n"
        "        raise type('Leak_' + x.replace('-', '_'), (Exception,), {})(x)\n"
        "    if how == 'exit':\n"
        "        os._exit(int(x[-2:], 16))\n"
        "    if how == 'signal':\n"
        "        os.kill(os.getpid(), 1 + int(x[-1], 16))\n"
        "    if how == 'value':\n"
        "        return x * 3\n"
        "    return x\n"
    )
    for how in ("class", "exit", "signal", "value"):
        verifier = suite([(["public", how], "PUBLIC")], [([secret, how], secret.upper())])
        out = verify(workdir, verifier, code, mode)
        assert_fail(out, "HIDDEN TESTS")
        assert out["detail"]["publicTests"] == "1/1" and out["detail"]["hiddenTests"] == "0/1", out
        assert secret not in out["_text"], (how, out["_text"])
        reason = out["reasons"][0]
        shape = r"TEST_SUITE: HIDDEN TESTS(: crashed| 0/1( \(errors: (?P<names>[A-Za-z, ]+)\))?)"
        match = re.fullmatch(shape, reason)
        assert match is not None and "Leak" not in reason, (how, reason)
        assert all(name in BUILTIN_ERRORS for name in (match["names"] or "Exception").split(", "))


def test_load_error_text_reaches_the_agent_only_before_any_case(workdir: Path) -> None:
    """A load error is the agent's own text (no case was in the sandbox yet), so it is shown."""
    code = "raise ValueError('my own message')\n"
    out = verify(workdir, ADD, code)
    assert_fail(out, "ISOLATE")
    assert "my own message" in out["reasons"][0]
