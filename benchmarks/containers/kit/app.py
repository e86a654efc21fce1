"""The HTTP face of a task container: `build_app` serves a `TaskContainer` over the task
contract (bearer auth, input validation, error rows for the container's own exceptions) and
`serve` is the CLI of a container module's `__main__`.

The container calls the policy model itself (with the rollout's policy block and a key
from its own environment), so the harness never hands a credential over the wire.
"""

from __future__ import annotations

import argparse
import hmac
import logging
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from benchmarks.containers.kit.container import CodeErrors, Row, RolloutEnv, TaskContainer, failed_response
from harness.body_limit import BodyLimit, read_body
from harness.contract import (
    CONTRACT_VERSION, GEPA_OPTIMIZER_CONTRACT, RolloutRequest, RolloutResponse, SideInfo, TasksRequest,
)
from harness.errors import HarnessError
from harness.heap import freeze_loaded
from harness.http_pool import SharedSession

log = logging.getLogger("benchmarks.containers.kit")

SHUTDOWN_GRACE_S = 3.0  # seconds in-flight requests get after SIGTERM before they are cut off


class _BearerAuth:
    """Pure ASGI middleware: every path but /health needs `Authorization: Bearer <key>`.

    Middleware rather than a dependency so the check runs before body parsing (a bad body
    without the key gets 401, not 422) and covers every route, including unknown ones.
    """

    def __init__(self, app: ASGIApp, expected: bytes) -> None:
        self.app = app
        self.expected = expected

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == "/health":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = given.partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.expected):
            await self.app(scope, receive, send)
            return
        response = JSONResponse(
            {"detail": "missing or wrong bearer key"}, status_code=401, headers={"WWW-Authenticate": "Bearer"}
        )
        await response(scope, receive, send)


