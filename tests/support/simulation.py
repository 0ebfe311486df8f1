"""A seeded whole-system simulation: the real stack as processes, random traffic, random faults.

`Simulation` starts every service as its own `escrowd` process against one anvil, one
PostgreSQL database and one Kafka broker of its own (behind a TCP proxy, so the broker can
be cut off), with two members in every consumer group and a standby relayer, as a
deployment scales out. From one integer seed it derives the whole schedule up front
(`Schedule.from_seed`): which tasks the traffic plays and when, and which faults strike
between them: kill -9 of any service, reorgs of random depth (some deeper than the
confirmations), RPC and broker cut-offs, duplicate and reordered deliveries of indexed
events, clock jumps. After the schedule it quiesces and `check_invariants` compares what
the pipeline derived with the chain itself. The same seed replays the same schedule (the
interleaving with the services' own timing is, of course, the operating system's).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from aiokafka import AIOKafkaProducer
from eth_abi import decode as abi_decode
from eth_account import Account

from escrowd.devnet import DAY, Devnet, EscrowRevert, text_hash
from escrowd.invariants import ChainEvent, token_flows
from lifecycle import clock, machine
from lifecycle.reputation import rules as reputation_rules
from runtime.services.ports import free_port
from schemas.events import EscrowEventMessage
from schemas.task_state import (
    AppealWindowClosed,
    DeadlinePassed,
    EscalationCollectible,
    RoundOutcome,
    TaskState,
)
from tests.support.indexer_harness import chain_logs, escrowd_command, read_topic
from tests.support.rpc_proxy import Faults, RpcFaultProxy
from tests.support.tcp_proxy import TcpProxy

REPO_ROOT = Path(__file__).resolve().parents[2]
_TIMER_EVENTS = (DeadlinePassed, AppealWindowClosed, EscalationCollectible)

# ---------------------------------------------------------------------------- the schedule

SERVICES = (
    "indexer",
    "verification-a",
    "verification-b",
    "lifecycle-a",
    "lifecycle-b",
    "reputation-a",
    "reputation-b",
    "relayer-a",
    "relayer-b",
    "api",
)
PATHS = ("auto_pass", "auto_fail", "manual_pass", "chain_dispute", "chain_cancel", "chain_timeout")
FAULTS = ("kill", "reorg", "deep_reorg", "rpc_cut", "broker_cut", "duplicate", "time_jump")


@dataclass(frozen=True)
class Step:
    """One entry of the schedule: start a task on a path, or inject a fault."""

    kind: str
    arg: str = ""
    amount: float = 0.0

    def __str__(self) -> str:
        return f"{self.kind}({self.arg}{',' if self.arg and self.amount else ''}{self.amount or ''})"


@dataclass(frozen=True)
class Schedule:
    """Everything the seed decides."""

    seed: int
    steps: tuple[Step, ...]

    @classmethod
    def from_seed(cls, seed: int, *, tasks: int, faults: int) -> Schedule:
        """`tasks` traffic steps over every path and `faults` faults, interleaved by the seed."""
        rng = random.Random(seed)
        steps = [Step("task", PATHS[i % len(PATHS)]) for i in range(tasks)]
        for i in range(faults):
            kind = FAULTS[i % len(FAULTS)] if i < len(FAULTS) else rng.choice(FAULTS)
            match kind:
                case "kill":
                    steps.append(Step("kill", rng.choice(SERVICES), round(rng.uniform(0.0, 2.0), 2)))
                case "reorg":
                    steps.append(Step("reorg", "", rng.randint(1, 1)))
                case "deep_reorg":
                    steps.append(Step("reorg", "deep", rng.randint(2, 3)))
                case "rpc_cut" | "broker_cut":
                    steps.append(Step(kind, "", round(rng.uniform(1.0, 4.0), 2)))
                case "duplicate":
                    steps.append(Step("duplicate", "", rng.randint(5, 30)))
                case "time_jump":
                    steps.append(Step("time_jump", "", rng.choice((3600, DAY, 4 * DAY, 15 * DAY))))
        rng.shuffle(steps)
        return cls(seed, tuple(steps))

    def describe(self) -> str:
        return f"seed={self.seed}: " + " ".join(str(s) for s in self.steps)


# ---------------------------------------------------------------------------- processes


class ServiceProcess:
    """One `escrowd …` child process, in its own process group, output to a log file."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.args = args
        self.env = env
        self.log_path = log_dir / f"{name}.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.kills = 0
        self.restarts_by_supervisor = 0
        self.paused = False

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        assert not self.running, f"{self.name} already running"
        with self.log_path.open("ab") as out:
            out.write(f"--- start {self.starts}\n".encode())
            out.flush()
            self._proc = subprocess.Popen(
                [*escrowd_command(), *self.args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=REPO_ROOT,
                start_new_session=True,
            )
        self.starts += 1

    def kill9(self) -> None:
        """SIGKILL the whole process group: nothing of the service cleans up."""
        if self._proc is None or self._proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait(timeout=30)
        self.kills += 1

    def stop(self) -> None:
        if self._proc is None or self._proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGTERM)
        try:
            self._proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.kill9()

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


