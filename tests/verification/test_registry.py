"""The verifier registry: plugins, endpoints (a real local HTTP server), rubrics, seed 002's types."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from schemas.task_terms import VerifierRef
from verification.registry import (
    Rubric,
    RubricItem,
    RubricStore,
    VerificationError,
    VerifierConfigError,
    VerifierRegistry,
    flatten_trajectory,
)
from verification.sandbox import SandboxSettings
from verification.verifiers import default_registry

TASK: dict[str, Any] = {"taskId": 1, "prompt": "What is 6 x 7?", "reference": "42"}


def ref(kind: str, name: str = "v1", **config: Any) -> VerifierRef:
    return VerifierRef.model_validate({"kind": kind, "ref": name, "config": config})


@pytest.fixture
def registry() -> VerifierRegistry:
    return default_registry(
        allowed_plugin_packages=["tests.verification.plugins"], allowed_endpoint_hosts=["127.0.0.1"], endpoint_timeout=0.5
    )


# ---------------------------------------------------------------------------- plugins


async def test_plugin_is_imported_lazily_once_and_scores(registry: VerifierRegistry) -> None:
    """No import until the first task; later tasks reuse the cached callable."""
    sys.modules.pop("tests.verification.plugins.lazy", None)
    lazy = VerifierRef(kind="plugin", ref="tests.verification.plugins.lazy:always")
    registry.check(lazy)
    assert "tests.verification.plugins.lazy" not in sys.modules
    assert (await registry.verify(lazy, TASK, "x")).reward == 1.0
    assert "tests.verification.plugins.lazy" in sys.modules
    arithmetic = VerifierRef(kind="plugin", ref="tests.verification.plugins.scoring:score_arithmetic")
    for trajectory, expected in (("6 times 7 is 42", 1.0), ("it is 41", 0.0), ("42", 1.0)):
        assert (await registry.verify(arithmetic, TASK, trajectory)).reward == expected
    assert registry.plugin_imports == 2  # one per plugin, however many tasks


async def test_plugin_outside_the_allow_list_is_refused(registry: VerifierRegistry) -> None:
    """A module outside the allow-listed packages is refused at registration and at run time."""
    outside = VerifierRef(kind="plugin", ref="os:system")
    with pytest.raises(VerifierConfigError, match="allow-listed"):
        registry.check(outside)
    with pytest.raises(VerificationError, match="allow-listed") as caught:
        await registry.verify(outside, TASK, "x")
    assert caught.value.verifier == "plugin:os:system"
    # A prefix that only looks like the package is not inside it.
    with pytest.raises(VerifierConfigError):
        registry.check(VerifierRef(kind="plugin", ref="tests.verification.pluginsx:f"))


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("tests.verification.plugins.broken:score", "import failed"),
        ("tests.verification.plugins.missing:score", "import failed"),
        ("tests.verification.plugins.scoring:absent", "no callable"),
        ("tests.verification.plugins.scoring:no_reference", "raised ValueError"),
        ("tests.verification.plugins.scoring:not_a_number", "non-numeric"),
    ],
)
async def test_plugin_that_cannot_answer_raises_naming_it(registry: VerifierRegistry, name: str, reason: str) -> None:
    """Import errors, missing callables, exceptions and non-numbers: VerificationError, never 0."""
    plugin = VerifierRef(kind="plugin", ref=name)
    with pytest.raises(VerificationError, match=reason) as caught:
        await registry.verify(plugin, TASK, "42")
    assert caught.value.verifier == f"plugin:{name}"
    assert name in str(caught.value)


async def test_failed_import_is_not_cached(registry: VerifierRegistry) -> None:
    """A plugin that failed to import is tried again on the next task (a fixed deployment recovers)."""
    plugin = VerifierRef(kind="plugin", ref="tests.verification.plugins.broken:score")
    for _ in range(2):
        with pytest.raises(VerificationError):
            await registry.verify(plugin, TASK, "x")
    assert registry.plugin_imports == 0


# ---------------------------------------------------------------------------- endpoints


@pytest.fixture
async def endpoint() -> AsyncIterator[tuple[str, list[Any]]]:
    """A real HTTP verifier on 127.0.0.1 with one route per behaviour; yields (base URL, requests seen)."""
    seen: list[Any] = []

    async def ok(request: web.Request) -> web.Response:
        seen.append(await request.json())
        return web.json_response({"reward": 0.83})

    async def empty(_: web.Request) -> web.Response:
        return web.json_response({})

    async def text(_: web.Request) -> web.Response:
        return web.Response(text="fine")

    async def words(_: web.Request) -> web.Response:
        return web.json_response({"reward": "high"})

    async def boolean(_: web.Request) -> web.Response:
        return web.json_response({"reward": True})

    async def error(_: web.Request) -> web.Response:
        return web.json_response({"reward": 1.0}, status=503)

    async def slow(_: web.Request) -> web.Response:
        await asyncio.sleep(3)
        return web.json_response({"reward": 1.0})

    async def pieces(request: web.Request) -> web.StreamResponse:
        # A detailed report streamed as it is written: the body arrives in several pieces.
        response = web.StreamResponse(headers={"content-type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(b'{"reward": 0.83, "detail": "')
        await asyncio.sleep(0.05)
        await response.write(b"x" * 200_000 + b'"}')
        await response.write_eof()
        return response

    app = web.Application()
    for path, handler in (("/ok", ok), ("/empty", empty), ("/text", text), ("/words", words),
                          ("/bool", boolean), ("/error", error), ("/slow", slow), ("/pieces", pieces)):  # fmt: skip
        app.router.add_post(path, handler)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


async def test_endpoint_posts_task_and_trajectory_and_reads_the_reward(
    registry: VerifierRegistry, endpoint: tuple[str, list[Any]]
) -> None:
    """POST exactly {"task": {"prompt", "reference"}, "trajectory"} → {reward}."""
    base, seen = endpoint
    outcome = await registry.verify(VerifierRef(kind="endpoint", ref=f"{base}/ok"), TASK, [{"content": "hi"}])
    assert outcome.reward == 0.83
    assert seen == [{"task": {"prompt": "What is 6 x 7?", "reference": "42"}, "trajectory": [{"content": "hi"}]}]
    await registry.close()


async def test_endpoint_reply_in_pieces_is_read_whole(registry: VerifierRegistry, endpoint: tuple[str, list[Any]]) -> None:
    """A reply that arrives in several pieces (streamed, or long) is read to its end, not cut at
    the first piece and refused as not JSON (a verifier that answered would never be heard)."""
    base, _ = endpoint
    outcome = await registry.verify(VerifierRef(kind="endpoint", ref=f"{base}/pieces"), TASK, "x")
    assert outcome.reward == 0.83
    await registry.close()


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/empty", "no reward field"),
        ("/text", "not JSON"),
        ("/words", "non-numeric"),
        ("/bool", "not a number"),
        ("/error", "HTTP 503"),
        ("/slow", "no answer within 0.5 s"),
    ],
)
async def test_endpoint_that_cannot_answer_raises(
    registry: VerifierRegistry, endpoint: tuple[str, list[Any]], path: str, reason: str
) -> None:
    """`{}`, non-JSON, non-numeric, an error status or a timeout: VerificationError naming the endpoint."""
    base, _ = endpoint
    with pytest.raises(VerificationError, match=reason) as caught:
        await registry.verify(VerifierRef(kind="endpoint", ref=f"{base}{path}?token=secret"), TASK, "x")
    assert caught.value.verifier == f"endpoint:{base}{path}"
    assert "secret" not in str(caught.value)  # query strings may carry credentials
    await registry.close()


async def test_endpoint_down_or_not_allow_listed(registry: VerifierRegistry) -> None:
    """Nothing listening: unreachable. A host off the allow-list: refused before any request."""
    from runtime.services.ports import free_port

    down = VerifierRef(kind="endpoint", ref=f"http://127.0.0.1:{free_port()}/score")
    with pytest.raises(VerificationError, match="unreachable"):
        await registry.verify(down, TASK, "x")
    elsewhere = VerifierRef(kind="endpoint", ref="http://verifier.example/score")
    with pytest.raises(VerifierConfigError, match="not allow-listed"):
        registry.check(elsewhere)
    with pytest.raises(VerificationError, match="not allow-listed"):
        await registry.verify(elsewhere, TASK, "x")
    await registry.close()


def test_default_endpoint_timeout_is_60_seconds() -> None:
    """Seed 001's default."""
    assert VerifierRegistry().endpoint_timeout == 60.0


