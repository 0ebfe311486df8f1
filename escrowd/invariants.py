"""Independent invariants of a run, checked against the chain itself (pure).

The traffic generator records what it meant each task to end as; these functions compare
that plan, the contract's own view of every task, the escrow's events and its token
balance. Nothing here trusts the pipeline's database: it is what the pipeline is judged by.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Check:
    """One invariant and whether it held."""

    name: str
    ok: bool
    detail: str = ""


@dataclass(frozen=True)
class PlannedTask:
    """What the generator meant a task to end as."""

    task_id: int
    path: str
    final_status: int
    agent: str | None = None
    failed_rounds: int = 0
    passed_rounds: int = 0


@dataclass(frozen=True)
class ChainEvent:
    """An escrow event as read from the chain (name and decoded fields)."""

    name: str
    args: Mapping[str, Any]


@dataclass
class Report:
    """Every check of a run."""

    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def add(self, name: str, ok: bool, detail: str = "") -> None:
        self.checks.append(Check(name, ok, detail))

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "checks": [c.__dict__ for c in self.checks]}


# The flow each event's amount arguments add to (the ABI's argument names).
_FLOWS: dict[str, tuple[tuple[str, str], ...]] = {
    "TaskCreated": (("deposits", "reward"),),
    "VerificationCompleted": (("payouts", "agentPayout"), ("fees", "fee")),
    "DisputeResolved": (("payouts", "agentAmount"), ("fees", "fee"), ("refunds", "posterAmount")),
    "EscalationCollected": (("payouts", "agentAmount"), ("fees", "fee")),
    "TaskCancelled": (("refunds", "refund"),),
    "TaskRefunded": (("refunds", "amount"),),
    "PaymentDeferred": (("deferred", "amount"),),
    "Withdrawn": (("withdrawn", "amount"),),
}


def token_flows(events: Iterable[ChainEvent]) -> dict[str, int]:
    """Deposits, payouts, fees and refunds as the escrow's events report them, and the part
    of those the token refused (`deferred`: credited, still in the escrow) and `withdrawn`."""
    flows = dict.fromkeys(("deposits", "payouts", "fees", "refunds", "deferred", "withdrawn"), 0)
    for event in events:
        for flow, argument in _FLOWS.get(event.name, ()):
            flows[flow] += int(event.args[argument])
    return flows


def verdict_counts(events: Iterable[ChainEvent]) -> dict[str, tuple[int, int]]:
    """Per agent (lower-case address): (failed rounds, passed rounds) from the chain's verdicts."""
    counts: dict[str, tuple[int, int]] = {}
    for event in events:
        if event.name != "VerificationCompleted":
            continue
        agent = str(event.args["agent"]).lower()
        fails, passes = counts.get(agent, (0, 0))
        counts[agent] = (fails, passes + 1) if event.args["passed"] else (fails + 1, passes)
    return counts


@dataclass(frozen=True)
class LostNonce:
    """A nonce one of our senders judged taken by someone else (its slot is `lost`)."""

    sender: str
    nonce: int
    ours: frozenset[str]
    """Every version of it we signed (lower-case hashes)."""
    taken_by: str | None
    """The hash the chain mined at that nonce (None: the chain says no transaction did)."""


def lost_nonces_check(lost: Iterable[LostNonce]) -> tuple[bool, str]:
    """Every nonce judged lost was consumed on chain by a transaction that is not ours.

    A sender that calls its own mined transaction lost queues its work again and sends it
    twice (the failure two looks in `chain.taken` exist for); this holds it to the chain."""
    wrong = []
    for item in lost:
        if item.taken_by is None:
            wrong.append(f"{item.sender} nonce {item.nonce}: judged lost, no transaction mined at it")
        elif item.taken_by.lower() in item.ours:
            wrong.append(f"{item.sender} nonce {item.nonce}: judged lost, our own {item.taken_by} was mined")
    return not wrong, "; ".join(wrong[:5])


def check_run(
    planned: Iterable[PlannedTask],
    statuses: Mapping[int, int],
    events: Iterable[ChainEvent],
    escrow_balance: int,
) -> Report:
    """The chain-side invariants: final states, token conservation, one verdict per attempt."""
    planned = list(planned)
    events = list(events)
    report = Report()
    wrong = [
        f"task {p.task_id} ({p.path}): expected status {p.final_status}, chain has {statuses.get(p.task_id)}"
        for p in planned
        if statuses.get(p.task_id) != p.final_status
    ]
    report.add("every task in its expected final state", not wrong, "; ".join(wrong[:10]))

    flows = token_flows(events)
    paid_out = flows["payouts"] + flows["fees"] + flows["refunds"] - flows["deferred"] + flows["withdrawn"]
    balance_ok = flows["deposits"] == paid_out + escrow_balance
    report.add(
        "token conservation (deposits = payouts + fees + refunds + escrowed)",
        balance_ok,
        f"{flows} escrowed={escrow_balance}",
    )

    verdicts = Counter(
        (int(e.args["taskId"]), int(e.args["attempt"])) for e in events if e.name == "VerificationCompleted"
    )
    twice = [key for key, n in verdicts.items() if n > 1]
    report.add("at most one verdict per attempt", not twice, f"judged twice: {twice[:10]}")

    submitted = {
        (int(e.args["taskId"]), int(e.args["attempt"])) for e in events if e.name == "EvidenceSubmitted"
    }
    judged_unsubmitted = [key for key in verdicts if key not in submitted]
    report.add("every verdict names a submitted attempt", not judged_unsubmitted, str(judged_unsubmitted[:10]))
    return report
