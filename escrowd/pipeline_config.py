"""The pipeline's configuration and component shape, shared by its wiring modules."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from chain.signers import SignerSpec
from escrowd.devnet import Devnet


@dataclass
class PipelineConfig:
    """Where everything is and which ports to serve on."""

    database_url: str
    kafka_bootstrap: str
    devnet: Devnet
    api_port: int
    metrics_port: int
    confirmations: int = 0
    relayer_signer: SignerSpec | None = None  # who holds the marketplace verifier key (None: in process)
    # The verification service's key (a fresh devnet key) and who holds it (None: in process).
    verification_key: str = field(default_factory=lambda: "0x" + secrets.token_hex(32), repr=False)
    verification_signer: SignerSpec | None = None


@dataclass
class Component:
    """A named long-running task and how to ask it to stop (None: it is cancelled)."""

    name: str
    run: Callable[[], Awaitable[None]]
    stop: Callable[[], None] | None = None
    task: asyncio.Task[None] | None = None
