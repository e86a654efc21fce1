"""Our GEPA loop: select a parent from the Pareto frontier, reflect on its minibatch
failures (several proposer samples, screened for free), propose an edit of one target
module, accept on minibatch improvement, then score the child on the pareto pool. Every
`merge_every`-th iteration instead merges two frontier candidates that lead on different
rows. The run's pick is the best pareto mean, or with `select_top` the best mean on train
rows kept apart (select.py).

With `parallel_proposals: P` > 1, P such iterations run at once over the shared frontier,
so the model's latency is overlapped rather than paid one minibatch at a time. The first
iterations start on the seed while the seed itself is scored on the pareto pool. Each
iteration reserves with the run's budget, before it starts, its minibatch rollouts and the
pareto scoring of its child (an iteration whose child could not be scored cannot change
the frontier), so together they never overrun the budget; which candidate gets which id
then depends on response order. Alone (P = 1) the pareto part is checked on acceptance."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from algorithms.gepa.edits import LearnedModule, union
from algorithms.gepa.loop import LoopState, all_or_first_error
from algorithms.gepa.pareto import ParetoFrontier
from algorithms.gepa.proposer import EDIT_FORMATS
from algorithms.gepa.propose import ProposerHealth, TurnInputs, at_once, one_by_one
from algorithms.gepa.reflect import CitationMemory, EditSettings, FailedAnswers, Proposal, Rotation, format_plan
from algorithms.gepa.select import apart_count, best_on_kept, contenders, split_train
from algorithms.protocol import OptimizerResult, RunView
from harness.budget import BudgetExhausted, Reservation, StopReason
from harness.candidates import Candidate, RolloutResult, digest_of, mean_reward


class GepaParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    minibatch_size: int = Field(default=4, gt=0)
    acceptance_margin: float = Field(default=0.0, ge=0.0)
    edit_formats: tuple[str, ...] = ("rules", "answer_guide")
    # None: the proposer model's own settings (configs/proposer/*.yaml)
    proposer_temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    proposer_max_tokens: int | None = Field(default=None, gt=0)
    proposal_samples: int = Field(default=2, gt=0)  # at most this many replies per request, screened before any rollout
    # sampling stops early once this many new lines survived the screen: a reply costs tens
    # of seconds with a local proposer, and a second one is only worth it when the first fell short
    lines_wanted: int = Field(default=2, gt=0)
    proposal_attempts: int = Field(default=2, gt=0)  # requests, with the next format, while nothing survives
    max_examples: int = Field(default=4, gt=0)  # reflection rows shown to the proposer, failures first
    max_new_lines: int = Field(default=4, gt=0)  # learned lines one proposal may add
    max_learned_lines: int = Field(default=12, gt=1)  # per section; a full rules section is consolidated
    max_example_lines: int = Field(default=24, gt=0)  # the `examples` section keeps its newest lines
    max_cited_lines: int | None = Field(default=None, gt=0)  # lines one `examples` edit adds (None: max_new_lines)
    # an `examples` edit with room left after its minibatch's citations also quotes those of
    # the run's earlier minibatch failures, the newest of at most this many (0: its own only)
    cited_memory: int = Field(default=0, ge=0)
    # an `examples` edit also keeps a section of at most this many lines on the failures'
    # answers that are label-shaped but not labels (0: never)
    not_answer_lines: int = Field(default=0, ge=0)
    # forbid: the section names those answers as not valid; spell: it names in full the
    # labels they are near spellings of, never the invented answers themselves
    not_answer_style: Literal["forbid", "spell"] = "forbid"
    # a turn whose failures carry cited inputs starts with `examples` (reflect.format_plan)
    examples_first: bool = False
    # a turn whose `examples` edit would add nothing (a container that cites no inputs)
    # rotates over the formats that ask the proposer, so each attempt is a request
    # (reflect.format_plan)
    asking_when_uncited: bool = False
    merge_every: int = Field(default=0, ge=0)  # every n-th iteration merges two frontier candidates (0: never)
    skip_perfect_minibatch: bool = True
    use_task_info: bool = True
    max_idle_iterations: int = Field(default=25, gt=0)  # stop when iterations stop spending rollouts
    max_proposer_errors: int = Field(default=3, gt=0)  # consecutive failed proposer calls that fail the run
    parallel_proposals: int = Field(default=1, gt=0)  # iterations in flight at once (1: the sequential loop)
    # a turn's proposer requests (each attempt's format, each with proposal_samples samples) go
    # out at once: one round trip a turn, at the price of the calls the early stops
    # (lines_wanted, the next attempt only when nothing survived) would have saved (propose.py)
    sample_together: bool = False
    # drop a learned line that quotes an input the container cited for another answer
    # (`answer_examples`); off reproduces the screen before the container cited inputs
    screen_cited_inputs: bool = True
    # before the pick, the `select_top` best pareto means and the seed are also scored on
    # `select_rows` train rows kept out of every minibatch (held from the budget up front);
    # the pick is the best mean on those rows (algorithms/gepa/select.py). 0: best pareto mean.
    select_top: int = Field(default=0, ge=0)
    select_rows: int = Field(default=30, gt=0)
    # a row field holding each row's class: the rows kept apart take each class's share of
    # the train pool. Unset, it is the container's `label_field` (configs/container/).
    select_spread_by: str | None = Field(default=None, min_length=1)

    @field_validator("edit_formats")
    @classmethod
    def _known_formats(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [f for f in value if f not in EDIT_FORMATS]
        if unknown or not value:
            raise ValueError(f"edit_formats must be a non-empty subset of {EDIT_FORMATS}, got {list(value)}")
        return value

    def edit_settings(self) -> EditSettings:
        return EditSettings(max_examples=self.max_examples, max_new_lines=self.max_new_lines,
                            max_learned_lines=self.max_learned_lines, screen_cited_inputs=self.screen_cited_inputs,
                            max_example_lines=self.max_example_lines,
                            max_cited_lines=self.max_cited_lines or self.max_new_lines,
                            not_answer_lines=self.not_answer_lines, not_answer_style=self.not_answer_style)


class MinibatchSampler:
    """Train rows without replacement within an epoch: each epoch is a fresh shuffle, so
    every row is reflected on before any row comes back."""

    def __init__(self, task_ids: tuple[str, ...], rng: random.Random):
        self.task_ids, self.rng = list(task_ids), rng
        self._order: list[str] = []

    def next(self, k: int) -> list[str]:
        batch: list[str] = []
        while len(batch) < min(k, len(self.task_ids)):
            if not self._order:
                fresh = self.task_ids[:]
                self.rng.shuffle(fresh)
                # a batch that spans two epochs: its rows come last in the new one (pop takes from the end)
                self._order = [r for r in fresh if r in batch] + [r for r in fresh if r not in batch]
            batch.append(self._order.pop())
        return batch


class GepaOptimizer:
    name = "gepa"
    container_params: ClassVar[dict[str, str]] = {"select_spread_by": "label_field"}

    def __init__(self, params: GepaParams):
        self.params = params

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> "GepaOptimizer":
        return cls(GepaParams.model_validate(params))

    async def run(self, ctx: RunView) -> OptimizerResult:
        frontier = ParetoFrontier(ctx.pools.pareto)
        loop = LoopState(ctx.budget)
        self._seeded = asyncio.Event()  # the seed is on the frontier (or its scoring stopped)
        self._judged: set[int] = set()  # iterations whose child has its proposals row
        self._edit = self.params.edit_settings()  # the caps every edit and merge of the run obeys
        # fed from the seed's scores on, before the loop starts
        self._failed_answers = FailedAnswers(kept=self._edit.lists_failed_answers)
        kept = self._rows_to_keep(ctx)
        classes = await self._train_classes(ctx) if kept else None
        minibatch_rows, self._select_rows = split_train(ctx.pools.train, kept, ctx.spec.seed, classes)
        with ExitStack() as held:
            self._hold = self._hold_for_pick(ctx, held)
            early = await self._optimize(ctx, frontier, loop, minibatch_rows)
        if early is not None:
            return early
        best = await self._pick(ctx, frontier)
        stop = loop.stop or StopReason.MAX_ROLLOUTS
        ctx.event("stop", f"stopped: {stop}", iterations=loop.iteration, best=best, best_score=frontier.mean(best))
        return OptimizerResult(best_candidate_id=best, stop_reason=stop, iterations=loop.iteration)

    async def _optimize(self, ctx: RunView, frontier: ParetoFrontier, loop: LoopState,
                        minibatch_rows: tuple[str, ...]) -> OptimizerResult | None:
        """The iterations; an OptimizerResult when the seed itself could not be scored."""
        seed = ctx.seed_candidate
        if self.params.parallel_proposals == 1:
            try:
                await self._score_seed(ctx, frontier)
            except BudgetExhausted as exhausted:
                return OptimizerResult(best_candidate_id=seed.candidate_id, stop_reason=exhausted.reason)
            self._start_loop(ctx, minibatch_rows)
            await self._worker(ctx, frontier, loop)
            return None
        # The first iterations need only the seed's texts, not its pareto scores: they start
        # while the seed is scored, which would otherwise leave most slots idle for a round trip.
        with ExitStack() as held:
            try:
                hold = held.enter_context(ctx.budget.reserve(len(ctx.uncached(seed, list(ctx.pools.pareto)))))
            except BudgetExhausted as exhausted:
                return OptimizerResult(best_candidate_id=seed.candidate_id, stop_reason=exhausted.reason)
            self._start_loop(ctx, minibatch_rows)
            workers = [self._worker(ctx, frontier, loop) for _ in range(self.params.parallel_proposals)]
            await all_or_first_error([self._score_seed_beside(ctx, frontier, loop, hold), *workers])
        if seed.candidate_id not in frontier.scores:
            return OptimizerResult(best_candidate_id=seed.candidate_id, stop_reason=loop.stop or StopReason.MAX_ROLLOUTS)
        return None

    # ---- the pick ---------------------------------------------------------------------

    async def _train_classes(self, ctx: RunView) -> dict[str, str] | None:
        """Each train row's class by `select_spread_by`; None when the param is unset."""
        field = self.params.select_spread_by
        if field is None:
            return None
        rows = await ctx.task_rows(ctx.pools.train)
        unclassed = next((t for t in ctx.pools.train if rows[t].get(field) is None), None)
        if unclassed is not None:
            raise ValueError(f"select_spread_by is {field!r}, and train task {unclassed} has no such field")
        return {t: str(rows[t][field]) for t in ctx.pools.train}

    def _rows_to_keep(self, ctx: RunView) -> int:
        """Train rows to keep apart for the pick: none without `select_top`, or when the budget
        could not also score the seed and one child beside them (the pick is then the best
        pareto mean, and every train row feeds the minibatches)."""
        params = self.params
        count = apart_count(len(ctx.pools.train), params.select_rows) if params.select_top else 0
        hold = (params.select_top + 1) * count
        search = 2 * len(ctx.pools.pareto) + 2 * params.minibatch_size
        return count if count and ctx.budget.rollouts_left >= hold + search else 0

    def _hold_for_pick(self, ctx: RunView, held: ExitStack) -> Reservation | None:
        """Rollouts kept from the iterations for the pick's extra rows (none kept apart: none)."""
        if not self._select_rows:
            return None
        reservation = held.enter_context(ctx.budget.reserve((self.params.select_top + 1) * len(self._select_rows)))
        spread = self.params.select_spread_by
        ctx.event("kept_apart", f"{len(self._select_rows)} train rows kept apart for the pick"
                  + (f", in the pool's shares of each {spread}" if spread else ""),
                  rows=list(self._select_rows), spread_by=spread)
        return reservation

    async def _pick(self, ctx: RunView, frontier: ParetoFrontier) -> str:
        best = frontier.best()
        ids = contenders(frontier, self.params.select_top, ctx.seed_candidate.candidate_id) if self._select_rows else []
        if not ids:  # no rows kept apart, or no child beat the seed on the pareto pool
            return best
        rows = list(self._select_rows)
        # The rows were held from the rollout budget; like heldout they run after the wall clock
        # has stopped the search. Every evaluation ends before the pick is made, whichever stopped.
        outcomes = await asyncio.gather(*(ctx.evaluate(ctx.candidate(c), rows, "select", past_wall=True)
                                          for c in ids), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BudgetExhausted):  # a USD budget: the pareto pool alone decides
                ctx.event("select_skipped", f"no rows for the pick ({outcome.reason}): best pareto mean", best=best)
                return best
            if isinstance(outcome, BaseException):
                raise outcome
        kept_means = {c: mean_reward(rs) for c, rs in zip(ids, outcomes)}  # type: ignore[arg-type]
        pick = best_on_kept(frontier, kept_means)
        ctx.event("select", f"pick {pick} on {len(rows)} train rows kept apart",
                  pareto_best=best, scores=kept_means)
        return pick

    def _start_loop(self, ctx: RunView, minibatch_rows: tuple[str, ...]) -> None:
        self._health = ProposerHealth(self.params.max_proposer_errors)
        self._rotation = Rotation(ctx.target_modules)
        self._sampler = MinibatchSampler(minibatch_rows, ctx.rng)
        self._memory = CitationMemory(self.params.cited_memory)

    async def _score_seed(self, ctx: RunView, frontier: ParetoFrontier) -> None:
        seed = ctx.seed_candidate
        try:
            seed_results = await ctx.evaluate(seed, list(ctx.pools.pareto), "seed")
            self._failed_answers.remember(seed_results)
            frontier.add(seed.candidate_id, [r.reward for r in seed_results])
            ctx.report_best(frontier.mean(seed.candidate_id) or 0.0)
        finally:
            self._seeded.set()  # set either way, so no iteration waits for a seed that will not come

    async def _score_seed_beside(self, ctx: RunView, frontier: ParetoFrontier, loop: LoopState,
                                 hold: Reservation) -> None:
        """The seed's pareto evaluation beside the first iterations, in rollouts held for it."""
        hold.spend(hold.left)  # evaluate starts them all before its first await
        try:
            await self._score_seed(ctx, frontier)
        except BudgetExhausted as exhausted:
            loop.finish(exhausted.reason)

    async def _worker(self, ctx: RunView, frontier: ParetoFrontier, loop: LoopState) -> None:
        while loop.stop is None:
            reason = ctx.stop_reason(generation=loop.iteration)
            if reason is not None:
                loop.finish(reason)
                break
            if loop.idle >= self.params.max_idle_iterations:
                ctx.event("stalled", f"{loop.idle} iterations in a row spent no rollouts")
                loop.finish(StopReason.STALLED)
                break
            iteration = loop.iteration
            loop.iteration += 1
            spent_before = ctx.usage.rollouts
            try:
                await self._iterate(ctx, frontier, iteration)
            except BudgetExhausted as exhausted:
                if loop.iteration == iteration + 1 and iteration not in self._judged:
                    loop.iteration = iteration  # an iteration that did not happen does not count
                others = ctx.budget.reserved - (self._hold.left if self._hold is not None else 0)
                if exhausted.reason is StopReason.MAX_ROLLOUTS and others:
                    await ctx.budget.wait_for_release()  # the others may not need all they reserved
                    continue
                loop.finish(exhausted.reason)
                break
            loop.idle = loop.idle + 1 if ctx.usage.rollouts == spent_before else 0

    async def _iterate(self, ctx: RunView, frontier: ParetoFrontier, iteration: int) -> None:
        params = self.params
        k = min(params.minibatch_size, len(self._sampler.task_ids))
        minibatch = self._sampler.next(k)
        pair = self._merge_pair(ctx, frontier) if params.merge_every and (iteration + 1) % params.merge_every == 0 \
            else None
        if pair:
            parents = [ctx.candidate(c) for c in pair]
        else:  # the frontier is empty only while the seed is scored: the seed is then its only member-to-be
            parents = [ctx.candidate(frontier.sample(ctx.rng)) if frontier.scores else ctx.seed_candidate]
        # The minibatch part must fit now. Alone, the pareto part is checked on acceptance; beside
        # others it is held too, else late iterations spend minibatches on children the budget
        # can no longer score (they cannot reach the frontier) and stretch the run's tail.
        needed = sum(len(ctx.uncached(p, minibatch)) for p in parents) + k
        if params.parallel_proposals > 1:
            needed += len(ctx.pools.pareto)
        with ctx.budget.reserve(needed) as reservation:
            if pair:
                await self._merge(ctx, frontier, iteration, parents, minibatch, reservation)
            else:
                await self._reflect(ctx, frontier, iteration, parents[0], minibatch, reservation)

    async def _reflect(self, ctx: RunView, frontier: ParetoFrontier, iteration: int, parent: Candidate,
                       minibatch: list[str], reservation: Reservation) -> None:
        reservation.spend(len(ctx.uncached(parent, minibatch)))
        parent_results = await ctx.evaluate(parent, minibatch, "minibatch")
        parent_score = mean_reward(parent_results)
        if self.params.skip_perfect_minibatch and all(r.reward is not None and r.reward >= 1.0
                                                      for r in parent_results):
            ctx.event("skip", "parent is perfect on the minibatch", iteration=iteration, parent=parent.candidate_id)
            return
        module, turn = self._rotation.next()
        child = await self._propose(ctx, parent, module, turn, parent_results, iteration, parent_score)
        self._memory.remember(parent_results)
        self._failed_answers.remember(parent_results)
        if child is not None:
            await self._judge(ctx, frontier, child, minibatch, reservation, [parent_score], "proposal")

    async def _judge(self, ctx: RunView, frontier: ParetoFrontier, child: tuple[Candidate, dict[str, Any]],
                     minibatch: list[str], reservation: Reservation,
                     parent_scores: list[float | None], origin: str) -> None:
        """Score the child on the minibatch, accept it on improvement over its best parent
        (a merge needs only to match it), then score it on the pareto pool."""
        candidate, fields = child
        reservation.spend(len(ctx.uncached(candidate, minibatch)))
        with self._recorded_if_cut_short(ctx, candidate, fields, "minibatch", None):
            child_score = mean_reward(await ctx.evaluate(candidate, minibatch, "minibatch"))
        known = [s for s in parent_scores if s is not None]
        bar = max(known) if known else None
        margin = self.params.acceptance_margin
        accepted = child_score is not None and bar is not None and (
            child_score >= bar + margin if origin == "merge" else child_score > bar + margin)
        pareto = ctx.uncached(candidate, list(ctx.pools.pareto))
        if accepted and not ctx.budget.fits_beyond_reserved(len(pareto), reservation):
            fields = {**fields, "error": "better on the minibatch, but the budget left cannot score it on the "
                                         f"pareto pool ({len(pareto)} rollouts)"}
            self._record_verdict(ctx, candidate, fields, child_score, None)
            raise BudgetExhausted(StopReason.MAX_ROLLOUTS)
        if not accepted:
            self._record_verdict(ctx, candidate, fields, child_score, None)
            return
        reservation.spend(len(pareto))
        with self._recorded_if_cut_short(ctx, candidate, fields, "pareto", child_score):
            pareto_results = await ctx.evaluate(candidate, list(ctx.pools.pareto), "pareto")
        # recorded once on the frontier's way: accepted proposals are exactly the frontier's children
        self._record_verdict(ctx, candidate, fields, child_score, origin)
        self._failed_answers.remember(pareto_results)
        await self._seeded.wait()  # the seed comes first on the frontier (ties go to the earlier)
        frontier.add(candidate.candidate_id, [r.reward for r in pareto_results])
        ctx.report_best(frontier.mean(candidate.candidate_id) or 0.0)
        ctx.event("accept", f"{candidate.candidate_id} accepted", parents=list(candidate.parent_ids),
                  pareto_score=frontier.mean(candidate.candidate_id), origin=origin)

    def _record_verdict(self, ctx: RunView, candidate: Candidate, fields: dict[str, Any], child_score: float | None,
                        accepted_as: str | None) -> None:
        """The child's proposals row and origin: `accepted_as` (proposal, merge) or rejected."""
        self._judged.add(fields["iteration"])
        ctx.record_proposal(**fields, child_id=candidate.candidate_id, accepted=accepted_as is not None,
                            child_minibatch_score=child_score)
        ctx.set_origin(candidate.candidate_id, accepted_as or "rejected")

    @contextmanager
    def _recorded_if_cut_short(self, ctx: RunView, candidate: Candidate, fields: dict[str, Any], stage: str,
                               child_score: float | None) -> Iterator[None]:
        """A child whose scoring the run stopped (wall clock, USD budget, a failure) still gets
        its proposals row, as rejected: its proposer request and replies stay inspectable."""
        try:
            yield
        except BaseException as stopped:
            why = stopped.reason.value if isinstance(stopped, BudgetExhausted) else type(stopped).__name__
            error = f"the run stopped ({why}) before the child's {stage} scoring finished"
            self._record_verdict(ctx, candidate, {**fields, "error": error}, child_score, None)
            raise

    # ---- merge -----------------------------------------------------------------------

    def _merge_pair(self, ctx: RunView, frontier: ParetoFrontier) -> tuple[str, str] | None:
        """Two non-dominated candidates that lead on the most rows the other does not, whose
        union of learned lines is a text not seen yet; None when there is no such pair."""
        leaders = frontier.non_dominated()
        fronts = frontier.fronts()
        rows = {c: {i for i, front in enumerate(fronts) if c in front} for c in leaders}
        seen = {c.digest for c in ctx.candidates}
        best: tuple[int, str, str] | None = None
        ids = list(leaders)
        for i, a in enumerate(ids):
            for b in ids[i + 1:]:
                gain = min(len(rows[a] - rows[b]), len(rows[b] - rows[a]))
                if gain == 0 or (best is not None and gain <= best[0]):
                    continue
                texts = self._merged_texts(ctx, a, b)
                if texts is not None and digest_of(texts) not in seen:
                    best = (gain, a, b)
        return (best[1], best[2]) if best else None

    def _merged_texts(self, ctx: RunView, a: str, b: str) -> dict[str, str] | None:
        """The union of learned lines of `b` into `a`, per target module; None when it adds nothing."""
        first, second = ctx.candidate(a).texts, ctx.candidate(b).texts
        merged = dict(first)
        caps = self._edit.section_caps
        for module in ctx.target_modules:
            field = ctx.program.field_of(module)
            merged[field] = union(first[field], second[field], caps)
        return merged if merged != first else None

    async def _merge(self, ctx: RunView, frontier: ParetoFrontier, iteration: int, parents: list[Candidate],
                     minibatch: list[str], reservation: Reservation) -> None:
        scores = []
        for parent in parents:
            reservation.spend(len(ctx.uncached(parent, minibatch)))
            scores.append(mean_reward(await ctx.evaluate(parent, minibatch, "minibatch")))
        texts = self._merged_texts(ctx, parents[0].candidate_id, parents[1].candidate_id)
        if texts is None:
            return
        child = ctx.add_candidate(texts, tuple(p.candidate_id for p in parents), "merge")
        fields = {"iteration": iteration, "parent_id": parents[0].candidate_id, "module": None,
                  "proposer_model": None, "edit_format": "merge", "attempts": 0, "status": "changed",
                  "changed": True, "parent_minibatch_score": max((s for s in scores if s is not None), default=None),
                  "prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0, "latency_s": 0.0, "error": None,
                  "merged_from": [p.candidate_id for p in parents],
                  "proposer_scopes": []}  # it calls no proposer: it must not take others' calls
        await self._judge(ctx, frontier, (child, fields), minibatch, reservation, scores, "merge")

    # ---- reflection ---------------------------------------------------------------------

    async def _propose(
        self, ctx: RunView, parent: Candidate, module: str, turn_index: int, results: list[RolloutResult],
        iteration: int, parent_score: float | None,
    ) -> tuple[Candidate, dict[str, Any]] | None:
        params = self.params
        field = ctx.program.field_of(module)
        current = parent.texts[field]
        settings = self._edit
        temperature = params.proposer_temperature if params.proposer_temperature is not None \
            else ctx.spec.proposer.temperature
        inputs = TurnInputs(current=current, results=results, settings=settings,
                            task_info=ctx.task_info if params.use_task_info else None,
                            samples=params.proposal_samples, lines_wanted=params.lines_wanted,
                            sampling={"temperature": temperature,
                                      "max_tokens": params.proposer_max_tokens or ctx.spec.proposer.max_tokens},
                            earlier=self._memory.pairs(), failed_answers=self._failed_answers.answers())
        examples_idle = params.asking_when_uncited and inputs.examples_edit.status != "changed"
        plan = format_plan(current, params.edit_formats, turn_index, params.proposal_attempts, results, settings,
                           params.examples_first, examples_idle)
        scopes: list[str] = []  # this proposal's gateway scopes: other iterations may be proposing too
        turn = await (at_once if params.sample_together else one_by_one)(ctx, plan, inputs, self._health, scopes)
        proposal = turn.proposal
        status = proposal.status if proposal is not None else "error"
        fields = {
            "iteration": iteration, "parent_id": parent.candidate_id, "module": module,
            "proposer_model": ctx.spec.proposer.model if turn.calls else None, "edit_format": turn.edit_format,
            "attempts": turn.calls,
            "status": status, "changed": status == "changed", "parent_minibatch_score": parent_score,
            "prompt_tokens": turn.prompt_tokens, "completion_tokens": turn.completion_tokens,
            "latency_s": turn.latency_s, "cost_usd": ctx.proposer_cost(turn.prompt_tokens, turn.completion_tokens),
            "error": turn.error, "proposer_scopes": scopes,
            **(_proposal_record(proposal) if proposal is not None else {}),
        }
        if proposal is None or status != "changed":
            ctx.record_proposal(**fields, accepted=False)
            ctx.event("proposal_rejected", f"proposal {status}", iteration=iteration, edit_format=turn.edit_format,
                      screened_out=proposal.dropped if proposal else None)
            return None
        child = ctx.add_candidate({**parent.texts, field: proposal.text}, (parent.candidate_id,), "proposal")
        return child, fields


def _proposal_record(proposal: Proposal) -> dict[str, Any]:
    """The proposer's request and raw replies, and what the screen dropped, for the evidence."""
    return {"proposer_prompt": proposal.prompt, "proposer_replies": list(proposal.replies),
            "screened_out_json": json.dumps(proposal.dropped, sort_keys=True), "truncated_replies": proposal.truncated_replies,
            "learned_lines": len(LearnedModule.parse(proposal.text).all_lines())}