# ---------------------------------------------------------------------------- rubrics and flattening


async def test_keyword_rubric_scores_and_a_missing_rubric_raises(tmp_path: Any) -> None:
    """The built-in keyword counter (`keyword_rubric`): distinct keywords per item, weighted; gone → error."""
    store = RubricStore(tmp_path)
    store.add("alice/risks", Rubric(name="risks", items=[
        RubricItem(criterion="names risks", keywords=["latency", "outage", "fraud"], min_mentions=2, weight=3),
        RubricItem(criterion="tone"),
    ]))  # fmt: skip
    (tmp_path / "bob").mkdir()
    (tmp_path / "bob" / "style.json").write_text('{"name": "style", "items": [{"criterion": "c", "keywords": ["ok"]}]}')
    registry = default_registry(rubrics=store)
    outcome = await registry.verify(VerifierRef(kind="keyword_rubric", ref="alice/risks"), {}, "Outage risk. Outage again.")
    assert outcome.reward == pytest.approx((0.5 * 3 + 0.5 * 1) / 4)
    assert (await registry.verify(VerifierRef(kind="keyword_rubric", ref="bob/style"), {}, "all ok")).reward == 1.0
    with pytest.raises(VerificationError, match="rubric not found") as caught:
        await registry.verify(VerifierRef(kind="keyword_rubric", ref="carol/gone"), {}, "x")
    assert caught.value.verifier == "keyword_rubric:carol/gone"


