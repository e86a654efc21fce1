"""Chat completions with OpenAI function tools: raw message dicts in (assistant tool calls,
tool results), text and parsed tool calls out. A subclass of the harness's ChatClient so
keys, retries and failure labels are the same: only the request body and the parse differ."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict

from harness.errors import FailureKind, ServiceError
from harness.llm import ChatClient


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


def parse_tool_calls(raw_calls: Any, turn_index: int) -> list[ToolCall]:
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
        return await self._post(body, lambda payload, latency_s: self._turn(payload, latency_s, turn_index))

    def _turn(self, payload: dict[str, Any], latency_s: float, turn_index: int) -> ChatTurn:
        try:
            choice = payload["choices"][0]
            message = choice["message"]
            usage = payload.get("usage") or {}
            calls = parse_tool_calls(message.get("tool_calls"), turn_index)
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise ServiceError(f"malformed completion from {self.base_url}: {type(exc).__name__}",
                               FailureKind.TRANSIENT) from exc
        return ChatTurn(content=message.get("content") or "", tool_calls=calls,
                        prompt_tokens=int(usage.get("prompt_tokens") or 0),
                        completion_tokens=int(usage.get("completion_tokens") or 0),
                        latency_s=latency_s, finish_reason=choice.get("finish_reason"))
