"""OpenAI-compatible chat client: the one place model calls are made and retried.

Used by the optimizer for the proposer and by the container kit for the policy. The key
is read from a named environment variable at call time and never stored in a model.
"""

from __future__ import annotations

import copy
import json
import time
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import Any, Callable, TypeVar

import aiohttp
from pydantic import BaseModel, ConfigDict

from harness.api_key import bearer_headers, read_key
from harness.errors import FailureKind, ServiceError, hide_capabilities, redact
from harness.http_pool import SharedSession, transport_failure
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
        client: SharedSession | None = None,
        gate: Callable[[], AbstractAsyncContextManager[Any]] | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self.retry = retry or RetryPolicy()
        # a caller's session (a container's, for all its rollouts) is the caller's to close
        self._session = client or SharedSession(timeout_s)
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

    async def _post(self, body: dict[str, Any], parse: Callable[[dict[str, Any], float], R]) -> R:
        """POST a chat completion under the retry policy; `parse` reads a 200 answer's JSON
        (given its latency) and raises a ServiceError for a garbled one, which is tried again."""
        url = f"{self.base_url}/chat/completions"
        shown = hide_capabilities(url)  # for error text
        key = self._key()
        headers = {**bearer_headers(key), "Content-Type": "application/json"}
        payload = json.dumps(body).encode()

        async def attempt() -> R:
            started = time.perf_counter()
            try:
                status, content, retry_after = await self._session.send("POST", url, payload, headers)
            except (TimeoutError, aiohttp.ClientError) as exc:
                raise AttemptFailed(f"{transport_failure(exc)[0]} calling {shown}", FailureKind.TRANSIENT) from exc
            text = content.decode("utf-8", errors="replace")
            if status != 200:
                # an endpoint that echoes the request must not put the key into an error
                reason = hide_capabilities(redact(text[:200], key))
                raise AttemptFailed.from_status(f"HTTP {status} from {shown}: {reason}", status, retry_after)
            try:
                try:
                    answer = json.loads(text)
                except ValueError as exc:
                    raise ServiceError(f"malformed completion from {hide_capabilities(self.base_url)}: "
                                       f"{type(exc).__name__}", FailureKind.TRANSIENT) from exc
                return parse(answer, time.perf_counter() - started)
            except ServiceError as exc:  # a garbled body from a flaky endpoint: try again
                raise AttemptFailed(str(exc), exc.kind) from exc

        try:
            return await self.retry.run(attempt)
        except AttemptFailed as exc:
            raise ServiceError(f"model call failed ({exc.kind.value}): {exc}", exc.kind) from None

    def _parse(self, payload: dict[str, Any], latency_s: float) -> ChatResult:
        try:
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
        if self._owns_client:
            await self._session.aclose()
