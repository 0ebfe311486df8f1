"""Hostile submissions against `escrowd verify run` (a real CLI process), as root and as a non-root uid.

Each attack's `solve` returns the right answer only if the attack worked, so a FAIL with the
cases counted proves the code ran to the end and the attack failed; side effects are looked
for on the host after the run. The non-root runner is the same CLI started with uid/gid
65534 (the test process runs as root), from a world-readable copy of the interpreter.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from verification.sandbox import _readable_by_others, host_runtime, stage_runtime

pytestmark = pytest.mark.timeout(600)

NOBODY = 65534
REPO = Path(__file__).resolve().parents[2]
SITE = next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix))
EXIT_COULD_NOT_ANSWER = 3


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    """A world-readable directory for the verifier and result files (both runners read them)."""
    path = Path(tempfile.mkdtemp(prefix="escrowd-hostile-"))
    path.chmod(0o755)
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


@pytest.fixture(scope="module", params=["root", "nonroot"])
def runner(request: pytest.FixtureRequest) -> dict[str, Any]:
    """How to start the CLI: as this (root) process, or as uid 65534 with a readable interpreter."""
    if request.param == "root":
        if os.geteuid() != 0:
            pytest.skip("the suite runs as root on this machine kind")
        return {"argv": [sys.executable, "-m", "escrowd.cli"], "env": {}, "user": None}
    if os.geteuid() != 0:
        # Already unprivileged: the plain CLI is the non-root runner.
        return {"argv": [sys.executable, "-m", "escrowd.cli"], "env": {}, "user": None}
    staged = stage_runtime(host_runtime(), Path(tempfile.gettempdir()))
    site, repo = readable_copy(Path(SITE), "site"), readable_copy(REPO, "repo", PACKAGES)
    python = staged.source / staged.executable.relative_to(staged.prefix)
    env = {}
    if staged.libraries:
        env["LD_LIBRARY_PATH"] = str(
            staged.source / staged.libraries[0].parent.relative_to(staged.prefix)
        )
    boot = (
        "import site, sys; site.addsitedir(sys.argv.pop(1)); sys.path.insert(0, sys.argv.pop(1));"
        " sys.argv[0] = 'escrowd'; from escrowd.cli import main; sys.exit(main())"
    )
    return {"argv": [str(python), "-c", boot, str(site), str(repo)], "env": env, "user": NOBODY}


PACKAGES = ("escrowd", "relayer", "schemas", "indexer")


def readable_copy(path: Path, tag: str, only: tuple[str, ...] = ()) -> Path:
    """`path` itself when uid 65534 can read it, else a hard-linked (or copied) world-readable mirror."""
    if _readable_by_others(path):
        return path
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    mirror = Path(tempfile.gettempdir()) / f"escrowd-nonroot-{tag}-{digest}"
    if not mirror.exists():
        building = Path(tempfile.mkdtemp(prefix=mirror.name + "."))
        for item in [path / name for name in only] if only else sorted(path.iterdir()):
            if subprocess.run(["cp", "-al", str(item), str(building)], check=False).returncode != 0:
                subprocess.run(["cp", "-a", str(item), str(building)], check=True)
        # Directories only: the files are hard links, and their modes are the originals' too.
        subprocess.run(
            ["find", str(building), "-type", "d", "-exec", "chmod", "755", "{}", "+"], check=True
        )
        try:
            building.rename(mirror)
        except OSError:  # another test process (a parallel worker) built it first
            subprocess.run(["rm", "-rf", str(building)], check=False)
    return mirror


def run_cli(
    runner: dict[str, Any],
    workdir: Path,
    verifier: dict[str, Any],
    code: str,
    extra_env: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any], str]:
    """`escrowd verify run` on `code`; (exit status, parsed stdout, stdout + stderr)."""
    token = secrets.token_hex(4)
    vfile, rfile = workdir / f"v-{token}.json", workdir / f"r-{token}.json"
    vfile.write_text(json.dumps(verifier))
    rfile.write_text(json.dumps({"output": code}))
    for f in (vfile, rfile):
        f.chmod(0o644)
    env = {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": "/nonexistent",
        **runner["env"],
        **(extra_env or {}),
    }
    user = runner["user"]
    proc = subprocess.run(
        [*runner["argv"], "verify", "run", "--verifier", str(vfile), "--result", str(rfile)],
        capture_output=True, text=True, env=env, cwd="/", timeout=540,
        **({"user": user, "group": user, "extra_groups": []} if user is not None else {}),
    )  # fmt: skip
    try:
        out = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else {}
    except ValueError:
        out = {}
    return proc.returncode, out, proc.stdout + proc.stderr


def suite(
    public: list[tuple[list[Any], Any]], hidden: list[tuple[list[Any], Any]] = (), **limits: Any
) -> dict[str, Any]:  # type: ignore[assignment]
    config: dict[str, Any] = {
        "publicTests": [{"args": a, "expected": e} for a, e in public],
        "hiddenTests": [{"args": a, "expected": e} for a, e in hidden],
        "timeLimitMs": 2000,
        "memoryMb": 128,
    }
    config.update(limits)
    return {"kind": "test_suite", "ref": "TEST_SUITE://V1", "config": config}


ADD = suite([([1, 2], 3)], [([10, 5], 15)])


def assert_attack_failed(status: int, out: dict[str, Any], text: str) -> None:
    assert status == 0, text
    assert out["passed"] is False and out["reward"] == 0.0, out
    # The code ran to the end and answered wrongly: the attack, not a crash, decided.
    assert out["detail"]["stage"] == "PUBLIC TESTS" and out["detail"]["publicTests"] == "0/1", out


def alive_with_name(name: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if Path(f"/proc/{entry}/comm").read_text().strip() == name:
                    found.append(int(entry))
            except OSError:
                continue
    return found


# ---------------------------------------------------------------------------- the attacks


def test_legitimate_stdlib_solution_passes(runner: dict[str, Any], workdir: Path) -> None:
    """math, heapq, fractions and statistics import and work; the verdict carries the measurements."""
    code = (
        "import math, heapq, fractions, statistics, collections, itertools, functools, re, json\n"
        "def solve(a, b):\n"
        "    h = [a, b]; heapq.heapify(h)\n"
        "    return int(statistics.fsum(h) + math.floor(fractions.Fraction(1, 3)))\n"
    )
    status, out, text = run_cli(runner, workdir, ADD, code)
    assert status == 0 and out["passed"] is True, text
    assert out["detail"]["resourceLimits"] == "PASS" and out["detail"]["measured"]["runs"] == 2


def test_reading_every_proc_environ_finds_no_secret(runner: dict[str, Any], workdir: Path) -> None:
    """The parent's environment (a fake database password) is in no /proc/*/environ or cmdline it can read."""
    secret = "hunter2-" + secrets.token_hex(8)
    code = (
        "import os\n"
        "def solve(a, b):\n"
        "    seen = b''\n"
        "    for pid in os.listdir('/proc'):\n"
        "        for name in ('environ', 'cmdline'):\n"
        "            try:\n"
        "                seen += open(f'/proc/{pid}/{name}', 'rb').read()\n"
        "            except OSError:\n"
        "                pass\n"
        "    seen += repr(dict(os.environ)).encode()\n"
        "    return a + b if b'hunter2' in seen or b'ESCROWD_' in seen else -1\n"
    )
    env = {
        "ESCROWD_DATABASE_URL": f"postgresql://app:{secret}@db/escrow",
        "ESCROWD_KEYSTORE_PASSWORD": secret,
    }
    status, out, text = run_cli(runner, workdir, ADD, code, env)
    assert_attack_failed(status, out, text)
    assert secret not in text


