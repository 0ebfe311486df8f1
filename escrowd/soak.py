"""`escrowd soak`: the deployed shape under steady traffic, sampled until it shows a trend.

Every service runs as its own process (`escrowd index run`, `consume verification run`,
`consume lifecycle`, `consume reputation`, `consume panels`, `relay run`, `relay rulings`,
`api serve`) against one PostgreSQL, one broker and an anvil devnet mining a block a second;
`--members 2` starts two processes of each consumer group. The traffic generator of
`escrowd run` drives tasks through the HTTP API and the chain. Every `--sample-seconds` the
soak reads each process's RSS (`/proc`), the database's connections by `application_name`,
table sizes and each consumer group's lag; it times `finalize` → verdict confirmed on chain.

At the end it prints one JSON summary and exits 1 when a process's memory grows faster than
`--max-slope-mb-per-hour` (least squares over the samples after the warm-up), a process
died, or an invariant of `escrowd.invariants` failed.

`--api URL --rpc URL --devnet FILE` aims the same traffic at a running deployment (an
operator's smoke test): FILE is what `escrowd devnet` prints; `--database-url` adds the
database samples. Nothing is started then and no RSS is read.

The pure parts (slope, percentiles, the growth verdict, the summary) come first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import secrets
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from escrowd.invariants import PlannedTask, Report
from runtime.aio import wait_event

DEFAULT_MAX_SLOPE_MB_PER_HOUR = 60.0
"""A process whose RSS grows faster than this after the warm-up fails the soak.

