"""`algorithm=gepa_ai`: the reference `gepa` library (gepa-ai, `gepa.optimize`) run against
the same container client, evaluation choke point, proposer endpoint and budget as our GEPA.

The library is synchronous: it runs in a worker thread and reaches the run through the
bridge (rollouts via `RunView.evaluate`, reflection via `RunView.propose`, both on
the run's event loop). Train minibatches come from the train pool and the library's
valset is the pareto pool, so both GEPA arms select on the same rows.

Budget: the library gets `max_metric_calls` from the run's budget (the rollouts left;
harness/budget.py decides every stop), but checks it only between iterations, so one
iteration can overshoot. The adapter therefore refuses any evaluation whose uncached
rollouts do not fit (the budget says so before any rollout); the refusal aborts the
library's iteration, is recorded as a `budget_stop` event, and the bridge's stop
condition ends the library's loop, which returns its result normally.
"""

from __future__ import annotations

import asyncio
import traceback
from typing import Any

import gepa
from gepa.core.result import GEPAResult

from algorithms.gepa_ai.adapter import HarnessAdapter, TaskIdLoader
from algorithms.gepa_ai.bridge import Bridge, Halt
from algorithms.gepa_ai.params import GepaLibraryParams
from algorithms.protocol import OptimizerResult, RunView
from harness.budget import StopReason
from harness.candidates import digest_of
from harness.errors import HarnessError


class GepaLibraryError(HarnessError):
    """The library raised something that is not a harness error; the run fails with it."""


class GepaLibraryOptimizer:
    name = "gepa_ai"

    def __init__(self, params: GepaLibraryParams):
        self.params = params

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> "GepaLibraryOptimizer":
        return cls(GepaLibraryParams.model_validate(params))

    async def run(self, ctx: RunView) -> OptimizerResult:
        bridge = Bridge(ctx, asyncio.get_running_loop(), self.params)
        budget = ctx.budget.library_metric_calls()
        error: BaseException | None = None
        result: GEPAResult | None = None
        try:
            result = await asyncio.to_thread(self._optimize, ctx, bridge, budget)
        except asyncio.CancelledError:
            bridge.cancel()
            raise
        except Exception as exc:  # raised outside the library's loop (e.g. on the seed's evaluation)
            error = exc
        if bridge.fatal is not None or error is not None:
            failure = bridge.fatal or error
            assert failure is not None
            raise self._failure(ctx, bridge, failure) from failure
        seed = ctx.seed_candidate
        if result is None:  # the seed's pareto evaluation did not fit the budget
            stop = bridge.stop_reason or StopReason.MAX_ROLLOUTS
            ctx.event("stop", f"stopped: {stop}", iterations=0, best=seed.candidate_id, best_score=None)
            return OptimizerResult(best_candidate_id=seed.candidate_id, stop_reason=stop)
        best = self._map_tree(ctx, bridge, result)
        stop = bridge.stop_reason
        if stop is None:  # the library's own max_metric_calls stopper (its count >= ours)
            stop = StopReason.MAX_ROLLOUTS
            ctx.event("library_stop", "the library's max_metric_calls stopper ended the run",
                      library_metric_calls=result.total_metric_calls, rollouts=ctx.usage.rollouts)
        ctx.event("stop", f"stopped: {stop}", iterations=bridge.completed_iterations, best=best,
                  best_score=result.val_aggregate_scores[result.best_idx],
                  library_metric_calls=result.total_metric_calls, rollouts=ctx.usage.rollouts)
        return OptimizerResult(best_candidate_id=best, stop_reason=stop, iterations=bridge.completed_iterations)

    def _optimize(self, ctx: RunView, bridge: Bridge, budget: int) -> GEPAResult | None:
        """The library's run, in the worker thread. None when the seed could not be scored."""
        p = self.params
        try:
            return gepa.optimize(
                seed_candidate=dict(bridge.library_seed),
                trainset=TaskIdLoader(ctx.pools.train),
                valset=TaskIdLoader(ctx.pools.pareto),
                adapter=HarnessAdapter(bridge),
                reflection_lm=bridge.reflect,
                candidate_selection_strategy=p.candidate_selection_strategy,
                skip_perfect_score=p.skip_perfect_score,
                reflection_minibatch_size=min(p.minibatch_size, len(ctx.pools.train)),
                perfect_score=p.perfect_score,
                reflection_prompt_template=bridge.prompt_template,
                module_selector=p.module_selector,
                max_metric_calls=budget,
                stop_callbacks=[bridge],
                logger=bridge.logger,
                callbacks=[bridge],
                track_best_outputs=False,
                display_progress_bar=False,
                cache_evaluation=False,  # the context caches (candidate digest, task id) already
                seed=ctx.spec.seed,
                raise_on_exception=False,  # errors end the loop through the bridge's stop condition
                acceptance_criterion=p.acceptance_criterion,
            )
        except Halt:
            return None

    @staticmethod
    def _map_tree(ctx: RunView, bridge: Bridge, result: GEPAResult) -> str:
        """Our id for each library candidate, the library's parents written into the
        candidates table where they differ from what was known at creation, origin
        `library` for every candidate in the library's pool; returns the best's id."""
        seed_texts = ctx.seed_candidate.texts
        ids: list[str] = []
        for texts in result.candidates:
            candidate = bridge.by_digest.get(digest_of({**seed_texts, **texts}))
            if candidate is None:
                raise GepaLibraryError("the library returned a candidate that was never evaluated through the run")
            ids.append(candidate.candidate_id)
        lineage: dict[str, list[str]] = {}
        for idx in range(1, len(ids)):
            child = ids[idx]
            if child in lineage or child == ids[0]:  # a duplicate of an earlier member: the first lineage stands
                continue
            parents = (ids[p] for p in result.parents[idx] if p is not None and ids[p] != child)
            lineage[child] = list(dict.fromkeys(parents))
        fixed = ctx.adopt_lineage(lineage, origin="library")
        if fixed:
            ctx.event("parent_fixup", f"{len(fixed)} parent link(s) set from the library's tree", fixed=fixed)
        ctx.event("library_tree", f"{len(ids)} candidates in the library's pool", candidates=ids,
                  parents=result.parents, val_scores=result.val_aggregate_scores,
                  library_metric_calls=result.total_metric_calls)
        return ids[result.best_idx]

    @staticmethod
    def _failure(ctx: RunView, bridge: Bridge, exc: BaseException) -> HarnessError:
        if isinstance(exc, HarnessError):
            return exc
        ctx.event("library_error", f"{type(exc).__name__}: {exc}",
                  traceback="".join(traceback.format_exception(exc)), log_tail=list(bridge.logger.lines)[-20:])
        return GepaLibraryError(f"gepa library failed: {type(exc).__name__}: {exc}")

