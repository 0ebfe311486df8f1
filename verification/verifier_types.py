"""Seed 002's verifier types, registered in the verifier registry under their own kinds.

| kind                 | passes when (reward 1.0, else 0.0)                                      |
| -------------------- | ----------------------------------------------------------------------- |
| `exact_match`        | the output equals `expected` after normalisation                        |
| `schema_validation`  | the output's JSON validates against `schema`, then `expected` values match |
| `numerical_range`    | the output's number is within `tolerance` of `reference`                |
| `test_suite`         | the code compiles and every public, then every hidden, case passes within `timeLimitMs` and `memoryMb`, the same on both runs |
| `execution_result`   | a quantity the harness measures (pass rate, CPU, memory, the task's scorer) meets `threshold` |
| `optimization_score` | a scorer verifier's raw reward beats `baseline`                         |
| `multi_verifier`     | every listed verifier passes                                            |

A wrong answer is a reward of 0.0 with the stage that failed; only a verifier that cannot
run (bad configuration, sandbox unavailable, a sub-verifier that cannot answer) raises
`VerificationError`. Everything here is deterministic: same output, same configuration,
same answer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from schemas import jsonbounds
from schemas.task_terms import VerifierRef
from verification.registry import (
    ResolvedVerifier,
    VerificationError,
    VerifierConfigError,
    VerifierOutcome,
    VerifierRegistry,
    describe,
    flatten_trajectory,
)
from verification.sandbox import (
    HASH_SEED,
    SandboxRun,
    SandboxUnavailable,
    Stage,
    json_equal,
    run_stages,
    strip_code_fences,
)

MAX_NESTING = 3
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")

_CONFIG = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def _config(model: type[BaseModel], ref: VerifierRef) -> Any:
    try:
        return model.model_validate(ref.config)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "config"
        raise VerifierConfigError(f"{where}: {first['msg']}") from None


def _passfail(passed: bool, detail: dict[str, Any], reason: str | None = None) -> VerifierOutcome:
    detail = {"status": "PASS" if passed else "FAIL", **detail}
    return VerifierOutcome(reward=1.0 if passed else 0.0, detail=detail, reasons=() if reason is None else (reason,))


def output_text(trajectory: Any) -> str:
    """The text a verifier reads: a string `output` field when there is one, else the flattened trajectory."""
    if isinstance(trajectory, Mapping) and isinstance(trajectory.get("output"), str):
        return str(trajectory["output"])
    return flatten_trajectory(trajectory)


def output_json(trajectory: Any) -> Any:
    """The output as a JSON value: taken as is, or parsed from its text (code fences removed)."""
    if isinstance(trajectory, Mapping) and isinstance(trajectory.get("output"), str):
        trajectory = trajectory["output"]
    if not isinstance(trajectory, str):
        return trajectory
    try:
        # Bounded: the text is the agent's, and may nest 100,000 levels inside one flat string.
        return jsonbounds.loads(strip_code_fences(trajectory), max_bytes=None)
    except ValueError:
        return _Missing


class _MissingType:
    """Marker: the output holds no JSON value."""


_Missing = _MissingType()


def normalize_text(text: str) -> str:
    """NFKC, case folded, whitespace collapsed; then wrapping markup (`` ` * " ' ``) and
    trailing sentence punctuation are peeled off until neither is left, so `**paris.**`,
    `**Paris**.` and `Paris` are equal whichever order they nest in."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    peeled = " ".join(folded.split())
    previous = None
    while peeled != previous:
        previous = peeled
        peeled = peeled.strip("`*\"' ").rstrip(".!; ")
    return peeled


_json_equal = json_equal


# ---------------------------------------------------------------------------- exact match


ConfigT = TypeVar("ConfigT", bound=BaseModel)


@dataclass(frozen=True)
class _Configured(Generic[ConfigT]):
    """What every configured verifier type holds: its name (for reasons) and its checked config."""

    name: str
    config: ConfigT


class ExactMatchConfig(BaseModel):
    model_config = _CONFIG

    expected: Any
    normalize: bool = True