60 MB/hour is well above what caches and pools still settling give over a 10-minute run
(4-20 MB/hour, see docs/performance.md); at the soak's ~0.25 tasks/s it is about 65 KB
retained per task (17 KB at 1 task/s)."""

WARMUP_FRACTION = 0.2
"""The first fifth of the samples (imports, pools, caches filling) is left out of the slope."""

MIN_SLOPE_SAMPLES = 5

# ---------------------------------------------------------------------------- pure


def least_squares_slope(points: Sequence[tuple[float, float]]) -> float:
    """Slope of the least-squares line through `(x, y)` points (0.0 for fewer than two x's)."""
    n = len(points)
    if n < 2:
        return 0.0
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    if sxx == 0:
        return 0.0
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    return sxy / sxx


def memory_slope_mb_per_hour(samples: Sequence[tuple[float, int]], *, warmup: float = WARMUP_FRACTION) -> float:
    """RSS slope in MB/hour of `(seconds, rss_bytes)` samples, the warm-up fraction left out."""
    kept = list(samples)[int(len(samples) * warmup) :]
    return least_squares_slope([(t / 3600.0, rss / 2**20) for t, rss in kept])


def percentile(values: Sequence[float], q: float) -> float | None:
    """The `q`-th percentile (0-100) by linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class GrowthVerdict:
    """Which processes grew faster than allowed, and which had too few samples to tell."""

    grew: dict[str, float]
    undecided: list[str]

    @property
    def ok(self) -> bool:
        return not self.grew and not self.undecided


def growth_verdict(
    samples: Mapping[str, Sequence[tuple[float, int]]], *, max_slope_mb_per_hour: float = DEFAULT_MAX_SLOPE_MB_PER_HOUR
) -> GrowthVerdict:
    """Per process: its RSS slope over the limit is growth; too few samples after warm-up is no verdict."""
    grew: dict[str, float] = {}
    undecided: list[str] = []
    for name, points in samples.items():
        if len(points) - int(len(points) * WARMUP_FRACTION) < MIN_SLOPE_SAMPLES:
            undecided.append(name)
            continue
        slope = memory_slope_mb_per_hour(points)
        if slope > max_slope_mb_per_hour:
            grew[name] = round(slope, 2)
    return GrowthVerdict(grew=grew, undecided=sorted(undecided))


@dataclass
class Samples:
    """Everything the sampler and the traffic recorded."""

    rss: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    connections: list[dict[str, int]] = field(default_factory=list)
    database_bytes: list[tuple[float, int]] = field(default_factory=list)
    tables: dict[str, int] = field(default_factory=dict)
    lag: list[dict[str, int]] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    traffic_errors: list[str] = field(default_factory=list)


def summarize(
    samples: Samples,
    *,
    minutes: float,
    members: int,
    elapsed_seconds: float,
    tasks: int,
    invariants: Report,
    exited: Sequence[str] = (),
    max_slope_mb_per_hour: float = DEFAULT_MAX_SLOPE_MB_PER_HOUR,
) -> dict[str, Any]:
    """The one JSON document a soak prints; `ok` is what its exit code says."""
    verdict = growth_verdict(samples.rss, max_slope_mb_per_hour=max_slope_mb_per_hour)

    def rounded(value: float | None) -> float | None:
        return None if value is None else round(value, 3)

    peak_connections: dict[str, int] = {}
    for sample in samples.connections:
        for app, n in sample.items():
            peak_connections[app] = max(peak_connections.get(app, 0), n)
    peak_lag: dict[str, int] = {}
    for sample in samples.lag:
        for group, n in sample.items():
            peak_lag[group] = max(peak_lag.get(group, 0), n)
    final_lag = samples.lag[-1] if samples.lag else {}
    ok = verdict.ok and invariants.ok and not exited
    return {
        "ok": ok,
        "minutes": minutes,
        "members_per_group": members,
        "elapsed_seconds": round(elapsed_seconds, 1),
        "tasks": tasks,
        "tasks_per_second": round(tasks / elapsed_seconds, 4) if elapsed_seconds > 0 else 0.0,
        "finalize_to_confirmed_seconds": {
            "count": len(samples.latencies),
            "p50": rounded(percentile(samples.latencies, 50)),
            "p99": rounded(percentile(samples.latencies, 99)),
            "max": rounded(max(samples.latencies, default=None) if samples.latencies else None),
        },
        "memory": {
            name: {
                "samples": len(points),
                "first_mb": round(points[0][1] / 2**20, 1) if points else None,
                "last_mb": round(points[-1][1] / 2**20, 1) if points else None,
                "slope_mb_per_hour": round(memory_slope_mb_per_hour(points), 2),
            }
            for name, points in sorted(samples.rss.items())
        },
        "max_slope_mb_per_hour": max_slope_mb_per_hour,
        "grew": verdict.grew,
        "undecided": verdict.undecided,
        "exited": list(exited),
        "db_connections_peak": dict(sorted(peak_connections.items())),
        "db_bytes": {
            "first": samples.database_bytes[0][1] if samples.database_bytes else None,
            "last": samples.database_bytes[-1][1] if samples.database_bytes else None,
            "slope_mb_per_hour": round(
                least_squares_slope([(t / 3600, b / 2**20) for t, b in samples.database_bytes]), 2
            ),
        },
        "largest_tables_bytes": dict(sorted(samples.tables.items(), key=lambda kv: -kv[1])[:8]),
        "consumer_lag_peak": dict(sorted(peak_lag.items())),
        "consumer_lag_final": dict(sorted(final_lag.items())),
        "invariants": invariants.as_dict(),
    }


# ---------------------------------------------------------------------------- shell: readings


def read_rss(pid: int) -> int | None:
    """Resident set size of `pid` in bytes (`/proc/PID/status`), None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return None


async def read_database(database_url: str) -> tuple[dict[str, int], int, dict[str, int]]:
    """Connections by application_name, the database's size, and every table's total size."""
    import asyncpg

    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT coalesce(nullif(application_name, ''), '(unnamed)') AS app, count(*) AS n"
            " FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " GROUP BY 1"
        )
        size = await conn.fetchval("SELECT pg_database_size(current_database())")
        tables = await conn.fetch(
            "SELECT relname, pg_total_relation_size(relid) AS bytes FROM pg_catalog.pg_statio_user_tables"
        )
    finally:
        await conn.close()
    return {r["app"]: int(r["n"]) for r in rows}, int(size), {r["relname"]: int(r["bytes"]) for r in tables}


KNOWN_GROUPS = ("escrowd-verification", "escrowd-lifecycle", "escrowd-reputation", "escrowd-panels", "settlement-relayer")
"""The default consumer groups; those named in `consumer_inbox` are read as well."""