# ---------------------------------------------------------------------------- the stack


@dataclass
class Simulation:
    """The real stack for one seed, and the faults that can be injected into it."""

    devnet: Devnet
    database_url: str
    bootstrap: str
    broker_proxy: TcpProxy
    schedule: Schedule
    confirmations: int = 1
    log_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="escrowd-sim-")))
    services: dict[str, ServiceProcess] = field(default_factory=dict)
    rpc_proxy: RpcFaultProxy | None = None
    api_port: int = 0
    notes: list[str] = field(default_factory=list)
    signer_key: str = ""

    # -- start / stop ------------------------------------------------------------------

    def start(self) -> None:
        # Bury the deployment (token mints, approvals) below the deepest reorg a schedule makes.
        self.devnet.mine(8)
        self.rpc_proxy = RpcFaultProxy(self.devnet.rpc_url, Faults(seed=self.schedule.seed)).start()
        self.signer_key = "0x" + random.Random(self.schedule.seed).randbytes(32).hex()
        signer = Account.from_key(self.signer_key).address
        self.api_port = free_port()
        chains = json.dumps([{
            "chain_id": self.devnet.chain_id, "name": "devnet", "rpc_urls": [self.rpc_proxy.url],
            "escrow_addresses": [self.devnet.escrow_address], "start_block": self.devnet.deploy_block,
            "confirmations": self.confirmations, "poll_interval": 0.2, "rpc_timeout": 3.0,
        }])  # fmt: skip
        relayer_chains = json.dumps([{
            "chain_id": self.devnet.chain_id, "rpc_urls": [self.rpc_proxy.url],
            "escrow_addresses": [self.devnet.escrow_address], "confirmations": self.confirmations,
            "poll_interval": 0.2, "rpc_timeout": 3.0,
        }])  # fmt: skip
        base = {
            **os.environ,
            "ESCROWD_DATABASE_URL": self.database_url,
            "ESCROWD_KAFKA_BOOTSTRAP": self.bootstrap,
            "ESCROWD_LOG_JSON": "true",
            "ESCROWD_TOPIC_PARTITIONS": "2",
        }
        specs: dict[str, tuple[list[str], dict[str, str]]] = {
            "indexer": (["index", "run"], {"ESCROWD_CHAINS": chains}),
            "api": (["api", "serve"], {
                "ESCROWD_API_PORT": str(self.api_port),
                "ESCROWD_MARKETPLACE_VERIFIER_ADDRESS": self.devnet.marketplace_verifier.address,
                "ESCROWD_EVIDENCE_WAIT_SECONDS": "20", "ESCROWD_FINALIZE_WAIT_SECONDS": "10",
                "ESCROWD_DEPLOYMENTS": json.dumps(
                    [{"chain_id": self.devnet.chain_id, "escrow": self.devnet.escrow_address}]
                ),
            }),
        }  # fmt: skip
        for member in ("a", "b"):
            specs[f"verification-{member}"] = (["consume", "verification", "run"], {
                "ESCROWD_VERIFICATION_SIGNING_KEY": self.signer_key,
                "ESCROWD_RETRY_BASE_SECONDS": "1", "ESCROWD_RETRY_MAX_SECONDS": "5",
            })  # fmt: skip
            specs[f"lifecycle-{member}"] = (["consume", "lifecycle"], {})
            specs[f"reputation-{member}"] = (["consume", "reputation"], {})
            specs[f"relayer-{member}"] = (["relay", "run"], {
                "ESCROWD_CHAINS": relayer_chains,
                "ESCROWD_RELAYER_KEY": self.devnet.marketplace_verifier.private_key,
                "ESCROWD_RELAYER_TRUSTED_SIGNERS": signer,
                "ESCROWD_RELAYER_POLL_INTERVAL": "0.5",
                "ESCROWD_RELAYER_PORT": str(free_port()),
                "ESCROWD_RELAYER_KAFKA_SESSION_TIMEOUT_MS": "6000",
                "ESCROWD_RELAYER_REPLACE_AFTER_SECONDS": "3",
            })  # fmt: skip
        for name in SERVICES:
            args, extra = specs[name]
            self.services[name] = ServiceProcess(name, args, {**base, **extra}, self.log_dir)
            self.services[name].start()

    def stop(self) -> None:
        for service in self.services.values():
            service.stop()
        if self.rpc_proxy is not None:
            self.rpc_proxy.stop()

    def ensure_running(self) -> None:
        for service in self.services.values():
            if not service.running:
                service.start()

    async def supervise(self) -> None:
        """Restart any service that exits, as a deployment's supervisor would (k8s, systemd).

        A service may exit on its own (e.g. the broker unreachable at start-up); a killed one
        is restarted by `inject` after its pause, and by this loop if that pause is over.
        """
        while True:
            await asyncio.sleep(0.5)
            for service in self.services.values():
                if not service.running and not service.paused:
                    service.restarts_by_supervisor += 1
                    service.start()

    async def ready(self, timeout: float = 120.0) -> None:
        """Until the API answers (every other service is then starting or started)."""

        async def answers() -> bool:
            try:
                async with httpx.AsyncClient(timeout=2) as client:
                    await client.get(f"http://127.0.0.1:{self.api_port}/docs")
                return True
            except httpx.HTTPError:
                return False

        await wait_for_condition(answers, timeout=timeout, what="the API")

    def logs(self, lines: int = 15) -> str:
        return "\n".join(
            f"== {s.name} (starts {s.starts}, kills {s.kills}, restarted after exiting {s.restarts_by_supervisor})"
            f"\n{s.tail(lines)}"
            for s in self.services.values()
        )

    # -- faults --------------------------------------------------------------------------

    async def inject(self, step: Step) -> None:
        """Apply one fault step (restoring what it cut off before returning)."""
        match step.kind:
            case "kill":
                service = self.services[step.arg]
                service.paused = True
                try:
                    service.kill9()
                    await asyncio.sleep(step.amount)
                    if not service.running:
                        service.start()
                finally:
                    service.paused = False
            case "reorg":
                depth = int(step.amount)
                await asyncio.to_thread(self.devnet.reorg, depth)
            case "rpc_cut":
                assert self.rpc_proxy is not None
                self.rpc_proxy.set_faults(Faults(error_rate=1.0, seed=self.schedule.seed))
                await asyncio.sleep(step.amount)
                self.rpc_proxy.set_faults(Faults(seed=self.schedule.seed))
            case "broker_cut":
                self.broker_proxy.refuse()
                self.broker_proxy.cut()
                await asyncio.sleep(step.amount)
                self.broker_proxy.resume()
            case "duplicate":
                await self._redeliver(int(step.amount))
            case "time_jump":
                await asyncio.to_thread(self.devnet.increase_time, int(step.amount))
        self.notes.append(str(step))

    async def _redeliver(self, count: int) -> None:
        """Publish `count` already-published event records again, newest first (reordered)."""
        with contextlib.suppress(Exception):
            records = await read_topic(self.bootstrap, "escrow.events.v1", timeout=10)
            rng = random.Random(self.schedule.seed + len(self.notes))
            sample = rng.sample(records, min(count, len(records)))
            producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, enable_idempotence=False)
            await producer.start()
            try:
                for record in reversed(sample):
                    await producer.send_and_wait(
                        "escrow.events.v1", json.dumps(record.payload).encode(), key=record.key,
                        headers=[(k, v.encode()) for k, v in record.headers.items()],
                    )  # fmt: skip
            finally:
                await producer.stop()


