"""The path parameters every router shares: a task's coordinates and addresses, bounded like
the columns they are compared with (bigint, numeric(78)), so 2**64 is a 422, never a 500."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path

ADDRESS_PATTERN = r"^0x[0-9a-fA-F]{40}$"

ChainPath = Annotated[int, Path(gt=0, le=2**63 - 1, description="EIP-155 chain id")]
EscrowPath = Annotated[str, Path(pattern=ADDRESS_PATTERN, description="Escrow address")]
TaskPath = Annotated[int, Path(ge=1, le=2**256 - 1, description="Task id on the escrow")]
AddressPath = Annotated[str, Path(pattern=ADDRESS_PATTERN, description="An account address")]
HashPath = Annotated[str, Path(pattern=r"^0x[0-9a-fA-F]{64}$", description="A 32-byte hash")]