async def read_lag(
    bootstrap: str, groups: Sequence[str], stored: Sequence[tuple[str, str, int, int]] = ()
) -> dict[str, int]:
    """Per consumer: the end offsets minus its committed offsets, summed over partitions.

    Group consumers' offsets are fetched per group by name (OffsetFetch, no join): the broker
    may not list groups (Tansu answers ListGroups with a frame aiokafka cannot read). Direct
    consumers (the relayer) keep theirs in `consumer_offsets`: `stored` rows.
    """
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from schemas.topics import all_topics

    lag: dict[str, int] = {}
    probe = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await probe.start()
    try:
        tps = [TopicPartition(t.name, p) for t in all_topics() for p in sorted(probe.partitions_for_topic(t.name) or ())]
        ends = await probe.end_offsets(tps) if tps else {}
    finally:
        await probe.stop()
    for group in groups:
        reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
        await reader.start()
        try:
            behind, seen = 0, False
            for tp in tps:
                committed = await reader.committed(tp)
                if committed is not None:
                    seen = True
                    behind += max(0, ends[tp] - committed)
            if seen:
                lag[group] = behind
        finally:
            await reader.stop()
    for consumer, topic, partition, next_offset in stored:
        end = ends.get(TopicPartition(topic, partition))
        if end is not None:
            lag[consumer] = lag.get(consumer, 0) + max(0, end - next_offset)
    return lag


async def read_offsets(database_url: str) -> tuple[list[str], list[tuple[str, str, int, int]]]:
    """The consumer names the inbox has seen, and the offsets direct consumers keep in PostgreSQL."""
    import asyncpg

    conn = await asyncpg.connect(database_url)
    try:
        names = [r["consumer"] for r in await conn.fetch("SELECT DISTINCT consumer FROM consumer_inbox")]
        rows = await conn.fetch("SELECT consumer, topic, partition, next_offset FROM consumer_offsets")
    finally:
        await conn.close()
    direct = {r["consumer"] for r in rows}
    stored = [(r["consumer"], r["topic"], int(r["partition"]), int(r["next_offset"])) for r in rows]
    return [n for n in names if n not in direct], stored


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0


# ---------------------------------------------------------------------------- shell: the deployment


@dataclass
class Deployment:
    """The processes of one soak and where they listen."""

    processes: dict[str, Any] = field(default_factory=dict)
    ready_urls: dict[str, str] = field(default_factory=dict)
    api_url: str = ""

    def exited(self) -> list[str]:
        return sorted(name for name, proc in self.processes.items() if not proc.running)

    def stop(self) -> None:
        for proc in self.processes.values():
            with contextlib.suppress(Exception):
                proc.terminate(timeout=20)


CONSUMER_GROUPS = ("verification", "lifecycle", "reputation", "panels")
"""The services that are consumer groups: `--members` processes of each."""


