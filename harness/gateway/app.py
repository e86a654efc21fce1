"""The gateway's ASGI app (Starlette: no per-request validation layers on the hot path).

Model routes, OpenAI-compatible below `/v1`:
- `/c/<token>/r/<run_id>/<scope>/<role>/v1/...`: attributed. The harness hands each rollout
  such a URL (scope = rollout id, token = that rollout's capability) and calls the proposer
  through one per call (with the run's token), so attribution and authority need no
  cooperation from the container, which passes on only a base URL. A rollout's token
  spends only in its scope while the rollout is open; the run registered which upstream
  serves each role; `grader` and `user_simulator` default to the policy's upstream.
- `/u/<upstream>/v1/...`: unattributed (anything outside a run): admin token only.

Control routes, all with `Authorization: Bearer <admin token>` (the driver's; see
server.py): `POST /admin/upstreams`, `POST /runs/<id>` (register: roles, USD budget; a taken
id is refused), `POST /runs/<id>/scopes` (rollouts about to start), `POST
/runs/<id>/scopes/close`, `GET /runs/<id>/spend`, `GET /runs/<id>/calls`, `DELETE
/runs/<id>`, `GET /usage`. Open: `GET /limits`, `GET /health`.
"""

from __future__ import annotations

import hmac
import secrets
from contextlib import asynccontextmanager
from typing import AsyncIterator, TypeVar

import aiohttp
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.middleware import Middleware
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from harness.body_limit import BodyLimit
from harness.errors import first_error
from harness.http_pool import tls_context
from harness.gateway.forward import MAX_CONNECTIONS, Gateway, error_response as _error
from harness.gateway.ledger import RunLedger
from harness.gateway.models import (
    ROLES,
    Announcement,
    CallRecord,
    GatewaySettings,
    RunGrant,
    RunRegistration,
    ScopeClosing,
    ScopeGrants,
    Upstream,
)

M = TypeVar("M", bound=BaseModel)
_RECORDS = TypeAdapter(list[CallRecord])


def _model(cls: type[M], payload: bytes) -> M | JSONResponse:
    try:
        return cls.model_validate_json(payload or b"{}")
    except ValidationError as exc:
        error = first_error(exc)
        return _error(422, "invalid_request", f"gateway: {cls.__name__} field {error.where or '(body)'}: {error.message}")


