"""The run's budget: the one place that decides whether a run may go on (rollouts, wall
time, USD, generations) and that holds the rollouts iterations in flight have reserved.
Optimizers ask it (through the run), the run's evaluation choke point asks it before any
rollout, and the gateway asks `would_cross_usd` before any model call it forwards."""

from __future__ import annotations

import asyncio
import time
from contextlib import contextmanager
from enum import StrEnum
from typing import TYPE_CHECKING, Iterator

from harness.errors import HarnessError
from harness.run_state import Usage

if TYPE_CHECKING:
    from harness.gateway.models import RunSpend
    from harness.specs import BudgetSpec


class StopReason(StrEnum):
    """Why a run's optimization ended; the values are what the evidence records."""

    MAX_ROLLOUTS = "max_rollouts"
    MAX_WALL_S = "max_wall_s"
    MAX_COST_USD = "max_cost_usd"
    MAX_GENERATIONS = "max_generations"
    STALLED = "stalled"  # iterations stopped spending rollouts
    SEED_ONLY = "seed_only"  # the baseline arm: nothing to optimize
    ERROR_RATE = "error_rate"  # too many failed rollouts
    CONTAINER_LOST = "container_lost"  # the container stopped answering for good


# the limits that also stop a call already under way (a proposer call), not only the next step
HARD_LIMITS = frozenset({StopReason.MAX_COST_USD, StopReason.MAX_WALL_S})


class BudgetExhausted(Exception):
    """The next step would cross a budget; the optimizer stops cleanly."""

    def __init__(self, reason: StopReason):
        super().__init__(reason.value)
        self.reason = reason

class RunFailed(HarnessError):
    """Too many failed rollouts (stop reason `error_rate`) or a container lost for good
    (`container_lost`): the run stops with a clear status."""

    def __init__(self, message: str, stop_reason: StopReason = StopReason.CONTAINER_LOST):
        super().__init__(message)
        self.stop_reason = stop_reason


def would_cross_usd(budget_usd: float | None, spent: float, in_flight: float, estimate: float | None) -> bool:
    """The gateway's check before it forwards a call: would its estimate, with the calls in
    flight, take the budgeted spend past the budget (so concurrent calls cannot cross it together)?"""
    if budget_usd is None:
        return False
    return spent + in_flight + (estimate or 0.0) > budget_usd


def projected_over_usd(budget_usd: float | None, spend: "RunSpend", *, rollouts: int = 0, proposer_calls: int = 0,
                       rollouts_done: int = 0) -> bool:
    """Would the next step (rollouts, proposer calls) take the gateway's metered spend past
    the budget, at the mean cost per rollout and per proposer call so far? Decided on spend
    that is complete (read after every batch and call), so a replay stops where the
    recording stopped; the gateway's own refusal is only the backstop for a bad guess."""
    if budget_usd is None:
        return False
    proposer = spend.by_role.get("proposer")
    proposer_cost = proposer.cost_usd if proposer else 0.0
    per_rollout = (spend.budgeted_cost_usd - proposer_cost) / rollouts_done if rollouts_done else 0.0
    per_call = proposer_cost / proposer.calls if proposer and proposer.calls else 0.0
    return spend.budgeted_cost_usd + rollouts * per_rollout + proposer_calls * per_call > budget_usd


class Reservation:
    """Rollouts one iteration may still start: what it reserved, less what it started."""

    def __init__(self, needed: int):
        self.left = needed

    def spend(self, rollouts: int) -> None:
        self.left = max(0, self.left - rollouts)