def service_specs(devnet: Any, database_url: str, bootstrap: str, workdir: Path, members: int) -> dict[str, tuple[list[str], dict[str, str], int]]:
    """Per process: the `escrowd` arguments, its environment and the port of its `/readyz`."""
    from eth_account import Account

    from escrowd.devnet import anvil_key
    from escrowd.harness import chain_config, write_config
    from runtime.services.ports import free_port
    from schemas.topics import ESCROW_EVENTS

    signer_key = "0x" + secrets.token_hex(32)
    panel_key = anvil_key(8)[1]
    secret = workdir / "panel-secret"
    secret.write_bytes(secrets.token_bytes(32))
    config = write_config(workdir / "indexer.yaml", database_url=database_url, kafka_bootstrap=bootstrap,
                          topic=ESCROW_EVENTS, chains=[chain_config(devnet, poll_interval=0.5)])  # fmt: skip
    chains = json.dumps([{"chain_id": devnet.chain_id, "rpc_urls": [devnet.rpc_url], "escrow_addresses": [devnet.escrow_address],
                          "confirmations": 0, "poll_interval": 0.5, "rpc_timeout": 5.0}])  # fmt: skip
    specs: dict[str, tuple[list[str], dict[str, str], int]] = {}

    def add(name: str, argv: list[str], env: dict[str, str], port_var: str | None = "ESCROWD_METRICS_PORT") -> None:
        port = free_port()
        if port_var:
            env = {**env, port_var: str(port)}
        # Each process's connections carry its name, for pg_stat_activity.
        url = f"{database_url}{'&' if '?' in database_url else '?'}application_name=soak-{name}"
        specs[name] = ([a.replace("{port}", str(port)) for a in argv], {"ESCROWD_DATABASE_URL": url, "ESCROWD_KAFKA_BOOTSTRAP": bootstrap, **env}, port)

    add("indexer", ["index", "run", "--config", str(config)], {})
    add("relayer", ["relay", "run"], {
        "ESCROWD_CHAINS": chains, "ESCROWD_RELAYER_KEY": devnet.marketplace_verifier.private_key,
        "ESCROWD_RELAYER_TRUSTED_SIGNERS": Account.from_key(signer_key).address,
    }, port_var="ESCROWD_RELAYER_PORT")  # fmt: skip
    add("rulings", ["relay", "rulings"], {
        "ESCROWD_RULING_CHAIN_ID": str(devnet.chain_id), "ESCROWD_RULING_RPC_URL": devnet.rpc_url,
        "ESCROWD_RULING_ESCROW": devnet.escrow_address, "ESCROWD_RULING_ARBITER_KEY": devnet.arbiter.private_key,
        "ESCROWD_RULING_TRUSTED_SIGNERS": json.dumps([Account.from_key(panel_key).address]),
    })  # fmt: skip
    for member in range(members):
        add(f"verification-{member}", ["consume", "verification", "run"], {"ESCROWD_VERIFICATION_SIGNING_KEY": signer_key})
        add(f"lifecycle-{member}", ["consume", "lifecycle"], {})
        add(f"reputation-{member}", ["consume", "reputation"], {})
        add(f"panels-{member}", ["consume", "panels"], {"ESCROWD_PANEL_SECRET_FILE": str(secret), "ESCROWD_PANEL_SIGNING_KEY": panel_key})
    add("api", ["api", "serve", "--port", "{port}"], {
        "ESCROWD_DEPLOYMENTS": json.dumps([{"chain_id": devnet.chain_id, "escrow": devnet.escrow_address}]),
        "ESCROWD_MARKETPLACE_VERIFIER_ADDRESS": devnet.marketplace_verifier.address,
    }, port_var=None)  # fmt: skip
    return specs


async def start_deployment(devnet: Any, database_url: str, bootstrap: str, workdir: Path, members: int) -> Deployment:
    """Migrate once, start every process, wait until each answers `/readyz` with 200."""
    from escrowd.harness import EscrowdProcess
    from runtime.db import migrate_url
    from runtime.kafka import ensure_topics
    from schemas.topics import all_topics

    # One migration and the topics up front, so N processes do not race to create them.
    await migrate_url(database_url)
    await ensure_topics(bootstrap, all_topics())
    deployment = Deployment()
    base = {k: v for k, v in os.environ.items() if not k.startswith("ESCROWD_")}
    for name, (argv, env, port) in service_specs(devnet, database_url, bootstrap, workdir, members).items():
        proc = EscrowdProcess(argv, name=name)
        proc.env = {**base, **env}  # the soak's settings only, none of the caller's ESCROWD_*
        deployment.processes[name] = proc.start()
        deployment.ready_urls[name] = f"http://127.0.0.1:{port}/readyz"
    deployment.api_url = deployment.ready_urls["api"].removesuffix("/readyz")
    deadline = time.monotonic() + 240
    for name, url in deployment.ready_urls.items():
        while await asyncio.to_thread(_get, url) != 200:
            proc = deployment.processes[name]
            if not proc.running or time.monotonic() > deadline:
                deployment.stop()
                raise RuntimeError(f"{name} not ready: {proc.output(2000)}")
            await asyncio.sleep(0.5)
    return deployment


# ---------------------------------------------------------------------------- shell: traffic


