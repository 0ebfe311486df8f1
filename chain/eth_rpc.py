"""The senders' names for the one JSON-RPC client in `chain.rpc` (kept so their imports
stay short and stable): the client, its errors, `Head`, `new_heads` and the error counter
the relayer's dashboards read."""

from __future__ import annotations

from chain.rpc import RELAYER_RPC_ERRORS as RPC_ERRORS
from chain.rpc import (
    AlreadyKnown,
    EthRpc,
    Head,
    NonceTooLow,
    RetryableRpcError,
    Reverted,
    RpcCallError,
    RpcError,
    RpcRateLimited,
    RpcTransportError,
    Underpriced,
    classify_send_error,
    new_heads,
    safe_url,
    sleep_backoff,
)

__all__ = [
    "RPC_ERRORS",
    "AlreadyKnown",
    "EthRpc",
    "Head",
    "NonceTooLow",
    "RetryableRpcError",
    "Reverted",
    "RpcCallError",
    "RpcError",
    "RpcRateLimited",
    "RpcTransportError",
    "Underpriced",
    "classify_send_error",
    "new_heads",
    "safe_url",
    "sleep_backoff",
]
