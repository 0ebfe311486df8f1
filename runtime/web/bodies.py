"""Request bodies checked at the door: size bounded while streaming, JSON bounded before parsing.

`BodyGuard` is the outermost middleware of the API. For every HTTP request that has a body:

1. a `Content-Length` above the limit is answered `413 BODY_TOO_LARGE` at once, before a
   byte of the body is read (the server then closes the connection instead of draining it);
2. a body without a length is counted while it streams in, and refused the same way as
   soon as it passes the limit;
3. a body whose media type is not JSON is `415 UNSUPPORTED_MEDIA_TYPE`;
4. the body goes through `schemas.jsonbounds.loads` (size, nesting depth, UTF-8, lone
   surrogates, NUL, NaN): a refusal is `400` with the bound's code (`JSON_TOO_DEEP`,
   `JSON_INVALID`);
5. otherwise the body is handed on to the application unchanged (its signature covers
   the exact bytes).

So no recursive parser behind it ever sees a text deeper than `jsonbounds.MAX_DEPTH`.
Starlette's own body limit is not used: it answers in plain text, not in the API's
`{"error": {code, message}}` shape.
"""

from __future__ import annotations

import email.message

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runtime.web.errors import error_body
from schemas import jsonbounds, jsoncodec


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return True  # FastAPI refuses it later as the wrong shape; the bounds still apply
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


class BodyGuard:
    """ASGI middleware: body size limit while streaming, then the bounded JSON check."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        length_header = headers.get(b"content-length")
        if length_header is not None:
            try:
                declared = int(length_header)
            except ValueError:
                await _refuse(send, 400, "BAD_REQUEST", "Content-Length is not a number")
                return
            if declared > self.max_body_bytes:
                await _too_large(send, self.max_body_bytes)
                return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await _too_large(send, self.max_body_bytes)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if body:
            content_type = headers.get(b"content-type")
            if not _is_json(content_type.decode("latin-1") if content_type else None):
                await _refuse(send, 415, "UNSUPPORTED_MEDIA_TYPE", "request bodies are application/json")
                return
            try:
                jsonbounds.loads(body, max_bytes=self.max_body_bytes)
            except jsonbounds.JsonRefused as exc:
                status = 413 if exc.code == "JSON_TOO_LARGE" else 400
                await _refuse(send, status, exc.code, str(exc))
                return
        await self.app(scope, _replay(body, receive), send)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: the disconnect, when it comes

    return replay


async def _too_large(send: Send, limit: int) -> None:
    # The rest of the body is never read: the connection cannot be reused.
    await _refuse(send, 413, "BODY_TOO_LARGE", f"request bodies are at most {limit} bytes", close=True)


async def _refuse(send: Send, status: int, code: str, message: str, *, close: bool = False) -> None:
    payload = jsoncodec.dumps(error_body(code, message))
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