def test_host_files_and_same_uid_secret_are_out_of_reach(
    runner: dict[str, Any], workdir: Path
) -> None:
    """/etc/passwd, the host's directories and a secret file owned by the runner's uid cannot be read."""
    secret_dir = Path(tempfile.mkdtemp(prefix="escrowd-secret-"))
    secret_dir.chmod(0o755)
    secret = secret_dir / "keystore.password"
    secret.write_text("s3cret")
    secret.chmod(0o600)
    if runner["user"] is not None:
        os.chown(secret, runner["user"], runner["user"])
    try:
        code = (
            "import os\n"
            "def solve(a, b):\n"
            "    got = []\n"
            f"    for path in ('/etc/passwd', {str(secret)!r}, '/root/.bashrc'):\n"
            "        try:\n"
            "            got.append(open(path).read())\n"
            "        except OSError:\n"
            "            pass\n"
            "    for d in ('/home', '/work', '/etc', '/var', '/root/.ssh', '/run'):\n"
            "        try:\n"
            "            got.extend(os.listdir(d))\n"
            "        except OSError:\n"
            "            pass\n"
            "    return a + b if got else -1\n"
        )
        status, out, text = run_cli(runner, workdir, ADD, code)
        assert_attack_failed(status, out, text)
        assert "s3cret" not in text
    finally:
        subprocess.run(["rm", "-rf", str(secret_dir)], check=False)


