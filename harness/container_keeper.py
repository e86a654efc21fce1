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

# Start the container again: True when a new process was started, False when the one there
# turned out to answer (busy rather than dead, or already restarted for another run).
RestartHook = Callable[[], Awaitable[bool]]


class ContainerKeeper:
    def __init__(self, client: ContainerClient, name: str, restart: RestartHook | None,
                 event: Callable[..., None]):
        self.client = client
        self.name = name
        self._restart = restart  # None: attached by url, not started by the harness
        self._event = event
        self.restarts = 0  # asked for by this run (the restarter may find the container answering)
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

    def restarted_before_start(self, error: str, restarted: bool) -> None:
        """Preflight found the container not answering and asked for a restart: recorded as this run's."""
        self.restarts += 1
        self._event("container_restart", f"container {self.name} did not answer preflight; asking for a restart",
                    error=error)
        self._answers_again(restarted)

    def _answers_again(self, restarted: bool) -> None:
        if restarted:
            self._event("container_restarted", f"container {self.name} answers again")
        else:
            self._event("container_answering", f"container {self.name} answers: not restarted (it was busy, "
                                               "or another run's request had restarted it)")

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
                self._event("container_restart", f"container {name} stopped answering; asking for a restart",
                            error=error)
                try:
                    restarted = await self._restart()
                except HarnessError as exc:
                    self.lost = f"container {name} stopped answering and the restart failed: {exc}"
                else:
                    self._generation += 1
                    self._answers_again(restarted)
                    return True
            return False