class TimedOffChain:
    """The API client, noting when each task's `finalize` calls were sent."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.finalized: dict[int, list[float]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    async def finalize(self, agent_key: str, task_id: int, result: Any) -> Any:
        self.finalized.setdefault(task_id, []).append(time.monotonic())
        return await self.client.finalize(agent_key, task_id, result)


def soak_generator(devnet: Any, offchain: TimedOffChain, seed: int) -> Any:
    """The run's traffic generator, timing `finalize` → verdict on chain for the auto paths.

    The panel path needs verifier bots, which a deployment does not run: it is left out.
    """
    from escrowd.harness import rpc
    from escrowd.traffic import TrafficGenerator

    class SoakTraffic(TrafficGenerator):
        def __init__(self) -> None:
            super().__init__(devnet, offchain=offchain, seed=seed)  # type: ignore[arg-type]
            self.auto_tasks: set[int] = set()
            self.sightings: dict[tuple[int, int], float] = {}
            self._from_block = devnet.deploy_block

        @property
        def paths(self) -> tuple[str, ...]:
            return tuple(p for p in super().paths if p != "panel_dispute")

        async def _deliver(self, plan: Any, result: Any) -> None:
            if plan.path.startswith("auto_"):  # judged by the service as soon as finalized
                self.auto_tasks.add(plan.task_id)
            await super()._deliver(plan, result)

        def latencies(self) -> list[float]:
            """Seconds from sending attempt k's `finalize` to first seeing its verdict on chain."""
            found = []
            for (task, attempt), seen in self.sightings.items():
                sent = offchain.finalized.get(task, [])
                if task in self.auto_tasks and 0 < attempt <= len(sent):
                    found.append(seen - sent[attempt - 1])
            return found

        async def watch_verdicts(self, stop: asyncio.Event) -> None:
            """Poll the chain's verdicts every 0.5 s, outside the generator's lock on the devnet."""
            while not stop.is_set():
                with contextlib.suppress(Exception):
                    head = int(await asyncio.to_thread(rpc, devnet.rpc_url, "eth_blockNumber"), 16)
                    if head >= self._from_block:
                        logs = await asyncio.to_thread(rpc, devnet.rpc_url, "eth_getLogs", [
                            {"address": devnet.escrow_address, "fromBlock": hex(self._from_block), "toBlock": hex(head)}])  # fmt: skip
                        now = time.monotonic()
                        for raw in logs:
                            event = devnet._codec.decode_log(raw)
                            if event is not None and event.name == "VerificationCompleted":
                                key = (int(event.args["taskId"]), int(event.args["attempt"]))
                                self.sightings.setdefault(key, now)
                        self._from_block = head + 1
                await wait_event(stop, 0.5)

    return SoakTraffic()


MAX_DEVNET_FILE_BYTES = 8 * 1024 * 1024
"""`--devnet FILE` is read up to this (the CLI files' bound, `docs/security.md`)."""


class DevnetFileError(ValueError):
    """`--devnet FILE` cannot describe the chain the soak would drive (the message says why)."""


_ADDRESS = r"^0x[0-9a-fA-F]{40}$"


class _ActorEntry(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)
    name: str = Field(max_length=64)
    address: str = Field(pattern=_ADDRESS)
    private_key: str = Field(pattern=r"^0x[0-9a-fA-F]{64}$")


class _Actors(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)
    owner: _ActorEntry
    arbiter: _ActorEntry
    marketplace_verifier: _ActorEntry
    fee_recipient: _ActorEntry
    posters: list[_ActorEntry] = Field(min_length=1, max_length=1000)
    agents: list[_ActorEntry] = Field(min_length=1, max_length=1000)
    verifier_agents: list[_ActorEntry] = Field(max_length=1000)
    spare: list[_ActorEntry] = Field(max_length=1000)


class _Contracts(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)
    escrow: str = Field(pattern=_ADDRESS)
    token: str = Field(pattern=_ADDRESS)


