"""The budget authority (harness/budget.py): every stop reason, the USD limit with the
gateway's metered figure, and the reservations of iterations in flight. The clock is set
through `resume_clock` (as a resumed run does), so no test waits on time."""

from __future__ import annotations

import asyncio

import pytest

from harness.budget import Budget, BudgetExhausted, StopReason, projected_over_usd, would_cross_usd
from harness.gateway.models import RoleTotals, RunSpend
from harness.run_state import Usage
from harness.specs import BudgetSpec


def budget(**limits: float | int | None) -> Budget:
    spec = BudgetSpec(**{"max_rollouts": 10, **limits})  # type: ignore[arg-type]
    return Budget(spec, Usage())


def refused(call: object) -> StopReason:
    with pytest.raises(BudgetExhausted) as exhausted:
        call()  # type: ignore[operator]
    return exhausted.value.reason


def test_stop_reason_values_are_the_strings_the_evidence_holds() -> None:
    assert {r.value for r in StopReason} == {"max_rollouts", "max_wall_s", "max_cost_usd", "max_generations",
                                             "stalled", "seed_only", "error_rate", "container_lost"}
    assert StopReason.MAX_ROLLOUTS == "max_rollouts" and str(BudgetExhausted(StopReason.MAX_WALL_S)) == "max_wall_s"


def test_nothing_stops_a_fresh_run() -> None:
    b = budget(max_cost_usd=1.0, max_wall_s=60, max_generations=3)
    assert b.stop_reason(generation=0) is None
    b.check_rollouts(10)
    b.check_proposal()


def test_each_limit_gives_its_reason() -> None:
    b = budget()
    b.usage.rollouts = 10
    assert b.stop_reason() is StopReason.MAX_ROLLOUTS

    b = budget(max_wall_s=60)
    b.resume_clock(60.0)
    assert b.stop_reason() is StopReason.MAX_WALL_S and b.wall_left() == 0.0

    b = budget(max_cost_usd=0.5)
    b.usage.cost_usd = 0.5
    assert b.stop_reason() is StopReason.MAX_COST_USD

    b = budget(max_cost_usd=0.5)
    b.usage.budget_refused = True  # the gateway refused a call: the USD budget is spent
    assert b.stop_reason() is StopReason.MAX_COST_USD

    b = budget(max_generations=3)
    assert b.stop_reason(generation=2) is None and b.stop_reason() is None
    assert b.stop_reason(generation=3) is StopReason.MAX_GENERATIONS


def test_wall_time_is_decided_first_then_cost_generations_rollouts() -> None:
    b = budget(max_wall_s=60, max_cost_usd=0.5, max_generations=1)
    b.usage.rollouts, b.usage.cost_usd = 10, 1.0
    assert b.stop_reason(generation=1) is StopReason.MAX_COST_USD
    b.resume_clock(61.0)
    assert b.stop_reason(generation=1) is StopReason.MAX_WALL_S
    b = budget(max_generations=1)
    b.usage.rollouts = 10
    assert b.stop_reason(generation=1) is StopReason.MAX_GENERATIONS


def test_started_rollouts_count_before_they_finish() -> None:
    b = budget()
    b.start_rollouts(7)
    assert b.rollouts_left == 3 and b.library_metric_calls() == 3
    assert refused(lambda: b.check_rollouts(4)) is StopReason.MAX_ROLLOUTS
    b.check_rollouts(3)
    b.usage.rollouts += 1
    b.finish_rollout()
    assert b.rollouts_left == 3


def test_a_proposal_is_stopped_by_usd_and_wall_only() -> None:
    b = budget(max_generations=1)
    b.usage.rollouts = 10  # out of rollouts: the proposal may still finish its iteration
    b.check_proposal()
    b = budget(max_wall_s=5)
    b.resume_clock(5.0)
    assert refused(b.check_proposal) is StopReason.MAX_WALL_S
    b = budget(max_cost_usd=0.1)
    b.usage.cost_usd = 0.2
    assert refused(b.check_proposal) is StopReason.MAX_COST_USD


