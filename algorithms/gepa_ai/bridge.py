"""The bridge between the `gepa` library, which runs synchronously in a worker thread,
and the run's event loop, which owns the run context.

Everything that touches the context runs on the loop (`Bridge.call` submits a coroutine
and waits), so the context is only ever used from one thread. The bridge is also the
library's reflection model, its stop condition and its callback object: from those it
maps library candidates to ours (one id per digest, parent = the iteration's selected
parent), records proposals and events, and stops the library where the run's budget
(harness/budget.py) says.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Coroutine, TypeVar

from gepa.strategies.instruction_proposal import InstructionProposalSignature

from algorithms.gepa.proposer import task_context
from algorithms.gepa_ai.params import GepaLibraryParams
from algorithms.protocol import RunView
from harness.budget import BudgetExhausted, StopReason
from harness.candidates import Candidate, RolloutResult, digest_of, mean_reward
from harness.errors import FailureKind, ServiceError
from harness.llm import ChatMessage, ChatResult

T = TypeVar("T")


class Halt(Exception):
    """Raised through the library to abort the current iteration (budget spent, run
    cancelled or failed); the stop condition then ends the library's loop."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class QuietLogger:
    """The library's logger: keeps the last lines for error reports instead of printing."""

    def __init__(self, keep: int = 200):
        self.lines: deque[str] = deque(maxlen=keep)

    def log(self, message: str) -> None:
        self.lines.append(str(message))


@dataclass
class _Iteration:
    number: int  # 0-based, as our GEPA counts
    parent_id: str | None = None
    parent_texts: dict[str, str] = field(default_factory=dict)
    parent_results: list[RolloutResult] | None = None
    components: list[str] = field(default_factory=list)
    reflections: list[dict[str, Any]] = field(default_factory=list)
    new_texts: dict[str, str] | None = None
    child_id: str | None = None
    child_created: bool = False
    child_results: list[RolloutResult] | None = None
    accepted: bool | None = None
    halted: str | None = None


