"""Forwarding one model call: attribution, the USD budget, the response store, rate
limits and retries on throttling, metering, and the key added here and scrubbed from
whatever comes back. The routes that call it are in app.py."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import aiohttp
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from harness.errors import FailureKind
from harness.gateway.ledger import Ledger, RunLedger
from harness.gateway.limiter import Limiter
from harness.gateway.models import CallRecord, GatewaySettings, Upstream
from harness.gateway.store import ResponseStore, request_digest, sample_digest
from harness.http_pool import env_proxy
from harness.pricing import cost_usd
from harness.retry import AttemptFailed, RetryPolicy, retry_after_s

MODEL_ENDPOINTS = frozenset({"chat/completions", "completions", "models"})
MAX_CONNECTIONS = 1024  # to all upstreams together
THROTTLE_STATUSES = frozenset({429, 503})
DEFAULT_OUTPUT_ESTIMATE = 1024  # tokens assumed for a call that sets no max_tokens
REDACTED = b"[redacted]"


def error_response(status: int, kind: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": {"type": kind, "message": message, **extra}}, status_code=status)


def prompt_text(body: dict[str, Any], endpoint: str) -> str:
    """The text a model call carries: message contents (text parts too) or the prompt."""
    if endpoint == "completions":
        prompt = body.get("prompt")
        return prompt if isinstance(prompt, str) else "\n".join(p for p in prompt or () if isinstance(p, str))
    parts: list[str] = []
    for message in body.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts += [p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
    return "\n".join(parts)


OUTPUT_FIELDS = ("max_tokens", "max_completion_tokens")


def output_allowance(body: dict[str, Any], cap: int) -> tuple[int | None, bool] | str:
    """(completion tokens the call may produce, whether the body was capped), or why its
    allowance is invalid. An allowance over the model's cap is lowered to it in `body`."""
    asked: int | None = None
    capped = False
    for field in OUTPUT_FIELDS:
        value = body.get(field)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return f"{field} must be a positive integer, got {json.dumps(value)[:40]}"
        if value > cap:
            body[field], value, capped = cap, cap, True
        asked = value if asked is None else min(asked, value)
    return asked, capped


def _int(value: Any, default: int) -> int:
    try:
        return int(value) if value else default
    except (TypeError, ValueError):
        return default


Usage = tuple[int, int, str | None]  # prompt tokens, completion tokens, the model that answered


def _usage(content: bytes) -> Usage:
    try:
        payload = json.loads(content)
        usage = payload.get("usage") or {}
        return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0), payload.get("model")
    except (ValueError, TypeError, AttributeError):
        return 0, 0, None