class ExactMatch(_Configured[ExactMatchConfig]):
    async def __call__(self, task: Mapping[str, Any], trajectory: Any) -> VerifierOutcome:
        expected = self.config.expected
        if isinstance(expected, str):
            text = output_text(trajectory)
            if self.config.normalize:
                passed = normalize_text(text) == normalize_text(expected)
            else:
                passed = text == expected
        else:
            value = output_json(trajectory)
            passed = value is not _Missing and _json_equal(value, expected)
        return _passfail(passed, {}, None if passed else "EXACT_MATCH: output differs from the expected value")


# ---------------------------------------------------------------------------- schema validation


class SchemaValidationConfig(BaseModel):
    model_config = _CONFIG

    json_schema: dict[str, Any] = Field(alias="schema")
    expected: dict[str, Any] = Field(default_factory=dict)


def _pointer(document: Any, path: str) -> Any:
    if not path.startswith("/"):
        return document.get(path, _Missing) if isinstance(document, dict) else _Missing
    current = document
    for token in path[1:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(current, dict) and token in current:
            current = current[token]
        elif isinstance(current, list) and token.isdigit() and int(token) < len(current):
            current = current[int(token)]
        else:
            return _Missing
    return current


class SchemaValidation(_Configured[SchemaValidationConfig]):
    async def __call__(self, task: Mapping[str, Any], trajectory: Any) -> VerifierOutcome:
        value = output_json(trajectory)
        if value is _Missing:
            return _passfail(False, {"stage": "PARSE"}, "SCHEMA_VALIDATION: output is not JSON")
        validator = jsonschema.Draft202012Validator(self.config.json_schema)
        error = jsonschema.exceptions.best_match(validator.iter_errors(value))
        if error is not None:
            where = "/" + "/".join(str(p) for p in error.absolute_path)
            return _passfail(False, {"stage": "SCHEMA"}, f"SCHEMA_VALIDATION: {where}: {error.message}"[:300])
        for path, expected in self.config.expected.items():
            found = _pointer(value, path)
            if found is _Missing or not _json_equal(found, expected):
                return _passfail(False, {"stage": "VALUES"}, f"SCHEMA_VALIDATION: {path} differs from the expected value")
        return _passfail(True, {"stage": "VALUES"})


def _local_resolver(schema: Mapping[str, Any]) -> tuple[Any, Any]:
    """The schema as a 2020-12 resource and a resolver over it alone (nothing is fetched),
    crawled once: a lookup that misses in an uncrawled registry crawls the whole schema again,
    so thousands of references to nothing took minutes."""
    from referencing import Registry
    from referencing.jsonschema import DRAFT202012

    root = DRAFT202012.create_resource(dict(schema))
    base = root.id() or ""
    return root, Registry().with_resource(base, root).crawl().resolver(base)


def unresolvable_refs(schema: Mapping[str, Any]) -> list[str]:
    """The `$ref`s and `$dynamicRef`s of a schema that do not resolve within it. Nothing is
    fetched, so a remote reference never resolves; references below a nested `$id` (another
    base URI) are left to the evaluation.

    The walk follows the keywords that hold schemas (`properties`' values, `items`, ...), as the
    evaluation does: a property named `const` is a schema, an unknown keyword's value is data."""
    from referencing import Resource
    from referencing.exceptions import Unresolvable

    root, resolver = _local_resolver(schema)
    missing: list[str] = []

    def walk(resource: Resource[Any], top: bool) -> None:
        node = resource.contents
        if not isinstance(node, dict) or (not top and "$id" in node):
            return
        for keyword in ("$ref", "$dynamicRef"):
            ref = node.get(keyword)
            if isinstance(ref, str):
                try:
                    resolver.lookup(ref)
                except Unresolvable:
                    missing.append(ref)
        for sub in resource.subresources():
            walk(sub, False)

    walk(root, True)
    return missing


_IN_PLACE = ("allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas")
"""Keywords that apply their schemas to the same instance (with `$ref` and `$dynamicRef`)."""


def refers_to_itself(schema: Mapping[str, Any]) -> bool:
    """Whether a schema reaches itself through references and keywords applied to the same
    instance (`{"$ref": "#"}`, `{"anyOf": [{"$ref": "#"}]}`): such a schema passes every
    static check and recurses at evaluation until RecursionError. A cycle that descends into
    the instance (`items`, `properties`) ends with the instance, and is fine. Nodes below a
    nested `$id` are left to the evaluation, as in `unresolvable_refs`."""
    from referencing.exceptions import Unresolvable
    from referencing.jsonschema import DRAFT202012

    root, resolver = _local_resolver(schema)

    def next_in_place(node: dict[str, Any]) -> list[Any]:
        found: list[Any] = []
        for keyword in ("$ref", "$dynamicRef"):
            ref = node.get(keyword)
            if isinstance(ref, str):
                with contextlib.suppress(Unresolvable):  # refused by `unresolvable_refs`
                    found.append(resolver.lookup(ref).contents)
        for keyword in _IN_PLACE:
            value = node.get(keyword)
            if isinstance(value, list):
                found.extend(value)
            elif isinstance(value, dict):
                found.extend(value.values() if keyword == "dependentSchemas" else [value])
        return [n for n in found if isinstance(n, dict) and (n is root.contents or "$id" not in n)]

    # Every schema node, each the start of an in-place walk: found by the keywords that hold
    # schemas, and by references (a reference may point into data, which is then a schema).
    nodes: dict[int, dict[str, Any]] = {}
    pending: list[Any] = [root.contents]
    while pending:
        node = pending.pop()
        if not isinstance(node, dict) or id(node) in nodes or (node is not root.contents and "$id" in node):
            continue
        nodes[id(node)] = node
        pending.extend(sub.contents for sub in DRAFT202012.create_resource(node).subresources())
        pending.extend(next_in_place(node))

    # Depth-first, without recursion (the chains are the poster's): grey while on the path.
    done: set[int] = set()
    on_path: set[int] = set()
    for start in nodes.values():
        if id(start) in done:
            continue
        stack: list[tuple[dict[str, Any], list[Any]]] = [(start, next_in_place(start))]
        on_path.add(id(start))
        while stack:
            node, children = stack[-1]
            if not children:
                stack.pop()
                on_path.discard(id(node))
                done.add(id(node))
                continue
            child = children.pop()
            if id(child) in on_path:
                return True
            if id(child) not in done:
                on_path.add(id(child))
                stack.append((child, next_in_place(child)))
    return False


def _schema_validation(registry: VerifierRegistry, ref: VerifierRef) -> ResolvedVerifier:
    config: SchemaValidationConfig = _config(SchemaValidationConfig, ref)
    try:
        jsonschema.Draft202012Validator.check_schema(config.json_schema)
    except jsonschema.exceptions.SchemaError as exc:
        raise VerifierConfigError(f"schema is not a valid JSON Schema: {exc.message}"[:300]) from None
    # A `$ref` to nothing passes the schema check and raises at every evaluation: the job
    # would be retried until an operator is paged, for the poster's mistake.
    missing = unresolvable_refs(config.json_schema)
    if missing:
        raise VerifierConfigError(
            f"schema $ref {missing[0][:100]!r} does not resolve within the schema (remote schemas are not fetched)"
        )
    # Nor may it reach itself without descending into the output: a RecursionError at every
    # evaluation, the same retries for the same mistake.
    if refers_to_itself(config.json_schema):
        raise VerifierConfigError("schema refers back to itself without descending into the output (a $ref cycle)")
    return SchemaValidation(describe(ref), config)


# ---------------------------------------------------------------------------- numerical range


class NumericalRangeConfig(BaseModel):
    model_config = _CONFIG

    reference: float = Field(allow_inf_nan=False)
    tolerance: float = Field(ge=0, allow_inf_nan=False)
    relative: bool = False


def extract_number(trajectory: Any) -> float | None:
    """The answer as a number: the JSON number itself, else the last number in the text."""
    value = output_json(trajectory)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value) if math.isfinite(float(value)) else None
    matches = _NUMBER.findall(output_text(trajectory).replace(",", ""))
    if not matches:
        return None
    number = float(matches[-1])
    return number if math.isfinite(number) else None


