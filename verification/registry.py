"""The verifier registry: resolve a `{kind, ref}` reference to one verify function and run it.

Seed 001's kinds, each a reference to something that owns the judgement:

* `rubric` — `<owner>/<name>[@version]` of a published rubric; scored by the judge model
  (`verification.agents.rubrics.RubricJudge`, set as `rubric_judge`); without one it raises;
* `plugin` — `module:callable`, imported lazily on first use and cached, only from an
  allow-listed set of packages;
* `endpoint` — an HTTP(S) URL on an allow-listed host: POST exactly
  `{"task": {"prompt", "reference"}, "trajectory"}`, expect `{reward}`; 60 s default timeout.

`keyword_rubric` is a built-in type, not seed 001's `rubric`: a deterministic keyword count
over a rubric of the registry's file store (distinct keywords found per item, weighted).

Seed 002's verifier types (`exact_match`, `schema_validation`, `numerical_range`,
`test_suite`, `execution_result`, `optimization_score`, `multi_verifier`) are registered
in the same table by `verification.verifier_types` (through `verifiers.default_registry`).

Every verifier has the seed's contract `VerifyFn(task, trajectory) -> reward`. A verifier
that cannot answer — import error, endpoint down or slow, a response without a numeric
`reward`, a missing rubric — raises `VerificationError` naming the verifier and the
reason. It never returns 0.0 for "could not tell": a silent zero is indistinguishable
from a wrong answer.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runtime.httpbody import read_bounded
from schemas import jsonbounds
from schemas.task_terms import VerifierRef
from verification.sandbox import DEFAULT_SETTINGS, SandboxSettings

log = structlog.get_logger(__name__)

DEFAULT_ENDPOINT_TIMEOUT = 60.0
DEFAULT_PLUGIN_TIMEOUT = 60.0
_MAX_ENDPOINT_RESPONSE = 1024 * 1024
_PLUGIN_REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_RUBRIC_REF = re.compile(r"^[\w.-]+/[\w.-]+$")
_JUDGED_RUBRIC_REF = re.compile(r"^[A-Za-z0-9_.-]{1,64}/[A-Za-z0-9_.-]{1,100}(@[1-9][0-9]{0,8})?$")

VerifyFn = Callable[[Mapping[str, Any], Any], float]
"""Seed 001's contract: the task and the submitted trajectory in, a reward out."""


class VerificationError(Exception):
    """A verifier could not answer. Never a zero: the attempt is retried later."""

    def __init__(self, verifier: str, reason: str) -> None:
        super().__init__(f"verifier {verifier} could not answer: {reason}")
        self.verifier = verifier
        self.reason = reason


class VerifierConfigError(ValueError):
    """A verifier reference that can never work (refused when the terms are registered)."""


@dataclass(frozen=True)
class VerifierOutcome:
    """A verifier's answer: the reward, and what it found (stages, counts) for the proof."""

    reward: float
    detail: dict[str, Any] = field(default_factory=dict)
    reasons: tuple[str, ...] = ()


class ResolvedVerifier(Protocol):
    """A verifier ready to run (async: endpoints and sandboxes do I/O)."""

    async def __call__(self, task: Mapping[str, Any], trajectory: Any) -> VerifierOutcome: ...


class RubricJudgeFn(Protocol):
    """Scores a trajectory against a published rubric (`verification.agents.rubrics.RubricJudge`)."""

    async def __call__(self, ref: str, task: Mapping[str, Any], trajectory: Any) -> VerifierOutcome: ...

    async def close(self) -> None: ...


TypeFactory = Callable[["VerifierRegistry", VerifierRef], ResolvedVerifier]
"""Builds a built-in verifier type from its reference (validating its config)."""


def describe(ref: VerifierRef) -> str:
    """How errors and logs name a verifier: `kind:ref`, with URL credentials and query removed."""
    if ref.kind == "endpoint":
        return f"endpoint:{redact_url(ref.ref)}"
    return f"{ref.kind}:{ref.ref}"


def redact_url(url: str) -> str:
    """The URL without user info, query or fragment (they may carry secrets)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        netloc = f"{host}:{parts.port}" if parts.port else host
        return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
    except ValueError:
        return "<unparseable url>"


def flatten_trajectory(trajectory: Any) -> str:
    """Seed 001's folding: a string stays, a message gives its content or text, a list is joined."""
    if trajectory is None:
        return ""
    if isinstance(trajectory, str):
        return trajectory
    if isinstance(trajectory, Mapping):
        for key in ("content", "text", "output"):
            value = trajectory.get(key)
            if value is not None:
                return flatten_trajectory(value)
        return json.dumps(trajectory, ensure_ascii=False, sort_keys=True)
    if isinstance(trajectory, list | tuple):
        return "\n".join(flatten_trajectory(item) for item in trajectory)
    return str(trajectory)


