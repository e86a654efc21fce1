"""What the iterations in flight share (parallel proposals): the iteration counter, the
idle count and the stop reason."""

from __future__ import annotations

import asyncio
from typing import Any

from harness.budget import Budget, StopReason


class LoopState:
    """The iteration counter, the idle count and the stop reason the workers share; the
    rollouts each has reserved are held by the run's budget (harness/budget.py)."""

    def __init__(self, budget: Budget) -> None:
        self.iteration = 0
        self.idle = 0
        self.stop: StopReason | None = None
        self._budget = budget

    def finish(self, reason: StopReason) -> None:
        if self.stop is None:
            self.stop = reason
        self._budget.wake_waiters()  # workers waiting for reserved rollouts see the stop


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