def test_tcp_connection_out_is_impossible(runner: dict[str, Any], workdir: Path) -> None:
    """A listener on the host's loopback gets no connection from the sandbox."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        server.setblocking(False)
        port = server.getsockname()[1]
        code = (
            "import socket\n"
            "def solve(a, b):\n"
            "    for host in ('127.0.0.1', '10.0.2.2', '8.8.8.8'):\n"
            "        try:\n"
            f"            socket.create_connection((host, {port}), timeout=0.2).close()\n"
            "            return a + b\n"
            "        except OSError:\n"
            "            pass\n"
            "    return -1\n"
        )
        status, out, text = run_cli(runner, workdir, ADD, code)
        assert_attack_failed(status, out, text)
        with pytest.raises(BlockingIOError):
            server.accept()


def test_unix_socket_connection_is_impossible(runner: dict[str, Any], workdir: Path) -> None:
    """A filesystem Unix socket of the host (world-writable) and abstract sockets are unreachable."""
    sock_dir = Path(tempfile.mkdtemp(prefix="escrowd-sock-"))
    sock_dir.chmod(0o777)
    path = sock_dir / "service.sock"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        path.chmod(0o777)
        server.listen(8)
        server.setblocking(False)
        try:
            code = (
                "import socket\n"
                "def solve(a, b):\n"
                f"    for target in ({str(path)!r}, '\\0escrowd-abstract'):\n"
                "        try:\n"
                "            s = socket.socket(socket.AF_UNIX); s.connect(target); s.close()\n"
                "            return a + b\n"
                "        except OSError:\n"
                "            pass\n"
                "    return -1\n"
            )
            status, out, text = run_cli(runner, workdir, ADD, code)
            assert_attack_failed(status, out, text)
            with pytest.raises(BlockingIOError):
                server.accept()
        finally:
            subprocess.run(["rm", "-rf", str(sock_dir)], check=False)


def test_writes_to_tmp_and_dev_shm_stay_inside(runner: dict[str, Any], workdir: Path) -> None:
    """Files written to /tmp and /dev/shm inside the sandbox never appear on the host."""
    name = "escrowd-probe-" + secrets.token_hex(6)
    code = (
        "def solve(a, b):\n"
        f"    for path in ('/tmp/{name}', '/dev/shm/{name}', '/{name}', '/usr/lib/{name}'):\n"
        "        try:\n"
        "            open(path, 'w').write('x')\n"
        "        except OSError:\n"
        "            pass\n"
        "    return -1\n"
    )
    status, out, text = run_cli(runner, workdir, ADD, code)
    assert status == 0 and out["passed"] is False, text
    for host_path in (f"/tmp/{name}", f"/dev/shm/{name}", f"/{name}", f"/usr/lib/{name}"):
        assert not os.path.exists(host_path), host_path


def test_detached_grandchildren_do_not_outlive_the_run(
    runner: dict[str, Any], workdir: Path
) -> None:
    """Double-forked, setsid'd children are alive during the run and gone when the CLI returns."""
    name = "esc" + secrets.token_hex(5)
    code = (
        "import ctypes, os, time\n"
        "def solve(a, b):\n"
        "    for _ in range(3):\n"
        "        if os.fork() == 0:\n"
        "            os.setsid()\n"
        "            if os.fork() == 0:\n"
        f"                ctypes.CDLL(None).prctl(15, {name.encode()!r}, 0, 0, 0)\n"
        "                while True:\n"
        "                    time.sleep(0.05)\n"
        "            os._exit(0)\n"
        "    time.sleep(1.0)\n"
        "    return -1\n"
    )
    vfile = suite([([1, 2], 3)])
    token = secrets.token_hex(4)
    (workdir / f"v-{token}.json").write_text(json.dumps(vfile))
    (workdir / f"r-{token}.json").write_text(json.dumps({"output": code}))
    for f in workdir.glob(f"*-{token}.json"):
        f.chmod(0o644)
    user = runner["user"]
    proc = subprocess.Popen(
        [*runner["argv"], "verify", "run", "--verifier", str(workdir / f"v-{token}.json"),
         "--result", str(workdir / f"r-{token}.json")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", **runner["env"]},
        **({"user": user, "group": user, "extra_groups": []} if user is not None else {}),
    )  # fmt: skip
    seen_alive = False
    while proc.poll() is None:
        seen_alive = seen_alive or bool(alive_with_name(name))
        time.sleep(0.01)
    stdout, stderr = proc.communicate()
    assert proc.returncode == 0, stdout + stderr
    assert json.loads(stdout.strip().splitlines()[-1])["passed"] is False
    assert seen_alive, "the grandchildren never started: the test proved nothing"
    assert alive_with_name(name) == []


def test_fork_bomb_is_bounded(runner: dict[str, Any], workdir: Path) -> None:
    """An endless fork loop ends as a FAIL (process limit / CPU), and nothing of it survives."""
    name = "esc" + secrets.token_hex(5)
    code = (
        "import ctypes, os\n"
        "def solve(a, b):\n"
        f"    ctypes.CDLL(None).prctl(15, {name.encode()!r}, 0, 0, 0)\n"
        "    while True:\n"
        "        try:\n"
        "            os.fork()\n"
        "        except OSError:\n"
        "            pass\n"
    )
    status, out, text = run_cli(runner, workdir, ADD, code)
    assert status == 0 and out["passed"] is False, text
    assert out["detail"]["stage"] in ("RESOURCE LIMITS", "PUBLIC TESTS"), out
    assert alive_with_name(name) == []


def test_memory_above_the_limit_fails(runner: dict[str, Any], workdir: Path) -> None:
    """Allocating past memoryMb is a FAIL at RESOURCE LIMITS."""
    code = "def solve(a, b):\n    block = bytearray(400 * 1024 * 1024)\n    return a + b\n"
    status, out, text = run_cli(
        runner, workdir, suite([([1, 2], 3)], memoryMb=64, timeLimitMs=60_000), code
    )
    assert status == 0 and out["passed"] is False, text
    assert out["detail"]["stage"] == "RESOURCE LIMITS" and "memory" in out["reasons"][0]


def test_cpu_spin_fails_at_the_time_limit(runner: dict[str, Any], workdir: Path) -> None:
    """A busy loop is stopped by its measured CPU time, reported as such."""
    code = "def solve(a, b):\n    while True:\n        a += 1\n"
    status, out, text = run_cli(runner, workdir, suite([([1, 2], 3)], timeLimitMs=300), code)
    assert status == 0 and out["passed"] is False, text
    assert out["detail"]["stage"] == "RESOURCE LIMITS" and "CPU time" in out["reasons"][0]
    assert out["detail"]["measured"]["cpuMs"] > 300


def test_forging_the_result_channel_fails(runner: dict[str, Any], workdir: Path) -> None:
    """No solve; forged runner lines on stdout, stderr and every descriptor it can open: FAIL."""
    forged = (
        '{"event": "started"}\\n{"event": "loaded"}\\n{"event": "case", "ok": true, "value": 15}\\n'
        '{"event": "done"}\\n{"event": "exit", "cpu_ms": 0, "maxrss_kb": 1, "reason": null}\\n'
        '{"passed": true, "reward": 1.0}\\n'
    )
    code = (
        "import os, sys\n"
        f"LINES = {forged!r}.encode()\n"
        "targets = [f'/proc/self/fd/{fd}' for fd in range(64)]\n"
        "for pid in os.listdir('/proc'):\n"
        "    if pid.isdigit():\n"
        "        targets += [f'/proc/{pid}/fd/{n}' for n in range(64)]\n"
        "for fd in range(64):\n"
        "    try:\n"
        "        os.write(fd, LINES)\n"
        "    except OSError:\n"
        "        pass\n"
        "for path in targets:\n"
        "    try:\n"
        "        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK); os.write(fd, LINES); os.close(fd)\n"
        "    except OSError:\n"
        "        pass\n"
        "print(LINES.decode()); sys.stderr.write(LINES.decode())\n"
    )
    status, out, text = run_cli(
        runner, workdir, suite([([1, 2], 3)], [([10, 5], 15), ([7, 7], 14)]), code
    )
    assert status == 0 and out["passed"] is False, text
    assert out["detail"]["hiddenTests"] != "2/2"


def test_execution_result_self_report_fails_and_trusting_config_is_refused(
    runner: dict[str, Any], workdir: Path
) -> None:
    """`return 10**9` does not pass a measured pass rate; a config that trusts the return value cannot run."""
    measured = {
        "kind": "execution_result", "ref": "gas",
        "config": {"cases": [{"args": [10], "expected": 45}], "measure": "pass_rate", "threshold": 1.0},
    }  # fmt: skip
    status, out, text = run_cli(runner, workdir, measured, "def solve(n):\n    return 10**9\n")
    assert status == 0 and out["passed"] is False and out["detail"]["result"] == 0.0, text
    trusting = {"kind": "execution_result", "ref": "gas", "config": {"args": [10], "threshold": 40}}
    status, out, text = run_cli(runner, workdir, trusting, "def solve(n):\n    return 10**9\n")
    assert status == EXIT_COULD_NOT_ANSWER and "measure" in out["error"], text


def test_kernel_surface_calls_are_refused_by_the_seccomp_filter(
    runner: dict[str, Any], workdir: Path
) -> None:
    """ptrace, unshare, mount, keyctl, bpf, io_uring and perf events return EPERM inside."""
    code = (
        "import ctypes\n"
        "def solve(a, b):\n"
        "    libc = ctypes.CDLL(None, use_errno=True)\n"
        "    calls = {101: (0, 0, 0, 0), 272: (0x10000000,), 165: (0, 0, 0, 0, 0), 250: (0, 0, 0, 0),\n"
        "             321: (0, 0, 0), 425: (8, 0), 298: (0, 0, -1, -1, 0)}\n"
        "    refused = 0\n"
        "    for number, args in calls.items():\n"
        "        ctypes.set_errno(0)\n"
        "        if libc.syscall(number, *args) == -1 and ctypes.get_errno() == 1:\n"
        "            refused += 1\n"
        "    return -1 if refused == len(calls) else a + b\n"
    )
    status, out, text = run_cli(runner, workdir, ADD, code)
    assert_attack_failed(status, out, text)


def test_without_user_namespaces_the_run_fails_closed(workdir: Path) -> None:
    """Where user namespaces are refused, `verify run` cannot answer (exit 3): it never runs the code unsandboxed."""
    # The CLI runs in a user namespace that may create no further ones (as Docker's default
    # seccomp profile or user.max_user_namespaces=0 would have it).
    helper = (
        "import ctypes, os, sys\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "assert libc.unshare(0x10000000) == 0, ctypes.get_errno()\n"
        "open('/proc/sys/user/max_user_namespaces', 'w').write('0')\n"
        "os.execv(sys.executable, [sys.executable, '-m', 'escrowd.cli', *sys.argv[1:]])\n"
    )
    marker = workdir / f"ran-{secrets.token_hex(4)}"
    code = (
        f"def solve(a, b):\n    open({str(marker)!r}, 'w').write('unsandboxed')\n    return a + b\n"
    )
    token = secrets.token_hex(4)
    vfile, rfile = workdir / f"v-{token}.json", workdir / f"r-{token}.json"
    vfile.write_text(json.dumps(ADD))
    rfile.write_text(json.dumps({"output": code}))
    proc = subprocess.run(
        [sys.executable, "-c", helper, "verify", "run", "--verifier", str(vfile), "--result", str(rfile)],
        capture_output=True, text=True, timeout=300, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
    )  # fmt: skip
    assert proc.returncode == EXIT_COULD_NOT_ANSWER, proc.stdout + proc.stderr
    assert "did not start" in json.loads(proc.stdout)["error"]
    assert not marker.exists()
