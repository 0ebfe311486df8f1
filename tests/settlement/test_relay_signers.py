"""The relayer with its key outside the process: an aws-kms key in the local KMS process, a
remote JSON-RPC signer process. Verdicts flow; the signer goes away mid-run (nothing is
signed or sent, the signer metric says so, verdicts wait queued); it comes back and every
verdict lands exactly once."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest

from chain.signers import SIGNER_FAILURES, SIGNER_UP, Signer, SignerError, open_signer
from escrowd.devnet import Devnet
from relayer.settlement.service import Relayer, load_relayer_key
from runtime.services.localkms import LocalKms
from runtime.services.localsigner import RemoteSignerProcess
from tests.settlement.conftest import (
    Relay,
    fetchval,
    on_chain,
    relayer_env,
    settings_from_env,
    verdict_events,
    verdict_statuses,
    wait_until,
)

pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize("kind", ["aws-kms", "remote"])
async def test_signer_outage_holds_sends_and_recovers(
    relay: Relay, devnet: Devnet, database_url: str,
    kind: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "local")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "local")
    key = devnet.marketplace_verifier.private_key
    address = devnet.marketplace_verifier.address
    local: LocalKms | RemoteSignerProcess
    if kind == "aws-kms":
        local = LocalKms({"marketplace": key}).start()
        spec = {"kind": kind, "kms_key_id": "marketplace", "kms_endpoint_url": local.url, "address": address, "timeout": 2}
    else:
        local = RemoteSignerProcess(key).start()
        spec = {"kind": kind, "remote_url": local.url, "address": address, "timeout": 2}
    env = relay.env(relayer_signer=json.dumps(spec))
    del env["ESCROWD_RELAYER_KEY"]  # the key is the signer's alone
    settings = settings_from_env(env)
    signer = await open_signer(settings.relayer_signer, "relayer", lambda: load_relayer_key(settings))
    assert signer.address == address
    relayer = Relayer(settings, signer)
    task = asyncio.create_task(relayer.run())
    try:
        first = await relay.submitted(4, prefix=f"{kind}-a")
        second = await relay.submitted(4, prefix=f"{kind}-b")
        await relay.send_verdicts(env, first)

        async def statuses_are(count: int, wanted: set[str]) -> bool:
            if task.done():
                task.result()
            await on_chain(devnet.mine)
            statuses = await verdict_statuses(database_url)
            return len(statuses) == count and set(statuses.values()) <= wanted

        await wait_until(lambda: statuses_are(4, {"confirmed"}), timeout=60, what="first verdicts confirmed")
        sent_before = await fetchval(database_url, "SELECT count(*) FROM settlement_transactions")
        failures_before = SIGNER_FAILURES.labels("relayer", kind)._value.get()

        local.stop()  # the signer is gone: nothing may be signed, stored or sent
        await relay.send_verdicts(env, second)
        await wait_until(lambda: statuses_are(8, {"confirmed", "queued"}), timeout=60, what="second verdicts queued")

        async def failing() -> bool:
            return SIGNER_FAILURES.labels("relayer", kind)._value.get() > failures_before

        await wait_until(failing, timeout=60, what="a signing failure counted")
        assert SIGNER_UP.labels("relayer", kind)._value.get() == 0
        assert await fetchval(database_url, "SELECT count(*) FROM settlement_transactions") == sent_before
        assert not task.done()  # the relayer waits for its signer, it does not die or switch keys

        local.start()  # the same key, back on the same port
        await wait_until(lambda: statuses_are(8, {"confirmed"}), timeout=90, what="every verdict confirmed")
        assert SIGNER_UP.labels("relayer", kind)._value.get() == 1
        events = await on_chain(verdict_events, devnet)
        assert {k: v for k, v in events.items() if k[0] in {i.task_id for i in first + second}} == {
            (i.task_id, 1): 1 for i in first + second
        }
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        await signer.aclose()
        local.stop()


async def test_a_signer_holding_another_key_stops_the_start(monkeypatch: pytest.MonkeyPatch, devnet: Devnet) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "local")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "local")
    local = LocalKms({"marketplace": devnet.arbiter.private_key}).start()
    try:
        env = relayer_env(
            devnet=devnet, database_url="postgresql://x@127.0.0.1:9/x", kafka_bootstrap="127.0.0.1:9", topic_prefix="",
            trusted=[devnet.arbiter.address], relayer_signer=json.dumps(
                {"kind": "aws-kms", "kms_key_id": "marketplace", "kms_endpoint_url": local.url,
                 "address": devnet.marketplace_verifier.address}),
        )
        del env["ESCROWD_RELAYER_KEY"]
        settings = settings_from_env(env)
        with pytest.raises(SignerError, match="not the configured"):
            await open_signer(settings.relayer_signer, "relayer", lambda: load_relayer_key(settings))
    finally:
        local.stop()


async def test_rotation_drill_to_a_new_kms_key(
    relay: Relay, devnet: Devnet, database_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """New key ready in KMS -> the relayer restarted on it reports the mismatch and holds ->
    the escrow owner switches -> sends resume, and not one transaction leaves the old key."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "local")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "local")
    old, new = devnet.marketplace_verifier, devnet.spare[2]
    local = LocalKms({"old": old.private_key, "new": new.private_key}).start()

    async def start(key_id: str, address: str) -> tuple[dict[str, str], Relayer, asyncio.Task[None], Signer]:
        spec = {"kind": "aws-kms", "kms_key_id": key_id, "kms_endpoint_url": local.url, "address": address}
        env = relay.env(relayer_signer=json.dumps(spec))
        del env["ESCROWD_RELAYER_KEY"]
        settings = settings_from_env(env)
        signer = await open_signer(settings.relayer_signer, "relayer", lambda: load_relayer_key(settings))
        relayer = Relayer(settings, signer)
        return env, relayer, asyncio.create_task(relayer.run()), signer

    async def stop(task: asyncio.Task[None], signer: Signer) -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        await signer.aclose()

    async def statuses_are(task: asyncio.Task[None], count: int, wanted: set[str]) -> bool:
        if task.done():
            task.result()
        await on_chain(devnet.mine)
        statuses = await verdict_statuses(database_url)
        return len(statuses) == count and set(statuses.values()) <= wanted

    first = await relay.submitted(3, prefix="rot-a")
    second = await relay.submitted(3, prefix="rot-b")
    env, relayer, task, signer = await start("old", old.address)
    try:
        await relay.send_verdicts(env, first)
        await wait_until(lambda: statuses_are(task, 3, {"confirmed"}), timeout=60, what="sent from the old key")
    finally:
        await stop(task, signer)
    old_count = int(devnet.rpc("eth_getTransactionCount", old.address, "latest"), 16)

    env, relayer, task, signer = await start("new", new.address)  # the new key is ready; the escrow trusts the old
    try:
        async def mismatch_reported() -> bool:
            report = await relayer.monitor.report() if relayer.monitor else None
            return report is not None and report.chains[0].verifier.verifier_matches is False

        await wait_until(mismatch_reported, timeout=30, what="the expected mismatch")
        await relay.send_verdicts(env, second)
        await wait_until(lambda: statuses_are(task, 6, {"confirmed", "queued"}), timeout=60, what="held")
        assert set((await verdict_statuses(database_url)).values()) == {"confirmed", "queued"}

        await on_chain(devnet.set_marketplace_verifier, new)  # the owner switches
        await wait_until(lambda: statuses_are(task, 6, {"confirmed"}), timeout=90, what="sent from the new key")
    finally:
        await stop(task, signer)
        local.stop()
    assert int(devnet.rpc("eth_getTransactionCount", old.address, "latest"), 16) == old_count
    senders = await fetchval(database_url, "SELECT array_agg(DISTINCT sender) FROM settlement_transactions")
    assert set(senders) == {old.address.lower(), new.address.lower()}
    events = await on_chain(verdict_events, devnet)
    assert {k: v for k, v in events.items() if k[0] in {i.task_id for i in first + second}} == {
        (i.task_id, 1): 1 for i in first + second
    }