class NumericalRange(_Configured[NumericalRangeConfig]):
    async def __call__(self, task: Mapping[str, Any], trajectory: Any) -> VerifierOutcome:
        number = extract_number(trajectory)
        if number is None:
            return _passfail(False, {}, "NUMERICAL_RANGE: no number in the output")
        bound = self.config.tolerance * (abs(self.config.reference) if self.config.relative else 1.0)
        distance = abs(number - self.config.reference)
        passed = distance <= bound
        return _passfail(
            passed,
            {"answer": number},
            None if passed else f"NUMERICAL_RANGE: {number:g} is {distance:g} from the reference (tolerance {bound:g})",
        )


# ---------------------------------------------------------------------------- code: test suite and execution


class SuiteCase(BaseModel):
    model_config = _CONFIG

    args: list[Any] = Field(default_factory=list)
    expected: Any = None


class _SandboxLimits(BaseModel):
    model_config = _CONFIG

    language: Literal["python"] = "python"
    entrypoint: str = Field(default="solve", pattern=r"^[A-Za-z_]\w*$")
    time_limit_ms: int = Field(default=2000, ge=50, le=60_000, alias="timeLimitMs")
    memory_mb: int = Field(default=256, ge=32, le=4096, alias="memoryMb")


class SuiteConfig(_SandboxLimits):
    public_tests: list[SuiteCase] = Field(default_factory=list, alias="publicTests", max_length=500)
    hidden_tests: list[SuiteCase] = Field(default_factory=list, alias="hiddenTests", max_length=500)


