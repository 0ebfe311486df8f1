"""Prometheus metrics of the indexer (names are used by grafana/ dashboards and alert rules)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

CHAIN_HEAD = Gauge("escrowd_indexer_chain_head", "Latest block number seen on the chain", ["chain_id"])
INDEXED_BLOCK = Gauge("escrowd_indexer_indexed_block", "Block number of the indexer cursor", ["chain_id"])
LAG_BLOCKS = Gauge("escrowd_indexer_lag_blocks", "Chain head minus indexed block", ["chain_id"])
LAG_SECONDS = Gauge(
    "escrowd_indexer_lag_seconds", "Head block time minus indexed block time", ["chain_id"]
)
EVENTS = Counter("escrowd_indexer_events_total", "Escrow events indexed", ["chain_id", "event"])
REORGS = Counter("escrowd_indexer_reorgs_total", "Reorgs detected and repaired", ["chain_id"])
REORG_DEPTH = Histogram(
    "escrowd_indexer_reorg_depth_blocks",
    "Depth of repaired reorgs",
    ["chain_id"],
    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 128),
)
DEEP_REORGS = Counter(
    "escrowd_indexer_deep_reorgs_total",
    "Reorgs deeper than the confirmation depth (published events retracted)",
    ["chain_id"],
)
RETRACTIONS = Counter("escrowd_indexer_retractions_total", "Retraction messages queued", ["chain_id"])
RANGE_SIZE = Gauge("escrowd_indexer_range_size_blocks", "Current eth_getLogs range size", ["chain_id"])
BATCH_SECONDS = Histogram(
    "escrowd_indexer_batch_seconds",
    "Time to fetch, decode and store one window",
    ["chain_id"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)


def at_start(chains: dict[int, int]) -> None:
    """Every indexer series at 0 for the chains it follows (`chain id -> number of RPC endpoints`)."""
    from chain.rpc import RPC_ERRORS, RPC_LATENCY
    from runtime.metrics import at_zero
    from schemas.events import event_names

    ids = [str(c) for c in chains]
    for metric in (REORGS, REORG_DEPTH, DEEP_REORGS, RETRACTIONS, BATCH_SECONDS):
        at_zero(metric, ids)
    at_zero(EVENTS, ids, event_names())
    for chain_id, endpoints in chains.items():
        names = [f"rpc{i}" for i in range(endpoints)]
        methods = ("eth_getLogs", "eth_blockNumber", "eth_getBlockByNumber")
        at_zero(RPC_LATENCY, [chain_id], names, methods)
        at_zero(RPC_ERRORS, [chain_id], names, methods, ("transport", "response", "range_too_large"))
