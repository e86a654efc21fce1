"""Rate limits per (upstream, model), shared by every run on the machine because there is
one gateway per machine: a concurrency cap that adapts (halved on 429/503, raised by one
per window of successes: AIMD, as TCP), token buckets for requests and tokens per minute,
and a pause honouring the upstream's Retry-After for every caller of that key.

Everything runs on the gateway's one event loop, so no state here needs a lock."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from harness.gateway.models import LimitSettings


class TokenBucket:
    """`rate` units per second, up to `capacity` saved. A take larger than the capacity is
    allowed once the bucket is full (it then owes the rest), so a big request never starves."""

    def __init__(self, rate_per_s: float, capacity: float):
        self.rate = rate_per_s
        self.capacity = max(capacity, 1.0)
        self.level = self.capacity
        self._stamp = time.monotonic()

    def _refill(self) -> None:
        now = time.monotonic()
        self.level = min(self.capacity, self.level + (now - self._stamp) * self.rate)
        self._stamp = now

    async def take(self, amount: float) -> None:
        while True:
            self._refill()
            need = min(amount, self.capacity)
            if self.level >= need:
                self.level -= amount
                return
            await asyncio.sleep((need - self.level) / self.rate)

    def refund(self, amount: float) -> None:
        """Correct an estimate after the fact (negative: charge more)."""
        self._refill()
        self.level = min(self.capacity, self.level + amount)


@dataclass
class Ticket:
    """One call's hold on a limit: the cut epoch it is sent under, and the tokens it was
    charged; the caller sets `used` from the answer (0 for a failure) and the difference
    goes back to the bucket whatever the outcome, so no single call can hold it down."""

    epoch: int
    charged: float = 0.0
    used: float = 0.0


class AdaptiveLimit:
    def __init__(self, settings: LimitSettings):
        self.max = settings.max_concurrency
        self.limit = float(settings.max_concurrency)
        self.in_flight = 0
        self.peak = 0
        self.low = self.limit  # the lowest the cap went
        self.cuts = 0
        self.paused_until = 0.0
        self._cond = asyncio.Condition()
        rpm, tpm = settings.requests_per_min, settings.tokens_per_min
        self.requests = TokenBucket(rpm / 60.0, max(1.0, rpm / 60.0)) if rpm else None
        self.tokens = TokenBucket(tpm / 60.0, tpm / 6.0) if tpm else None  # up to 10 s of tokens at once

    def _free(self) -> int:
        return max(0, int(self.limit) - self.in_flight)

    @asynccontextmanager
    async def slot(self, estimated_tokens: int = 0) -> AsyncIterator[Ticket]:
        """Hold one slot; yields the call's ticket. `estimated_tokens` must be bounded (the
        gateway caps it at the model's context): a charge above the bucket's capacity is
        taken as debt that every later caller waits out."""
        async with self._cond:
            await self._cond.wait_for(lambda: self._free() > 0)
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
        ticket = Ticket(epoch=self.cuts)
        try:
            await self.wait_pause()
            if self.requests is not None:
                await self.requests.take(1)
            if self.tokens is not None and estimated_tokens:
                await self.tokens.take(estimated_tokens)
                ticket.charged = float(estimated_tokens)
            ticket.epoch = self.cuts
            yield ticket
        finally:
            if self.tokens is not None and ticket.charged:
                self.tokens.refund(ticket.charged - ticket.used)
            async with self._cond:
                self.in_flight -= 1
                self._cond.notify(self._free())

    async def wait_pause(self) -> None:
        delay = self.paused_until - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)

    async def on_success(self) -> None:
        if self.limit < self.max:
            self.limit = min(float(self.max), self.limit + 1.0 / self.limit)  # about +1 per window
            async with self._cond:
                self._cond.notify(self._free())

    def on_throttle(self, retry_after: float | None, epoch: int) -> None:
        """A 429/503 for a call sent in `epoch`. Calls sent before the last cut were sent
        under the old cap: their throttles say nothing about the new one (one cut per round
        trip, as TCP's congestion window)."""
        now = time.monotonic()
        if epoch == self.cuts:
            self.limit = max(1.0, self.limit / 2.0)
            self.low = min(self.low, self.limit)
            self.cuts += 1
        if retry_after is not None:
            self.paused_until = max(self.paused_until, now + retry_after)

    def snapshot(self) -> dict[str, float | int]:
        return {"limit": round(self.limit, 2), "max": self.max, "low": round(self.low, 2), "in_flight": self.in_flight,
                "peak": self.peak, "cuts": self.cuts,
                "paused_s": round(max(0.0, self.paused_until - time.monotonic()), 2)}


class Limiter:
    """One AdaptiveLimit per (upstream, model), made on first use."""

    def __init__(self, settings_for: Callable[[str, str], LimitSettings]):
        self._settings_for = settings_for
        self._limits: dict[tuple[str, str], AdaptiveLimit] = {}

    def get(self, upstream: str, model: str) -> AdaptiveLimit:
        key = (upstream, model)
        if key not in self._limits:
            self._limits[key] = AdaptiveLimit(self._settings_for(upstream, model))
        return self._limits[key]

    def snapshot(self) -> dict[str, dict[str, float | int]]:
        return {f"{u}/{m}": limit.snapshot() for (u, m), limit in self._limits.items()}