RUNS_PER_CHECK = 2
"""Every sandboxed check runs twice; runs that disagree are a FAIL at DETERMINISM (seed 002:
a verifier gives the same answer twice, so code that does not is the submission's fault)."""

_RESOURCE_STAGES = ("time_limit", "memory_limit", "blocked")


def _resource_failure(run: SandboxRun) -> str | None:
    if run.stage in _RESOURCE_STAGES:
        return run.error or run.stage
    return None


def run_digest(run: SandboxRun, hidden_from: int | None = None) -> str:
    """The digest of what must be equal between two runs; hidden cases enter only as pass or fail.

    `hidden_from`: the index of the first hidden case (with their expected values applied by
    the caller, a hidden case's value never reaches the digest, which the agent can read).
    """
    signature = run.signature()
    if hidden_from is not None:
        stage, stages_run, cases = signature
        signature = (stage, stages_run, cases[:hidden_from], tuple(ok for ok, *_ in cases[hidden_from:]))
    return "0x" + hashlib.sha256(json.dumps(signature, default=str).encode()).hexdigest()


@dataclass(frozen=True)
class Disagreement:
    """Two runs of the same code that did not give the same answer."""

    digests: tuple[str, ...]
    stages: tuple[str, ...]


async def _run(
    registry: VerifierRegistry, source: str, config: _SandboxLimits, stages: list[Stage], name: str,
    entrypoint: str | None = None, judge: Any = None,
) -> tuple[SandboxRun, dict[str, Any], Disagreement | None]:
    """Run the code `RUNS_PER_CHECK` times: the first run, what was measured over all, and any disagreement.

    `judge(run)` maps a run to what must agree (default: the run's digest); a
    `SandboxUnavailable` (our environment could not answer) raises `VerificationError`.
    """
    runs: list[SandboxRun] = []
    for _ in range(RUNS_PER_CHECK):
        try:
            runs.append(
                await run_stages(
                    source, entrypoint or config.entrypoint, stages,
                    time_limit_ms=config.time_limit_ms, memory_mb=config.memory_mb,
                    settings=registry.sandbox_settings,
                )
            )  # fmt: skip
        except SandboxUnavailable as exc:
            raise VerificationError(name, str(exc)) from None
    # A run that passed a limit is a FAIL at RESOURCE LIMITS whatever the other did (two runs
    # stopped at different moments differ in their partial outcomes, not in the finding).
    limited = [run for run in runs if run.stage in _RESOURCE_STAGES]
    first = limited[0] if limited else runs[0]
    measured = {
        "cpuMs": max(run.cpu_ms for run in runs),
        "peakMemoryMb": max(run.peak_memory_mb for run in runs),
        "runs": len(runs),
        "hashSeed": HASH_SEED,
        "accounting": first.accounting,
    }
    digests = tuple(judge(run) if judge is not None else run_digest(run) for run in runs)
    disagreement = None
    if len(set(digests)) > 1 and not limited:
        disagreement = Disagreement(digests, tuple(run.stage for run in runs))
    return first, measured, disagreement


