"""Limits shared by every run of a sweep: one Ray actor holds a semaphore per endpoint
(container or model URL), so fifty parallel runs do not flood one endpoint."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable

import ray


@ray.remote(num_cpus=0)
class EndpointLimiter:
    def __init__(self, limits: dict[str, int]):
        self._limits = dict(limits)
        self._semaphores: dict[str, asyncio.Semaphore] = {}

    def _semaphore(self, key: str) -> asyncio.Semaphore:
        if key not in self._semaphores:
            self._semaphores[key] = asyncio.Semaphore(self._limits.get(key, 1_000_000))
        return self._semaphores[key]

    async def acquire(self, key: str) -> None:
        await self._semaphore(key).acquire()

    async def release(self, key: str) -> None:
        self._semaphore(key).release()


def shared_gate(limiter: Any, *keys: str) -> Callable[[], Any]:
    """A gate for ContainerClient/ChatClient that holds one slot of each key (always in
    the same order, so two gates never wait on each other)."""
    ordered = sorted(set(keys))

    @asynccontextmanager
    async def gate() -> AsyncIterator[None]:
        taken: list[str] = []
        try:
            for key in ordered:
                await limiter.acquire.remote(key)
                taken.append(key)
            yield
        finally:
            for key in reversed(taken):
                await limiter.release.remote(key)

    return gate