async def test_rubric_without_a_judge_model_raises_never_scores() -> None:
    """Seed 001's `rubric` is the judge model's; with none configured it raises, it never counts keywords."""
    registry = VerifierRegistry()
    with pytest.raises(VerificationError, match="no rubric judge") as caught:
        await registry.verify(VerifierRef(kind="rubric", ref="alice/risks@2"), {}, "x")
    assert caught.value.verifier == "rubric:alice/risks@2"
    registry.check(VerifierRef(kind="rubric", ref="alice/risks"))
    with pytest.raises(VerifierConfigError):
        registry.check(VerifierRef(kind="rubric", ref="alice/risks@0"))


def test_trajectory_flattening() -> None:
    """A string stays, a message gives its content or text, a list is joined."""
    assert flatten_trajectory("a") == "a"
    assert flatten_trajectory({"role": "assistant", "content": "b"}) == "b"
    assert flatten_trajectory({"text": "c"}) == "c"
    assert flatten_trajectory(["a", {"content": "b"}, ["c"]]) == "a\nb\nc"
    assert flatten_trajectory(None) == ""


# ---------------------------------------------------------------------------- seed 002 types


async def test_exact_match(registry: VerifierRegistry) -> None:
    """Equal after normalisation (case, width, spacing, final period) passes; other text fails."""
    paris = ref("exact_match", expected="Paris")
    assert (await registry.verify(paris, {}, "  ＰＡＲＩＳ. ")).reward == 1.0
    assert (await registry.verify(paris, {}, {"output": "paris"})).reward == 1.0
    assert (await registry.verify(paris, {}, "Lyon")).reward == 0.0
    structured = ref("exact_match", expected={"a": 1, "b": [1, 2]})
    assert (await registry.verify(structured, {}, '{"b": [1, 2.0], "a": 1}')).reward == 1.0
    assert (await registry.verify(structured, {}, '{"a": 1}')).reward == 0.0
    assert (await registry.verify(ref("exact_match", expected="Paris", normalize=False), {}, "paris")).reward == 0.0


