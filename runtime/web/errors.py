"""Refusals as values with a status and a stable code, rendered as `{"error": {code, message}}`."""

from __future__ import annotations

import re
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from schemas.task_terms import ApiError

log = structlog.get_logger(__name__)


class ApiProblem(Exception):
    """A refusal the client can act on: HTTP status, upper-case code, one sentence."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message


def error_body(code: str, message: str) -> dict[str, dict[str, str]]:
    """The JSON body of every error response."""
    return {"error": {"code": code, "message": message}}


def _validation_message(exc: RequestValidationError) -> str:
    errors = exc.errors()
    if not errors:
        return "the request is invalid"
    first = errors[0]
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "request"
    return f"{where}: {first.get('msg', 'invalid')}"[:500]


def error_responses(*answers: tuple[int, str]) -> dict[int | str, dict[str, Any]]:
    """An operation's documented error answers, (status, what it means) each, all `ApiError`."""
    return {status: {"model": ApiError, "description": text} for status, text in answers}


GUARD_RESPONSES = error_responses(
    (400, "The body is not bounded JSON (`JSON_TOO_DEEP`, `JSON_INVALID`) or breaks a rule"),
    (413, "The body is larger than the limit (`BODY_TOO_LARGE`)"),
    (415, "The body is not application/json"),
    (422, "The request does not fit the schema (`INVALID_REQUEST`)"),
)
"""Answers every route can give, whatever it does: documented on each operation."""

SIGNED_RESPONSES = error_responses(
    (401, "No valid request signature for the deployment acted on (`AUTH_REQUIRED`, `SIGNATURE_INVALID`, `SIGNATURE_EXPIRED`)"),
    (403, "The signer may not do this"),
    (404, "Not found, or a deployment this API does not serve (`DEPLOYMENT_UNKNOWN`)"),
    (409, "Refused in the current state, or a nonce already used (`NONCE_REPLAYED`)"),
    (503, "The API serves no deployment (`NO_DEPLOYMENT`)"),
)
"""Answers of the signed routes of the agent and panel routers (documented on each operation)."""

_STATUS_CODES = {
    400: "BAD_REQUEST",
    401: "UNAUTHORIZED",
    403: "FORBIDDEN",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    409: "CONFLICT",
    413: "PAYLOAD_TOO_LARGE",
    415: "UNSUPPORTED_MEDIA_TYPE",
}


_HTTP_METHODS = frozenset({"get", "put", "post", "delete", "patch", "head", "options", "trace"})


def _path_methods(app: FastAPI) -> list[tuple[re.Pattern[str], frozenset[str]]]:
    """(path pattern, methods) of every documented path, built once per app."""
    cached: list[tuple[re.Pattern[str], frozenset[str]]] | None = getattr(app.state, "path_methods", None)
    if cached is None:
        cached = []
        for template, operations in app.openapi().get("paths", {}).items():
            pattern = re.compile("^" + re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template)) + "$")
            cached.append((pattern, frozenset(m.upper() for m in operations if m in _HTTP_METHODS)))
        app.state.path_methods = cached
    return cached


def allowed_methods(request: Request) -> list[str]:
    """Every method the API documents at this request's path, sorted.

    Starlette's own 405 names the methods of the first route whose path matched; a path served
    by several routes (`GET` in one router, `PUT` in another) needs all of them in `Allow`.
    """
    path = request.url.path
    return sorted({m for pattern, methods in _path_methods(request.app) if pattern.match(path) for m in methods})


def install_error_handlers(app: FastAPI) -> None:
    """Render every error, expected or not, in the one error shape (no internals leak)."""

    @app.exception_handler(ApiProblem)
    async def _problem(_request: Request, exc: ApiProblem) -> JSONResponse:
        return JSONResponse(error_body(exc.code, exc.message), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(error_body("INVALID_REQUEST", _validation_message(exc)), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _STATUS_CODES.get(exc.status_code, "HTTP_ERROR")
        # Headers such as 405's `Allow` are part of the answer.
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            allowed = allowed_methods(request)
            if allowed:
                headers["Allow"] = ", ".join(allowed)
        return JSONResponse(error_body(code, str(exc.detail)), status_code=exc.status_code, headers=headers or None)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # The exception text can hold SQL or configuration: log its type, never return it.
        log.error("api_unexpected_error", path=request.url.path, error_type=type(exc).__name__)
        return JSONResponse(error_body("INTERNAL", "internal error"), status_code=500)
