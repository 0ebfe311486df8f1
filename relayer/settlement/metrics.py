"""Prometheus metrics of the settlement relayer, all named `escrowd_relayer_*`.

Defined once here (the JSON-RPC error counter lives with the client in `chain.eth_rpc`); the Grafana dashboards and alert rules use these names. Labels are
chain ids, outcomes and error names: never addresses of users, never anything secret.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import Counter, Gauge, Histogram

from chain.eth_rpc import RPC_ERRORS as RPC_ERRORS
from chain.sender import SenderMetrics

# What the chain toolkit's transaction sender counts, under the relayer's names.
SENDER = SenderMetrics.create("escrowd_relayer", "the relayer")
TX_SENT = SENDER.tx_sent
TX_REPLACED = SENDER.tx_replaced
TX_RESENT = SENDER.tx_resent
REORGS = SENDER.reorgs
NONCE_RECONCILIATIONS = SENDER.reconciliations
GAPS_FILLED = SENDER.gaps_filled
FEE_CAP_REACHED = SENDER.fee_cap_reached
FEE_CAP_HELD = SENDER.fee_cap_held
PENDING_TX = SENDER.pending
NEXT_NONCE = SENDER.next_nonce
HEAD_BLOCK = SENDER.head_block

VERDICTS_RECEIVED = Counter(
    "escrowd_relayer_verdicts_received_total",
    "Signed verdicts consumed, by outcome (accepted, awaiting_evidence, rejected, duplicate)",
    ["outcome"],
)
SIGNATURE_REJECTIONS = Counter(
    "escrowd_relayer_signature_rejections_total",
    "Verdicts refused because of their signature (invalid, untrusted signer, signer mismatch)",
    ["reason"],
)
VERDICT_REJECTIONS = Counter(
    "escrowd_relayer_verdict_rejections_total",
    "Verdicts refused for any reason, signature included",
    ["reason"],
)
TX_CONFIRMED = Counter(
    "escrowd_relayer_tx_confirmed_total", "Verdict transactions confirmed", ["chain_id"]
)
TX_REVERTED = Counter(
    "escrowd_relayer_tx_reverted_total",
    "Verdicts refused by the escrow (preflight or mined), by custom error",
    ["chain_id", "error"],
)
ALREADY_JUDGED = Counter(
    "escrowd_relayer_already_judged_total",
    "Verdicts not sent (or cancelled) because the attempt was judged already",
    ["chain_id"],
)
CONFIRMATION_SECONDS = Histogram(
    "escrowd_relayer_verdict_confirmation_seconds",
    "Time from a verdict's arrival to its transaction's confirmation",
    ["chain_id"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600),
)
KEY_MISMATCH_EVENTS = Counter(
    "escrowd_relayer_verifier_key_mismatch_total",
    "Times the relayer found the escrow trusting another verifier address",
    ["chain_id"],
)
SENDING_PAUSED = Gauge(
    "escrowd_relayer_sending_paused",
    "1 while sending is stopped (fail closed), with the reason as a label",
    ["chain_id", "reason"],
)
BALANCE = Gauge("escrowd_relayer_balance_wei", "Balance of the relayer address, wei", ["chain_id"])
RUNWAY = Gauge(
    "escrowd_relayer_runway_verdicts",
    "Verdict transactions the relayer's balance pays for at the current gas price (at the gas limit)",
    ["chain_id"],
)
KEY_MATCH = Gauge(
    "escrowd_relayer_verifier_key_match",
    "1 when the escrow trusts the relayer's key, 0 when not (sending stopped), -1 unknown",
    ["chain_id"],
)
INDEXER_LAG = Gauge(
    "escrowd_relayer_indexer_lag_blocks", "Chain head minus the indexer's cursor", ["chain_id"]
)
RPC_UP = Gauge("escrowd_relayer_rpc_up", "1 when the chain's RPC answered the last check", ["chain_id"])


def at_start(chain_ids: Iterable[int]) -> None:
    """Every relayer series whose labels are known at 0, so each alert fires on its first event."""
    from runtime.metrics import at_zero
    from schemas.abi import escrow_abi

    ids = [str(c) for c in chain_ids]
    at_zero(VERDICTS_RECEIVED, ("accepted", "awaiting_evidence", "rejected", "duplicate"))
    signature = ("bad_signature", "signer_mismatch", "untrusted_signer")  # consumer.SIGNATURE_REASONS
    at_zero(SIGNATURE_REJECTIONS, signature)
    at_zero(VERDICT_REJECTIONS, ("malformed", "unknown_escrow", "attempt_out_of_range", "attempt_not_indexed",
                                 "evidence_mismatch", *signature))  # fmt: skip
    errors = sorted({str(e["name"]) for e in escrow_abi() if e.get("type") == "error"} | {"unknown"})
    SENDER.at_start(ids, ("verdict", "batch", "filler"))
    at_zero(TX_REVERTED, ids, errors)
    for metric in (TX_CONFIRMED, ALREADY_JUDGED, CONFIRMATION_SECONDS, KEY_MISMATCH_EVENTS):
        at_zero(metric, ids)
    methods = ("eth_sendRawTransaction", "eth_getTransactionReceipt", "eth_getTransactionCount", "eth_call", "eth_blockNumber")
    at_zero(RPC_ERRORS, ids, methods, ("transient", "refused"))
    for chain_id in ids:
        KEY_MATCH.labels(chain_id).set(-1)  # unknown until the first check (the gauge's documented value)
