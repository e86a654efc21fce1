"""Async client for the HTTP task contract: timeouts, bounded concurrency, bearer auth
from a named env var, retries with backoff for transport errors, 429 and 5xx."""

from __future__ import annotations

import asyncio
import json
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import Any, Callable, TypeVar

import aiohttp
from pydantic import BaseModel, ValidationError

from harness.contract import (
    DEFAULT_ROUTES,
    HealthResponse,
    MetadataResponse,
    ProgramResponse,
    RolloutRequest,
    RolloutResponse,
    Task,
    TasksetResponse,
    TasksRequest,
    TasksResponse,
)
from harness.api_key import bearer_headers, read_key
from harness.errors import CameBack, ContractViolation, FailureKind, ServiceError, Unreachable, first_error, redact
from harness.http_pool import SharedSession, transport_failure
from harness.retry import AttemptFailed, RetryPolicy

M = TypeVar("M", bound=BaseModel)

# A gate is entered around each rollout: shared limits across runs (see harness.sweep.limits).
Gate = Callable[[], AbstractAsyncContextManager[Any]]


def _body_reason(content: bytes) -> str:
    """The reason a container gave in an error body (`detail`, `error`, `status_detail`,
    `message`), else the body's start."""
    try:
        payload = json.loads(content)
    except ValueError:
        payload = None
    if isinstance(payload, dict):
        for key in ("detail", "error", "status_detail", "message"):
            value = payload.get(key)
            if isinstance(value, dict):
                value = value.get("message") or value.get("detail") or value
            if value:
                return (value if isinstance(value, str) else str(value))[:300]
    return content.decode("utf-8", errors="replace")[:200]