# ---------------------------------------------------------------------------- traffic


class Traffic:
    """Plays task paths on the chain and through the API; every step is best effort.

    Faults can drop a transaction (a reorg) or delay a verdict past any wait, so a path that
    does not go as planned is just noted: the run is judged against the chain at the end,
    never against the plan.
    """

    def __init__(self, sim: Simulation) -> None:
        from escrowd.pipeline_parts import ApiClient

        self.sim = sim
        self.dn = sim.devnet
        self.api = ApiClient(f"http://127.0.0.1:{sim.api_port}", sim.devnet)
        self.lock = asyncio.Lock()
        self.index = 0
        self.failures: Counter[str] = Counter()

    async def chain(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        async with self.lock:
            return await asyncio.to_thread(fn, *args, **kwargs)

    async def play(self, path: str) -> None:
        index = self.index
        self.index += 1
        try:
            await asyncio.wait_for(getattr(self, f"_{path}")(index), timeout=90)
        except (EscrowRevert, RuntimeError, TimeoutError, AssertionError, OSError, httpx.HTTPError) as exc:
            # Best effort by design (a fault may drop a step), but a programming error in the
            # traffic itself (TypeError, AttributeError, ...) is not caught: it fails the run.
            self.failures[f"{path}: {type(exc).__name__} {str(exc)[:60]}"] += 1

    def _actors(self, index: int) -> tuple[Any, Any]:
        return self.dn.posters[index % len(self.dn.posters)], self.dn.agents[index % len(self.dn.agents)]

    async def _status(self, task: int, want: int, within: float = 60.0) -> None:
        deadline = time.monotonic() + within
        while int((await self.chain(self.dn.get_task, task)).status) != want:
            if time.monotonic() > deadline:
                raise TimeoutError(f"task {task} never reached {want}")
            await asyncio.sleep(0.3)

    async def _pipeline_task(self, index: int, terms: dict[str, Any], output: str) -> tuple[int, Any, Any]:
        from schemas.task_terms import result_hash

        poster, agent = self._actors(index)
        task_hash = await self.api.register_terms(poster.private_key, terms)
        task = await self.chain(self.dn.post_task, poster, duration=30 * DAY, task_hash=task_hash)
        await self.chain(self.dn.accept_task, task, sender=agent)
        result = {"output": output}
        await self.chain(self.dn.submit_evidence, task, bytes.fromhex(result_hash(result)[2:]), sender=agent)
        await self.api.finalize(agent.private_key, task, result)
        return task, poster, agent

    AUTO = {  # noqa: RUF012 - read-only
        "verificationMode": "auto",
        "verificationCriteria": {"min_length": 40, "contains_keywords": ["escrow"], "pass_threshold": 60},
    }

    async def _auto_pass(self, index: int) -> None:
        words = " ".join(f"finding{i} on settlement" for i in range(8))
        task, _, _ = await self._pipeline_task(index, self.AUTO, f"Escrow report {index}: it works. {words}.")
        await self._status(task, 4)

    async def _auto_fail(self, index: int) -> None:
        task, _, _ = await self._pipeline_task(index, self.AUTO, f"Short note {index} without the keyword at all.")
        await self._status(task, 3)

    async def _manual_pass(self, index: int) -> None:
        from schemas.task_terms import result_hash

        output = f"Manual work {index}"
        task, poster, _ = await self._pipeline_task(index, {"verificationMode": "manual"}, output)
        for _ in range(100):
            try:
                await self.api.review(poster.private_key, task, 1, result_hash({"output": output}), True, [])
                break
            except RuntimeError:
                await asyncio.sleep(0.3)
        await self._status(task, 4)

    async def _chain_dispute(self, index: int) -> None:
        poster, agent = self._actors(index)
        verifier = self.dn.verifier_agents[index % len(self.dn.verifier_agents)]
        task = await self.chain(self.dn.post_task, poster, duration=30 * DAY, verifier=verifier)
        evidence = text_hash(f"disputed {index}")
        await self.chain(self.dn.accept_task, task, sender=agent)
        await self.chain(self.dn.submit_evidence, task, evidence, sender=agent)
        await self.chain(self.dn.complete_verification, task, 1, evidence, False, 10, sender=verifier)
        await self.chain(self.dn.raise_dispute, task, sender=agent)
        await self.chain(self.dn.resolve_dispute, task, random.Random(index).choice((0, 5_000, 10_000)))

    async def _chain_cancel(self, index: int) -> None:
        poster, _ = self._actors(index)
        task = await self.chain(self.dn.post_task, poster, duration=30 * DAY)
        await self.chain(self.dn.cancel, task, sender=poster)

    async def _chain_timeout(self, index: int) -> None:
        poster, agent = self._actors(index)
        task = await self.chain(self.dn.post_task, poster, duration=DAY)
        await self.chain(self.dn.accept_task, task, sender=agent)
        await self.chain(self.dn.submit_evidence, task, text_hash(f"never judged {index}"), sender=agent)


# ---------------------------------------------------------------------------- invariants


async def quiesce(sim: Simulation, conn: asyncpg.Connection, *, timeout: float = 240.0) -> None:
    """Every service up, no fault active, the chain still; then wait for the pipeline to settle."""
    sim.ensure_running()
    assert sim.rpc_proxy is not None
    sim.rpc_proxy.set_faults(Faults(seed=sim.schedule.seed))
    sim.broker_proxy.resume()
    await asyncio.to_thread(sim.devnet.mine, sim.confirmations + 1)
    head = await asyncio.to_thread(sim.devnet.block_number)

    async def settled() -> bool:
        row = await conn.fetchrow(
            "SELECT (SELECT block_number FROM chain_cursor WHERE chain_id = $1) AS cursor,"
            " (SELECT count(*) FROM outbox WHERE published_at IS NULL)"
            " + (SELECT count(*) FROM event_log_messages WHERE state <> 'published') AS pending,"
            " (SELECT count(*) FROM settlement_verdicts WHERE status IN ('queued', 'sent')) AS open",
            sim.devnet.chain_id,
        )
        if row is None or row["cursor"] is None or row["cursor"] < head or row["pending"] or row["open"]:
            return False
        return not await derived_state_differences(sim, conn)

    await wait_for_condition(settled, timeout=timeout, what="the pipeline to settle")


async def wait_for_condition(
    predicate: Callable[[], Awaitable[bool]], *, timeout: float, what: str, interval: float = 0.5
) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(interval)


async def _canonical_events(conn: asyncpg.Connection, chain_id: int) -> list[EscrowEventMessage]:
    rows = await conn.fetch(
        "SELECT event_id, chain_id, escrow_address, block_number, block_hash, block_timestamp, tx_hash,"
        " tx_index, log_index, event_name, task_id, args FROM escrow_events WHERE chain_id = $1"
        " ORDER BY block_number, log_index",
        chain_id,
    )
    return [
        EscrowEventMessage(
            id=r["event_id"], chain_id=r["chain_id"], escrow_address=r["escrow_address"],
            block_number=r["block_number"], block_hash=r["block_hash"], block_timestamp=r["block_timestamp"],
            tx_hash=r["tx_hash"], tx_index=r["tx_index"], log_index=r["log_index"], event=r["event_name"],
            task_id=None if r["task_id"] is None else int(r["task_id"]), args=dict(r["args"]),
        )
        for r in rows
    ]


def _by_task(events: list[EscrowEventMessage]) -> dict[int, list[machine.DomainEvent]]:
    tasks: dict[int, list[machine.DomainEvent]] = {}
    for message in events:
        event = machine.event_from_message(message)
        if event is not None and message.task_id is not None:
            tasks.setdefault(message.task_id, []).append(event)
    return tasks


async def derived_state_differences(sim: Simulation, conn: asyncpg.Connection) -> list[str]:
    """Where the pipeline's derived state differs from a fold of the canonical events."""
    dn = sim.devnet
    problems: list[str] = []
    logs = await asyncio.to_thread(chain_logs, dn.rpc_url, dn.chain_id, [dn.escrow_address], dn.deploy_block)
    stored = {r["event_id"] for r in await conn.fetch("SELECT event_id FROM escrow_events WHERE chain_id = $1", dn.chain_id)}
    canonical = {log.id for log in logs}
    if stored != canonical:
        problems.append(f"indexer: {len(canonical - stored)} events missing, {len(stored - canonical)} not canonical")
        return problems
    events = await _canonical_events(conn, dn.chain_id)
    states = {
        int(r["task_id"]): TaskState.model_validate(r["state"])
        for r in await conn.fetch("SELECT task_id, state FROM task_states WHERE chain_id = $1", dn.chain_id)
    }
    for task_id, task_events in _by_task(events).items():
        now = await clock.task_time(conn, dn.chain_id, dn.escrow_address, task_id)
        expected, effects = machine.replay(task_events, now)
        got = states.get(task_id)
        if expected is None or got is None:
            if expected != got:
                problems.append(f"task {task_id}: state {got} vs fold {expected}")
            continue
        if got.model_dump(exclude={"pending_timers"}) != expected.model_dump(exclude={"pending_timers"}):
            problems.append(f"task {task_id}: derived {got.status.name}/{got.last_event_id} vs fold {expected.status.name}/{expected.last_event_id}")
        justified = {(e.kind.value, e.at) for e in effects if isinstance(e, _TIMER_EVENTS)}
        live = {
            (r["kind"], int(r["at"]))
            for r in await conn.fetch(
                "SELECT kind, at FROM lifecycle_fired_timers WHERE chain_id = $1 AND task_id = $2 AND live",
                dn.chain_id, task_id,
            )
        }  # fmt: skip
        if not live <= justified:
            problems.append(f"task {task_id}: live timers {sorted(live - justified)} have no cause")
    for task_id in set(states) - set(_by_task(events)):
        problems.append(f"task {task_id}: derived state without a canonical event")
    outcomes: dict[str, list[RoundOutcome]] = {}
    for message in events:
        if message.event == "VerificationCompleted" and message.task_id is not None:
            agent = str(message.args["agent"]).lower()
            outcomes.setdefault(agent, []).append(
                RoundOutcome(
                    agent=agent, passed=bool(message.args["passed"]), chain_id=message.chain_id,
                    escrow=message.escrow_address, task_id=message.task_id, attempt=int(message.args["attempt"]),
                    event_id=message.id, block_number=message.block_number, log_index=message.log_index,
                    block_timestamp=message.block_timestamp,
                )
            )
    reputation = {
        r["agent"]: (r["score"], r["dispute_count"], r["passes"], r["failures"])
        for r in await conn.fetch("SELECT agent, score, dispute_count, passes, failures FROM agent_reputation")
    }
    for agent, agent_outcomes in outcomes.items():
        want = reputation_rules.fold(agent, agent_outcomes)
        got_rep = reputation.get(agent)
        if got_rep != (want.score, want.dispute_count, want.passes, want.failures):
            problems.append(f"reputation of {agent}: {got_rep} vs rules {want}")
    for agent, row in reputation.items():
        if agent not in outcomes and row[2:] != (0, 0):
            problems.append(f"reputation of {agent}: {row} without a canonical verdict")
    return problems


async def chain_invariants(sim: Simulation, conn: asyncpg.Connection) -> list[str]:
    """Funds conserved, no verdict twice, no verdict transaction twice, no effect without cause."""
    dn = sim.devnet
    problems: list[str] = []
    decoded = await asyncio.to_thread(lambda: list(dn.logs()))
    events = [ChainEvent(e.name, e.args) for e in decoded]
    flows = token_flows(events)
    balance = await asyncio.to_thread(dn.balance_of, dn.escrow_address)
    if flows["deposits"] != flows["payouts"] + flows["fees"] + flows["refunds"] + balance:
        problems.append(f"funds: {flows} escrowed={balance}")
    open_rewards = 0
    for task_id in range(1, await asyncio.to_thread(dn.task_count) + 1):
        view = await asyncio.to_thread(dn.get_task, task_id)
        if int(view.status) in (0, 1, 2, 3, 5, 6):
            open_rewards += view.reward
    if open_rewards != balance:
        problems.append(f"funds: escrow holds {balance}, unsettled rewards are {open_rewards}")
    verdicts = Counter((int(e.args["taskId"]), int(e.args["attempt"])) for e in events if e.name == "VerificationCompleted")
    if twice := [k for k, n in verdicts.items() if n > 1]:
        problems.append(f"judged twice: {twice}")
    # Every verdict transaction the relayer key sent on the canonical chain, per attempt.
    sent: Counter[tuple[int, int]] = Counter()
    relayer = dn.marketplace_verifier.address.lower()
    function = dn._codec.functions["completeVerification"]
    selector = "0x" + function.selector.hex()
    for number in range(dn.deploy_block, await asyncio.to_thread(dn.block_number) + 1):
        block = await asyncio.to_thread(dn.rpc, "eth_getBlockByNumber", hex(number), True)
        for tx in block["transactions"]:
            if tx["from"].lower() == relayer and tx["input"].startswith(selector):
                task_id, attempt = abi_decode(function.input_types, bytes.fromhex(tx["input"][10:]))[:2]
                sent[(int(task_id), int(attempt))] += 1
    if twice_sent := [k for k, n in sent.items() if n > 1]:
        problems.append(f"verdict transactions sent twice: {twice_sent}")
    confirmed = await conn.fetch("SELECT task_id, attempt FROM settlement_verdicts WHERE status = 'confirmed'")
    if missing := [(int(r["task_id"]), r["attempt"]) for r in confirmed if (int(r["task_id"]), r["attempt"]) not in verdicts]:
        problems.append(f"relayer says confirmed, the chain has no verdict: {missing}")
    return problems


@contextlib.contextmanager
def simulation_logs_on_failure(sim: Simulation) -> Iterator[None]:
    """Re-raise any failure with the seed, the schedule and the services' last log lines."""
    try:
        yield
    except BaseException as exc:
        raise AssertionError(
            f"simulation failed; replay with ESCROWD_SIM_SEED={sim.schedule.seed}\n"
            f"{sim.schedule.describe()}\napplied: {sim.notes}\n{exc}\n{sim.logs()}"
        ) from exc
