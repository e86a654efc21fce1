"""Async client for the HTTP task contract: timeouts, bounded concurrency, bearer auth
from a named env var, retries with backoff for transport errors, 429 and 5xx."""

from __future__ import annotations

import asyncio
import os
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import Any, Callable, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from harness.contract import (
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
from harness.errors import (
    ConfigError,
    ContractViolation,
    FailureKind,
    ServiceError,
    Unreachable,
    classify_status,
    redact,
)
from harness.http_pool import ClientPerCall
from harness.llm import RetryPolicy, _retry_after_seconds

M = TypeVar("M", bound=BaseModel)
# Transport errors that mean the process behind the url is gone: nothing accepts the
# connection, or it closed one without answering (it exited mid-request).
_PROCESS_GONE = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError)

# A gate is entered around each rollout: shared limits across runs (see harness.sweep.limits).
Gate = Callable[[], AbstractAsyncContextManager[Any]]


def _describe(exc: ValidationError) -> str:
    first = exc.errors()[0]
    location = ".".join(str(part) for part in first["loc"]) or "(body)"
    return f"field '{location}': {first['msg']}"


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
        self._clients = ClientPerCall(timeout_s)  # see harness/http_pool.py

    def _key(self) -> str | None:
        if not self.api_key_env:
            return None
        key = os.environ.get(self.api_key_env)
        if not key:
            raise ConfigError(f"environment variable {self.api_key_env} is not set (container key for {self.base_url})")
        return key

    async def _call(self, method: str, route: str, model: type[M], body: Any = None) -> M:
        url = f"{self.base_url}{route}"
        key = self._key()
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        async with self._limit, self._clients.client() as http:
            return await self._attempts(http, method, route, url, model, body, headers, key)

    async def _attempts(self, http: httpx.AsyncClient, method: str, route: str, url: str, model: type[M], body: Any,
                        headers: dict[str, str], key: str | None) -> M:
        last_error, kind = "no attempt made", FailureKind.TRANSIENT
        # The process was seen gone (connection refused or dropped) during this call, and the
        # last attempt also got no HTTP answer: the caller may restart it. A timeout on the
        # last attempt counts too: it may have reached a process that was still starting.
        seen_down = no_answer = False
        for attempt in range(self.retry.attempts):
            wait: float | None = None
            try:
                response = await http.request(method, url, json=body, headers=headers)
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                last_error, kind, no_answer = f"{type(exc).__name__}", FailureKind.TRANSIENT, True
                seen_down = seen_down or isinstance(exc, _PROCESS_GONE)
            else:
                no_answer = False
                if response.status_code == 200:
                    return self._parse(route, response, model)
                kind = classify_status(response.status_code)
                last_error = f"HTTP {response.status_code}: {redact(response.text[:200], key)}"
                if kind is FailureKind.FATAL:
                    break
                wait = _retry_after_seconds(response)
            if attempt + 1 < self.retry.attempts:
                await asyncio.sleep(self.retry.delay(attempt, wait))
        message = f"{method} {route} failed ({kind.value}): {last_error}"
        if seen_down and no_answer:
            raise Unreachable(message)
        raise ServiceError(message, kind)

    @staticmethod
    def _parse(route: str, response: httpx.Response, model: type[M]) -> M:
        try:
            payload = response.json()
        except ValueError as exc:
            raise ContractViolation(f"{route}: response is not JSON") from exc
        try:
            return model.model_validate(payload)
        except ValidationError as exc:
            raise ContractViolation(f"{route}: malformed response, {_describe(exc)}") from exc

    async def health(self) -> HealthResponse:
        return await self._call("GET", "/health", HealthResponse)

    async def metadata(self) -> MetadataResponse:
        return await self._call("GET", "/metadata", MetadataResponse)

    async def program(self) -> ProgramResponse:
        return await self._call("GET", "/program", ProgramResponse)

    async def taskset(self) -> TasksetResponse:
        return await self._call("GET", "/taskset", TasksetResponse)

    async def tasks(self, split: str, task_ids: list[str]) -> list[Task]:
        body = TasksRequest(split=split, task_ids=task_ids).model_dump()
        response = await self._call("POST", "/taskset/tasks", TasksResponse, body)
        returned = [task.task_id for task in response.tasks]
        if returned != task_ids:
            missing = sorted(set(task_ids) - set(returned))
            raise ContractViolation(f"/taskset/tasks: asked for {len(task_ids)} ids, missing {missing[:5]}")
        return response.tasks

    async def task_info(self) -> dict[str, Any] | None:
        try:
            return (await self._call("GET", "/task_info", _AnyBody)).model_dump()
        except ServiceError as exc:
            if exc.kind is FailureKind.FATAL:
                return None  # optional route
            raise

    async def rollout(self, request: RolloutRequest) -> RolloutResponse:
        async with (self._gate() if self._gate else nullcontext()):
            response = await self._call("POST", "/rollout", RolloutResponse, request.model_dump(exclude_none=True))
        if response.rollout_id != request.rollout_id:
            raise ContractViolation(
                f"/rollout: answered rollout_id {response.rollout_id!r} for request {request.rollout_id!r}"
            )
        return response

    async def aclose(self) -> None:
        await self._clients.aclose()


class _AnyBody(BaseModel):
    model_config = {"extra": "allow"}
