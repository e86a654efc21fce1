"""The one optimizer protocol: what an optimizer is (`Optimizer`), what it returns
(`OptimizerResult`) and what it sees of a run (`RunView`).

`harness.context.RunContext` implements `RunView`; an optimizer is typed against the view
only, so it depends on the run's public face and plain value types, never on how the run
is built (no `harness.context`, Ray or Hydra here)."""

from __future__ import annotations

import random
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

from harness.budget import Budget
from harness.candidates import Candidate, RolloutResult
from harness.contract import ProgramResponse
from harness.llm import ChatMessage, ChatResult
from harness.run_state import Usage
from harness.specs import Pools, RunSpec


class OptimizerResult(BaseModel):
    model_config = ConfigDict(frozen=True)
    best_candidate_id: str
    stop_reason: str
    iterations: int = 0


class RunView(Protocol):
    """The run as an optimizer sees it: rollouts through `evaluate` (the one choke point),
    proposer calls through `propose`, budget questions, and what it records."""

    @property
    def spec(self) -> RunSpec: ...
    @property
    def pools(self) -> Pools: ...
    @property
    def program(self) -> ProgramResponse: ...
    @property
    def target_modules(self) -> list[str]: ...
    @property
    def task_info(self) -> dict[str, Any] | None: ...
    @property
    def rng(self) -> random.Random: ...
    @property
    def seed_candidate(self) -> Candidate: ...
    @property
    def usage(self) -> Usage: ...
    @property
    def candidates(self) -> list[Candidate]: ...

    # budget: raise `harness.budget.BudgetExhausted` or answer a stop reason; reservations
    # for iterations in flight live on the run's one budget authority
    @property
    def budget(self) -> Budget: ...
    @property
    def rollouts_left(self) -> int: ...
    def stop_reason(self, generation: int | None = None) -> str | None: ...
    def uncached(self, candidate: Candidate, task_ids: list[str] | tuple[str, ...]) -> list[str]: ...

    # rollouts and proposer calls
    async def evaluate(self, candidate: Candidate, task_ids: list[str] | tuple[str, ...],
                       stage: str, *, past_wall: bool = False) -> list[RolloutResult]: ...
    async def propose(self, messages: list[ChatMessage], *, temperature: float, max_tokens: int,
                      scopes: list[str] | None = None) -> ChatResult: ...
    def proposer_cost(self, prompt_tokens: int, completion_tokens: int) -> float | None: ...

    # candidates and records
    def add_candidate(self, texts: dict[str, str], parent_ids: tuple[str, ...], origin: str) -> Candidate: ...
    def candidate(self, candidate_id: str) -> Candidate: ...
    def set_origin(self, candidate_id: str, origin: str) -> None: ...
    def record_proposal(self, proposer_scopes: list[str] | None = None, **fields: Any) -> str: ...
    def adopt_lineage(self, parents: dict[str, list[str]], origin: str) -> list[dict[str, Any]]: ...
    def event(self, kind: str, message: str, **data: Any) -> None: ...
    def report_best(self, score: float) -> None: ...


class Optimizer(Protocol):
    name: str

    async def run(self, ctx: RunView) -> OptimizerResult: ...
