"""The harness that runs inside the bubblewrap sandbox (its source is executed by `python -c`).

It imports nothing of the project: `verification.sandbox` reads this file's text and runs it
with the sandboxed interpreter as the sandbox's **pid 1** (`bwrap --as-pid-1`). Protocol:

* argv: `fd` of the result channel (a pipe to the host), the limits as JSON;
* stdin, one JSON line at a time from the host: first `{"source", "entrypoint"}`; then, each
  only when the host asks for it, `{"cases": [...]}` (a stage's arguments, never expected
  values) or `{"end": true}`; at any time `{"stop": "time"}` when the host's own accounting
  (the run's cgroup) saw a limit passed;
* the result channel receives JSON lines written only by this process: `started`, then
  `compile_error` / `load_error` / `loaded`, for each stage its `case` lines (ok, value or
  error class) and `stage_done`, and last `exit` with the measured CPU time, peak memory and
  why the worker stopped (and this process's own CPU since the code arrived, which the host
  subtracts from the run's cgroup).

The host sends a stage's cases only after the submission has loaded and, for every stage
after the first, only after it has judged the stage before: cases the code has not reached
(the hidden ones while it loads or runs the public ones) are nowhere in the sandbox.

Out of the submission's reach: the submitted code runs in a forked *worker* that closed the
result channel before it loaded anything. This process is the pid namespace's init, so the
kernel drops every signal sent to it from inside the namespace (it installs no handler),
`SIGKILL` included; it is non-dumpable, so the worker can neither ptrace it (also refused by
seccomp) nor open its memory or descriptors through `/proc/1`; and the seccomp filter refuses
`prlimit64` on any process but the caller, so its limits cannot be lowered under it.

Measured, over *every* thread of *every* process of the run (the namespace's init is the
reaper of every orphan, so nothing escapes by double-forking):

* CPU: the kernel's own totals. Live processes are read from `/proc/<pid>/stat` (user +
  system time of the whole thread group, dead threads included, plus the children it
  reaped); processes that ended were reaped either by a live process (in its children's
  time) or by this init (in its `RUSAGE_CHILDREN`). At the end everything is killed and
  reaped here, so the final figure is `RUSAGE_CHILDREN`, exact. A process can also be
  reaped by nobody (its parent ignores `SIGCHLD`): its time is seen only while it is
  alive, at each poll (see docs/security.md).
* Memory: the anonymous and shared-memory resident pages of every process (proportional
  set size: a copy-on-write page shared by a fork counts once), plus the pages
  and inodes used on every writable mount (`/tmp` and `/dev/shm`, tmpfs with a size limit each), against
  `memoryMb`; the address-space rlimit also makes a single process's allocations past the
  limit fail.
* Blocked time: wall time minus the time threads spent running or waiting for a CPU on the
  run queue (summed over every thread seen, from `/proc/<pid>/task/<tid>/schedstat`), so
  load on the host never counts against the submission; time spent waiting for the host
  between stages is not counted either.
"""

import contextlib
import json
import os
import resource
import select
import signal
import sys
import time
from typing import Any

POLL_SECONDS = 0.02
MAX_REPORT = 8 * 1024 * 1024
MAX_HOST_LINE = 64 * 1024 * 1024
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
INODE_BYTES = 1024
"""What one inode on a writable mount is charged (kernel memory no page count shows)."""
WRITABLE_MOUNTS = ("/tmp", "/dev/shm")
MAX_THREADS_TRACKED = 100_000
WALL = 0x40000000
"""`__WALL`: reap children whatever signal they asked for at exit (clone's exit_signal)."""


def _thread_schedstats(pid: int) -> list[tuple[int, int, int]]:
    """(tid, time on a CPU, time waiting for one) for each live thread of `pid`, in ns."""
    found = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            stat = _schedstat_path(f"/proc/{pid}/task/{tid}/schedstat")
            if stat is not None:
                found.append((int(tid), *stat))
    return found


