"""Fixtures of the agents tests: the local model endpoint (a real HTTP server speaking chat completions)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from verification.agents.model import ModelClient, ModelSettings
from verification.agents.stub_model import StubModel, start_stub


@dataclass
class ModelEndpoint:
    """The running stub and its base URL."""

    stub: StubModel
    url: str

    def client(self, **overrides: object) -> ModelClient:
        """A model client of this endpoint (fast retries, short timeout unless overridden)."""
        values: dict[str, object] = {"url": self.url, "name": "stub-judge", "timeout_seconds": 5.0, "backoff_seconds": 0.0}
        values.update(overrides)
        return ModelClient(ModelSettings(**values))  # type: ignore[arg-type]


@pytest.fixture
async def model_endpoint() -> AsyncIterator[ModelEndpoint]:
    """A deterministic OpenAI-compatible endpoint on a free local port."""
    stub = StubModel(slow_seconds=3.0)
    runner, url = await start_stub(stub)
    try:
        yield ModelEndpoint(stub, url)
    finally:
        await runner.cleanup()


# The verification tests' actors, signed API client and indexed-chain writer serve here too.
from tests.verification.conftest import api, chain, who  # noqa: E402, F401