class ContainerClient:
    """Speaks the task contract to one container."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key_env: str | None = None,
        concurrency: int = 8,
        timeout_s: float = 120.0,
        retry: RetryPolicy | None = None,
        gate: Gate | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.api_key_env = api_key_env
        self._gate = gate
        self.retry = retry or RetryPolicy()
        self._limit = asyncio.Semaphore(concurrency)
        self._session = SharedSession(timeout_s)
        # route name -> path; a container's advertised routes replace these (use_routes)
        self.routes = dict(DEFAULT_ROUTES)

    def use_routes(self, metadata: MetadataResponse) -> dict[str, str]:
        """Follow the routes a container advertises in metadata.optimizer_contracts.gepa."""
        advertised = metadata.routes()
        self.routes.update(advertised)
        return advertised

    def _key(self) -> str | None:
        return read_key(self.api_key_env, f"container key for {self.base_url}")

    async def _call(self, method: str, name: str, model: type[M], body: Any = None,
                    answers: list[str] | None = None) -> M:
        """One call of the route called `name` (`body`: a JSON value, or JSON already encoded
        as bytes); error answers of earlier attempts are appended to `answers` (so a retry
        that succeeds does not hide them)."""
        route = self.routes[name]
        url = f"{self.base_url}{route}"
        key = self._key()
        headers = bearer_headers(key)
        async with self._limit:
            return await self._attempts(method, route, url, model, body, headers, key,
                                        answers if answers is not None else [])

    def _auth_hint(self, status: int) -> str:
        if status not in (401, 403):
            return ""
        if self.api_key_env:
            return f" (the container refused the key in ${self.api_key_env}: check that it holds the container's key)"
        return " (the container wants a bearer key: set container.api_key_env to the variable holding it)"

    async def _attempts(self, method: str, route: str, url: str, model: type[M], body: Any,
                        headers: dict[str, str], key: str | None, answers: list[str]) -> M:
        # The process was seen gone (connection refused or dropped) during this call, and the
        # last attempt also got no HTTP answer: the caller may restart it. A timeout on the
        # last attempt counts too: it may have reached a process that was still starting. Seen
        # gone, then answered with a retryable failure: the caller may send it once more.
        seen_down = no_answer = False
        payload = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
        if payload is not None:
            headers = {**headers, "Content-Type": "application/json"}

        async def attempt() -> M:
            nonlocal seen_down, no_answer
            try:
                status, content, retry_after = await self._session.send(method, url, payload, headers)
            except (TimeoutError, aiohttp.ClientError) as exc:
                name, gone = transport_failure(exc)
                no_answer, seen_down = True, seen_down or gone
                raise AttemptFailed(name, FailureKind.TRANSIENT) from exc
            no_answer = False
            if status == 200:
                return self._parse(route, content, model)
            error = f"HTTP {status}: {redact(_body_reason(content), key)}{self._auth_hint(status)}"
            answers.append(error)
            raise AttemptFailed.from_status(error, status, retry_after)

        try:
            return await self.retry.run(attempt)
        except AttemptFailed as exc:
            message = f"{method} {route} failed ({exc.kind.value}): {exc}"
            if seen_down and no_answer:
                raise Unreachable(message) from None
            if seen_down and exc.kind is not FailureKind.FATAL:
                raise CameBack(message, exc.kind) from None
            raise ServiceError(message, exc.kind) from None

    @staticmethod
    def _parse(route: str, content: bytes, model: type[M]) -> M:
        # parsed and validated in one pass by pydantic-core: a third less CPU than json.loads
        # and then validating the dict, on every rollout
        try:
            return model.model_validate_json(content)
        except ValidationError as exc:
            if exc.errors(include_url=False)[0]["type"] == "json_invalid":
                raise ContractViolation(f"{route}: response is not JSON") from exc
            error = first_error(exc)
            raise ContractViolation(f"{route}: malformed response, field '{error.where or '(body)'}': "
                                    f"{error.message}") from exc

    async def health(self) -> HealthResponse:
        return await self._call("GET", "health", HealthResponse)

    async def metadata(self) -> MetadataResponse:
        return await self._call("GET", "metadata", MetadataResponse)

    async def program(self) -> ProgramResponse:
        return await self._call("GET", "program", ProgramResponse)

    async def taskset(self) -> TasksetResponse:
        return await self._call("GET", "taskset", TasksetResponse)

    async def tasks(self, split: str, task_ids: list[str]) -> list[Task]:
        body = TasksRequest(split=split, task_ids=task_ids).model_dump()
        response = await self._call("POST", "tasks", TasksResponse, body)
        returned = [task.task_id for task in response.tasks]
        if returned != task_ids:
            missing = sorted(set(task_ids) - set(returned))
            raise ContractViolation(f"{self.routes['tasks']}: asked for {len(task_ids)} ids, missing {missing[:5]}")
        return response.tasks

    async def task_info(self) -> dict[str, Any] | None:
        try:
            return (await self._call("GET", "task_info", _AnyBody)).model_dump()
        except ServiceError as exc:
            if exc.kind is FailureKind.FATAL:
                return None  # optional route
            raise

    async def rollout(self, request: RolloutRequest, answers: list[str] | None = None) -> RolloutResponse:
        """One rollout. Error answers of attempts before the one that returned go to
        `answers`: a container that failed a rollout with a reason, then answered the retry
        from a stored record, keeps its first reason in the evidence."""
        # encoded once, by pydantic's serializer: a dict dumped and then encoded by httpx's json
        # cost twice as much, per rollout (the same JSON)
        body = request.model_dump_json(exclude_none=True).encode()
        async with (self._gate() if self._gate else nullcontext()):
            response = await self._call("POST", "rollout", RolloutResponse, body, answers)
        if response.rollout_id is None:
            response = response.model_copy(update={"rollout_id": request.rollout_id})
        if response.rollout_id != request.rollout_id:
            raise ContractViolation(
                f"{self.routes['rollout']}: answered rollout_id {response.rollout_id!r} for request {request.rollout_id!r}"
            )
        return response

    async def aclose(self) -> None:
        await self._session.aclose()


class _AnyBody(BaseModel):
    model_config = {"extra": "allow"}
