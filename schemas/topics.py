"""Kafka topic names (versioned) and their shapes; every service takes its names from here.

Each name can be overridden in a service's settings; these are the defaults.
"""

from __future__ import annotations

from schemas.cloudevents import TopicSpec

ESCROW_EVENTS = "escrow.events.v1"
"""Indexed escrow events and their retractions. Key: `<chain id>:<task id>`."""

ESCROW_EVENTS_FINALIZED = "escrow.events.finalized.v1"
"""The same events once their block is finalized, never a retraction (the indexer's `finalized_topic`).
Key: `<chain id>:<task id>`."""

VERIFICATION_REQUESTS = "escrow.verification-requests.v1"
"""Finalize (agent result) and review (poster decision) requests accepted by the API. Key: `<chain id>:<task id>`."""

VERDICTS = "escrow.verdicts.v1"
"""Signed verdicts for the settlement relayer. Key: `<chain id>:<task id>`."""

TASKS = "escrow.tasks.v1"
"""Compacted: the latest state of each task. Key: `<chain id>:<task id>`."""

REPUTATION = "escrow.reputation.v1"
"""Compacted: the latest reputation of each agent. Key: agent address (lower case)."""

TIMERS = "escrow.timers.v1"
"""Timer events emitted as chain time crosses a window (appeal closed, escalation collectible…)."""

PANEL_ROUNDS = "escrow.panel-rounds.v1"
"""Panel rounds when drawn and when closed (`PanelRound`). Key: `<chain id>:<task id>`."""

PANEL_ATTESTATIONS = "escrow.panel-attestations.v1"
"""Signed attestations accepted by the API, published once their round closed. Key: `<chain id>:<task id>`."""

PANEL_CONSENSUS = "escrow.panel-consensus.v1"
"""Each closed round's consensus, outcome and split (`ConsensusRecord`). Key: `<chain id>:<task id>`."""

PANEL_RULINGS = "escrow.panel-rulings.v1"
"""Signed rulings for the settlement relayer (`SignedRuling`). Key: `<chain id>:<task id>`."""

PANEL_CALIBRATION = "escrow.panel-calibration.v1"
"""Compacted: latest calibration per verifier / poster. Key: `<verifier|poster>:<address lower case>`."""

PANEL_FEES = "escrow.panel-fees.v1"
"""Fee ledger entries (`FeeLedgerEntry`), integer token units. Key: account address (lower case)."""

DEAD_LETTERS = "escrow.dlq.v1"
"""Poison messages with the consumer and the reason in headers (`dlq_reason`, `dlq_consumer`)."""


def all_topics(partitions: int = 4) -> list[TopicSpec]:
    """Every topic with its partition count and clean-up policy."""
    return [
        TopicSpec(ESCROW_EVENTS, partitions),
        TopicSpec(ESCROW_EVENTS_FINALIZED, partitions),
        TopicSpec(VERIFICATION_REQUESTS, partitions),
        TopicSpec(VERDICTS, partitions),
        TopicSpec(TASKS, partitions, compacted=True),
        TopicSpec(REPUTATION, partitions, compacted=True),
        TopicSpec(TIMERS, partitions),
        TopicSpec(PANEL_ROUNDS, partitions),
        TopicSpec(PANEL_ATTESTATIONS, partitions),
        TopicSpec(PANEL_CONSENSUS, partitions),
        TopicSpec(PANEL_RULINGS, partitions),
        TopicSpec(PANEL_CALIBRATION, partitions, compacted=True),
        TopicSpec(PANEL_FEES, partitions),
        TopicSpec(DEAD_LETTERS, 1),
    ]