class Gateway:
    """State shared by the routes: upstreams, store, limiter, ledger, pooled HTTP client."""

    def __init__(self, settings: GatewaySettings, admin_token: str | None, upstreams: list[Upstream]):
        self.settings = settings
        self.admin_token = admin_token
        self.upstreams: dict[str, Upstream] = {u.name: u for u in upstreams}
        self.store: ResponseStore | None = None
        if settings.cache != "off":
            if not settings.cache_path:
                raise ValueError(f"gateway cache {settings.cache!r} needs a cache_path")
            self.store = ResponseStore(settings.cache_path)
        self.limiter = Limiter(settings.limits_for)
        # throttling only (429/503), which the caller could not do better; a Retry-After
        # beyond max_retry_after_s goes back to the caller at once instead of pausing every
        # run on that model, and callers sent away by one throttle come back spread out
        self.retry = RetryPolicy(attempts=settings.max_attempts, max_delay_s=settings.max_backoff_s,
                                 max_retry_after_s=settings.max_retry_after_s, long_retry_after="give_up",
                                 retry_after_jitter=0.1)
        self.ledger = Ledger()
        self.http: aiohttp.ClientSession | None = None  # opened in the app's lifespan, on its loop
        self._urls: dict[tuple[str, str], tuple[str, str | None]] = {}

    # ---- upstream calls ------------------------------------------------------------

    def _key(self, upstream: Upstream) -> str | None:
        return os.environ.get(upstream.api_key_env) if upstream.api_key_env else None

    def _url(self, upstream: Upstream, endpoint: str) -> tuple[str, str | None]:
        """(URL, proxy from the environment or None), once per upstream and endpoint
        (http_pool.env_proxy)."""
        key = (upstream.name, endpoint)
        if key not in self._urls:
            url = f"{upstream.base_url.rstrip('/')}/{endpoint}"
            self._urls[key] = url, env_proxy(url)
        return self._urls[key]

    def _redact(self, content: bytes, upstream: Upstream) -> bytes:
        key = self._key(upstream)
        return content.replace(key.encode(), REDACTED) if key and key.encode() in content else content

    async def _live(self, upstream: Upstream, endpoint: str, model: str, method: str, raw: bytes,
                    estimated_tokens: int) -> tuple[int, bytes, dict[str, str], int, Usage | None]:
        """(status, body, headers for the caller, attempts, the answer's usage when it is a
        200: parsed once, for the limiter and the meter). Retries only throttling
        (429/503), which the caller could not do better; other failures go back at once
        to the caller's own retry policy."""
        headers = {"content-type": "application/json", **upstream.headers}
        if upstream.api_key_env:
            key = self._key(upstream)
            if not key:
                message = f"gateway: environment variable {upstream.api_key_env} is not set (key for {upstream.name})"
                return 500, json.dumps({"error": {"type": "gateway_config", "message": message}}).encode(), {}, 0, None
            headers["authorization"] = f"Bearer {key}"
        url, proxy = self._url(upstream, endpoint)
        limit = self.limiter.get(upstream.name, model)
        http = self.http
        assert http is not None, "the gateway's HTTP client opens with the app"
        attempts = 0
        usage: Usage | None = None

        async def attempt() -> tuple[int, bytes, dict[str, str]]:
            nonlocal attempts, usage
            attempts += 1
            async with limit.slot(estimated_tokens) as ticket:
                try:
                    async with http.request(method, url, data=raw if method == "POST" else None, headers=headers,
                                            proxy=proxy, allow_redirects=False) as response:
                        status, content = response.status, await response.read()
                        retry_after = response.headers.get("retry-after")
                except TimeoutError:
                    message = f"gateway: {upstream.name} did not answer within {self.settings.timeout_s:g}s"
                    return 504, json.dumps({"error": {"type": "upstream_timeout", "message": message}}).encode(), {}
                except aiohttp.ClientError as exc:
                    message = f"gateway: cannot reach {upstream.name}: {type(exc).__name__}"
                    return 502, json.dumps({"error": {"type": "upstream_unreachable", "message": message}}).encode(), {}
                if status == 200:  # any other outcome used none of the tokens it was charged
                    usage = _usage(content)
                    ticket.used = usage[0] + usage[1]
            if status in THROTTLE_STATUSES:
                wait = retry_after_s(retry_after)
                limit.on_throttle(None if self.retry.gives_up_on(wait) else wait, ticket.epoch)
                passed = {"retry-after": retry_after} if retry_after is not None else {}
                raise AttemptFailed(f"HTTP {status}", FailureKind.RATE_LIMITED, retry_after=wait,
                                    answer=(status, content, passed))
            if status < 500:
                await limit.on_success()
            return status, self._redact(content, upstream), {}

        try:
            status, content, passed = await self.retry.run(attempt)
        except AttemptFailed as throttled:  # the caller sees the last throttle, with its Retry-After
            status, content, passed = throttled.answer  # type: ignore[misc]
            content = self._redact(content, upstream)
        return status, content, passed, attempts, usage

    # ---- one model call ------------------------------------------------------------

    async def call(self, request: Request, run: RunLedger | None, scope: str | None, role: str,
                   upstream_name: str, endpoint: str) -> Response:
        upstream = self.upstreams.get(upstream_name)
        if upstream is None:
            return error_response(404, "unknown_upstream", f"gateway: no upstream named {upstream_name!r}")
        if endpoint not in MODEL_ENDPOINTS:
            return error_response(404, "unknown_endpoint", f"gateway: /v1/{endpoint} is not forwarded")
        method = request.method
        raw = await request.body() if method == "POST" else b""
        try:
            body: dict[str, Any] = json.loads(raw) if raw else {}
            if not isinstance(body, dict):
                raise ValueError("not an object")
        except ValueError:
            return error_response(400, "invalid_request", "gateway: the request body is not a JSON object")
        if body.get("stream"):
            return error_response(400, "invalid_request", "gateway: streaming is not supported; send stream=false")
        model = body.get("model") if isinstance(body.get("model"), str) else None
        limits = self.settings.limits_for(upstream.name, model or "")
        allowance = output_allowance(body, limits.max_output_tokens)
        if isinstance(allowance, str):
            return error_response(400, "invalid_request", f"gateway: {allowance}")
        output, capped = allowance
        if capped:  # what is sent (and stored, and digested) is the capped request
            raw = json.dumps(body, ensure_ascii=False).encode()
        # the limiter's charge: about 4 bytes of request per prompt token plus the allowance,
        # never more than the model's context
        tokens = min(len(raw) // 4 + (output or DEFAULT_OUTPUT_ESTIMATE), limits.context_tokens)
        base = request_digest(upstream.name, endpoint, model, body)
        key = scope or "-"
        if run is not None:
            sample, call_id = run.next_sample(key, base), run.next_call_id(key)
        else:  # unattributed: no scope to count samples in, so the store answers every repeat alike
            sample, call_id = 0, self.ledger.unattributed_call_id()
        record = CallRecord(
            run_id=run.run_id if run else None, call_id=call_id, scope=scope, role=role, model=model,
            upstream=upstream.name, endpoint=endpoint, digest=sample_digest(base, sample),
            cache="off" if self.store is None else "miss",
            prompt_check=run.prompt_check(key, prompt_text(body, endpoint))
            if run is not None and role == "policy" and endpoint != "models" else None,
        )
        started = time.perf_counter()
        estimate = self._estimate(upstream, model, raw, body) if run is not None and run.budgeted(key) else None
        if run is not None and run.budgeted(key) and run.would_cross(estimate):
            message = (f"gateway: run {run.run_id} budget ${run.budget:.6f} would be crossed "
                       f"(spent ${run.budgeted_spent:.6f}, in flight ${run.reserved:.6f}, "
                       f"this call up to ${estimate or 0.0:.6f}): call refused")
            return self._finish(record, run, started, 402, error_response(402, "budget_exhausted", message), error=message,
                                label="refused")
        if estimate:
            run.reserved += estimate  # type: ignore[union-attr]
        try:
            return await self._serve(record, run, started, upstream, endpoint, model or "", method, raw, tokens)
        finally:
            if estimate:
                run.reserved -= estimate  # type: ignore[union-attr]

    async def _serve(self, record: CallRecord, run: RunLedger | None, started: float, upstream: Upstream,
                     endpoint: str, model: str, method: str, raw: bytes, estimated_tokens: int) -> Response:
        mode, store, digest = self.settings.cache, self.store, record.digest or ""
        content = await asyncio.to_thread(store.get, digest) if store is not None else None
        if content is not None:
            record.cache = "hit" if mode == "read_write" else "replay"
            return self._finish(record, run, started, 200, content)
        if mode == "replay":
            message = (f"gateway replay: no stored response for request {digest} ({endpoint}, model {model!r}, "
                       f"upstream {upstream.name}); record it first with gateway.cache=read_write")
            record.cache = "replay"
            return self._finish(record, run, started, 404, error_response(404, "replay_miss", message, digest=digest),
                                error=message, label="replay_miss")
        status, content, headers, attempts, usage = await self._live(upstream, endpoint, model, method, raw,
                                                                     estimated_tokens)
        record.attempts = attempts
        if status == 200 and store is not None:
            await asyncio.to_thread(store.put, digest, upstream=upstream.name, endpoint=endpoint, model=model or None,
                                    body=content)
        return self._finish(record, run, started, status, content, headers=headers, usage=usage)

    def _finish(self, record: CallRecord, run: RunLedger | None, started: float, http_status: int,
                content: bytes | Response, *, headers: dict[str, str] | None = None, error: str | None = None,
                label: str | None = None, usage: Usage | None = None) -> Response:
        """Meter the call, record it, and answer the caller."""
        record.http_status = http_status
        record.status = label or ("ok" if http_status == 200 else "error")
        if isinstance(content, Response):
            response = content
        else:
            response = Response(content, status_code=http_status, media_type="application/json", headers=headers)
            if http_status == 200:
                prompt, completion, answered = usage or _usage(content)
                record.prompt_tokens, record.completion_tokens = prompt, completion
                record.cost_usd = self._price(record, answered)
            elif error is None:
                error = content[:300].decode(errors="replace")
        if record.status != "ok":
            record.cost_usd = 0.0  # nothing billed for a call that did not complete
        record.error = error
        record.latency_s = time.perf_counter() - started
        if record.endpoint != "models":
            self.ledger.add(record, run)
        response.headers["x-gateway-call-id"] = record.call_id
        response.headers["x-gateway-cache"] = record.cache
        return response

    def _price(self, record: CallRecord, answered_model: str | None) -> float | None:
        provider = self.upstreams[record.upstream].provider
        cost = cost_usd(provider, record.model or "", record.prompt_tokens, record.completion_tokens)
        if cost is None and answered_model and answered_model != record.model:
            # a provider may answer with a dated snapshot name of the model asked for
            cost = cost_usd(provider, answered_model, record.prompt_tokens, record.completion_tokens)
        if cost is None and "/" in (record.model or ""):
            # a router's `vendor/model` name (OpenRouter): priced as the vendor's model
            cost = cost_usd(provider, (record.model or "").rsplit("/", 1)[1], record.prompt_tokens,
                            record.completion_tokens)
        return cost

    def _estimate(self, upstream: Upstream, model: str | None, raw: bytes, body: dict[str, Any]) -> float | None:
        """An upper-side guess of a call's cost before it is made: about 4 bytes of request
        per prompt token, and the whole completion allowance."""
        output = _int(body.get("max_completion_tokens") or body.get("max_tokens"), DEFAULT_OUTPUT_ESTIMATE)
        return cost_usd(upstream.provider, model or "", len(raw) // 4 + 1, output)

    # ---- control -------------------------------------------------------------------

    def register_upstream(self, upstream: Upstream) -> str | None:
        """None when registered (or already registered the same way), else why not."""
        known = self.upstreams.get(upstream.name)
        if known is not None and known != upstream:
            # never re-point a name: a caller could otherwise send a key to a URL of its choice
            return f"upstream {upstream.name!r} is already registered with other settings"
        self.upstreams[upstream.name] = upstream
        return None
