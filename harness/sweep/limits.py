"""Limits shared by every run of a sweep: one Ray actor holds a semaphore per endpoint
(container or model URL), so fifty parallel runs do not flood one endpoint.

Slots are held on behalf of a holder (one attempt of one run). When a worker process
dies it cannot give its slots back, so the driver calls `release_holder` for it; without
that, every death would shrink the limit for the rest of the sweep until runs wait forever."""

from __future__ import annotations

import asyncio
import uuid
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable

import ray


class HolderReleased(RuntimeError):
    """The limiter gave this holder's slots back already (the driver took it for dead)."""


@ray.remote(num_cpus=0)
class EndpointLimiter:
    def __init__(self, limits: dict[str, int]):
        self._limits = dict(limits)
        self._semaphores: dict[str, asyncio.Semaphore] = {}
        self._held: dict[str, dict[str, int]] = {}  # holder -> key -> slots held
        self._released: set[str] = set()  # holders whose slots were given back for good

    def _semaphore(self, key: str) -> asyncio.Semaphore:
        if key not in self._semaphores:
            self._semaphores[key] = asyncio.Semaphore(self._limits.get(key, 1_000_000))
        return self._semaphores[key]

    async def acquire(self, keys: list[str], holder: str = "") -> bool:
        """Wait for one slot of each key, in the order given (gates pass them sorted, so two
        never wait on each other), all in one actor call. False, holding nothing, if the
        holder was released meanwhile."""
        taken: list[str] = []
        try:
            for key in keys:
                if not await self._take(key, holder):
                    break
                taken.append(key)
            return len(taken) == len(keys)
        finally:
            if len(taken) < len(keys):  # released, or cancelled while it waited: what it took goes back
                self._give_back(taken, holder)

    async def release(self, keys: list[str], holder: str = "") -> None:
        self._give_back(keys, holder)

    async def _take(self, key: str, holder: str) -> bool:
        if holder in self._released:
            return False
        await self._semaphore(key).acquire()
        if holder in self._released:  # its worker died while this call waited
            self._semaphore(key).release()
            return False
        held = self._held.setdefault(holder, {})
        held[key] = held.get(key, 0) + 1
        return True

    def _give_back(self, keys: list[str], holder: str) -> None:
        held = self._held.get(holder, {})
        for key in reversed(keys):
            if held.get(key, 0) <= 0:
                continue  # not held (already given back by release_holder): never raise the limit
            held[key] -= 1
            if not held[key]:
                del held[key]
            self._semaphore(key).release()
        if not held:
            self._held.pop(holder, None)

    async def release_holder(self, holder: str) -> int:
        """Give back every slot `holder` still holds, and any it would get later; returns how many."""
        self._released.add(holder)
        held = self._held.pop(holder, {})
        for key, count in held.items():
            for _ in range(count):
                self._semaphore(key).release()
        return sum(held.values())

    def in_use(self) -> dict[str, int]:
        """Slots held per key, across holders."""
        totals: dict[str, int] = {}
        for held in self._held.values():
            for key, count in held.items():
                totals[key] = totals.get(key, 0) + count
        return totals


def shared_gate(limiter: Any, *keys: str, holder: str | None = None) -> Callable[[], Any]:
    """A gate for ContainerClient/ChatClient that holds one slot of each key (always in
    the same order, so two gates never wait on each other). `holder` names whose slots
    these are (see `EndpointLimiter.release_holder`); by default one name per gate."""
    ordered = sorted(set(keys))
    name = holder if holder is not None else uuid.uuid4().hex

    @asynccontextmanager
    async def gate() -> AsyncIterator[None]:
        if not await limiter.acquire.remote(ordered, name):
            raise HolderReleased(f"endpoint limiter released holder {name!r}")
        try:
            yield
        finally:
            await limiter.release.remote(ordered, name)

    return gate
