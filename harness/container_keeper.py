"""The run's line to its container: each rollout call, and a restart when the container
stops answering (its process died). Whether it may be restarted again is the restarter's
call alone (the Services that started it cap restarts per container): in a sweep the
container is shared, and a run that saw an earlier death must not fail on the next one."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

from harness.client import ContainerClient
from harness.contract import RolloutRequest
from harness.errors import HarnessError, Unreachable


class ContainerKeeper:
    def __init__(self, client: ContainerClient, name: str, restart: Callable[[], Awaitable[None]] | None,
                 event: Callable[..., None]):
        self.client = client
        self.name = name
        self._restart = restart  # None: attached by url, not started by the harness
        self._event = event
        self.restarts = 0  # asked for by this run
        self.lost: str | None = None  # why the container is gone for good
        self._generation = 0
        self._lock = asyncio.Lock()

    async def send(self, request: RolloutRequest, answers: list[str]) -> Any:
        """One rollout call. When the container refuses the connection (its process died),
        restart it through the hook and send the same request once more."""
        generation = self._generation
        try:
            return await self.client.rollout(request, answers)
        except Unreachable as exc:
            if not await self._revive(generation, str(exc)):
                raise
        return await self.client.rollout(request, answers)

    def restarted_before_start(self, error: str) -> None:
        """Preflight found the container dead and had it restarted: recorded as this run's restart."""
        self.restarts += 1
        self._event("container_restart", f"container {self.name} did not answer preflight; restarting it",
                    error=error)
        self._event("container_restarted", f"container {self.name} answers again")

    async def _revive(self, generation: int, error: str) -> bool:
        """True when the container answers again (restarted by this call or by a concurrent
        rollout since `generation`); False, with the container marked lost, when it cannot be."""
        async with self._lock:
            if self.lost is not None:
                return False
            if self._generation != generation:
                return True  # another rollout restarted it while this one waited
            name = self.name
            if self._restart is None:
                self.lost = (f"container {name} stopped answering and cannot be restarted (attached "
                             f"by url, not started by the harness: start it again, then rerun): {error}")
            else:
                self.restarts += 1
                self._event("container_restart", f"container {name} stopped answering; restarting it", error=error)
                try:
                    await self._restart()
                except HarnessError as exc:
                    self.lost = f"container {name} stopped answering and the restart failed: {exc}"
                else:
                    self._generation += 1
                    self._event("container_restarted", f"container {name} answers again")
                    return True
            return False
