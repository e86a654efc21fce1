"""Our GEPA loop: select a parent from the Pareto frontier, reflect on its minibatch
failures, propose an edit of one target module, accept on minibatch improvement, then
score the child on the pareto pool.

With `parallel_proposals: P` > 1, P such iterations run at once over the shared frontier,
so the model's latency is overlapped rather than paid one minibatch at a time. Each
iteration reserves the rollouts it may need before it starts, so together they never
overrun the budget; which candidate gets which id then depends on response order."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from algorithms.gepa.pareto import ParetoFrontier
from algorithms.gepa.proposer import EDIT_FORMATS, apply_reply, build_messages
from algorithms.protocol import OptimizerResult
from harness.candidates import Candidate, RolloutResult, mean_reward
from harness.context import BudgetExhausted, RunContext
from harness.errors import FailureKind, ServiceError


class GepaParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    minibatch_size: int = Field(default=4, gt=0)
    acceptance_margin: float = Field(default=0.0, ge=0.0)
    edit_formats: tuple[str, ...] = ("rules", "answer_guide")
    proposer_temperature: float = Field(default=0.8, ge=0.0, le=2.0)
    proposer_max_tokens: int = Field(default=300, gt=0)
    max_examples: int = Field(default=4, gt=0)  # reflection rows shown to the proposer, failures first
    proposal_attempts: int = Field(default=2, gt=0)  # retries, with the next format, on an unchanged reply
    skip_perfect_minibatch: bool = True
    use_task_info: bool = True
    max_idle_iterations: int = Field(default=25, gt=0)  # stop when iterations stop spending rollouts
    max_proposer_errors: int = Field(default=3, gt=0)  # consecutive failed proposer calls that fail the run
    parallel_proposals: int = Field(default=1, gt=0)  # iterations in flight at once (1: the sequential loop)

    @field_validator("edit_formats")
    @classmethod
    def _known_formats(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [f for f in value if f not in EDIT_FORMATS]
        if unknown or not value:
            raise ValueError(f"edit_formats must be a non-empty subset of {EDIT_FORMATS}, got {list(value)}")
        return value


class GepaOptimizer:
    name = "gepa"

    def __init__(self, params: GepaParams):
        self.params = params

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> "GepaOptimizer":
        return cls(GepaParams.model_validate(params))

    async def run(self, ctx: RunContext) -> OptimizerResult:
        frontier = ParetoFrontier(ctx.pools.pareto)
        seed = ctx.seed_candidate
        try:
            seed_results = await ctx.evaluate(seed, list(ctx.pools.pareto), "seed")
        except BudgetExhausted as exhausted:
            return OptimizerResult(best_candidate_id=seed.candidate_id, stop_reason=exhausted.reason)
        frontier.add(seed.candidate_id, [r.reward for r in seed_results])
        ctx.report_best(frontier.mean(seed.candidate_id))
        self._proposer_errors = 0
        loop = _LoopState()
        workers = [self._worker(ctx, frontier, loop) for _ in range(self.params.parallel_proposals)]
        if len(workers) == 1:
            await workers[0]
        else:
            await _all_or_first_error(workers)
        best = frontier.best()
        stop = loop.stop or "max_rollouts"
        ctx.event("stop", f"stopped: {stop}", iterations=loop.iteration, best=best, best_score=frontier.mean(best))
        return OptimizerResult(best_candidate_id=best, stop_reason=stop, iterations=loop.iteration)

    async def _worker(self, ctx: RunContext, frontier: ParetoFrontier, loop: "_LoopState") -> None:
        while loop.stop is None:
            reason = ctx.stop_reason(generation=loop.iteration)
            if reason is not None:
                loop.finish(reason)
                break
            if loop.idle >= self.params.max_idle_iterations:
                ctx.event("stalled", f"{loop.idle} iterations in a row spent no rollouts")
                loop.finish("stalled")
                break
            iteration = loop.iteration
            loop.iteration += 1
            spent_before = ctx.usage.rollouts
            try:
                await self._iterate(ctx, frontier, iteration, loop)
            except BudgetExhausted as exhausted:
                if loop.iteration == iteration + 1:
                    loop.iteration = iteration  # an iteration that did not happen does not count
                if exhausted.reason == "max_rollouts" and loop.reserved():
                    await loop.wait_for_release()  # the others may not need all they reserved
                    continue
                loop.finish(exhausted.reason)
                break
            loop.idle = loop.idle + 1 if ctx.usage.rollouts == spent_before else 0

    async def _iterate(self, ctx: RunContext, frontier: ParetoFrontier, iteration: int, loop: "_LoopState") -> None:
        params = self.params
        parent = ctx.candidate(frontier.sample(ctx.rng))
        k = min(params.minibatch_size, len(ctx.pools.train))
        minibatch = ctx.rng.sample(list(ctx.pools.train), k)
        # The whole iteration must fit: parent minibatch, child minibatch, child pareto scoring.
        needed = len(ctx.uncached(parent, minibatch)) + k + len(ctx.pools.pareto)
        if needed > ctx.rollouts_left - loop.reserved():
            raise BudgetExhausted("max_rollouts")
        with loop.reserve(needed) as reservation:
            await self._iterate_reserved(ctx, frontier, iteration, parent, minibatch, reservation)

    async def _iterate_reserved(self, ctx: RunContext, frontier: ParetoFrontier, iteration: int, parent: Candidate,
                                minibatch: list[str], reservation: "_Reservation") -> None:
        params = self.params
        reservation.spend(len(ctx.uncached(parent, minibatch)))
        parent_results = await ctx.evaluate(parent, minibatch, "minibatch")
        parent_score = mean_reward(parent_results)
        if params.skip_perfect_minibatch and all(r.reward is not None and r.reward >= 1.0 for r in parent_results):
            ctx.event("skip", "parent is perfect on the minibatch", iteration=iteration, parent=parent.candidate_id)
            return
        module = ctx.target_modules[iteration % len(ctx.target_modules)]
        child = await self._propose(ctx, parent, module, parent_results, iteration, parent_score)
        if child is None:
            return
        child_candidate, proposal_fields = child
        reservation.spend(len(ctx.uncached(child_candidate, minibatch)))
        child_results = await ctx.evaluate(child_candidate, minibatch, "minibatch")
        child_score = mean_reward(child_results)
        # error rows carry no reward: a child with none is rejected, a parent with none is beaten by any
        accepted = child_score is not None and (parent_score is None or child_score > parent_score + params.acceptance_margin)
        ctx.record_proposal(**proposal_fields, child_id=child_candidate.candidate_id, accepted=accepted,
                            child_minibatch_score=child_score)
        ctx.set_origin(child_candidate.candidate_id, "proposal" if accepted else "rejected")
        if not accepted:
            return
        reservation.spend(len(ctx.uncached(child_candidate, list(ctx.pools.pareto))))
        pareto_results = await ctx.evaluate(child_candidate, list(ctx.pools.pareto), "pareto")
        frontier.add(child_candidate.candidate_id, [r.reward for r in pareto_results])
        ctx.report_best(frontier.mean(child_candidate.candidate_id))
        ctx.event("accept", f"{child_candidate.candidate_id} accepted", parent=parent.candidate_id,
                  pareto_score=frontier.mean(child_candidate.candidate_id))

    async def _propose(
        self, ctx: RunContext, parent: Candidate, module: str, results: list[RolloutResult],
        iteration: int, parent_score: float | None,
    ) -> tuple[Candidate, dict[str, Any]] | None:
        field = ctx.program.field_of(module)
        current = parent.texts[field]
        formats = self.params.edit_formats
        task_info = ctx.task_info if self.params.use_task_info else None
        tokens = [0, 0]
        latency, status, error = 0.0, "empty", None
        edit_format = formats[iteration % len(formats)]
        attempts = 0
        proposal = None
        scopes: list[str] = []  # this proposal's gateway scopes: other iterations may be proposing too
        for attempt in range(self.params.proposal_attempts):
            attempts = attempt + 1
            edit_format = formats[(iteration + attempt) % len(formats)]
            messages = build_messages(current, results, edit_format, task_info, self.params.max_examples)
            try:
                reply = await ctx.propose(messages, temperature=self.params.proposer_temperature,
                                          max_tokens=self.params.proposer_max_tokens, scopes=scopes)
            except ServiceError as exc:
                # An endpoint that keeps failing (after the client's retries) fails the run.
                self._proposer_errors += 1
                if exc.kind is FailureKind.FATAL or self._proposer_errors >= self.params.max_proposer_errors:
                    raise
                status, error = "error", str(exc)
                break
            self._proposer_errors = 0
            tokens[0] += reply.prompt_tokens
            tokens[1] += reply.completion_tokens
            latency += reply.latency_s
            proposal = apply_reply(current, reply.text, edit_format)
            status = proposal.status
            if status == "changed":
                break
        fields = {
            "iteration": iteration, "parent_id": parent.candidate_id, "module": module,
            "proposer_model": ctx.spec.proposer.model, "edit_format": edit_format, "attempts": attempts,
            "status": status, "changed": status == "changed", "parent_minibatch_score": parent_score,
            "prompt_tokens": tokens[0], "completion_tokens": tokens[1], "latency_s": latency,
            "cost_usd": ctx.proposer_cost(tokens[0], tokens[1]), "error": error, "proposer_scopes": scopes,
        }
        if proposal is None or status != "changed":
            ctx.record_proposal(**fields, accepted=False)
            ctx.event("proposal_rejected", f"proposal {status}", iteration=iteration, edit_format=edit_format)
            return None
        child = ctx.add_candidate({**parent.texts, field: proposal.text}, (parent.candidate_id,), "proposal")
        return child, fields


class _Reservation:
    """Rollouts one iteration may still start: `needed` at first, less what it has started."""

    def __init__(self, needed: int):
        self.left = needed

    def spend(self, rollouts: int) -> None:
        self.left = max(0, self.left - rollouts)


class _LoopState:
    """What the iterations in flight share: the next iteration index, the idle count, the
    stop reason, and the rollouts reserved by iterations that have not started them yet
    (the context already counts started ones in `rollouts_left`)."""

    def __init__(self) -> None:
        self.iteration = 0
        self.idle = 0
        self.stop: str | None = None
        self._reservations: list[_Reservation] = []
        self._released = asyncio.Event()

    def reserved(self) -> int:
        return sum(r.left for r in self._reservations)

    def reserve(self, needed: int) -> "_Reserved":
        return _Reserved(self, _Reservation(needed))

    def finish(self, reason: str) -> None:
        if self.stop is None:
            self.stop = reason
        self._released.set()

    async def wait_for_release(self) -> None:
        self._released.clear()
        await self._released.wait()


class _Reserved:
    def __init__(self, loop: _LoopState, reservation: _Reservation):
        self.loop, self.reservation = loop, reservation

    def __enter__(self) -> _Reservation:
        self.loop._reservations.append(self.reservation)
        return self.reservation

    def __exit__(self, *_: object) -> None:
        self.loop._reservations.remove(self.reservation)
        self.loop._released.set()


async def _all_or_first_error(coroutines: list[Any]) -> None:
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