class Bridge:
    def __init__(self, ctx: RunView, loop: asyncio.AbstractEventLoop, params: GepaLibraryParams):
        self.ctx = ctx
        self.loop = loop
        self.params = params
        self.logger = QuietLogger()
        seed = ctx.seed_candidate
        self.fields = [ctx.program.field_of(m) for m in ctx.target_modules]
        self.module_of = {ctx.program.field_of(m): m for m in ctx.target_modules}
        # the library evolves the target fields only; the rest of the seed rides along
        self.library_seed = {f: seed.texts[f] for f in self.fields}
        self.by_digest: dict[str, Candidate] = {seed.digest: seed}
        self.library_ids: dict[int, str] = {}
        self.pareto = list(ctx.pools.pareto)
        self.prompt_template = reflection_template(params, ctx.task_info)
        self.edit_format = ("library_template" if params.reflection_prompt_template else
                            "library_task_context" if self.prompt_template else "library_default")
        self.stop_reason: StopReason | None = None
        self.fatal: BaseException | None = None
        self.cancelled = False
        self.completed_iterations = 0
        self.library_state: Any = None  # the library's GEPAState, once its loop runs
        self._iteration: _Iteration | None = None
        self._idle = 0
        self._last_rollouts: int | None = None
        self._proposer_errors = 0  # consecutive failed proposer calls
        self._inflight: set[concurrent.futures.Future] = set()
        self._lock = threading.Lock()

    # ---- thread -> loop -------------------------------------------------------------

    @property
    def halted(self) -> bool:
        return self.cancelled or self.fatal is not None or self.stop_reason is not None

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the run's loop and wait for it (from the library's thread)."""
        if self.cancelled:
            coro.close()
            raise Halt("cancelled")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        with self._lock:
            self._inflight.add(future)
        try:
            return future.result()
        except BudgetExhausted as exc:
            raise Halt(exc.reason) from None
        except concurrent.futures.CancelledError:
            self.cancelled = True
            raise Halt("cancelled") from None
        finally:
            with self._lock:
                self._inflight.discard(future)

    def cancel(self) -> None:
        """The run's coroutine was cancelled: make the library's thread wind down."""
        self.cancelled = True
        with self._lock:
            pending = list(self._inflight)
        for future in pending:
            future.cancel()

    def fail(self, exc: BaseException) -> None:
        if self.fatal is None and not isinstance(exc, Halt):
            self.fatal = exc

    # ---- candidates and rollouts (adapter.evaluate) ---------------------------------------

    def evaluate(self, library_texts: dict[str, str], task_ids: list[str]) -> tuple[list[RolloutResult], int]:
        if self.halted:
            raise Halt(self.stop_reason or "halted")
        try:
            return self.call(self._evaluate(library_texts, task_ids))
        except Halt:
            raise
        except Exception as exc:  # RunFailed, a container that stopped answering: the run fails
            self.fail(exc)
            raise

    def _stage(self, candidate: Candidate | None, task_ids: list[str]) -> str:
        """Our stage names, from the batch: the library's valset is the pareto pool."""
        if len(task_ids) == len(self.pareto) and set(task_ids) == set(self.pareto):
            return "seed" if candidate is self.ctx.seed_candidate else "pareto"
        return "minibatch"

    async def _evaluate(self, library_texts: dict[str, str], task_ids: list[str]) -> tuple[list[RolloutResult], int]:
        ctx = self.ctx
        texts = {**ctx.seed_candidate.texts, **library_texts}
        digest = digest_of(texts)
        candidate = self.by_digest.get(digest)
        it = self._iteration
        stage = self._stage(candidate, task_ids)  # a new candidate is never the seed
        needed = len(set(task_ids)) if candidate is None else len(ctx.uncached(candidate, task_ids))
        try:
            if candidate is None:  # refuse before creating a candidate that would have no rollouts
                ctx.budget.check_rollouts(needed)
                parents = (it.parent_id,) if it is not None and it.parent_id is not None else ()
                candidate = ctx.add_candidate(texts, parents, "library")
                self.by_digest[digest] = candidate
                if it is not None:
                    it.child_created = True
            results = await ctx.evaluate(candidate, task_ids, stage)
        except BudgetExhausted as exc:
            self._record_budget_stop(exc.reason, "refused", stage=stage, needed=needed,
                                     candidate=candidate.candidate_id if candidate else None)
            raise
        if it is not None and stage == "minibatch":
            if it.parent_results is None and candidate.candidate_id == it.parent_id:
                it.parent_results = results
            elif it.new_texts is not None:
                it.child_id, it.child_results = candidate.candidate_id, results
        return results, needed

    @property
    def library_metric_calls(self) -> int:
        return self.library_state.total_num_evals if self.library_state is not None else 0

    def _record_budget_stop(self, reason: StopReason, how: str, **data: Any) -> None:
        if self.stop_reason is not None:
            return
        self.stop_reason = reason
        ctx = self.ctx
        if self._iteration is not None:
            self._iteration.halted = reason
        ctx.event("budget_stop", f"library stopped: {reason} ({how})", reason=reason, how=how,
                  rollouts=ctx.usage.rollouts, rollouts_left=ctx.rollouts_left,
                  budget=ctx.spec.budget.max_rollouts, library_metric_calls=self.library_metric_calls,
                  iteration=self._iteration.number if self._iteration else None, **data)

    # ---- reflection model -------------------------------------------------------------

    def reflect(self, prompt: str | list[dict[str, Any]]) -> str:
        """The library's reflection LM: one metered call to our proposer endpoint."""
        if self.halted:
            raise Halt(self.stop_reason or "halted")
        if isinstance(prompt, str):
            messages = [ChatMessage(role="user", content=prompt)]
        else:  # multimodal/chat form: keep the text parts
            messages = [ChatMessage(role=m.get("role", "user"), content=_text_of(m.get("content"))) for m in prompt]
        component = self._component_of(messages[-1].content if messages else "")
        record: dict[str, Any] = {"component": component, "prompt_tokens": 0, "completion_tokens": 0,
                                  "latency_s": 0.0, "error": None}
        try:
            result: ChatResult = self.call(self._propose(messages))
        except Halt as halt:
            record["error"] = f"stopped: {halt.reason}"
            self._add_reflection(record)
            raise
        except ServiceError as exc:  # the library drops this proposal; an endpoint that keeps failing fails the run
            record["error"] = str(exc)
            self._add_reflection(record)
            self._proposer_errors += 1
            if exc.kind is FailureKind.FATAL or self._proposer_errors >= self.params.max_proposer_errors:
                self.fail(exc)
            raise
        except Exception as exc:
            self.fail(exc)
            raise
        self._proposer_errors = 0
        record.update(prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens,
                      latency_s=result.latency_s)
        self._add_reflection(record)
        return result.text

    async def _propose(self, messages: list[ChatMessage]) -> ChatResult:
        p, proposer = self.params, self.ctx.spec.proposer
        temperature = p.proposer_temperature if p.proposer_temperature is not None else proposer.temperature
        try:
            return await self.ctx.propose(messages, temperature=temperature,
                                          max_tokens=p.proposer_max_tokens or proposer.max_tokens)
        except BudgetExhausted as exc:
            self._record_budget_stop(exc.reason, "refused", stage="reflection")
            raise

    def _component_of(self, prompt: str) -> str | None:
        it = self._iteration
        if it is None or not it.components:
            return None
        if len(it.components) > 1:
            hits = [c for c in it.components if it.parent_texts.get(c) and it.parent_texts[c] in prompt]
            if len(hits) == 1:
                return hits[0]
            done = {r["component"] for r in it.reflections if r["error"] is None}
            return next((c for c in it.components if c not in done), it.components[0])
        return it.components[0]

    def _add_reflection(self, record: dict[str, Any]) -> None:
        if self._iteration is not None:
            self._iteration.reflections.append(record)

    # ---- stop condition -----------------------------------------------------------------

    def __call__(self, state: Any) -> bool:
        """The library's stopper, checked before each iteration."""
        self.library_state = state
        if self.halted:
            return True
        try:
            self.call(self._check_stop(state.i + 1))
        except Halt:
            return True
        except Exception as exc:
            self.fail(exc)
            return True
        return self.stop_reason is not None

    async def _check_stop(self, iterations_done: int) -> None:
        ctx = self.ctx
        reason = ctx.stop_reason(generation=iterations_done)
        if reason is not None:
            self._record_budget_stop(reason, "stopper")
            return
        rollouts = ctx.usage.rollouts
        self._idle = self._idle + 1 if rollouts == self._last_rollouts else 0
        self._last_rollouts = rollouts
        if self._idle >= self.params.max_idle_iterations:
            self.stop_reason = StopReason.STALLED
            ctx.event("stalled", f"{self._idle} iterations in a row spent no rollouts")

    # ---- library callbacks ----------------------------------------------------------------

    def _on_loop(self, handler: Any, event: Any) -> None:
        """Run a callback's bookkeeping on the loop; a failure there fails the run (the
        library would only log it)."""
        if self.cancelled:
            return
        try:
            self.call(handler(event))
        except Halt:
            pass
        except Exception as exc:
            self.fail(exc)

    def on_iteration_start(self, event: Any) -> None:
        self._iteration = _Iteration(number=event["iteration"] - 1)

    def on_candidate_selected(self, event: Any) -> None:
        self._on_loop(self._candidate_selected, event)

    async def _candidate_selected(self, event: Any) -> None:
        it = self._iteration
        if it is None:
            return
        texts = dict(event["candidate"])
        it.parent_texts = texts
        parent = self.by_digest.get(digest_of({**self.ctx.seed_candidate.texts, **texts}))
        it.parent_id = parent.candidate_id if parent else self.library_ids.get(event["candidate_idx"])

    def on_evaluation_skipped(self, event: Any) -> None:
        self._on_loop(self._evaluation_skipped, event)

    async def _evaluation_skipped(self, event: Any) -> None:
        it = self._iteration
        if event.get("reason") == "all_scores_perfect":
            self.ctx.event("skip", "parent is perfect on the minibatch", iteration=it.number if it else None,
                           parent=it.parent_id if it else None)

    def on_proposal_start(self, event: Any) -> None:
        if self._iteration is not None:
            self._iteration.components = list(event["components"])

    def on_proposal_end(self, event: Any) -> None:
        if self._iteration is not None:
            self._iteration.new_texts = dict(event["new_instructions"])

    def on_valset_evaluated(self, event: Any) -> None:
        self._on_loop(self._valset_evaluated, event)

    async def _valset_evaluated(self, event: Any) -> None:
        texts = {**self.ctx.seed_candidate.texts, **dict(event["candidate"])}
        candidate = self.by_digest.get(digest_of(texts))
        if candidate is None:
            return
        self.library_ids[event["candidate_idx"]] = candidate.candidate_id
        self.ctx.report_best(float(event["average_score"]))
        it = self._iteration
        if event["candidate_idx"] > 0:
            self.ctx.event("accept", f"{candidate.candidate_id} accepted",
                           parent=it.parent_id if it else None, pareto_score=float(event["average_score"]),
                           library_idx=event["candidate_idx"])

    def on_candidate_accepted(self, event: Any) -> None:
        if self._iteration is not None:
            self._iteration.accepted = True

    def on_candidate_rejected(self, event: Any) -> None:
        if self._iteration is not None and self._iteration.accepted is None:
            self._iteration.accepted = False

    def on_error(self, event: Any) -> None:
        exc = event["exception"]
        if not isinstance(exc, Halt):
            self.fail(exc)

    def on_iteration_end(self, event: Any) -> None:
        it, self._iteration = self._iteration, None
        if it is None:
            return
        if it.halted is None and not self.halted:
            self.completed_iterations += 1
        if not self.cancelled:
            self._on_loop(self._finish_iteration, it)

    async def _finish_iteration(self, it: _Iteration) -> None:
        """One proposal row per reflected component; a child rejected on its minibatch
        is marked `library_rejected` (unless it existed before this iteration)."""
        ctx = self.ctx
        if it.child_id is not None and it.child_created and it.accepted is False:
            ctx.set_origin(it.child_id, "library_rejected")
        parent_score = mean_reward(it.parent_results) if it.parent_results else None
        child_score = mean_reward(it.child_results) if it.child_results else None
        by_component: dict[str | None, list[dict[str, Any]]] = {}
        for record in it.reflections:
            by_component.setdefault(record["component"], []).append(record)
        for component, records in by_component.items():
            ok = [r for r in records if r["error"] is None]
            new_text = (it.new_texts or {}).get(component) if component is not None else None
            if not ok or new_text is None:
                status = "error"
            elif not new_text.strip():
                status = "empty"
            elif new_text.strip() == it.parent_texts.get(component, "").strip():
                status = "unchanged"
            else:
                status = "changed"
            prompt_tokens = sum(r["prompt_tokens"] for r in records)
            completion_tokens = sum(r["completion_tokens"] for r in records)
            error = next((r["error"] for r in reversed(records) if r["error"]), None)
            if it.halted and error is None:
                if it.child_results is None:
                    error = f"stopped before the child's minibatch: {it.halted}"
                elif it.accepted is None:
                    error = f"stopped before the child's pareto scoring: {it.halted}"
            ctx.record_proposal(
                iteration=it.number, parent_id=it.parent_id, child_id=it.child_id,
                module=self.module_of.get(component, component) if component else None,
                proposer_model=ctx.spec.proposer.model,
                edit_format=self.edit_format,
                attempts=len(records), status=status, changed=status == "changed", accepted=bool(it.accepted),
                parent_minibatch_score=parent_score, child_minibatch_score=child_score,
                prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                cost_usd=ctx.proposer_cost(prompt_tokens, completion_tokens),
                latency_s=sum(r["latency_s"] for r in records), error=error,
            )


def reflection_template(params: GepaLibraryParams, task_info: dict[str, Any] | None) -> str | None:
    """The library's reflection prompt: the configured template, else its default headed by
    the task context our proposer shows (None: the library's default as it is)."""
    if params.reflection_prompt_template is not None:
        return params.reflection_prompt_template
    context = task_context(task_info) if params.use_task_info else None
    if not context:
        return None
    return f"Task context:\n{context}\n\n{InstructionProposalSignature.default_prompt_template}"


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content or "")
