"""`escrowd run`: the whole pipeline on one machine, with traffic and a live progress view.

`escrowd run --tasks N --exit` plays N tasks through every path, waits for the pipeline
to settle, checks the run's invariants against the chain and prints a JSON summary; the
exit code is 0 only if every invariant held.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import sys
import time
from dataclasses import dataclass
from types import FrameType
from typing import Any

import structlog
import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from chain.signers import SIGNER_KINDS
from escrowd.invariants import ChainEvent, PlannedTask, Report, check_run, lost_nonces_check
from runtime.errors import redact_url
from runtime.logging import configure_logging
from runtime.services.ports import free_port
from schemas.task_state import TaskStatus

log = structlog.get_logger(__name__)

STATUS_NAMES = {status.value: status.name.title() for status in TaskStatus}


def run(
    tasks: int = typer.Option(0, "--tasks", "-n", help="Tasks to drive (0: keep generating until interrupted)"),
    exit_when_done: bool = typer.Option(False, "--exit", help="Check invariants, print JSON and exit"),
    seed: int = typer.Option(1, help="Seed of the traffic generator"),
    batch: int = typer.Option(20, help="Tasks per batch when generating continuously"),
    api_port: int = typer.Option(0, help="API port (0: a free port)"),
    metrics_port: int = typer.Option(0, help="Prometheus port (0: a free port)"),
    progress: bool = typer.Option(True, help="Live progress display"),
    database_url: str | None = typer.Option(None, envvar="ESCROWD_DATABASE_URL", help="PostgreSQL server (a fresh database is created on it; else embedded)"),
    kafka_bootstrap: str | None = typer.Option(None, envvar="ESCROWD_KAFKA_BOOTSTRAP", help="Kafka broker (else Tansu)"),
    signer: str = typer.Option(
        "keystore", "--signer",
        help="Who holds the relayer, verification and hosted verifier agent keys: keystore (in process), aws-kms (a local KMS process), remote (local JSON-RPC signers)",
    ),
) -> None:
    """Run the indexer, every consumer, the relayer and the API on embedded services, with traffic."""
    from escrowd.stack import start_stack

    if signer not in SIGNER_KINDS:
        raise typer.BadParameter(f"--signer must be one of {', '.join(SIGNER_KINDS)}")
    configure_logging(json=False, level=os.environ.get("ESCROWD_LOG_LEVEL", "WARNING"))
    console = Console(stderr=True)
    # SIGINT and SIGTERM both stop everything in order and exit 128 + signal number. Outside
    # the event loop they raise `Interrupted`; inside it they cancel the main task, whose
    # clean-up stops the pipeline.
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    code = 1
    stack = None
    try:
        console.print("[bold]escrowd run[/]: starting PostgreSQL, Kafka and anvil…")
        # "" rather than None: `escrowd run` reads ESCROWD_* only, not the test harness's
        # DATABASE_URL / KAFKA_BOOTSTRAP fallback of the service launchers.
        stack = start_stack(database_url=database_url or "", kafka_bootstrap=kafka_bootstrap or "")
        options = RunOptions(console=console, tasks=tasks, exit_when_done=exit_when_done, seed=seed, batch=batch,
                             api_port=api_port or free_port(), metrics_port=metrics_port or free_port(),
                             progress=progress, signer=signer)  # fmt: skip
        code = asyncio.run(_main(stack, options))
    except Interrupted as stop:
        code = 128 + stop.signum
    finally:
        # A second signal must not cut the clean-up short and leave services behind.
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        if stack is not None:
            stack.stop()
        console.print(f"[bold]escrowd run[/]: stopped (exit {code})")
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    raise typer.Exit(code)


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived; `signum` says which (exit code 128 + signum)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signum)


@dataclass(frozen=True)
class RunOptions:
    """What the command line asked of the run."""

    console: Console
    tasks: int
    exit_when_done: bool
    seed: int
    batch: int
    api_port: int
    metrics_port: int
    progress: bool
    signer: str


async def _main(stack: Any, options: RunOptions) -> int:
    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()
    assert main_task is not None
    received: list[int] = []

    def on_signal(signum: int) -> None:
        if not received:
            received.append(signum)
            main_task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        return await _pipeline_main(stack, options)
    except asyncio.CancelledError:
        if not received:
            raise
        return 128 + received[0]
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
            signal.signal(sig, _interrupt)


async def _pipeline_main(stack: Any, options: RunOptions) -> int:
    from escrowd.pipeline import Pipeline, PipelineConfig
    from escrowd.pipeline_parts import LocalSigner
    from escrowd.traffic import TrafficGenerator

    console, tasks, api_port, metrics_port = options.console, options.tasks, options.api_port, options.metrics_port

    dn = stack.devnet
    signer = options.signer
    verification_key = "0x" + secrets.token_hex(32)
    keys = {
        "relayer": dn.marketplace_verifier.private_key, "verification": verification_key,
        "verifier-agent": dn.spare[-1].private_key,  # the hosted verifier agent's wallet
    }  # fmt: skip
    local_signer = LocalSigner(signer, keys)
    pipeline = Pipeline(
        PipelineConfig(
            database_url=stack.postgres.url,
            kafka_bootstrap=stack.kafka.bootstrap,
            devnet=dn,
            api_port=api_port,
            metrics_port=metrics_port,
            relayer_signer=local_signer.specs.get("relayer"),
            verification_key=verification_key,
            verification_signer=local_signer.specs.get("verification"),
        )
    )
    display: asyncio.Task[None] | None = None
    hosted: Any = None
    try:
        await pipeline.start()
        for role, url in local_signer.urls.items():
            console.print(f"  signer     {signer} at {url} (holds the {role} key)")
        console.print(
            f"  chain      {dn.rpc_url} (chain id {dn.chain_id}), escrow {dn.escrow_address}\n"
            f"  API        http://127.0.0.1:{api_port}  (OpenAPI: /docs)\n"
            f"  bridge     http://127.0.0.1:{api_port}/health/bridge\n"
            f"  metrics    http://127.0.0.1:{metrics_port}/metrics\n"
            f"  Kafka      {stack.kafka.bootstrap}    PostgreSQL {redact_url(stack.postgres.url)}"
        )
        from escrowd import pipeline_parts

        offchain = pipeline_parts.offchain_client(api_port, dn)
        from verification.agents.verifier_agent import LocalHostedVerifier

        # A hosted verifier (`escrowd verifier-agent`'s loop) with the deterministic local model
        # serves the agent-review tasks posted through the API.
        hosted_actor = dn.spare[-1]
        hosted = await LocalHostedVerifier.start(
            api_url=f"http://127.0.0.1:{api_port}", rpc_url=dn.rpc_url, chain_id=dn.chain_id,
            escrow_address=dn.escrow_address, wallet_key=hosted_actor.private_key,
            database_url=pipeline.config.database_url, wallet_signer=local_signer.specs.get("verifier-agent"),
        )  # fmt: skip
        console.print(f"  verifier   {hosted_actor.address} (hosted verifier agent, local model {hosted.model_url})")
        generator = TrafficGenerator(dn, offchain=offchain, seed=options.seed, hosted_verifier=hosted_actor)
        started = time.monotonic()
        planned: list[PlannedTask] = []
        display = asyncio.create_task(_display(pipeline, generator, console, options.progress))
        console.print("[bold]escrowd run[/]: ready")
        if tasks > 0:
            planned = await generator.run(generator.plan(tasks))
        if options.exit_when_done:
            report, summary = await _settle_and_check(pipeline, dn, planned, generator, started)
            display.cancel()
            print(json.dumps(summary, indent=2))
            return 0 if report.ok else 1
        while True:
            if tasks == 0:
                planned += await generator.run(generator.plan(options.batch))
            else:
                await asyncio.sleep(3600)
            if pipeline.failed():
                console.print(f"[red]components failed: {pipeline.failed()}[/]")
                return 1
    finally:
        if display is not None:
            display.cancel()
            with contextlib.suppress(BaseException):
                await display
        if hosted is not None:
            with contextlib.suppress(Exception):
                await hosted.stop()
        await pipeline.stop()
        local_signer.stop()


async def _settle_and_check(
    pipeline: Any, dn: Any, planned: list[PlannedTask], generator: Any, started: float
) -> tuple[Report, dict[str, Any]]:
    from escrowd import pipeline_parts

    head = await asyncio.to_thread(dn.block_number)
    await pipeline.wait_indexed(head, timeout=120)
    await pipeline_parts.settle(pipeline)
    chain_logs = await asyncio.to_thread(lambda: list(dn.logs()))
    events = [ChainEvent(e.name, e.args) for e in chain_logs]
    statuses = {}
    for task in planned:
        view = await asyncio.to_thread(dn.get_task, task.task_id)
        statuses[task.task_id] = int(view.status)
    balance = await asyncio.to_thread(dn.balance_of, dn.escrow_address)
    report = check_run(planned, statuses, events, balance)
    indexed = await pipeline.indexed_event_ids()
    on_chain = {(e.block_number, e.log_index) for e in chain_logs}
    report.add(
        "indexer holds exactly the chain's events",
        indexed == on_chain,
        f"missing {len(on_chain - indexed)}, extra {len(indexed - on_chain)}",
    )
    for name, ok, detail in await pipeline_parts.checks(pipeline, planned, events):
        report.add(name, ok, detail)
    lost = await pipeline_parts.lost_nonces(pipeline, dn)
    ok, detail = lost_nonces_check(lost)
    report.add("senders: every nonce judged lost was taken by a transaction not ours", ok,
               detail or f"{len(lost)} lost, each taken by another transaction of the key")
    failed = pipeline.failed()
    report.add("no pipeline component crashed", not failed, ", ".join(failed))
    snapshot = await pipeline.snapshot()
    summary = {
        "tasks": len(planned),
        "paths": generator.stats.by_path,
        "elapsed_seconds": round(time.monotonic() - started, 2),
        "events_indexed": snapshot["events"],
        "verdicts_on_chain": snapshot["verdicts"],
        "verdicts_relayed": snapshot["verdicts_relayed"],
        "final_statuses": {
            STATUS_NAMES[s]: n for s, n in sorted(_count(statuses.values()).items())
        },
        "invariants": report.as_dict(),
    }
    return report, summary


def _count(values: Any) -> dict[int, int]:
    counts: dict[int, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return counts


async def _display(pipeline: Any, generator: Any, console: Console, enabled: bool) -> None:
    if not enabled or not console.is_terminal:
        return
    with Live(console=console, refresh_per_second=4, transient=False) as live:
        while True:
            with contextlib.suppress(Exception):
                live.update(_render(await pipeline.snapshot(), generator.stats))
            await asyncio.sleep(0.5)


def _render(snapshot: dict[str, Any], stats: Any) -> Table:
    table = Table(title="escrowd pipeline", show_header=True)
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("tasks planned / posted / finished", f"{stats.planned} / {stats.posted} / {stats.finished}")
    for status, n in snapshot["tasks_by_status"].items():
        table.add_row(f"  tasks {STATUS_NAMES.get(status, status)}", str(n))
    table.add_row("events indexed", str(snapshot["events"]))
    table.add_row("verdicts on chain / relayed by us", f"{snapshot['verdicts']} / {snapshot['verdicts_relayed']}")
    table.add_row("indexed block / lag", f"{snapshot['indexed_block']} / {snapshot['lag']}")
    table.add_row("outbox pending", str(snapshot["outbox_pending"]))
    return table


if __name__ == "__main__":  # pragma: no cover
    sys.exit(typer.run(run))  # type: ignore[func-returns-value]
