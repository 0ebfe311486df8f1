"""The judging stage through the real process: `escrowd consume verification run` as a child.

Escrow events and service-signed finalizes go to the broker as the indexer and the API
publish them (`escrowd.verification_load.Feed`); every task's terms name a local endpoint
verifier (`LatencyVerifier`) whose calls the test can hold. Assertions are on order and
outcome, never on wall-clock time.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import time
from collections.abc import Awaitable

from aiohttp import ClientSession

from escrowd.verification_load import CHAIN_ID, ESCROW, Feed, LatencyVerifier, VerificationProcess
from runtime.db import connect
from runtime.retention import Pruner, RetentionConfig
from verification.judging_stage import JudgingLimits, JudgingPool
from verification.verifiers import default_registry

from .conftest import (
    EVENTS,
    REQUESTS,
    VERDICTS,
    Api,
    IndexedChain,
    Who,
    drain,
    finalized_task,
    make_handler,
    until,
)


async def _verdicts(feed: Feed) -> dict[tuple[int, int], bool]:
    return {(int(r["task_id"]), r["attempt"]): r["passed"] for r in await feed.results()}


async def test_a_slow_verifier_does_not_delay_other_tasks(
    feed: Feed, verifier: LatencyVerifier
) -> None:
    """Tasks judged by a held verifier, queued first on the one partition, hold up no other task's
    verdict; that verifier gets at most its per-verifier limit of judgements at once."""
    verifier.hold("slow")
    process = VerificationProcess(feed.env(ESCROWD_JUDGING_PER_VERIFIER="2")).start()
    try:
        slow, fast = [1, 2, 3], [4, 5, 6, 7, 8]
        for task in slow:
            await feed.task(task, verifier.url("slow"))
        for task in fast:
            await feed.task(task, verifier.url("fast"))
        for task in slow + fast:
            await feed.submit(task, 1, passed=True)

        async def fast_judged() -> bool:
            verdicts = await _verdicts(feed)
            return all((t, 1) in verdicts for t in fast)

        await until(fast_judged, "the fast tasks' verdicts", process)
        # Still held: no slow verdict yet, and only two of its three judgements were started.
        verdicts = await _verdicts(feed)
        assert not any((t, 1) in verdicts for t in slow)
        assert sorted(t for name, t, _ in verifier.started if name == "slow") in (
            [1, 2],
            [1, 3],
            [2, 3],
        )
        assert len([s for s in verifier.started if s[0] == "slow"]) == 2

        verifier.release("slow")

        async def all_judged() -> bool:
            return len(await _verdicts(feed)) == len(slow) + len(fast)

        await until(all_judged, "every verdict", process)
        assert [c.task for c in verifier.calls if c.path == "slow"] and len(verifier.calls) == 8
        assert process.terminate() == 0
    finally:
        process.cleanup()


async def test_kill_9_during_a_judgement_judges_once_and_never_a_superseded_attempt(
    feed: Feed, verifier: LatencyVerifier
) -> None:
    """kill -9 while two judgements are in flight. Task 1's is claimed again once its lease
    expires and recorded once; task 2's attempt is superseded meanwhile (judged on chain, a
    second attempt submitted): its old claim yields no verdict, the new attempt one."""
    env = feed.env(ESCROWD_JUDGING_LEASE_SECONDS="2")
    verifier.hold("one")
    verifier.hold("two")
    first = VerificationProcess(env).start()
    second = VerificationProcess(env)
    try:
        await feed.task(1, verifier.url("one"))
        await feed.task(2, verifier.url("two"))
        await feed.submit(1, 1, passed=True)
        await feed.submit(2, 1, passed=True)

        async def in_flight() -> bool:
            return {(n, t) for n, t, _ in verifier.started} == {("one", 1), ("two", 2)}

        await until(in_flight, "both judgements in flight", first)
        # Task 2's attempt 1 is judged on chain and attempt 2 submitted while its judge still
        # waits: the consumer takes that in (it judges nothing itself) and queues attempt 2.
        await feed.judged_on_chain(2, 1, passed=False)
        await feed.submit(2, 2, passed=True)

        async def second_attempt_queued() -> bool:
            assert feed.conn is not None
            return bool(
                await feed.conn.fetchval(
                    "SELECT count(*) FROM verification_jobs WHERE task_id = 2 AND attempt = 2"
                )
            )

        await until(second_attempt_queued, "task 2's second attempt queued", first)
        first.kill9()
        verifier.release("one")
        verifier.release("two")
        second.start()

        async def settled() -> bool:
            verdicts = await _verdicts(feed)
            return (1, 1) in verdicts and (2, 2) in verdicts

        await until(settled, "task 1's verdict and task 2's second attempt judged", second)
        assert feed.conn is not None

        async def jobs_closed() -> bool:
            assert feed.conn is not None
            return not await feed.conn.fetchval(
                "SELECT count(*) FROM verification_jobs WHERE state IN ('queued', 'judging')"
            )

        await until(jobs_closed, "every job closed", second)
        assert await _verdicts(feed) == {
            (1, 1): True,
            (2, 2): True,
        }  # nothing for the superseded attempt
        verdict_rows = await feed.conn.fetch(
            "SELECT key FROM outbox WHERE topic = $1 ORDER BY seq", feed.verdicts
        )
        assert len(verdict_rows) == 2  # one signed verdict each, never a second
        jobs = {
            (int(r["task_id"]), r["attempt"]): (r["state"], r["claims"], r["expiries"])
            for r in await feed.conn.fetch(
                "SELECT task_id, attempt, state, claims, expiries FROM verification_jobs"
                " WHERE chain_id = $1 AND escrow_address = $2", CHAIN_ID, ESCROW,
            )
        }  # fmt: skip
        assert jobs == {(1, 1): ("done", 2, 1), (2, 1): ("dropped", 2, 1), (2, 2): ("done", 1, 0)}
        # Task 1 was judged again in full; task 2's first attempt never again, its second once.
        assert [s for s in verifier.started if s[0] == "one"] == [("one", 1, 1), ("one", 1, 1)]
        assert [s for s in verifier.started if s[0] == "two"] == [("two", 2, 1), ("two", 2, 2)]
        assert second.terminate() == 0
    finally:
        first.cleanup()
        second.cleanup()


async def test_sigterm_finishes_the_judgement_in_flight_and_a_cut_drain_hands_its_lease_back(
    feed: Feed, verifier: LatencyVerifier
) -> None:
    """SIGTERM: no more claims, the judgement in flight commits, exit 0. A second signal cuts the
    drain short: the lease is handed back (queued again, not left to expire), no verdict, exit
    143; the next process judges it."""
    verifier.hold("held")
    await feed.task(1, verifier.url("held"))
    await feed.task(2, verifier.url("held"))
    process = VerificationProcess(feed.env()).start()
    try:
        await feed.submit(1, 1, passed=True)

        async def started(count: int) -> bool:
            return len(verifier.started) >= count

        await until(lambda: started(1), "task 1's judgement in flight", process)
        assert process._proc is not None
        process._proc.send_signal(signal.SIGTERM)
        await until(lambda: _logged(process, "service_stopping"), "the drain begun", process)
        verifier.release("held")
        assert await asyncio.to_thread(process._proc.wait, 60) == 0, process.output()
        assert await _verdicts(feed) == {(1, 1): True}

        verifier.hold("held")
        process.start()
        await feed.submit(2, 1, passed=True)
        await until(lambda: started(2), "task 2's judgement in flight", process)
        process._proc.send_signal(signal.SIGTERM)
        await until(
            lambda: _logged(process, "service_stopping", 2), "the second drain begun", process
        )
        process._proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(process._proc.wait, 60) == 143, process.output()
        assert feed.conn is not None
        job = await feed.conn.fetchrow(
            "SELECT state, claim_token, claims FROM verification_jobs WHERE task_id = 2"
        )
        assert job is not None and (job["state"], job["claim_token"], job["claims"]) == (
            "queued",
            None,
            1,
        )
        assert await _verdicts(feed) == {(1, 1): True}

        verifier.release("held")
        process.start()

        async def judged() -> bool:
            return (2, 1) in await _verdicts(feed)

        await until(judged, "task 2 judged by the next process", process)
        expiries = await feed.conn.fetchval(
            "SELECT expiries FROM verification_jobs WHERE task_id = 2"
        )
        assert (
            expiries == 0
        )  # claimed again because it was handed back, not because a lease ran out
        assert process.terminate() == 0
    finally:
        process.cleanup()


async def _logged(process: VerificationProcess, event: str, times: int = 1) -> bool:
    return process.output(tail=10**7).count(f'"{event}"') >= times


async def test_a_judge_whose_lease_was_taken_over_commits_nothing(
    api: Api, chain: IndexedChain, who: dict[str, Who], database_url: str
) -> None:
    """A judge stalls past its lease (`run_once` renews none); a second claims the job, judges
    and commits. When the first one's judgement returns, its claim token no longer holds the
    job: no second verdict, no second outbox row."""
    from tests.verification.plugins import gate

    gate.calls.clear()
    gate.gate.clear()
    await finalized_task(api, chain, who, 5, "tests.verification.plugins.gate:score")
    handler = make_handler(
        registry=default_registry(allowed_plugin_packages=["tests.verification.plugins"])
    )
    await drain(database_url, handler, judge=False)  # queued, not judged
    conn = await connect(database_url)
    try:
        stalled = asyncio.create_task(
            JudgingPool(database_url, handler, JudgingLimits(lease_seconds=0.2)).run_once()
        )

        async def lease_expired() -> bool:
            return bool(gate.calls) and bool(
                await conn.fetchval(
                    "SELECT count(*) FROM verification_jobs WHERE task_id = 5 AND lease_until < now()"
                )
            )

        deadline = time.monotonic() + 60
        while not await lease_expired():
            assert time.monotonic() < deadline, "the first judge never stalled past its lease"
            await asyncio.sleep(0.05)
        assert (
            await JudgingPool(database_url, handler).run_once() == 1
        )  # took the job over, committed
        gate.gate.set()
        assert await asyncio.wait_for(stalled, 60) == 0  # its late outcome is dropped
        assert len(gate.calls) == 2
        assert (
            await conn.fetchval("SELECT count(*) FROM verification_results WHERE task_id = 5") == 1
        )
        assert await conn.fetchval("SELECT count(*) FROM outbox WHERE topic = $1", VERDICTS) == 1
        job = await conn.fetchrow(
            "SELECT state, claims, expiries, outcome FROM verification_jobs WHERE task_id = 5"
        )
        assert job is not None and tuple(job) == ("done", 2, 1, "Judged")
    finally:
        await conn.close()


async def test_a_pruned_job_whose_finalize_is_redelivered_is_not_judged_again(
    api: Api, chain: IndexedChain, who: dict[str, Who], database_url: str
) -> None:
    """The pruner deletes a closed job; the task's messages delivered again are duplicates by
    their inbox rows, and with the inbox rows gone too (the floor's job, lost here on purpose)
    the request and verdict rows still say the attempt is judged: no job, no judgement, no
    second verdict."""
    from tests.verification.plugins import scoring

    scoring.CALLS.clear()
    await finalized_task(api, chain, who, 7, "tests.verification.plugins.scoring:score_arithmetic")
    handler = make_handler()
    await drain(database_url, handler)
    conn = await connect(database_url)
    try:
        assert (
            await conn.fetchval("SELECT state FROM verification_jobs WHERE task_id = 7") == "done"
        )
        config = RetentionConfig(jobs_keep_hours=0, broker_retention_hours=1000)
        await conn.execute("UPDATE verification_jobs SET updated_at = now() - interval '1 second'")
        result = await Pruner(database_url, config).cycle(conn)
        assert result.deleted["verification_jobs"] == 1
        assert result.deleted["consumer_inbox"] == 0
        assert await conn.fetchval("SELECT count(*) FROM verification_jobs") == 0

        topics = [EVENTS, REQUESTS]
        await conn.execute(
            "UPDATE outbox SET published_at = NULL WHERE topic = ANY($1::text[])", topics
        )
        assert set(await drain(database_url, handler)) == {"duplicate"}

        await conn.execute("DELETE FROM consumer_inbox")
        await conn.execute("DELETE FROM consumer_inbox_floors")
        await conn.execute(
            "UPDATE outbox SET published_at = NULL WHERE topic = ANY($1::text[])", topics
        )
        assert set(await drain(database_url, handler)) == {"processed"}
        assert await conn.fetchval("SELECT count(*) FROM verification_jobs") == 0
        assert len(scoring.CALLS) == 1
        assert (
            await conn.fetchval("SELECT count(*) FROM verification_results WHERE task_id = 7") == 1
        )
        assert await conn.fetchval("SELECT count(*) FROM outbox WHERE topic = $1", VERDICTS) == 1
    finally:
        await conn.close()


async def test_a_judge_that_raises_is_retried_with_a_bound_then_parked_as_failed_never_scored(
    feed: Feed, verifier: LatencyVerifier
) -> None:
    """The commit of task 1's verdict raises (a trigger refuses it: an error on our side, not
    the verifier's). The job is tried `judging_max_errors` times with a backoff between, then
    parked as `failed`: no verdict, no zero, no FAIL, the request's last_error says whose fault,
    the failed-jobs gauge shows it; task 2 on the same verifier is judged meanwhile. Queued
    again after the cause is gone, it is judged once."""
    assert feed.conn is not None
    await feed.conn.execute(
        "CREATE FUNCTION refuse_task_1() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        " IF NEW.task_id = 1 THEN RAISE EXCEPTION 'refused for the test'; END IF; RETURN NEW; END $$"
    )
    await feed.conn.execute(
        "CREATE TRIGGER refuse_task_1 BEFORE INSERT ON verification_results FOR EACH ROW EXECUTE FUNCTION refuse_task_1()"
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = feed.env(
        ESCROWD_JUDGING_MAX_ERRORS="3", ESCROWD_JUDGING_ERROR_BACKOFF_SECONDS="0.2", ESCROWD_METRICS_PORT=str(port),
    )  # fmt: skip
    process = VerificationProcess(env).start()
    try:
        await feed.task(1, verifier.url("v"))
        await feed.task(2, verifier.url("v"))
        await feed.submit(1, 1, passed=True)
        await feed.submit(2, 1, passed=True)

        async def parked() -> bool:
            assert feed.conn is not None
            state = await feed.conn.fetchval(
                "SELECT state FROM verification_jobs WHERE task_id = 1"
            )
            return bool(state == "failed")

        await until(parked, "task 1's job parked as failed", process)
        job = await feed.conn.fetchrow(
            "SELECT errors, claims, expiries, outcome FROM verification_jobs WHERE task_id = 1"
        )
        assert job is not None and (job["errors"], job["claims"], job["expiries"]) == (3, 3, 0)
        assert "refused for the test" in job["outcome"]
        assert [c.task for c in verifier.calls].count(1) == 3  # bounded: three tries, then no more
        request = await feed.conn.fetchrow(
            "SELECT state, last_error FROM verification_requests WHERE task_id = 1"
        )
        assert request is not None and request["state"] != "applied"
        assert request["last_error"].startswith("judging failed on our side")
        assert await _verdicts(feed) == {(2, 1): True}  # nothing at all for task 1, task 2 judged

        async def gauge() -> str | None:
            with contextlib.suppress(OSError):
                async with (
                    ClientSession() as session,
                    session.get(f"http://127.0.0.1:{port}/metrics") as reply,
                ):
                    text = await reply.text()
                    return text if "escrowd_verification_jobs_failed 1.0" in text else None
            return None

        await until(lambda: _truthy(gauge()), "the failed-jobs gauge at 1", process)
        text = await gauge() or ""
        assert 'escrowd_verification_jobs_total{outcome="errored"} 2.0' in text
        assert 'escrowd_verification_jobs_total{outcome="failed"} 1.0' in text

        # The operator's fix (docs/operations.md): remove the cause, queue the failed jobs again.
        await feed.conn.execute("DROP TRIGGER refuse_task_1 ON verification_results")
        await feed.conn.execute(
            "UPDATE verification_jobs SET state = 'queued', errors = 0, not_before = NULL WHERE state = 'failed'"
        )

        async def judged() -> bool:
            return (1, 1) in await _verdicts(feed)

        await until(judged, "task 1 judged once queued again", process)
        assert await _verdicts(feed) == {(1, 1): True, (2, 1): True}
        assert process.terminate() == 0
    finally:
        process.cleanup()


async def _truthy(value: Awaitable[object]) -> bool:
    return bool(await value)
