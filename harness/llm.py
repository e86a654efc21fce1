"""OpenAI-compatible chat client: the one place model calls are made and retried.

Used by the optimizer for the proposer and by the container kit for the policy. The key
is read from a named environment variable at call time and never stored in a model.
"""

from __future__ import annotations

import copy
import time
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import Any, Callable, TypeVar

import httpx
from pydantic import BaseModel, ConfigDict

from harness.api_key import bearer_headers, read_key
from harness.errors import FailureKind, ServiceError, hide_capabilities, redact
from harness.http_pool import ClientPerCall
from harness.retry import AttemptFailed, RetryPolicy

R = TypeVar("R")


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
        client: httpx.AsyncClient | ClientPerCall | None = None,
        gate: Callable[[], AbstractAsyncContextManager[Any]] | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self.retry = retry or RetryPolicy()
        # without a caller's client, one single-connection client per call in flight: httpx's
        # shared pool costs more per request the more requests wait in it (http_pool.py);
        # a caller's ClientPerCall shares those clients between ChatClients (a container's rollouts)
        self._client = client if isinstance(client, httpx.AsyncClient) else None
        self._pool = client if isinstance(client, ClientPerCall) else ClientPerCall(timeout_s) if client is None else None
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
        return read_key(self.api_key_env, f"API key for {self.base_url}")

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
        return await self._post(body, self._parse)

    async def _post(self, body: dict[str, Any], parse: Callable[[httpx.Response, float], R]) -> R:
        """POST a chat completion under the retry policy; `parse` reads a 200 answer (given
        its latency) and raises a ServiceError for a garbled one, which is tried again."""
        url = f"{self.base_url}/chat/completions"
        shown = hide_capabilities(url)  # for error text
        key = self._key()
        headers = bearer_headers(key)

        async def attempt() -> R:
            started = time.perf_counter()
            try:
                response = await self._send(url, body, headers)
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                raise AttemptFailed(f"{type(exc).__name__} calling {shown}", FailureKind.TRANSIENT) from exc
            if response.status_code != 200:
                # an endpoint that echoes the request must not put the key into an error
                raise AttemptFailed.from_response(
                    f"HTTP {response.status_code} from {shown}: {hide_capabilities(redact(response.text[:200], key))}",
                    response)
            try:
                return parse(response, time.perf_counter() - started)
            except ServiceError as exc:  # a garbled body from a flaky endpoint: try again
                raise AttemptFailed(str(exc), exc.kind) from exc

        try:
            return await self.retry.run(attempt)
        except AttemptFailed as exc:
            raise ServiceError(f"model call failed ({exc.kind.value}): {exc}", exc.kind) from None

    async def _send(self, url: str, body: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
        if self._client is not None:
            return await self._client.post(url, json=body, headers=headers)
        assert self._pool is not None
        async with self._pool.client() as http:
            return await http.post(url, json=body, headers=headers)

    def _parse(self, response: httpx.Response, latency_s: float) -> ChatResult:
        try:
            payload = response.json()
            choice = payload["choices"][0]
            text = choice["message"].get("content") or ""
            usage = payload.get("usage") or {}
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise ServiceError(
                f"malformed completion from {hide_capabilities(self.base_url)}: {type(exc).__name__}",
                FailureKind.TRANSIENT
            ) from exc
        return ChatResult(
            text=text,
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            latency_s=latency_s,
            finish_reason=choice.get("finish_reason"),
        )

    async def aclose(self) -> None:
        if self._owns_client and self._pool is not None:
            await self._pool.aclose()
