"""The gateway's ASGI app (Starlette: no per-request validation layers on the hot path).

Model routes, OpenAI-compatible below `/v1`:
- `/r/<run_id>/<scope>/<role>/v1/...`: attributed. The harness hands each rollout such a
  URL (scope = rollout id) and calls the proposer through one per call, so attribution
  needs no cooperation from the container. The run registered which upstream serves each
  role; `grader` and `user_simulator` default to the policy's upstream.
- `/u/<upstream>/v1/...`: unattributed (anything outside a run).

Control routes: `POST /admin/upstreams` (needs the admin token Services generated: an
upstream names the key variable the gateway will send, so registering one is privileged),
`POST /runs/<id>` (register: roles, USD budget), `POST /runs/<id>/scopes` (rollouts about to
start), `GET /runs/<id>/spend`, `GET /runs/<id>/calls`, `DELETE /runs/<id>`, `GET /usage`,
`GET /limits`, `GET /health`.
"""

from __future__ import annotations

import hmac
from contextlib import asynccontextmanager
from typing import AsyncIterator, TypeVar

import httpx
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from harness.gateway.forward import CLIENT_SHARDS, CONNECTIONS_PER_SHARD, Gateway, error_response as _error
from harness.gateway.ledger import RunLedger
from harness.gateway.models import ROLES, Announcement, CallRecord, GatewaySettings, RunRegistration, Upstream

M = TypeVar("M", bound=BaseModel)
_RECORDS = TypeAdapter(list[CallRecord])


def _model(cls: type[M], payload: bytes) -> M | JSONResponse:
    try:
        return cls.model_validate_json(payload or b"{}")
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(body)"
        return _error(422, "invalid_request", f"gateway: {cls.__name__} field {where}: {first['msg']}")


def create_app(settings: GatewaySettings, *, admin_token: str | None = None,
               upstreams: list[Upstream] | None = None) -> Starlette:
    gateway = Gateway(settings, admin_token, list(upstreams or ()))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        timeout = httpx.Timeout(settings.timeout_s, connect=settings.connect_timeout_s)
        limits = httpx.Limits(max_connections=CONNECTIONS_PER_SHARD, max_keepalive_connections=CONNECTIONS_PER_SHARD)
        tls = httpx.create_ssl_context()  # loading the CA bundle takes ~50 ms: once, not per shard
        gateway.clients = [httpx.AsyncClient(timeout=timeout, limits=limits, verify=tls) for _ in range(CLIENT_SHARDS)]
        try:
            yield
        finally:
            for client in gateway.clients:
                await client.aclose()
        if gateway.store is not None:
            gateway.store.close()

    def run_of(request: Request) -> RunLedger | JSONResponse:
        run_id = request.path_params["run_id"]
        run = gateway.ledger.runs.get(run_id)
        return run if run is not None else _error(404, "unknown_run", f"gateway: run {run_id!r} is not registered")

    async def attributed(request: Request) -> Response:
        run = run_of(request)
        if isinstance(run, Response):
            return run
        role = request.path_params["role"]
        upstream = run.upstream_for(role)
        if role not in ROLES or upstream is None:
            return _error(404, "unknown_role", f"gateway: run {run.run_id!r} has no upstream for role {role!r}")
        return await gateway.call(request, run, request.path_params["scope"], role, upstream,
                                  request.path_params["endpoint"])

    async def unattributed(request: Request) -> Response:
        return await gateway.call(request, None, None, "policy", request.path_params["upstream"],
                                  request.path_params["endpoint"])

    async def add_upstream(request: Request) -> Response:
        given = request.headers.get("x-gateway-admin", "")
        if gateway.admin_token and not hmac.compare_digest(given.encode(), gateway.admin_token.encode()):
            return _error(403, "forbidden", "gateway: registering an upstream needs the admin token")
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
        gateway.ledger.register(request.path_params["run_id"], registration)
        return JSONResponse({"registered": request.path_params["run_id"]})

    async def announce(request: Request) -> Response:
        run = run_of(request)
        if isinstance(run, Response):
            return run
        announcement = _model(Announcement, await request.body())
        if isinstance(announcement, Response):
            return announcement
        run.announce(announcement)
        return JSONResponse({"scopes": len(announcement.scopes)})

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
    routes = [
        Route("/r/{run_id}/{scope}/{role}/v1/{endpoint:path}", attributed, methods=model_methods),
        Route("/u/{upstream}/v1/{endpoint:path}", unattributed, methods=model_methods),
        Route("/admin/upstreams", add_upstream, methods=["POST"]),
        Route("/runs/{run_id}", register_run, methods=["POST"]),
        Route("/runs/{run_id}", drop_run, methods=["DELETE"]),
        Route("/runs/{run_id}/scopes", announce, methods=["POST"]),
        Route("/runs/{run_id}/spend", spend, methods=["GET"]),
        Route("/runs/{run_id}/calls", calls, methods=["GET"]),
        Route("/usage", usage, methods=["GET"]),
        Route("/limits", limits, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.gateway = gateway
    return app
