"""The sandbox runner as its own service: the narrow interface between verification and bwrap.

Deployed alone (`escrowd verify serve-sandbox`), in a container with no secrets, no database
URL and egress denied, so that code escaping bubblewrap still lands where there is nothing
to take. The verification service sets `ESCROWD_SANDBOX_URL` and sends each run here.

    POST /v1/run  {"source", "entrypoint", "stages": [{"cases", "expected"}], "timeLimitMs",
                   "memoryMb"}   (or "cases" for a single stage)
      200 {"stage", "cases": [{"ok", "value", "error"}], "error", "cpuMs", "peakMemoryMb",
           "wallMs", "limits", "stagesRun"}

Each stage's cases enter the sandbox only after the code has loaded and the stage before
returned its expected values (`verification.sandbox.Stage`), exactly as in a local run.
      503 {"error"}  the sandbox could not run (the caller raises SandboxUnavailable)
      400 {"error"}  a malformed request
    GET /health    {"ok": true}   (also /healthz and /readyz, for the probes)

Bodies are bounded (16 MiB) before they are parsed; at most `max_parallel` runs at a time
(the rest wait, so the caller's backstop, not this service, decides when it is too slow).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from verification.sandbox import (
    DEFAULT_SETTINGS,
    SandboxSettings,
    SandboxUnavailable,
    Stage,
    run_stages,
    run_to_json,
)

MAX_BODY = 16 * 1024 * 1024


class StageRequest(BaseModel):
    """One stage: the cases' arguments and, when a later stage depends on it, their expected values."""

    model_config = ConfigDict(extra="forbid")

    cases: list[list[Any]] = Field(max_length=1000)
    expected: list[Any] | None = Field(default=None, max_length=1000)


class RunRequest(BaseModel):
    """One run: the code, its entrypoint, its stages (or one stage's `cases`) and the task's limits."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    source: str = Field(max_length=1_000_000)
    entrypoint: str = Field(pattern=r"^[A-Za-z_]\w*$", max_length=100)
    cases: list[list[Any]] | None = Field(default=None, max_length=1000)
    stages: list[StageRequest] | None = Field(default=None, max_length=4)
    time_limit_ms: int = Field(ge=50, le=60_000, alias="timeLimitMs")
    memory_mb: int = Field(ge=32, le=4096, alias="memoryMb")


def create_app(
    settings: SandboxSettings = DEFAULT_SETTINGS, *, max_parallel: int = 2
) -> web.Application:
    """The runner's HTTP application (runs always happen locally here: `remote_url` is ignored)."""
    local = dataclasses.replace(settings, remote_url=None)
    slots = asyncio.Semaphore(max_parallel)

    async def run(request: web.Request) -> web.Response:
        try:
            body = await request.read()
            job = RunRequest.model_validate_json(body)
        except ValidationError as exc:
            return web.json_response(
                {"error": f"bad request: {exc.errors()[0]['msg']}"}, status=400
            )
        if (job.cases is None) == (job.stages is None):
            return web.json_response({"error": "bad request: give cases or stages"}, status=400)
        if job.stages is None:
            stages = [Stage.of(job.cases or [])]
        else:
            if any(s.expected is not None and len(s.expected) != len(s.cases) for s in job.stages):
                return web.json_response(
                    {"error": "bad request: expected values do not match the cases"}, status=400
                )
            stages = [Stage.of(s.cases, s.expected) for s in job.stages]
        async with slots:
            try:
                result = await run_stages(
                    job.source, job.entrypoint, stages,
                    time_limit_ms=job.time_limit_ms, memory_mb=job.memory_mb, settings=local,
                )  # fmt: skip
            except SandboxUnavailable as exc:
                return web.json_response({"error": str(exc)}, status=503)
        return web.json_response(run_to_json(result))

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application(client_max_size=MAX_BODY)
    app.router.add_post("/v1/run", run)
    app.router.add_get("/health", health)
    # The probes every escrowd service serves (the runner is ready as soon as it listens),
    # and its metrics on the same port (a runner has no port of its own to spare).
    app.router.add_get("/healthz", health)
    app.router.add_get("/readyz", health)
    app.router.add_get("/metrics", _metrics)
    return app


async def _metrics(_: web.Request) -> web.Response:
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

    return web.Response(body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def serve(app: web.Application, *, host: str, port: int, stop: asyncio.Event) -> None:
    """Serve `app` until `stop`; runs in flight finish (aiohttp's shutdown waits for them)."""
    import structlog

    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        structlog.get_logger(__name__).info("sandbox_runner_ready", host=host, port=port)
        await stop.wait()
    finally:
        await runner.cleanup()
