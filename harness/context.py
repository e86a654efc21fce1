"""The run context: everything an optimizer may touch. `evaluate` is the single choke
point for rollouts: it asks the budget (harness/budget.py) before any rollout, caches
(candidate digest, task id) so no rollout repeats, bounds concurrency (through the
client) and records evidence (through the recorder, harness/evidence/recorder.py)."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Callable

from harness.budget import Budget, BudgetExhausted, RunFailed, StopReason
from harness.candidates import Candidate, RolloutResult
from harness.client import ContainerClient
from harness.contract import PolicyBlock, ProgramResponse, RolloutRequest
from harness.container_keeper import ContainerKeeper, RestartHook
from harness.errors import ServiceError
from harness.evidence.recorder import Recorder
from harness.llm import ChatClient, ChatMessage, ChatResult
from harness.outcome import RolloutOutcome, judge
from harness.pricing import cost_usd
from harness.run_state import OPTIMIZATION_STAGES, Evidence, Progress, Usage
from harness.specs import Pools, RunSpec

if TYPE_CHECKING:
    from harness.gateway.session import GatewaySession

__all__ = ["OPTIMIZATION_STAGES", "BudgetExhausted", "Evidence", "Progress", "RunContext", "RunFailed", "StopReason",
           "Usage"]

class RunContext:
    def __init__(
        self,
        spec: RunSpec,
        client: ContainerClient,
        program: ProgramResponse,
        policy: PolicyBlock,
        proposer: ChatClient,
        task_info: dict[str, Any] | None = None,
        rows: dict[str, dict[str, Any]] | None = None,
        observer: Callable[[Progress], None] | None = None,
        max_error_rate: float = 0.5,
        restart_container: RestartHook | None = None,
        gateway: "GatewaySession | None" = None,
        pools: Pools | None = None,
    ):
        self.spec = spec
        self.run_id = spec.run_id
        self.client = client
        self.program = program
        self.policy = policy
        self.proposer_client = proposer
        self.task_info = task_info
        self.observer = observer
        self.max_error_rate = max_error_rate
        self.rng = random.Random(spec.seed)
        self.pools = pools or spec.pools  # preflight's: stratified pools' rows chosen
        self.target_modules = list(program.target_modules)
        self.usage = Usage()
        self.budget = Budget(spec.budget, self.usage)
        # with the gateway in the path its ledger is the one source of cost
        self.recorder = Recorder(self.run_id, metered=gateway is not None)
        self.best_score: float | None = None
        self._cache: dict[tuple[str, str], RolloutResult] = {}
        # (digest, task) pairs being rolled out: concurrent evaluations (parallel proposals)
        # do not repeat a rollout
        self._in_flight: dict[tuple[str, str], asyncio.Event] = {}
        self._rows: dict[str, dict[str, Any]] = dict(rows or {})
        self._candidates: dict[str, Candidate] = {}
        self._seq = 0
        # bounds rollouts in flight, so latency_s measures the call, not the queue
        self._slots = asyncio.Semaphore(spec.concurrency)
        # model calls go through the inference gateway: per-rollout URLs, metered cost
        self.gateway = gateway
        # a container that stops answering (its process died) is restarted by whoever started it
        self.container = ContainerKeeper(client, spec.container.name, restart_container, self.event)
        # spend metered by an earlier process of this run (restored from its checkpoint)
        self._carried_cost = 0.0
        self.seed_candidate = self.add_candidate(dict(program.seed_candidate), (), "seed")

    # ---- checkpoint ------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """What a resumed run needs to go on from here (see harness/checkpoint.py)."""
        return {"usage": asdict(self.usage), "seq": self._seq, "proposal_seq": self.recorder.proposal_seq,
                "elapsed_s": self.elapsed(), "container_restarts": self.container.restarts,
                # vars, not asdict: the rows are fresh dicts already, and asdict's deep copy of
                # every field of every row was most of a checkpoint's cost in a long run
                "evidence": vars(self.recorder.evidence())}

    def restore(self, state: dict[str, Any]) -> None:
        """Take up a snapshot: candidates, evidence, counters, the clock, and every rollout
        it recorded as cached, so none is rolled out again."""
        self.usage = Usage(**state["usage"])
        self.budget.usage = self.usage
        self._carried_cost = self.usage.cost_usd if self.gateway is not None else 0.0
        self.recorder.restore(Evidence(**state["evidence"]), state["proposal_seq"])
        self._seq = state["seq"]
        self.container.restarts = state["container_restarts"]
        self.budget.resume_clock(state["elapsed_s"])
        self._candidates = {}
        for row in self.recorder.candidates:
            candidate = Candidate(candidate_id=row.candidate_id, index=row.index, texts=json.loads(row.modules_json),
                                  parent_ids=tuple(row.parent_ids), generation=row.generation, origin=row.origin)
            self._candidates[candidate.candidate_id] = candidate
        self.seed_candidate = self._candidates[self.recorder.candidates[0].candidate_id]
        self._cache = {}
        for rollout in self.recorder.rollouts:
            if rollout.status == "refused":
                continue  # never ran: not a result
            candidate = self._candidates[rollout.candidate_id]
            self._cache[(candidate.digest, rollout.task_id)] = RolloutResult(
                candidate_id=rollout.candidate_id, task_id=rollout.task_id, reward=rollout.reward,
                status=rollout.status, error=rollout.error, feedback=rollout.feedback or "",
                output=rollout.output or "", task=self._rows.get(rollout.task_id), inputs=rollout.inputs,
                feedback_source=rollout.feedback_source,
                answer_examples=json.loads(rollout.answer_examples_json) if rollout.answer_examples_json else None)

    # ---- time and budget -------------------------------------------------------

    def elapsed(self) -> float:
        return self.budget.elapsed()

    def stop_reason(self, generation: int | None = None) -> StopReason | None:
        return self.budget.stop_reason(generation)

    @property
    def rollouts_left(self) -> int:
        return self.budget.rollouts_left

    def uncached(self, candidate: Candidate, task_ids: list[str] | tuple[str, ...]) -> list[str]:
        seen: set[str] = set()
        out = []
        for task_id in task_ids:
            key = (candidate.digest, task_id)
            if key not in self._cache and key not in self._in_flight and task_id not in seen:
                seen.add(task_id)
                out.append(task_id)
        return out

    # ---- candidates --------------------------------------------------------------

    def add_candidate(self, texts: dict[str, str], parent_ids: tuple[str, ...], origin: str) -> Candidate:
        index = len(self._candidates)
        generation = 1 + max((self._candidates[p].generation for p in parent_ids), default=-1)
        candidate = Candidate(
            candidate_id=f"c{index:04d}", index=index, texts=dict(texts),
            parent_ids=tuple(parent_ids), generation=generation, origin=origin,
        )
        self._candidates[candidate.candidate_id] = candidate
        self.recorder.candidate(candidate, rollouts=self.usage.rollouts, elapsed_s=self.elapsed(),
                                cost_usd=None if self.usage.cost_unknown else self.usage.cost_usd)
        return candidate

    @property
    def evidence(self) -> Evidence:
        """The evidence tables so far, as plain rows (made and changed by `recorder` only)."""
        return self.recorder.evidence()

    def set_origin(self, candidate_id: str, origin: str) -> None:
        """Mark a candidate after the fact (e.g. a proposal rejected on its minibatch)."""
        self.recorder.set_origin(candidate_id, origin)

    def candidate(self, candidate_id: str) -> Candidate:
        return self._candidates[candidate_id]

    @property
    def candidates(self) -> list[Candidate]:
        return list(self._candidates.values())

    # ---- rollouts ----------------------------------------------------------------

    async def task_rows(self, task_ids: list[str] | tuple[str, ...]) -> dict[str, dict[str, Any]]:
        """The container's rows of `task_ids` (preflight's, else asked for now)."""
        await self._rows_for(list(task_ids))
        return {t: self._rows[t] for t in task_ids}

    async def _rows_for(self, task_ids: list[str]) -> None:
        missing = [t for t in task_ids if t not in self._rows]
        by_split: dict[str, list[str]] = {}
        for task_id in missing:
            by_split.setdefault(task_id.split(":", 1)[0], []).append(task_id)
        for split, ids in by_split.items():
            for task in await self.client.tasks(split, ids):
                self._rows[task.task_id] = task.model_dump()

    async def evaluate(self, candidate: Candidate, task_ids: list[str] | tuple[str, ...], stage: str, *,
                       past_wall: bool = False) -> list[RolloutResult]:
        """Roll out `candidate` on `task_ids`; cached pairs are not rolled out again.
        Raises BudgetExhausted, before any rollout, if the uncached part does not fit
        (`past_wall`: the wall clock does not refuse them, as for rollouts that finish a
        search the wall stopped). Pairs another evaluation is rolling out are awaited, not
        rolled out twice."""
        todo = self.uncached(candidate, task_ids)
        elsewhere = {self._in_flight[(candidate.digest, t)] for t in task_ids if (candidate.digest, t) in self._in_flight}
        optimizing = stage in OPTIMIZATION_STAGES
        if optimizing and todo:
            self.budget.check_rollouts(len(todo), wall=not past_wall)
        if todo:
            mine = {(candidate.digest, t): asyncio.Event() for t in todo}
            self._in_flight.update(mine)
            if optimizing:
                self.budget.start_rollouts(len(todo))
            try:
                await self._evaluate_new(candidate, todo, stage)
            finally:
                for key, event in mine.items():
                    del self._in_flight[key]
                    event.set()
        for event in elsewhere:
            await event.wait()
        if any((candidate.digest, t) not in self._cache for t in task_ids):
            # the other evaluation's rollout of a pair was refused (budget) or ended with an error
            if self.usage.budget_refused:
                raise self.budget.refused_by_gateway()
            raise RunFailed(self.container.lost or "a rollout awaited from a concurrent evaluation did not finish")
        return [self._cache[(candidate.digest, t)] for t in task_ids]

    async def _evaluate_new(self, candidate: Candidate, todo: list[str], stage: str) -> None:
        await self._rows_for(todo)
        if self.gateway is not None:
            await self.gateway.announce({self.rollout_id(candidate, t): candidate.candidate_id for t in todo},
                                        {candidate.candidate_id: candidate.texts}, budgeted=stage in OPTIMIZATION_STAGES)
        seqs = list(range(self._seq, self._seq + len(todo)))
        self._seq += len(todo)
        results = await asyncio.gather(
            *(self._rollout(candidate, task_id, stage, seq) for task_id, seq in zip(todo, seqs))
        )
        refused: set[str] = set()
        if self.gateway is not None:
            await self.gateway.close_scopes([self.rollout_id(candidate, t) for t in todo])
            if self.gateway.refresh_due():
                await self.sync_spend()
            # all refusals, not just the new ones: a concurrent evaluation's read may have seen ours first
            refused = set(self.gateway.spend.refused_scopes)
        for task_id, result in zip(todo, results):
            if self.rollout_id(candidate, task_id) in refused:
                self._mark_refused(self.rollout_id(candidate, task_id))  # not run: neither cached nor failed
            else:
                self._cache[(candidate.digest, task_id)] = result
        if any(self.rollout_id(candidate, t) in refused for t in todo):
            raise self.budget.refused_by_gateway()
        if self.container.lost is not None:
            raise RunFailed(self.container.lost)
        self._check_error_rate()
        self.notify(stage)

    def cached_result(self, candidate: Candidate, task_id: str) -> RolloutResult | None:
        return self._cache.get((candidate.digest, task_id))

    async def _rollout(self, candidate: Candidate, task_id: str, stage: str, seq: int) -> RolloutResult:
        row = self._rows[task_id]
        rollout_id = self.rollout_id(candidate, task_id)
        policy = self.gateway.policy_block(self.policy, rollout_id) if self.gateway is not None else self.policy
        request = RolloutRequest(
            rollout_id=rollout_id, task_id=task_id, candidate=candidate.texts, task=row, policy=policy,
            metadata={"candidate_id": candidate.candidate_id, "seed": self.spec.seed, "stage": stage, "run_id": self.run_id},
        )
        error = error_kind = None
        prompt_tokens = completion_tokens = 0
        container_cost: float | None = None
        answers: list[str] = []  # error answers of attempts before the last one
        async with self._slots:
            started = time.monotonic()
            try:
                response = await self.container.send(request, answers)
            except ServiceError as exc:
                response = None
                error, error_kind = str(exc), exc.kind.value
            latency = time.monotonic() - started
        outcome = RolloutOutcome(error=error, error_kind=error_kind) if response is None else judge(response)
        if outcome.error is not None and answers and answers[0] not in outcome.error:
            outcome.error += f" (first answer: {answers[0]})"
        if response is not None:
            prompt_tokens, completion_tokens = response.usage.prompt_tokens, response.usage.completion_tokens
            container_cost = response.usage.cost_usd
        status = "ok" if outcome.reward is not None else "error"
        # without the gateway the run prices the call; with it, the gateway's ledger does
        cost = None if self.gateway is not None else container_cost if container_cost is not None else cost_usd(
            self.policy.provider, self.policy.model, prompt_tokens, completion_tokens)
        self._account(stage, status, prompt_tokens, completion_tokens, cost)
        self.recorder.rollout(
            seq=seq, rollout_id=rollout_id, candidate_id=candidate.candidate_id, task_id=task_id,
            split=task_id.split(":", 1)[0], stage=stage, reward=outcome.reward, status=status,
            container_status=outcome.container_status, error=outcome.error, error_kind=outcome.error_kind,
            prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, cost_usd=cost, latency_s=latency,
            elapsed_s=self.elapsed(), output=outcome.output, feedback=outcome.feedback,
            feedback_source=outcome.feedback_source, inputs=outcome.inputs,
            answer_examples_json=json.dumps(outcome.answer_examples, ensure_ascii=False, sort_keys=True)
            if outcome.answer_examples else None)
        return RolloutResult(candidate_id=candidate.candidate_id, task_id=task_id, reward=outcome.reward,
                             status=status, error=outcome.error, feedback=outcome.feedback, output=outcome.output,
                             task=row, inputs=outcome.inputs, feedback_source=outcome.feedback_source,
                             answer_examples=outcome.answer_examples)

    def restarted_before_start(self, error: str, restarted: bool) -> None:
        """Preflight found the container not answering and asked for a restart: this run's."""
        self.container.restarted_before_start(error, restarted)

    def _account(self, stage: str, status: str, prompt_tokens: int, completion_tokens: int, cost: float | None) -> None:
        usage = self.usage
        if stage in OPTIMIZATION_STAGES:
            usage.rollouts += 1
            self.budget.finish_rollout()  # started in evaluate; now counted as spent
        else:
            usage.heldout_rollouts += 1
        if status != "ok":
            usage.failed_rollouts += 1
        usage.policy_prompt_tokens += prompt_tokens
        usage.policy_completion_tokens += completion_tokens
        if self.gateway is None:  # with the gateway, its ledger is the run's cost (see sync_spend)
            if cost is None:
                usage.cost_unknown = True
            else:
                usage.cost_usd += cost
        self.notify(stage)  # per rollout: a person watching sees each one land, not each batch

    def _check_error_rate(self, final: bool = False) -> None:
        """Fail the run when more rollouts failed than tolerated: from 10 rollouts on, and
        at the end of the run (`final`) whatever the count."""
        total = self.usage.rollouts + self.usage.heldout_rollouts
        if total >= (1 if final else 10) and self.usage.failed_rollouts / total > self.max_error_rate:
            raise RunFailed(
                f"{self.usage.failed_rollouts}/{total} rollouts failed (tolerance {self.max_error_rate:.0%}); "
                f"last error: {self.recorder.last_error()}", stop_reason=StopReason.ERROR_RATE)

    def check_error_rate(self) -> None:
        """The end-of-run check (see _check_error_rate)."""
        self._check_error_rate(final=True)

    # ---- proposer ----------------------------------------------------------------

    async def propose(self, messages: list[ChatMessage], *, temperature: float, max_tokens: int,
                      scopes: list[str] | None = None) -> ChatResult:
        """One proposer call, metered. Raises BudgetExhausted when the cost budget is spent
        or the wall budget runs out, also during the call. The call's gateway scope is
        appended to `scopes`, for `record_proposal`."""
        self.budget.check_proposal()
        # A seed drawn from the run's RNG keeps sampled proposals reproducible.
        client = self.proposer_client
        scope = None
        if self.gateway is not None:  # one attributed URL per proposer call
            client = self.gateway.proposer_client(client)
            scope = self.gateway.last_proposer_scope  # this call's, before another call can start
            if scopes is not None:
                scopes.append(scope)
        call = client.complete(messages, temperature=temperature, max_tokens=max_tokens,
                               seed=self.rng.randrange(2**31))
        self.notify("proposing")  # a local proposer's reply takes tens of seconds: say what is going on
        try:
            # a slow proposer (minutes on a local model) must not carry the run past its wall budget
            result = await asyncio.wait_for(call, timeout=self.budget.wall_left())
        except TimeoutError:
            # the loop's timers are millisecond-grained and may fire a hair early: a run
            # stopped by its wall clock records at least the wall (run.py's optimize_s)
            while left := self.budget.wall_left():
                await asyncio.sleep(left)
            raise BudgetExhausted(StopReason.MAX_WALL_S) from None
        except ServiceError:
            if self.gateway is not None:
                await self.sync_spend()
                if scope in self.gateway.spend.refused_scopes:
                    raise self.budget.refused_by_gateway() from None
            raise
        self.usage.proposer_calls += 1
        self.usage.proposer_prompt_tokens += result.prompt_tokens
        self.usage.proposer_completion_tokens += result.completion_tokens
        if self.gateway is None:  # with the gateway, its ledger is the run's cost (see sync_spend)
            cost = self.proposer_cost(result.prompt_tokens, result.completion_tokens)
            if cost is None:
                self.usage.cost_unknown = True
            else:
                self.usage.cost_usd += cost
        elif self.gateway.refresh_due():
            await self.sync_spend()
        return result

    # ---- gateway -----------------------------------------------------------------

    def rollout_id(self, candidate: Candidate, task_id: str) -> str:
        return f"{self.run_id}-{candidate.candidate_id}-{task_id}"

    async def sync_spend(self) -> set[str]:
        """Take the run's cost from the gateway, which meters every call (graders and user
        simulators too); returns the scopes it refused since the last look."""
        assert self.gateway is not None
        refused = await self.gateway.refresh()
        spend = self.budget.gateway_spend = self.gateway.spend
        self.usage.cost_usd = self._carried_cost + spend.cost_usd
        self.usage.cost_unknown = self.usage.cost_unknown or spend.unknown_cost_calls > 0
        self.usage.budget_refused = self.usage.budget_refused or bool(refused)
        return refused

    def _mark_refused(self, rollout_id: str) -> None:
        if self.recorder.refuse(rollout_id):
            self.usage.failed_rollouts -= 1

    def proposer_cost(self, prompt_tokens: int, completion_tokens: int) -> float | None:
        return cost_usd(self.spec.proposer.provider, self.spec.proposer.model, prompt_tokens, completion_tokens)

    def adopt_lineage(self, parents: dict[str, list[str]], origin: str) -> list[dict[str, Any]]:
        """Another optimizer's candidate tree becomes the lineage (see `Recorder.adopt_lineage`)."""
        return self.recorder.adopt_lineage(parents, origin)

    def record_proposal(self, proposer_scopes: list[str] | None = None, **fields: Any) -> str:
        """Add a proposals row; `proposer_scopes` (from `propose(scopes=...)`) ties its
        proposer calls to it, else every call since the last recorded proposal is."""
        proposal_id = self.recorder.proposal(fields)
        if self.gateway is not None:
            self.gateway.assign_proposal(proposal_id, proposer_scopes)
        return proposal_id

    # ---- events and progress ---------------------------------------------------------

    def event(self, kind: str, message: str, **data: Any) -> None:
        self.recorder.event(kind, message, self.elapsed(), data)

    def report_best(self, score: float) -> None:
        self.best_score = score if self.best_score is None else max(self.best_score, score)
        self.notify("best")

    def notify(self, stage: str) -> None:
        if self.observer is not None:
            self.observer(Progress(self.usage.rollouts, self.spec.budget.max_rollouts, self.best_score,
                                   self.usage.tokens, stage, self.gateway.spend if self.gateway else None,
                                   self.usage.heldout_rollouts))
