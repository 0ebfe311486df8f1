"""`escrowd api serve`: run the HTTP API with uvicorn (settings from `ESCROWD_*` variables)."""

from __future__ import annotations

from typing import Annotated

import typer

from runtime.options import ConfigOption, LogJsonOption

app = typer.Typer(help="The HTTP API: task terms, finalize, review, results.", no_args_is_help=True)


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Listen address (default: ESCROWD_API_HOST or 127.0.0.1)")] = None,
    port: Annotated[int | None, typer.Option(help="Listen port (default: ESCROWD_API_PORT or 8080)")] = None,
    log_json: LogJsonOption = True,
    config: ConfigOption = None,
) -> None:
    """Serve the API until Ctrl-C; OpenAPI at /openapi.json."""
    import structlog

    from api.app import create_app
    from api.settings import ApiSettings
    from runtime.config_file import load
    from runtime.logging import configure_logging
    from runtime.shell import run_service, startup_failure
    from runtime.web.server import serve_asgi
    from schemas.jsonbounds import cap_recursion_limit

    configure_logging(json=log_json)
    try:
        settings = load(ApiSettings, "api", config)
    except Exception as exc:
        startup_failure("configuration error", exc)
    application = create_app(settings)
    # Every import is done: a library that raised the recursion limit on the way is undone.
    limit = cap_recursion_limit()
    structlog.get_logger(__name__).info("api_starting", recursion_limit=limit)
    listen_host = host or settings.api_host
    listen_port = port if port is not None else settings.api_port
    run_service(
        "api",
        lambda stop: serve_asgi(application, host=listen_host, port=listen_port, stop=stop),
        configure=False,
    )


if __name__ == "__main__":
    app()