def as_reward(verifier: str, value: Any) -> float:
    """`float(value)` if it is a finite number (not a bool), else VerificationError."""
    if isinstance(value, bool) or value is None:
        raise VerificationError(verifier, f"returned {value!r}, not a number")
    try:
        reward = float(value)
    except (TypeError, ValueError):
        raise VerificationError(verifier, f"returned a non-numeric reward of type {type(value).__name__}") from None
    if not math.isfinite(reward):
        raise VerificationError(verifier, "returned a non-finite reward")
    return reward


# ---------------------------------------------------------------------------- rubrics


class RubricItem(BaseModel):
    """One scored item of a rubric (the same shape as seed 000's rubric items)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    criterion: str = Field(min_length=1, max_length=200)
    keywords: list[str] = Field(default_factory=list, max_length=20)
    min_mentions: int = Field(default=1, ge=1)
    weight: float = Field(default=1.0, gt=0, le=100)


class Rubric(BaseModel):
    """A team's written standard: named, versioned, a list of weighted items."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    version: str = "1"
    items: list[RubricItem] = Field(min_length=1, max_length=50)


class RubricStore:
    """Rubrics by `<owner>/<name>`: registered in code or loaded from `<dir>/<owner>/<name>.json`."""

    def __init__(self, directory: Path | None = None, rubrics: Mapping[str, Rubric] | None = None) -> None:
        self._directory = directory
        self._rubrics: dict[str, Rubric] = dict(rubrics or {})

    def add(self, ref: str, rubric: Rubric) -> None:
        """Register (or replace) a rubric."""
        self._rubrics[ref] = rubric

    def get(self, ref: str) -> Rubric | None:
        """The rubric named `ref`, or None when it is gone."""
        if ref in self._rubrics:
            return self._rubrics[ref]
        if self._directory is None or not _RUBRIC_REF.match(ref) or ".." in ref:
            return None
        path = self._directory / f"{ref}.json"
        try:
            return Rubric.model_validate_json(path.read_bytes())
        except (OSError, ValidationError):
            return None


def score_rubric(rubric: Rubric, text: str) -> VerifierOutcome:
    """Deterministic judge: per item, distinct keywords found / min_mentions (cap 1); no keywords 0.5."""
    lowered = text.lower()
    total = 0.0
    weights = 0.0
    breakdown: list[dict[str, Any]] = []
    for item in rubric.items:
        if item.keywords:
            found = {k.lower() for k in item.keywords if k.lower() in lowered}
            score = min(1.0, len(found) / item.min_mentions)
        else:
            score = 0.5
        total += score * item.weight
        weights += item.weight
        breakdown.append({"criterion": item.criterion, "score": score, "weight": item.weight})
    return VerifierOutcome(reward=total / weights, detail={"rubric": rubric.name, "items": breakdown})


# ---------------------------------------------------------------------------- the registry


