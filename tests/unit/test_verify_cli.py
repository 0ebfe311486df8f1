"""`verify auto` and `verify validate-criteria`, driven through typer's CliRunner."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from verification.cli import app

runner = CliRunner()


def _write(tmp_path: Path, name: str, content: object) -> Path:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    return path


def _run(*args: str):
    return runner.invoke(app, list(args))


def test_auto_prints_the_verification_result_and_exits_0_on_fail(tmp_path: Path) -> None:
    criteria = _write(tmp_path, "c.json", {"required_fields": ["name", "price", "currency"]})
    result = _write(tmp_path, "r.json", {"name": "Acme Widget", "price": "", "currency": "USD"})
    outcome = _run("auto", "--criteria", str(criteria), "--result", str(result))
    assert outcome.exit_code == 0
    assert json.loads(outcome.stdout) == {
        "passed": False,
        "score": 73,
        "reasons": ["required_fields: 67%"],
        "breakdown": [
            {"name": "required_fields", "score": 0.6666666666666666, "weight": 2, "reason": ""},
            {"name": "system_failure_detection", "score": 1, "weight": 0.5, "reason": ""},
        ],
        "errors": {},
    }


def test_auto_exits_0_on_pass(tmp_path: Path) -> None:
    criteria = _write(tmp_path, "c.json", {"expected_answer": "42"})
    result = _write(tmp_path, "r.json", {"output": "The answer is 42."})
    outcome = _run("auto", "--criteria", str(criteria), "--result", str(result))
    assert outcome.exit_code == 0
    verdict = json.loads(outcome.stdout)
    assert (verdict["passed"], verdict["score"]) == (True, 100)


def test_auto_keeps_non_ascii_reasons_readable(tmp_path: Path) -> None:
    criteria = _write(tmp_path, "c.json", {"expected_answer": "42"})
    result = _write(tmp_path, "r.json", {"output": "6 × 7 = 42, so the answer is 42."})
    outcome = _run("auto", "--criteria", str(criteria), "--result", str(result))
    assert 'output also offers \\"6\\" — more than one answer' in outcome.stdout


@pytest.mark.parametrize("which", ["criteria", "result"])
@pytest.mark.parametrize(
    "content", ["not json", "{", "", '{"a": NaN}', b"\xff\xfe\x00garbage".decode("latin-1")]
)
def test_auto_non_json_file_exits_2_with_one_line(tmp_path: Path, which: str, content: str) -> None:
    good = {"criteria": {"min_length": 10}, "result": {"output": "hello there friend"}}
    files = {
        name: _write(tmp_path, f"{name}.json", content if name == which else good[name])
        for name in ("criteria", "result")
    }
    outcome = _run("auto", "--criteria", str(files["criteria"]), "--result", str(files["result"]))
    assert outcome.exit_code == 2
    assert outcome.stdout == ""
    lines = outcome.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"error: {which} file")


def test_auto_missing_file_exits_2(tmp_path: Path) -> None:
    criteria = _write(tmp_path, "c.json", {"min_length": 10})
    outcome = _run("auto", "--criteria", str(criteria), "--result", str(tmp_path / "missing.json"))
    assert outcome.exit_code == 2
    assert outcome.stderr.strip().splitlines() == [
        f"error: cannot read result file {str(tmp_path / 'missing.json')!r}: No such file or directory"
    ]


def test_auto_directory_exits_2(tmp_path: Path) -> None:
    result = _write(tmp_path, "r.json", {"output": "x"})
    outcome = _run("auto", "--criteria", str(tmp_path), "--result", str(result))
    assert outcome.exit_code == 2
    assert len(outcome.stderr.strip().splitlines()) == 1


def test_auto_criteria_must_be_an_object(tmp_path: Path) -> None:
    criteria = _write(tmp_path, "c.json", ["min_length"])
    result = _write(tmp_path, "r.json", {"output": "x"})
    outcome = _run("auto", "--criteria", str(criteria), "--result", str(result))
    assert outcome.exit_code == 2
    assert "must hold a JSON object" in outcome.stderr


def test_auto_oversized_criteria_is_a_verdict_not_an_error(tmp_path: Path) -> None:
    criteria = _write(tmp_path, "c.json", {"contains_keywords": ["k"] * 51})
    result = _write(tmp_path, "r.json", {"output": "some text here"})
    outcome = _run("auto", "--criteria", str(criteria), "--result", str(result))
    assert outcome.exit_code == 0
    assert json.loads(outcome.stdout)["reasons"] == [
        "Verification criteria exceed the supported size — cannot auto-verify against them"
    ]


def test_auto_deeply_nested_file_exits_2(tmp_path: Path) -> None:
    criteria = _write(tmp_path, "c.json", {"min_length": 10})
    result = _write(tmp_path, "r.json", "[" * 200_000 + "]" * 200_000)
    outcome = _run("auto", "--criteria", str(criteria), "--result", str(result))
    assert outcome.exit_code == 2
    assert outcome.stderr.strip().splitlines() == [
        f"error: result file {str(result)!r} is nested too deeply to read"
    ]


def test_escrowd_verify_survives_deep_json_with_raised_recursion_limit(tmp_path: Path) -> None:
    """The `escrowd` process imports py_ecc, which raises the recursion limit to 100,000:
    a deep file must be refused, not crash the C JSON decoder."""
    criteria = _write(tmp_path, "c.json", {"min_length": 10})
    result = _write(tmp_path, "r.json", "[" * 200_000 + "]" * 200_000)
    script = (
        "import sys; sys.setrecursionlimit(100_000); "
        "from verification.cli import app; app()"
    )
    completed = subprocess.run(
        [
            sys.executable,
            "-c",
            script,
            "auto",
            "--criteria",
            str(criteria),
            "--result",
            str(result),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 2, completed.stderr
    assert "nested too deeply" in completed.stderr


def test_validate_criteria_accepts(tmp_path: Path) -> None:
    path = _write(tmp_path, "c.json", {"min_length": 10, "min_lenght": 20})
    outcome = _run("validate-criteria", str(path))
    assert outcome.exit_code == 0
    assert json.loads(outcome.stdout) == {
        "ok": True,
        "code": None,
        "errors": [],
        "warnings": ["unknown field 'min_lenght' was dropped"],
        "criteria": {"min_length": 10},
    }


@pytest.mark.parametrize(
    ("criteria", "code"),
    [
        ({"forbidden_phrases": ["lorem"]}, "AUTO_CRITERIA_REQUIRED"),
        ({"regex_pattern": "(a+)+", "min_length": 5}, "REGEX_PATTERN_UNUSABLE"),
        ({"min_length": -5}, "VERIFICATION_CRITERIA_INVALID"),
    ],
)
def test_validate_criteria_refusals_exit_1(tmp_path: Path, criteria: object, code: str) -> None:
    outcome = _run("validate-criteria", str(_write(tmp_path, "c.json", criteria)))
    assert outcome.exit_code == 1
    verdict = json.loads(outcome.stdout)
    assert (verdict["ok"], verdict["code"]) == (False, code)


def test_validate_criteria_mode(tmp_path: Path) -> None:
    path = _write(tmp_path, "c.json", {"forbidden_phrases": ["lorem"]})
    assert _run("validate-criteria", str(path), "--mode", "manual").exit_code == 0
    outcome = _run("validate-criteria", str(path), "--mode", "oracle")
    assert outcome.exit_code == 2
    assert outcome.stderr.strip().splitlines() == [
        "error: unknown mode 'oracle'; expected one of auto, agent, manual"
    ]


def test_validate_criteria_unreadable_file_exits_2(tmp_path: Path) -> None:
    outcome = _run("validate-criteria", str(_write(tmp_path, "c.json", "{oops")))
    assert outcome.exit_code == 2
    assert len(outcome.stderr.strip().splitlines()) == 1