def _merge_measured(total: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any]:
    if not total:
        return dict(measured)
    return {
        **total,
        "cpuMs": max(total["cpuMs"], measured["cpuMs"]),
        "peakMemoryMb": max(total["peakMemoryMb"], measured["peakMemoryMb"]),
    }


def _determinism_fail(prefix: str, detail: dict[str, Any], disagreement: Disagreement) -> VerifierOutcome:
    return _passfail(
        False,
        {**detail, "stage": "DETERMINISM", "runDigests": list(disagreement.digests)},
        f"{prefix}: DETERMINISM: {len(disagreement.digests)} runs of the same code gave different results",
    )


@dataclass(frozen=True)
class SuiteVerifier(_Configured[SuiteConfig]):
    """Seed 002's pipeline: SUBMISSION → COMPILE → ISOLATE → PUBLIC → HIDDEN → RESOURCE LIMITS → DETERMINISM.

    One sandbox per run loads the code once; the hidden cases' arguments are sent into it only
    after it loaded and passed every public case. What the agent reads of the hidden stage is
    its count and, for a run that did not finish, the kind of limit or "crashed": never an
    error text, a value or an exit status (each could carry the hidden inputs out).
    """

    registry: VerifierRegistry

    async def __call__(self, task: Mapping[str, Any], trajectory: Any) -> VerifierOutcome:
        source = strip_code_fences(output_text(trajectory))
        public, hidden = self.config.public_tests, self.config.hidden_tests
        n_public, n_hidden = len(public), len(hidden)
        limits = {"timeLimitMs": self.config.time_limit_ms, "memoryMb": self.config.memory_mb}
        detail: dict[str, Any] = {"publicTests": f"0/{n_public}", "hiddenTests": f"0/{n_hidden}", "limits": limits}
        if not source.strip():
            return _passfail(False, {**detail, "stage": "SUBMISSION"}, "TEST_SUITE: SUBMISSION: no code")
        stages = [
            Stage.of([c.args for c in public], [c.expected for c in public]),
            Stage.of([c.args for c in hidden], [c.expected for c in hidden]),
        ]

        def judged(run: SandboxRun) -> str:
            # Hidden values are replaced by whether they were right before the digest.
            marked = dataclasses.replace(
                run,
                cases=run.cases[:n_public] + tuple(
                    dataclasses.replace(o, value=None, ok=o.ok and _json_equal(o.value, c.expected))
                    for o, c in zip(run.cases[n_public:], hidden, strict=False)
                ),
            )
            return run_digest(marked, hidden_from=n_public)

        run, measured, disagreement = await _run(self.registry, source, self.config, stages, self.name, judge=judged)
        # Once the hidden cases were in the sandbox, the code could encode them in how long it
        # runs or how much it holds: the figures the agent reads are coarse then.
        detail["measured"] = _coarse(measured, self.config) if run.stages_run > 1 else measured
        if run.stage in ("compile", "load"):
            stage_name = "COMPILE" if run.stage == "compile" else "ISOLATE"
            # Load errors are the agent's own text and no case was in the sandbox yet.
            return self._checked(disagreement, detail, stage_name, f"TEST_SUITE: {stage_name}: {run.error}")
        public_out, hidden_out = run.cases[:n_public], run.cases[n_public:]
        passed_public = sum(1 for c, o in zip(public, public_out, strict=False) if o.ok and _json_equal(o.value, c.expected))
        passed_hidden = sum(1 for c, o in zip(hidden, hidden_out, strict=False) if o.ok and _json_equal(o.value, c.expected))
        detail["publicTests"] = f"{passed_public}/{n_public}"
        detail["hiddenTests"] = f"{passed_hidden}/{n_hidden}"
        in_hidden = run.stages_run > 1
        resource_error = _resource_failure(run)
        if resource_error is not None:
            detail["resourceLimits"] = "FAIL"
            shown = _limit_kind(run) if in_hidden else resource_error
            return self._checked(disagreement, detail, "RESOURCE LIMITS", f"TEST_SUITE: RESOURCE LIMITS: {shown}")
        if run.stage == "isolate":
            return self._checked(disagreement, detail, "ISOLATE", f"TEST_SUITE: ISOLATE: {run.error}")
        for stage, cases, outcomes, passed, hide in (
            ("PUBLIC TESTS", public, public_out, passed_public, False),
            ("HIDDEN TESTS", hidden, hidden_out, passed_hidden, True),
        ):
            if len(outcomes) < len(cases) and not run.completed:
                why = "crashed" if hide else run.error
                return self._checked(disagreement, detail, stage, f"TEST_SUITE: {stage}: {why}")
            if passed < len(cases):
                errors = sorted({o.error for o in outcomes if not o.ok and o.error})
                extra = f" (errors: {', '.join(errors)})" if errors and hide else ""
                return self._checked(disagreement, detail, stage, f"TEST_SUITE: {stage} {passed}/{len(cases)}{extra}")
        if disagreement is not None:
            return _determinism_fail("TEST_SUITE", detail, disagreement)
        detail["resourceLimits"] = "PASS"
        return _passfail(True, {**detail, "stage": "PASS"})

    def _checked(
        self, disagreement: Disagreement | None, detail: dict[str, Any], stage: str, reason: str
    ) -> VerifierOutcome:
        # A FAIL either way: runs that disagree are reported as such, with both digests.
        if disagreement is not None:
            return _determinism_fail("TEST_SUITE", detail, disagreement)
        return _passfail(False, {**detail, "stage": stage}, reason)


