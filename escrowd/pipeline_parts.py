"""The services of the pipeline beyond the indexer: consumers, relayer, API.

Kept apart from `pipeline.py` so each service's wiring reads in one place.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from escrowd.pipeline import Component, PipelineConfig
    from escrowd.traffic import OffChain


async def components(config: PipelineConfig, stop: asyncio.Event) -> list[Component]:
    """Every downstream service, ready to run."""
    return []


def offchain_client(api_port: int, devnet: object) -> OffChain | None:
    """The HTTP client the traffic generator uses for the off-chain steps (none yet)."""
    return None


async def settle(pipeline: object) -> None:
    """Wait until the downstream services caught up (nothing to wait for yet)."""


async def checks(pipeline: object, planned: object, events: object) -> list[tuple[str, bool, str]]:
    """Pipeline-side invariants of the downstream services."""
    return []
