"""`escrowd panel draw` and `escrowd panel consensus`: offline, reproducible, strict input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from panels import rules
from panels.cli import app

runner = CliRunner()
TASK = "31337:0x" + "E3" * 20 + ":7"
POOL = [
    {"id": f"0x{i:040x}", "operator": f"op{i % 8}", "calibration": 0.2 + 0.1 * (i % 7)}
    for i in range(1, 13)
]


def _write(tmp_path: Path, name: str, content: object) -> Path:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    return path


def _secret(tmp_path: Path) -> Path:
    return _write(tmp_path, "secret", "s3cret-draw-key-0123456789abcdef\n")


def test_draw_prints_three_ids_reproducibly_and_matches_the_core(tmp_path: Path) -> None:
    pool, secret = _write(tmp_path, "pool.json", POOL), _secret(tmp_path)
    args = ["draw", "--task-key", TASK, "--pool", str(pool), "--secret-file", str(secret),
            "--exclude-operators", "op1,op2"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.stderr
    drawn = json.loads(first.stdout)["verifiers"]
    assert runner.invoke(app, args).stdout == first.stdout
    assert len(drawn) == 3
    by_id = {p["id"]: p for p in POOL}
    assert all(by_id[v]["operator"] not in {"op1", "op2"} for v in drawn)
    assert len({by_id[v]["operator"] for v in drawn}) == 3  # one seat per operator
    core = rules.draw(
        b"s3cret-draw-key-0123456789abcdef", TASK.lower(), 1,
        [rules.Candidate(p["id"], p["operator"], rules.to_ppm(p["calibration"])) for p in POOL],
        exclude_operators=["op1", "op2"],
    )
    assert drawn == [c.id for c in core]
    rerun = runner.invoke(app, [*args, "--round", "2", "--exclude-ids", ",".join(drawn)])
    assert rerun.exit_code == 0, rerun.stderr
    assert not set(json.loads(rerun.stdout)["verifiers"]) & set(drawn)
    assert "s3cret" not in first.stdout + first.stderr


def test_draw_with_too_small_a_pool_exits_3(tmp_path: Path) -> None:
    pool, secret = _write(tmp_path, "pool.json", POOL), _secret(tmp_path)
    outcome = runner.invoke(app, ["draw", "--task-key", TASK, "--pool", str(pool), "--secret-file",
                                  str(secret), "--exclude-operators", "op0,op1,op2,op3,op4",
                                  "--exclude-ids", POOL[4]["id"]])
    assert outcome.exit_code == 3
    assert "2 eligible operators" in outcome.stderr


def test_draw_refuses_hostile_input(tmp_path: Path) -> None:
    secret = _secret(tmp_path)
    cases = {
        "bad key": (TASK.replace(":7", ":x"), POOL),
        "extra field": (TASK, [{**POOL[0], "x": 1}, *POOL[1:]]),
        "calibration > 1": (TASK, [{**POOL[0], "calibration": 1.5}, *POOL[1:]]),
        "bool calibration": (TASK, [{**POOL[0], "calibration": True}, *POOL[1:]]),
        "not a list": (TASK, {"id": "x"}),
        "duplicate": (TASK, [*POOL, POOL[0]]),
    }
    for name, (key, pool) in cases.items():
        path = _write(tmp_path, "pool.json", pool)
        outcome = runner.invoke(app, ["draw", "--task-key", key, "--pool", str(path),
                                      "--secret-file", str(secret)])
        assert outcome.exit_code == 2, name
        assert outcome.stderr.startswith("error: "), name
    short = _write(tmp_path, "short", "abc")
    pool = _write(tmp_path, "pool.json", POOL)
    outcome = runner.invoke(app, ["draw", "--task-key", TASK, "--pool", str(pool), "--secret-file", str(short)])
    assert outcome.exit_code == 2 and "abc" not in outcome.stderr


def test_consensus_rules_reruns_and_goes_inconclusive(tmp_path: Path) -> None:
    def run(body: object) -> dict[str, object]:
        outcome = runner.invoke(app, ["consensus", "--attestations", str(_write(tmp_path, "a.json", body))])
        assert outcome.exit_code == 0, outcome.stderr
        parsed: dict[str, object] = json.loads(outcome.stdout)
        return parsed

    ruling = run({"round": 1, "attestations": [
        {"verifier": "a", "quality": 0.8, "confidence": 1, "calibration": 0.5},
        {"verifier": "b", "quality": 0.6, "confidence": 0.5, "calibration": 1},
        {"verifier": "c", "quality": 0.1, "confidence": 0, "calibration": 1},
    ]})
    assert ruling == {
        "consensus": 0.7, "consensus_ppm": 700_000, "rerun": False, "inconclusive": False,
        "outcome": "ruling", "round": 1, "spread": 0.2, "weighted": ["a", "b"], "declined": ["c"],
        "min_confidence": 0.1, "schema_ok": True, "band": "accept", "agent_share_bps": 10_000,
    }
    colluding = {"round": 1, "attestations": [
        {"verifier": v, "quality": q, "confidence": 0.9, "calibration": 0.6}
        for v, q in (("a", 0.50), ("b", 0.51), ("c", 0.52))
    ]}
    assert run(colluding)["rerun"] is True
    assert run({**colluding, "round": 2})["rerun"] is False
    capped = run({"round": 2, "schema_ok": False, "attestations": [*colluding["attestations"][:1], {"verifier": "d", "quality": 0.95, "confidence": 1, "calibration": 1}]})
    assert (capped["band"], capped["agent_share_bps"]) == ("revision", 6_999)
    timed_out = run({"round": 1, "attestations": [
        {"verifier": "a", "quality": 0.9, "confidence": 0.9, "calibration": 0.9, "timed_out": True},
        {"verifier": "b", "quality": 0.2, "confidence": 0, "calibration": 0.9},
    ]})
    assert timed_out["inconclusive"] is True and timed_out["consensus"] is None


def test_a_weightless_third_no_longer_hides_two_colluders(tmp_path: Path) -> None:
    """Issue 25 item 5, through `escrowd panel consensus` as a process: two agree exactly, the
    third attests quality 0 with confidence 1e-6. It used to count as weighted and widen the
    spread to 0.95 (`rerun: false`); now it is a decline, outside the spread."""
    body = {"round": 1, "attestations": [
        {"verifier": "a", "quality": 0.95, "confidence": 1, "calibration": 0.5},
        {"verifier": "b", "quality": 0.95, "confidence": 1, "calibration": 0.5},
        {"verifier": "c", "quality": 0, "confidence": 0.000001, "calibration": 0.5},
    ]}
    path = _write(tmp_path, "colluders.json", body)
    escrowd = Path(sys.executable).with_name("escrowd")
    done = subprocess.run([str(escrowd), "panel", "consensus", "--attestations", str(path)],
                          capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert (shown["rerun"], shown["spread"], shown["weighted"], shown["declined"]) == (True, 0.0, ["a", "b"], ["c"])
    assert shown["consensus_ppm"] == 950_000
    # A deployment that sets its minimum to 0 is back to counting it (the CLI shows either).
    loose = runner.invoke(app, ["consensus", "--attestations", str(_write(tmp_path, "l.json", {**body, "min_confidence": 0}))])
    assert loose.exit_code == 0 and json.loads(loose.stdout)["rerun"] is False


def test_draw_operator_cap(tmp_path: Path) -> None:
    pool, secret = _write(tmp_path, "pool.json", POOL), _secret(tmp_path)
    base = ["draw", "--task-key", TASK, "--pool", str(pool), "--secret-file", str(secret)]
    capped = runner.invoke(app, [*base, "--operator-cap", "0.3"])
    assert capped.exit_code == 0, capped.stderr
    core = rules.draw(
        b"s3cret-draw-key-0123456789abcdef", TASK.lower(), 1,
        [rules.Candidate(p["id"], p["operator"], rules.to_ppm(p["calibration"])) for p in POOL],
        operator_cap_ppm=300_000,
    )
    assert json.loads(capped.stdout)["verifiers"] == [c.id for c in core]
    for bad in ("0", "1.5", "x", "-0.1"):
        refused = runner.invoke(app, [*base, "--operator-cap", bad])
        assert refused.exit_code == 2 and "operator-cap" in refused.stderr, bad


def test_consensus_refuses_bad_files(tmp_path: Path) -> None:
    for body in ({"round": 3, "attestations": []},
                 {"round": 1, "attestations": [{"verifier": "a", "quality": 2, "confidence": 1, "calibration": 1}]},
                 {"round": 1, "attestations": [{"verifier": "a", "quality": 0.1, "confidence": 1, "calibration": 1}] * 2},
                 "[" * 100_000):
        outcome = runner.invoke(app, ["consensus", "--attestations", str(_write(tmp_path, "a.json", body))])
        assert outcome.exit_code == 2
        assert outcome.stderr.startswith("error: ")


def test_escrowd_panel_draw_as_a_real_process(tmp_path: Path) -> None:
    pool, secret = _write(tmp_path, "pool.json", POOL), _secret(tmp_path)
    escrowd = Path(sys.executable).with_name("escrowd")
    done = subprocess.run(
        [str(escrowd), "panel", "draw", "--task-key", TASK, "--pool", str(pool), "--secret-file", str(secret)],
        capture_output=True, text=True, check=False, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)["verifiers"]) == 3