async def test_exact_match_strips_markup_and_punctuation_in_any_order(registry: VerifierRegistry) -> None:
    """Seed 000: "Paris.", "**Paris**" and the like are the answer `Paris`; markup around a
    final period (`**paris.**`) and a period after markup (`**Paris**.`) both normalise,
    whichever side holds them. Other words still differ."""
    paris = ref("exact_match", expected="Paris")
    for output in ("**paris.**", "**Paris**.", "`Paris.`", '"Paris!"', "*Paris*;", " **PARIS.** "):
        assert (await registry.verify(paris, {}, output)).reward == 1.0, output
    assert (await registry.verify(ref("exact_match", expected="**paris.**"), {}, "Paris")).reward == 1.0
    for output in ("Paris, France", "**Lyon.**", "Parisian"):
        assert (await registry.verify(paris, {}, output)).reward == 0.0, output


async def test_schema_validation(registry: VerifierRegistry) -> None:
    """Validates against the JSON Schema, then compares the expected values."""
    schema = {"type": "object", "required": ["name", "price"], "properties": {"price": {"type": "number"}}}
    verifier = ref("schema_validation", schema=schema, expected={"name": "Acme", "/price": 3})
    assert (await registry.verify(verifier, {}, '```json\n{"name": "Acme", "price": 3.0}\n```')).reward == 1.0
    wrong_type = await registry.verify(verifier, {}, {"name": "Acme", "price": "3"})
    assert wrong_type.reward == 0.0 and wrong_type.detail["stage"] == "SCHEMA"
    wrong_value = await registry.verify(verifier, {}, {"name": "Other", "price": 3})
    assert wrong_value.reward == 0.0 and wrong_value.detail["stage"] == "VALUES"
    assert (await registry.verify(verifier, {}, "not json")).detail["stage"] == "PARSE"
    with pytest.raises(VerifierConfigError, match="JSON Schema"):
        registry.check(ref("schema_validation", schema={"type": "no-such-type"}))


async def test_numerical_range(registry: VerifierRegistry) -> None:
    """Inside the tolerance passes; relative tolerance scales with the reference; no number fails."""
    absolute = ref("numerical_range", reference=443.21, tolerance=0.01)
    assert (await registry.verify(absolute, {}, "The total is 443.215 USD")).reward == 1.0
    assert (await registry.verify(absolute, {}, "roughly 443.3")).reward == 0.0
    assert (await registry.verify(absolute, {}, "no idea")).reward == 0.0
    relative = ref("numerical_range", reference=1000, tolerance=0.05, relative=True)
    assert (await registry.verify(relative, {}, "1,040")).reward == 1.0
    assert (await registry.verify(relative, {}, 1060)).reward == 0.0


SOLUTION = "def solve(a, b):\n    return a + b\n"


def suite(**extra: Any) -> VerifierRef:
    config: dict[str, Any] = {
        "publicTests": [{"args": [1, 2], "expected": 3}, {"args": [2, 2], "expected": 4}],
        "hiddenTests": [{"args": [10, 5], "expected": 15}, {"args": [-1, 1], "expected": 0}],
        "timeLimitMs": 2000,
        "memoryMb": 128,
    }
    config.update(extra)
    return VerifierRef(kind="test_suite", ref="TEST_SUITE://V1", config=config)


async def test_test_suite_passes_all_public_and_hidden_cases(registry: VerifierRegistry) -> None:
    """Seed 002's pipeline end to end, with its proof fields."""
    outcome = await registry.verify(suite(), {}, f"```python\n{SOLUTION}```")
    assert outcome.reward == 1.0
    measured = outcome.detail.pop("measured")
    assert outcome.detail == {
        "status": "PASS", "publicTests": "2/2", "hiddenTests": "2/2", "resourceLimits": "PASS", "stage": "PASS",
        "limits": {"timeLimitMs": 2000, "memoryMb": 128},
    }  # fmt: skip
    # Measured, not inferred: CPU time and peak memory of the runs, run twice, hash seed fixed.
    assert measured["runs"] == 2 and measured["hashSeed"] == 0
    assert 0 <= measured["cpuMs"] <= 2000 and 0 < measured["peakMemoryMb"] <= 128