MEASURE_STEPS = 10
"""After the hidden stage, measurements are shown rounded up to a tenth of their limit."""


def _coarse(measured: dict[str, Any], config: _SandboxLimits) -> dict[str, Any]:
    cpu_step = max(1, config.time_limit_ms // MEASURE_STEPS)
    mem_step = max(1, config.memory_mb // MEASURE_STEPS)
    return {
        **measured,
        "cpuMs": -(-int(measured["cpuMs"]) // cpu_step) * cpu_step,
        "peakMemoryMb": float(-(-math.ceil(float(measured["peakMemoryMb"])) // mem_step) * mem_step),
    }


def _limit_kind(run: SandboxRun) -> str:
    return {"time_limit": "CPU time limit", "memory_limit": "memory limit", "blocked": "blocked limit"}.get(
        run.stage, run.stage
    )


Measure = Literal["pass_rate", "cpu_ms", "peak_memory_mb", "score"]


class ExecutionResultConfig(_SandboxLimits):
    """What is measured comes from the harness, never from the submission's own report.

    * `pass_rate`: the fraction of `cases` whose returned value equals `expected`;
    * `cpu_ms` / `peak_memory_mb`: measured over the run of every case (all must complete);
    * `score`: the task's own metric, `scorer` (Python source defining
      `score(args_list, outputs) -> number`), run in its own sandbox over the outputs.
    """

    cases: list[SuiteCase] = Field(default_factory=list, max_length=500)
    args: list[Any] | None = None
    measure: Measure
    scorer: str | None = Field(default=None, max_length=100_000)
    threshold: float = Field(allow_inf_nan=False)
    direction: Literal["max", "min"] = "max"
    metric: str = Field(default="result", max_length=100)

    def all_cases(self) -> list[SuiteCase]:
        """`cases`, or the single case `args` (the older shorthand)."""
        if self.cases:
            return list(self.cases)
        return [SuiteCase(args=list(self.args or []))]


def _execution_result(registry: VerifierRegistry, ref: VerifierRef) -> ResolvedVerifier:
    config: ExecutionResultConfig = _config(ExecutionResultConfig, ref)
    if config.measure == "score" and not (config.scorer or "").strip():
        raise VerifierConfigError("measure 'score' needs the task's scorer source")
    return ExecutionResult(describe(ref), config, registry)


@dataclass(frozen=True)
class ExecutionResult(_Configured[ExecutionResultConfig]):
    registry: VerifierRegistry

    async def __call__(self, task: Mapping[str, Any], trajectory: Any) -> VerifierOutcome:
        source = strip_code_fences(output_text(trajectory))
        cases = self.config.all_cases()
        run, measured, disagreement = await _run(
            self.registry, source, self.config, [Stage.of([c.args for c in cases])], self.name
        )
        base = {"measure": self.config.measure, "measured": measured}
        if disagreement is not None:
            return _determinism_fail("EXECUTION_RESULT", base, disagreement)
        if run.stage in ("compile", "load"):
            return _passfail(False, {**base, "stage": "COMPILE"}, f"EXECUTION_RESULT: COMPILE: {run.error}")
        resource_error = _resource_failure(run)
        if resource_error is not None:
            return _passfail(False, {**base, "stage": "RESOURCE LIMITS"}, f"EXECUTION_RESULT: RESOURCE LIMITS: {resource_error}")
        if not run.completed:
            return _passfail(False, {**base, "stage": "RUN"}, f"EXECUTION_RESULT: RUN: {run.error}")
        value = await self._measure(run, measured, cases)
        if self.config.direction == "max":
            passed = value >= self.config.threshold
        else:
            passed = value <= self.config.threshold
        detail = {**base, "stage": "RUN", self.config.metric: value, "threshold": self.config.threshold}
        reason = None if passed else f"EXECUTION_RESULT: {self.config.metric} {value:g} misses {self.config.threshold:g}"
        return _passfail(passed, detail, reason)

    async def _measure(self, run: SandboxRun, measured: dict[str, Any], cases: list[SuiteCase]) -> float:
        measure = self.config.measure
        if measure == "cpu_ms":
            return float(measured["cpuMs"])
        if measure == "peak_memory_mb":
            return float(measured["peakMemoryMb"])
        outputs = [outcome.value if outcome.ok else None for outcome in run.cases]
        if measure == "pass_rate":
            good = sum(1 for case, out in zip(cases, outputs, strict=True) if _json_equal(out, case.expected))
            return good / len(cases)
        # The scorer is the task's own code, not the submission's: if its runs disagree, this
        # verifier cannot answer.
        scored, _, scorer_disagreement = await _run(
            self.registry, self.config.scorer or "", self.config, [Stage.of([[[c.args for c in cases], outputs]])],
            f"{self.name} (scorer)", entrypoint="score",
        )  # fmt: skip
        if scorer_disagreement is not None:
            raise VerificationError(self.name, "the task's scorer gave different results on two runs")
        value = scored.cases[0].value if scored.completed and scored.cases and scored.cases[0].ok else None
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise VerificationError(self.name, f"the task's scorer gave no number ({scored.stage}: {scored.error})")
        return float(value)


# ---------------------------------------------------------------------------- composites


class OptimizationScoreConfig(BaseModel):
    model_config = _CONFIG

    scorer: VerifierRef
    baseline: float = Field(allow_inf_nan=False)
    direction: Literal["max", "min"] = "max"


@dataclass(frozen=True)
class OptimizationScore(_Configured[OptimizationScoreConfig]):
    scorer: ResolvedVerifier

    async def __call__(self, task: Mapping[str, Any], trajectory: Any) -> VerifierOutcome:
        outcome = await self.scorer(task, trajectory)
        score = outcome.reward
        beats = score > self.config.baseline if self.config.direction == "max" else score < self.config.baseline
        reason = None if beats else f"OPTIMIZATION_SCORE: {score:g} does not beat the baseline {self.config.baseline:g}"
        return _passfail(beats, {"score": score, "baseline": self.config.baseline}, reason)


class MultiVerifierConfig(BaseModel):
    model_config = _CONFIG

    verifiers: list[VerifierRef] = Field(min_length=1, max_length=10)


@dataclass(frozen=True)
class MultiVerifier:
    name: str
    parts: tuple[tuple[VerifierRef, ResolvedVerifier], ...]

    async def __call__(self, task: Mapping[str, Any], trajectory: Any) -> VerifierOutcome:
        results: list[dict[str, Any]] = []
        reasons: list[str] = []
        all_passed = True
        # Every part runs, in order, even after a failure: the proof lists them all.
        for ref, verifier in self.parts:
            outcome = await verifier(task, trajectory)
            passed = outcome.reward >= ref.pass_reward
            all_passed = all_passed and passed
            results.append({"verifier": describe(ref), "reward": outcome.reward, "passed": passed})
            if not passed:
                reasons.extend(outcome.reasons or (f"{describe(ref)}: reward {outcome.reward:g}",))
        return VerifierOutcome(
            reward=1.0 if all_passed else 0.0,
            detail={"status": "PASS" if all_passed else "FAIL", "verifiers": results},
            reasons=tuple(reasons),
        )


def _depth(ref: VerifierRef) -> int:
    nested: list[Any] = []
    if ref.kind == "multi_verifier":
        nested = list(ref.config.get("verifiers") or [])
    elif ref.kind == "optimization_score" and ref.config.get("scorer") is not None:
        nested = [ref.config["scorer"]]
    depth = 0
    for item in nested:
        try:
            depth = max(depth, _depth(VerifierRef.model_validate(item)))
        except ValidationError:
            continue
    return depth + 1


def _nested(registry: VerifierRegistry, ref: VerifierRef) -> None:
    if _depth(ref) > MAX_NESTING:
        raise VerifierConfigError(f"verifiers nest at most {MAX_NESTING} deep")


def _multi(registry: VerifierRegistry, ref: VerifierRef) -> ResolvedVerifier:
    _nested(registry, ref)
    config: MultiVerifierConfig = _config(MultiVerifierConfig, ref)
    for part in config.verifiers:
        registry.check(part)
    return MultiVerifier(describe(ref), tuple((part, _LazyPart(registry, part)) for part in config.verifiers))


def _optimization(registry: VerifierRegistry, ref: VerifierRef) -> ResolvedVerifier:
    _nested(registry, ref)
    config: OptimizationScoreConfig = _config(OptimizationScoreConfig, ref)
    registry.check(config.scorer)
    return OptimizationScore(describe(ref), config, _LazyPart(registry, config.scorer))


@dataclass(frozen=True)
class _LazyPart:
    """A sub-verifier resolved when it runs, so a plugin is imported on first use only."""

    registry: VerifierRegistry
    ref: VerifierRef

    async def __call__(self, task: Mapping[str, Any], trajectory: Any) -> VerifierOutcome:
        return await self.registry.verify(self.ref, task, trajectory)


def register_builtin_types(registry: VerifierRegistry) -> None:
    """Register seed 002's types in `registry`."""
    registry.register_type("exact_match", lambda _r, ref: ExactMatch(describe(ref), _config(ExactMatchConfig, ref)))
    registry.register_type("schema_validation", _schema_validation)
    registry.register_type(
        "numerical_range", lambda _r, ref: NumericalRange(describe(ref), _config(NumericalRangeConfig, ref))
    )
    registry.register_type("test_suite", lambda r, ref: SuiteVerifier(describe(ref), _config(SuiteConfig, ref), r))
    registry.register_type("execution_result", _execution_result)
    registry.register_type("optimization_score", _optimization)
    registry.register_type("multi_verifier", _multi)
