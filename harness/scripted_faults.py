"""Scripts that fail on purpose, for fault-injection tests and soak runs of the scripted
model (harness.scripted_server serves them by name, like any script):

- `fail` / `fail_429`: always HTTP 500 / 429 (with `Retry-After: 0`).
- `flaky`: `rules`, except that a share of requests fail. Options follow the name as a query
  string (also as a model's `source`), e.g. `flaky?rate=0.05&kinds=429,503,empty&seed=0`:
  `rate` (share of distinct requests that fail), `kinds` (subset of `FLAKY_KINDS`: 429 with
  `Retry-After`, 429 without, 503, `slow` (answers after `slow_s` seconds, past a short
  client timeout), `empty` (a completion with no text), `garbage` (HTTP 200 whose body is
  not JSON)), `attempts` (how many times the same request fails before it is answered; 0:
  always), `seed`, `retry_after`, `slow_s`. Which requests fail depends on the seed, the
  request body and how often that body was seen, so a rerun fails the same requests.
  `/stats` counts the faults by kind.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from collections import Counter
from typing import Any

from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, field_validator

from harness.scripted_model import RulesScript, Script, ScriptError


class FailScript(Script):
    name = "fail"

    def reply(self, messages: list[dict[str, Any]], role: str) -> str:
        raise ScriptError(500)


class Fail429Script(Script):
    name = "fail_429"

    def reply(self, messages: list[dict[str, Any]], role: str) -> str:
        raise ScriptError(429, {"Retry-After": "0"})


FLAKY_KINDS = ("429", "429_bare", "503", "slow", "empty", "garbage")


class FlakyOptions(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    rate: float = Field(default=0.2, ge=0.0, le=1.0)
    kinds: tuple[str, ...] = FLAKY_KINDS
    seed: int = 0
    attempts: int = Field(default=1, ge=0)
    retry_after: float = Field(default=1.0, ge=0.0)
    slow_s: float = Field(default=5.0, gt=0.0)

    @field_validator("kinds", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        kinds = tuple(k.strip() for k in value.split(",") if k.strip()) if isinstance(value, str) else value
        unknown = sorted(set(kinds) - set(FLAKY_KINDS))
        if unknown or not kinds:
            raise ValueError(f"kinds must be a non-empty subset of {list(FLAKY_KINDS)}, got {list(kinds)}")
        return kinds


class FlakyScript(RulesScript):
    """`rules`, with faults decided per request by `fault_for` (see the module docstring)."""

    name = "flaky"

    def __init__(self, replies: list[str] | None = None, options: FlakyOptions | None = None):
        super().__init__(replies)
        self.options = options or FlakyOptions()
        self.faults: Counter[str] = Counter()
        self._seen: Counter[str] = Counter()

    def fault_for(self, body: dict[str, Any]) -> str | None:
        options = self.options
        key = hashlib.sha256(f"{options.seed}:{json.dumps(body, sort_keys=True)}".encode()).digest()
        if int.from_bytes(key[:8], "big") / 2**64 >= options.rate:
            return None
        self._seen[key.hex()] += 1
        if options.attempts and self._seen[key.hex()] > options.attempts:
            return None
        kind = options.kinds[int.from_bytes(key[8:16], "big") % len(options.kinds)]
        self.faults[kind] += 1
        print(f"flaky: injected {kind}", file=sys.stderr, flush=True)  # the server's log keeps the count
        return kind


async def flaky_answer(script: Script, body: dict[str, Any]) -> tuple[Response | None, str | None]:
    """(an error response to send instead of a completion, or a forced completion text)."""
    if not isinstance(script, FlakyScript):
        return None, None
    kind = script.fault_for(body)
    error = {"error": {"message": f"scripted fault {kind}", "type": "scripted_failure"}}
    if kind == "429":
        return JSONResponse(error, status_code=429, headers={"Retry-After": f"{script.options.retry_after:g}"}), None
    if kind == "429_bare":
        return JSONResponse(error, status_code=429), None
    if kind == "503":
        return JSONResponse(error, status_code=503), None
    if kind == "garbage":
        return Response("<html><body>upstream hiccup</body></html>", status_code=200, media_type="text/html"), None
    if kind == "slow":
        await asyncio.sleep(script.options.slow_s)
    return None, ("" if kind == "empty" else None)
