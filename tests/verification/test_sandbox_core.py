"""The sandbox's pure core: reading the harness's report, the stage gate, error names, the
determinism digest, the cgroup files and the host's memory, without starting a sandbox."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verification.sandbox import (
    BUILTIN_ERRORS,
    DEFAULT_SETTINGS,
    DENIED_SYSCALLS_X86_64,
    CaseOutcome,
    SandboxRun,
    SandboxUnavailable,
    Stage,
    cgroup2_mount,
    cpu_stat_usec,
    error_name,
    host_short_of_memory,
    interpret,
    own_cgroup2,
    run_limits,
    seccomp_program,
)
from verification.verifier_types import MEASURE_STEPS, SuiteConfig, _coarse, run_digest

LIMITS = run_limits(300, 64, DEFAULT_SETTINGS)
PUBLIC = Stage.of([[1, 2]], [3])
HIDDEN = Stage.of([[10, 5], [7, 7]], [15, 14])


def report(*events: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(e).encode() + b"\n" for e in events)


def exit_event(**extra: Any) -> dict[str, Any]:
    return {
        "event": "exit",
        "cpu_ms": 5,
        "maxrss_kb": 10_000,
        "exit_code": 0,
        "signal": None,
        "reason": None,
        **extra,
    }


def case(value: Any) -> dict[str, Any]:
    return {"event": "case", "ok": True, "value": value}


def test_both_stages_run_when_the_public_one_passes() -> None:
    lines = report(
        {"event": "started"}, {"event": "loaded"}, case(3), {"event": "stage_done"},
        case(15), case(14), {"event": "stage_done"}, exit_event(),
    )  # fmt: skip
    run = interpret(lines, b"", 0, [PUBLIC, HIDDEN], LIMITS, 10)
    assert run.stage == "ok" and run.stages_run == 2 and [c.value for c in run.cases] == [3, 15, 14]


def test_cases_after_a_failed_public_stage_are_not_counted() -> None:
    """Forged hidden outcomes after a wrong public answer: the hidden stage was never sent."""
    lines = report(
        {"event": "started"}, {"event": "loaded"}, case(4), {"event": "stage_done"},
        case(15), case(14), {"event": "stage_done"}, exit_event(),
    )  # fmt: skip
    run = interpret(lines, b"", 0, [PUBLIC, HIDDEN], LIMITS, 10)
    assert run.stage == "ok" and run.stages_run == 1 and [c.value for c in run.cases] == [4]


def test_a_load_error_after_loaded_is_not_shown() -> None:
    """Code that forged `loaded` and failed later: its error text never becomes the reason."""
    lines = report(
        {"event": "started"}, {"event": "loaded"}, case(3), {"event": "stage_done"},
        {"event": "load_error", "error": "RuntimeError: secret"}, exit_event(),
    )  # fmt: skip
    run = interpret(lines, b"", 0, [PUBLIC, HIDDEN], LIMITS, 10)
    assert run.stage == "crashed" and "secret" not in (run.error or "")


def test_a_supervisor_killed_by_a_signal_is_isolate_and_its_own_failure_is_ours() -> None:
    started = report({"event": "started"}, {"event": "loaded"})
    killed = interpret(started, b"", 137, [PUBLIC], LIMITS, 10)
    assert killed.stage == "isolate" and "signal 9" in (killed.error or "")
    assert interpret(started, b"", -9, [PUBLIC], LIMITS, 10).stage == "isolate"
    with pytest.raises(SandboxUnavailable, match="before reporting"):
        interpret(started, b"Traceback (most recent call last):\n", 1, [PUBLIC], LIMITS, 10)
    with pytest.raises(SandboxUnavailable, match="did not start"):
        interpret(b"", b"bwrap: No permissions", 1, [PUBLIC], LIMITS, 10)


def test_limits_are_read_from_the_exit_event() -> None:
    base = [{"event": "started"}, {"event": "loaded"}]
    assert (
        interpret(
            report(*base, exit_event(reason="time", cpu_ms=301)), b"", 0, [PUBLIC], LIMITS, 1
        ).stage
        == "time_limit"
    )
    assert (
        interpret(report(*base, exit_event(cpu_ms=301)), b"", 0, [PUBLIC], LIMITS, 1).stage
        == "time_limit"
    )
    assert (
        interpret(report(*base, exit_event(cpu_ms=300)), b"", 0, [PUBLIC], LIMITS, 1).stage
        == "crashed"
    )
    assert (
        interpret(report(*base, exit_event(maxrss_kb=65 * 1024)), b"", 0, [PUBLIC], LIMITS, 1).stage
        == "memory_limit"
    )
    assert (
        interpret(report(*base, exit_event(reason="blocked")), b"", 0, [PUBLIC], LIMITS, 1).stage
        == "blocked"
    )
    assert (
        interpret(report(*base, exit_event(reason="output")), b"", 0, [PUBLIC], LIMITS, 1).error
        == "too many output"
    )


def test_error_names_are_builtin_or_exception() -> None:
    assert (
        error_name("ValueError") == "ValueError"
        and error_name("KeyboardInterrupt") == "KeyboardInterrupt"
    )
    for forged in ("Leak_hidden_123", "ValueError ", "", None, 7, ["ValueError"]):
        assert error_name(forged) == "Exception"
    assert "print" not in BUILTIN_ERRORS and "BaseException" in BUILTIN_ERRORS


@given(
    st.lists(st.one_of(st.integers(), st.text(max_size=5), st.none()), max_size=4),
    st.lists(st.booleans(), max_size=4),
)
@settings(max_examples=200, deadline=None)
def test_a_stage_passes_only_when_every_case_returned_its_expected_value(
    values: list[Any], oks: list[bool]
) -> None:
    stage = Stage.of([[i] for i in range(len(values))], values)
    outcomes = [
        CaseOutcome(ok=ok, value=v if ok else None) for v, ok in zip(values, oks, strict=False)
    ]
    assert stage.passed(outcomes) == (len(outcomes) == len(values) and all(oks[: len(values)]))
    assert Stage.of([[i] for i in range(len(values))]).passed(outcomes) == stage.passed(outcomes)


def test_json_equality_of_the_gate() -> None:
    stage = Stage.of([[0]], [1])
    assert stage.passed([CaseOutcome(ok=True, value=1.0)])
    assert not stage.passed([CaseOutcome(ok=True, value=True)])
    assert not stage.passed([CaseOutcome(ok=True, value="1")])


def run_with(cases: tuple[CaseOutcome, ...], stages_run: int = 2) -> SandboxRun:
    return SandboxRun("ok", cases, None, 1, 1.0, 1, {}, stages_run)


def test_the_digest_hides_hidden_values_and_sees_public_ones() -> None:
    a = run_with(
        (
            CaseOutcome(True, 3),
            CaseOutcome(True, "hidden-1"),
            CaseOutcome(False, None, "ValueError"),
        )
    )
    b = run_with(
        (
            CaseOutcome(True, 3),
            CaseOutcome(True, "hidden-2"),
            CaseOutcome(False, None, "ValueError"),
        )
    )
    c = run_with(
        (
            CaseOutcome(True, 4),
            CaseOutcome(True, "hidden-1"),
            CaseOutcome(False, None, "ValueError"),
        )
    )
    assert run_digest(a, hidden_from=1) == run_digest(b, hidden_from=1)
    assert run_digest(a, hidden_from=1) != run_digest(c, hidden_from=1)
    assert run_digest(a) != run_digest(b)
    flipped = run_with(
        (
            CaseOutcome(True, 3),
            CaseOutcome(False, None, "ValueError"),
            CaseOutcome(False, None, "ValueError"),
        )
    )
    assert run_digest(a, hidden_from=1) != run_digest(flipped, hidden_from=1)
    digest = run_digest(a)
    assert digest.startswith("0x") and len(digest) == 66


def test_measurements_after_the_hidden_stage_are_rounded_up_to_a_tenth_of_the_limit() -> None:
    config = SuiteConfig(timeLimitMs=300, memoryMb=64)
    assert MEASURE_STEPS == 10
    coarse = _coarse({"cpuMs": 31, "peakMemoryMb": 10.2, "runs": 2}, config)
    assert coarse == {"cpuMs": 60, "peakMemoryMb": 12.0, "runs": 2}
    assert _coarse({"cpuMs": 30, "peakMemoryMb": 6.0}, config) == {"cpuMs": 30, "peakMemoryMb": 6.0}
    assert _coarse({"cpuMs": 301, "peakMemoryMb": 65.0}, config)["cpuMs"] == 330


MOUNTINFO = """\
25 1 0:22 / /sys rw,nosuid - sysfs sysfs rw
30 25 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
35 30 0:31 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate
36 30 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
"""


def test_cgroup_files_are_read() -> None:
    assert str(cgroup2_mount(MOUNTINFO)) == "/sys/fs/cgroup/unified"
    assert cgroup2_mount(MOUNTINFO.replace("cgroup2 cgroup2", "cgroup cgroup")) is None
    assert (
        own_cgroup2("4:memory:/a\n0::/system.slice/escrowd.service\n")
        == "/system.slice/escrowd.service"
    )
    assert own_cgroup2("0::/\n") == "/" and own_cgroup2("4:memory:/a\n") is None
    assert cpu_stat_usec("usage_usec 123456\nuser_usec 100000\nsystem_usec 23456\n") == 123456
    with pytest.raises(ValueError):
        cpu_stat_usec("user_usec 1\n")


def test_host_short_of_memory_boundaries() -> None:
    def meminfo(total_kb: int, available_kb: int) -> str:
        return f"MemTotal: {total_kb} kB\nMemFree: 1 kB\nMemAvailable: {available_kb} kB\n"

    assert host_short_of_memory(meminfo(16 * 2**20, 128 * 1024 - 1))
    assert not host_short_of_memory(meminfo(1 * 2**20, 128 * 1024))
    # 2 % of a large host.
    assert host_short_of_memory(meminfo(100 * 2**20, 2 * 2**20 - 1))
    assert not host_short_of_memory(meminfo(100 * 2**20, 2 * 2**20 + 1))
    assert host_short_of_memory("garbage")


def run_bpf(program: bytes, nr: int, args: tuple[int, ...] = (), arch: int = 0xC000003E) -> int:
    """A classic-BPF interpreter for the instructions the filter uses; the action it returns."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *(list(args) + [0] * (6 - len(args))))
    code = [struct.unpack("<HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    pc, acc = 0, 0
    while True:
        op, jt, jf, k = code[pc]
        if op == 0x20:  # ld [k]
            acc = struct.unpack_from("<I", data, k)[0]
            pc += 1
        elif op == 0x15:  # jeq #k
            pc += 1 + (jt if acc == k else jf)
        elif op == 0x35:  # jge #k
            pc += 1 + (jt if acc >= k else jf)
        elif op == 0x06:  # ret #k
            return int(k)
        else:
            raise AssertionError(f"unexpected instruction {op:#x}")


ALLOW, EPERM, KILL = 0x7FFF0000, 0x00050001, 0x80000000


def test_the_seccomp_filter_decides_each_call_as_documented() -> None:
    program = seccomp_program("x86_64")
    assert program is not None
    for name, number in DENIED_SYSCALLS_X86_64.items():
        assert run_bpf(program, number) == EPERM, name
    for allowed in (
        0,
        1,
        2,
        9,
        56,
        57,
        61,
        231,
    ):  # read write open mmap clone fork wait4 exit_group
        assert run_bpf(program, allowed) == ALLOW
    assert run_bpf(program, 0, arch=0x40000003) == KILL  # i386
    assert run_bpf(program, 0x40000000 + 1) == KILL  # x32
    # prlimit64 on itself only.
    assert run_bpf(program, 302, (0, 7, 0, 0)) == ALLOW
    assert run_bpf(program, 302, (1, 0, 0, 0)) == EPERM
    assert run_bpf(program, 302, (0x1_0000_0000 + 1,)) == EPERM
    # SIGCHLD's action may be read, not set; other signals' may be set.
    assert run_bpf(program, 13, (17, 0, 0x7FFF0000)) == ALLOW
    assert run_bpf(program, 13, (17, 0x7FFF0000)) == EPERM
    assert run_bpf(program, 13, (17, 0x7F00_0000_0000)) == EPERM
    assert run_bpf(program, 13, (2, 0x7FFF0000)) == ALLOW


def test_a_run_the_cgroup_had_to_kill_is_a_time_limit(tmp_path: Any) -> None:
    """Told to stop past the limit, a harness that did not is killed with its cgroup: a time limit, not ISOLATE."""
    from verification.sandbox import RunCgroup, _CgroupAccount

    (tmp_path / "cgroup.controllers").write_text("")
    (tmp_path / "cpu.stat").write_text("usage_usec 1000\n")
    account = _CgroupAccount(RunCgroup(tmp_path), 1, LIMITS)
    account.baseline_usec = 1000
    (tmp_path / "cpu.stat").write_text("usage_usec 901000\n")
    assert account.over()  # 900 ms > 1.5 × 300 ms + 100 ms
    account.stopped = True
    run = interpret(
        report({"event": "started"}, {"event": "loaded"}), b"", 137, [PUBLIC], LIMITS, 10, account
    )
    assert run.stage == "time_limit" and run.cpu_ms == 900 and run.accounting == "cgroup"
    (tmp_path / "cpu.stat").write_text("usage_usec 551000\n")
    assert not account.over()  # 550 ms: within the allowance for the harness's own polling
