"""The executor directory through the API: signed registration, opt-in, chain filter, staleness."""

from __future__ import annotations

from runtime.db import connect
from tests.verification.conftest import Api, Who
from tests.verification.test_api import code

from .helpers import entry, register_executor


async def listed(api: Api, query: str) -> list[str]:
    response = await api.call("GET", f"/v1/executors?{query}")
    assert response.status_code == 200, response.text
    return [e["address"] for e in response.json()["executors"]]


async def test_verifiers_listed_are_opted_in_on_the_chain_and_running(api: Api, who: dict[str, Who], database_url: str) -> None:
    """Only opted-in verifiers of that chain seen recently; workers under role=worker."""
    first = await register_executor(api, who["verifier"], chains=(31337, 8453))
    assert first["verifyOthers"] is True and first["chains"] == [8453, 31337]
    await register_executor(api, who["agent"], roles=("worker",))
    await register_executor(api, who["agent2"], roles=("worker", "verifier"), opt_in=False)
    await register_executor(api, who["stranger"], chains=(8453,))
    assert await listed(api, "role=verifier&chain=31337") == [who["verifier"].address]
    assert sorted(await listed(api, "role=verifier&chain=8453")) == sorted([who["verifier"].address, who["stranger"].address])
    assert sorted(await listed(api, "role=worker")) == sorted([who["agent"].address, who["agent2"].address])
    assert await listed(api, "role=verifier&chain=1") == []

    # Not seen for an hour: no longer running, so no longer listed; a heartbeat brings it back.
    conn = await connect(database_url)
    try:
        await conn.execute("UPDATE executors SET last_seen = now() - interval '1 hour' WHERE address = $1", who["verifier"].address.lower())
    finally:
        await conn.close()
    assert await listed(api, "role=verifier&chain=31337") == []
    beat = await api.call("POST", "/v1/executors/me/heartbeat", as_=who["verifier"])
    assert beat.status_code == 204
    assert await listed(api, "role=verifier&chain=31337") == [who["verifier"].address]

    # Opting out is a signed change of the entry.
    await register_executor(api, who["verifier"], opt_in=False)
    assert await listed(api, "role=verifier&chain=31337") == []


async def test_registration_is_signed_and_validated(api: Api, who: dict[str, Who]) -> None:
    """Unsigned → 401; a key off the curve → 400 (after the signature); an unknown role → 422; a heartbeat before registering → 404."""
    assert (await api.call("PUT", "/v1/executors/me", entry(who["verifier"]))).status_code == 401
    off_curve = entry(who["verifier"], encryptionPublicKey="0x02" + "ff" * 32)
    refused = await api.call("PUT", "/v1/executors/me", off_curve, as_=who["verifier"])
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "ENCRYPTION_KEY_INVALID"
    bad_role = entry(who["verifier"], roles=("oracle",))
    assert (await api.call("PUT", "/v1/executors/me", bad_role, as_=who["verifier"])).status_code == 422
    beat = await api.call("POST", "/v1/executors/me/heartbeat", as_=who["stranger"])
    assert beat.status_code == 404 and code(beat) == "EXECUTOR_NOT_REGISTERED"
