"""What the iterations in flight share (parallel proposals): the iteration counter, the
idle count, the stop reason, and the rollouts each has reserved but not started yet."""

from __future__ import annotations

import asyncio
from typing import Any


class Reservation:
    """Rollouts one iteration may still start: what it reserved, less what it started."""

    def __init__(self, needed: int):
        self.left = needed

    def spend(self, rollouts: int) -> None:
        self.left = max(0, self.left - rollouts)

    def extend(self, rollouts: int) -> None:
        """Reserve more (an accepted child's pareto scoring) once it is known to fit."""
        self.left += rollouts


class LoopState:
    """The context already counts started rollouts in `rollouts_left`; reservations are
    those iterations in flight have yet to start."""

    def __init__(self) -> None:
        self.iteration = 0
        self.idle = 0
        self.stop: str | None = None
        self._reservations: list[Reservation] = []
        self._released = asyncio.Event()

    def reserved(self) -> int:
        return sum(r.left for r in self._reservations)

    def reserve(self, needed: int) -> "Reserved":
        return Reserved(self, Reservation(needed))

    def finish(self, reason: str) -> None:
        if self.stop is None:
            self.stop = reason
        self._released.set()

    async def wait_for_release(self) -> None:
        self._released.clear()
        await self._released.wait()


class Reserved:
    def __init__(self, loop: LoopState, reservation: Reservation):
        self.loop, self.reservation = loop, reservation

    def __enter__(self) -> Reservation:
        self.loop._reservations.append(self.reservation)
        return self.reservation

    def __exit__(self, *_: object) -> None:
        self.loop._reservations.remove(self.reservation)
        self.loop._released.set()


async def all_or_first_error(coroutines: list[Any]) -> None:
    """Run the workers together; the first to fail cancels the rest and its error is raised."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in done:
        if task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
