"""Chat completions with OpenAI function tools: raw message dicts in (assistant tool calls,
tool results), text and parsed tool calls out. A subclass of the harness's ChatClient so
keys, retries and failure labels are the same; ChatClient itself is unchanged."""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict

from harness.errors import FailureKind, ServiceError, classify_status
from harness.llm import ChatClient, _retry_after_seconds

MAX_RETRY_AFTER_S = 60.0


class ToolCall(BaseModel):
    model_config = ConfigDict(frozen=True)
    id: str
    name: str
    arguments: dict[str, Any] | None  # None when the model's arguments were not a JSON object
    raw_arguments: str


class ChatTurn(BaseModel):
    model_config = ConfigDict(frozen=True)
    content: str
    tool_calls: list[ToolCall]
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    finish_reason: str | None = None

    def assistant_message(self) -> dict[str, Any]:
        """The message to append to the history, in the request format."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content or None}
        if self.tool_calls:
            message["tool_calls"] = [{"id": c.id, "type": "function",
                                      "function": {"name": c.name, "arguments": c.raw_arguments}}
                                     for c in self.tool_calls]
        elif message["content"] is None:
            message["content"] = ""
        return message


def _parse_calls(raw_calls: Any, turn_index: int) -> list[ToolCall]:
    calls = []
    for k, raw in enumerate(raw_calls or []):
        function = (raw or {}).get("function") or {}
        arguments = function.get("arguments")
        if isinstance(arguments, dict):  # some servers send an object instead of a JSON string
            text, parsed = json.dumps(arguments), arguments
        else:
            text = arguments if isinstance(arguments, str) else ""
            try:
                loaded = json.loads(text) if text.strip() else {}
            except json.JSONDecodeError:
                loaded = None
            parsed = loaded if isinstance(loaded, dict) else None
        # Local servers sometimes omit ids; the tool result must still point at its call.
        calls.append(ToolCall(id=str(raw.get("id") or f"call_{turn_index}_{k}"), name=str(function.get("name") or ""),
                              arguments=parsed, raw_arguments=text))
    return calls


class ToolChatClient(ChatClient):
    async def chat(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
                   temperature: float = 0.0, max_tokens: int = 512, seed: int | None = None,
                   turn_index: int = 0) -> ChatTurn:
        body: dict[str, Any] = {"model": self.model, "messages": messages, "temperature": temperature,
                                "max_tokens": max_tokens}
        if tools:
            body["tools"] = tools
        if seed is not None:
            body["seed"] = seed
        url = f"{self.base_url}/chat/completions"
        headers = self._headers()
        key = headers.get("Authorization", "").removeprefix("Bearer ")
        last_error, kind = "no attempt made", FailureKind.TRANSIENT
        for attempt in range(self.retry.attempts):
            started, wait = time.perf_counter(), None
            try:
                response = await self._client.post(url, json=body, headers=headers)
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                last_error, kind = f"{type(exc).__name__} calling {url}", FailureKind.TRANSIENT
            else:
                if response.status_code == 200:
                    try:
                        return self._turn(response, time.perf_counter() - started, turn_index)
                    except ServiceError as exc:  # a garbled body from a flaky endpoint: try again
                        last_error, kind = str(exc), exc.kind
                else:
                    kind = classify_status(response.status_code)
                    text = response.text[:200]
                    # an endpoint that echoes the request must not put the key into a trace
                    last_error = f"HTTP {response.status_code} from {url}: {text.replace(key, '[redacted]') if key else text}"
                    if kind is FailureKind.FATAL:
                        break
                    wait = _retry_after_seconds(response)
            if attempt + 1 < self.retry.attempts:
                backoff = min(self.retry.max_delay_s, self.retry.base_delay_s * 2**attempt) * (0.5 + random.random())
                # a Retry-After hours away fails the episode rather than stalling the run
                await asyncio.sleep(min(wait, MAX_RETRY_AFTER_S) if wait is not None else backoff)
        raise ServiceError(f"model call failed ({kind.value}): {last_error}", kind)

    def _turn(self, response: httpx.Response, latency_s: float, turn_index: int) -> ChatTurn:
        try:
            payload = response.json()
            choice = payload["choices"][0]
            message = choice["message"]
            usage = payload.get("usage") or {}
            calls = _parse_calls(message.get("tool_calls"), turn_index)
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise ServiceError(f"malformed completion from {self.base_url}: {type(exc).__name__}",
                               FailureKind.TRANSIENT) from exc
        return ChatTurn(content=message.get("content") or "", tool_calls=calls,
                        prompt_tokens=int(usage.get("prompt_tokens") or 0),
                        completion_tokens=int(usage.get("completion_tokens") or 0),
                        latency_s=latency_s, finish_reason=choice.get("finish_reason"))
