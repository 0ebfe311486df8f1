"""The verifier's queue: only listed, delivered, finalized, unjudged attempts naming the signer."""

from __future__ import annotations

from schemas.task_terms import result_hash
from tests.verification.conftest import CHAIN_ID, ESCROW, Api, IndexedChain, Who
from tests.verification.test_api import register

from .helpers import register_executor
from .test_refusals import listing_path


async def queue(api: Api, who: Who, limit: int = 100) -> list[int]:
    response = await api.call("GET", f"/v1/verifiers/me/queue?limit={limit}", as_=who)
    assert response.status_code == 200, response.text
    return [item["taskId"] for item in response.json()["items"]]


async def test_the_queue_holds_only_what_the_verifier_can_judge_now(api: Api, chain: IndexedChain, who: dict[str, Who]) -> None:
    """Judged tasks leave it (and do not crowd the page), unlisted and unfinalized ones never enter."""
    await register_executor(api, who["verifier"])
    terms = {"verificationMode": "agent", "verifierAddress": who["verifier"].address, "verificationCriteria": {"acceptance": 'Say "hi".'}}
    digest = await register(api, who["poster"], **terms)
    for task_id in (1, 2, 3, 4):
        await chain.created(task_id, who["poster"].address, digest, verifier=who["verifier"].address)
        await chain.accepted(task_id, who["agent"].address)
        await chain.submitted(task_id, who["agent"].address, 1, result_hash(f"hi {task_id}"))
        if task_id != 4:  # task 4 stays unlisted
            assert (await api.call("POST", listing_path(task_id), as_=who["poster"])).status_code == 201
        if task_id != 3:  # task 3 is never finalized: no result to judge
            path = f"/v1/tasks/{CHAIN_ID}/{ESCROW}/{task_id}/finalize"
            assert (await api.call("POST", path, {"result": f"hi {task_id}"}, as_=who["agent"])).status_code == 202
    assert await queue(api, who["verifier"]) == [1, 2]
    assert await queue(api, who["stranger"]) == []
    item = (await api.call("GET", "/v1/verifiers/me/queue", as_=who["verifier"])).json()["items"][0]
    assert (item["result"], item["acceptance"], item["attempt"], item["failures"]) == ("hi 1", 'Say "hi".', 1, 0)
    await chain.judged(1, who["verifier"].address, who["agent"].address, 1, result_hash("hi 1"), True, 100)
    assert await queue(api, who["verifier"], limit=1) == [2]  # the judged task no longer takes the only slot
    assert (await api.call("GET", "/v1/verifiers/me/queue")).status_code == 401