def _sanitized_errors(errors: Any) -> list[dict[str, Any]]:
    # Pydantic errors carry the offending `input` (and `ctx`); a rejected policy block may
    # hold a secret, so only location, message and type go back to the caller.
    return [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")} for e in errors]


class RolloutFirst:
    """`POST /rollout`, the container's hot path, goes straight to its handler; every other
    request goes to the FastAPI app. FastAPI's exception, routing and validation layers cost
    more per rollout than the rollout's own work (py-spy at 64 rollouts in flight: three
    quarters of the container's CPU in them, a quarter in the handler). The answers are
    FastAPI's: a body that does not validate gets 422 with sanitized errors, an exception the
    app has a handler for (HTTPException, a container's own) gets that handler's response."""

    def __init__(self, app: FastAPI, handle: Callable[[RolloutRequest], Awaitable[RolloutResponse]]) -> None:
        self.app = app
        self.handle = handle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/rollout" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        try:
            body = await read_body(receive)
        except ClientDisconnect:
            return
        try:
            req = RolloutRequest.model_validate_json(body or b"{}")
        except ValidationError as exc:
            errors = [{**e, "loc": ["body", *e.get("loc", ())]} for e in exc.errors()]
            await JSONResponse({"detail": _sanitized_errors(errors)}, status_code=422)(scope, receive, send)
            return
        try:
            done = await self.handle(req)
        except Exception as exc:
            handler = exception_handler(self.app, exc)
            if handler is None:
                raise  # uvicorn answers 500, as FastAPI's error layer did
            await (await handler(Request(scope, receive), exc))(scope, receive, send)
            return
        await Response(done.model_dump_json(), media_type="application/json")(scope, receive, send)


def exception_handler(app: FastAPI, exc: Exception) -> Callable[..., Any] | None:
    """The handler the app has for `exc` (a deliberate HTTP answer), nearest class first;
    a catch-all `Exception` handler does not count."""
    return next((app.exception_handlers[cls] for cls in type(exc).__mro__
                 if cls is not Exception and cls in app.exception_handlers), None)


def build_app(
    container: TaskContainer, *, api_key_env: str | None = None, policy_key_env: str | None = None
) -> ASGIApp:
    """The ASGI app serving `container` over the task contract: bearer auth and the body
    limit in front of every route, `/rollout` on its own fast path, the rest on FastAPI."""
    expected_key = os.environ.get(api_key_env) if api_key_env else None
    if api_key_env and not expected_key:
        log.warning("%s is not set: the container accepts requests without a key", api_key_env)
    program = container.program()
    code_errors = CodeErrors()
    required_fields = [m.candidate_field or m.module_id for m in program.modules if m.mutable]

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # One aiohttp session per app, shared by concurrent rollouts' policy calls: httpx's
        # shared pool scanned every connection per request, half the container's CPU at 64
        # rollouts in flight (http_pool.py)
        clients = SharedSession(timeout_s=300.0)
        app.state.http = clients
        try:
            yield
        finally:
            await clients.aclose()

    app = FastAPI(title=container.name, lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(RequestValidationError)
    async def _on_invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": _sanitized_errors(exc.errors())}, status_code=422)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "contract_version": CONTRACT_VERSION}

    @app.get("/metadata")
    async def metadata() -> dict[str, Any]:
        return {
            "runtime_id": container.taskset_id,
            "name": container.name,
            "capabilities": {"protocol": "http", "contract_version": CONTRACT_VERSION},
            "metadata": {
                "optimizer_contracts": {"gepa": {"version": GEPA_OPTIMIZER_CONTRACT}},
                "taskset_id": container.taskset_id,
                "program_id": program.program_id,
            },
        }

    @app.get("/program")
    async def get_program() -> dict[str, Any]:
        return program.model_dump(mode="json")

    @app.get("/taskset")
    async def taskset() -> dict[str, Any]:
        body: dict[str, Any] = {
            "taskset_id": container.taskset_id,
            "splits": {name: len(rows) for name, rows in container.splits().items()},
        }
        labels = container.labels()
        if labels is not None:
            body["labels"] = labels
        if container.source:
            body["source"] = container.source
        return body

    @app.post("/taskset/tasks")
    async def tasks(req: TasksRequest) -> dict[str, Any]:
        splits = container.splits()
        if req.split not in splits:
            raise HTTPException(404, f"unknown split {req.split!r}; splits are {sorted(splits)}")
        out = []
        for task_id in req.task_ids:
            try:
                task = container.task(task_id)
            except KeyError as exc:
                raise HTTPException(404, str(exc.args[0])) from None
            if task["split"] != req.split:
                raise HTTPException(404, f"task id {task_id!r} is not in split {req.split!r}")
            out.append(task)
        return {"tasks": out}

    @app.get("/task_info")
    async def task_info() -> dict[str, Any]:
        return container.task_info()

    def row_for(req: RolloutRequest) -> Row:
        if req.task and all(key in req.task for key in container.row_keys):
            return req.task
        try:
            return container.lookup(req.task_id)[2]
        except KeyError as exc:
            raise HTTPException(404, str(exc.args[0])) from None

    async def rollout(req: RolloutRequest) -> RolloutResponse:
        missing = [name for name in required_fields if name not in req.candidate]
        if missing:
            raise HTTPException(422, f"candidate lacks field(s) {missing}")
        row = row_for(req)
        env = RolloutEnv(http=app.state.http, policy_key_env=policy_key_env,
                         trace={"model": req.policy.model}, code_errors=code_errors)
        trace = env.trace
        try:
            done = await container.rollout(req, row, env)
        except HarnessError as exc:
            done = failed_response(req, exc, trace)
        except Exception as exc:  # the container's own code: an error row, not a 500 the harness retries
            if exception_handler(app, exc) is not None:  # HTTPException's among them
                raise  # a deliberate HTTP answer
            code_errors.log("rollout", req.task_id, exc)
            done = failed_response(req, exc, trace)
        if done.actionable_side_info is None or done.actionable_side_info.inputs is None:
            try:
                inputs = container.reflection_input(row)
            except Exception as exc:
                code_errors.log("reflection_input", req.task_id, exc)
                inputs = None
            if inputs:
                side = done.actionable_side_info or SideInfo()
                done = done.model_copy(update={"actionable_side_info": side.model_copy(update={"inputs": inputs})})
        return done

    container.extend_app(app)
    served: ASGIApp = BodyLimit(RolloutFirst(app, rollout))  # HARNESS_MAX_BODY_BYTES, else 8 MiB: 413
    return _BearerAuth(served, expected_key.encode()) if expected_key else served


def serve(container_factory: Callable[[str | None], TaskContainer], argv: list[str] | None = None) -> None:
    """CLI entry for a container module's `__main__`."""
    parser = argparse.ArgumentParser(description="Serve a task container over the HTTP task contract.")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--data-dir", default=os.environ.get("HARNESS_DATA_DIR"),
                        help="folder holding <dataset>/<file> (default $HARNESS_DATA_DIR); else download")
    parser.add_argument("--api-key-env", default=None, help="env var holding the key clients must send")
    parser.add_argument("--policy-key-env", default=None, help="env var holding the policy model's API key")
    add_arguments = getattr(container_factory, "add_arguments", None)
    if callable(add_arguments):
        add_arguments(parser)
    args = parser.parse_args(argv)
    container = container_factory(args.data_dir)
    container.configure(args)
    try:
        container.splits()  # load (or download) the data before we report healthy
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    app = build_app(container, api_key_env=args.api_key_env, policy_key_env=args.policy_key_env)
    freeze_loaded()
    # bounded shutdown: on SIGTERM (also the harness's death signal) a request that hangs
    # (a stuck policy call) must not keep this process alive after the harness is gone
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning",
                timeout_graceful_shutdown=SHUTDOWN_GRACE_S)