async def test_test_suite_stops_at_the_failing_stage(registry: VerifierRegistry) -> None:
    """Compile error, a hidden case failing, and code that only echoes the public answers."""
    compile_error = await registry.verify(suite(), {}, "def solve(a, b) return a + b")
    assert compile_error.reward == 0.0 and compile_error.detail["stage"] == "COMPILE"
    hardcoded = "def solve(a, b):\n    return {(1, 2): 3, (2, 2): 4}.get((a, b), 0)\n"
    outcome = await registry.verify(suite(), {}, hardcoded)
    assert outcome.reward == 0.0
    assert (outcome.detail["stage"], outcome.detail["publicTests"], outcome.detail["hiddenTests"]) == (
        "HIDDEN TESTS", "2/2", "1/2",
    )  # fmt: skip
    assert outcome.reasons == ("TEST_SUITE: HIDDEN TESTS 1/2",)


async def test_test_suite_time_limit(registry: VerifierRegistry) -> None:
    """An endless loop is stopped at the CPU time limit: a FAIL at RESOURCE LIMITS, with the CPU time measured."""
    outcome = await registry.verify(suite(timeLimitMs=300), {}, "def solve(a, b):\n    while True:\n        pass\n")
    assert outcome.reward == 0.0
    assert outcome.detail["stage"] == "RESOURCE LIMITS" and outcome.detail["resourceLimits"] == "FAIL"
    assert "CPU time" in outcome.reasons[0]
    assert outcome.detail["measured"]["cpuMs"] > 300


async def test_time_limit_is_cpu_time_and_sleeping_is_bounded_separately(registry: VerifierRegistry) -> None:
    """timeLimitMs is CPU time: sleep(1.2) within 1000 ms passes; sleeping past the blocked allowance fails."""
    napper = "import time\ndef solve(a, b):\n    time.sleep(1.2)\n    return a + b\n"
    one = {"publicTests": [{"args": [1, 2], "expected": 3}], "hiddenTests": [], "timeLimitMs": 1000}
    outcome = await registry.verify(suite(**one), {}, napper)
    assert outcome.reward == 1.0, outcome.reasons
    assert outcome.detail["measured"]["cpuMs"] < 1000
    sleeper = "import time\ndef solve(a, b):\n    time.sleep(3600)\n    return a + b\n"
    outcome = await registry.verify(suite(**one), {}, sleeper)
    assert outcome.reward == 0.0 and outcome.detail["stage"] == "RESOURCE LIMITS"
    assert "blocked" in outcome.reasons[0]


async def test_test_suite_memory_limit(registry: VerifierRegistry) -> None:
    """Allocating past memoryMb fails at RESOURCE LIMITS (the address-space limit holds)."""
    greedy = "def solve(a, b):\n    block = bytearray(512 * 1024 * 1024)\n    return a + b\n"
    outcome = await registry.verify(suite(memoryMb=64, timeLimitMs=60_000), {}, greedy)
    assert outcome.reward == 0.0
    assert outcome.detail["stage"] == "RESOURCE LIMITS"
    assert "memory" in outcome.reasons[0]
    # The same code within a larger limit passes: the failure was the limit, not the code.
    roomy = await registry.verify(suite(memoryMb=1024, timeLimitMs=60_000), {}, greedy)
    assert roomy.reward == 1.0