class DevnetDescription(BaseModel):
    """`escrowd devnet`'s JSON, strictly (its other keys, `token`, `mnemonic`, `warning`, are
    notes for people)."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)
    rpc_url: str = Field(max_length=2048)
    ws_url: str | None = Field(default=None, max_length=2048)
    chain_id: int = Field(ge=1, le=2**53 - 1)
    deploy_block: int = Field(default=0, ge=0)
    contracts: _Contracts
    actors: _Actors


def read_devnet_file(path: Path) -> dict[str, Any]:
    """`--devnet FILE` checked: bounded JSON (`jsonbounds`), `escrowd devnet`'s shape, and
    every actor's key deriving its address (the soak signs with the key and checks balances
    and events by the address). DevnetFileError naming the problem."""
    from eth_account import Account

    from schemas import jsonbounds

    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_DEVNET_FILE_BYTES + 1)
        data = jsonbounds.loads(raw, max_bytes=MAX_DEVNET_FILE_BYTES)
    except OSError as exc:
        raise DevnetFileError(f"cannot read it: {exc.strerror or type(exc).__name__}") from None
    except jsonbounds.JsonRefused as exc:
        raise DevnetFileError(f"not JSON `escrowd devnet` printed ({exc.code})") from None
    try:
        description = DevnetDescription.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        raise DevnetFileError(f"{where}: {first['msg']} ({exc.error_count()} problem(s))") from None
    actors = description.actors
    for entry in [actors.owner, actors.arbiter, actors.marketplace_verifier, actors.fee_recipient,
                  *actors.posters, *actors.agents, *actors.verifier_agents, *actors.spare]:  # fmt: skip
        if Account.from_key(entry.private_key).address.lower() != entry.address.lower():
            raise DevnetFileError(f"actor {entry.name!r}: its private key is not the key of {entry.address}")
    dumped: dict[str, Any] = description.model_dump()
    return dumped


def check_devnet_chain(devnet: Any) -> None:
    """The chain at the RPC is the file's: its chain id, and contract code at the escrow and
    the token (the soak would otherwise sign and send the file's keys' transactions to
    whatever chain the URL reaches). DevnetFileError naming the difference."""
    try:
        chain_id = int(str(devnet.rpc("eth_chainId")), 16)
        codes = {name: str(devnet.rpc("eth_getCode", address, "latest"))
                 for name, address in (("escrow", devnet.escrow_address), ("token", devnet.token_address))}  # fmt: skip
    except Exception as exc:  # any transport or reply fault: nothing was sent
        raise DevnetFileError(f"the RPC did not answer eth_chainId/eth_getCode ({type(exc).__name__})") from None
    if chain_id != devnet.chain_id:
        raise DevnetFileError(f"chain_id is {devnet.chain_id}, the RPC's chain is {chain_id}")
    for name, code in codes.items():
        if code in ("", "0x", "None"):
            raise DevnetFileError(f"contracts.{name}: no contract at that address on chain {chain_id}")


def attach_devnet(description: Mapping[str, Any], rpc_url: str | None = None) -> Any:
    """A `Devnet` for a chain described by `escrowd devnet`'s JSON (actors, contracts, endpoints)."""
    from web3 import Web3

    from escrowd.devnet import Actor, Devnet

    actors = description["actors"]

    def actor(entry: Mapping[str, str]) -> Actor:
        return Actor(name=entry["name"], address=entry["address"], private_key=entry["private_key"])

    url = rpc_url or description["rpc_url"]
    return Devnet(
        w3=Web3(Web3.HTTPProvider(url, request_kwargs={"timeout": 30})),
        chain_id=int(description["chain_id"]),
        rpc_url=url,
        token_address=description["contracts"]["token"],
        escrow_address=description["contracts"]["escrow"],
        owner=actor(actors["owner"]),
        arbiter=actor(actors["arbiter"]),
        marketplace_verifier=actor(actors["marketplace_verifier"]),
        fee_recipient=actor(actors["fee_recipient"]),
        posters=[actor(a) for a in actors["posters"]],
        agents=[actor(a) for a in actors["agents"]],
        verifier_agents=[actor(a) for a in actors["verifier_agents"]],
        spare=[actor(a) for a in actors["spare"]],
        deploy_block=int(description.get("deploy_block", 0)),
        ws_url=description.get("ws_url"),
    )


# ---------------------------------------------------------------------------- shell: the run


@dataclass(frozen=True)
class SoakOptions:
    """What the command line asked of the soak."""

    minutes: float
    members: int
    sample_seconds: float
    batch: int
    seed: int
    max_slope_mb_per_hour: float