class Budget:
    """Limits against the run's usage and clock. Rollouts count as spent once started
    (`start_rollouts`), and iterations in flight together reserve no more than is left."""

    def __init__(self, limits: "BudgetSpec", usage: Usage, gateway_spend: "RunSpend | None" = None):
        self.limits = limits
        self.usage = usage
        # the gateway's metered spend (set on each read of it), when model calls go through one
        self.gateway_spend = gateway_spend
        self.started = time.monotonic()
        self._in_flight = 0  # budgeted rollouts started but not yet counted in usage
        self._reservations: list[Reservation] = []
        self._released = asyncio.Event()

    # ---- clock -----------------------------------------------------------------------

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def resume_clock(self, elapsed_s: float) -> None:
        """Go on from a checkpoint: the time an earlier process spent counts."""
        self.started = time.monotonic() - elapsed_s

    def wall_left(self) -> float | None:
        """Seconds before the wall budget runs out (None: no wall budget)."""
        wall = self.limits.max_wall_s
        return None if wall is None else max(0.0, wall - self.elapsed())

    # ---- stop decisions --------------------------------------------------------------

    def stop_reason(self, generation: int | None = None, *, wall: bool = True) -> StopReason | None:
        limits, usage = self.limits, self.usage
        if wall and limits.max_wall_s is not None and self.elapsed() >= limits.max_wall_s:
            return StopReason.MAX_WALL_S
        if limits.max_cost_usd is not None and (usage.cost_usd >= limits.max_cost_usd or usage.budget_refused):
            return StopReason.MAX_COST_USD
        if limits.max_generations is not None and generation is not None and generation >= limits.max_generations:
            return StopReason.MAX_GENERATIONS
        if usage.rollouts >= limits.max_rollouts:
            return StopReason.MAX_ROLLOUTS
        return None

    @property
    def rollouts_left(self) -> int:
        return self.limits.max_rollouts - self.usage.rollouts - self._in_flight

    def check_rollouts(self, count: int, *, wall: bool = True) -> None:
        """Raise BudgetExhausted unless `count` more budgeted rollouts fit, in every limit
        (`wall=False`: all but the wall clock, for rollouts that finish a stopped search)."""
        reason = self.stop_reason(wall=wall)
        if reason is None and count > self.rollouts_left:
            reason = StopReason.MAX_ROLLOUTS
        if reason is None and self._usd_projection_over(rollouts=count):
            reason = StopReason.MAX_COST_USD
        if reason is not None:
            raise BudgetExhausted(reason)

    def check_proposal(self) -> None:
        """Raise BudgetExhausted unless one more proposer call fits: only the USD and wall
        limits bind a proposal (rollout limits bind the rollouts it leads to)."""
        reason = self.stop_reason()
        if reason in HARD_LIMITS:
            raise BudgetExhausted(reason)
        if self._usd_projection_over(proposer_calls=1):
            raise BudgetExhausted(StopReason.MAX_COST_USD)

    def refused_by_gateway(self) -> BudgetExhausted:
        """The gateway refused a budgeted call (it would have crossed the USD budget): the
        stop to raise."""
        self.usage.budget_refused = True
        return BudgetExhausted(StopReason.MAX_COST_USD)

    def _usd_projection_over(self, *, rollouts: int = 0, proposer_calls: int = 0) -> bool:
        if self.gateway_spend is None:
            return False
        return projected_over_usd(self.limits.max_cost_usd, self.gateway_spend, rollouts=rollouts,
                                  proposer_calls=proposer_calls, rollouts_done=self.usage.rollouts)

    def library_metric_calls(self) -> int:
        """The `max_metric_calls` a library optimizer with its own counter is given: the rollouts left."""
        return self.rollouts_left

    # ---- rollouts in flight and reservations ------------------------------------------

    def start_rollouts(self, count: int) -> None:
        self._in_flight += count

    def finish_rollout(self) -> None:
        """A started rollout is now counted in usage."""
        self._in_flight -= 1

    @property
    def reserved(self) -> int:
        return sum(r.left for r in self._reservations)

    def fits_beyond_reserved(self, count: int, own: Reservation | None = None) -> bool:
        """Whether `count` rollouts fit in what is left once the other iterations' reservations
        are kept (an iteration may use what it reserved itself: `own`)."""
        return count <= self.rollouts_left - self.reserved + (own.left if own is not None else 0)

    @contextmanager
    def reserve(self, needed: int) -> Iterator[Reservation]:
        """Hold `needed` rollouts for an iteration while it runs; BudgetExhausted when they do not fit."""
        if not self.fits_beyond_reserved(needed):
            raise BudgetExhausted(StopReason.MAX_ROLLOUTS)
        reservation = Reservation(needed)
        self._reservations.append(reservation)
        try:
            yield reservation
        finally:
            self._reservations.remove(reservation)
            self._released.set()

    def wake_waiters(self) -> None:
        """Wake iterations waiting for reserved rollouts (e.g. the run is stopping)."""
        self._released.set()

    async def wait_for_release(self) -> None:
        self._released.clear()
        await self._released.wait()