class ModelCallsFirst:
    """The attributed model route, the gateway's hot path, goes from the body limit straight
    to its handler; every other request goes to the Starlette app. Starlette's router and
    its two exception layers cost about as much per call as the gateway's own bookkeeping,
    and the model handler answers every failure it knows itself (anything else reaches
    uvicorn, which answers 500 as Starlette's error layer did)."""

    def __init__(self, app: Starlette, route: Route, max_body_bytes: int):
        self.app = app
        self.state = app.state  # the gateway's state, as on the Starlette app
        self.route = route
        self.model_call = BodyLimit(self._model_call, max_bytes=max_body_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            match, child_scope = self.route.matches(scope)
            if match is Match.FULL:
                scope.update(child_scope)
                await self.model_call(scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _model_call(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await self.route.endpoint(Request(scope, receive, send))
        await response(scope, receive, send)


def create_app(settings: GatewaySettings, *, admin_token: str | None = None,
               upstreams: list[Upstream] | None = None) -> ASGIApp:
    # without a token nobody can use the control routes (never: anybody can)
    admin = (admin_token or secrets.token_urlsafe(32)).encode()
    gateway = Gateway(settings, admin_token, list(upstreams or ()))

    def is_admin(request: Request) -> bool:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), admin)

    def admin_only(handler):  # type: ignore[no-untyped-def]
        async def guarded(request: Request) -> Response:
            if not is_admin(request):
                return _error(401, "unauthorized", "gateway: this route needs the admin token "
                                                   "(Authorization: Bearer ...)")
            return await handler(request)
        return guarded

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # aiohttp, not httpx, upstream: its C response parser and flat pool cost a fraction
        # of httpx's per call, the larger part of the gateway's own work. Timeouts as httpx's
        # were: timeout_s for a free connection and for each read, connect_timeout_s to connect.
        timeout = aiohttp.ClientTimeout(total=None, connect=settings.timeout_s,
                                        sock_connect=settings.connect_timeout_s, sock_read=settings.timeout_s)
        # certifi's CA bundle and SSL_CERT_FILE, as httpx verifies
        connector = aiohttp.TCPConnector(limit=MAX_CONNECTIONS, limit_per_host=0, ssl=tls_context())
        # the environment's proxies are resolved once per upstream URL (Gateway._url), not per call
        gateway.http = aiohttp.ClientSession(connector=connector, timeout=timeout)
        try:
            yield
        finally:
            await gateway.http.close()
        if gateway.store is not None:
            gateway.store.close()

    def run_of(request: Request) -> RunLedger | JSONResponse:
        run_id = request.path_params["run_id"]
        run = gateway.ledger.runs.get(run_id)
        return run if run is not None else _error(404, "unknown_run", f"gateway: run {run_id!r} is not registered")

    async def attributed(request: Request) -> Response:
        run = gateway.ledger.runs.get(request.path_params["run_id"])
        scope, role = request.path_params["scope"], request.path_params["role"]
        # an unknown run and a wrong token answer alike: no probing for run ids
        problem = "unknown run or wrong token" if run is None else run.admits(request.path_params["token"], scope, role)
        if problem or run is None:
            return _error(403, "forbidden", f"gateway: {problem}")
        upstream = run.upstream_for(role)
        if role not in ROLES or upstream is None:
            return _error(404, "unknown_role", f"gateway: run {run.run_id!r} has no upstream for role {role!r}")
        return await gateway.call(request, run, scope, role, upstream, request.path_params["endpoint"])

    async def untokened(request: Request) -> Response:
        return _error(403, "forbidden", "gateway: a model call needs a capability URL (/c/<token>/r/...)")

    async def unattributed(request: Request) -> Response:
        return await gateway.call(request, None, None, "policy", request.path_params["upstream"],
                                  request.path_params["endpoint"])

    async def add_upstream(request: Request) -> Response:
        upstream = _model(Upstream, await request.body())
        if isinstance(upstream, Response):
            return upstream
        problem = gateway.register_upstream(upstream)
        if problem:
            return _error(409, "conflict", f"gateway: {problem}")
        return JSONResponse({"registered": upstream.name})

    async def register_run(request: Request) -> Response:
        registration = _model(RunRegistration, await request.body())
        if isinstance(registration, Response):
            return registration
        unknown = sorted(set(registration.upstreams.values()) - set(gateway.upstreams))
        if unknown:
            return _error(422, "unknown_upstream", f"gateway: no upstream named {unknown[0]!r}")
        run = gateway.ledger.register(request.path_params["run_id"], registration)
        if run is None:
            return _error(409, "conflict", f"gateway: run {request.path_params['run_id']!r} is already registered")
        return Response(RunGrant(registered=run.run_id, token=run.token).model_dump_json(),
                        media_type="application/json")

    async def announce(request: Request) -> Response:
        run = run_of(request)
        if isinstance(run, Response):
            return run
        announcement = _model(Announcement, await request.body())
        if isinstance(announcement, Response):
            return announcement
        return Response(ScopeGrants(tokens=run.announce(announcement)).model_dump_json(),
                        media_type="application/json")

    async def close_scopes(request: Request) -> Response:
        run = run_of(request)
        if isinstance(run, Response):
            return run
        closing = _model(ScopeClosing, await request.body())
        if isinstance(closing, Response):
            return closing
        run.close(closing.scopes)
        return JSONResponse({"closed": len(closing.scopes)})

    async def spend(request: Request) -> Response:
        run = run_of(request)
        return run if isinstance(run, Response) else Response(run.spend().model_dump_json(),
                                                              media_type="application/json")

    async def calls(request: Request) -> Response:
        run = run_of(request)
        if isinstance(run, Response):
            return run
        return Response(_RECORDS.dump_json(run.records), media_type="application/json")

    async def drop_run(request: Request) -> Response:
        gateway.ledger.runs.pop(request.path_params["run_id"], None)
        return JSONResponse({"dropped": request.path_params["run_id"]})

    async def usage(request: Request) -> Response:
        return Response(gateway.ledger.usage().model_dump_json(), media_type="application/json")

    async def limits(request: Request) -> Response:
        return JSONResponse(gateway.limiter.snapshot())

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "cache": settings.cache, "upstreams": sorted(gateway.upstreams)})

    model_methods = ["GET", "POST"]
    model_calls = Route("/c/{token}/r/{run_id}/{scope}/{role}/v1/{endpoint:path}", attributed, methods=model_methods)
    routes = [
        model_calls,
        Route("/r/{run_id}/{scope}/{role}/v1/{endpoint:path}", untokened, methods=model_methods),
        Route("/u/{upstream}/v1/{endpoint:path}", admin_only(unattributed), methods=model_methods),
        Route("/admin/upstreams", admin_only(add_upstream), methods=["POST"]),
        Route("/runs/{run_id}", admin_only(register_run), methods=["POST"]),
        Route("/runs/{run_id}", admin_only(drop_run), methods=["DELETE"]),
        Route("/runs/{run_id}/scopes", admin_only(announce), methods=["POST"]),
        Route("/runs/{run_id}/scopes/close", admin_only(close_scopes), methods=["POST"]),
        Route("/runs/{run_id}/spend", admin_only(spend), methods=["GET"]),
        Route("/runs/{run_id}/calls", admin_only(calls), methods=["GET"]),
        Route("/usage", admin_only(usage), methods=["GET"]),
        Route("/limits", limits, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, middleware=[Middleware(BodyLimit, max_bytes=settings.max_body_bytes)])
    app.state.gateway = gateway
    return ModelCallsFirst(app, model_calls, settings.max_body_bytes)