def _schedstat_path(path: str) -> tuple[int, int] | None:
    try:
        with open(path) as f:
            cpu, wait, _ = f.read().split()
        return int(cpu), int(wait)
    except (OSError, ValueError):
        return None


def _process_cpu_ns(pid: int) -> int:
    """User + system time of the whole thread group and of the children it reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
        return ticks * 1_000_000_000 // CLOCK_TICKS
    except (OSError, ValueError, IndexError):
        return 0


def _private_bytes(pid: int) -> int:
    """Proportional anonymous + shared-memory resident bytes (copy-on-write pages split among
    the processes sharing them, shared libraries' file pages excluded).

    A process that made itself non-dumpable hides `smaps_rollup`: its whole anonymous and
    shared resident set from `status` is counted instead (shared pages then count in full).
    """
    for name, keys in (
        ("smaps_rollup", ("Pss_Anon:", "Pss_Shmem:")),
        ("status", ("RssAnon:", "RssShmem:")),
    ):
        total = 0
        try:
            with open(f"/proc/{pid}/{name}") as f:
                for line in f:
                    if line.startswith(keys):
                        total += int(line.split()[1]) * 1024
            return total
        except PermissionError:
            continue
        except (OSError, ValueError, IndexError):
            return 0
    return 0


def _mount_bytes() -> int:
    total = 0
    for path in WRITABLE_MOUNTS:
        with contextlib.suppress(OSError):
            st = os.statvfs(path)
            total += (st.f_blocks - st.f_bfree) * st.f_frsize
            total += (st.f_files - st.f_ffree) * INODE_BYTES
    return total


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit() and name != "1"]


def _children_cpu_ns() -> int:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return int((ru.ru_utime + ru.ru_stime) * 1e9)


def _worker(limits: dict[str, Any], job_fd: int, value_fd: int) -> None:
    mem = limits["memory_bytes"]
    cpu = limits["cpu_seconds"]
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    # SIGXCPU at the soft limit (reported as a time limit), SIGKILL a second later.
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["max_processes"], limits["max_processes"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"], limits["file_bytes"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits["open_files"], limits["open_files"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    jobs = os.fdopen(job_fd, "rb")
    out = os.fdopen(value_fd, "w", buffering=1)
    # Preallocated: after a MemoryError there may be no room to build this text.
    oom = '{"event": "memory"}\n'
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    job = json.loads(jobs.readline())
    namespace: dict[str, Any] = {"__name__": "solution"}
    failed_as = "compile_error"  # then "load_error" once the code compiled
    try:
        code = compile(job.pop("source"), "solution.py", "exec")
        failed_as = "load_error"
        exec(code, namespace)
    except MemoryError:
        out.write(oom)
        return
    except BaseException as exc:
        error = (type(exc).__name__ + ": " + str(exc))[:300]
        out.write(json.dumps({"event": failed_as, "error": error}) + "\n")
        return
    fn = namespace.get(job["entrypoint"])
    if not callable(fn):
        error = "no callable named " + job["entrypoint"]
        out.write(json.dumps({"event": "load_error", "error": error}) + "\n")
        return
    out.write('{"event": "loaded"}\n')
    while True:
        request = jobs.readline()
        if not request:
            return
        stage = json.loads(request)
        if "cases" not in stage:
            return
        for args in stage["cases"]:
            try:
                value = fn(*args)
                report = json.dumps({"event": "case", "ok": True, "value": value}, allow_nan=False)
            except MemoryError:
                out.write(oom)
                return
            except BaseException as exc:
                report = json.dumps({"event": "case", "ok": False, "error": type(exc).__name__})
            out.write(report + "\n")
        del stage
        out.write('{"event": "done"}\n')
        out.flush()


def _set_dumpable(value: int) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(4, value, 0, 0, 0) != 0:  # PR_SET_DUMPABLE = 4
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")


def _no_handlers() -> None:
    # As the namespace's init, a signal from inside reaches this process only if it has a
    # handler: Python's SIGINT handler would let the submission raise KeyboardInterrupt here.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)


class Run:
    """The state of one run as this init sees it."""

    def __init__(self, limits: dict[str, Any], result: Any) -> None:
        self.limits = limits
        self.result = result
        self.reason: str | None = None
        self.worker_status: int | None = None
        self.worker_usage: Any = None
        self.peak_bytes = 0
        self.cpu_ns = 0
        self.paused_ns = 0
        self.waiting_since: float | None = None
        self.processes_seen: set[int] = set()
        self.runnable: dict[int, int] = {}

    def emit(self, item: dict[str, Any]) -> None:
        self.result.write(json.dumps(item) + "\n")

    def reap(self, worker: int) -> None:
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG | WALL)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == worker:
                self.worker_status, self.worker_usage = status, usage

    def sample(self, started: float) -> None:
        """Measure every process of the namespace once; set `reason` when a limit is passed."""
        # RUSAGE_CHILDREN before the processes: a child reaped in between is then counted
        # in neither (a brief undercount), never in both.
        cpu = _children_cpu_ns()
        pids = _pids()
        memory = _mount_bytes()
        for pid in pids:
            cpu += _process_cpu_ns(pid)
            memory += _private_bytes(pid)
            if len(self.runnable) < MAX_THREADS_TRACKED:
                for tid, on_cpu, waiting in _thread_schedstats(pid):
                    self.runnable[tid] = max(self.runnable.get(tid, 0), on_cpu + waiting)
        # Time some thread was running or waiting for a CPU, summed over threads (generous:
        # threads that ran side by side count twice, so load never counts as blocked).
        busiest = sum(self.runnable.values())
        self.processes_seen.update(pids)
        self.cpu_ns = max(self.cpu_ns, cpu)
        self.peak_bytes = max(self.peak_bytes, memory)
        now = time.monotonic()
        paused = self.paused_ns + (
            (now - self.waiting_since) * 1e9 if self.waiting_since is not None else 0
        )
        blocked = ((now - started) * 1e9 - paused - busiest) / 1e9
        if self.reason is not None:
            return
        if self.cpu_ns > self.limits["time_limit_ms"] * 1_000_000:
            self.reason = "time"
        elif memory > self.limits["memory_bytes"]:
            self.reason = "memory"
        elif blocked > self.limits["blocked_seconds"]:
            self.reason = "blocked"
        elif len(self.processes_seen) > 4 * self.limits["max_processes"]:
            self.reason = "processes"


def _kill_all() -> None:
    # From the namespace's init, kill(-1) reaches every other process of the namespace.
    with contextlib.suppress(OSError):
        os.kill(-1, signal.SIGKILL)


def main() -> None:
    _no_handlers()
    result = os.fdopen(int(sys.argv[1]), "w", buffering=1)
    limits = json.loads(sys.argv[2])
    host = os.fdopen(0, "rb", buffering=0)
    _set_dumpable(0)
    job_read, job_write = os.pipe()
    value_read, value_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            # Dumpable again (this init stays non-dumpable): its memory map must be readable here.
            _set_dumpable(1)
            os.close(job_write)
            os.close(value_read)
            result.close()
            host.close()
            _worker(limits, job_read, value_write)
        finally:
            os._exit(0)
    os.close(job_read)
    os.close(value_write)
    # After the fork: the host may now move every process of the run into its cgroup (the
    # worker waits for the code, nothing forks until the host sends it).
    result.write('{"event": "started"}\n')
    own_cpu_at_job: float | None = None
    for fd in (value_read, job_write, host.fileno()):
        os.set_blocking(fd, False)
    run = Run(limits, result)
    started = time.monotonic()
    # Waiting for the host's first line (the code) is not the submission's time.
    run.waiting_since = started
    from_host = bytearray()
    to_worker = bytearray()
    values = bytearray()
    host_open = True
    output_bytes = 0
    while run.worker_status is None:
        readers = [value_read] + ([host.fileno()] if host_open else [])
        writers = [job_write] if to_worker else []
        ready_r, ready_w, _ = select.select(readers, writers, [], POLL_SECONDS)
        if host.fileno() in ready_r:
            chunk = os.read(host.fileno(), 1 << 20)
            if not chunk:
                host_open = False
            from_host += chunk
            if len(from_host) > MAX_HOST_LINE:
                raise SystemExit("the host sent an oversized line")
            while b"\n" in from_host:
                line, _, rest = from_host.partition(b"\n")
                from_host = bytearray(rest)
                if line.startswith(b'{"stop"'):
                    # The host's own accounting (the run's cgroup) saw a limit passed.
                    stop = json.loads(line)["stop"]
                    run.reason = run.reason or (
                        stop if stop in ("time", "memory", "processes") else "time"
                    )
                    continue
                if own_cpu_at_job is None:
                    own_cpu_at_job = _own_cpu()
                to_worker += line + b"\n"
                if run.waiting_since is not None:
                    run.paused_ns += int((time.monotonic() - run.waiting_since) * 1e9)
                    run.waiting_since = None
        if job_write in ready_w and to_worker:
            with contextlib.suppress(BlockingIOError, BrokenPipeError):
                written = os.write(job_write, to_worker[: 1 << 16])
                del to_worker[:written]
        if value_read in ready_r:
            with contextlib.suppress(BlockingIOError):
                chunk = os.read(value_read, 1 << 16)
                output_bytes += len(chunk)
                values += chunk
                if output_bytes > MAX_REPORT:
                    run.reason = run.reason or "output"
                    values.clear()
            while b"\n" in values:
                line, _, rest = values.partition(b"\n")
                values = bytearray(rest)
                if _relay(run, line):
                    run.waiting_since = time.monotonic()
        run.reap(pid)
        if run.worker_status is not None:
            break
        run.sample(started)
        if run.reason is not None:
            _kill_all()
            while run.worker_status is None:
                run.reap(pid)
                time.sleep(0.001)
            break
    with contextlib.suppress(BlockingIOError, OSError):
        while chunk := os.read(value_read, 1 << 16):
            if output_bytes + len(chunk) > MAX_REPORT:
                break
            output_bytes += len(chunk)
            values += chunk
    for tail in bytes(values).split(b"\n"):
        _relay(run, tail)
    # Processes the worker left behind: measured once more, then killed and reaped here,
    # which makes RUSAGE_CHILDREN the exact total.
    run.sample(started)
    _kill_all()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.wait4(-1, WALL)
        except ChildProcessError:
            break
    run.cpu_ns = max(run.cpu_ns, _children_cpu_ns())
    status = run.worker_status
    usage = run.worker_usage
    run.emit(
        {
            "event": "exit",
            "cpu_ms": run.cpu_ns // 1_000_000,
            "maxrss_kb": max(usage.ru_maxrss, run.peak_bytes // 1024),
            "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
            "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            "reason": run.reason,
            "wall_ms": int((time.monotonic() - started) * 1000),
            # This process's own CPU since the code arrived: in the run's cgroup, not the code's.
            "runner_cpu_ms": int((_own_cpu() - (own_cpu_at_job or _own_cpu())) * 1000),
        }
    )
    result.flush()


def _own_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return float(ru.ru_utime + ru.ru_stime)


def _relay(run: Run, raw: bytes | bytearray) -> bool:
    """Pass one of the worker's lines on (only the kinds it may send); True at a stage's end."""
    try:
        item = json.loads(raw)
    except (ValueError, RecursionError, MemoryError):
        # The worker's pipe is the code's to write: deep or huge lines are dropped, never
        # allowed to stop this process (that would look like our own failure).
        return False
    if not isinstance(item, dict):
        return False
    kind = item.get("event")
    if kind not in ("compile_error", "load_error", "loaded", "case", "done", "memory"):
        return False
    if kind == "done":
        run.emit({"event": "stage_done"})
        return True
    run.emit(item)
    return bool(kind == "loaded")


if __name__ == "__main__":
    main()
