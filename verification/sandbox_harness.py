"""The harness that runs inside the bubblewrap sandbox (its source is executed by `python -c`).

It imports nothing of the project: `verification.sandbox` reads this file's text
and runs it with the sandboxed interpreter. Protocol:

* argv: `fd` of the result channel (a pipe to the host), the limits as JSON;
* stdin: the job `{"source", "entrypoint", "cases"}` (arguments only, never expected values);
* the result channel receives JSON lines, written only by this process:
  `started`, then `compile_error` / `load_error` / `loaded`, `case` lines (index, ok, value
  or error class), and last `exit` with the measured CPU time, peak memory and why the
  worker stopped.

The submitted code runs in a forked *worker* that closed the result channel before it
loaded anything; this process is made non-dumpable first, so the worker can neither ptrace
it nor open its descriptors through `/proc/<pid>/fd`. The worker sends the values its
entrypoint returned on a second pipe. The submission shares the worker's process, so it can
write on that pipe too, but all it can claim there is a value per case, in order (never a
verdict, a count, a stage or a measurement: those come from here and from the host, and the
expected values never enter the sandbox).

Measured limits: CPU time is the sum over every process of the sandbox (read from
`/proc/<pid>/schedstat`, so work spread over children counts too; the worker's final
figure from `wait4`); time a process spent *blocked* (wall time minus CPU time minus time
spent waiting for a CPU on the run queue) is bounded separately, so load on the host never
counts against the submission. Peak memory is the larger of the worker's `ru_maxrss` and the
resident memory of all the sandbox's processes together (polled); the address-space rlimit
makes a single process's allocations past the limit fail, the poll stops a family of
processes that together exceed it.
"""

import contextlib
import json
import os
import resource
import signal
import sys
import time
from typing import Any

POLL_SECONDS = 0.02
MAX_REPORT = 8 * 1024 * 1024
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def _schedstat(pid: int) -> tuple[int, int] | None:
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            cpu, wait, _ = f.read().split()
        return int(cpu), int(wait)
    except (OSError, ValueError):
        return None


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return 0


def _sandbox_pids(exclude: set[int]) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) not in exclude:
            pids.append(int(name))
    return pids


def _kill_all(exclude: set[int]) -> None:
    # Everything in this pid namespace except pid 1 (bwrap's init) and this harness.
    for _ in range(50):
        pids = _sandbox_pids(exclude)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.005)


