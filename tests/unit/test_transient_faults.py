"""Which faults a sender's loop (and the ruling sender's round) waits out, and which end it.

A database failover answers reconnects with `CannotConnectNowError` ("the database system is
starting up") and closes sessions with `AdminShutdownError`; neither is a
`PostgresConnectionError`, and the sender's loops caught only that class, so a failover ended
the relayer instead of pausing it.
"""

from __future__ import annotations

import asyncpg
import pytest

from chain.rpc import RpcError
from chain.sender import transient_fault
from chain.signers import SignerError

WAITED_OUT = [
    asyncpg.exceptions.CannotConnectNowError("the database system is starting up"),
    asyncpg.exceptions.AdminShutdownError("terminating connection due to administrator command"),
    asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
    asyncpg.exceptions.ConnectionFailureError("connection failure"),
    asyncpg.exceptions.InterfaceError("connection is closed"),
    ConnectionResetError("reset by peer"),
    TimeoutError(),
    OSError("network unreachable"),
    RpcError("every endpoint failed"),
    SignerError("remote signer eth_signTransaction failed: TimeoutError"),
]
ENDS_THE_LOOP = [
    ValueError("a bug"),
    KeyError("slot"),
    TypeError("int() of None"),
    asyncpg.exceptions.UniqueViolationError("duplicate key"),
    asyncpg.exceptions.CheckViolationError("violates check constraint"),
]


@pytest.mark.parametrize("exc", WAITED_OUT, ids=lambda e: type(e).__name__)
def test_the_node_the_network_the_signer_and_a_database_going_away_are_waited_out(exc: BaseException) -> None:
    assert transient_fault(exc)


@pytest.mark.parametrize("exc", ENDS_THE_LOOP, ids=lambda e: type(e).__name__)
def test_bugs_and_refusals_are_not(exc: BaseException) -> None:
    assert not transient_fault(exc)
