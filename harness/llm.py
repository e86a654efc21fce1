"""OpenAI-compatible chat client: the one place model calls are made and retried.

Used by the optimizer for the proposer and by the container kit for the policy. The key
is read from a named environment variable at call time and never stored in a model.
"""

from __future__ import annotations

import asyncio
import copy
import os
import random
import time
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import Any, Callable

import httpx
from pydantic import BaseModel, ConfigDict

from harness.errors import ConfigError, FailureKind, ServiceError, classify_status, redact


class ChatMessage(BaseModel):
    model_config = ConfigDict(frozen=True)
    role: str
    content: str


class ChatResult(BaseModel):
    model_config = ConfigDict(frozen=True)
    text: str
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    finish_reason: str | None = None


class RetryPolicy(BaseModel):
    model_config = ConfigDict(frozen=True)
    attempts: int = 4
    base_delay_s: float = 0.5
    max_delay_s: float = 20.0
    # a server's Retry-After is honoured up to this: a quota reset hours away fails the
    # call (and its row) instead of stalling the run for hours
    max_retry_after_s: float = 60.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait before attempt `attempt + 1`: the server's Retry-After (capped),
        else exponential backoff with jitter (capped)."""
        if retry_after is not None:
            return min(retry_after, self.max_retry_after_s)
        return min(self.max_delay_s, self.base_delay_s * 2**attempt * (0.5 + random.random()))


def _retry_after_seconds(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


class ChatClient:
    """Async client for one OpenAI-compatible endpoint (`.../v1`)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str | None = None,
        timeout_s: float = 120.0,
        retry: RetryPolicy | None = None,
        client: httpx.AsyncClient | None = None,
        gate: Callable[[], AbstractAsyncContextManager[Any]] | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self.retry = retry or RetryPolicy()
        self._client = client or httpx.AsyncClient(timeout=timeout_s)
        self._owns_client = client is None
        self._gate = gate

    def with_base_url(self, base_url: str) -> "ChatClient":
        """This client (connection pool, gate, retry policy) aimed at another URL: the
        gateway attributes each proposer call by its URL."""
        clone = copy.copy(self)
        clone.base_url = base_url.rstrip("/")
        clone._owns_client = False
        return clone

    def _key(self) -> str | None:
        if not self.api_key_env:
            return None
        key = os.environ.get(self.api_key_env)
        if not key:
            raise ConfigError(f"environment variable {self.api_key_env} is not set (API key for {self.base_url})")
        return key

    def _headers(self) -> dict[str, str]:
        key = self._key()
        return {"Authorization": f"Bearer {key}"} if key else {}

    async def complete(self, messages: list[ChatMessage], **kwargs: Any) -> ChatResult:
        async with (self._gate() if self._gate else nullcontext()):
            return await self._complete(messages, **kwargs)

    async def _complete(
        self,
        messages: list[ChatMessage],
        *,
        temperature: float = 0.0,
        max_tokens: int = 256,
        seed: int | None = None,
    ) -> ChatResult:
        body: dict = {
            "model": self.model,
            "messages": [m.model_dump() for m in messages],
            "temperature": temperature,
            "max_tokens": max_tokens,
        }
        if seed is not None:
            body["seed"] = seed
        url = f"{self.base_url}/chat/completions"
        key = self._key()
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        last_error = "no attempt made"
        kind = FailureKind.TRANSIENT
        for attempt in range(self.retry.attempts):
            started = time.perf_counter()
            wait: float | None = None
            try:
                response = await self._client.post(url, json=body, headers=headers)
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                last_error, kind = f"{type(exc).__name__} calling {url}", FailureKind.TRANSIENT
            else:
                if response.status_code == 200:
                    try:
                        return self._parse(response, time.perf_counter() - started)
                    except ServiceError as exc:  # a garbled body from a flaky endpoint: try again
                        last_error, kind = str(exc), exc.kind
                else:
                    kind = classify_status(response.status_code)
                    last_error = f"HTTP {response.status_code} from {url}: {redact(response.text[:200], key)}"
                    if kind is FailureKind.FATAL:
                        break
                    wait = _retry_after_seconds(response)
            if attempt + 1 < self.retry.attempts:
                await asyncio.sleep(self.retry.delay(attempt, wait))
        raise ServiceError(f"model call failed ({kind.value}): {last_error}", kind)

    def _parse(self, response: httpx.Response, latency_s: float) -> ChatResult:
        try:
            payload = response.json()
            choice = payload["choices"][0]
            text = choice["message"].get("content") or ""
            usage = payload.get("usage") or {}
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise ServiceError(
                f"malformed completion from {self.base_url}: {type(exc).__name__}", FailureKind.TRANSIENT
            ) from exc
        return ChatResult(
            text=text,
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            latency_s=latency_s,
            finish_reason=choice.get("finish_reason"),
        )

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()
