"""`/health/bridge` on a real `escrowd api serve` against `bridge_health` rows that lie by
their shape or their clock: a row stamped in the future (the database's clock stepped back,
or a writer's), a row whose `stale_after_seconds` is infinite, a row of megabytes and a row
that is not a report. Each must read as failing; none may hold the API's answer at ok.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import asyncpg

from relayer.settlement.health import MAX_REPORT_BYTES, ChainHealth
from tests.support.processes import ServiceProcess, api_process, get

CHAIN = 31337
RELAYER = "0x" + "11" * 20
ESCROW = "0x" + "22" * 20


def _report(**indexer: Any) -> str:
    """A report the relayer would write for a healthy chain."""
    return ChainHealth.model_validate({
        "chainId": CHAIN, "rpc": {"reachable": True, "head": 5},
        "indexer": {"cursorBlock": 5, "lagBlocks": 0, "live": True, **indexer},
        "relayer": {"address": RELAYER, "sending": True},
        "verifier": {"escrow": ESCROW, "relayerAddress": RELAYER, "verifierMatches": True},
    }).model_dump_json(by_alias=True)  # fmt: skip


def _write(database_url: str, report: str, *, checked_at: str = "now()", stale_after: str = "15") -> None:
    async def write() -> None:
        conn = await asyncpg.connect(database_url)
        try:
            await conn.execute(
                "INSERT INTO bridge_health (chain_id, relayer_address, report, checked_at, stale_after_seconds)"
                f" VALUES ($1, $2, $3::text::jsonb, {checked_at}, {stale_after}::float8) ON CONFLICT (chain_id) DO UPDATE"
                " SET report = EXCLUDED.report, checked_at = EXCLUDED.checked_at,"
                " stale_after_seconds = EXCLUDED.stale_after_seconds",
                CHAIN, RELAYER, report,
            )  # fmt: skip
        finally:
            await conn.close()

    asyncio.run(write())


def _body(api: ServiceProcess) -> tuple[int, dict[str, Any]]:
    status, raw = get(api.url + "/health/bridge")
    assert status in (200, 503), raw[:300]
    assert len(raw) <= 2 * MAX_REPORT_BYTES, f"the API served {len(raw)} bytes"
    return status, dict(json.loads(raw))


def _until(api: ServiceProcess, check: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
    """The first answer that passes `check` (the API reads the table at most once a second)."""
    deadline = time.monotonic() + 30
    while True:
        _, body = _body(api)
        if check(body):
            return body
        assert api.alive(), api.log()[-3000:]
        assert time.monotonic() < deadline, f"never {what}; last answer: {json.dumps(body)[:600]}"
        time.sleep(0.2)


def test_rows_that_lie_by_clock_or_shape_read_as_failing(database_url: str) -> None:
    bridge_chains = json.dumps([{"chain_id": CHAIN, "rpc_urls": ["http://127.0.0.1:9"], "escrow_addresses": [ESCROW]}])
    with api_process(database_url, bridge_chains=bridge_chains) as api:
        # The control: a fresh, honest row is ok (so each failing below is the row's doing).
        _write(database_url, _report())
        _until(api, lambda b: b.get("status") == "ok", "ok for an honest row")

        # Stamped an hour ahead: its age read as 0 s, fresh for an hour after the relayer died.
        _write(database_url, _report(), checked_at="now() + interval '1 hour'")
        body = _until(api, lambda b: b.get("status") == "failing", "failing for a row from the future")
        assert body["chains"][0]["stale"] is True
        assert "future" in body["chains"][0]["relayer"]["pausedReason"]

        _write(database_url, _report())
        _until(api, lambda b: b.get("status") == "ok", "ok again")

        # Two hours old, but "stale after infinity": never stale, ok forever.
        _write(database_url, _report(), checked_at="now() - interval '2 hours'", stale_after="'Infinity'")
        body = _until(api, lambda b: b.get("status") == "failing", "failing for an old row with no staleness bound")
        assert body["chains"][0]["stale"] is True

        # Megabytes of report: refused by size, not parsed and served back once a second.
        _write(database_url, _report())
        _until(api, lambda b: b.get("status") == "ok", "ok again")
        _write(database_url, _report(reason="x" * (4 * MAX_REPORT_BYTES)))
        body = _until(api, lambda b: b.get("status") != "ok", "not ok for a huge row")
        assert body["status"] == "failing" and body["chains"] == []
        assert str(CHAIN) in body["reason"] and "unreadable" in body["reason"]

        # Not a report at all, or another chain's report: that chain is failing with a reason
        # (not a bare 503 for every chain, and never the other chain's answer).
        for lie in (json.dumps({"chainId": CHAIN, "rpc": "up"}), _report().replace(f'"chainId":{CHAIN}', '"chainId":1')):
            _write(database_url, _report())
            _until(api, lambda b: b.get("status") == "ok", "ok again")
            _write(database_url, lie)
            body = _until(api, lambda b: b.get("status") != "ok", "not ok for a malformed row")
            assert body["status"] == "failing" and body["chains"] == []
            assert str(CHAIN) in body["reason"] and "unreadable" in body["reason"]
        assert api.alive()
