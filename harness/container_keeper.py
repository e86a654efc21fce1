"""The run's line to its container: each rollout call, and a restart when the container
stops answering (its process died). Whether it may be restarted again is the restarter's
call alone (the Services that started it cap restarts per container): in a sweep the
container is shared, and a run that saw an earlier death must not fail on the next one."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

from pydantic import BaseModel, ConfigDict

from harness.client import ContainerClient
from harness.contract import RolloutRequest
from harness.errors import CameBack, HarnessError, Unreachable

# Start the container again: True when a new process was started, False when the one there
# turned out to answer (busy rather than dead, or already restarted for another run).
RestartHook = Callable[[], Awaitable[bool]]


class RestartOutcome(BaseModel):
    """What the owner of a container did about a run's request to restart it, as it travels
    back to the run from another process (the sweep driver, a node's service set)."""

    model_config = ConfigDict(frozen=True)
    restarted: bool = False  # a new process was started (False: the one there answered)
    error: str | None = None  # why it could not be restarted

    @classmethod
    def of(cls, revive: Callable[[str], bool], url: str) -> "RestartOutcome":
        """`revive(url)`, any failure as the error: the runs that asked fail with it, the
        sweep goes on."""
        try:
            return cls(restarted=revive(url))
        except Exception as exc:  # noqa: BLE001
            return cls(error=str(exc) if isinstance(exc, HarnessError) else f"{type(exc).__name__}: {exc}")

    def restarted_or_raise(self) -> bool:
        """The hook's answer: whether a new process was started; a HarnessError if none could be."""
        if self.error:
            raise HarnessError(self.error)
        return self.restarted


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
        restart it through the hook and send the same request once more; when a new process
        came up during the call (another run restarted it) and its first answer was one worth
        retrying, the attempts went to the gone one: send once more as well."""
        generation = self._generation
        try:
            return await self.client.rollout(request, answers)
        except Unreachable as exc:
            if not await self._revive(generation, str(exc)):
                raise
        except CameBack:
            pass
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
