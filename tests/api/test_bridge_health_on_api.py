"""`GET /health/bridge` on the API process is the relayer's answer (real processes: an indexer,
`escrowd relay run`, `escrowd api serve`), through the runbook's rotation (`escrowd keys new`,
restart the relayer, `setMarketplaceVerifier`), its indexer recovery (start it again), and a
dead relayer (its report goes stale: failing).

The API used to compute its own report from a configured relayer address: during the
relayer's fail-closed window (restarted with the new key, the escrow still trusting the old
one) it said ok, after the rotation it said failing until restarted, and it said ok while the
indexer was dead and behind. Now it serves what the relayer's monitor publishes.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from escrowd.devnet import Devnet
from escrowd.harness import IndexerProcess, chain_config, escrowd_command, write_config
from relayer.settlement.health import ChainHealth, indexer_liveness, judge_published
from tests.settlement.conftest import relayer_env
from tests.support.processes import ServiceProcess, api_process, consumer_process, get


def _wait(check: Callable[[], bool], what: str, *processes: ServiceProcess, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        for process in processes:
            assert process.alive(), f"a process exited while waiting for {what}:\n{process.log()[-3000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


@contextlib.contextmanager
def _relayer(devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str, keys: Path) -> Iterator[ServiceProcess]:
    env = relayer_env(
        devnet=devnet, database_url=database_url, kafka_bootstrap=kafka_bootstrap, topic_prefix=topic_prefix,
        trusted=[devnet.spare[2].address], confirmations=0, relayer_keystore=keys / "relayer-keystore.json",
        relayer_keystore_password_file=keys / "relayer-keystore-password", relayer_indexer_stale_seconds=5,
    )  # fmt: skip
    del env["ESCROWD_RELAYER_KEY"]  # the key is the new keystore, as after rotation step 2
    with tempfile.TemporaryDirectory() as tmp, consumer_process(["relay", "run"], env, Path(tmp) / "relayer.log") as process:
        yield process


def test_api_serves_the_relayers_answer_through_a_rotation_and_a_dead_indexer(
    devnet: Devnet, database_url: str, kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    config = write_config(
        tmp_path / "indexer.yaml", database_url=database_url, kafka_bootstrap=kafka_bootstrap,
        topic=f"{topic_prefix}escrow.events.v1", chains=[chain_config(devnet)],
    )  # fmt: skip
    indexer = IndexerProcess(config).start()
    # Rotation step 1 of docs/operations.md: one new key from the command we ship.
    made = subprocess.run([*escrowd_command(), "keys", "new", "--role", "relayer", "--out", str(tmp_path / "new")],
                          capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
    new_address = json.loads(made.stdout)["relayer"]
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == ["relayer-keystore-password", "relayer-keystore.json"]
    bridge_chains = json.dumps([{"chain_id": devnet.chain_id, "rpc_urls": [devnet.rpc_url],
                                 "escrow_addresses": [devnet.escrow_address]}])  # fmt: skip
    try:
        with (
            api_process(database_url, bridge_chains=bridge_chains) as api,
            _relayer(devnet, database_url, kafka_bootstrap, topic_prefix, tmp_path / "new") as relayer,
        ):
            url = api.url + "/health/bridge"

            def body() -> dict[str, Any]:
                status, raw = get(url)
                assert status in (200, 503), raw
                return dict(json.loads(raw))

            # Rotation step 3: the relayer runs the new key, the escrow still trusts the old.
            def reported_new_key() -> bool:
                chains = body().get("chains") or []
                return bool(chains) and chains[0]["relayer"]["address"] == new_address

            _wait(reported_new_key, "the relayer's first report", api, relayer)
            window = body()
            assert window["status"] == "failing"
            chain = window["chains"][0]
            assert chain["verifier"]["verifierMatches"] is False
            assert chain["relayer"]["sending"] is False
            assert new_address in chain["verifier"]["reason"]

            # Step 4: the owner names the new key; the API follows without a restart.
            devnet.set_marketplace_verifier(new_address)
            _wait(lambda: body()["status"] == "ok", "ok after the rotation", api, relayer)
            chain = body()["chains"][0]
            assert chain["verifier"]["verifierMatches"] is True
            assert chain["relayer"]["sending"] is True
            assert chain["indexer"]["live"] is True

            # The indexer dies while the chain moves on: failing, and the report says why.
            indexer.kill9()

            def indexer_dead() -> bool:
                devnet.mine()
                return body()["chains"][0]["indexer"]["live"] is False

            _wait(indexer_dead, "the dead indexer reported", api, relayer)
            report = body()
            assert report["status"] == "failing"
            assert report["chains"][0]["indexer"]["lagBlocks"] > 0
            assert "not moved" in report["chains"][0]["indexer"]["reason"]

            # Indexer recovery as the runbook says: start it again; it resumes from its cursor.
            indexer.start()
            _wait(lambda: body()["status"] == "ok", "ok after the indexer's restart", api, relayer)
            assert body()["chains"][0]["indexer"]["live"] is True
            assert relayer.alive() and api.alive()

            # The relayer dies: its last report goes stale and the API stops vouching for it.
            relayer.process.kill()
            relayer.process.wait(30)
            _wait(lambda: body()["chains"][0]["stale"] is True, "the relayer's report stale", api)
            report = body()
            assert report["status"] == "failing"
            assert report["chains"][0]["relayer"]["sending"] is False
            assert "is the relayer running" in report["chains"][0]["relayer"]["pausedReason"]
    finally:
        indexer.cleanup()


def test_an_api_without_any_relayer_report_says_failing(database_url: str) -> None:
    """No relayer has reported: 503 naming the cause, never a made-up answer."""
    with api_process(database_url) as api:
        status, raw = get(api.url + "/health/bridge")
        assert status == 503
        assert json.loads(raw) == {"status": "failing", "error": "the relayer has published no health report yet"}


def test_indexer_liveness_and_report_age_rules() -> None:
    """Behind and not moving is dead; at the head it may rest; an old report is stale."""
    assert indexer_liveness(100, 110, 6.0, 5.0)[0] is False
    assert indexer_liveness(100, 110, 1.0, 5.0) == (True, None)
    assert indexer_liveness(110, 110, 600.0, 5.0) == (True, None)
    assert indexer_liveness(None, 110, None, 5.0)[0] is None
    chain = ChainHealth.model_validate({
        "chainId": 1, "rpc": {"reachable": True, "head": 5}, "indexer": {"cursorBlock": 5, "lagBlocks": 0, "live": True},
        "relayer": {"address": "0x" + "11" * 20, "sending": True},
        "verifier": {"escrow": "0x" + "22" * 20, "relayerAddress": "0x" + "11" * 20, "verifierMatches": True},
    })  # fmt: skip
    assert judge_published(chain, age=10.0, stale_after=15.0) is chain
    stale = judge_published(chain, age=16.0, stale_after=15.0)
    assert stale.stale and not stale.relayer.sending and "16 s old" in (stale.relayer.paused_reason or "")
