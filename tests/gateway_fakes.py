"""A fake OpenAI-compatible upstream for the gateway tests: real HTTP on loopback (served
by conftest.ServerThread), with a key it demands, usage it reports, and switches for
throttling (429/503 with Retry-After), latency and echoing the caller's key back."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from harness.scripted_model import RulesScript, role_of


@dataclass
class FakeUpstream:
    key: str | None = None  # the bearer key it demands
    delay_s: float = 0.0
    throttle_first: int = 0  # answer the first N requests with `throttle_status`
    throttle_status: int = 429
    retry_after: str | None = "1"
    throttle_above: int | None = None  # a real rate limit: 429 while more than this many are in flight
    echo_auth: bool = False  # put the Authorization header it got into the reply (a leaky upstream)
    # each call waits (up to 30 s) until this many have been in flight at once: a cap is then
    # reached whatever the machine's load, instead of only when the scheduler lines calls up
    hold_until_peak: int | None = None
    requests: int = 0
    completions: int = 0
    refused: int = 0
    throttled: int = 0
    in_flight: int = 0
    peak: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)

    def _throttle(self) -> JSONResponse:
        self.throttled += 1
        headers = {"Retry-After": self.retry_after} if self.retry_after is not None else {}
        return JSONResponse({"error": {"message": "slow down", "type": "rate_limit"}}, status_code=self.throttle_status,
                            headers=headers)

    async def chat(self, request: Request) -> JSONResponse:
        self.requests += 1
        auth = request.headers.get("authorization", "")
        if self.key is not None and auth != f"Bearer {self.key}":
            self.refused += 1
            return JSONResponse({"error": {"message": "bad key"}}, status_code=401)
        if self.requests <= self.throttle_first:
            return self._throttle()
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            if self.hold_until_peak is not None:
                deadline = time.monotonic() + 30
                while self.peak < self.hold_until_peak and time.monotonic() < deadline:
                    await asyncio.sleep(0.005)
            if self.throttle_above is not None and self.in_flight > self.throttle_above:
                return self._throttle()
            raw = await request.body()
            body = json.loads(raw)
            self.bodies.append(body)
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            messages = [m for m in body.get("messages", []) if isinstance(m, dict)]
            text = RulesScript().reply(messages, role_of(messages))
            self.completions += 1
            # tokens as a tokenizer would roughly count them: the estimate the gateway budgets with is exact
            completion = min(len(text.split()), int(body.get("max_tokens") or 256))
            payload: dict[str, Any] = {
                "id": f"fake-{self.completions}", "object": "chat.completion", "model": body.get("model"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": len(raw) // 4, "completion_tokens": completion,
                          "total_tokens": len(raw) // 4 + completion},
            }
            if self.echo_auth:
                payload["system_fingerprint"] = f"served for {auth}"
            return JSONResponse(payload)
        finally:
            self.in_flight -= 1

    async def models(self, request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "fake", "object": "model"}]})

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"]),
                                 Route("/v1/models", self.models, methods=["GET"])])


def chat_body(text: str, model: str = "gpt-4.1-mini", max_tokens: int = 16, system: str = "Be brief.") -> dict:
    return {"model": model, "max_tokens": max_tokens, "temperature": 0.0,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": text}]}