def _worker(job: dict[str, Any], limits: dict[str, Any], value_fd: int) -> None:
    mem = limits["memory_bytes"]
    cpu = limits["cpu_seconds"]
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    # SIGXCPU at the soft limit (reported as a time limit), SIGKILL a second later.
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["max_processes"], limits["max_processes"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"], limits["file_bytes"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits["open_files"], limits["open_files"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    out = os.fdopen(value_fd, "w", buffering=1)
    # Preallocated: after a MemoryError there may be no room to build this text.
    oom = '{"event": "memory"}\n'
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    try:
        code = compile(job["source"], "solution.py", "exec")
    except MemoryError:
        out.write(oom)
        return
    except BaseException as exc:
        out.write(
            json.dumps(
                {"event": "compile_error", "error": (type(exc).__name__ + ": " + str(exc))[:300]}
            )
            + "\n"
        )
        return
    namespace: dict[str, Any] = {"__name__": "solution"}
    try:
        exec(code, namespace)
    except MemoryError:
        out.write(oom)
        return
    except BaseException as exc:
        out.write(
            json.dumps(
                {"event": "load_error", "error": (type(exc).__name__ + ": " + str(exc))[:300]}
            )
            + "\n"
        )
        return
    fn = namespace.get(job["entrypoint"])
    if not callable(fn):
        out.write(
            json.dumps({"event": "load_error", "error": "no callable named " + job["entrypoint"]})
            + "\n"
        )
        return
    out.write('{"event": "loaded"}\n')
    for args in job["cases"]:
        try:
            value = fn(*args)
            line = json.dumps({"event": "case", "ok": True, "value": value}, allow_nan=False)
        except MemoryError:
            out.write(oom)
            return
        except BaseException as exc:
            line = json.dumps({"event": "case", "ok": False, "error": type(exc).__name__})
        out.write(line + "\n")
    out.write('{"event": "done"}\n')
    out.flush()


def _set_non_dumpable() -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE = 4
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")


def main() -> None:
    result = os.fdopen(int(sys.argv[1]), "w", buffering=1)
    limits = json.loads(sys.argv[2])
    job = json.loads(sys.stdin.buffer.read())
    sys.stdin.close()
    _set_non_dumpable()
    result.write('{"event": "started"}\n')
    read_fd, write_fd = os.pipe()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_fd)
            result.close()
            _worker(job, limits, write_fd)
        finally:
            os._exit(0)
    os.close(write_fd)
    os.set_blocking(read_fd, False)
    me = {1, os.getpid()}
    buffer = bytearray()
    reason: str | None = None
    status: int | None = None
    usage: Any = None
    seen_cpu: dict[int, int] = {}
    seen_wait: dict[int, int] = {}
    peak_rss = 0
    cpu_limit_ns = limits["time_limit_ms"] * 1_000_000
    blocked_limit = limits["blocked_seconds"]
    while status is None:
        try:
            while chunk := os.read(read_fd, 65536):
                buffer += chunk
                if len(buffer) > MAX_REPORT:
                    reason = reason or "output"
                    break
        except BlockingIOError:
            pass
        for p in _sandbox_pids(me):
            stat = _schedstat(p)
            if stat is not None:
                seen_cpu[p], seen_wait[p] = stat
        done_pid, raw_status, ru = os.wait4(pid, os.WNOHANG)
        if done_pid == pid:
            status, usage = raw_status, ru
            break
        cpu_total = sum(seen_cpu.values())
        pids = _sandbox_pids(me)
        live = [s for s in (_schedstat(p) for p in pids) if s is not None]
        # Resident memory of the whole sandbox: children count, not only the worker.
        rss_total = sum(_rss_bytes(p) for p in pids)
        peak_rss = max(peak_rss, rss_total)
        # Time the busiest live process spent neither running nor waiting for a CPU: sleeping.
        wall_ns = (time.monotonic() - started) * 1e9
        blocked = (wall_ns - max((c + w for c, w in live), default=0)) / 1e9
        if reason is None and cpu_total > cpu_limit_ns:
            reason = "time"
        elif reason is None and rss_total > limits["memory_bytes"]:
            reason = "memory"
        elif reason is None and blocked > blocked_limit:
            reason = "blocked"
        elif reason is None and len(seen_cpu) > 4 * limits["max_processes"]:
            reason = "processes"
        if reason is not None:
            _kill_all(me)
            _, status, usage = os.wait4(pid, 0)
            break
        time.sleep(POLL_SECONDS)
    try:
        while chunk := os.read(read_fd, 65536):
            buffer += chunk
            if len(buffer) > MAX_REPORT:
                break
    except BlockingIOError:
        pass
    # Processes the worker left behind still count for CPU until they die with the namespace.
    for p in _sandbox_pids(me):
        stat = _schedstat(p)
        if stat is not None:
            seen_cpu[p], seen_wait[p] = stat
    seen_cpu[pid] = max(seen_cpu.get(pid, 0), int((usage.ru_utime + usage.ru_stime) * 1e9))
    _kill_all(me)
    for raw in bytes(buffer[:MAX_REPORT]).split(b"\n"):
        try:
            item = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(item, dict) or item.get("event") not in (
            "compile_error",
            "load_error",
            "loaded",
            "case",
            "done",
            "memory",
        ):
            continue
        result.write(json.dumps(item) + "\n")
    exit_event = {
        "event": "exit",
        "cpu_ms": sum(seen_cpu.values()) // 1_000_000,
        "maxrss_kb": max(usage.ru_maxrss, peak_rss // 1024),
        "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "reason": reason,
        "wall_ms": int((time.monotonic() - started) * 1000),
    }
    result.write(json.dumps(exit_event) + "\n")
    result.flush()


if __name__ == "__main__":
    main()