async def sample_loop(
    samples: Samples, stop: asyncio.Event, options: SoakOptions, *, started: float,
    pids: Mapping[str, Any], database_url: str | None, bootstrap: str | None,
) -> None:  # fmt: skip
    """Every `sample_seconds`: RSS per process, database connections and sizes, consumer lag."""
    while not stop.is_set():
        now = time.monotonic() - started
        for name, proc in pids.items():
            rss = read_rss(proc.pid) if proc.pid is not None else None
            if rss is not None:
                samples.rss.setdefault(name, []).append((now, rss))
        if database_url:
            with contextlib.suppress(Exception):
                connections, size, tables = await read_database(database_url)
                samples.connections.append(connections)
                samples.database_bytes.append((now, size))
                samples.tables = tables
        if bootstrap:
            with contextlib.suppress(Exception):
                names, stored = await read_offsets(database_url) if database_url else ([], [])
                groups = (set(KNOWN_GROUPS) | set(names)) - {row[0] for row in stored}
                samples.lag.append(await asyncio.wait_for(read_lag(bootstrap, sorted(groups), stored), 30))
        await wait_event(stop, options.sample_seconds)


async def drive(devnet: Any, api_url: str, options: SoakOptions, samples: Samples, stop_when: float) -> list[PlannedTask]:
    """Batches of tasks through every path until `stop_when` (monotonic); each batch completes."""
    from escrowd.pipeline_parts import ApiClient

    offchain = TimedOffChain(ApiClient(api_url, devnet))
    generator = soak_generator(devnet, offchain, options.seed)
    watch_stop = asyncio.Event()
    watcher = asyncio.create_task(generator.watch_verdicts(watch_stop))
    planned: list[PlannedTask] = []
    try:
        while time.monotonic() < stop_when:
            try:
                planned += await generator.run(generator.plan(options.batch))
            except (TimeoutError, RuntimeError) as exc:
                # A task that never reached its state is the soak's finding, not its crash.
                samples.traffic_errors.append(f"{type(exc).__name__}: {exc}")
                break
        await asyncio.sleep(2.0)  # the watcher's last poll sees the last verdicts
    finally:
        watch_stop.set()
        await watcher
        samples.latencies = generator.latencies()
        await offchain.close()
    return planned


async def check_invariants(devnet: Any, planned: Sequence[PlannedTask]) -> Report:
    """The chain-side invariants of `escrowd.invariants` over every planned task."""
    from escrowd.invariants import ChainEvent, check_run

    logs = await asyncio.to_thread(lambda: list(devnet.logs()))
    statuses = {p.task_id: int((await asyncio.to_thread(devnet.get_task, p.task_id)).status) for p in planned}
    balance = await asyncio.to_thread(devnet.balance_of, devnet.escrow_address)
    return check_run(planned, statuses, [ChainEvent(e.name, e.args) for e in logs], balance)


async def soak_local(options: SoakOptions, database_url: str, bootstrap: str) -> dict[str, Any]:
    """Start the stack and every process, drive and sample, stop everything, summarize."""
    from escrowd.stack import start_stack

    stack = await asyncio.to_thread(start_stack, database_url=database_url, kafka_bootstrap=bootstrap, block_time=1.0)
    deployment: Deployment | None = None
    ok = False
    try:
        with tempfile.TemporaryDirectory(prefix="escrowd-soak-") as workdir:
            deployment = await start_deployment(stack.devnet, stack.postgres.url, stack.kafka.bootstrap, Path(workdir), options.members)
            summary = await _measure(options, stack.devnet, deployment.api_url, deployment, stack.postgres.url, stack.kafka.bootstrap)
            ok = bool(summary["ok"])
            return summary
    finally:
        if deployment is not None:
            await asyncio.to_thread(deployment.stop)
            for name, proc in deployment.processes.items():
                if ok:
                    with contextlib.suppress(OSError):
                        proc.log_path.unlink()
                else:  # a failed soak keeps every process's log for the post-mortem
                    sys.stderr.write(f"escrowd soak: {name} log {proc.log_path}\n")
        await asyncio.to_thread(stack.stop)


