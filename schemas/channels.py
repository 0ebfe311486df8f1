"""What a subscriber needs to know of each topic: its key, who publishes it, and its messages.

The topic names, partition counts and clean-up policies are `schemas.topics`; this catalog
adds, per topic, the record key, the publishing service and every CloudEvents type that
travels on it with the JSON Schema of its body (a file of `schemas/jsonschema/`). The
AsyncAPI document (`schemas/asyncapi.yaml`) is generated from it (`schemas.asyncapi`).
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas import topics
from schemas.abi import escrow_events
from schemas.events import event_type

TASK_KEY = "`<chain id>:<task id>` (decimal chain id and task id): one task's records stay in order on one partition"


@dataclass(frozen=True)
class Message:
    """One kind of record on a topic: its `ce_type` and the schema file of its JSON body."""

    name: str
    ce_type: str
    schema: str
    summary: str


@dataclass(frozen=True)
class Channel:
    """One topic as a subscriber sees it."""

    topic: str
    summary: str
    key: str
    publisher: str
    messages: tuple[Message, ...]
    description: str = ""


def _escrow_event_messages() -> tuple[Message, ...]:
    return tuple(
        Message(
            name=name,
            ce_type=event_type(name),
            schema=f"events/{name}Args",
            summary=f"The escrow's `{name}` event as indexed (or its retraction, `removed: true`)",
        )
        for name in sorted(entry["name"] for entry in escrow_events())
    )


def _request(kind: str, model: str, summary: str) -> Message:
    return Message(model, f"io.escrowd.verification.{kind}.v1", model, summary)


def _timer(model: str, summary: str) -> Message:
    return Message(model, f"io.escrowd.task.{model}.v1", model, summary)


CHANNELS: tuple[Channel, ...] = (
    Channel(
        topics.ESCROW_EVENTS,
        "Every escrow event the indexer stored, and the retraction of each one a reorg removed",
        TASK_KEY + "; escrow-wide events (no task) are keyed `<chain id>:escrow:<escrow address lower case>`",
        "escrowd index run / escrowd index publish (the outbox publisher of the event log)",
        _escrow_event_messages(),
        description=(
            "The body is `EscrowEventMessage` with `args` as the event's own schema. A retraction repeats "
            "the removed event with `removed: true` under the id `<event id>:removed`; an event that "
            "comes back after its retraction is published again under `<event id>#<n>`."
        ),
    ),
    Channel(
        topics.ESCROW_EVENTS_FINALIZED,
        "The escrow events of finalized blocks only: never a retraction",
        TASK_KEY + "; escrow-wide events (no task) are keyed `<chain id>:escrow:<escrow address lower case>`",
        "escrowd index run with `finalized_topic` set (the finalized-only stream of the event log)",
        _escrow_event_messages(),
        description=(
            "Each message is the events topic's message byte for byte (same `ce_id`, key, headers and "
            "`EscrowEventMessage` body, `removed` always false), published once its block is at or below "
            "the chain's `finalized` tag (or the head minus `fallback_confirmations` where the node has no "
            "tag). A reorg never removes a finalized block, so no retraction is ever published here: a "
            "subscriber of this topic needs no retraction handling. It trails the events topic by the "
            "chain's finality delay (about 13 minutes on Ethereum, 64 blocks on anvil)."
        ),
    ),
    Channel(
        topics.VERIFICATION_REQUESTS,
        "Finalize and review requests accepted by the API, verifier reports and retries",
        TASK_KEY,
        "escrowd api serve (finalize, review, verifier reports); escrowd consume verification run (retries)",
        (
            _request("finalize", "FinalizeRequested", "The agent finalized an attempt with its result"),
            _request("review", "ReviewSubmitted", "The poster approved or rejected a manual attempt"),
            _request("verifier_verdict", "VerifierVerdictReported", "A named verifier reports its on-chain verdict"),
            _request("verifier_error", "VerifierFailed", "A named verifier could not judge this time"),
            _request("retry", "RetryDue", "A finalize whose verifier could not answer is due again"),
        ),
    ),
    Channel(
        topics.VERDICTS,
        "Signed verdicts (EIP-712) for the settlement relayer",
        TASK_KEY,
        "escrowd consume verification run",
        (Message("SignedVerdict", "io.escrowd.verdict.v1", "SignedVerdict", "A verdict and the verification service's signature"),),
    ),
    Channel(
        topics.TASKS,
        "The latest state of each task (compacted: the newest record of a key is the state)",
        TASK_KEY,
        "escrowd consume lifecycle",
        (Message("TaskState", "io.escrowd.task.State.v1", "TaskState", "A task's whole state after an event, a retraction or a timer"),),
    ),
    Channel(
        topics.REPUTATION,
        "The latest reputation of each agent (compacted)",
        "the agent's address, lower case",
        "escrowd consume reputation",
        (Message("Reputation", "io.escrowd.agent.Reputation.v1", "Reputation", "An agent's whole reputation after a verdict or its retraction"),),
    ),
    Channel(
        topics.TIMERS,
        "Timers fired as chain time crosses a task's window, and their withdrawal",
        TASK_KEY,
        "escrowd consume lifecycle",
        (
            _timer("DeadlinePassed", "The deadline passed with no accepted work"),
            _timer("AppealWindowClosed", "The appeal window of a failed attempt closed"),
            _timer("EscalationCollectible", "An escalated task can be collected by its agent"),
            _timer("TimerRetracted", "A timer fired earlier is withdrawn (a retraction undid its cause)"),
        ),
    ),
    Channel(
        topics.PANEL_ROUNDS,
        "Dispute panel rounds when drawn and when closed",
        TASK_KEY,
        "escrowd consume panels",
        (Message("PanelRound", "io.escrowd.panel.round.v1", "PanelRound", "A round drawn or closed"),),
    ),
    Channel(
        topics.PANEL_ATTESTATIONS,
        "Signed attestations of a round's verifiers, published once the round closed",
        TASK_KEY,
        "escrowd consume panels",
        (Message("SignedAttestation", "io.escrowd.panel.attestation.v1", "SignedAttestation", "One verifier's signed attestation"),),
    ),
    Channel(
        topics.PANEL_CONSENSUS,
        "Each closed round's consensus, outcome and split",
        TASK_KEY,
        "escrowd consume panels",
        (Message("ConsensusRecord", "io.escrowd.panel.consensus.v1", "ConsensusRecord", "What a closed round led to"),),
    ),
    Channel(
        topics.PANEL_RULINGS,
        "Signed rulings for the ruling relay (`resolveDispute` from the arbiter key)",
        TASK_KEY,
        "escrowd consume panels",
        (Message("SignedRuling", "io.escrowd.panel.ruling.v1", "SignedRuling", "A ruling and the panel service's signature"),),
    ),
    Channel(
        topics.PANEL_CALIBRATION,
        "The latest calibration of each verifier and poster (compacted)",
        "`verifier:<address lower case>` or `poster:<address lower case>`",
        "escrowd consume panels",
        (Message("CalibrationUpdate", "io.escrowd.panel.calibration.v1", "CalibrationUpdate", "A calibration after a ruled dispute"),),
    ),
    Channel(
        topics.PANEL_FEES,
        "Panel fee ledger entries, integer token units",
        "the account's address, lower case",
        "escrowd consume panels",
        (Message("FeeLedgerEntry", "io.escrowd.panel.fee.v1", "FeeLedgerEntry", "One fee credited to a verifier"),),
    ),
    Channel(
        topics.DEAD_LETTERS,
        "Messages a consumer could not handle, with the consumer and the reason in headers",
        "the original record's key (absent when it was longer than 1,024 bytes)",
        "every consumer (runtime.consumer)",
        (
            Message(
                "DeadLetter",
                "io.escrowd.deadletter.v1",
                "",
                "The original body unchanged (empty when larger than the limit; kept in the database)",
            ),
        ),
        description=(
            "Headers `dlq_reason`, `dlq_consumer`, `dlq_topic`, `dlq_partition`, `dlq_offset` say what was "
            "refused and why; the original non-CloudEvents headers are kept; `ce_subject` is the original `ce_id`."
        ),
    ),
)


def channel(topic: str) -> Channel:
    """The catalog entry of `topic` (KeyError when it is not one of ours)."""
    for entry in CHANNELS:
        if entry.topic == topic:
            return entry
    raise KeyError(topic)
