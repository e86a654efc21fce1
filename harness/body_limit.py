"""Bounded request bodies: a pure ASGI middleware that answers 413 to a body larger than
`max_bytes`, before the app holds it in memory. A declared Content-Length over the limit is
refused without reading a byte; a chunked body is counted as it arrives and refused as soon
as it crosses the limit.

Used by the inference gateway and the container kit. Default limit: the environment's
HARNESS_MAX_BODY_BYTES, else 8 MiB. `read_body` is the whole-body read of a raw ASGI route
(the paths that skip the framework's request object)."""

from __future__ import annotations

import json
import os

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_BODY_ENV = "HARNESS_MAX_BODY_BYTES"
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024


def default_max_bytes() -> int:
    raw = os.environ.get(MAX_BODY_ENV, "")
    return int(raw) if raw.isascii() and raw.isdigit() and int(raw) > 0 else DEFAULT_MAX_BODY_BYTES


class BodyTooLarge(HTTPException):
    """Raised from `receive` mid-body; an HTTPException so that frameworks that wrap body
    errors (FastAPI answers 400 "error parsing the body") pass it on as a 413."""

    def __init__(self, limit: int) -> None:
        super().__init__(status_code=413, detail=f"request body larger than {limit} bytes")


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes or default_max_bytes()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        declared = dict(scope.get("headers") or ()).get(b"content-length", b"")
        if declared and (not declared.isdigit() or int(declared) > limit):
            await _refuse(send, limit)
            return
        received = 0
        started = False

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
            return message

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except BodyTooLarge:
            if not started:
                await _refuse(send, limit)


async def read_body(receive: Receive) -> bytes:
    """The request's body, chunks joined; ClientDisconnect when the client left mid-body."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _refuse(send: Send, limit: int) -> None:
    body = json.dumps({"error": {"type": "body_too_large",
                                 "message": f"request body larger than {limit} bytes: refused"}}).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
