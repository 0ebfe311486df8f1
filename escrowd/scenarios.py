"""Scripted escrow histories on a devnet: every path a task can take, for tests and demos.

Each function drives one task through one path with real transactions and returns the
task id; `every_event_type` runs them all, so every event the contract emits appears.
"""

from __future__ import annotations

from escrowd.devnet import APPEAL_WINDOW, DAY, ESCALATION_DELAY, USDC, Actor, Devnet, text_hash


def _parties(dn: Devnet, n: int) -> tuple[Actor, Actor]:
    """The `n`th poster and agent (cycling through the devnet's accounts)."""
    return dn.posters[n % len(dn.posters)], dn.agents[n % len(dn.agents)]


def _deliver(dn: Devnet, task: int, agent: Actor, label: str) -> bytes:
    """`agent` accepts `task` and submits the evidence `label`; the evidence hash."""
    dn.accept_task(task, sender=agent)
    evidence = text_hash(f"{label} {task}")
    dn.submit_evidence(task, evidence, sender=agent)
    return evidence


def pass_first_time(dn: Devnet, n: int = 0) -> int:
    """Create → accept → submit → verified pass (90/10 payout)."""
    poster, agent = _parties(dn, n)
    task = dn.post_task(poster, reward=10 * USDC)
    evidence = _deliver(dn, task, agent, "result")
    dn.complete_verification(task, 1, evidence, True, 90, sender=dn.marketplace_verifier)
    return task


def _failed_once(dn: Devnet, n: int, label: str, score: int) -> tuple[int, Actor]:
    """A task delivered by its agent and failed by the marketplace verifier: (task, agent)."""
    poster, agent = _parties(dn, n)
    task = dn.post_task(poster)
    evidence = _deliver(dn, task, agent, label)
    dn.complete_verification(task, 1, evidence, False, score, sender=dn.marketplace_verifier)
    return task, agent


def fail_then_pass(dn: Devnet, n: int = 0) -> int:
    """A failed verdict, a resubmission, then a pass."""
    task, agent = _failed_once(dn, n, "first", 20)
    second = text_hash(f"second {task}")
    dn.submit_evidence(task, second, sender=agent)
    dn.complete_verification(task, 2, second, True, 80, sender=dn.marketplace_verifier)
    return task


def agent_review(dn: Devnet, n: int = 0) -> int:
    """A named verifier agent judges on chain."""
    poster, agent = _parties(dn, n)
    verifier = dn.verifier_agents[n % len(dn.verifier_agents)]
    task = dn.post_task(poster, verifier=verifier)
    evidence = _deliver(dn, task, agent, "reviewed")
    dn.complete_verification(task, 1, evidence, True, 100, sender=verifier)
    return task


def dispute_and_ruling(dn: Devnet, n: int = 0) -> int:
    """A failed verdict disputed by the agent and split by the arbiter."""
    task, agent = _failed_once(dn, n, "disputed", 10)
    dn.raise_dispute(task, sender=agent)
    dn.resolve_dispute(task, 5_000)
    return task


def cancelled(dn: Devnet, n: int = 0) -> int:
    """Posted and cancelled while open."""
    poster = dn.posters[n % len(dn.posters)]
    task = dn.post_task(poster)
    dn.cancel(task, sender=poster)
    return task


def timeout_refund(dn: Devnet, n: int = 0) -> int:
    """Never delivered: the poster reclaims after the deadline."""
    poster, agent = _parties(dn, n)
    task = dn.post_task(poster, duration=DAY)
    dn.accept_task(task, sender=agent)
    dn.increase_time(DAY + 1)
    dn.claim_timeout(task, sender=poster)
    return task


def escalation_and_collection(dn: Devnet, n: int = 0) -> int:
    """Delivered, never judged: escalated at the deadline, collected 14 days later."""
    poster, agent = _parties(dn, n)
    task = dn.post_task(poster, duration=DAY)
    _deliver(dn, task, agent, "unjudged")
    dn.increase_time(DAY + 1)
    dn.claim_timeout(task, sender=poster)
    dn.increase_time(ESCALATION_DELAY)
    dn.collect_escalated(task, sender=agent)
    return task


def failed_refund_after_appeal(dn: Devnet, n: int = 0) -> int:
    """Failed, deadline passed, appeal window closed: full refund."""
    poster, agent = _parties(dn, n)
    task = dn.post_task(poster, duration=DAY)
    evidence = _deliver(dn, task, agent, "failed")
    dn.complete_verification(task, 1, evidence, False, 0, sender=dn.marketplace_verifier)
    dn.increase_time(DAY + APPEAL_WINDOW + 1)
    dn.claim_timeout(task, sender=poster)
    return task


def rotate_verifier(dn: Devnet) -> None:
    """Rotate the marketplace verifier away and back (two escrow-wide events)."""
    original = dn.marketplace_verifier
    dn.set_marketplace_verifier(dn.spare[0])
    dn.set_marketplace_verifier(original)


PATHS = (
    pass_first_time,
    fail_then_pass,
    agent_review,
    dispute_and_ruling,
    cancelled,
    timeout_refund,
    escalation_and_collection,
    failed_refund_after_appeal,
)


def every_event_type(dn: Devnet) -> list[int]:
    """Run every path once (and a verifier rotation); return the task ids."""
    tasks = [path(dn, i) for i, path in enumerate(PATHS)]
    rotate_verifier(dn)
    return tasks