async def test_test_suite_runs_isolated(registry: VerifierRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
    """The child sees no environment of the service and cannot write outside its directory."""
    monkeypatch.setenv("ESCROWD_DATABASE_URL", "postgresql://secret")
    probe = (
        "import os\n"
        "def solve(a, b):\n"
        "    leaked = os.environ.get('ESCROWD_DATABASE_URL')\n"
        "    try:\n"
        "        open('/etc/escrowd-sandbox-probe', 'w').write('x')\n"
        "        wrote = True\n"
        "    except OSError:\n"
        "        wrote = False\n"
        "    return a + b if leaked is None and not wrote else -1\n"
    )
    outcome = await registry.verify(suite(), {}, probe)
    assert outcome.reward == 1.0, outcome.detail


async def test_execution_result_measures_instead_of_trusting(registry: VerifierRegistry) -> None:
    """The number comes from the harness: a pass rate, the measured CPU, or the task's own scorer."""
    cases = [{"args": [10], "expected": 45}, {"args": [4], "expected": 6}]
    rate = VerifierRef(
        kind="execution_result", ref="rate", config={"cases": cases, "measure": "pass_rate", "threshold": 1.0}
    )
    assert (await registry.verify(rate, {}, "def solve(n):\n    return sum(range(n))\n")).reward == 1.0
    boast = await registry.verify(rate, {}, "def solve(n):\n    return 10**9\n")
    assert boast.reward == 0.0 and boast.detail["result"] == 0.0
    scorer = "def score(args_list, outputs):\n    return sum(1000 - len(str(o)) for o in outputs)\n"
    scored = VerifierRef(
        kind="execution_result", ref="gas",
        config={"cases": cases, "measure": "score", "scorer": scorer, "threshold": 1990, "metric": "gasSaved"},
    )  # fmt: skip
    outcome = await registry.verify(scored, {}, "def solve(n):\n    return sum(range(n))\n")
    assert outcome.reward == 1.0 and outcome.detail["gasSaved"] == 1997
    assert (await registry.verify(scored, {}, "def solve(n):\n    return 10**9\n")).reward == 0.0
    # A configuration that would trust the submission's own number is refused.
    with pytest.raises(VerifierConfigError, match="measure"):
        registry.check(VerifierRef(kind="execution_result", ref="gas", config={"args": [1], "threshold": 40}))


async def test_forged_result_lines_without_solve_fail(registry: VerifierRegistry) -> None:
    """Code with no `solve` that writes the runner's result lines to every descriptor it finds fails.

    It can reach only the worker's value pipe (never the result channel), so the most it can
    do is claim values in order: the public answers it knows, never the hidden ones.
    """
    forger = (
        "import os\n"
        "lines = b'{\"event\": \"loaded\"}\\n' + b''.join(\n"
        "    b'{\"event\": \"case\", \"i\": %d, \"ok\": true, \"value\": %d}\\n' % (i, v)\n"
        "    for i, v in enumerate([3, 4, 15, 0])) + b'{\"event\": \"done\"}\\n'\n"
        "for fd in range(3, 64):\n"
        "    try:\n"
        "        os.write(fd, lines)\n"
        "    except OSError:\n"
        "        pass\n"
        "print(lines.decode())\n"
    )
    outcome = await registry.verify(suite(), {}, forger)
    assert outcome.reward == 0.0
    assert outcome.detail["stage"] in ("ISOLATE", "HIDDEN TESTS") and outcome.detail["hiddenTests"] != "2/2"


async def test_sandbox_unavailable_is_could_not_answer() -> None:
    """A sandbox that cannot start is the verifier's fault: VerificationError, never a zero."""
    broken = default_registry(sandbox_settings=SandboxSettings(bwrap="/bin/false"))
    with pytest.raises(VerificationError, match="did not start"):
        await broken.verify(suite(), {}, SOLUTION)


async def test_nondeterministic_code_fails_at_determinism(registry: VerifierRegistry) -> None:
    """Two runs that disagree are the submission's fault (seed 002): a FAIL at DETERMINISM, both digests shown."""
    coin = "import os\ndef solve(a, b):\n    return a + b + os.urandom(1)[0] % 2\n"
    many = [{"args": [i, i], "expected": 2 * i} for i in range(20)]
    outcome = await registry.verify(suite(publicTests=many), {}, coin)
    assert outcome.reward == 0.0 and outcome.detail["stage"] == "DETERMINISM", outcome
    digests = outcome.detail["runDigests"]
    assert len(digests) == 2 and digests[0] != digests[1]
    assert all(d.startswith("0x") and len(d) == 66 for d in digests)
    assert "DETERMINISM" in outcome.reasons[0]


async def test_optimization_score(registry: VerifierRegistry) -> None:
    """A scorer plugin's raw value must beat the baseline."""
    scorer = {"kind": "plugin", "ref": "tests.verification.plugins.scoring:length_score"}
    longer = VerifierRef(kind="optimization_score", ref="len", config={"scorer": scorer, "baseline": 5})
    assert (await registry.verify(longer, {}, "abcdefgh")).reward == 1.0
    assert (await registry.verify(longer, {}, "abc")).reward == 0.0
    shorter = VerifierRef(kind="optimization_score", ref="len", config={"scorer": scorer, "baseline": 5, "direction": "min"})
    assert (await registry.verify(shorter, {}, "abc")).reward == 1.0


async def test_multi_verifier(registry: VerifierRegistry) -> None:
    """Every part must pass; a part that cannot answer makes the whole unable to answer."""
    parts = [
        {"kind": "exact_match", "ref": "a", "config": {"expected": "42"}},
        {"kind": "numerical_range", "ref": "b", "config": {"reference": 42, "tolerance": 0}},
    ]
    multi = VerifierRef(kind="multi_verifier", ref="both", config={"verifiers": parts})
    assert (await registry.verify(multi, {}, "42")).reward == 1.0
    failed = await registry.verify(multi, {}, "42.5")
    assert failed.reward == 0.0 and [p["passed"] for p in failed.detail["verifiers"]] == [False, False]
    broken = VerifierRef(
        kind="multi_verifier", ref="both",
        config={"verifiers": [*parts, {"kind": "plugin", "ref": "tests.verification.plugins.scoring:no_reference"}]},
    )  # fmt: skip
    with pytest.raises(VerificationError, match="no_reference"):
        await registry.verify(broken, {}, "42")
    deep: dict[str, Any] = {"kind": "exact_match", "ref": "x", "config": {"expected": "1"}}
    for _ in range(4):
        deep = {"kind": "multi_verifier", "ref": "m", "config": {"verifiers": [deep]}}
    with pytest.raises(VerifierConfigError, match="nest"):
        registry.check(VerifierRef.model_validate(deep))


async def test_invalid_type_config_cannot_answer(registry: VerifierRegistry) -> None:
    """A built-in type with a broken config is refused at registration and raises at run time."""
    bad = ref("numerical_range", reference="far")
    with pytest.raises(VerifierConfigError, match="reference"):
        registry.check(bad)
    with pytest.raises(VerificationError, match="invalid configuration"):
        await registry.verify(bad, {}, "1")
    assert set(registry.kinds) == {
        "rubric", "plugin", "endpoint", "exact_match", "schema_validation", "numerical_range", "test_suite",
        "execution_result", "optimization_score", "multi_verifier", "keyword_rubric",
    }  # fmt: skip


def test_seccomp_program_is_built_for_x86_64_only() -> None:
    """A whole number of 8-byte BPF instructions ending in ALLOW then EPERM; no filter elsewhere."""
    from verification.sandbox import DENIED_SYSCALLS_X86_64, seccomp_program

    program = seccomp_program("x86_64")
    # arch check, x32 check, one test per denied call, prlimit64's pid test (3),
    # rt_sigaction's SIGCHLD test (7), ALLOW, EPERM (what each does: test_sandbox_core.py).
    assert program is not None and len(program) == 8 * (6 + len(DENIED_SYSCALLS_X86_64) + 3 + 7 + 2)
    assert program[-16:-8] == bytes.fromhex("060000000000ff7f") and program[-8:] == bytes.fromhex("0600000001000500")
    assert seccomp_program("aarch64") is None


async def test_memory_spread_over_processes_counts_in_total(registry: VerifierRegistry) -> None:
    """Children that each stay under the address-space limit but together exceed memoryMb fail at RESOURCE LIMITS."""
    family = (
        "import os, time\n"
        "def solve(a, b):\n"
        "    for _ in range(6):\n"
        "        if os.fork() == 0:\n"
        "            block = bytearray(40 * 1024 * 1024)\n"
        "            time.sleep(30)\n"
        "            os._exit(0)\n"
        "    time.sleep(30)\n"
        "    return a + b\n"
    )
    outcome = await registry.verify(suite(memoryMb=128, timeLimitMs=20_000), {}, family)
    assert outcome.reward == 0.0 and outcome.detail["stage"] == "RESOURCE LIMITS"
    assert "memory" in outcome.reasons[0] and outcome.detail["measured"]["peakMemoryMb"] > 128
