"""Run untrusted Python code in a child process under time and memory limits.

Used by the `test_suite` and `execution_result` verifier types (seed 002: "the run starts
in an isolated environment with the Prompt's limits applied"). The child is a fresh
`python -I -S` (no environment, no site-packages, no current directory on the path) in an
empty temporary directory. Before it touches the submitted code it applies, with
`resource.setrlimit`: address space (`memory_mb`), CPU seconds, file size (1 MiB), no core
files; when it runs as root it also leaves the network namespace (best effort) and drops to
uid/gid 65534 (`nobody`). The parent enforces the wall-clock limit and kills the child's
process group.

The child never sees expected outputs: it receives only each case's arguments and returns
the values it computed, as JSON lines on a private pipe; the parent compares. Code that
prints a forged "pass" can therefore only forge values, never verdicts.

This is process isolation, not a security boundary against kernel exploits: run the
verification service itself in a container when strangers' code is judged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_RUNNER = r'''
import ctypes, json, os, resource, sys

def main():
    out = os.fdopen(int(sys.argv[1]), "w", buffering=1)
    limits = json.loads(sys.argv[2])
    mem = limits["memory_bytes"]
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_seconds"], limits["cpu_seconds"] + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if os.geteuid() == 0:
        try:
            ctypes.CDLL(None, use_errno=True).unshare(0x40000000)  # CLONE_NEWNET: no network
        except Exception:
            pass
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
    with open("cases.json") as f:
        job = json.load(f)
    # Preallocated: after a MemoryError there may be no room to build this text.
    oom = json.dumps({"event": "memory"})
    try:
        with open("solution.py") as f:
            source = f.read()
        code = compile(source, "solution.py", "exec")
    except MemoryError:
        out.write(oom + "\n")
        return
    except BaseException as exc:
        out.write(json.dumps({"event": "compile_error", "error": type(exc).__name__ + ": " + str(exc)[:300]}) + "\n")
        return
    sys.stdout = open(os.devnull, "w")
    sys.stderr = open(os.devnull, "w")
    namespace = {"__name__": "solution"}
    try:
        exec(code, namespace)
    except MemoryError:
        out.write(oom + "\n")
        return
    except BaseException as exc:
        out.write(json.dumps({"event": "load_error", "error": type(exc).__name__ + ": " + str(exc)[:300]}) + "\n")
        return
    fn = namespace.get(job["entrypoint"])
    if not callable(fn):
        out.write(json.dumps({"event": "load_error", "error": "no callable named " + job["entrypoint"]}) + "\n")
        return
    out.write(json.dumps({"event": "loaded"}) + "\n")
    for i, args in enumerate(job["cases"]):
        try:
            value = fn(*args)
            line = json.dumps({"event": "case", "i": i, "ok": True, "value": value}, allow_nan=False)
        except MemoryError:
            out.write(oom + "\n")
            return
        except BaseException as exc:
            line = json.dumps({"event": "case", "i": i, "ok": False, "error": type(exc).__name__})
        out.write(line + "\n")
    out.write(json.dumps({"event": "done"}) + "\n")

main()
'''

_MAX_REPORT_BYTES = 8 * 1024 * 1024


class SandboxUnavailable(RuntimeError):
    """The sandbox itself could not run (not the submitted code's fault)."""


@dataclass(frozen=True)
class CaseOutcome:
    """One case: the value the code returned, or the exception class it raised."""

    ok: bool
    value: Any = None
    error: str | None = None


@dataclass(frozen=True)
class SandboxRun:
    """What happened to one run of the submitted code."""

    stage: str  # "ok", "compile", "load", "time_limit", "memory_limit", "crashed"
    cases: tuple[CaseOutcome, ...]
    error: str | None = None
    wall_seconds: float = 0.0

    @property
    def completed(self) -> bool:
        """True when the code loaded and every case produced an outcome."""
        return self.stage == "ok"


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


async def run_cases(
    source: str,
    entrypoint: str,
    cases: list[list[Any]],
    *,
    time_limit_ms: int,
    memory_mb: int,
) -> SandboxRun:
    """Run `entrypoint(*args)` for each case in a limited child process."""
    loop = asyncio.get_running_loop()
    with tempfile.TemporaryDirectory(prefix="escrowd-sandbox-") as tmp:
        workdir = Path(tmp)
        (workdir / "solution.py").write_text(source, encoding="utf-8", errors="replace")
        (workdir / "cases.json").write_text(json.dumps({"entrypoint": entrypoint, "cases": cases}))
        for path in (workdir, workdir / "solution.py", workdir / "cases.json"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        limits = {
            "memory_bytes": memory_mb * 1024 * 1024,
            "cpu_seconds": max(1, -(-time_limit_ms // 1000)),
        }
        read_fd, write_fd = os.pipe()
        started = loop.time()
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-I", "-S", "-B", "-c", _RUNNER, str(write_fd), json.dumps(limits),
                cwd=workdir,
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                pass_fds=(write_fd,),
                start_new_session=True,
            )  # fmt: skip
        except OSError as exc:
            os.close(read_fd)
            os.close(write_fd)
            raise SandboxUnavailable(f"cannot start the sandbox: {exc.strerror or exc}") from None
        finally:
            with contextlib.suppress(OSError):
                os.close(write_fd)
        timed_out = False
        try:
            report = await asyncio.wait_for(
                _read_all(read_fd, proc), timeout=time_limit_ms / 1000 + 0.5
            )
        except TimeoutError:
            timed_out = True
            _kill_group(proc.pid)
            await proc.wait()
            report = b""
        finally:
            with contextlib.suppress(OSError):
                os.close(read_fd)
        wall = loop.time() - started
    return _interpret(report, proc.returncode, timed_out, len(cases), wall)


async def _read_all(fd: int, proc: asyncio.subprocess.Process) -> bytes:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=_MAX_REPORT_BYTES)
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", closefd=False)
    )
    try:
        data = bytearray()
        while chunk := await reader.read(65536):
            data += chunk
            if len(data) > _MAX_REPORT_BYTES:
                _kill_group(proc.pid)
                break
        await proc.wait()
        return bytes(data)
    finally:
        transport.close()


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _interpret(report: bytes, returncode: int | None, timed_out: bool, n_cases: int, wall: float) -> SandboxRun:
    # Imported here: this file also runs as the sandboxed child, where only the stdlib exists.
    from schemas import jsonbounds

    events: list[dict[str, Any]] = []
    for line in report.decode("utf-8", "replace").splitlines():
        with contextlib.suppress(ValueError):
            item = jsonbounds.loads(line, max_bytes=None)  # the child's lines are as hostile as its code
            if isinstance(item, dict):
                events.append(item)
    cases: dict[int, CaseOutcome] = {}
    stage = "crashed"
    error: str | None = None
    loaded = False
    for event in events:
        kind = event.get("event")
        if kind == "compile_error":
            return SandboxRun("compile", (), str(event.get("error", ""))[:300], wall)
        if kind == "load_error":
            return SandboxRun("load", (), str(event.get("error", ""))[:300], wall)
        if kind == "memory":
            stage, error = "memory_limit", "memory limit exceeded"
            break
        if kind == "loaded":
            loaded = True
        if kind == "case" and isinstance(event.get("i"), int) and 0 <= event["i"] < n_cases:
            ok = event.get("ok") is True
            cases.setdefault(
                event["i"],
                CaseOutcome(ok=ok, value=event.get("value") if ok else None, error=None if ok else str(event.get("error"))),
            )
        if kind == "done" and loaded and len(cases) == n_cases:
            stage = "ok"
    if timed_out:
        stage, error = "time_limit", "time limit exceeded"
    elif stage == "crashed" and returncode is not None and returncode < 0:
        sig = -returncode
        if sig in (signal.SIGXCPU, signal.SIGKILL):
            stage, error = "time_limit", "CPU time limit exceeded"
        else:
            error = f"killed by signal {sig}"
    elif stage == "crashed":
        error = f"exited with status {returncode} before finishing"
    ordered = tuple(cases[i] for i in sorted(cases))
    return SandboxRun(stage, ordered, error, wall)