def spend(budgeted: float, proposer_cost: float, proposer_calls: int) -> RunSpend:
    return RunSpend(run_id="r", cost_usd=budgeted, budgeted_cost_usd=budgeted,
                    by_role={"proposer": RoleTotals(calls=proposer_calls, cost_usd=proposer_cost)})


def test_usd_limit_projects_the_gateways_metered_spend() -> None:
    b = budget(max_cost_usd=1.0)
    b.usage.rollouts = 4
    # 0.75 spent: 0.5 on 4 rollouts (0.125 each), 0.25 on 1 proposer call
    b.gateway_spend = spend(0.75, proposer_cost=0.25, proposer_calls=1)
    b.usage.cost_usd = 0.75
    b.check_rollouts(2)  # 0.75 + 2 * 0.125 = 1.0: not past the budget
    assert refused(lambda: b.check_rollouts(3)) is StopReason.MAX_COST_USD
    b.check_proposal()  # 0.75 + 0.25 = 1.0
    b.gateway_spend = spend(0.875, proposer_cost=0.25, proposer_calls=1)
    assert refused(b.check_proposal) is StopReason.MAX_COST_USD
    assert not projected_over_usd(None, spend(5.0, 1.0, 1), rollouts=100)  # no USD budget: nothing to project


def test_without_the_gateways_figure_only_the_run_cost_decides() -> None:
    b = budget(max_cost_usd=1.0)
    b.usage.rollouts, b.usage.cost_usd = 4, 0.9
    b.check_rollouts(6)
    b.check_proposal()


def test_gateway_refuses_the_call_that_would_cross_the_budget() -> None:
    assert not would_cross_usd(None, 10.0, 10.0, 10.0)
    assert not would_cross_usd(1.0, 0.5, 0.25, 0.25)
    assert would_cross_usd(1.0, 0.5, 0.25, 0.3)  # the calls in flight count with their estimate
    assert not would_cross_usd(1.0, 0.5, 0.0, None)  # no estimate: only the spend so far


def test_reservations_keep_room_for_the_iterations_in_flight() -> None:
    b = budget()
    with b.reserve(6) as first:
        assert b.reserved == 6
        assert refused(lambda: b.reserve(5).__enter__()) is StopReason.MAX_ROLLOUTS
        with b.reserve(4) as second:
            assert b.reserved == 10 and not b.fits_beyond_reserved(1)
            second.spend(3)
            b.start_rollouts(3)
            assert b.reserved == 7 and b.rollouts_left == 7
            # an accepted child may use what its own iteration reserved, not the others' share
            assert b.fits_beyond_reserved(1, own=second) and not b.fits_beyond_reserved(2, own=second)
            assert b.fits_beyond_reserved(6, own=first) and not b.fits_beyond_reserved(7, own=first)
        assert b.reserved == 6
    assert b.reserved == 0 and b.fits_beyond_reserved(7)


def test_a_released_reservation_wakes_a_waiting_iteration() -> None:
    async def scenario() -> list[str]:
        b = budget()
        order: list[str] = []
        holding, waiting = asyncio.Event(), asyncio.Event()

        async def holder() -> None:
            with b.reserve(10):
                holding.set()
                await waiting.wait()
                order.append("released")

        async def waiter() -> None:
            await holding.wait()
            assert refused(lambda: b.reserve(1).__enter__()) is StopReason.MAX_ROLLOUTS
            release = asyncio.ensure_future(b.wait_for_release())
            await asyncio.sleep(0)  # the waiter is parked on the event before the holder goes on
            waiting.set()
            await release
            order.append("woken")
            with b.reserve(1):
                order.append("reserved")

        await asyncio.gather(holder(), waiter())
        return order

    assert asyncio.run(scenario()) == ["released", "woken", "reserved"]


def test_stopping_wakes_waiters() -> None:
    async def scenario() -> bool:
        b = budget()
        release = asyncio.ensure_future(b.wait_for_release())
        await asyncio.sleep(0)
        b.wake_waiters()
        await asyncio.wait_for(release, timeout=5)
        return release.done()

    assert asyncio.run(scenario())
