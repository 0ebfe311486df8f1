"""The sandbox runner as its own process (`escrowd verify serve-sandbox`), used through `sandbox_url`."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import aiohttp
import pytest

from schemas.task_terms import VerifierRef
from verification.registry import VerificationError
from verification.sandbox import SandboxSettings
from verification.verifiers import default_registry

pytestmark = pytest.mark.timeout(300)

SUITE = VerifierRef(
    kind="test_suite", ref="TEST_SUITE://V1",
    config={"publicTests": [{"args": [1, 2], "expected": 3}], "hiddenTests": [{"args": [4, 5], "expected": 9}],
            "timeLimitMs": 300, "memoryMb": 128},
)  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def runner_url() -> Iterator[str]:
    """A real `escrowd verify serve-sandbox` process, with an environment holding nothing of the service."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "escrowd.cli", "verify", "serve-sandbox", "--port", str(port)],
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(
                    f"serve-sandbox did not start: {proc.stderr.read() if proc.stderr else ''}"
                ) from None
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=30)


async def test_runs_go_through_the_runner_service(runner_url: str) -> None:
    """A correct solution passes and a CPU spin fails at RESOURCE LIMITS, judged by the remote runner."""
    registry = default_registry(sandbox_settings=SandboxSettings(remote_url=runner_url))
    passed = await registry.verify(SUITE, {}, "def solve(a, b):\n    return a + b\n")
    assert passed.reward == 1.0 and passed.detail["measured"]["runs"] == 2
    spin = await registry.verify(SUITE, {}, "def solve(a, b):\n    while True:\n        pass\n")
    assert spin.reward == 0.0 and spin.detail["stage"] == "RESOURCE LIMITS"


async def test_a_malformed_request_is_refused_and_a_down_runner_cannot_answer(
    runner_url: str,
) -> None:
    """400 for a request that is not a run; a runner that is not there is "could not answer", never 0."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            runner_url + "/v1/run",
            json={
                "source": "x",
                "entrypoint": "1bad",
                "cases": [],
                "timeLimitMs": 1,
                "memoryMb": 1,
            },
        ) as response,
    ):
        assert response.status == 400
    down = default_registry(
        sandbox_settings=SandboxSettings(remote_url=f"http://127.0.0.1:{free_port()}")
    )
    with pytest.raises(VerificationError, match="unreachable"):
        await down.verify(SUITE, {}, "def solve(a, b):\n    return a + b\n")


def test_deployments_give_the_runner_no_secrets_and_no_egress() -> None:
    """Compose and Kubernetes: the sandbox runner has no secret, env or config; egress is denied;
    the verification container mounts only its own keystore folder and points at the runner."""
    from pathlib import Path

    import yaml

    deploy = Path(__file__).resolve().parents[2] / "deploy"
    compose = yaml.safe_load((deploy / "docker-compose.yml").read_text())
    sandbox = compose["services"]["sandbox"]
    assert "environment" not in sandbox and "volumes" not in sandbox
    assert sandbox["networks"] == ["sandbox"] and compose["networks"]["sandbox"]["internal"] is True
    verification = compose["services"]["verification"]
    assert verification["environment"]["ESCROWD_SANDBOX_URL"] == "http://sandbox:8090"
    assert not any(v.split(":")[0].endswith("./secrets}") for v in verification["volumes"])
    docs = list(yaml.safe_load_all((deploy / "k8s" / "sandbox.yaml").read_text()))
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert all("env" not in c and "envFrom" not in c for c in pod["containers"])
    assert all("secret" not in v and "configMap" not in v for v in pod["volumes"])
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy")
    assert "Egress" in policy["spec"]["policyTypes"] and policy["spec"]["egress"] == []


@pytest.mark.parametrize(
    "reply",
    [
        {"stage": "ok", "cases": [], "stagesRun": 2},  # "ok", yet no case has an outcome
        {"stage": "ok", "cases": ["3", "9"], "stagesRun": 2},  # cases that are not outcomes
        {"stage": "ok", "cases": [{"ok": True, "value": 3}], "stagesRun": 2},  # a case missing
        {"stage": "fine", "cases": [], "stagesRun": 0},  # no stage a run ends at
        {"stage": "crashed", "cases": [{"ok": True, "value": 3}] * 3, "stagesRun": 2},  # more outcomes than cases
    ],
)
async def test_a_runner_reply_that_is_not_a_run_cannot_answer(reply: dict[str, object]) -> None:
    """A 200 from the runner that is not a run the harness could have made (a runner of another
    version, a proxy's page) is "could not answer", never a FAIL scored 0 for the agent."""
    from aiohttp import web

    from tests.support.local_http import serve_post

    async def run(_: web.Request) -> web.Response:
        return web.json_response(reply)

    async with serve_post({"/v1/run": run}) as url:
        registry = default_registry(sandbox_settings=SandboxSettings(remote_url=url))
        with pytest.raises(VerificationError, match="not a run"):
            await registry.verify(SUITE, {}, "def solve(a, b):\n    return a + b\n")