class VerifierRegistry:
    """Resolves verifier references; plugins are imported once and cached."""

    def __init__(
        self,
        *,
        allowed_plugin_packages: Iterable[str] = (),
        allowed_endpoint_hosts: Iterable[str] = (),
        endpoint_timeout: float = DEFAULT_ENDPOINT_TIMEOUT,
        plugin_timeout: float = DEFAULT_PLUGIN_TIMEOUT,
        rubrics: RubricStore | None = None,
        types: Iterable[Callable[[VerifierRegistry], None]] = (),
        sandbox_settings: SandboxSettings = DEFAULT_SETTINGS,
        rubric_judge: RubricJudgeFn | None = None,
    ) -> None:
        self.allowed_plugin_packages = tuple(allowed_plugin_packages)
        self.allowed_endpoint_hosts = tuple(h.lower() for h in allowed_endpoint_hosts)
        self.endpoint_timeout = endpoint_timeout
        self.plugin_timeout = plugin_timeout
        self.rubrics = rubrics or RubricStore()
        self.sandbox_settings = sandbox_settings
        self.rubric_judge = rubric_judge
        self._plugins: dict[str, Callable[..., Any]] = {}
        self._types: dict[str, TypeFactory] = {}
        self._session: aiohttp.ClientSession | None = None
        self.plugin_imports = 0
        self._types["keyword_rubric"] = _keyword_rubric_factory
        # Types are registered by the caller (`verification.verifiers.default_registry`
        # adds seed 002's): the type modules import this one, never the other way round.
        for register in types:
            register(self)

    # -------------------------------------------------------------- registration

    def register_type(self, kind: str, factory: TypeFactory) -> None:
        """Add a verifier type (`verifiers.default_registry` registers seed 002's)."""
        if kind in ("rubric", "plugin", "endpoint"):
            raise ValueError(f"{kind} is a reference kind, not a type")
        self._types[kind] = factory

    @property
    def kinds(self) -> tuple[str, ...]:
        """Every kind this registry resolves."""
        return ("rubric", "plugin", "endpoint", *sorted(self._types))

    # -------------------------------------------------------------- checks at registration time

    def check(self, ref: VerifierRef) -> None:
        """Refuse a reference that can never work (VerifierConfigError); imports nothing."""
        if ref.kind == "plugin":
            self._check_plugin_ref(ref.ref)
        elif ref.kind == "endpoint":
            self._check_endpoint_url(ref.ref)
        elif ref.kind == "rubric":
            if not _JUDGED_RUBRIC_REF.match(ref.ref) or ".." in ref.ref:
                raise VerifierConfigError("a rubric reference is <owner>/<name>[@version]")
        elif ref.kind in self._types:
            self._types[ref.kind](self, ref)
        else:
            raise VerifierConfigError(f"unknown verifier kind {ref.kind!r}")

    def _check_plugin_ref(self, ref: str) -> tuple[str, str]:
        if not _PLUGIN_REF.match(ref):
            raise VerifierConfigError("a plugin reference is module:callable")
        module, _, attr = ref.partition(":")
        if not any(module == p or module.startswith(p + ".") for p in self.allowed_plugin_packages):
            raise VerifierConfigError(f"plugin module {module!r} is not in an allow-listed package")
        return module, attr

    def _check_endpoint_url(self, url: str) -> None:
        try:
            parts = urlsplit(url)
        except ValueError:
            raise VerifierConfigError("the endpoint is not a URL") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise VerifierConfigError("an endpoint is an http(s) URL with a host")
        if parts.hostname.lower() not in self.allowed_endpoint_hosts:
            raise VerifierConfigError(f"endpoint host {parts.hostname!r} is not allow-listed")

    # -------------------------------------------------------------- running

    async def verify(self, ref: VerifierRef, task: Mapping[str, Any], trajectory: Any) -> VerifierOutcome:
        """Run the verifier; VerificationError (naming it) when it cannot answer."""
        name = describe(ref)
        resolved = self.resolve(ref)
        try:
            return await resolved(task, trajectory)
        except VerificationError:
            raise
        except Exception as exc:
            raise VerificationError(name, f"{type(exc).__name__}: {exc}"[:300]) from None

    def resolve(self, ref: VerifierRef) -> ResolvedVerifier:
        """The runnable verifier for a reference (VerificationError if it cannot exist)."""
        name = describe(ref)
        if ref.kind == "plugin":
            fn = self._load_plugin(ref.ref)
            return _PluginVerifier(name, fn, self.plugin_timeout)
        if ref.kind == "endpoint":
            try:
                self._check_endpoint_url(ref.ref)
            except VerifierConfigError as exc:
                raise VerificationError(name, str(exc)) from None
            return _EndpointVerifier(name, ref.ref, self)
        if ref.kind == "rubric":
            return _JudgedRubric(name, ref.ref, self.rubric_judge)
        factory = self._types.get(ref.kind)
        if factory is None:
            raise VerificationError(name, f"no verifier type {ref.kind!r} is registered")
        try:
            return factory(self, ref)
        except VerifierConfigError as exc:
            raise VerificationError(name, f"invalid configuration: {exc}") from None

    def _load_plugin(self, ref: str) -> Callable[..., Any]:
        cached = self._plugins.get(ref)
        if cached is not None:
            return cached
        name = f"plugin:{ref}"
        try:
            module_name, attr = self._check_plugin_ref(ref)
        except VerifierConfigError as exc:
            raise VerificationError(name, str(exc)) from None
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:
            # Not cached: the next task tries again (a fixed deployment recovers by itself).
            raise VerificationError(name, f"import failed: {type(exc).__name__}: {exc}"[:300]) from None
        self.plugin_imports += 1
        found = getattr(module, attr, None)
        if not callable(found):
            raise VerificationError(name, f"{module_name} has no callable {attr!r}")
        fn: Callable[..., Any] = found
        self._plugins[ref] = fn
        return fn

    async def session(self) -> aiohttp.ClientSession:
        """The shared HTTP session for endpoint verifiers."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    async def close(self) -> None:
        """Close the HTTP session (and the rubric judge's)."""
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self.rubric_judge is not None:
            await self.rubric_judge.close()


@dataclass(frozen=True)
class _PluginVerifier:
    name: str
    fn: Callable[..., Any]
    timeout: float

    async def __call__(self, task: Mapping[str, Any], trajectory: Any) -> VerifierOutcome:
        try:
            if inspect.iscoroutinefunction(self.fn):
                value = await asyncio.wait_for(self.fn(task, trajectory), self.timeout)
            else:
                # A thread, so a slow plugin cannot stall the consumer's event loop.
                value = await asyncio.wait_for(asyncio.to_thread(self.fn, task, trajectory), self.timeout)
        except TimeoutError:
            raise VerificationError(self.name, f"no answer within {self.timeout:g} s") from None
        except VerificationError:
            raise
        except Exception as exc:
            raise VerificationError(self.name, f"raised {type(exc).__name__}: {exc}"[:300]) from None
        if isinstance(value, VerifierOutcome):
            return value
        return VerifierOutcome(reward=as_reward(self.name, value))


@dataclass(frozen=True)
class _EndpointVerifier:
    name: str
    url: str
    registry: VerifierRegistry

    async def __call__(self, task: Mapping[str, Any], trajectory: Any) -> VerifierOutcome:
        session = await self.registry.session()
        timeout = aiohttp.ClientTimeout(total=self.registry.endpoint_timeout)
        try:
            async with session.post(
                self.url, json=endpoint_request(task, trajectory), timeout=timeout
            ) as response:
                if response.status != 200:
                    raise VerificationError(self.name, f"HTTP {response.status}")
                body = await read_bounded(response, _MAX_ENDPOINT_RESPONSE)
                if body is None:
                    raise VerificationError(self.name, "response too large")
        except TimeoutError:
            raise VerificationError(
                self.name, f"no answer within {self.registry.endpoint_timeout:g} s"
            ) from None
        except aiohttp.ClientError as exc:
            raise VerificationError(self.name, f"unreachable: {type(exc).__name__}") from None
        try:
            data = jsonbounds.loads(body, max_bytes=_MAX_ENDPOINT_RESPONSE)
        except ValueError:
            raise VerificationError(self.name, "response is not JSON") from None
        if not isinstance(data, dict) or "reward" not in data:
            raise VerificationError(self.name, "response has no reward field")
        return VerifierOutcome(reward=as_reward(self.name, data["reward"]))


def endpoint_request(task: Mapping[str, Any], trajectory: Any) -> dict[str, Any]:
    """Seed 001's request body, exactly: `{"task": {"prompt", "reference"}, "trajectory"}`."""
    return {"task": {"prompt": task.get("prompt"), "reference": task.get("reference")}, "trajectory": trajectory}


@dataclass(frozen=True)
class _JudgedRubric:
    name: str
    ref: str
    judge: RubricJudgeFn | None

    async def __call__(self, task: Mapping[str, Any], trajectory: Any) -> VerifierOutcome:
        if self.judge is None:
            raise VerificationError(self.name, "no rubric judge model is configured")
        return await self.judge(self.ref, task, trajectory)


@dataclass(frozen=True)
class _KeywordRubric:
    """The built-in `keyword_rubric` type: the keyword counter over a file-store rubric."""

    name: str
    ref: str
    store: RubricStore

    async def __call__(self, task: Mapping[str, Any], trajectory: Any) -> VerifierOutcome:
        rubric = self.store.get(self.ref)
        if rubric is None:
            raise VerificationError(self.name, "rubric not found")
        return score_rubric(rubric, flatten_trajectory(trajectory))


def _keyword_rubric_factory(registry: VerifierRegistry, ref: VerifierRef) -> ResolvedVerifier:
    if not _RUBRIC_REF.match(ref.ref):
        raise VerifierConfigError("a keyword_rubric reference is <owner>/<name>")
    return _KeywordRubric(describe(ref), ref.ref, registry.rubrics)