async def _measure(
    options: SoakOptions, devnet: Any, api_url: str, deployment: Deployment | None,
    database_url: str | None, bootstrap: str | None,
) -> dict[str, Any]:  # fmt: skip
    samples = Samples()
    stop = asyncio.Event()
    started = time.monotonic()
    pids = deployment.processes if deployment is not None else {}
    sampler = asyncio.create_task(
        sample_loop(samples, stop, options, started=started, pids=pids, database_url=database_url, bootstrap=bootstrap)
    )
    try:
        planned = await drive(devnet, api_url, options, samples, started + options.minutes * 60)
    finally:
        stop.set()
        await sampler
    elapsed = time.monotonic() - started
    report = await check_invariants(devnet, planned)
    report.add("every batch of traffic completed", not samples.traffic_errors, "; ".join(samples.traffic_errors))
    exited = deployment.exited() if deployment is not None else []
    if deployment is not None:
        report.add("no service process exited", not exited, ", ".join(exited))
    return summarize(samples, minutes=options.minutes, members=options.members, elapsed_seconds=elapsed,
                     tasks=len(planned), invariants=report, exited=exited,
                     max_slope_mb_per_hour=options.max_slope_mb_per_hour)  # fmt: skip


def soak(
    minutes: float = typer.Option(10.0, "--minutes", help="How long the traffic runs"),
    members: int = typer.Option(1, "--members", min=1, max=4, help="Processes per consumer group"),
    sample_seconds: float = typer.Option(10.0, help="Seconds between samples"),
    batch: int = typer.Option(12, help="Tasks per batch of traffic"),
    seed: int = typer.Option(1, help="Seed of the traffic generator"),
    max_slope: float = typer.Option(DEFAULT_MAX_SLOPE_MB_PER_HOUR, "--max-slope-mb-per-hour", help="RSS growth that fails the soak"),
    api: str | None = typer.Option(None, "--api", help="A running deployment's API (with --rpc and --devnet: start nothing)"),
    rpc_url: str | None = typer.Option(None, "--rpc", help="The running deployment's chain RPC"),
    devnet_file: Path | None = typer.Option(None, "--devnet", help="`escrowd devnet`'s JSON: contracts and actors"),
    database_url: str | None = typer.Option(None, envvar="DATABASE_URL", help="PostgreSQL (local: a fresh database on it; else embedded)"),
    kafka_bootstrap: str | None = typer.Option(None, envvar="KAFKA_BOOTSTRAP", help="Kafka broker (local: used as is; else Tansu)"),
) -> None:
    """Every service as its own process under steady traffic; JSON summary, exit 1 on growth or a broken invariant."""
    from runtime.logging import configure_logging

    configure_logging(json=False, level=os.environ.get("ESCROWD_LOG_LEVEL", "WARNING"))
    options = SoakOptions(minutes=minutes, members=members, sample_seconds=sample_seconds, batch=batch, seed=seed,
                          max_slope_mb_per_hour=max_slope)  # fmt: skip
    if api is not None:
        if devnet_file is None:
            raise typer.BadParameter("--api needs --devnet (the deployment's contracts and actors)")
        try:
            devnet = attach_devnet(read_devnet_file(devnet_file), rpc_url)
            check_devnet_chain(devnet)
        except DevnetFileError as exc:
            # An operator's file: exit 2 naming it and the problem, before any transaction.
            sys.stderr.write(f"escrowd soak: --devnet {devnet_file}: {exc}\n")
            raise typer.Exit(2) from None
        work = _measure(options, devnet, api.rstrip("/"), None, database_url, kafka_bootstrap)
    else:
        work = soak_local(options, database_url or "", kafka_bootstrap or "")
    summary = asyncio.run(_until_signalled(work))
    if summary is None:
        raise typer.Exit(143)
    sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    raise typer.Exit(0 if summary["ok"] else 1)


async def _until_signalled(work: Any) -> dict[str, Any] | None:
    """Run `work`; SIGINT or SIGTERM cancel it, so every process and service it started is stopped."""
    import signal

    task = asyncio.ensure_future(work)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    try:
        result: dict[str, Any] = await task
        return result
    except asyncio.CancelledError:
        return None
