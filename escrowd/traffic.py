"""The traffic generator of `escrowd run`: posters, agents and verifiers playing every path.

Each planned task follows one path; chain actions go through the devnet library (in a
worker thread, since web3 is synchronous), off-chain ones (task terms, finalize, review)
through the HTTP API, exactly as a marketplace client would. Chain time moves in phases:

1. **interactive** (before any deadline): posting, accepting, submitting, verdicts through
   the pipeline, agent-review verdicts, disputes and rulings, cancellations;
2. **past the short deadlines**: timeouts are claimed (refund when never delivered,
   escalation when delivered but never judged);
3. **past the appeal window and the escalation delay**: failed tasks are refunded and
   escalated rewards collected.

Every task records the status it must end in; `escrowd.invariants` checks that against
the chain afterwards.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from escrowd.devnet import (
    APPEAL_WINDOW,
    DAY,
    ESCALATION_DELAY,
    USDC,
    Actor,
    Devnet,
    EscrowRevert,
    text_hash,
)
from escrowd.invariants import PlannedTask

log = structlog.get_logger(__name__)

LONG_DEADLINE = 30 * DAY
SHORT_DEADLINE = 1 * DAY


class OffChain:
    """The off-chain side a path may need (the HTTP API). None in a chain-only run."""

    async def register_terms(self, poster_key: str, terms: dict[str, Any]) -> bytes:  # pragma: no cover
        raise NotImplementedError

    async def finalize(self, agent_key: str, task_id: int, result: Any) -> dict[str, Any]:  # pragma: no cover
        raise NotImplementedError

    async def review(
        self, poster_key: str, task_id: int, attempt: int, evidence_hash: str, passed: bool, reasons: list[str]
    ) -> dict[str, Any]:  # pragma: no cover
        """The poster's decision on `attempt`, whose on-chain evidence is `evidence_hash`."""
        raise NotImplementedError

    async def list_task(self, poster_key: str, task_id: int) -> None:  # pragma: no cover
        raise NotImplementedError

    async def put_brief(self, poster_key: str, task_hash: bytes, brief: str) -> None:  # pragma: no cover
        """Store the task's public brief (it hashes to the terms' instructionsDigest)."""
        raise NotImplementedError


@dataclass
class TaskPlan:
    """One task's path and what it must end as."""

    index: int
    path: str
    task_id: int | None = None
    final_status: int = -1
    agent: str | None = None
    failed_rounds: int = 0
    passed_rounds: int = 0
    done: bool = False

    def planned(self) -> PlannedTask:
        assert self.task_id is not None
        return PlannedTask(
            task_id=self.task_id,
            path=self.path,
            final_status=self.final_status,
            agent=self.agent,
            failed_rounds=self.failed_rounds,
            passed_rounds=self.passed_rounds,
        )


@dataclass
class TrafficStats:
    """Counters for the progress display."""

    planned: int = 0
    posted: int = 0
    finished: int = 0
    by_path: dict[str, int] = field(default_factory=dict)


