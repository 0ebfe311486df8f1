"""The verifier registry with seed 002's types: what services and the API construct.

`registry.py` knows reference kinds and how to resolve them; `verifier_types.py` builds on it.
This module composes the two, so neither has to import the other in a circle.
"""

from __future__ import annotations

from collections.abc import Iterable

from verification.registry import (
    DEFAULT_ENDPOINT_TIMEOUT,
    DEFAULT_PLUGIN_TIMEOUT,
    RubricJudgeFn,
    RubricStore,
    VerifierRegistry,
)
from verification.sandbox import DEFAULT_SETTINGS, SandboxSettings
from verification.verifier_types import register_builtin_types


def default_registry(
    *,
    allowed_plugin_packages: Iterable[str] = (),
    allowed_endpoint_hosts: Iterable[str] = (),
    endpoint_timeout: float = DEFAULT_ENDPOINT_TIMEOUT,
    plugin_timeout: float = DEFAULT_PLUGIN_TIMEOUT,
    rubrics: RubricStore | None = None,
    rubric_judge: RubricJudgeFn | None = None,
    sandbox_settings: SandboxSettings = DEFAULT_SETTINGS,
) -> VerifierRegistry:
    """A registry that resolves rubrics, plugins, endpoints and every seed 002 type."""
    return VerifierRegistry(
        allowed_plugin_packages=allowed_plugin_packages,
        allowed_endpoint_hosts=allowed_endpoint_hosts,
        endpoint_timeout=endpoint_timeout,
        plugin_timeout=plugin_timeout,
        rubrics=rubrics,
        rubric_judge=rubric_judge,
        sandbox_settings=sandbox_settings,
        types=(register_builtin_types,),
    )
