"""Control arm: scores the seed candidate on the pareto pool and proposes nothing."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from algorithms.protocol import OptimizerResult, RunView
from harness.budget import BudgetExhausted, StopReason
from harness.candidates import mean_reward


class SeedOnlyParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SeedOnly:
    name = "seed_only"

    def __init__(self, params: SeedOnlyParams):
        self.params = params

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> "SeedOnly":
        return cls(SeedOnlyParams.model_validate(params))

    async def run(self, ctx: RunView) -> OptimizerResult:
        seed = ctx.seed_candidate
        try:
            results = await ctx.evaluate(seed, list(ctx.pools.pareto), "seed")
        except BudgetExhausted as exhausted:
            return OptimizerResult(best_candidate_id=seed.candidate_id, stop_reason=exhausted.reason)
        score = mean_reward(results)
        if score is not None:  # every row failed: no score to report
            ctx.report_best(score)
        return OptimizerResult(best_candidate_id=seed.candidate_id, stop_reason=StopReason.SEED_ONLY)