class TrafficGenerator:
    """Drives planned tasks through their paths on a devnet."""

    CHAIN_ONLY_PATHS = (
        "agent_review_pass",
        "agent_review_fail_resubmit",
        "dispute_and_ruling",
        "cancellation",
        "timeout_refund",
        "escalation_and_collection",
    )
    PIPELINE_PATHS = ("auto_pass", "auto_fail_resubmit", "manual_review", "auto_fail_refund", "panel_dispute")

    def __init__(
        self,
        devnet: Devnet,
        *,
        offchain: OffChain | None = None,
        seed: int = 0,
        wait_judged: Callable[[int, int], Awaitable[bool]] | None = None,
        hosted_verifier: Any = None,
    ) -> None:
        self.dn = devnet
        self.offchain = offchain
        self.hosted_verifier = hosted_verifier
        self.random = random.Random(seed)
        self.stats = TrafficStats()
        self._wait_judged = wait_judged
        self._lock = asyncio.Lock()

    @property
    def paths(self) -> tuple[str, ...]:
        """Paths this run can play (the pipeline paths need the API)."""
        if self.offchain is None:
            return self.CHAIN_ONLY_PATHS
        hosted = ("agent_review_hosted",) if self.hosted_verifier is not None else ()
        return self.PIPELINE_PATHS + hosted + self.CHAIN_ONLY_PATHS

    def plan(self, count: int) -> list[TaskPlan]:
        """`count` tasks spread over every path, in a seeded order."""
        paths = self.paths
        plans = [TaskPlan(index=i, path=paths[i % len(paths)]) for i in range(count)]
        self.random.shuffle(plans)
        self.stats.planned += count
        for plan in plans:
            self.stats.by_path[plan.path] = self.stats.by_path.get(plan.path, 0) + 1
        return plans

    async def _chain(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        # One devnet call at a time: actors share nonces, and anvil automines each tx.
        async with self._lock:
            return await asyncio.to_thread(fn, *args, **kwargs)

    # -- the phases ------------------------------------------------------------------

    async def run(self, plans: list[TaskPlan], *, concurrency: int = 8) -> list[PlannedTask]:
        """Play every plan through all phases; return what each task must end as."""
        semaphore = asyncio.Semaphore(concurrency)

        async def interactive(plan: TaskPlan) -> None:
            async with semaphore:
                await getattr(self, f"_phase1_{plan.path}")(plan)

        await asyncio.gather(*(interactive(p) for p in plans))
        await self._chain(self.dn.increase_time, SHORT_DEADLINE + 1)
        for plan in plans:
            step = getattr(self, f"_phase2_{plan.path}", None)
            if step is not None:
                await step(plan)
        await self._chain(self.dn.increase_time, max(APPEAL_WINDOW, ESCALATION_DELAY) + 1)
        for plan in plans:
            step = getattr(self, f"_phase3_{plan.path}", None)
            if step is not None:
                await step(plan)
        for plan in plans:
            plan.done = True
            self.stats.finished += 1
        return [p.planned() for p in plans]

    # -- helpers -----------------------------------------------------------------------

    def _actors(self, plan: TaskPlan) -> tuple[Any, Any]:
        poster = self.dn.posters[plan.index % len(self.dn.posters)]
        agent = self.dn.agents[plan.index % len(self.dn.agents)]
        plan.agent = agent.address.lower()
        return poster, agent

    async def _post(self, plan: TaskPlan, *, duration: int, verifier: Any = None, task_hash: bytes | None = None) -> int:
        poster, _ = self._actors(plan)
        task_id: int = await self._chain(
            self.dn.post_task, poster, reward=(5 + plan.index % 20) * USDC, duration=duration,
            verifier=verifier, task_hash=task_hash,
        )
        plan.task_id = task_id
        self.stats.posted += 1
        return task_id

    async def _accept_and_submit(self, plan: TaskPlan, evidence: bytes) -> None:
        _, agent = self._actors(plan)
        assert plan.task_id is not None
        task = await self._chain(self.dn.get_task, plan.task_id)
        if task.status == 0:
            await self._chain(self.dn.accept_task, plan.task_id, sender=agent)
        await self._chain(self.dn.submit_evidence, plan.task_id, evidence, sender=agent)

    # -- paths through the pipeline (API → verification → relayer → chain) -------------

    async def _wait_status(self, plan: TaskPlan, status: int, *, within: float = 120.0) -> None:
        assert plan.task_id is not None
        deadline = asyncio.get_running_loop().time() + within
        while True:
            view = await self._chain(self.dn.get_task, plan.task_id)
            if int(view.status) == status:
                return
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"task {plan.task_id} ({plan.path}): status {int(view.status)}, want {status}")
            await asyncio.sleep(0.2)

    async def _post_with_terms(self, plan: TaskPlan, terms: dict[str, Any], *, duration: int) -> int:
        assert self.offchain is not None
        poster, _ = self._actors(plan)
        task_hash = await self.offchain.register_terms(poster.private_key, terms)
        return await self._post(plan, duration=duration, task_hash=task_hash)

    async def _deliver(self, plan: TaskPlan, result: Any) -> None:
        """submitEvidence with the result's hash, then finalize the result through the API."""
        from schemas.task_terms import result_hash

        assert self.offchain is not None and plan.task_id is not None
        _, agent = self._actors(plan)
        evidence = bytes.fromhex(result_hash(result)[2:])
        await self._accept_and_submit(plan, evidence)
        await self.offchain.finalize(agent.private_key, plan.task_id, result)

    def _good_result(self, plan: TaskPlan, round_: int) -> dict[str, Any]:
        words = " ".join(f"finding{i} about settlement latency and fees" for i in range(8))
        return {"output": f"Escrow report {plan.index}.{round_}: the escrow flow works end to end. {words}."}

    def _bad_result(self, plan: TaskPlan, round_: int) -> dict[str, Any]:
        return {"output": f"Short note {plan.index}.{round_} with nothing that was asked for in it at all."}

    AUTO_TERMS: dict[str, Any] = {  # noqa: RUF012 - read-only
        "verificationMode": "auto",
        "verificationCriteria": {"min_length": 40, "contains_keywords": ["escrow"], "pass_threshold": 60},
    }

    async def _phase1_auto_pass(self, plan: TaskPlan) -> None:
        await self._post_with_terms(plan, self.AUTO_TERMS, duration=LONG_DEADLINE)
        await self._deliver(plan, self._good_result(plan, 1))
        await self._wait_status(plan, 4)
        plan.passed_rounds, plan.final_status = 1, 4

    async def _phase1_auto_fail_resubmit(self, plan: TaskPlan) -> None:
        await self._post_with_terms(plan, self.AUTO_TERMS, duration=LONG_DEADLINE)
        await self._deliver(plan, self._bad_result(plan, 1))
        await self._wait_status(plan, 3)
        await self._deliver(plan, self._good_result(plan, 2))
        await self._wait_status(plan, 4)
        plan.failed_rounds, plan.passed_rounds, plan.final_status = 1, 1, 4

    async def _phase1_auto_fail_refund(self, plan: TaskPlan) -> None:
        await self._post_with_terms(plan, self.AUTO_TERMS, duration=SHORT_DEADLINE)
        await self._deliver(plan, self._bad_result(plan, 1))
        await self._wait_status(plan, 3)
        plan.failed_rounds = 1

    async def _phase3_auto_fail_refund(self, plan: TaskPlan) -> None:
        # Deadline passed and the 3-day appeal window closed without a dispute: full refund.
        poster, _ = self._actors(plan)
        assert plan.task_id is not None
        await self._chain(self.dn.claim_timeout, plan.task_id, sender=poster)
        plan.final_status = 7

    async def _phase1_manual_review(self, plan: TaskPlan) -> None:
        assert self.offchain is not None
        poster, _ = self._actors(plan)
        await self._post_with_terms(plan, {"verificationMode": "manual"}, duration=LONG_DEADLINE)
        assert plan.task_id is not None
        first = self._bad_result(plan, 1)
        await self._deliver(plan, first)
        await self._review_when_indexed(plan, poster.private_key, 1, first, False, ["The summary table is missing."])
        await self._wait_status(plan, 3)
        second = self._good_result(plan, 2)
        await self._deliver(plan, second)
        await self._review_when_indexed(plan, poster.private_key, 2, second, True, [])
        await self._wait_status(plan, 4)
        plan.failed_rounds, plan.passed_rounds, plan.final_status = 1, 1, 4

    async def _review_when_indexed(
        self, plan: TaskPlan, key: str, attempt: int, result: Any, passed: bool, reasons: list[str]
    ) -> None:
        """Review `attempt` (whose evidence is `result`'s hash) once the API has indexed it."""
        from schemas.task_terms import result_hash

        assert self.offchain is not None and plan.task_id is not None
        last: Exception | None = None
        for _ in range(100):
            try:
                await self.offchain.review(key, plan.task_id, attempt, result_hash(result), passed, reasons)
                return
            except RuntimeError as exc:  # the submission may not be indexed yet
                last = exc
                await asyncio.sleep(0.2)
        raise RuntimeError(f"review of task {plan.task_id} refused: {last}")

    async def _phase1_agent_review_hosted(self, plan: TaskPlan) -> None:
        """Agent review by the running hosted verifier: terms, post with it, list, deliver; it judges."""
        assert self.offchain is not None and self.hosted_verifier is not None
        poster, _ = self._actors(plan)
        # The verifier judges against the brief, which must hash to the terms' instructionsDigest.
        brief = f"Task plan {plan.index}: write a short report on the escrow flow."
        terms = {
            "verificationMode": "agent",
            "verifierAddress": self.hosted_verifier.address,
            "verificationCriteria": {"acceptance": 'The report covers the "escrow" flow.'},
            "instructionsDigest": "0x" + text_hash(brief).hex(),
        }
        task_hash = await self.offchain.register_terms(poster.private_key, terms)
        await self.offchain.put_brief(poster.private_key, task_hash, brief)
        task = await self._post(plan, duration=LONG_DEADLINE, verifier=self.hosted_verifier, task_hash=task_hash)
        await self.offchain.list_task(poster.private_key, task)
        await self._deliver(plan, self._good_result(plan, 1))
        await self._wait_status(plan, 4)
        plan.passed_rounds, plan.final_status = 1, 4

    async def _phase1_panel_dispute(self, plan: TaskPlan) -> None:
        # A manual review the agent disputes, then left to the panel: registered terms with a
        # public brief, a delivered result, the poster's rejection; the drawn verifiers check
        # all three against the chain before they attest, the panel service signs the ruling
        # and the relayer sends resolveDispute from the arbiter key.
        from schemas.task_terms import keccak_hex

        assert self.offchain is not None
        poster, agent = self._actors(plan)
        brief = f"Report {plan.index}: summarise the escrow flow end to end."
        terms = {"verificationMode": "manual", "instructionsDigest": keccak_hex(brief.encode("utf-8"))}
        task_hash = await self.offchain.register_terms(poster.private_key, terms)
        await self.offchain.put_brief(poster.private_key, task_hash, brief)
        task = await self._post(plan, duration=LONG_DEADLINE, task_hash=task_hash)
        result = self._bad_result(plan, 1)
        await self._deliver(plan, result)
        await self._review_when_indexed(plan, poster.private_key, 1, result, False, ["Not what the brief asked."])
        await self._wait_status(plan, 3)
        await self._chain(self.dn.raise_dispute, task, sender=agent)
        await self._wait_status(plan, 9, within=300)
        plan.failed_rounds, plan.final_status = 1, 9

    # -- chain-only paths ---------------------------------------------------------------

    async def _posted_for_agent(self, plan: TaskPlan) -> tuple[int, Actor]:
        """A task posted with one of the devnet's verifier agents named (chosen by the plan's index)."""
        verifier = self.dn.verifier_agents[plan.index % len(self.dn.verifier_agents)]
        return await self._post(plan, duration=LONG_DEADLINE, verifier=verifier), verifier

    async def _judged_on_chain(self, plan: TaskPlan, task: int, verifier: Actor, label: str, attempt: int,
                               passed: bool, score: int) -> None:  # fmt: skip
        """The agent submits evidence `label`, then `verifier` judges that attempt on chain."""
        evidence = text_hash(f"{label} {task}")
        await self._accept_and_submit(plan, evidence)
        await self._chain(self.dn.complete_verification, task, attempt, evidence, passed, score, sender=verifier)

    async def _phase1_agent_review_pass(self, plan: TaskPlan) -> None:
        task, verifier = await self._posted_for_agent(plan)
        await self._judged_on_chain(plan, task, verifier, "review pass", 1, True, 95)
        plan.passed_rounds, plan.final_status = 1, 4

    async def _phase1_agent_review_fail_resubmit(self, plan: TaskPlan) -> None:
        task, verifier = await self._posted_for_agent(plan)
        await self._judged_on_chain(plan, task, verifier, "review first", 1, False, 30)
        await self._judged_on_chain(plan, task, verifier, "review second", 2, True, 90)
        plan.failed_rounds, plan.passed_rounds, plan.final_status = 1, 1, 4

    async def _phase1_dispute_and_ruling(self, plan: TaskPlan) -> None:
        task, verifier = await self._posted_for_agent(plan)
        await self._judged_on_chain(plan, task, verifier, "disputed", 1, False, 10)
        _, agent = self._actors(plan)
        await self._chain(self.dn.raise_dispute, task, sender=agent)
        share = self.random.choice((0, 2_500, 5_000, 10_000))
        try:
            await self._chain(self.dn.resolve_dispute, task, share)
        except EscrowRevert as exc:
            # With panels running, the panel's ruling may land first; the task is resolved either way.
            if exc.name != "WrongStatus":
                raise
        plan.failed_rounds, plan.final_status = 1, 9

    async def _phase1_cancellation(self, plan: TaskPlan) -> None:
        poster, _ = self._actors(plan)
        task = await self._post(plan, duration=LONG_DEADLINE)
        await self._chain(self.dn.cancel, task, sender=poster)
        plan.agent, plan.final_status = None, 8

    async def _phase1_timeout_refund(self, plan: TaskPlan) -> None:
        task = await self._post(plan, duration=SHORT_DEADLINE)
        _, agent = self._actors(plan)
        await self._chain(self.dn.accept_task, task, sender=agent)

    async def _claim_timeout(self, plan: TaskPlan) -> None:
        """The poster claims the task's timeout (a refund, or an escalation of work never judged)."""
        poster, _ = self._actors(plan)
        assert plan.task_id is not None
        await self._chain(self.dn.claim_timeout, plan.task_id, sender=poster)

    async def _phase2_timeout_refund(self, plan: TaskPlan) -> None:
        await self._claim_timeout(plan)
        plan.final_status = 7

    async def _phase1_escalation_and_collection(self, plan: TaskPlan) -> None:
        task = await self._post(plan, duration=SHORT_DEADLINE)
        # Delivered on chain, never finalized: nothing judges it.
        await self._accept_and_submit(plan, text_hash(f"never finalized {task}"))

    async def _phase2_escalation_and_collection(self, plan: TaskPlan) -> None:
        await self._claim_timeout(plan)

    async def _phase3_escalation_and_collection(self, plan: TaskPlan) -> None:
        _, agent = self._actors(plan)
        assert plan.task_id is not None
        await self._chain(self.dn.collect_escalated, plan.task_id, sender=agent)
        plan.passed_rounds, plan.final_status = 0, 4

